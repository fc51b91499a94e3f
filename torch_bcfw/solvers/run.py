"""One run of a solver on one problem: the solver loop (chunks of steps, exact gap checks, stopping rules) and
``SolverRun`` (the algorithm with its dual state, counters and history, saved and resumed), through which
:func:`torch_bcfw.fit` and the Lightning callback train.  :data:`ALGORITHMS` is the library's solver table.

Stopping rules of :func:`run_solver`: ``max_passes``, a certified gap ``<= gap_tol`` (or ``gap / primal <=
rel_gap_tol``), ``time_budget`` (wall-clock seconds), Ctrl-C or SIGTERM (taking effect between chunks of steps,
:mod:`torch_bcfw.runtime.signals`), or ``converged`` (every exact block gap is zero).  The loop always ends with an
exact certificate of the model it returns.  The check runs every ``gap_check`` passes and when the algorithm asks for it.
"""
from __future__ import annotations

import dataclasses
import difflib
import math
import time
from dataclasses import dataclass, field

from ..runtime.signals import deferred_signals
from .algorithm import Algorithm, DualAlgorithm
from .bcfw import BCFW
from .callbacks import ProgressBar
from ..certificate import task_loss
from .cutting_plane import CuttingPlane
from .extragradient import Extragradient
from .fw import FrankWolfe
from .mpbcfw import MPBCFW, RecordAccounting
from .online_eg import OnlineEG
from .options import SolverOptions
from .record import CheckRecord, as_records, plain_history
from .ssg import SSG

__all__ = ["SolverRun", "ALGORITHMS", "SOLVERS", "DUAL_STATE_SOLVERS", "NOT_OPTIONS", "option_defaults",
           "check_option_names", "options_for", "make_algorithm",
           "run_solver", "RunOutput"]


@dataclass
class RunOutput:
    """What :func:`run_solver` returns.

    Attributes:
        history: the :class:`~torch_bcfw.solvers.record.CheckRecord` of every check (the caller's list, extended).
        stopped_by: the stopping rule that ended the run.
        checked_weights: ``(w, w_avg or None)``, copies of the iterates the last completed check certified (``None``
            when none completed): these, not the current iterates, go with ``history[-1]``.
    """

    history: list = field(default_factory=list)
    stopped_by: str = ""
    checked_weights: tuple | None = None


#: relative slack of weak duality in the checks: a dual value above a primal one by more proves an inconsistent state
WEAK_DUALITY_TOL = 1e-9


def _check(alg, options, test_data, counters: dict, out: RunOutput) -> CheckRecord:
    """Exact certificate of the last (and averaged) iterate: the history record; copies of the certified iterates go
    to ``out.checked_weights``."""
    t0 = time.perf_counter()
    model = alg.model
    w, ell = alg.iterate()
    cert = alg.certificate()
    rec = CheckRecord(passes=alg.oracle_calls / alg.n, oracle_calls=alg.oracle_calls, cache_hits=alg.cache_hits,
                      steps=alg.work, primal=cert.primal, dual=cert.dual, gap_last=cert.gap)
    avg = alg.averaged()
    if avg is not None and options.check_averaged:
        c2 = alg.certify_point(avg[0], avg[1])
        rec.primal_avg, rec.dual_avg, rec.gap_avg = c2.primal, c2.dual, c2.gap
    # any dual-feasible point bounds P* from below: certify the better primal against the better dual
    primals = [(rec.primal, "last")] + ([(rec.primal_avg, "averaged")] if rec.primal_avg is not None else [])
    duals = [d for d in (rec.dual, rec.dual_avg) if d is not None]
    best_primal, rec.selected = min(primals)
    if duals and max(duals) > min(p for p, _ in primals) + WEAK_DUALITY_TOL * (1.0 + abs(best_primal)):
        raise ValueError(f"the dual value {max(duals)!r} exceeds the primal value {best_primal!r}: the solver's state is "
                         "not a feasible dual point (a corrupted or crafted saved state?), so no certificate is given")
    if rec.dual_avg is not None and not alg.averaged_dual_trusted():  # loaded accumulators: only its primal counts
        duals = [d for d in (rec.dual,) if d is not None]
    rec.gap = best_primal - max(duals) if duals else None
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
    return prev is not None and all(getattr(prev, k) == getattr(rec, k) for k in keys)


