"""The chain's compiled subgradient steps: the SSG baseline on CSR token features in ``O(nnz(x_i) K)`` per step.

Keeps the unrolled sums of :mod:`.subgradient` (``w_k = v_k / (lam k)``, ``w_avg_k = 2 (k v_k - u_k) / (lam k
(k+1))``): a step decodes block ``i`` at ``w = v / (lam k)`` with the chain's compiled Viterbi
(:func:`~.chain_kernels.loss_augmented_decode`) and adds ``psi_i(y*)`` to ``v`` (and ``k psi_i(y*)`` to ``u``) over
the non-zeros of the block's tokens only, where the generic :class:`~.subgradient.SubgradientSteps` rescales and
adds dense ``Tensor[d]`` vectors (``O(d)`` per step: 1.6M weights on CoNLL).
"""
from __future__ import annotations

import numpy as np
import torch
from numba import njit
from torch import Tensor

from .chain import chain_kernel_features
from .chain_kernels import (ChainFeatures, ChainWeights, StepScratch, add_direction, loss_augmented_decode,
                            step_scratch, unary_scores)
from .subgradient import unrolled_sums

__all__ = ["ChainSubgradientSteps", "chain_subgradient_steps"]


@njit(cache=True, _nrt=False)
def _add_psi(c, s, L, feats, ystar, D, v):
    """``v += c psi_i(y*)``: ``c (phi(x_i, y_i) - phi(x_i, y*))`` of the block at tokens ``s .. s+L-1``."""
    y = feats.y
    for t in range(L):
        for q in range(D.shape[1]):
            D[t, q] = 0.0
        D[t, y[s + t]] += 1.0
        D[t, ystar[t]] -= 1.0
    add_direction(c, s, L, feats.indptr, feats.indices, feats.values, D, v.We, v.bias, v.start, v.end)
    for t in range(1, L):
        v.trans[y[s + t - 1], y[s + t]] += c
        v.trans[ystar[t - 1], ystar[t]] -= c


@njit(cache=True, _nrt=False)
def chain_subgradient_steps(order, k0, lam, averaging, feats, v, u, scr, trans_w):
    """Steps ``k0, k0 + 1, ...`` on the blocks ``order[j]`` (``int64[m]``): decode at ``w = v / (lam k)`` (``w = 0``
    at ``k = 0``), then ``v += psi`` and, with ``averaging``, ``u += k psi``.  ``v``, ``u``: :class:`ChainWeights`
    views of the sums; ``scr``: a :class:`StepScratch`; ``trans_w [K, K]``: scratch for the scaled transitions."""
    K = trans_w.shape[0]
    for j in range(order.shape[0]):
        i = order[j]
        k = k0 + j
        a = 1.0 / (lam * k) if k > 0 else 0.0
        s = feats.offsets[i]
        L = feats.offsets[i + 1] - s
        unary_scores(s, L, feats.indptr, feats.indices, feats.values, v.We, v.bias, v.start, v.end, scr.U)
        for t in range(L):
            for c in range(K):
                scr.U[t, c] *= a
        for p in range(K):
            for c in range(K):
                trans_w[p, c] = a * v.trans[p, c]
        loss_augmented_decode(scr.U, scr.Ua, L, s, feats.y, 1.0 / L, trans_w, scr.ystar, scr.delta)
        _add_psi(1.0, s, L, feats, scr.ystar, scr.D, v)
        if averaging and k > 0:
            _add_psi(float(k), s, L, feats, scr.ystar, scr.D, u)


class ChainSubgradientSteps:
    """The subgradient steps of a :class:`~torch_bcfw.models.chain.Chain` on CPU data, compiled
    (:func:`chain_subgradient_steps`); the interface of :class:`~.subgradient.SubgradientSteps`.

    Args:
        model: the chain (its own oracle: :meth:`~torch_bcfw.models.chain.Chain.builtin_oracle`).
        data: CPU :class:`~torch_bcfw.data.sequences.SequenceData`.
        lam: regularisation ``> 0``.
        averaging: keep the weighted average.
    """

    def __init__(self, model, data, lam: float, averaging: bool):
        self.model, self.lam, self.averaging = model, float(lam), bool(averaging)
        d = model.n_features
        self.v = torch.zeros(d, dtype=torch.float64)
        self.u = torch.zeros(d, dtype=torch.float64)
        self.k = 0
        self._feats: ChainFeatures = chain_kernel_features(data)
        K = model.n_labels
        self._scratch: StepScratch = step_scratch(self._feats.offsets, K)
        self._trans_w = np.empty((K, K))

    def _views(self, x: Tensor) -> ChainWeights:
        return ChainWeights(*(t.numpy() for t in self.model.unpack(x)))

    def advance(self, blocks) -> None:
        """One step per entry of ``blocks`` (``int64[m]`` example indices), in order."""
        order = np.ascontiguousarray(blocks, dtype=np.int64)
        chain_subgradient_steps(order, self.k, self.lam, self.averaging, self._feats, self._views(self.v),
                                self._views(self.u), self._scratch, self._trans_w)
        self.k += int(order.shape[0])

    def weights(self) -> Tensor:
        """``w = v / (lam k)``: a new ``Tensor[d]``."""
        if self.k == 0:
            return torch.zeros_like(self.v)
        return self.v / (self.lam * self.k)

    def averaged(self) -> Tensor:
        """``w_avg = 2 (k v - u) / (lam k (k+1))``: a new ``Tensor[d]`` (zeros without averaging)."""
        if not self.averaging or self.k == 0:
            return torch.zeros_like(self.v)
        k = self.k
        return (k * self.v - self.u) * (2.0 / (self.lam * k * (k + 1)))

    def load(self, w: Tensor, w_avg: Tensor, k: int) -> None:
        """Continue from ``w``, ``w_avg`` (``Tensor[d]``) after ``k`` steps."""
        self.k = int(k)
        self.v, self.u = (t.contiguous() for t in unrolled_sums(w.to("cpu", torch.float64),
                                                               w_avg.to("cpu", torch.float64), self.k, self.lam))

