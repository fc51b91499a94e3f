"""Ctrl-C ends the whole job: a KeyboardInterrupt inside one solve of a multi-fit entry point
(the Lightning callback, cross_validate, compare, the regularization path) is not swallowed by the solver loop
and followed by more work; what finished is reported as finished and no aggregate uses the cut run.

The interrupt is a real ``KeyboardInterrupt`` raised from a solver callback (``on_chunk`` runs inside the solver
loop's ``try``), or a real SIGINT (``os.kill`` of this process, or ``send_signal`` to a CLI subprocess)."""
import copy
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from conftest import random_chain_problem, random_multiclass_problem, shared_data
from torch_bcfw import cross_validate, fit
from torch_bcfw.compare import finished_runs, plot_comparison, run_comparison, summarise, write_results
from torch_bcfw.cross_validation import CrossValidationInterrupted
from torch_bcfw.solvers.callbacks import Callback
from torch_bcfw.certificate import certify
from torch_bcfw.solvers.path import grid_search, regularization_path

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def keep_sigint_handler():
    """Lightning ignores SIGINT after a KeyboardInterrupt (``signal.SIG_IGN``): put the handler back."""
    old = signal.getsignal(signal.SIGINT)
    yield
    signal.signal(signal.SIGINT, old)


class CutRun(Callback):
    """Ctrl-C in the ``fit``-th solve this callback sees (0-based), at its ``chunk``-th chunk.

    ``how="raise"`` raises KeyboardInterrupt; ``how="signal"`` sends SIGINT to this process (Python raises
    KeyboardInterrupt at the next bytecode, as for a real Ctrl-C); ``how="start"`` raises in ``on_start``
    (outside the solver loop's ``try``: between two runs)."""

    def __init__(self, fit: int, chunk: int = 2, how: str = "raise"):
        self.fit, self.chunk, self.how = fit, chunk, how
        self.starts, self.chunks, self.ends = -1, 0, []

    def on_start(self, info):
        self.starts += 1
        self.chunks = 0
        if self.how == "start" and self.starts == self.fit:
            raise KeyboardInterrupt

    def on_chunk(self, passes, elapsed):
        self.chunks += 1
        if self.starts == self.fit and self.chunks == self.chunk and self.how != "start":
            if self.how == "signal":
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(1.0)  # the handler raises before this returns
                raise AssertionError("SIGINT was not turned into KeyboardInterrupt")
            raise KeyboardInterrupt

    def on_end(self, record, stopped_by):
        self.ends.append(stopped_by)


# ------------------------------------------------------------------ the solver loop itself (unchanged)
def test_a_single_fit_still_returns_interrupted():
    model, data = random_multiclass_problem(n=12, seed=3)
    cut = CutRun(fit=0, chunk=2, how="signal")
    r = fit(model, data, 0.1, max_passes=50, callbacks=[cut])
    assert r.stopped_by == "interrupted" and cut.ends == ["interrupted"]
    assert r.passes < 50


# ------------------------------------------------------------------ cross_validate
@pytest.mark.parametrize("how", ["raise", "signal"])
def test_cross_validate_stops_at_the_cut_fold_and_reports_the_finished_ones(how):
    model, data = random_multiclass_problem(n=12, seed=3)
    folds = torch.arange(12) % 3
    cut = CutRun(fit=1, chunk=2, how=how)
    with pytest.raises(KeyboardInterrupt) as info:
        cross_validate(model, data, folds, lam=0.1, max_passes=5, seed=4, callbacks=[cut])
    stop = info.value
    assert isinstance(stop, CrossValidationInterrupted)
    assert cut.starts == 1 and cut.ends == ["max_passes", "interrupted"]  # fold 2 was never started
    assert [f.fold for f in stop.folds] == [0] and all(f.status == "finished" for f in stop.folds)
    alone = fit(model, data[stop.folds[0].train_index], 0.1, max_passes=5, seed=4)
    assert torch.equal(stop.folds[0].result.weights, alone.weights)
    assert stop.interrupted.fold == 1 and stop.interrupted.status == "interrupted"
    assert stop.interrupted.result.stopped_by == "interrupted"
    assert "1 fold(s) finished" in str(stop)


