"""One plan per run (``torch_bcfw.planning``): every ``"auto"`` choice of a run resolved by one call before any
solver exists, measured only when a choice needs it; ``lam`` handed once through each module on its way from ``fit``
to the first block step; the solvers only check that nothing is left on ``"auto"``."""
from __future__ import annotations

import importlib
import importlib.util
import sys

import pytest

import torch_bcfw as tb
from conftest import random_chain_problem, random_multiclass_problem
from torch_bcfw import fit, planning
from torch_bcfw.solvers.bcfw import BCFW
from torch_bcfw.solvers.options import SolverOptions
from torch_bcfw.solvers.run import make_algorithm, options_for

LAM = 0.1


@pytest.fixture
def counted(monkeypatch):
    """Counts of the calls of ``plan_run`` (from ``fit`` and the callback), of the preset's resolution and of the
    timing helper."""
    calls = {"plan_run": 0, "resolve_auto_preset": 0, "seconds_per_block": 0}

    def counting(name, fn):
        def wrapper(*args, **kw):
            calls[name] += 1
            return fn(*args, **kw)
        return wrapper

    plan = counting("plan_run", planning.plan_run)
    monkeypatch.setattr(importlib.import_module("torch_bcfw.fit"), "plan_run", plan)  # (tb.fit is the function)
    if importlib.util.find_spec("lightning") is not None:
        monkeypatch.setattr(importlib.import_module("torch_bcfw.lightning.callback"), "plan_run", plan)
    for name in ("resolve_auto_preset", "seconds_per_block"):
        monkeypatch.setattr(planning, name, counting(name, getattr(planning, name)))
    return calls


@pytest.mark.parametrize("options", [{}, {"preset": "auto"}, {"batch_size": 4}, {"batch_size": 4, "preset": "auto"}])
def test_a_fit_plans_once_and_measures_nothing_on_the_cpu(counted, options):
    model, data = random_chain_problem(n=8, F=4, K=3, max_len=3, seed=1)
    r = fit(model, data, LAM, max_passes=2, **options)
    assert counted == {"plan_run": 1, "resolve_auto_preset": 1, "seconds_per_block": 0}
    assert r.options.batch_size == options.get("batch_size", 1)
    if options.get("preset") == "auto":  # the chain's compiled steps; rounds take FW steps
        assert r.options.extra["auto"]["chosen"] == ("uniform-fw" if "batch_size" in options else "gap-pairwise")


def test_the_callback_plans_once_per_solve(counted):
    pytest.importorskip("lightning", reason="the [lightning] extra is not installed")
    from test_lightning import Toy

    from torch_bcfw.lightning import BCFWCallback

    _, raw = random_chain_problem(n=8, F=4, K=3, max_len=3, seed=1)
    cb = BCFWCallback(lam=LAM, passes_per_call=2, preset="auto")
    cb.solve(None, Toy(raw), 2.0, log=False)
    cb.solve(None, Toy(raw), 2.0, log=False)
    assert counted == {"plan_run": 2, "resolve_auto_preset": 2, "seconds_per_block": 0}
    assert cb.round_size == 1 and cb.solve_device == "cpu" and cb.calibration == {}


def test_lam_passes_each_module_once_from_fit_to_the_first_block_step():
    """The modules a call hands ``lam`` into (an argument named ``lam``, from a function of another module), in
    order, until the first chunk of block steps; ``torch_bcfw.checks`` (the argument checks every door calls) aside."""
    model, data = random_chain_problem(n=8, F=4, K=3, max_len=3, seed=1)
    fit(model, data, LAM, max_passes=1)  # compiled kernels: no compiler frames in the trace
    entered, done = [], []

    def profile(frame, event, arg):
        if event != "call" or done:
            return
        code, module = frame.f_code, frame.f_globals.get("__name__", "")
        if code.co_name == "advance":
            done.append(module)
            return
        caller = frame.f_back.f_globals.get("__name__", "") if frame.f_back is not None else ""
        if ("lam" in code.co_varnames[:code.co_argcount + code.co_kwonlyargcount] and module != caller
                and module.startswith("torch_bcfw") and module != "torch_bcfw.checks"):
            entered.append(module)

    sys.setprofile(profile)
    try:
        fit(model, data, LAM, max_passes=1, preset="auto")
    finally:
        sys.setprofile(None)
    assert done == ["torch_bcfw.solvers.bcfw"]
    assert entered[:4] == ["torch_bcfw.fit", "torch_bcfw.planning", "torch_bcfw.head_solve", "torch_bcfw.solvers.run"]
    assert len(entered) == len(set(entered)), entered


def test_the_plan_resolves_every_auto_choice():
    model, data = random_chain_problem(n=8, F=4, K=3, max_len=3, seed=1)
    plan = planning.plan_run(model, data, LAM, "bcfw", options_for("bcfw", preset="auto"))
    assert (plan.round_size, plan.strategy, plan.comm, plan.group, plan.placement) == (1, "auto", None, None, {})
    assert plan.options.extra["auto"]["chosen"] == "gap-pairwise" and plan.data is plan.data_here() is data
    fw = planning.plan_run(model, data, LAM, "fw", options_for("fw"))
    assert fw.round_size == 1 and fw.record() == {}
    rounds = planning.plan_run(model, data, LAM, "bcfw", options_for("bcfw", batch_size=4, preset="auto"))
    assert rounds.options.extra["auto"]["chosen"] == "uniform-fw"
    # the continuation of a saved run keeps its round size
    assert planning.plan_run(model, data, LAM, "bcfw", options_for("bcfw"), saved="replicate",
                             saved_round_size=3).round_size == 3


def test_the_solvers_only_check_that_nothing_is_left_on_auto():
    model, data = random_multiclass_problem(n=6, F=3, K=3, seed=0)
    with pytest.raises(ValueError, match="nothing left on 'auto'.*plan_run"):
        BCFW(model, data, LAM, SolverOptions())
    with pytest.raises(ValueError, match="nothing left on 'auto'.*preset='auto'"):
        BCFW(model, data, LAM, options_for("bcfw", preset="auto", batch_size=1))
    with pytest.raises(ValueError, match="batch_size = 'auto'.*plan_run"):
        make_algorithm("fw", model, data, LAM, SolverOptions())
    assert BCFW(model, data, LAM, SolverOptions(batch_size=1)).batch_size == 1


def test_a_warm_start_from_fit_in_memory_trusts_its_state_and_from_a_file_does_not(tmp_path):
    model, data = random_chain_problem(n=8, F=4, K=3, max_len=3, seed=1)
    first = fit(model, data, LAM, max_passes=2)
    assert first.trust is not None
    first.save(tmp_path / "r.pt")
    assert tb.FitResult.load(tmp_path / "r.pt").trust is None
    assert fit(model, data, LAM, max_passes=1, init=first).trust == first.trust
