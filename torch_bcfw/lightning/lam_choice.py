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

__all__ = ["LamChoice", "lam_grid"]


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
    def choose(self, callback, trainer, pl_module, data):
        """Held-out data, the candidates' solves and the choice at the current features ``data``.

        Sets ``callback.lam`` and the callback's dual state and solver progress to the chosen candidate's; returns
        ``(training data, undo)``: the examples the head is solved on, and a function restoring the callback and
        this object as they were (for a call that is then interrupted)."""
        from .callback import collect_features, ddp_context, find_protocol_method

        saved = (callback.lam, callback.dual_sd, callback.alg_sd, dict(self.states), list(self.history),
                 self.val_data)

        def undo():
            callback.lam, callback.dual_sd, callback.alg_sd, self.states, self.history, self.val_data = saved

        if self.holdout is None:
            loader = find_protocol_method(trainer, pl_module, "bcfw_val_dataloader")
            if loader is None:
                raise ValueError(f"LamChoice: neither {type(pl_module).__name__} nor its datamodule defines "
                                 "bcfw_val_dataloader() (held-out labelled examples); or give holdout=<fraction>")
            device = callback.device if callback.device is not None else pl_module.device
            to_device = trainer.strategy.batch_to_device if trainer is not None else None
            val = collect_features(pl_module, loader(), device=device, to_device=to_device, ctx=ddp_context(trainer))
            callback._head(pl_module).model.check_data(val)
            train = data
        else:
            n_val = math.ceil(self.holdout * len(data))
            if not 0 < n_val < len(data):
                raise ValueError(f"LamChoice: holdout {self.holdout} of {len(data)} examples leaves no training or no "
                                 "held-out example")
            train, val = data[list(range(len(data) - n_val))], data[list(range(len(data) - n_val, len(data)))]
        model = callback._head(pl_module).model
        if callback.dual_sd is not None:  # the previous call's polished state of the lam it chose
            self.states[callback.lam] = (callback.dual_sd, callback.alg_sd)
        passes = callback.options.max_passes if self.passes is None else self.passes
        opts = dataclasses.replace(callback.options, max_passes=passes, gap_check=max(1, math.ceil(passes)),
                                   strategy="replicate")
        cands, new_states = [], {}
        try:
            for lam in self.candidates(callback.lam if self.history else None):
                cand, new_states[lam] = self._solve(callback, model, train, val, lam, opts)
                cands.append(cand)
        except KeyboardInterrupt:
            undo()
            raise
        best = min(cands, key=lambda c: (c.val_loss, -c.lam))  # ties: the larger lam
        self.states.update(new_states)
        epoch = trainer.current_epoch if trainer is not None else None
        self.history.append({"epoch": epoch, "lam": best.lam, "val_loss": best.val_loss,
                             "candidates": [dataclasses.asdict(c) for c in cands]})
        self.val_data = val
        callback.lam = best.lam
        callback.dual_sd, callback.alg_sd = self.states[best.lam]
        return train, undo

    def _solve(self, callback, model, train, val, lam: float, opts):
        """``passes`` passes at ``lam`` from the candidate's state of the previous call (re-bound to ``train``):
        its :class:`Candidate` and its new ``(dual state dict, progress dict)``."""
        from .callback import checkpoint_safe

        sd, progress = self.states.get(lam, (None, None))
        if sd is None or self._state_type is None:
            state = rebindable_state(model, train, lam)
            self._state_type = type(state)
        if sd is not None:
            state = rebound_state(model, train, lam, sd, (self._state_type,))
        run = SolverRun(model, train, lam, callback.solver, opts, state=state)
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

    def figures(self, model, w) -> dict:
        """The chosen ``lam`` and the held-out task loss of the head's weights ``w`` (the record's extra columns)."""
        from ..solvers.certificate import task_loss

        return {"lam": float(self.history[-1]["lam"]),
                "val_loss": task_loss(model, self.val_data, w.to(self.val_data.device))}

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