def test_cross_validate_interrupted_between_folds():
    model, data = random_multiclass_problem(n=12, seed=3)
    cut = CutRun(fit=2, how="start")  # raised by the third fit before its loop starts
    with pytest.raises(CrossValidationInterrupted) as info:
        cross_validate(model, data, torch.arange(12) % 3, lam=0.1, max_passes=3, callbacks=[cut])
    assert [f.fold for f in info.value.folds] == [0, 1] and info.value.interrupted is None


def test_cross_validate_without_interrupt_is_unchanged():
    model, data = random_multiclass_problem(n=12, seed=3)
    fits = cross_validate(model, data, torch.arange(12) % 3, lam=0.1, max_passes=3)
    assert [f.fold for f in fits] == [0, 1, 2] and all(f.status == "finished" for f in fits)


# ------------------------------------------------------------------ compare (library)
def _compare_cfg():
    return {"lam": 0.05, "seeds": [1, 2], "options": {"max_passes": 4, "gap_check": 2},
            "solvers": [{"label": "A", "preset": "uniform-fw"}, {"label": "B", "preset": "gap-fw"},
                        {"label": "C", "solver": "fw"}]}


def test_compare_stops_at_the_cut_run_and_no_median_uses_it(tmp_path):
    model, data = random_chain_problem(n=10, seed=2)
    cut = CutRun(fit=3, chunk=2)  # timed runs: A1 A2 B1 [B2 cut]; C never runs
    res = run_comparison(_compare_cfg(), model=model, train=data, log=lambda *a: None, callbacks=[cut])
    assert res["status"] == "interrupted" and res["interrupted_at"] == {"solver": "B", "seed": 2}
    assert cut.starts == 3 and cut.ends == ["max_passes"] * 3 + ["interrupted"]
    assert list(res["runs"]) == ["A", "B"]
    assert {s: r["status"] for s, r in res["runs"]["A"]["seeds"].items()} == {"1": "finished", "2": "finished"}
    b = res["runs"]["B"]["seeds"]
    assert b["1"]["status"] == "finished" and b["2"]["status"] == "interrupted"
    assert b["2"]["stopped_by"] == "interrupted"
    rows = {r["solver"]: r for r in summarise(res)}
    assert rows["A"]["runs"] == 2 and rows["B"]["runs"] == 1
    last_b1 = b["1"]["history"][-1]
    assert rows["B"]["gap"] == last_b1["gap"] and rows["B"]["oracle_calls"] == last_b1["oracle_calls"]
    assert finished_runs(res["runs"]["B"]) == [b["1"]]
    # the plot draws only finished runs: a cut run with an absurd history changes nothing
    b["2"]["history"] = [dict(last_b1, gap=1e30, oracle_calls=10 ** 9)]
    assert {r["solver"]: r for r in summarise(res)} == rows
    assert plot_comparison(res, tmp_path / "c.png").read_bytes()[:4] == b"\x89PNG"
    saved = json.loads(write_results(res, tmp_path).read_text())
    assert saved["status"] == "interrupted" and saved["runs"]["B"]["seeds"]["2"]["status"] == "interrupted"


def test_compare_with_every_run_of_a_solver_cut_has_no_row_for_it():
    model, data = random_chain_problem(n=10, seed=2)
    res = run_comparison(_compare_cfg(), model=model, train=data, log=lambda *a: None,
                         callbacks=[CutRun(fit=2, chunk=1)])  # B1 cut
    assert res["interrupted_at"] == {"solver": "B", "seed": 1} and list(res["runs"]["B"]["seeds"]) == ["1"]
    assert [r["solver"] for r in summarise(res)] == ["A"]


