"""benchmarks/gpu.py on the CPU (``--device cpu --quick``): every section runs, paths agree where they must."""
import json
import math
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.heavy


def test_gpu_script_runs_on_cpu(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    sys.modules.pop("gpu", None)
    import gpu

    out = tmp_path / "gpu.json"
    gpu.main(["--device", "cpu", "--quick", "--sections", "ocr,map,profile,strategy", "--out", str(out)])
    rep = json.loads(out.read_text())
    assert rep["machine"]["device"] == "cpu" and rep["quick"] is True
    rows = rep["ocr"]
    assert [r.get("error") for r in rows] == [None] * len(rows)
    assert {r["tau"] for r in rows} == {1, 16, 64, 256}  # 1024 > n / 2 for the 600 quick words
    for r in rows:
        assert math.isfinite(r["s_per_pass"]) and r["s_per_pass"] > 0 and r["gap"] >= 0
    plain = rows[0]
    assert plain["passes"] == pytest.approx(2.0) and plain["gap"] < rows[1]["gap"]  # 2 passes beat 0.02 of one
    (viterbi, ts) = rep["map"]
    assert viterbi["words"] == ts["words"] == 600 and ts["max_abs_diff_to_viterbi"] < 1e-9
    assert rep["profile"]["plain"] and rep["profile"]["rounds_300"]
    cal = rep["strategy"]  # two processes' calibration: its figures and the choice they predict
    assert "error" not in cal, cal.get("error")
    assert cal["processes"] == 2 and cal["n"] == 600 and cal["strategy"] in ("replicate", "shard", "split-oracle")
    assert all(cal[k] > 0 for k in ("step_seconds", "oracle_seconds", "allreduce_seconds", "gather_seconds"))
    assert cal["replicate_pass_seconds"] == pytest.approx(600 * cal["step_seconds"])
    with pytest.raises(SystemExit, match="unknown section"):
        gpu.main(["--device", "cpu", "--sections", "ocr,gpu", "--out", str(out)])