def _certified_gap(rec: dict) -> float:
    return rec.gap if rec.gap is not None else math.inf


def _relative_gap(rec: dict) -> float:
    g = _certified_gap(rec)
    primal = min(p for p in (rec.primal, rec.primal_avg) if p is not None)
    return g / primal if primal > 0 else (0.0 if g <= 0 else math.inf)


def _check_here(alg, options, test_data, counters: dict, out: RunOutput, callbacks,
                scheduled: bool = False) -> CheckRecord:
    """A check, recorded in ``out.history``; one outside the loop's schedule (the run's last, or a resumed state's
    first) replaces ``history[-1]`` when it certifies the same point again."""
    if scheduled or alg.work % (options.gap_check * alg.n) == 0:  # a run cut just before a scheduled check
        with deferred_signals():
            alg.on_scheduled_check()
    rec = _check(alg, options, test_data, counters, out)
    if not scheduled and _same_check(out.history[-1] if out.history else None, rec):
        out.history[-1] = rec  # a warm start that took no step: the same point on the same data again
    else:
        out.history.append(rec)
    for cb in callbacks:
        cb.on_check(rec)
    return rec


def run_solver(alg, options, test_data=None, callbacks=(), counters: dict | None = None,
               history: list | None = None, after_iteration=None, certify_first: bool = False) -> RunOutput:
    """Run ``alg`` for ``options.max_passes`` more effective passes (or until another stopping rule).

    ``counters`` (``solver_time``, ``gap_time``, ``gap_oracle_calls``, ``work``) and ``history`` continue a previous
    run when given; they are updated in place.  ``after_iteration(out)`` is called after every chunk and its checks,
    where the state, ``out.history`` and ``out.checked_weights`` are consistent (checkpoints).  ``certify_first``:
    check the state before the first step (a resumed state whose final check was cut by a second interrupt).
    """
    counters = counters if counters is not None else {}
    for key in ("solver_time", "gap_time", "gap_oracle_calls", "work"):
        counters.setdefault(key, 0.0 if key not in ("gap_oracle_calls", "work") else 0)
    out = RunOutput(history=history if history is not None else [])
    n = alg.n
    if alg.whole_passes and options.max_passes != int(options.max_passes):
        raise ValueError(f"max_passes = {options.max_passes}: solver {alg.name!r} makes whole passes (each iteration "
                         "visits every example); give a whole number")
    start_work = alg.work
    target_work = start_work + int(round(options.max_passes * n))
    for cb in callbacks:
        cb.on_start({"solver": alg.name, "n": n, "lam": alg.lam, "max_passes": options.max_passes,
                     "options": options.to_dict()})
    wall0 = time.perf_counter()
    last_rec = None
    checked_at = None
    try:
        if certify_first:
            last_rec = _check_here(alg, options, test_data, counters, out, callbacks)
            checked_at = (alg.work, alg.oracle_calls)
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
            if alg.work % (options.gap_check * n) == 0 or alg.check_requested:
                alg.check_requested = False
                last_rec = _check_here(alg, options, test_data, counters, out, callbacks, scheduled=True)
                checked_at = (alg.work, alg.oracle_calls)
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
            last_rec = _check_here(alg, options, test_data, counters, out, callbacks)
        except KeyboardInterrupt:  # a second Ctrl-C: out.checked_weights still belong to history[-1]
            out.stopped_by = "interrupted"
    counters["work"] = alg.work
    for cb in callbacks:
        cb.on_end(last_rec, out.stopped_by)
    return out


