"""The generic dual state: one dense ``w_i`` per example (:class:`DenseTable`, the base of the states that keep more
beside it; :class:`DenseDualState`, the table alone)."""
from __future__ import annotations

import torch
from torch import Tensor

from .base import DualState
from .stepsize import lazy_weight

__all__ = ["DenseTable", "DenseDualState", "dense_dual_state"]


class DenseTable(DualState):
    """Stores ``w_i`` as a dense ``Tensor[n, d]`` (float64; ``w_blocks``, its average accumulator ``w_blocks_acc``).
    Works for any model and device.  A state that keeps the dual variables beside the table (active sets, marginals)
    extends its moves and hooks; its mini-batch moves are the per-block defaults of :class:`DualState`.

    Not :attr:`~DualState.rebindable`: the table holds ``A(x) alpha_[i]`` for the features it was
    built with, and ``alpha`` is not kept (see :class:`~torch_bcfw.duals.active_set.ActiveSetDualState`).

    Nor does the table determine ``l_i``: a loaded state's blocks are *untrusted* (:meth:`untrusted_part`).  Each block
    keeps the fraction ``rho_i`` of its dual variables that came from the file (1 after the load; a step of size
    ``gamma`` multiplies it by ``1 - gamma``; a pairwise or away step makes the whole block untrusted again) with the
    loaded ``(w_i^0, l_i^0)``; the certificate counts that fraction at the ground truth (``w = 0``, ``l = 0``), a
    feasible dual point whatever the file held.
    """

    rebindable = False
    determines_duals = False

    def __init__(self, model, data, lam: float, n_total: int | None = None):
        super().__init__(model, data, lam, n_total)
        self.w_blocks = torch.zeros(self.n, self.d, dtype=torch.float64, device=data.device)
        self.w_blocks_acc = torch.zeros_like(self.w_blocks)
        self._phi_true = None
        self._last_phi = None
        #: after a load: ``(rho [n], w0 [n, d], l0 [n], whole [n] bool)`` (see the class docstring), else ``None``
        self._untrusted = None

    def _true_features(self, i) -> Tensor:
        """``phi(x_i, y_i)`` of block(s) ``i`` (an index or ``LongTensor[tau]``), from a table built once."""
        if self._phi_true is None:
            self._phi_true = self.model.joint_feature(self.data, self.data.y)
        return self._phi_true[i]

    def block_direction(self, i: int, y: Tensor) -> tuple[Tensor, float]:
        blk = self.block_data(i)
        phi_y = self.model.joint_feature(blk, y)[0]
        self._last_phi = (i, y, phi_y)  # for a subclass's _move_block (the same labeling's features)
        w_s = (self._true_features(i) - phi_y) / (self.lam * self.n_total)
        ell_s = float(self.model.loss(blk, y)[0]) / self.n_total
        return self.w_blocks[i] - w_s, ell_s

    def _move_block(self, i: int, y: Tensor, gamma: float, v: Tensor) -> None:
        self._shrink_untrusted(i, gamma)
        self.w_blocks[i] -= gamma * v

    def _move_block_general(self, i, y_s, y_a, coeffs, gamma, d, drop) -> None:
        if self._untrusted is not None:  # the loaded part of alpha_i may lose mass: the whole block is untrusted
            self._untrusted[3][i] = True
        self.w_blocks[i] += gamma * d

    # ------------------------------------------------------------ untrusted blocks of a loaded state
    def _mark_untrusted(self) -> None:
        """Every block's dual variables came from a file that does not determine them (called after a load)."""
        self._untrusted = (torch.ones(self.n, dtype=torch.float64, device=self.w.device), self.w_blocks.clone(),
                           self.block_ell.clone(), torch.zeros(self.n, dtype=torch.bool, device=self.w.device))

    def _shrink_untrusted(self, idx, gamma: float) -> None:
        """Blocks ``idx`` (an index, ``LongTensor`` or ``slice``) are about to move ``alpha_i <- (1 - gamma) alpha_i +
        gamma e_y``: a block wholly untrusted is captured as loaded (its current ``w_i``, ``l_i``), then the loaded
        fraction shrinks."""
        if self._untrusted is None:
            return
        rho, w0, l0, whole = self._untrusted
        rows = torch.arange(self.n, device=rho.device)[idx].reshape(-1)
        cap = rows[whole[rows]]
        if len(cap):
            rho[cap], w0[cap], l0[cap], whole[cap] = 1.0, self.w_blocks[cap], self.block_ell[cap], False
        rho[rows] *= 1.0 - gamma

    def has_untrusted_blocks(self) -> bool:
        return self._untrusted is not None

    def _clear_untrusted(self) -> None:
        self._untrusted = None

    def untrusted_part(self) -> tuple[Tensor, float] | None:
        """``(u, l_u)``: the part of ``(v, l)`` that came from a file and is not determined by it (``u = sum_i rho_i
        w_i^0``, ``Tensor[d]``), or ``None`` when every block is trusted.  ``(v - u, l - l_u)`` is the feature-space
        image and linear part of a feasible dual point."""
        if self._untrusted is None:
            return None
        rho, w0, l0, whole = self._untrusted
        r = torch.where(whole, torch.ones_like(rho), rho)
        W = torch.where(whole[:, None], self.w_blocks, w0)
        L = torch.where(whole, self.block_ell, l0)
        return r @ W, float(r @ L)

    def _rescale_storage(self, rho: float) -> None:
        """``w_i = A alpha_[i] / (lam n)`` is unchanged by ``alpha_i <- rho alpha_i + (1 - rho) e_{y_i}`` at ``lam <- rho
        lam`` (``psi_i(y_i) = 0``), ``l_i`` scales by ``rho``: so does the loaded part of an untrusted block.  A state
        that keeps ``alpha`` beside the table rescales it."""
        if self._untrusted is not None:
            self._untrusted[2].mul_(rho)

    def _block_dots(self) -> Tensor:
        return self.lam * (self.w_blocks @ self.w)

    def _move_all(self, y: Tensor, gamma: float) -> None:
        w_s = (self.model.joint_feature(self.data, self.data.y) - self.model.joint_feature(self.data, y)) / (
            self.lam * self.n_total
        )
        self._shrink_untrusted(slice(None), gamma)
        self.w_blocks.mul_(1.0 - gamma).add_(w_s, alpha=gamma)

    def subset_values(self, idx: Tensor, sub) -> Tensor:
        return self.block_ell[idx] - self.lam * (self.w_blocks[idx] @ self.w)

    def block_w(self, i: int) -> Tensor:
        return self.w_blocks[i].clone()

    def _w_from_blocks(self) -> Tensor:
        return self.w_blocks.sum(0)

    def _avg_accumulate(self, i, S) -> None:
        if i is None:
            self.w_blocks_acc.add_(S[:, None] * self.w_blocks)
        else:
            self.w_blocks_acc[i].add_(self.w_blocks[i], alpha=S)

    def _avg_w(self, S: Tensor, total: float) -> Tensor:
        return (self.w_blocks_acc.sum(0) + S @ self.w_blocks) / total

    def _avg_reset_storage(self) -> None:
        self.w_blocks_acc.zero_()

    def _storage_dict(self) -> dict:
        return {"w_blocks": self.w_blocks.cpu().clone(), "w_blocks_acc": self.w_blocks_acc.cpu().clone()}

    def _load_storage(self, sd: dict) -> None:
        """The saved ``w_i`` table and its accumulator, checked (``[n, d]``, finite)."""
        shape = ((self.n, self.d), None, None)
        self._load_tensors(sd, "dense", {"w_blocks": shape, "w_blocks_acc": shape})


