"""The run object shared by ``fit`` and ``BCFWCallback`` (``SolverRun``) and the typed check record (``CheckRecord``):
one solver table, exact resume through ``state_dict``, records that read and save as the dicts of before."""
from __future__ import annotations

import copy
import importlib
import json

import pytest
import torch

from conftest import random_chain_problem, random_multiclass_problem
from torch_bcfw import CheckRecord, FitResult, fit, head_solve
from torch_bcfw.io.tree_file import load_tree, save_tree
from torch_bcfw.solvers import run as run_mod
from torch_bcfw.solvers.bcfw import BCFW
from torch_bcfw.solvers.options import SolverOptions
from torch_bcfw.solvers.record import RECORD_FIELDS, as_records, plain_history
from torch_bcfw.solvers.run import ALGORITHMS, DUAL_STATE_SOLVERS, SOLVERS, SolverRun

LAM = 0.1

#: the columns of a check, in the order of the saved dicts
LEGACY_COLUMNS = ("passes", "oracle_calls", "cache_hits", "steps", "primal", "dual", "gap_last", "primal_avg",
                  "dual_avg", "gap_avg", "selected", "gap", "train_loss", "test_loss", "solver_time", "gap_time",
                  "gap_oracle_calls")


def _chain():
    return random_chain_problem(n=8, F=4, K=3, max_len=3, seed=1)


# ---------------------------------------------------------------------- one solver table
def test_one_solver_table():
    assert tuple(ALGORITHMS) == SOLVERS
    assert DUAL_STATE_SOLVERS == ("bcfw", "fw", "mp-bcfw")
    fit_mod = importlib.import_module("torch_bcfw.fit")  # (the package's ``fit`` attribute is the function)

    assert fit_mod.HeadSolve is head_solve.HeadSolve and head_solve.SolverRun is SolverRun
    assert not hasattr(fit_mod, "_ALGORITHMS")
    with pytest.raises(ValueError, match="unknown solver 'nope'"):
        SolverRun(*_chain(), LAM, "nope")


def test_fit_and_the_callback_build_their_algorithm_through_the_run(tmp_path, monkeypatch):
    pytest.importorskip("lightning", reason="the [lightning] extra is not installed")
    from test_lightning import Toy

    from torch_bcfw.lightning import BCFWCallback
    from torch_bcfw.lightning import callback as cb_mod

    assert cb_mod.HeadSolve is head_solve.HeadSolve and not hasattr(cb_mod, "_ALGORITHMS")
    built = []

    class Spy(BCFW):
        def __init__(self, *args, **kw):
            built.append(kw.get("state") is not None)
            super().__init__(*args, **kw)

    monkeypatch.setitem(run_mod.ALGORITHMS, "bcfw", Spy)
    model, data = _chain()
    fit(model, data, LAM, max_passes=2)
    _, raw = _chain()
    cb = BCFWCallback(lam=LAM, passes_per_call=2)
    rec = cb.solve(None, Toy(raw), 2.0, log=False)
    assert built == [False, True]  # fit: the model's new state; the callback: its (re-bound) state
    assert isinstance(rec, CheckRecord) and rec.stale == 0.0 and rec.extra["call"] == 0
    rec2 = cb.solve(None, Toy(raw), 2.0, log=False)
    assert rec2.oracle_calls == 2 * rec.oracle_calls  # load_progress: the oracle calls go on
    assert [type(r) for r in cb.history] == [CheckRecord, CheckRecord]


def test_callback_checkpoint_holds_plain_dicts_and_loads_records(tmp_path):
    pytest.importorskip("lightning", reason="the [lightning] extra is not installed")
    from test_lightning import Toy

    from torch_bcfw.lightning import BCFWCallback

    _, raw = _chain()
    cb = BCFWCallback(lam=LAM, passes_per_call=2)
    cb.solve(None, Toy(raw), 2.0, log=False)
    save_tree(cb.state_dict(), tmp_path / "callback.safetensors")  # tensors and JSON only
    sd = load_tree(tmp_path / "callback.safetensors")
    assert all(type(h) is dict for h in sd["history"]) and sd["history"][0]["stale"] == 0.0
    again = BCFWCallback(lam=LAM, passes_per_call=2)
    again.load_state_dict(sd)
    assert again.history == cb.history and isinstance(again.last_record, CheckRecord)