def test_compare_without_interrupt_marks_every_run_finished():
    model, data = random_chain_problem(n=10, seed=2)
    res = run_comparison(_compare_cfg(), model=model, train=data, log=lambda *a: None)
    assert res["status"] == "finished" and "interrupted_at" not in res
    assert all(s["status"] == "finished" for run in res["runs"].values() for s in run["seeds"].values())
    assert [r["runs"] for r in summarise(res)] == [2, 2, 2]


def test_old_results_without_status_use_stopped_by():
    res = {"n": 4, "runs": {"A": {"seeds": {
        "1": {"stopped_by": "max_passes", "history": [{"gap": 1.0, "primal": 2.0, "oracle_calls": 4, "solver_time": 1.0,
                                                        "gap_time": 0.0}]},
        "2": {"stopped_by": "interrupted", "history": [{"gap": 9.0, "primal": 9.0, "oracle_calls": 1, "solver_time": 0.1,
                                                         "gap_time": 0.0}]}}}}}
    (row,) = summarise(res)
    assert row["runs"] == 1 and row["gap"] == 1.0


# ------------------------------------------------------------------ torch-bcfw compare: a real SIGINT
def _cli(*args):
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    return subprocess.Popen([sys.executable, "-m", "torch_bcfw", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=ROOT, env=env)


def _interrupt_after(proc, prefix: str, wait: float = 1.5, timeout: float = 120.0):
    """Read the child's stdout until a line starts with ``prefix``, wait, then send SIGINT; returns
    ``(stdout, stderr)`` of the whole run."""
    lines = []
    t0 = time.monotonic()
    while True:
        line = proc.stdout.readline()
        if not line:
            out, err = proc.communicate(timeout=10)
            pytest.fail(f"the command ended before printing {prefix!r}: {''.join(lines) + out}\n{err}")
        lines.append(line)
        if line.startswith(prefix):
            break
        assert time.monotonic() - t0 < timeout, "".join(lines)
    time.sleep(wait)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=timeout)
    return "".join(lines) + out, err


@pytest.mark.heavy
def test_compare_command_exits_130_and_writes_the_finished_runs(tmp_path):
    cfg = tmp_path / "cmp.yaml"
    cfg.write_text(
        f"data: {{name: ocr, path: {shared_data('ocr')}, split: large, fold: 0, limit: 60}}\n"
        "lam: 0.01\nseeds: [1]\n"
        "options: {gap_check: 2, averaging: false, check_averaged: false, track_train_loss: false}\n"
        "solvers:\n"
        "  - {label: quick, preset: uniform-fw, options: {max_passes: 2}}\n"
        # long enough to be cut (a time budget so that a lost signal cannot hang the test)
        "  - {label: long, preset: uniform-fw, options: {max_passes: 10000000, gap_check: 1000000, time_budget: 60}}\n"
        "  - {label: never, preset: uniform-fw, options: {max_passes: 2}}\n"
    )
    out_dir = tmp_path / "out"
    proc = _cli("compare", "--config", str(cfg), "--output", str(out_dir))
    t0 = time.monotonic()
    out, err = _interrupt_after(proc, "quick")
    assert proc.returncode == 130, (out, err)
    assert time.monotonic() - t0 < 40  # the long run was cut, not run to its time budget
    assert "interrupted" in err and "1 finished run(s)" in err
    res = json.loads((out_dir / "comparison.json").read_text())
    assert res["status"] == "interrupted" and res["interrupted_at"] == {"solver": "long", "seed": 1}
    assert list(res["runs"]) == ["quick", "long"]
    assert res["runs"]["quick"]["seeds"]["1"]["status"] == "finished"
    assert res["runs"]["long"]["seeds"]["1"]["status"] == "interrupted"
    assert (out_dir / "comparison.png").read_bytes()[:4] == b"\x89PNG"
    table = [line.split()[0] for line in out.splitlines() if line.startswith(("quick", "long", "never"))]
    assert table == ["quick", "long", "quick"]  # log line, "long ... interrupted", then the table: quick only
    assert "long" in out and "interrupted (not counted)" in out


