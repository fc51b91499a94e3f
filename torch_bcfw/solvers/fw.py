"""Batch Frank-Wolfe on the SSVM dual (Lacoste-Julien et al. 2013, Alg. 2).

Each iteration makes one batched oracle call at the current ``w`` and moves every block towards its corner with one
common step (line search or ``2/(k+2)``).  With box constraints this is Alg. 8 of Osokin et al. 2016 (App. H).
"""
from __future__ import annotations

from ..checks import saved_int
from .algorithm import DualAlgorithm

__all__ = ["FrankWolfe"]


class FrankWolfe(DualAlgorithm):
    name = "fw"
    whole_passes = True

    def __init__(self, model, data, lam, options, state=None, bounds=None):
        if options.sampling == "gap":
            raise ValueError("gap sampling is a BCFW refinement (solver='bcfw')")
        super().__init__(model, data, lam, options, state, bounds)
        self.iteration = 0

    def advance(self, m: int) -> None:
        for _ in range(max(1, m // self.n)):
            y = self.model.oracle(self.state.w, self.data, loss_augmented=True)
            self.state.batch_step(y, self.step_code, self.iteration, self.options.averaging)
            self.iteration += 1
            self.oracle_calls += self.n

    def state_dict(self) -> dict:
        return {"state": self.state.state_dict(), "iteration": self.iteration, "oracle_calls": self.oracle_calls}

    def load_state_dict(self, sd: dict) -> None:
        self.state.load_state_dict(sd["state"])
        self.iteration = saved_int(sd["iteration"], "iteration", 0)
        self.oracle_calls = saved_int(sd["oracle_calls"], "oracle_calls", 0)
