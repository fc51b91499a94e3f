"""The command line on a small slice of OCR."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import shared_data

ROOT = Path(__file__).resolve().parents[1]


def run(*args):
    return subprocess.run([sys.executable, "-m", "torch_bcfw", *args], capture_output=True, text=True, cwd=ROOT)


def test_fit_and_evaluate(tmp_path):
    data = str(shared_data("ocr"))
    out = tmp_path / "run"
    p = run("fit", "--config", "configs/ocr.yaml", "--set", f"data.path={data}", "--set", "data.limit=300",
            "--set", "options.max_passes=4", "--set", "options.gap_check=2", "--output", str(out), "--quiet")
    assert p.returncode == 0, p.stderr
    assert "duality gap (certified)" in p.stdout and "test error" in p.stdout
    for name in ("model.safetensors", "history.csv", "history.json", "gap.png"):
        assert (out / name).is_file(), name
    hist = json.loads((out / "history.json").read_text())["history"]
    assert [h["passes"] for h in hist] == [2.0, 4.0]
    assert (out / "gap.png").read_bytes()[:4] == b"\x89PNG"
    p = run("evaluate", "--model", str(out / "model.safetensors"), "--config", "configs/ocr.yaml",
            "--set", f"data.path={data}", "--set", "data.limit=300", "--json", str(tmp_path / "eval.json"))
    assert p.returncode == 0, p.stderr
    ev = json.loads((tmp_path / "eval.json").read_text())
    assert 0 < ev["test_error"] < 0.9 and ev["certified_gap_as_saved"] == hist[-1]["gap"] > 0
    # other training data (all of OCR-large, not the 300 words fitted): the saved certificate is not shown
    p = run("evaluate", "--model", str(out / "model.safetensors"), "--config", "configs/ocr.yaml",
            "--set", f"data.path={data}", "--json", str(tmp_path / "eval2.json"))
    assert p.returncode == 0, p.stderr
    assert json.loads((tmp_path / "eval2.json").read_text())["certified_gap_as_saved"] is None
    assert "the saved certificate is for other training data" in p.stderr


def test_bad_config_is_reported(tmp_path):
    cfg = tmp_path / "bad.yaml"
    cfg.write_text("data: {name: ocr}\nlam: 0.01\noptions: {max_pases: 3}\n")
    p = run("fit", "--config", str(cfg), "--quiet")
    assert p.returncode == 2
    assert "unknown solver option" in p.stderr or "OCR data not found" in p.stderr
    p = run("fit", "--config", str(tmp_path / "missing.yaml"))
    assert p.returncode == 2 and "not found" in p.stderr


@pytest.mark.heavy  # a slower check: the run of the fast tier stays under 5 minutes cold
def test_path_command_writes_the_path_and_selects_lambda(tmp_path):
    data = str(shared_data("ocr"))
    out = tmp_path / "path"
    p = run("path", "--config", "configs/ocr_path.yaml", "--set", f"data.path={data}", "--set", "data.limit=100",
            "--set", "path.lam_min=0.05", "--set", "grid.warm=true", "--set", "grid.lams=[4.0, 1.0, 0.25, 0.0625]",
            "--output", str(out), "--quiet")
    assert p.returncode == 0, p.stderr
    assert "selected lam" in p.stdout and "test error" in p.stdout
    path = json.loads((out / "path.json").read_text())
    pts = path["points"]
    assert path["kind"] == "path" and len(pts) >= 2 and path["lam_inf"] == pts[0]["lam"]
    assert all(pt["gap"] <= 0.09 + 1e-12 for pt in pts) and all(pt["val_loss"] is not None for pt in pts)
    assert path["lower_limit"] is not None and path["lower_limit"] <= 0.05
    summary = json.loads((out / "summary.json").read_text())
    assert summary["selected_val_loss"] == min(pt["val_loss"] for pt in pts)
    assert 0 < summary["test_loss"] < 1
    grid = json.loads((out / "grid_warm.json").read_text())
    assert [pt["lam"] for pt in grid["points"]] == [4.0, 1.0, 0.25, 0.0625]
    assert (out / "path.png").read_bytes()[:4] == b"\x89PNG"
    bad = tmp_path / "bad.yaml"
    bad.write_text("data: {name: ocr}\npath: {epsilon: 0.1}\n")
    p = run("path", "--config", str(bad), "--quiet")
    assert p.returncode == 2 and "unknown path option" in p.stderr
