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
from torch_bcfw.certificate import certify

WORKER = Path(__file__).resolve().parent / "distributed_fit_worker.py"
#: the figures behind strategy="auto"'s choice, recorded in the counters
CALIBRATION_KEYS = {f"calibration_{k}" for k in ("step_seconds", "allreduce_seconds", "replicate_pass_seconds",
                                                 "shard_pass_seconds", "oracle_seconds", "apply_seconds",
                                                 "apply_round_seconds", "gather_seconds", "split_pass_seconds")}
sys.path.insert(0, str(WORKER.parent))
import distributed_fit_worker as worker  # noqa: E402

TIMING = ("solver_time", "gap_time", "gap_oracle_calls")  # a split run makes one more check

pytestmark = pytest.mark.heavy  # multi-process: the tier .ci/run runs after the README's test command


def _launch(scenario: str, name: str, tmp: Path) -> list[dict]:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
           "--master-port", str(free_port()), str(WORKER), scenario, str(tmp), name]
    runs = _run([cmd], [_env()], tmp)
    assert runs[0].returncode == 0, runs[0].stdout[-4000:]
    return [json.loads((tmp / f"{scenario}_{name}_rank{r}.json").read_text()) for r in range(2)]


def _untimed(history: list[dict]) -> list[dict]:
    return [{k: v for k, v in h.items() if k not in TIMING} for h in history]


@pytest.mark.parametrize("name", ["chain", "multiclass", "chain-gap-cache"])
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
    if "cache" in name:  # hits summed over the ranks: every block iteration is an oracle call or a hit
        assert last["cache_hits"] > 0 and last["oracle_calls"] + last["cache_hits"] == 40 * n
    assert last["primal"] == pytest.approx(ind.primal, rel=1e-12)
    assert last["dual"] == pytest.approx(ind.dual, rel=1e-12) and last["gap_last"] == pytest.approx(ind.gap, abs=1e-12)
    # the same optimum as one process, within the certified gaps
    one = fit(model, data, worker.LAM, preset="uniform-pairwise", max_passes=3000, gap_tol=1e-7, gap_check=10)
    g = last["gap"]
    assert one.gap <= 1e-7 and abs(min(last["primal"], last["primal_avg"]) - one.primal) <= g + 1e-7
    w_best = torch.tensor(r0["w_avg"] if last["selected"] == "averaged" else r0["w"], dtype=torch.float64)
    assert float((w_best - one.weights).norm()) <= math.sqrt(2 * g / worker.LAM) + math.sqrt(2e-7 / worker.LAM)
    # every rank wrote its shard's checkpoint, one committed set at the end (the older members removed)
    assert all(Path(r["checkpoint"]).exists() and r["members"] == [r["checkpoint"]] for r in (r0, r1))
    assert r0["manifest"]["work"] == 40 * n and r0["manifest"]["world_size"] == 2


def test_two_nodes_on_loopback_fit_the_same_head_as_one_node(tmp_path):
    """``torchrun --nnodes 2`` (one process per 'node', c10d rendezvous on 127.0.0.1) gives the run of one node with
    two processes, bit for bit: the layout depends on the world size only."""
    import os

    port, run_id = free_port(), f"fit{os.getpid()}"
    nodes = tmp_path / "nodes"
    nodes.mkdir()
    cmds = [[sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--node-rank", str(k),
             "--nproc-per-node", "1", "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}",
             "--rdzv-id", run_id, "--local-addr", "127.0.0.1", str(WORKER), "fit", str(nodes), "multiclass"]
            for k in range(2)]
    runs = _run(cmds, [_env(), _env()], nodes)
    assert [r.returncode for r in runs] == [0, 0], "\n".join(r.stdout[-3000:] for r in runs)
    two_nodes = [json.loads((nodes / f"fit_multiclass_rank{r}.json").read_text()) for r in range(2)]
    one_node = _launch("fit", "multiclass", tmp_path)
    for a, b in zip(two_nodes, one_node):
        assert a["w"] == b["w"] and a["w_avg"] == b["w_avg"] and _untimed(a["history"]) == _untimed(b["history"])