# ---------------------------------------------------------------------- the run object
def test_run_resumes_from_its_state_dict_bit_for_bit():
    model, data = random_multiclass_problem(n=9, F=3, K=4, seed=2)
    opts = run_mod.options_for("bcfw", max_passes=2, gap_check=1, preset="gap-pairwise", seed=3, batch_size=1)
    whole = SolverRun(model, data, LAM, "bcfw", opts)
    whole.run(4)
    first = SolverRun(model, data, LAM, "bcfw", opts)
    first.run()
    saved = first.state_dict()
    assert all(type(h) is dict for h in saved["history"])
    rest = SolverRun(model, data, LAM, "bcfw", opts, saved=copy.deepcopy(saved))
    rest.run()
    untimed = [[v for k, v in r.to_dict().items() if not k.endswith("_time")] for r in whole.history]
    assert [[v for k, v in r.to_dict().items() if not k.endswith("_time")] for r in rest.history] == untimed
    assert all(isinstance(r, CheckRecord) for r in rest.history)
    assert torch.equal(rest.state.w, whole.state.w)
    assert rest.counters["work"] == whole.counters["work"] and rest.passes == whole.passes == 4


def test_run_refuses_another_solver_lam_or_sampling():
    model, data = random_multiclass_problem(n=6, F=3, K=3, seed=0)
    saved = SolverRun(model, data, LAM, "bcfw", SolverOptions(max_passes=1, batch_size=1)).state_dict()
    with pytest.raises(ValueError, match="cannot warm-start solver 'fw'"):
        SolverRun(model, data, LAM, "fw", saved=saved)
    with pytest.raises(ValueError, match="cannot warm-start at lam"):
        SolverRun(model, data, 2 * LAM, "bcfw", saved=saved)
    with pytest.raises(ValueError, match="cannot warm-start with"):
        SolverRun(model, data, LAM, "bcfw", SolverOptions(sampling="perm", batch_size=1), saved=saved)


# ---------------------------------------------------------------------- the check record
def test_record_fields_and_types():
    model, data = _chain()
    r = fit(model, data, LAM, max_passes=2, gap_check=1)
    rec = r.history[-1]
    assert isinstance(rec, CheckRecord) and RECORD_FIELDS == LEGACY_COLUMNS
    assert tuple(rec.to_dict()) == LEGACY_COLUMNS and rec.extra == {}
    for name in ("passes", "primal", "dual", "gap_last", "primal_avg", "dual_avg", "gap_avg", "gap", "train_loss",
                 "solver_time", "gap_time"):
        assert type(getattr(rec, name)) is float, name
    for name in ("oracle_calls", "cache_hits", "steps", "gap_oracle_calls"):
        assert type(getattr(rec, name)) is int, name
    assert rec.selected in ("last", "averaged") and rec.test_loss is None
    assert not hasattr(rec, "epoch") and CheckRecord.from_dict(rec.to_dict()) == rec


def test_record_columns_update_and_equality():
    rec = CheckRecord(passes=1.0, oracle_calls=3, gap=0.5)
    rec.update({"approx_steps": 7}, epoch=2, gap=0.25)
    assert rec.gap == 0.25 and rec.extra == {"approx_steps": 7, "epoch": 2}
    assert list(rec.to_dict())[-2:] == ["approx_steps", "epoch"] and rec.epoch == 2 and rec.approx_steps == 7
    d = rec.to_dict()
    assert CheckRecord.from_dict(d) == rec and CheckRecord.from_dict({**d, "epoch": 3}) != rec
    assert copy.deepcopy(rec) == rec and copy.deepcopy(rec) is not rec
    with pytest.raises(AttributeError, match="no column 'nope'"):
        rec.nope
    with pytest.raises(TypeError):
        rec["gap"]  # one way to read a record: attributes
    with pytest.raises(TypeError):
        hash(rec)


def test_history_json_is_the_format_of_plain_dicts(tmp_path):
    model, data = random_multiclass_problem(n=6, F=3, K=3, seed=1)
    r = fit(model, data, LAM, "mp-bcfw", max_passes=2, gap_check=1)
    r.write_history_json(tmp_path / "h.json")
    text = (tmp_path / "h.json").read_text()
    hist = json.loads(text)["history"]
    assert hist == [rec.to_dict() for rec in r.history] == plain_history(r.history)
    assert tuple(hist[-1])[:len(LEGACY_COLUMNS)] == LEGACY_COLUMNS and "approx_steps" in hist[-1]
    # the same text as the history written as plain dicts
    plain = json.dumps({"solver": r.solver, "lam": r.lam, "options": r.options.to_dict(), "stopped_by": r.stopped_by,
                        "history": [rec.to_dict() for rec in r.history]}, indent=1)
    assert text == plain