#: the library's solver table: solver name -> algorithm class (with its own options, ``Options``, beside it).  A new
#: solver is its module and one entry here.
ALGORITHMS: dict[str, type[Algorithm]] = {
    "bcfw": BCFW, "fw": FrankWolfe, "ssg": SSG, "mp-bcfw": MPBCFW, "cutting-plane": CuttingPlane,
    "online-eg": OnlineEG, "extragradient": Extragradient,
}

#: the solver names :func:`torch_bcfw.fit` accepts, in the table's order
SOLVERS = tuple(ALGORITHMS)

#: the solvers that work on a model's dual state, which the caller may give them (e.g. one re-bound to new features)
DUAL_STATE_SOLVERS = tuple(name for name, cls in ALGORITHMS.items() if issubclass(cls, DualAlgorithm))

#: the options a resumed run must share with the run it continues (they shape the saved state)
_STATE_OPTIONS = ("sampling", "step_rule", "cache")


#: names given as options that are none, and what to do instead
NOT_OPTIONS = {"device": "a run solves where its data is: for a GPU run put the data on the device, data.to('cuda')"}


def option_defaults(solver: str | None = None) -> dict:
    """The option names ``solver`` takes, with their defaults: the shared options of
    :class:`~torch_bcfw.solvers.options.SolverOptions` and, flat, the solver's own (its ``Options``, e.g.
    ``mp_max_planes`` for ``"mp-bcfw"``); ``None``: those of every solver.  The one list of option names."""
    groups = [ALGORITHMS[solver].Options] if solver is not None else [cls.Options for cls in ALGORITHMS.values()]
    out = {f.name: f.default for f in dataclasses.fields(SolverOptions) if f.name in SolverOptions.shared_names()}
    for group in groups:
        if group is not None:
            out.update(zip(group.flat_names(), (f.default for f in dataclasses.fields(group))))
    return out


def check_option_names(solver: str, names, arguments=(), taken=None, who: str = "") -> None:
    """``TypeError`` for the first name of ``names`` that is no option of ``solver`` (nor one of the caller's
    ``arguments``, nor of ``taken``: options the caller sets itself, to the argument that sets each): another solver's
    option names that solver and its group; a name of :data:`NOT_OPTIONS` says what to do instead; any other gets the
    closest valid name ("did you mean").  ``who``: the caller, e.g. ``"BCFWCallback"``."""
    if solver not in ALGORITHMS:
        raise ValueError(f"unknown solver {solver!r}; choose from {list(SOLVERS)}")
    taken = taken or {}
    mine = [k for k in option_defaults(solver) if k not in taken]
    unknown = sorted(set(names) - set(mine) - set(arguments) - set(taken))
    if not unknown:
        return
    name, head = unknown[0], f"{who} got " if who else ""
    owner = next((other for other, cls in ALGORITHMS.items() if cls.Options is not None
                  and name in cls.Options.flat_names()), None)
    if owner is not None:
        raise TypeError(f"{head}option(s) {unknown} belong to solver {owner!r}, not {solver!r} (its options: "
                        f"{ALGORITHMS[owner].Options.described()})")
    if name in NOT_OPTIONS:
        raise TypeError(f"{head}unknown solver option {name!r}: {NOT_OPTIONS[name]}")
    close = [taken.get(c, c) for c in difflib.get_close_matches(name, [*arguments, *mine, *taken], n=1)]
    group = ALGORITHMS[solver].Options
    raise TypeError(
        f"{head}unknown {'argument' if arguments else 'solver option'}(s) {unknown}; "
        + (f"did you mean {close[0]!r}? " if close else "")
        + (f"its arguments: {list(arguments)}; " if arguments else "")
        + f"options of solver {solver!r}: {[k for k in SolverOptions.shared_names() if k not in taken]}"
        + (f" and its own {group.described()}" if group is not None else ""))


