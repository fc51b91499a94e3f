"""The command line on a small slice of OCR."""
import json
import subprocess
import sys
from pathlib import Path

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
    for name in ("model.pt", "history.csv", "history.json", "gap.png"):
        assert (out / name).is_file(), name
    hist = json.loads((out / "history.json").read_text())["history"]
    assert [h["passes"] for h in hist] == [2.0, 4.0]
    assert (out / "gap.png").read_bytes()[:4] == b"\x89PNG"
    p = run("evaluate", "--model", str(out / "model.pt"), "--config", "configs/ocr.yaml",
            "--set", f"data.path={data}", "--json", str(tmp_path / "eval.json"))
    assert p.returncode == 0, p.stderr
    ev = json.loads((tmp_path / "eval.json").read_text())
    assert 0 < ev["test_error"] < 0.9 and ev["certified_gap"] > 0


def test_bad_config_is_reported(tmp_path):
    cfg = tmp_path / "bad.yaml"
    cfg.write_text("data: {name: ocr}\nlam: 0.01\noptions: {max_pases: 3}\n")
    p = run("fit", "--config", str(cfg), "--quiet")
    assert p.returncode == 2
    assert "unknown solver option" in p.stderr or "OCR data not found" in p.stderr
    p = run("fit", "--config", str(tmp_path / "missing.yaml"))
    assert p.returncode == 2 and "not found" in p.stderr
