"""The stochastic subgradient baseline's state (no dual variables): Pegasos steps with weighted averaging.

Step ``k`` (from 0) on a sampled example ``i`` with loss-augmented answer ``y*``::

    w     <- (1 - 1/(k+1)) w + psi_i(y*) / (lam (k+1)),       psi_i(y) = phi(x_i, y_i) - phi(x_i, y)
    w_avg <- (1 - rho) w_avg + rho w,                           rho = 2 / (k+2)

(Lacoste-Julien et al. 2013, App. F).  Unrolled, ``w_k = v_k / (lam k)`` and ``w_avg_k = 2 (k v_k - u_k) / (lam k
(k+1))`` with ``v_k = sum_{j<k} psi_j`` and ``u_k = sum_{j<k} j psi_j``: a state may keep ``(v, u)`` and add only
the non-zeros of ``psi`` per step (:class:`~torch_bcfw.duals.chain_subgradient.ChainSubgradientSteps`).

:class:`SubgradientSteps` runs the steps through the model contract (any model, any device);
:meth:`~torch_bcfw.models.base.StructuredModel.subgradient_steps` says which state a model uses.
"""
from __future__ import annotations

import torch
from torch import Tensor

from ..runtime.threads import single_thread

__all__ = ["SubgradientSteps", "unrolled_sums"]


class SubgradientSteps:
    """Dense ``w`` and ``w_avg`` (``Tensor[d]``, float64, on the data's device) updated through the model's
    :meth:`oracle` and :meth:`joint_feature`: ``O(d)`` work per step.

    Args:
        model: a :class:`~torch_bcfw.models.base.StructuredModel`.
        data: its training data.
        lam: regularisation ``> 0``.
        averaging: keep ``w_avg``.
    """

    def __init__(self, model, data, lam: float, averaging: bool):
        self.model, self.data, self.lam, self.averaging = model, data, float(lam), bool(averaging)
        d = model.n_features
        self.w = torch.zeros(d, dtype=torch.float64, device=data.device)
        self.w_avg = torch.zeros(d, dtype=torch.float64, device=data.device)
        self.k = 0
        self._blocks = {}

    def _block(self, i: int):
        if i not in self._blocks:
            self._blocks[i] = self.data[[i]]
        return self._blocks[i]

    def advance(self, blocks) -> None:
        """One step per entry of ``blocks`` (``int64[m]`` example indices), in order."""
        with single_thread(self.data.device):
            for i in blocks:
                blk = self._block(int(i))
                y = self.model.oracle(self.w, blk, loss_augmented=True)
                psi = (self.model.joint_feature(blk, blk.y) - self.model.joint_feature(blk, y))[0]
                step = 1.0 / (self.k + 1)
                self.w.mul_(1.0 - step).add_(psi, alpha=step / self.lam)
                if self.averaging:
                    rho = 2.0 / (self.k + 2)
                    self.w_avg.mul_(1.0 - rho).add_(self.w, alpha=rho)
                self.k += 1

    def weights(self) -> Tensor:
        """``w``: ``Tensor[d]`` (the state's own tensor; do not modify)."""
        return self.w

    def averaged(self) -> Tensor:
        """``w_avg``: ``Tensor[d]`` (zeros without averaging)."""
        return self.w_avg

    def load(self, w: Tensor, w_avg: Tensor, k: int) -> None:
        """Continue from ``w``, ``w_avg`` (``Tensor[d]``) after ``k`` steps."""
        self.w = w.to(self.w.device, torch.float64).clone()
        self.w_avg = w_avg.to(self.w.device, torch.float64).clone()
        self.k = int(k)


def unrolled_sums(w: Tensor, w_avg: Tensor, k: int, lam: float) -> tuple[Tensor, Tensor]:
    """``(v, u)`` with ``w = v / (lam k)`` and ``w_avg = 2 (k v - u) / (lam k (k+1))`` (zeros at ``k = 0``): the
    unrolled sums of a state after ``k`` steps (:meth:`~.chain_subgradient.ChainSubgradientSteps.weights` and
    :meth:`~.chain_subgradient.ChainSubgradientSteps.averaged` invert it)."""
    v = (lam * k) * w
    return v, k * v - (lam * k * (k + 1) / 2.0) * w_avg

