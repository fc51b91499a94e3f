"""``LamChoice``: the regularisation ``lam`` of a :class:`~torch_bcfw.lightning.BCFWCallback` head chosen on held-out
data at every solve.

At every call of the callback, on the current features:

1. the held-out features: those of ``bcfw_val_dataloader()`` (the feature protocol, on the LightningModule or its
   datamodule: labelled examples the head is not solved on), or the last ``holdout`` fraction of the
   ``bcfw_dataloader()`` examples (the head is then solved on the others);
2. every candidate ``lam`` of :attr:`LamChoice.lams` (or, with ``window=k``, the current choice and the ``k``
   candidates on each side of it in the grid; all of them at the first call) runs ``passes`` BCFW passes (default:
   the callback's ``passes_per_call``, as far as the head) from its own dual state of the last call that solved
   it, re-bound to the new features (a warm-started grid: each candidate follows the backbone like the callback's
   one ``lam`` does), ends with an exact gap check and is scored by the mean task loss of its certified weights on
   the held-out examples;
3. the candidate with the lowest held-out loss wins (ties: the larger ``lam``); the callback continues its own
   solve (``passes_per_call`` passes) at that ``lam`` from that candidate's state, so the head it writes carries
   the certified gap at the chosen ``lam``.  The record of the call (:attr:`BCFWCallback.history`) and the logs
   add ``lam``, ``val_loss`` (the head's held-out task loss) and the candidates' table is kept in
   :attr:`LamChoice.history`.

Candidate states, their solver progress and the choices are part of the callback's checkpoint: a resumed run
chooses the same ``lam`` and writes the same head.  Under DDP every rank runs the same candidate solves on the same
gathered features (a replicated solve).
"""
from __future__ import annotations

import copy
import dataclasses
import math
from dataclasses import dataclass

from ..checks import check_lam
from ..duals.rebind import rebindable_state, rebound_state
from ..solvers.run import SolverRun

__all__ = ["LamChoice", "LamPick", "lam_grid"]


def lam_grid(lam_min: float, lam_max: float, num: int) -> list[float]:
    """``num`` values spaced evenly in ``log lam`` from ``lam_max`` down to ``lam_min`` (largest first)."""
    lo, hi = check_lam(lam_min), check_lam(lam_max)
    if not lo <= hi:
        raise ValueError(f"lam_min must be <= lam_max, got {lo} and {hi}")
    num = int(num)
    if num < 1 or (num == 1 and lo != hi):
        raise ValueError(f"num must be >= 2 for a range (1 when lam_min == lam_max), got {num}")
    if num == 1:
        return [hi]
    return [hi * (lo / hi) ** (k / (num - 1)) for k in range(num)]


@dataclass
class Candidate:
    """One candidate's solve at one call: ``lam``, its certified gap and primal, its held-out task loss."""

    lam: float
    gap: float
    primal: float
    val_loss: float
    passes: float


@dataclass
class LamPick:
    """One call's choice (:meth:`LamChoice.choose`), before it is committed.

    Attributes:
        lam: the chosen ``lam``.
        state: its candidate's ``(dual state dict, progress dict)``, which the callback's solve continues.
        states: every candidate's state after this call (``lam`` -> state).
        val_data: the held-out examples.
        record: the call's entry of :attr:`LamChoice.history` (without its ``epoch``).
    """

    lam: float
    state: tuple
    states: dict
    val_data: object
    record: dict