@pytest.mark.parametrize("name", ["multiclass", "chain-gap-cache"])
def test_resume_from_each_ranks_checkpoint_is_exact(name, tmp_path):
    recs = _launch("resume", name, tmp_path)
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


def test_torchrun_command_line_fit_and_resume(tmp_path):
    """``torchrun --nproc-per-node 2 -m torch_bcfw fit``: rank 0 writes the usual files (model.safetensors without the state),
    each rank its shard of the state into the committed checkpoint set, and ``--resume`` continues from that."""
    from conftest import shared_data
    from torch_bcfw import FitResult

    out = tmp_path / "run"
    cfg = tmp_path / "ocr.yaml"
    cfg.write_text(f"data: {{name: ocr, path: {shared_data('ocr')}, split: small, fold: 0}}\nlam: 0.1\n"
                   f"options: {{max_passes: 4, gap_check: 2, batch_size: 32, strategy: shard}}\noutput: {out}\n")

    def launch(*args):
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
               "--master-port", str(free_port()), "-m", "torch_bcfw", "fit", "--quiet", *args]
        runs = _run([cmd], [_env()], tmp_path)
        assert runs[0].returncode == 0, runs[0].stdout[-4000:]
        return runs[0].stdout

    def members():
        found = [sorted(out.glob(f"checkpoint.rank{r}-of-2.w*.safetensors")) for r in range(2)]
        assert [len(f) for f in found] == [1, 1], found  # one committed set, the older members removed
        return [FitResult.load(f[0]) for f in found]

    table = launch("--config", str(cfg))
    assert "gap" in table
    first = members()
    main = FitResult.load(out / "model.safetensors")
    assert torch.equal(first[0].w, first[1].w) and torch.equal(main.w, first[0].w)
    assert main.passes == 4 and (out / "history.csv").exists() and (out / "gap.png").exists()
    assert [f.solver_state["shard"] for f in first] == [{"rank": 0, "world_size": 2}, {"rank": 1, "world_size": 2}]
    assert not main.has_state and not list(out.glob("model.rank*"))  # the model file: no state; the shards' set:
    assert json.loads((out / "checkpoint.shards.json").read_text())["work"] == first[0].counters["work"]  # committed
    launch("--resume", str(out), "--set", "options.max_passes=6")
    again = members()
    assert again[0].passes == 6 and torch.equal(again[0].w, again[1].w)
    assert len(again[0].history) > len(first[0].history)