# ------------------------------------------------------------------ regularization path and grid search
def test_path_drops_the_cut_solve_and_keeps_a_certified_lower_limit():
    model, data = random_chain_problem(n=8, F=3, K=3, max_len=4, seed=9)
    full = regularization_path(model, data, eps=0.1, lam_min=1e-3)
    assert len(full.points) >= 4
    cut = CutRun(fit=2, chunk=1)  # the third inner solve (breakpoint 4) is cut
    path = regularization_path(model, data, eps=0.1, lam_min=1e-3, callbacks=[cut])
    assert path.stopped_by == "interrupted" and cut.ends[-1] == "interrupted" and cut.starts == 2
    assert len(path.points) == 3 and len(path.predicted_gaps) == 2
    assert all(p.stopped_by in ("init", "gap_tol", "converged") for p in path.points)
    assert path.lams == full.lams[:3]
    assert all(p.train_loss is not None for p in path.points)
    # the lower limit is the cut breakpoint's lam, where the previous point is still certified eps-approximate
    assert path.lower_limit == pytest.approx(full.lams[3])
    assert path.certificate(model, data, path.lower_limit * (1 + 1e-12)).gap <= 0.1 + 1e-9
    assert path.best("train_loss") in path.points


def test_path_interrupted_outside_a_solve_and_before_its_first_point():
    model, data = random_chain_problem(n=8, F=3, K=3, max_len=4, seed=9)
    path = regularization_path(model, data, eps=0.1, lam_min=1e-3, callbacks=[CutRun(fit=1, how="start")])
    assert path.stopped_by == "interrupted" and len(path.points) == 2 and len(path.predicted_gaps) == 1
    assert path.lower_limit == path.lams[-1]  # from the last point's own certificate


def test_path_interrupted_before_its_first_point_raises(monkeypatch):
    """When the closed-form start is not within kappa eps (box constraints can do that) the path solves at
    lam_inf first; cut there, nothing is finished and the interrupt propagates."""
    import dataclasses

    from torch_bcfw.solvers import path as path_mod

    model, data = random_chain_problem(n=8, F=3, K=3, max_len=4, seed=9)
    real = path_mod.BCFW.certificate
    calls = []

    def first_too_large(self):  # the start's certificate reads too large: a solve at lam_inf is needed
        c = real(self)
        calls.append(1)
        return dataclasses.replace(c, gap=1e9) if len(calls) == 1 else c

    monkeypatch.setattr(path_mod.BCFW, "certificate", first_too_large)
    cut = CutRun(fit=0, chunk=1)
    with pytest.raises(KeyboardInterrupt):
        regularization_path(model, data, eps=0.1, lam_min=1e-3, callbacks=[cut])
    assert cut.starts == 0 and cut.ends == ["interrupted"]


@pytest.mark.parametrize("warm", [True, False])
def test_grid_search_drops_the_cut_lam(warm):
    model, data = random_chain_problem(n=8, F=3, K=3, max_len=4, seed=9)
    grid = [2.0 ** k for k in range(4, -7, -1)]
    sw = grid_search(model, data, grid, eps=0.1, warm_start=warm, callbacks=[CutRun(fit=3, chunk=1)])
    assert sw.stopped_by == "interrupted" and sw.lams == grid[:3]
    assert all(p.stopped_by in ("gap_tol", "converged") and p.gap <= 0.1 + 1e-12 for p in sw.points)


