"""Sharded BCFW with real processes: ``torch_bcfw.fit`` inside a 2-rank gloo group (torchrun), against one process
and an independent certificate; exact resume from each rank's checkpoint; a rank that dies mid-run.  The ranks run
tests/distributed_fit_worker.py and write JSON; the assertions are here."""
from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest
import torch

from test_distributed_layer import LAUNCH_TIMEOUT_S, _env, _run, free_port
from torch_bcfw import fit
from torch_bcfw.solvers.certificate import certify

WORKER = Path(__file__).resolve().parent / "distributed_fit_worker.py"
sys.path.insert(0, str(WORKER.parent))
import distributed_fit_worker as worker  # noqa: E402

TIMING = ("solver_time", "gap_time", "gap_oracle_calls")  # a split run makes one more check


def _launch(scenario: str, name: str, tmp: Path) -> list[dict]:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
           "--master-port", str(free_port()), str(WORKER), scenario, str(tmp), name]
    runs = _run([cmd], [_env()], tmp)
    assert runs[0].returncode == 0, runs[0].stdout[-4000:]
    return [json.loads((tmp / f"{scenario}_{name}_rank{r}.json").read_text()) for r in range(2)]


def _untimed(history: list[dict]) -> list[dict]:
    return [{k: v for k, v in h.items() if k not in TIMING} for h in history]


@pytest.mark.parametrize("name", ["chain", "multiclass"])
def test_two_ranks_solve_one_problem_with_an_exact_global_certificate(name, tmp_path):
    r0, r1 = _launch("fit", name, tmp_path)
    # one head, replicated: the same weights and the same records on both ranks
    assert r0["w"] == r1["w"] and r0["w_avg"] == r1["w_avg"]
    assert _untimed(r0["history"]) == _untimed(r1["history"])
    model, data = worker.problem(name)
    n = len(data)
    assert (r0["n_local"] + r1["n_local"], r0["n_total"]) == (n, n) and abs(r0["n_local"] - r1["n_local"]) <= 1
    # the logged certificate equals one computed independently on the full data from both ranks' dual states
    w = torch.tensor(r0["w"], dtype=torch.float64)
    ind = certify(model, data, w, r0["ell_local"] + r1["ell_local"], worker.LAM)
    last = r0["history"][-1]
    assert last["primal"] == pytest.approx(ind.primal, rel=1e-12)
    assert last["dual"] == pytest.approx(ind.dual, rel=1e-12) and last["gap"] == pytest.approx(ind.gap, abs=1e-12)
    # the same optimum as one process, within the certified gaps
    one = fit(model, data, worker.LAM, preset="uniform-pairwise", max_passes=3000, gap_tol=1e-7, gap_check=10)
    g = last["gap_best"]
    assert one.gap <= 1e-7 and abs(min(last["primal"], last["primal_avg"]) - one.primal) <= g + 1e-7
    w_best = torch.tensor(r0["w_avg"] if last["selected"] == "averaged" else r0["w"], dtype=torch.float64)
    assert float((w_best - one.weights).norm()) <= math.sqrt(2 * g / worker.LAM) + math.sqrt(2e-7 / worker.LAM)
    # every rank wrote its shard's checkpoint
    assert all(Path(r["checkpoint"]).exists() for r in (r0, r1))


def test_resume_from_each_ranks_checkpoint_is_exact(tmp_path):
    recs = _launch("resume", "multiclass", tmp_path)
    for rec in recs:
        assert rec["resumed"]["w"] == rec["whole"]["w"] and rec["resumed"]["w_avg"] == rec["whole"]["w_avg"]
        assert _untimed(rec["resumed"]["history"])[-1] == _untimed(rec["whole"]["history"])[-1]
        assert "resume with the world size of the run that saved it" in rec["wrong_rank_error"]


def test_a_dead_rank_stops_the_other_with_a_clear_error(tmp_path):
    port = str(free_port())
    envs = [_env(RANK=str(r), WORLD_SIZE="2", LOCAL_RANK=str(r), MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
            for r in range(2)]
    cmd = [sys.executable, str(WORKER), "kill", str(tmp_path), "chain"]
    runs = _run([cmd, cmd], envs, tmp_path)
    assert runs[1].returncode == 1  # rank 1 died
    path = tmp_path / "kill_chain_rank0.json"
    assert path.exists(), runs[0].stdout[-3000:]
    rec = json.loads(path.read_text())
    assert rec["error"] is not None and "failed on rank 0 of 2" in rec["error"]
    assert rec["seconds"] < 30.0 < LAUNCH_TIMEOUT_S  # within the group's timeout (30 s), not a hang