class DenseDualState(DenseTable):
    """The :class:`DenseTable` alone: a mini-batch round moves its rows together."""

    def subset_direction(self, idx: Tensor, sub, y: Tensor):
        """Batched: ``parts = W_i - W_s`` (``Tensor[tau, d]``, the per-block directions)."""
        W_s = (self._true_features(idx) - self.model.joint_feature(sub, y)) / (self.lam * self.n_total)
        Vb = self.w_blocks[idx] - W_s
        ell_s = self.model.loss(sub, y).to(torch.float64) / self.n_total
        return Vb.sum(0), ell_s, Vb

    def _move_subset(self, idx: Tensor, y: Tensor, gamma: float, parts) -> None:
        self._shrink_untrusted(idx, gamma)
        self.w_blocks[idx] -= gamma * parts

    def _subset_block_gaps(self, idx: Tensor, sub, parts) -> Tensor:
        return self.lam * (parts @ self.w)

    def _avg_touch_subset(self, idx: Tensor) -> None:
        ic = idx.cpu()
        S = lazy_weight.py_func(self.avg_t, self.avg_last[ic].to(torch.float64)).to(self.w.device)
        self.w_blocks_acc[idx] += S[:, None] * self.w_blocks[idx]
        self.avg_last[ic] = self.avg_t


def dense_dual_state(model, data, lam: float, n_total: int | None = None) -> DenseDualState:
    """The per-block dual state for BCFW-type solvers (dense ``w_i``, :class:`DenseDualState`); ``n_total``: the
    problem's number of examples when ``data`` is one shard of it (see :class:`~torch_bcfw.duals.base.DualState`).
    :meth:`StructuredModel.dual_state <torch_bcfw.models.base.StructuredModel.dual_state>` unless a model keeps its
    own state."""
    return DenseDualState(model, data, lam, n_total)
