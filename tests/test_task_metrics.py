"""Each dataset's own metric beside the Hamming error (torch_bcfw.metrics.tasks, the `torch-bcfw fit` table)."""
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import random_chain_problem, shared_data
from torch_bcfw import fit
from torch_bcfw.datasets.task_metrics import TASK_METRICS, register_task_metric, task_metrics
from torch_bcfw.metrics.segmentation import segmentation_metrics

ROOT = Path(__file__).resolve().parents[1]


def test_segmentation_metrics_by_hand():
    # image 0: truth 1 1 0 0, pred 1 0 1 0 -> tp 1, union 3; image 1: no foreground anywhere -> IoU 1
    truth = torch.tensor([1, 1, 0, 0, 0, 0])
    pred = torch.tensor([1, 0, 1, 0, 0, 0])
    m = segmentation_metrics(pred, truth, torch.tensor([0, 4, 6]))
    assert m["test IoU (%)"] == pytest.approx(100 / 3)
    assert m["test mean IoU per image (%)"] == pytest.approx(100 * (1 / 3 + 1) / 2)
    assert m["test pixel accuracy (%)"] == pytest.approx(100 * 4 / 6)
    with pytest.raises(ValueError, match="5 predicted labels but 6 true labels"):
        segmentation_metrics(pred[:5], truth, torch.tensor([0, 4, 6]))


def test_horses_metric_uses_the_fitted_decoding():
    class Result:  # the hook only needs FitResult.predict
        def predict(self, data):
            return torch.tensor([1, 1, 1, 0])

    class Data:
        y = torch.tensor([1, 1, 0, 0])
        offsets = torch.tensor([0, 4])

    m = task_metrics("horses", None, Data(), Result(), {})
    assert m["test IoU (%)"] == pytest.approx(200 / 3) and m["test pixel accuracy (%)"] == pytest.approx(75)


def test_unknown_datasets_and_missing_data_report_nothing_and_hooks_register():
    model, data = random_chain_problem(n=4)
    res = fit(model, data, 0.1, max_passes=1, gap_check=1)
    assert task_metrics("ocr", model, data, res) == {} and task_metrics(None, model, data, res) == {}
    assert task_metrics("conll", model, None, res) == {}
    try:
        register_task_metric("toy", lambda model, data, result, config: {"toy accuracy (%)": 100 * (1 - result.evaluate(data))})
        assert task_metrics("toy", model, data, res) == {"toy accuracy (%)": pytest.approx(100 * (1 - res.evaluate(data)))}
    finally:
        TASK_METRICS.pop("toy", None)


def test_conll_chunk_f1_equals_the_problem_f1_on_small_data():
    from torch_bcfw.datasets.conll_chain import load_conll_problem

    path = shared_data("conll2000")
    prob = load_conll_problem(path, limit=150, test_limit=60)
    res = fit(prob.model, prob.train, 0.03, max_passes=2, gap_check=2)
    expected = prob.f1(res.weights)
    m = task_metrics("conll", prob.model, prob.test, res, {"name": "conll", "path": str(path), "test_limit": 60})
    assert m["test chunk F1 (%)"] == pytest.approx(100 * expected["f1"])
    assert m["test chunk precision (%)"] == pytest.approx(100 * expected["precision"])
    assert m["test chunk recall (%)"] == pytest.approx(100 * expected["recall"])
    assert 30 < m["test chunk F1 (%)"] <= 100
    # without the corpus (no path), the gold tags are read from the label ids: the same here (no I-LST in these)
    assert task_metrics("conll", prob.model, prob.test, res, {})["test chunk F1 (%)"] == pytest.approx(m["test chunk F1 (%)"])


def test_cli_fit_reports_the_chunk_f1_for_conll(tmp_path):
    out = tmp_path / "conll"
    p = subprocess.run(
        [sys.executable, "-m", "torch_bcfw", "fit", "--config", "configs/conll.yaml", "--set",
         f"data.path={shared_data('conll2000')}", "--set", "data.limit=150", "--set", "data.test_limit=60", "--set",
         "options.max_passes=2", "--set", "options.gap_check=2", "--output", str(out), "--quiet"],
        capture_output=True, text=True, cwd=ROOT)
    assert p.returncode == 0, p.stderr
    rows = {line.split("|")[1].strip(): line.split("|")[2].strip() for line in p.stdout.splitlines() if line.startswith("| ")}
    assert "test error" in rows and 30 < float(rows["test chunk F1 (%)"]) <= 100
    assert float(rows["test chunk precision (%)"]) > 0 and float(rows["test chunk recall (%)"]) > 0
    assert (out / "gap.png").read_bytes()[:4] == b"\x89PNG"