class LamChoice:
    """Choose the head's ``lam`` on held-out data at every solve of a :class:`~torch_bcfw.lightning.BCFWCallback`
    (module docstring).

    Args:
        lams: the candidate values (any order; solved largest first).  Or ``lam_range=(lam_min, lam_max)`` and
            ``num``: ``num`` values evenly spaced in ``log lam`` (:func:`lam_grid`).
        passes: BCFW passes per candidate per call (``None``, default: the callback's ``passes_per_call``, so
            that the candidates are compared solved as far as the head; the chosen one then gets
            ``passes_per_call`` more).  Fewer passes compare under-solved candidates: the held-out loss then
            measures optimisation error as much as regularisation.
        window: ``None`` (default): every candidate at every call; ``k``: the current choice and the ``k``
            neighbouring candidates on each side (all of them at the first call), so that a call costs
            ``2 k + 1`` candidate solves and the choice moves at most ``k`` grid steps per call.
        holdout: ``None`` (default): the held-out examples come from ``bcfw_val_dataloader()``; a fraction in
            ``(0, 1)``: the last ``ceil(holdout n)`` examples of ``bcfw_dataloader()`` are held out and the head is
            solved on the rest (the backbone still trains on them: a separate validation loader is the honest
            choice).
    """

    def __init__(self, lams=None, *, lam_range: tuple[float, float] | None = None, num: int = 5,
                 passes: float | None = None, window: int | None = None, holdout: float | None = None):
        if (lams is None) == (lam_range is None):
            raise ValueError("LamChoice needs exactly one of lams (the candidate values) or lam_range=(lam_min, lam_max)")
        if lam_range is not None:
            if not (isinstance(lam_range, (tuple, list)) and len(lam_range) == 2):
                raise ValueError(f"lam_range must be (lam_min, lam_max), got {lam_range!r}")
            lams = lam_grid(lam_range[0], lam_range[1], num)
        lams = sorted({check_lam(v) for v in lams}, reverse=True)
        if not lams:
            raise ValueError("LamChoice needs at least one candidate lam")
        if passes is not None and not (isinstance(passes, (int, float)) and not isinstance(passes, bool)
                                       and passes > 0 and math.isfinite(passes)):
            raise ValueError(f"passes must be None (the callback's passes_per_call) or a positive number, got {passes!r}")
        if window is not None and not (isinstance(window, int) and not isinstance(window, bool) and window >= 1):
            raise ValueError(f"window must be None (every candidate) or an int >= 1, got {window!r}")
        if holdout is not None and not (isinstance(holdout, float) and 0.0 < holdout < 1.0):
            raise ValueError(f"holdout must be None (use bcfw_val_dataloader) or a fraction in (0, 1), got {holdout!r}")
        self.lams, self.holdout, self.window = lams, holdout, window
        self.passes = None if passes is None else float(passes)
        self.states: dict = {}  # lam -> (dual state dict, solver progress dict) of the candidate's last solve
        self.history: list = []  # per call: {"epoch", "lam", "val_loss", "candidates": [Candidate dicts]}
        self.val_data = None  # the held-out data of the last call
        self._state_type = None  # the class of the head model's dual state

    def config(self) -> dict:
        return {"lams": list(self.lams), "passes": self.passes, "window": self.window, "holdout": self.holdout}

    def candidates(self, current: float | None) -> list[float]:
        """The candidates solved at a call whose current choice is ``current`` (``None``: no choice yet)."""
        if self.window is None or current is None or current not in self.lams:
            return list(self.lams)
        i = self.lams.index(current)
        return self.lams[max(0, i - self.window): i + self.window + 1]

    # ------------------------------------------------------------------ the callback's hook
    def held_out(self, data, val=None):
        """``(train, val)``: the examples the head is solved on and the held-out ones; ``val`` are those of
        ``bcfw_val_dataloader()`` (``holdout=None``), else the last ``holdout`` fraction of ``data``."""
        if self.holdout is None:
            return data, val
        n_val = math.ceil(self.holdout * len(data))
        if not 0 < n_val < len(data):
            raise ValueError(f"LamChoice: holdout {self.holdout} of {len(data)} examples leaves no training or no "
                             "held-out example")
        return data[list(range(len(data) - n_val))], data[list(range(len(data) - n_val, len(data)))]

    def choose(self, model, train, val, solver: str, options, *, passes: float, lam: float,
               state: tuple | None) -> LamPick:
        """The candidates' solves at the current features and the choice, committed by nobody: the callback continues
        the pick and then :meth:`commit` s it (an interrupted call leaves this object as it was).

        Args:
            model, train, val: the head's model, the examples it is solved on, the held-out ones.
            solver, options: the run's solver and planned options (:func:`torch_bcfw.planning.plan_run`).
            passes: the passes of a candidate when :attr:`passes` is ``None`` (the callback's ``passes_per_call``).
            lam, state: the callback's current ``lam`` and its ``(dual state dict, progress dict)`` (``None``: no
                solve yet), the polished state of the candidate it chose at the previous call.
        """
        states = dict(self.states)
        if state is not None:
            states[lam] = state
        passes = passes if self.passes is None else self.passes
        opts = dataclasses.replace(options, max_passes=passes, gap_check=max(1, math.ceil(passes)),
                                   strategy="replicate")
        cands = []
        for cand_lam in self.candidates(lam if self.history else None):
            cand, states[cand_lam] = self._solve(model, train, val, cand_lam, solver, opts, states.get(cand_lam))
            cands.append(cand)
        best = min(cands, key=lambda c: (c.val_loss, -c.lam))  # ties: the larger lam
        return LamPick(lam=best.lam, state=states[best.lam], states=states, val_data=val,
                       record={"lam": best.lam, "val_loss": best.val_loss,
                               "candidates": [dataclasses.asdict(c) for c in cands]})

    def commit(self, pick: LamPick, epoch: int | None) -> None:
        """Keep the candidates' states, the held-out data and the record (with ``epoch``) of a finished call."""
        self.states, self.val_data = pick.states, pick.val_data
        self.history.append({"epoch": epoch, **pick.record})

    def _solve(self, model, train, val, lam: float, solver: str, opts, saved: tuple | None):
        """``passes`` passes at ``lam`` from the candidate's ``saved`` state of the previous call (re-bound to
        ``train``): its :class:`Candidate` and its new ``(dual state dict, progress dict)``."""
        from .callback import checkpoint_safe

        sd, progress = (None, None) if saved is None else saved
        if sd is None or self._state_type is None:
            state = rebindable_state(model, train, lam)
            self._state_type = type(state)
        if sd is not None:
            state = rebound_state(model, train, lam, sd, (self._state_type,))
        run = SolverRun(model, train, lam, solver, opts, state=state)
        run.load_progress(progress, {}, [])
        out = run.run(test_data=val)
        if out.stopped_by == "interrupted":
            raise KeyboardInterrupt(f"LamChoice: the solve at lam = {lam:g} was interrupted")
        rec = run.history[-1]
        sd = run.algorithm.state_dict()
        dual = checkpoint_safe(sd.pop("state"))
        cand = Candidate(lam=lam, gap=float(rec.gap), primal=float(rec.model_primal), val_loss=float(rec.test_loss),
                         passes=float(rec.passes))
        return cand, (dual, checkpoint_safe(sd))

    @staticmethod
    def figures(pick: LamPick, model, w) -> dict:
        """The chosen ``lam`` and the held-out task loss of the head's weights ``w`` (the record's extra columns)."""
        from ..certificate import task_loss

        return {"lam": float(pick.lam), "val_loss": task_loss(model, pick.val_data, w.to(pick.val_data.device))}

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict:
        return {"config": self.config(),
                "states": [[lam, copy.deepcopy(sd), copy.deepcopy(progress)] for lam, (sd, progress) in self.states.items()],
                "history": copy.deepcopy(self.history)}

    def load_state_dict(self, sd: dict) -> None:
        if sd["config"] != self.config():
            raise ValueError(f"LamChoice: the checkpoint was written with {sd['config']}, this one is {self.config()}")
        self.states = {float(lam): (dual, progress) for lam, dual, progress in sd["states"]}
        self.history = copy.deepcopy(sd["history"])
        self.val_data = None