def test_saved_result_round_trip_and_a_history_with_absent_columns(tmp_path):
    model, data = _chain()
    r = fit(model, data, LAM, max_passes=2, gap_check=1)
    r.save(tmp_path / "r.safetensors")
    raw = load_tree(tmp_path / "r.safetensors")
    assert all(type(h) is dict for h in raw["history"])
    back = FitResult.load(tmp_path / "r.safetensors")
    assert back.history == r.history and all(isinstance(h, CheckRecord) for h in back.history)
    assert back.gap == r.gap and back.primal == r.primal and back.selected == r.selected
    # a history of plain dicts with some columns absent
    old = [{k: v for k, v in h.items() if k not in ("cache_hits", "gap_oracle_calls")} for h in raw["history"]]
    raw["history"] = old
    save_tree(raw, tmp_path / "old.safetensors")
    loaded = FitResult.load(tmp_path / "old.safetensors")
    assert [h.to_dict() for h in loaded.history] == old and "cache_hits" not in loaded.history[-1].to_dict()
    assert loaded.history[-1].cache_hits is None and loaded.history[-1].cache_hits is None
    assert FitResult.to_dict(loaded)["history"] == old  # saved again as it was
    cont = fit(model, data, LAM, init=loaded, max_passes=1, gap_check=1)  # and a warm start continues it
    assert [h.to_dict() for h in cont.history[:len(old)]] == old and len(cont.history) == len(old) + 1


def test_as_records_copies():
    recs = as_records([{"passes": 1.0, "epoch": 0}])
    again = as_records(recs)
    again[0].update(epoch=5)
    assert recs[0].epoch == 0 and again[0].passes == 1.0


def test_the_progress_bar_and_the_log_show_the_certified_gap(capsys):
    """The bar (and PrintLogger's line) show ``gap`` = the certified gap of the returned model and its primal."""
    from torch_bcfw.solvers.callbacks import PrintLogger, _fmt

    model, data = _chain()
    lines = []
    r = fit(model, data, LAM, max_passes=3, gap_check=1, progress=True, callbacks=[PrintLogger(lines.append)])
    err = capsys.readouterr().err
    assert f"gap={_fmt(r.gap)} primal={_fmt(r.primal)}" in err
    assert f"gap {_fmt(r.gap)}  primal {_fmt(r.primal)}" in lines[-2] and "gap(last)" in lines[-2]


def test_a_new_solver_is_its_module_and_one_table_entry(monkeypatch):
    """docs/anatomy.md's tiny solver, given one entry in ``ALGORITHMS``: ``fit`` runs it with its own option (flat,
    ``cs_step``), certifies its primal value independently, and every other solver refuses that option."""
    from pathlib import Path

    from conftest import brute_force_primal
    from test_docs import code_blocks

    page = Path(__file__).resolve().parents[1] / "docs" / "anatomy.md"
    lines = page.read_text(encoding="utf-8").splitlines()
    start = lines.index("<!-- anatomy: tiny solver -->") + 2
    block = next(b for b in code_blocks(page) if b.line == start + 1)
    ns = {"__name__": "__anatomy__"}
    exec(compile(block.source, str(page), "exec", dont_inherit=True), ns)  # noqa: S102 -- the page's own code
    monkeypatch.setitem(ALGORITHMS, "constant-step", ns["ConstantStepSubgradient"])
    model, data = random_multiclass_problem(n=6, F=3, K=3, seed=2)
    r = fit(model, data, LAM, "constant-step", cs_step=0.05, max_passes=20, gap_check=10)
    assert r.options.own == ns["ConstantStepOptions"](step=0.05) and r.gap is None
    assert r.primal == pytest.approx(brute_force_primal(model, data, r.w, LAM), abs=1e-12)
    with pytest.raises(TypeError, match="belong to solver 'constant-step', not 'bcfw'"):
        fit(model, data, LAM, "bcfw", cs_step=0.05)
    with pytest.raises(ValueError, match="cs_step must be a finite number > 0"):
        fit(model, data, LAM, "constant-step", cs_step=-1.0)
