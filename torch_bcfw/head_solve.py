"""One solve of a linear head under a :class:`~torch_bcfw.planning.RunPlan`, shared by :func:`torch_bcfw.fit` and the
Lightning callback: the :class:`~torch_bcfw.solvers.run.SolverRun` on this process's examples and what follows a
run: the certified iterates and the head's weights among them, the check that every replica holds the same head, the
trust marks of a dual state this process computed, and each rank's part of a sharded run's state."""
from __future__ import annotations

import torch
from torch import Tensor

from .checkpoint import save_sharded
from .distributed.collectives import assert_replicated, collective
from .planning import RunPlan
from .runtime.signals import deferred_signals
from .solvers.run import RunOutput, SolverRun

__all__ = ["HeadSolve"]


class HeadSolve:
    """The run of ``solver`` on ``(model, plan.data, lam)`` with the plan's options and communicator.

    Args:
        state: the dual state to start from (default: a new one); ``bounds``: box constraints on the weights.
        saved: a :meth:`~torch_bcfw.solvers.run.SolverRun.state_dict` to continue.
        trust: :meth:`trust_marks` of the state being continued when this process computed it (``None``: loaded).

    Attributes:
        plan: the :class:`~torch_bcfw.planning.RunPlan`.
        run: the :class:`~torch_bcfw.solvers.run.SolverRun` on :meth:`~torch_bcfw.planning.RunPlan.data_here`.
    """

    def __init__(self, model, lam: float, solver: str, plan: RunPlan, *, state=None, bounds=None,
                 saved: dict | None = None, trust: tuple | None = None):
        self.plan = plan
        self.run = SolverRun(model, plan.data_here(), lam, solver, plan.options, state=state, bounds=bounds,
                             saved=saved, comm=plan.comm)
        if trust is not None and self.run.state is not None:
            self.run.state.restore_trust(trust)

    def trust_marks(self) -> tuple | None:
        """What certifies in the run's dual state (:meth:`~torch_bcfw.duals.base.DualState.trust_marks`; ``None``
        without one), for a warm start from this process's result."""
        return None if self.run.state is None else self.run.state.trust_marks()

    def iterates(self, out: RunOutput) -> tuple[Tensor, Tensor | None]:
        """``(w, w_avg)`` (``Tensor[d]`` each, ``w_avg`` ``None`` without averaging) that the last completed check of
        ``out`` certified; the current iterates when none completed."""
        if out.checked_weights is not None:
            return out.checked_weights
        alg = self.run.algorithm
        avg = alg.averaged()
        return alg.iterate()[0], None if avg is None else avg[0]

    def head_weights(self, out: RunOutput) -> Tensor:
        """``Tensor[d]``: of the iterates of the last check of ``out``, the one with the lower primal value."""
        w, w_avg = self.iterates(out)
        return w_avg if w_avg is not None and out.history[-1].selected == "averaged" else w

    def check_replicated(self, w: Tensor, out: RunOutput, name: str) -> None:
        """The head ``w`` is the same on every replica of a replicated run (``DistributedError`` naming ``name``
        otherwise); not after an interrupted run, whose signal reached the ranks at different moments."""
        if self.plan.group is not None and not self.plan.sharded and out.stopped_by != "interrupted":
            assert_replicated(w, self.plan.group, name=name)

    def save(self, result, path) -> None:
        """Save ``result`` (a :class:`~torch_bcfw.FitResult`) at ``path``: a sharded run one set of every rank's
        shard, committed once complete; a replicated run rank 0's file; Ctrl-C held back meanwhile."""
        with deferred_signals():  # a Ctrl-C / SIGTERM waits until the file (a sharded set: every member) is saved
            if self.plan.sharded:
                save_sharded(result, path, self.plan.group)
            elif self.plan.group is None or self.plan.group.is_main:
                result.save(path)

    def every_rank(self, part) -> list | None:
        """A sharded run: every rank's ``part`` (any picklable object) on every rank, in rank order; else ``None``."""
        if not self.plan.sharded:
            return None
        group = self.plan.group
        parts = [None] * group.world_size
        with collective("shard states", group):
            torch.distributed.all_gather_object(parts, part)
        return parts