@pytest.mark.heavy
def test_path_command_exits_130_and_writes_the_finished_breakpoints(tmp_path):
    out_dir = tmp_path / "path"
    # a small eps and lam_min give a long path; the warm grid must never start
    proc = _cli("path", "--config", "configs/ocr_path.yaml", "--set", f"data.path={shared_data('ocr')}",
                "--set", "data.limit=100", "--set", "path.eps=0.002", "--set", "path.lam_min=1e-9",
                "--set", "path.time_budget=60", "--set", "grid.warm=true", "--output", str(out_dir))
    t0 = time.monotonic()
    out, err = _interrupt_after(proc, "[path]", wait=0.5)
    assert proc.returncode == 130, (out, err)
    assert time.monotonic() - t0 < 40
    assert "interrupted during the path" in err
    path = json.loads((out_dir / "path.json").read_text())
    assert path["stopped_by"] == "interrupted" and len(path["points"]) >= 1
    assert all(p["stopped_by"] in ("init", "gap_tol", "converged") for p in path["points"])
    summary = json.loads((out_dir / "summary.json").read_text())
    assert summary["status"] == "interrupted" and summary["interrupted_in"] == "path"
    assert summary["selected_lam"] in [p["lam"] for p in path["points"]]
    assert not (out_dir / "grid_warm.json").exists() and "grid (warm)" not in summary


# ------------------------------------------------------------------ the Lightning callback
def _lightning():
    pytest.importorskip("lightning", reason="the [lightning] extra is not installed")
    import lightning.pytorch as pl
    from test_lightning import Toy, _trainer

    from torch_bcfw.lightning import BCFWCallback
    from torch_bcfw.lightning import callback as cb_mod

    return pl, Toy, _trainer, BCFWCallback, cb_mod


def _cut_solve(monkeypatch, cb_mod, call: int, how: str = "raise") -> list:
    """Ctrl-C inside the ``call``-th solve of the BCFW callback (0-based, counting the initial solve), at its
    second chunk: its solver loop gets a :class:`CutRun`.  Returns the list of stop reasons of every solve.
    (The callback solves through :class:`~torch_bcfw.solvers.run.SolverRun`, whose module calls ``run_solver``.)"""
    from torch_bcfw.solvers import run as run_mod

    real = run_mod.run_solver
    ends = []

    def run_solver(alg, options, callbacks=(), **kw):
        k = len(ends)
        extra = (CutRun(fit=0, chunk=2, how=how),) if k == call else ()
        out = real(alg, options, callbacks=tuple(callbacks) + extra, **kw)
        ends.append(out.stopped_by)
        return out

    monkeypatch.setattr(run_mod, "run_solver", run_solver)
    return ends


def _recorder(pl, cb):
    class Recorder(pl.Callback):
        """After the BCFW callback in the list: what the head and the callback hold after every epoch's solve."""

        def __init__(self):
            self.epochs, self.snapshots, self.exceptions = [], [], []

        def on_train_epoch_start(self, trainer, pl_module):
            self.epochs.append(trainer.current_epoch)

        def on_train_epoch_end(self, trainer, pl_module):
            self.snapshots.append({"w": pl_module.head.w.detach().clone(), "dual_sd": copy.deepcopy(cb.dual_sd),
                                   "alg_sd": copy.deepcopy(cb.alg_sd), "counters": dict(cb.counters),
                                   "history": copy.deepcopy(cb.history), "calls": cb.calls,
                                   "metrics": {k: float(v) for k, v in trainer.callback_metrics.items()
                                               if k.startswith("ssvm/")}})

        def on_exception(self, trainer, pl_module, exception):
            self.exceptions.append(exception)

    return Recorder()


def _fit_interrupted(trainer, module):
    """Lightning turns a KeyboardInterrupt into a graceful shutdown (2.x: then ``sys.exit(1)``)."""
    try:
        trainer.fit(module)
    except SystemExit as exc:
        assert exc.code == 1
    from lightning.pytorch.trainer.states import TrainerStatus

    assert trainer.state.status == TrainerStatus.INTERRUPTED and trainer.interrupted


