"""The interface between the solver loop and one algorithm (BCFW, FW, SSG)."""
from __future__ import annotations

from torch import Tensor

__all__ = ["Algorithm", "DualAlgorithm"]


class Algorithm:
    """One optimisation algorithm on the SSVM: advances by chunks of oracle calls.

    Attributes:
        name: solver name.
        oracle_calls: training oracle calls made so far (gap checks are not counted).
    """

    name = "base"
    has_dual = True

    def __init__(self, model, data, lam: float, options):
        self.model, self.data, self.lam, self.options = model, data, lam, options
        self.n = len(data)
        self.oracle_calls = 0

    def chunk_size(self) -> int:
        """Oracle calls per chunk (one effective pass by default)."""
        return self.n

    def advance(self, m: int) -> None:
        """Do about ``m`` oracle calls worth of optimisation."""
        raise NotImplementedError

    def iterate(self) -> tuple[Tensor, float | None]:
        """The last iterate ``(w, l)`` (``l = None`` without a dual)."""
        raise NotImplementedError

    def averaged(self) -> tuple[Tensor, float | None] | None:
        """The averaged iterate, or ``None`` when averaging is off."""
        return None

    def on_scheduled_check(self) -> None:
        """Called before a scheduled gap check (e.g. to remove floating-point drift)."""

    def state_dict(self) -> dict:
        raise NotImplementedError

    def load_state_dict(self, sd: dict) -> None:
        raise NotImplementedError


class DualAlgorithm(Algorithm):
    """An algorithm that works on a model's dual state (BCFW, batch FW): iterates come from the state."""

    def __init__(self, model, data, lam: float, options, state=None):
        super().__init__(model, data, lam, options)
        self.state = state if state is not None else model.dual_state(data, lam)

    def iterate(self):
        return self.state.w, self.state.ell

    def averaged(self):
        return self.state.averaged() if self.options.averaging else None

    def on_scheduled_check(self) -> None:
        self.state.refresh()
