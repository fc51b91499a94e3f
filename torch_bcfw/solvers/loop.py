"""The solver loop shared by every algorithm: chunks of steps, exact gap checks, stopping rules.

Stopping rules: ``max_passes`` more passes (``n`` block iterations each: oracle calls, plus cache hits
for a cached BCFW), a certified gap ``<= gap_tol`` (or ``gap / primal <= rel_gap_tol``), the ``time_budget`` (wall-clock seconds, steps and
checks together), Ctrl-C (or SIGTERM where a handler turns it into ``KeyboardInterrupt``, as the command line
does; held back until the current chunk of steps ends, see :mod:`torch_bcfw.signals`), or an algorithm that certifies it cannot progress (``converged``: every exact
block gap is zero).  In every case the loop ends with an exact certificate of the model it returns.

The exact gap check (the algorithm's :meth:`~torch_bcfw.solvers.algorithm.Algorithm.certificate`) runs
every ``gap_check`` passes, and at once when the algorithm asks for it (gap sampling whose estimates are
all zero).  For the refined BCFW the check is also the batch gap pass that refreshes the block-gap
estimates and the global gap of the cache test (Osokin et al. 2016, Alg. 2).
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

from ..signals import deferred_signals
from .certificate import task_loss
from .record import CheckRecord

__all__ = ["run_solver", "RunOutput"]


@dataclass
class RunOutput:
    """What :func:`run_solver` returns.

    Attributes:
        history: the :class:`~torch_bcfw.solvers.record.CheckRecord` of every check (the caller's list, extended).
        stopped_by: the stopping rule that ended the run.
        checked_weights: ``(w, w_avg or None)``, copies of the iterates the last completed check of this run
            certified (``None`` when no check completed).  After a second Ctrl-C during the final check the
            algorithm has moved past them: these, not the algorithm's current iterates, go with
            ``history[-1]``.
    """

    history: list = field(default_factory=list)
    stopped_by: str = ""
    checked_weights: tuple | None = None


def _check(alg, options, test_data, counters: dict, out: RunOutput) -> CheckRecord:
    """Exact certificate of the last (and averaged) iterate; returns the history record and stores copies of
    the certified iterates in ``out.checked_weights`` once the record is complete."""
    t0 = time.perf_counter()
    model = alg.model
    w, ell = alg.iterate()
    cert = alg.certificate()
    rec = CheckRecord(passes=alg.oracle_calls / alg.n, oracle_calls=alg.oracle_calls, cache_hits=alg.cache_hits,
                      steps=alg.work, primal=cert.primal, dual=cert.dual, gap=cert.gap)
    avg = alg.averaged()
    if avg is not None and options.check_averaged:
        c2 = alg.certify_point(avg[0], avg[1])
        rec.primal_avg, rec.dual_avg, rec.gap_avg = c2.primal, c2.dual, c2.gap
    # any dual-feasible point bounds P* from below: certify the better primal against the better dual
    primals = [(rec.primal, "last")] + ([(rec.primal_avg, "averaged")] if rec.primal_avg is not None else [])
    duals = [d for d in (rec.dual, rec.dual_avg) if d is not None]
    best_primal, rec.selected = min(primals)
    rec.gap_best = best_primal - max(duals) if duals else None
    w_model = avg[0] if rec.selected == "averaged" else w
    rec.train_loss = alg.task_loss(w_model) if options.track_train_loss else None
    rec.test_loss = task_loss(model, test_data, w_model) if test_data is not None else None
    counters["gap_time"] += time.perf_counter() - t0
    counters["gap_oracle_calls"] += alg.n * (2 if rec.gap_avg is not None else 1)
    rec.solver_time = counters["solver_time"]
    rec.gap_time = counters["gap_time"]
    rec.gap_oracle_calls = counters["gap_oracle_calls"]
    out.checked_weights = (w.detach().clone(), None if avg is None else avg[0].detach().clone())
    return rec


def _same_check(prev: dict | None, rec: dict) -> bool:
    """Whether ``rec`` certifies the same point on the same data as ``prev`` (same work, same values)."""
    keys = ("steps", "oracle_calls", "primal", "dual", "primal_avg", "dual_avg")
    return prev is not None and all(prev.get(k) == rec.get(k) for k in keys)


def _certified_gap(rec: dict) -> float:
    return rec["gap_best"] if rec.get("gap_best") is not None else math.inf


def _relative_gap(rec: dict) -> float:
    g = _certified_gap(rec)
    primal = min(p for p in (rec["primal"], rec.get("primal_avg")) if p is not None)
    return g / primal if primal > 0 else (0.0 if g <= 0 else math.inf)


def run_solver(alg, options, test_data=None, callbacks=(), counters: dict | None = None,
               history: list | None = None, after_iteration=None) -> RunOutput:
    """Run ``alg`` for ``options.max_passes`` more effective passes (or until another stopping rule).

    ``counters`` (``solver_time``, ``gap_time``, ``gap_oracle_calls``, and ``work``: the algorithm's block
    iterations so far) and ``history`` continue a previous run when given (warm start); they are updated in
    place.  ``after_iteration(out)`` (optional) is called after every chunk of steps and its checks, at a point
    where the algorithm's state, ``out.history`` and ``out.checked_weights`` are consistent (checkpoints).
    """
    counters = counters if counters is not None else {}
    for key in ("solver_time", "gap_time", "gap_oracle_calls", "work"):
        counters.setdefault(key, 0.0 if key not in ("gap_oracle_calls", "work") else 0)
    out = RunOutput(history=history if history is not None else [])
    n = alg.n
    start_work = alg.work
    target_work = start_work + int(round(options.max_passes * n))
    for cb in callbacks:
        cb.on_start({"solver": alg.name, "n": n, "lam": alg.lam, "max_passes": options.max_passes,
                     "options": options.to_dict()})
    wall0 = time.perf_counter()
    last_rec = None
    checked_at = None
    try:
        while True:
            if alg.work >= target_work:
                out.stopped_by = "max_passes"
                break
            m = min(alg.chunk_size(), target_work - alg.work)
            t0 = time.perf_counter()
            with deferred_signals():  # Ctrl-C / SIGTERM take effect between chunks, never inside a step
                alg.advance(m)
            counters["solver_time"] += time.perf_counter() - t0
            if alg.converged:
                out.stopped_by = "converged"
                break
            passes = alg.work / n
            for cb in callbacks:
                cb.on_chunk(passes - start_work / n, time.perf_counter() - wall0)
            early = getattr(options, "early_gap_check", None)
            if early is not None and options.gap_tol is not None and not alg.check_requested:
                est = alg.estimated_gap()
                alg.check_requested = est is not None and est <= early * options.gap_tol
            if alg.work % (options.gap_check * n) == 0 or alg.check_requested:
                alg.check_requested = False
                with deferred_signals():
                    alg.on_scheduled_check()
                last_rec = _check(alg, options, test_data, counters, out)
                checked_at = (alg.work, alg.oracle_calls)
                out.history.append(last_rec)
                for cb in callbacks:
                    cb.on_check(last_rec)
                if options.gap_tol is not None and _certified_gap(last_rec) <= options.gap_tol:
                    out.stopped_by = "gap_tol"
                    break
                if options.rel_gap_tol is not None and _relative_gap(last_rec) <= options.rel_gap_tol:
                    out.stopped_by = "rel_gap_tol"
                    break
            counters["work"] = alg.work
            if after_iteration is not None:
                after_iteration(out)
            if options.time_budget is not None and alg.comm.any(time.perf_counter() - wall0 >= options.time_budget):
                out.stopped_by = "time_budget"
                break
    except KeyboardInterrupt:
        out.stopped_by = "interrupted"
    if checked_at != (alg.work, alg.oracle_calls):
        try:
            if alg.work % (options.gap_check * n) == 0:  # this check is the schedule's (a run cut just before it)
                with deferred_signals():
                    alg.on_scheduled_check()
            last_rec = _check(alg, options, test_data, counters, out)
            if _same_check(out.history[-1] if out.history else None, last_rec):
                out.history[-1] = last_rec  # a warm start that took no step: the same point on the same data again
            else:
                out.history.append(last_rec)
            for cb in callbacks:
                cb.on_check(last_rec)
        except KeyboardInterrupt:  # a second Ctrl-C: out.checked_weights still belong to history[-1]
            out.stopped_by = "interrupted"
    counters["work"] = alg.work
    for cb in callbacks:
        cb.on_end(last_rec, out.stopped_by)
    return out
