"""benchmarks/heads.py: the CRF head's likelihood and decoding against enumeration on tiny words (torch-struct's
log-partition included), and the ``--quick`` setting end to end (heavy tier: about 1.5 minutes)."""
import itertools
import json
import math
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import heads  # noqa: E402


def test_crf_likelihood_and_decoding_against_enumeration():
    """Words of 1, 2 and 3 letters over 3 labels: the mean negative log-likelihood equals the enumerated
    ``log Z - score(y)`` (torch-struct's partition for the words with an edge, a softmax for the one-letter word) and
    the decoding is the enumerated argmax."""
    torch.manual_seed(0)
    K = 3
    lengths = [3, 1, 2]
    offsets = torch.tensor([0, 3, 4, 6])
    emission = torch.randn(6, K, dtype=torch.float64)
    trans = torch.randn(K, K, dtype=torch.float64)
    labels = torch.tensor([0, 2, 1, 1, 2, 0])
    nll, pred = heads.crf_nll_and_decode(emission, trans, offsets, labels)
    total, best = 0.0, []
    for b, L in enumerate(lengths):
        s = int(offsets[b])

        def score(ys):
            return sum(float(emission[s + t, ys[t]]) for t in range(L)) + sum(
                float(trans[ys[t], ys[t + 1]]) for t in range(L - 1))

        scores = {ys: score(ys) for ys in itertools.product(range(K), repeat=L)}
        log_z = math.log(sum(math.exp(v) for v in scores.values()))
        total += log_z - score(tuple(labels[s:s + L].tolist()))
        best += list(max(scores, key=scores.get))
    assert float(nll.detach()) == pytest.approx(total / len(lengths), abs=1e-10)
    assert pred.tolist() == best


@pytest.mark.heavy
@pytest.mark.parametrize("task", ["ocr", "conll"])
def test_quick_run_writes_the_table_json_and_plot(task, tmp_path):
    # every head on OCR (BCFW as the head's optimizer included); the default heads on CoNLL (all but bcfw-step)
    expected = list(heads.HEADS) if task == "ocr" else [h for h in heads.HEADS if h != "bcfw-step"]
    heads.main(["--task", task, "--quick", "--results", str(tmp_path), "--heads", ",".join(expected)])
    rep = json.loads((tmp_path / f"heads_{task}_quick.json").read_text())
    # hinge + Adam's row names the lam the held-out data chose for it ("hinge lam 0.01")
    assert rep["task"] == task and [r["head"].split(" lam ")[0] for r in rep["table"]] == expected
    for row in rep["table"]:  # a letter error in (0, 1), a chunk F1 in (0, 100] %
        for key in ("test_at_held_out_epoch", "test_at_last_epoch"):
            assert 0.0 < row[key] < (1.0 if task == "ocr" else 100.0 + 1e-9)
        assert row["seconds"] > 0 and row["peak_rss_mb"] > 0
    for bcfw in (row for row in rep["table"] if row["head"].startswith("bcfw")):
        assert 0.0 < bcfw["callback_share"] < 1.0 and bcfw["final_gap"] >= 0
    assert all(len(r["curve"]) == 3 for r in rep["runs"])  # one point per epoch
    for r in rep["runs"]:  # the epoch reported is the one the held-out metric chose
        chosen = heads.held_out_epoch(r["curve"], task)
        better = max if task == "conll" else min
        assert chosen["val_metric"] == better(c["val_metric"] for c in r["curve"])
    if task == "ocr":  # the step head moved the head at every step and certified it at every epoch end
        step_run = next(r for r in rep["runs"] if r["head"] == "bcfw-step")
        assert step_run["bcfw_warmup"] == 2 and all(c["gap"] >= 0 for c in step_run["curve"])
    with pytest.raises(SystemExit, match="ocr only"):
        heads.main(["--task", "conll", "--quick", "--heads", "bcfw-step", "--results", str(tmp_path)])
    lam_run = next(r for r in rep["runs"] if r["head"] == "bcfw-lam")
    assert len(lam_run["lam_choices"]) == 4  # the initial solve and one per epoch, each lam from the grid
    assert all(c["lam"] in lam_run["lam_grid"] for c in lam_run["lam_choices"])
    assert (tmp_path / f"heads_{task}_quick.png").read_bytes()[:4] == b"\x89PNG"