def options_for(solver: str, **kwargs) -> SolverOptions:
    """The options of a run of ``solver`` from keyword arguments (``fit``'s, a config's ``options``): the names of
    :func:`option_defaults`.  ``ValueError`` for an unknown solver or a bad value, ``TypeError`` for a name that is no
    option of ``solver`` (:func:`check_option_names`)."""
    check_option_names(solver, kwargs)
    group = ALGORITHMS[solver].Options
    own = {k: kwargs.pop(k) for k in group.flat_names() if k in kwargs} if group is not None else {}
    return SolverOptions(**kwargs, own=group.from_flat(own) if group is not None else None)


def make_algorithm(solver: str, model, data, lam: float, options: SolverOptions, *, state=None,
                   bounds=None, comm=None) -> Algorithm:
    """The algorithm ``solver`` on ``(model, data, lam)``, on the dual state ``state`` (default: a new one) with box
    constraints ``bounds`` (default: the model's); ``comm``: a :class:`torch_bcfw.distributed.ShardComm` when
    ``data`` is this process' shard (``"bcfw"`` only), or a replica's
    :class:`~torch_bcfw.distributed.communicators.ReplicaComm`.  ``options`` leave nothing on ``"auto"``
    (:func:`torch_bcfw.planning.plan_run` resolves it)."""
    if solver not in ALGORITHMS:
        raise ValueError(f"unknown solver {solver!r}; choose from {list(SOLVERS)}")
    if solver != "bcfw" and options.batch_size != 1:
        raise ValueError(f"batch_size = {options.batch_size!r}: mini-batch rounds (Wang et al. 2016) are a mode of "
                         f"solver='bcfw'; solver {solver!r} takes no batch_size (1; torch_bcfw.planning.plan_run "
                         "resolves 'auto')")
    if comm is not None and comm.sharded:
        if solver != "bcfw":
            raise ValueError(f"solver {solver!r} does not shard its examples; over several processes use "
                             "solver='bcfw' or strategy='replicate'")
        return BCFW(model, data, lam, options, state=state, bounds=bounds, comm=comm)
    alg = ALGORITHMS[solver](model, data, lam, options, state=state, bounds=bounds)
    if comm is not None:  # a replicated run: every block here, stopping decisions taken with the other replicas
        alg.comm = comm
    return alg