@pytest.mark.parametrize("strategy", ["shard", "auto", "split-oracle"])
def test_lightning_ddp_callback_solves_one_head_over_all_ranks(strategy, tmp_path):
    """``BCFWCallback`` under ``strategy="ddp"`` (2 CPU processes, gloo), sharded, with ``strategy="auto"`` (which
    replicates this tiny problem) and with the oracle calls split: the same head on both ranks, the logged gap the exact certificate over all
    examples, the single-process optimum within it, and an exact resume from a Lightning checkpoint (written by rank
    0).  Replicated: the features each rank computed for its batches are gathered in the order of one process, and
    the head is bit for bit the one a single process solves on them from the same state -- the checkpoint after 2
    epochs resumed in ONE process with the final backbone gives the 2-process head of epoch 3 (split-oracle too: its
    trajectory does not depend on the number of processes)."""
    pytest.importorskip("lightning", reason="the [lightning] extra is not installed")
    from conftest import brute_force_primal, random_multiclass_problem
    from lightning_ddp_worker import CALLBACKS
    from test_lightning import Toy
    from torch_bcfw.data import MulticlassData
    from torch_bcfw.lightning import BCFWCallback, collect_features
    from torch_bcfw.models import Multiclass

    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
           "--master-port", str(free_port()), str(WORKER.parent / "lightning_ddp_worker.py"), str(tmp_path), strategy]
    runs = _run([cmd], [_env()], tmp_path)
    assert runs[0].returncode == 0, runs[0].stdout[-4000:]
    r0, r1 = (json.loads((tmp_path / f"ddp_rank{r}.json").read_text()) for r in range(2))
    assert (r0["rank"], r1["rank"], r0["world_size"]) == (0, 1, 2)
    expected = "replicate" if strategy == "auto" else strategy
    for key in ("full", "resumed"):
        a, b = r0[key], r1[key]
        assert a["head"] == b["head"] and a["backbone"] == b["backbone"] and a["logged_gap"] == b["logged_gap"]
        assert a["strategy"] == b["strategy"] == expected
        if strategy == "shard":
            assert a["shard_n"] == [7, 7]  # one head over both shards of the 14 examples
    # the calibration that picked (or was asked for) the strategy is recorded with the callback's counters
    assert r0["full"]["calibration"] == sorted(CALIBRATION_KEYS)
    # resumed from the checkpoint after 2 epochs == 3 epochs in one run, bit for bit
    assert r0["resumed"]["head"] == r0["full"]["head"] and r0["resumed"]["backbone"] == r0["full"]["backbone"]
    assert r0["resumed"]["last"]["gap"] == r0["full"]["last"]["gap"]
    # the logged certificate, recomputed independently at the final features
    f, last = r0["full"], r0["full"]["last"]
    lam = CALLBACKS[strategy]["lam"]
    model, data = Multiclass(3, 3), MulticlassData(torch.tensor(f["x"], dtype=torch.float64), torch.tensor(f["y"]))
    head = torch.tensor(f["head"], dtype=torch.float64)
    primal = last["primal_avg"] if last["selected"] == "averaged" else last["primal"]
    assert brute_force_primal(model, data, head, lam) == pytest.approx(primal, abs=1e-10)
    if strategy == "shard":
        v = torch.tensor(f["shard_w"][0], dtype=torch.float64)
        assert sum(f["shard_ell"]) - 0.5 * lam * float(v @ v) == pytest.approx(last["dual"], abs=1e-12)
    assert f["logged_gap"] == pytest.approx(last["gap"], rel=1e-12)
    one = fit(model, data, lam, preset="uniform-pairwise", max_passes=3000, gap_tol=1e-9)
    assert one.gap <= 1e-9 and 0.0 <= primal - one.primal <= last["gap"] + 1e-9
    if strategy == "shard":
        return
    # replicated: one process, the 2-process checkpoint after epoch 2 and the final backbone -> the same head
    _, raw = random_multiclass_problem(n=14, F=4, K=3, seed=4)
    module = Toy(raw, F=3, K=3)
    with torch.no_grad():
        module.backbone.weight.copy_(torch.tensor(f["backbone"], dtype=torch.float64).reshape(3, 4))
        module.backbone.bias.copy_(torch.tensor(f["backbone_bias"], dtype=torch.float64))
    gathered = collect_features(module, module.bcfw_dataloader())
    assert gathered.x.tolist() == f["gathered_x"] and gathered.y.tolist() == f["gathered_y"]
    cb = BCFWCallback(**CALLBACKS[strategy])
    cb.load_state_dict(torch.load(tmp_path / "mid.ckpt", weights_only=True)["callbacks"][cb.state_key])
    rec = cb.solve(None, module, cb.passes_per_call, log=False)
    assert module.head.w.tolist() == f["head"]
    assert rec.gap == last["gap"] and rec.primal == last["primal"]


