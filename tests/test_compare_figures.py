"""``torch-bcfw compare`` with the BCFW paper's figure configs: ``lam: 1/n``, per-solver seeds and the
primal-suboptimality axis (every method drawn against the best certified dual, SSG included)."""
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from conftest import shared_data
from torch_bcfw.compare import best_dual, config_lam, run_comparison, summarise

ROOT = Path(__file__).resolve().parents[1]


def test_paper_configs_parse_and_name_known_solvers():
    from torch_bcfw.solvers.run import SOLVERS

    for name in ("ocr", "conll", "matching"):
        cfg = yaml.safe_load((ROOT / "configs" / f"bcfw_paper_{name}.yaml").read_text())
        assert cfg["y"] == "suboptimality"
        assert {s["solver"] for s in cfg["solvers"]} <= set(SOLVERS)
        labels = [s["label"] for s in cfg["solvers"]]
        assert len(labels) == len(set(labels))


def test_config_lam():
    assert config_lam("1/n", 8) == 0.125
    assert config_lam(0.01, 8) == 0.01
    for bad in ("0.01", True, 0, -1.0, math.nan, math.inf, None):
        with pytest.raises(ValueError, match="lam must be"):
            config_lam(bad, 8)


def test_bad_axis_is_refused():
    with pytest.raises(ValueError, match="y must be one of"):
        run_comparison({"lam": 0.1, "y": "primal", "solvers": [{"label": "A"}]})


@pytest.mark.heavy
def test_matching_figure_through_the_cli(tmp_path):
    """The matching config, shortened: every method gets a suboptimality >= 0 against D* (a certified dual, hence
    <= P*), SSG included though it has no gap; the deterministic methods run one seed; lam 1/n is 1/len(train)."""
    out = tmp_path / "m"
    p = subprocess.run(
        [sys.executable, "-m", "torch_bcfw", "compare", "--config", "configs/bcfw_paper_matching.yaml", "--quiet",
         "--set", f"data.path={shared_data('hansards_alignment')}", "--set", "data.n_train=20", "--set", "lam=1/n",
         "--set", "seeds=[1, 2]", "--set", "options.max_passes=6", "--set", "options.gap_check=3",
         "--set", f"output={out}"],
        capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert p.returncode == 0, p.stderr
    res = json.loads((out / "comparison.json").read_text())
    assert res["lam"] == pytest.approx(1 / 20) and res["y"] == "suboptimality"
    assert (out / "comparison.png").read_bytes()[:4] == b"\x89PNG"
    d_star = best_dual(res)
    rows = {r["solver"]: r for r in summarise(res)}
    assert set(rows) == {"BCFW", "BCFW-wavg", "SSG", "SSG-wavg", "batch FW", "cutting plane", "extragradient",
                         "extragradient-wavg"}
    assert rows["SSG"]["gap"] is None and rows["SSG"]["suboptimality"] is not None
    for label, run in res["runs"].items():
        assert len(run["seeds"]) == (2 if label.startswith(("BCFW", "SSG")) else 1), label
        for s in run["seeds"].values():
            for rec in s["history"]:
                for p_ in (rec["primal"], rec.get("primal_avg")):
                    assert p_ is None or p_ >= d_star - 1e-9 * max(1.0, abs(d_star)), label
                if rec["gap_last"] is not None:  # certified methods: the gap is primal - dual of the same check
                    assert rec["gap_last"] == pytest.approx(rec["primal"] - rec["dual"], abs=1e-12)
    assert "subopt" in p.stdout and "SSG" in p.stdout