class SolverRun:
    """One run of ``solver`` on ``(model, data, lam)``: its algorithm and dual state, counters and history.

    Args:
        model, data, lam: the problem.
        solver: a name of :data:`ALGORITHMS`.
        options: the :class:`~torch_bcfw.solvers.options.SolverOptions`, nothing left on ``"auto"``
            (:func:`torch_bcfw.planning.plan_run`; default: plain one-block BCFW); ``max_passes`` is the length of
            :meth:`run`.
        state: the dual state to start from (solvers of :data:`DUAL_STATE_SOLVERS`; default: a new one).
        bounds: box constraints ``(lower, upper)`` on the weights (default: the model's ``weight_bounds``).
        saved: a :meth:`state_dict` to continue (:meth:`load_state_dict`).
        comm: a sharded or replica communicator (:func:`make_algorithm`); default: all blocks here, alone.

    Attributes:
        algorithm: the :class:`~torch_bcfw.solvers.algorithm.Algorithm`.
        options: the options it runs with (the solver's own group filled in).
        counters: cumulative ``solver_time``, ``gap_time``, ``gap_oracle_calls`` and ``work`` (block iterations).
        history: the :class:`~torch_bcfw.solvers.record.CheckRecord` of every exact gap check.

    A run continued from its :meth:`state_dict` follows the trajectory of an uninterrupted one bit for bit.
    """

    def __init__(self, model, data, lam: float, solver: str = "bcfw", options: SolverOptions | None = None, *,
                 state=None, bounds=None, saved: dict | None = None, comm=None):
        self.model, self.data, self.lam, self.solver = model, data, lam, solver
        options = SolverOptions(batch_size=1) if options is None else options
        self.algorithm = make_algorithm(solver, model, data, lam, options, state=state, bounds=bounds, comm=comm)
        self.options = self.algorithm.options
        self.counters: dict = {}
        self.history: list = []
        if saved is not None:
            self.load_state_dict(saved)

    @property
    def state(self):
        """The algorithm's dual state (``None`` for solvers without one)."""
        return getattr(self.algorithm, "state", None)

    @property
    def passes(self) -> float:
        """Block iterations so far / ``n``."""
        return self.algorithm.work / self.algorithm.n

    # ------------------------------------------------------------------ running
    def run(self, max_passes: float | None = None, *, test_data=None, callbacks=(), after_iteration=None,
            certify_first: bool = False) -> RunOutput:
        """Run ``max_passes`` more effective passes (default ``options.max_passes``), extending :attr:`counters` and
        :attr:`history`.  ``test_data``: labelled data whose task loss every check records; ``callbacks``,
        ``after_iteration``, ``certify_first``: see :func:`run_solver`."""
        opts = self.options if max_passes is None else dataclasses.replace(self.options, max_passes=max_passes)
        alg = self.algorithm
        cbs = ([RecordAccounting(alg)] if hasattr(alg, "accounting") else []) + list(callbacks or [])
        if opts.progress and alg.comm.rank == 0:
            cbs.append(ProgressBar())
        return run_solver(alg, opts, test_data=test_data, callbacks=cbs, counters=self.counters,
                          history=self.history, after_iteration=after_iteration, certify_first=certify_first)

    # ------------------------------------------------------------------ saving and resuming
    def state_dict(self) -> dict:
        """Everything a resume needs: solver, ``lam``, options, the algorithm's state (copies, on CPU), counters and
        history (plain dicts)."""
        return {"solver": self.solver, "lam": self.lam, "options": self.options.to_dict(),
                "solver_state": self.algorithm.state_dict(), "counters": dict(self.counters),
                "history": plain_history(self.history)}

    def load_state_dict(self, sd: dict) -> None:
        """Continue the run saved in ``sd`` (a :meth:`state_dict`, or the same fields of a
        :class:`~torch_bcfw.FitResult`): same solver, same ``lam`` and the same ``sampling``, ``step_rule`` and
        ``cache`` options, else ``ValueError``."""
        if sd["solver"] != self.solver:
            raise ValueError(f"cannot warm-start solver {self.solver!r} from a {sd['solver']!r} result")
        if sd["lam"] != self.lam:
            raise ValueError(f"cannot warm-start at lam = {self.lam} from a result at lam = {sd['lam']}")
        saved_opts = sd["options"].to_dict() if isinstance(sd["options"], SolverOptions) else sd["options"]
        theirs = {k: saved_opts.get(k) for k in _STATE_OPTIONS}
        ours = {k: self.options.to_dict().get(k) for k in _STATE_OPTIONS}
        if theirs != ours:
            raise ValueError(f"cannot warm-start with {ours} from a result run with {theirs}: pass the options of the "
                             f"run being continued (e.g. preset={saved_opts.get('preset')!r})")
        try:
            self.algorithm.load_state_dict(sd["solver_state"])
        except KeyError as exc:  # a field the solver's state_dict writes is missing
            raise ValueError(f"the saved solver state lacks the field {exc}") from None
        self.counters = dict(sd["counters"])
        self.history = as_records(sd["history"])

    def load_progress(self, solver_state: dict | None, counters: dict, history) -> None:
        """Continue a run whose dual state the caller re-bound (given as ``state``): the progress of ``solver_state``
        (:meth:`~torch_bcfw.solvers.algorithm.Algorithm.load_progress`; ``None``: none yet), counters, history."""
        if solver_state is not None:
            self.algorithm.load_progress(solver_state)
        self.counters = dict(counters)
        self.history = as_records(history)
