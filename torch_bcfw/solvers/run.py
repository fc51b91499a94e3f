"""``SolverRun``: one run of a solver on one problem -- the algorithm with its dual state, the cumulative counters
and the history -- that can be saved and resumed.

:func:`torch_bcfw.fit` and the Lightning :class:`~torch_bcfw.lightning.BCFWCallback` both train through it.  The
library's one solver table (:data:`ALGORITHMS`) lives here; the stopping rules are those of
:func:`~torch_bcfw.solvers.loop.run_solver`, which :meth:`SolverRun.run` calls.
"""
from __future__ import annotations

import dataclasses

from .algorithm import Algorithm, DualAlgorithm
from .bcfw import BCFW
from .callbacks import ProgressBar
from .cutting_plane import CuttingPlane
from .extragradient import Extragradient
from .fw import FrankWolfe
from .loop import RunOutput, run_solver
from .mpbcfw import MPBCFW, RecordAccounting
from .online_eg import OnlineEG
from .options import SOLVERS, SolverOptions
from .record import as_records, plain_history
from .ssg import SSG

__all__ = ["SolverRun", "ALGORITHMS", "DUAL_STATE_SOLVERS", "make_algorithm"]

#: solver name -> algorithm class (the names of :data:`~torch_bcfw.solvers.options.SOLVERS`, in that order)
ALGORITHMS: dict[str, type[Algorithm]] = {
    "bcfw": BCFW, "fw": FrankWolfe, "ssg": SSG, "mp-bcfw": MPBCFW, "cutting-plane": CuttingPlane,
    "online-eg": OnlineEG, "extragradient": Extragradient,
}
assert tuple(ALGORITHMS) == SOLVERS, "ALGORITHMS and SOLVERS must name the same solvers"

#: the solvers that work on a model's dual state, which the caller may give them (e.g. one re-bound to new features)
DUAL_STATE_SOLVERS = tuple(name for name, cls in ALGORITHMS.items() if issubclass(cls, DualAlgorithm))

#: the options a resumed run must share with the run it continues (they shape the saved state)
_STATE_OPTIONS = ("sampling", "step_rule", "cache")


def make_algorithm(solver: str, model, data, lam: float, options: SolverOptions, *, state=None,
                   bounds=None, comm=None) -> Algorithm:
    """The algorithm ``solver`` on ``(model, data, lam)``, on the dual state ``state`` (default: a new one of the
    model's) and the box constraints ``bounds`` (default: the model's ``weight_bounds``); ``comm``: a sharded
    communicator (:class:`torch_bcfw.distributed.ShardComm`) when ``data`` is this process' shard (``"bcfw"``
    only)."""
    if solver not in ALGORITHMS:
        raise ValueError(f"unknown solver {solver!r}; choose from {list(SOLVERS)}")
    if comm is not None and comm.sharded:
        if solver != "bcfw":
            raise ValueError(f"solver {solver!r} runs in one process; over several processes use solver='bcfw'")
        return BCFW(model, data, lam, options, state=state, bounds=bounds, comm=comm)
    return ALGORITHMS[solver](model, data, lam, options, state=state, bounds=bounds)


class SolverRun:
    """One run of ``solver`` on ``(model, data, lam)``: its algorithm and dual state, counters and history.

    Args:
        model, data, lam: the problem.
        solver: a name of :data:`ALGORITHMS`.
        options: the :class:`~torch_bcfw.solvers.options.SolverOptions` (``max_passes`` is the length of
            :meth:`run`).
        state: the dual state to start from (solvers of :data:`DUAL_STATE_SOLVERS`; default: a new one).
        bounds: box constraints ``(lower, upper)`` on the weights (default: the model's ``weight_bounds``).
        saved: a :meth:`state_dict` to continue (:meth:`load_state_dict`).
        comm: ``data`` is this process' shard of a problem sharded over a process group
            (:class:`torch_bcfw.distributed.ShardComm`; ``"bcfw"`` only); default: all blocks here.

    Attributes:
        algorithm: the :class:`~torch_bcfw.solvers.algorithm.Algorithm`.
        options: the options it runs with (``preset="auto"`` resolved).
        counters: cumulative ``solver_time``, ``gap_time``, ``gap_oracle_calls`` and ``work`` (block iterations).
        history: the :class:`~torch_bcfw.solvers.record.CheckRecord` of every exact gap check.

    A run continued from its :meth:`state_dict` (in a new ``SolverRun`` on the same problem) follows the
    trajectory of an uninterrupted one bit for bit; :meth:`load_progress` instead continues only the sampler
    and counters on a dual state of the caller's (the Lightning callback's re-bound state).
    """

    def __init__(self, model, data, lam: float, solver: str = "bcfw", options: SolverOptions | None = None, *,
                 state=None, bounds=None, saved: dict | None = None, comm=None):
        self.model, self.data, self.lam, self.solver = model, data, lam, solver
        self.algorithm = make_algorithm(solver, model, data, lam, options if options is not None else SolverOptions(),
                                        state=state, bounds=bounds, comm=comm)
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
    def run(self, max_passes: float | None = None, *, test_data=None, callbacks=(), after_iteration=None) -> RunOutput:
        """Run ``max_passes`` more effective passes (default ``options.max_passes``) or until another stopping rule
        of :func:`~torch_bcfw.solvers.loop.run_solver`; :attr:`counters` and :attr:`history` are extended.

        ``test_data``: labelled data whose task loss every check records.  ``callbacks``: run callbacks (the
        algorithm's own record columns, e.g. mp-bcfw's accounting, come first, and a progress bar last when
        ``options.progress``).  ``after_iteration(out)``: see :func:`~torch_bcfw.solvers.loop.run_solver`.
        """
        opts = self.options if max_passes is None else dataclasses.replace(self.options, max_passes=max_passes)
        alg = self.algorithm
        cbs = ([RecordAccounting(alg)] if hasattr(alg, "accounting") else []) + list(callbacks or [])
        if opts.progress and alg.comm.rank == 0:
            cbs.append(ProgressBar())
        return run_solver(alg, opts, test_data=test_data, callbacks=cbs, counters=self.counters,
                          history=self.history, after_iteration=after_iteration)

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
        ours = {k: getattr(self.options, k) for k in _STATE_OPTIONS}
        if theirs != ours:
            raise ValueError(f"cannot warm-start with {ours} from a result run with {theirs}: pass the options of the "
                             f"run being continued (e.g. preset={saved_opts.get('preset')!r})")
        self.algorithm.load_state_dict(sd["solver_state"])
        self.counters = dict(sd["counters"])
        self.history = as_records(sd["history"])

    def load_progress(self, solver_state: dict | None, counters: dict, history) -> None:
        """Continue a run whose dual state the caller re-bound (given as ``state``): the sampler, iteration and
        oracle counts of ``solver_state`` (:meth:`Algorithm.load_progress
        <torch_bcfw.solvers.algorithm.Algorithm.load_progress>`; ``None``: none yet), and copies of ``counters``
        and ``history``."""
        if solver_state is not None:
            self.algorithm.load_progress(solver_state)
        self.counters = dict(counters)
        self.history = as_records(history)