@pytest.mark.parametrize("how", ["raise", "signal"])
def test_callback_interrupt_ends_training_and_keeps_the_last_finished_solve(tmp_path, monkeypatch, how):
    pl, Toy, _trainer, BCFWCallback, cb_mod = _lightning()
    _, raw = random_chain_problem(n=8, F=4, K=3, max_len=3, seed=1)
    lam = 0.1
    cb = BCFWCallback(lam=lam, passes_per_call=3, averaging=False)
    rec = _recorder(pl, cb)
    ends = _cut_solve(monkeypatch, cb_mod, call=2, how=how)  # initial solve, epoch 0, [epoch 1 cut]
    module = Toy(raw)
    trainer = _trainer(tmp_path, [cb, rec], epochs=5)
    _fit_interrupted(trainer, module)
    assert ends == ["max_passes", "max_passes", "interrupted"]
    assert rec.epochs == [0, 1]  # training did not go on after the cut solve (epochs 2-4 never ran)
    assert len(rec.exceptions) == 1 and isinstance(rec.exceptions[0], KeyboardInterrupt)
    assert cb.interrupted
    # everything is the state after the last finished solve (epoch 0): nothing of the cut one
    (snap,) = rec.snapshots
    assert torch.equal(module.head.w, snap["w"])
    assert cb.calls == snap["calls"] == 2 and cb.counters == snap["counters"]
    assert cb.history == snap["history"] and [h.epoch for h in cb.history] == [0, 0]
    assert cb.last_record is cb.history[-1]
    assert cb.alg_sd == snap["alg_sd"]
    for k, v in snap["dual_sd"].items():
        assert (torch.equal(cb.dual_sd[k], v) if isinstance(v, torch.Tensor) else k == "storage" or cb.dual_sd[k] == v), k
    assert all(torch.equal(cb.dual_sd["storage"][k], v) for k, v in snap["dual_sd"]["storage"].items())
    # the head's weights are the state's w, and the logged certificate is theirs (at that call's features)
    assert torch.allclose(cb.dual_sd["w"], module.head.w, atol=1e-12)
    ell = float(cb.dual_sd["block_ell"].sum())
    c = certify(module.head.model, cb.last_data, module.head.w, ell, lam)
    assert c.gap == pytest.approx(cb.last_record.gap, rel=1e-10, abs=1e-12)
    assert snap["metrics"]["ssvm/gap"] == pytest.approx(cb.last_record.gap, rel=1e-12)
    logged = {k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("ssvm/")}
    assert logged == snap["metrics"]
    # the checkpoint state of the callback resumes from the finished solve
    sd = cb.state_dict()
    assert sd["calls"] == 2 and len(sd["history"]) == 2


def test_callback_interrupt_in_the_initial_solve_leaves_the_head_untouched(tmp_path, monkeypatch):
    pl, Toy, _trainer, BCFWCallback, cb_mod = _lightning()
    _, raw = random_chain_problem(n=8, F=4, K=3, max_len=3, seed=1)
    cb = BCFWCallback(lam=0.1, passes_per_call=3, averaging=False)
    rec = _recorder(pl, cb)
    ends = _cut_solve(monkeypatch, cb_mod, call=0)
    module = Toy(raw)
    w0 = module.head.w.detach().clone()
    _fit_interrupted(_trainer(tmp_path, [cb, rec], epochs=3), module)
    assert ends == ["interrupted"] and rec.epochs == [] and rec.snapshots == []
    assert torch.equal(module.head.w, w0)
    assert cb.calls == 0 and cb.history == [] and cb.dual_sd is None and cb.last_record is None and cb.counters == {}


def test_sigint_during_the_callback_commit_is_delivered_after_it(monkeypatch):
    """The head and the callback's state are written with Ctrl-C held back: a SIGINT there is raised once the
    write is complete, never in the middle of it."""
    from torch_bcfw.runtime.signals import deferred_signals

    done = []
    with pytest.raises(KeyboardInterrupt):
        with deferred_signals((signal.SIGINT,)):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)
            done.append(1)
    assert done == [1] and signal.getsignal(signal.SIGINT) is signal.default_int_handler
