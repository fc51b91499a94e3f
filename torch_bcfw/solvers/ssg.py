"""Stochastic subgradient (Pegasos step ``1/(lam (k+1))``) with weighted averaging: the SSG baseline.

``w <- (1 - 1/(k+1)) w + 1/(lam (k+1)) psi_i(y*)`` for a sampled example ``i`` and its loss-augmented answer ``y*``
(Lacoste-Julien et al. 2013, App. F).  No dual variables: only the primal value is certified.
"""
from __future__ import annotations

import torch

from ..checks import saved_int, saved_tensor
from ..runtime.threads import single_thread
from .algorithm import Algorithm
from .sampling import make_sampler

__all__ = ["SSG"]


class SSG(Algorithm):
    name = "ssg"
    has_dual = False

    def __init__(self, model, data, lam, options, state=None, bounds=None):
        super().__init__(model, data, lam, options)
        if options.refined:
            raise ValueError("gap sampling, pairwise / away steps and caching need a dual: use solver='bcfw'")
        self.refuse_bcfw_extras(bounds, refinements=False)
        model.check_data(data)
        d, dev = model.n_features, data.device
        self.w = torch.zeros(d, dtype=torch.float64, device=dev)
        self.w_avg = torch.zeros(d, dtype=torch.float64, device=dev)
        self.k = 0
        self.sampler = make_sampler(options.sampling, self.n, options.seed)
        self._blocks = {}

    def _block(self, i: int):
        if i not in self._blocks:
            self._blocks[i] = self.data[[i]]
        return self._blocks[i]

    def advance(self, m: int) -> None:
        with single_thread(self.data.device):
            for i in self.sampler.draw(m):
                blk = self._block(int(i))
                y = self.model.oracle(self.w, blk, loss_augmented=True)
                psi = (self.model.joint_feature(blk, blk.y) - self.model.joint_feature(blk, y))[0]
                step = 1.0 / (self.k + 1)
                self.w.mul_(1.0 - step).add_(psi, alpha=step / self.lam)
                if self.options.averaging:
                    rho = 2.0 / (self.k + 2)
                    self.w_avg.mul_(1.0 - rho).add_(self.w, alpha=rho)
                self.k += 1
        self.oracle_calls += m

    def iterate(self):
        return self.w, None

    def averaged(self):
        return (self.w_avg, None) if self.options.averaging else None

    def state_dict(self) -> dict:
        return {"w": self.w.cpu().clone(), "w_avg": self.w_avg.cpu().clone(), "k": self.k,
                "sampler": self.sampler.state_dict(), "oracle_calls": self.oracle_calls}

    def load_state_dict(self, sd: dict) -> None:
        dev, d = self.w.device, self.w.shape[0]
        self.w = saved_tensor(sd["w"], "ssg w", (d,)).to(dev, self.w.dtype)
        self.w_avg = saved_tensor(sd["w_avg"], "ssg w_avg", (d,)).to(dev, self.w_avg.dtype)
        self.k = saved_int(sd["k"], "ssg k", 0)
        self.sampler.load_state_dict(sd["sampler"])
        self.oracle_calls = saved_int(sd["oracle_calls"], "oracle_calls", 0)