def test_a_dead_peer_ends_the_command_line_with_one_line(tmp_path):
    """Two ranks of ``torch-bcfw fit``; rank 1 is killed once it has saved its first checkpoint: rank 0 stops within
    the group's timeout with exit code 1 and one error line naming the failed operation, no traceback."""
    import signal
    import subprocess
    import time

    from conftest import shared_data

    out = tmp_path / "run"
    cfg = tmp_path / "ocr.yaml"
    cfg.write_text(f"data: {{name: ocr, path: {shared_data('ocr')}, split: small, fold: 0}}\nlam: 0.1\n"
                   f"options: {{max_passes: 100000, gap_check: 1000, batch_size: 32, strategy: shard}}\noutput: {out}\n")
    port = str(free_port())
    cmd = [sys.executable, "-m", "torch_bcfw", "fit", "--quiet", "--config", str(cfg), "--checkpoint-every", "1p"]
    procs = [subprocess.Popen(cmd, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=_env(RANK=str(r), WORLD_SIZE="2", LOCAL_RANK=str(r), MASTER_ADDR="127.0.0.1",
                                       MASTER_PORT=port)) for r in range(2)]
    try:
        deadline = time.monotonic() + LAUNCH_TIMEOUT_S
        while not (out / "checkpoint.shards.json").exists():
            assert time.monotonic() < deadline and procs[1].poll() is None, "rank 1 never saved a checkpoint"
            time.sleep(0.2)
        procs[1].send_signal(signal.SIGKILL)
        t0 = time.monotonic()
        _, err = procs[0].communicate(timeout=LAUNCH_TIMEOUT_S)
        waited = time.monotonic() - t0
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert procs[0].returncode == 1, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    errors = [ln for ln in err.splitlines() if ln.startswith("torch-bcfw: error:")]
    assert len(errors) == 1 and "rank 0 of 2" in errors[0], err[-3000:]
    assert waited < 60.0


def test_sharded_checkpoints_survive_node_wide_kills_at_random_points(tmp_path):
    """Two ranks of ``torch-bcfw fit`` checkpointing every pass are SIGKILLed together (a node-wide preemption) at 10
    random moments, during saves too; each ``--resume`` continues from the newest committed set, and the run ends
    with the weights and the last certificate of the uninterrupted run."""
    import random
    import signal
    import subprocess
    import time

    from conftest import shared_data
    from torch_bcfw import FitResult

    cfg = tmp_path / "ocr.yaml"
    cfg.write_text(f"data: {{name: ocr, path: {shared_data('ocr')}, split: small, fold: 0}}\nlam: 0.1\n"
                   "options: {max_passes: 80, gap_check: 20, batch_size: 32, strategy: shard}\n")

    def start(*args):
        port = str(free_port())
        cmd = [sys.executable, "-m", "torch_bcfw", "fit", "--quiet", "--checkpoint-every", "1p", *args]
        procs = []
        for r in range(2):
            procs.append(subprocess.Popen(cmd, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                          text=True, env=_env(RANK=str(r), WORLD_SIZE="2", LOCAL_RANK=str(r),
                                                              MASTER_ADDR="127.0.0.1", MASTER_PORT=port)))
        return procs

    def finish(procs):
        errs = [p.communicate(timeout=LAUNCH_TIMEOUT_S)[1] for p in procs]
        assert [p.returncode for p in procs] == [0, 0], errs[0][-3000:] + errs[1][-3000:]

    finish(start("--config", str(cfg), "--output", str(tmp_path / "whole")))
    whole = FitResult.load(tmp_path / "whole" / "model.safetensors")
    out, rng, kills = tmp_path / "cut", random.Random(0), 0
    manifest = out / "checkpoint.shards.json"
    procs = start("--config", str(cfg), "--output", str(out))
    while kills < 10:
        before = manifest.read_text() if manifest.exists() else None
        deadline = time.monotonic() + LAUNCH_TIMEOUT_S
        while (manifest.read_text() if manifest.exists() else None) == before and procs[0].poll() is None:
            assert time.monotonic() < deadline, "no checkpoint was committed"
            time.sleep(0.01)  # a new set is committed: this segment made progress
        time.sleep(rng.uniform(0.0, 0.4))
        if procs[0].poll() is not None:  # the run finished before the kill
            break
        for p in procs:  # both ranks at once: a node-wide kill
            p.send_signal(signal.SIGKILL)
        for p in procs:
            p.communicate(timeout=LAUNCH_TIMEOUT_S)
        kills += 1
        procs = start("--resume", str(out))
    finish(procs)
    assert kills >= 5
    cut = FitResult.load(out / "model.safetensors")
    assert torch.equal(cut.w, whole.w) and torch.equal(cut.w_avg, whole.w_avg)
    assert _untimed([cut.history[-1].to_dict()]) == _untimed([whole.history[-1].to_dict()])
    assert not list(out.glob("model.rank*")) and len(list(out.glob("checkpoint.rank*.safetensors"))) == 2


