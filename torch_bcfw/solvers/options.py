"""Solver options: one dataclass, with the defaults of the papers' reference code."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

__all__ = ["SolverOptions", "SOLVERS"]

#: solver names accepted by :func:`torch_bcfw.fit`
SOLVERS = ("bcfw", "fw", "ssg")


@dataclass
class SolverOptions:
    """Options shared by BCFW, batch Frank-Wolfe and SSG.

    Defaults follow the authors' BCFWstruct code (line search, weighted averaging, uniform
    sampling with replacement, ``rand_seed = 1``) and the gapBCFW code (exact gap every 10 passes).

    Attributes:
        max_passes: stop after this many effective passes (oracle calls / n). Default 100.
        gap_check: run an exact duality-gap pass (n oracle calls at a fixed ``w``) every this
            many passes, and always at the end. Default 10.
        gap_tol: stop as soon as a certified gap (of the last or of the averaged iterate) is
            ``<= gap_tol``, in the units of the objective ``lam/2||w||^2 + 1/n sum_i H_i``.
            ``None`` (default) never stops on the gap.
        time_budget: stop after this many seconds of solver time (``None``: no limit). The model
            reached so far is returned, with its certified gap.
        step: ``"line_search"`` (default) or ``"fixed"`` (``2n/(k+2n)`` for BCFW, ``2/(k+2)`` for
            FW). SSG always uses ``1/(lam (k+1))``.
        sampling: ``"uniform"`` (i.i.d. with replacement, the setting of the theory; default) or
            ``"perm"`` (a fresh random permutation every pass).
        averaging: keep the weighted average ``wbar_k = 2/(k(k+1)) sum_t t w_t`` (and ``lbar``)
            and certify its gap as well. Default True (BCFWstruct: "it made a big difference in
            test error").
        check_averaged: also run the gap pass at the averaged iterate (one more oracle pass per
            check). Default True. Without it the averaged iterate is not certified, so the last
            iterate is returned as the model.
        track_train_loss: record the task loss of the (averaged) model on the training set at every
            gap check (one plain-decoding pass). Default True.
        seed: random seed of the sampler. Default 1.
        progress: show a progress bar (pass, gap, primal, elapsed). Default False.
    """

    max_passes: float = 100
    gap_check: int = 10
    gap_tol: float | None = None
    time_budget: float | None = None
    step: str = "line_search"
    sampling: str = "uniform"
    averaging: bool = True
    check_averaged: bool = True
    track_train_loss: bool = True
    seed: int = 1
    progress: bool = False
    extra: dict = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if self.step not in ("line_search", "fixed"):
            raise ValueError(f"step must be 'line_search' or 'fixed', got {self.step!r}")
        if self.sampling not in ("uniform", "perm"):
            raise ValueError(f"sampling must be 'uniform' or 'perm', got {self.sampling!r}")
        if not self.max_passes > 0:
            raise ValueError(f"max_passes must be > 0, got {self.max_passes}")
        if int(self.gap_check) < 1:
            raise ValueError(f"gap_check must be >= 1, got {self.gap_check}")
        self.gap_check = int(self.gap_check)
        if self.gap_tol is not None and self.gap_tol < 0:
            raise ValueError(f"gap_tol must be >= 0, got {self.gap_tol}")
        if self.time_budget is not None and self.time_budget <= 0:
            raise ValueError(f"time_budget must be > 0 seconds, got {self.time_budget}")

    @classmethod
    def from_kwargs(cls, **kwargs) -> "SolverOptions":
        """Build from keyword arguments; unknown names raise ``TypeError`` listing the valid ones."""
        names = {f.name for f in dataclasses.fields(cls)} - {"extra"}
        unknown = sorted(set(kwargs) - names)
        if unknown:
            raise TypeError(f"unknown solver option(s) {unknown}; valid options: {sorted(names)}")
        return cls(**kwargs)

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d.pop("extra")
        return d
