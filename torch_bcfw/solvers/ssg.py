"""Stochastic subgradient (Pegasos step ``1/(lam (k+1))``) with weighted averaging: the SSG baseline.

``w <- (1 - 1/(k+1)) w + 1/(lam (k+1)) psi_i(y*)`` for a sampled example ``i`` and its loss-augmented answer ``y*``
(Lacoste-Julien et al. 2013, App. F).  No dual variables: only the primal value is certified.
"""
from __future__ import annotations

from ..checks import saved_int, saved_tensor
from .algorithm import Algorithm
from .sampling import make_sampler

__all__ = ["SSG"]


class SSG(Algorithm):
    name = "ssg"
    has_dual = False

    def __init__(self, model, data, lam, options, state=None, bounds=None):
        super().__init__(model, data, lam, options)
        if options.sampling == "gap":
            raise ValueError("gap sampling needs a dual: use solver='bcfw'")
        self.refuse_bcfw_extras(bounds, refinements=False)
        model.check_data(data)
        #: the steps (:meth:`~torch_bcfw.models.base.StructuredModel.subgradient_steps`: compiled for chains on CPU)
        self.steps = model.subgradient_steps(data, lam, options.averaging)
        self.sampler = make_sampler(options.sampling, self.n, options.seed)

    @property
    def k(self) -> int:
        """Steps done."""
        return self.steps.k

    def advance(self, m: int) -> None:
        self.steps.advance(self.sampler.draw(m))
        self.oracle_calls += m

    def iterate(self):
        return self.steps.weights(), None

    def averaged(self):
        return (self.steps.averaged(), None) if self.options.averaging else None

    def state_dict(self) -> dict:
        return {"w": self.steps.weights().cpu().clone(), "w_avg": self.steps.averaged().cpu().clone(), "k": self.k,
                "sampler": self.sampler.state_dict(), "oracle_calls": self.oracle_calls}

    def load_state_dict(self, sd: dict) -> None:
        d = self.model.n_features
        self.steps.load(saved_tensor(sd["w"], "ssg w", (d,)), saved_tensor(sd["w_avg"], "ssg w_avg", (d,)),
                        saved_int(sd["k"], "ssg k", 0))
        self.sampler.load_state_dict(sd["sampler"])
        self.oracle_calls = saved_int(sd["oracle_calls"], "oracle_calls", 0)