@pytest.mark.parametrize("name", ["chain", "multiclass"])
def test_replicated_heads_equal_one_process_and_resume_under_any_world_size(name, tmp_path):
    """``strategy="replicate"``: both ranks hold the single-process head of the same seed bit for bit; rank 0 wrote
    the one checkpoint, which continues in a single process to the uninterrupted single-process run; ``"auto"`` is
    recorded as the choice it made, with its figures, and a forced ``"shard"`` shards."""
    from torch_bcfw import FitResult

    r0, r1 = _launch("replicate", name, tmp_path)
    model, data = worker.problem(name)
    one = fit(model, data, worker.LAM, max_passes=6, **worker.REPLICATE)
    assert r0["w"] == r1["w"] == one.w.tolist() and r0["w_avg"] == one.w_avg.tolist()
    assert _untimed(r0["history"]) == _untimed([h.to_dict() for h in one.history])
    assert r0["strategy"] == "replicate" and r0["n_local"] == len(data)
    assert r0["files"] == [f"rep_{name}.pt"]  # one file, no rank files
    assert r0["auto"] in ("replicate", "shard", "split-oracle") and r0["auto"] == r1["auto"]
    assert set(r0["calibration"]) == CALIBRATION_KEYS
    assert r0["forced"] == "shard" and r0["forced_n_local"] < len(data)
    assert r1["warnings"] == [] and len(r0["warnings"]) <= 1  # a warning comes from rank 0 only (rule: test_coercions)
    saved = FitResult.load(tmp_path / f"rep_{name}.pt")  # written at 6 passes, resumed with one process
    more = fit(model, data, worker.LAM, max_passes=6, init=saved, **worker.REPLICATE)
    whole = fit(model, data, worker.LAM, max_passes=12, **worker.REPLICATE)
    assert torch.equal(more.w, whole.w) and torch.equal(more.w_avg, whole.w_avg)
    # split-oracle: the trajectory of one process running the same rounds, on both ranks; its one checkpoint (rank
    # 0's, at 2 passes) continues in one process to the uninterrupted run
    split = fit(model, data, worker.LAM, max_passes=4, **worker.SPLIT)
    assert r0["split_strategy"] == "split-oracle" and r0["split"]["n_local"] == len(data)
    assert r0["split"]["w"] == r1["split"]["w"] == split.w.tolist() and r0["split"]["w_avg"] == split.w_avg.tolist()
    assert _untimed(r0["split"]["history"]) == _untimed([h.to_dict() for h in split.history])
    half = fit(model, data, worker.LAM, max_passes=2, **worker.SPLIT)
    saved = FitResult.load(tmp_path / f"split_{name}.pt")
    assert torch.equal(saved.w, split.w)  # the final save; the one at 2 passes equals the 2-pass run:
    more = fit(model, data, worker.LAM, max_passes=2, init=half, **worker.SPLIT)
    assert torch.equal(more.w, split.w) and torch.equal(more.w_avg, split.w_avg)
