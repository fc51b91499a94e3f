"""The generic re-bindable dual state: dense ``w_i`` plus the dual variables themselves, in a working set."""
from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from .base import DualState
from .dense import DenseDualState
from .working_set import ACC, ALPHA, WorkingSet, block_labelings

__all__ = ["ActiveSetDualState"]


class ActiveSetDualState(DenseDualState):
    """Dense ``w_i`` plus the dual variables themselves: per block, the labelings with non-zero
    weight (the active set) and their weights.  Works for any model; can be re-bound to new features.

    ``alpha`` lives in a :class:`~torch_bcfw.duals.working_set.WorkingSet` (attribute ``active_set``): per block the
    labelings in the order they were first used, with their weight (column ``ALPHA``), their loss ``L_i(y)/n``
    (``LOSS``) and their averaging accumulator (``ACC``); a labeling leaves when both its weight and its accumulator
    are 0.  The dense ``w_i`` table of :class:`~torch_bcfw.duals.dense.DenseDualState` is kept as a cache for the
    solver steps and recomputed from the active sets by :meth:`_rebuild_blocks` (``w_i = sum_y alpha_i(y)
    psi_i(y) / (lam n)``, one batched :meth:`~torch_bcfw.models.base.StructuredModel.joint_feature` call per
    chunk).  A BCFW step adds at most one labeling to one block, so the memory grows with the number of
    distinct oracle answers (at most ``K`` per example for a multiclass model).

    The active set is the state's own record of ``alpha``, complete at all times; a solver's
    :attr:`~torch_bcfw.duals.base.DualState.working_set` (a cache or MP-BCFW's planes, which may evict active
    labelings) is a separate instance of the same structure.
    """

    rebindable = True

    def __init__(self, model, data, lam: float, n_total: int | None = None):
        super().__init__(model, data, lam, n_total)
        self.active_set = WorkingSet.for_data(data)

    # ------------------------------------------------------------ moves of alpha
    def _plane(self, i: int, y: Tensor, loss: float | None = None) -> int:
        """Position of labeling ``y`` in block ``i``'s active set, added with ``alpha = 0`` (and ``L_i(y) / n``, given
        as ``loss`` or computed) when absent."""
        ws = self.active_set
        ynp = y.detach().cpu().numpy().reshape(-1)
        j = ws.find(i, ynp)
        if j < 0:
            if loss is None:
                loss = float(self.model.loss(self.block_data(i), y.reshape(-1).to(self.w.device))[0]) / self.n_total
            j = ws.insert(i, ynp, loss, 0, True)
        return j

    def _prune(self, i: int, nonpositive: bool, keep_averaged: bool = True) -> None:
        """Drop the labelings of block ``i`` whose weight is 0 (``nonpositive``: ``<= 0``) and, with
        ``keep_averaged``, whose averaging accumulator is 0 as well."""
        a, acc = self.active_set.column(i, ALPHA), self.active_set.column(i, ACC)
        gone = a <= 0.0 if nonpositive else a == 0.0
        if keep_averaged:
            gone &= acc == 0.0
        if gone.any():
            self.active_set.remove(i, np.flatnonzero(gone))

    def _add(self, i: int, y: Tensor, gamma: float, loss: float | None = None) -> None:
        """``alpha_i <- (1 - gamma) alpha_i + gamma e_y``."""
        ws = self.active_set
        ws.column(i, ALPHA)[:] *= 1.0 - gamma
        j = self._plane(i, y, loss)
        ws.fl[ws.start[i] + j, ALPHA] += gamma
        self._prune(i, nonpositive=False)

    def _move_block(self, i: int, y: Tensor, gamma: float, v: Tensor) -> None:
        super()._move_block(i, y, gamma, v)
        self._add(i, y, gamma)

    def _move_block_general(self, i, y_s, y_a, coeffs, gamma, d, drop) -> None:
        super()._move_block_general(i, y_s, y_a, coeffs, gamma, d, drop)
        p, q, r = coeffs
        ws = self.active_set
        if r != 0.0:
            ws.column(i, ALPHA)[:] *= 1.0 + gamma * r
        for y, c in ((y_s, p), (y_a, q)):
            if c != 0.0:
                j = self._plane(i, y)
                ws.fl[ws.start[i] + j, ALPHA] += gamma * c
        if drop:
            ws.fl[ws.start[i] + ws.find(i, y_a.detach().cpu().numpy().reshape(-1)), ALPHA] = 0.0
        self._prune(i, nonpositive=True)

    # the moves keep more than w_blocks: the per-block default of DualState
    subset_direction = DualState.subset_direction
    _move_subset = DualState._move_subset
    _avg_touch_subset = DualState._avg_touch_subset
    _subset_block_gaps = DualState._subset_block_gaps

    def _move_all(self, y: Tensor, gamma: float) -> None:
        super()._move_all(y, gamma)
        labs = block_labelings(y, getattr(self.data, "offsets", None))
        losses = (self.model.loss(self.data, y) / self.n_total).tolist()
        for i in range(self.n):
            self._add(i, torch.from_numpy(labs[i]), gamma, losses[i])

    def _avg_accumulate(self, i, S) -> None:
        super()._avg_accumulate(i, S)
        ws = self.active_set
        if i is None:
            for j, s in enumerate(S.detach().cpu().tolist()):
                ws.column(j, ACC)[:] += s * ws.column(j, ALPHA)
        else:
            ws.column(i, ACC)[:] += float(S) * ws.column(i, ALPHA)

    def _rescale_storage(self, rho: float) -> None:
        ws = self.active_set
        labs = block_labelings(self.data.y, getattr(self.data, "offsets", None))
        for i in range(self.n):
            ws.column(i, ALPHA)[:] *= rho
            j = ws.find(i, labs[i])
            if j < 0:
                j = ws.insert(i, labs[i], 0.0, 0, True)
            ws.fl[ws.start[i] + j, ALPHA] += 1.0 - rho
            self._prune(i, nonpositive=True, keep_averaged=False)

    def _avg_reset_storage(self) -> None:
        super()._avg_reset_storage()
        for i in range(self.n):
            self.active_set.column(i, ACC)[:] = 0.0

    def active_set_sizes(self) -> Tensor:
        """``LongTensor[n]``: number of stored labelings per block."""
        return torch.from_numpy(self.active_set.sizes())

    # ------------------------------------------------------------ w_i from the active sets
    def _flat(self):
        """Every stored labeling, block by block in storage order: ``(blocks LongTensor[m], labels list of
        LongTensor, weights float64[m], accumulators float64[m])``."""
        ws = self.active_set
        blocks, labels, weights, accs = [], [], [], []
        for i in range(self.n):
            blocks += [i] * int(ws.size[i])
            labels += [torch.from_numpy(y.astype(np.int64)) for y in ws.labelings(i)]
            weights.append(ws.column(i, ALPHA))
            accs.append(ws.column(i, ACC))
        return (torch.tensor(blocks, dtype=torch.long), labels,
                torch.from_numpy(np.concatenate(weights)), torch.from_numpy(np.concatenate(accs)))

    def _rebuild_blocks(self, chunk: int = 4096) -> None:
        blocks, labels, weights, accs = self._flat()
        dev = self.w.device
        self._phi_true = None
        self.w_blocks = torch.zeros(self.n, self.d, dtype=torch.float64, device=dev)
        self.w_blocks_acc = torch.zeros_like(self.w_blocks)
        scale = 1.0 / (self.lam * self.n_total)
        for s in range(0, blocks.numel(), chunk):
            idx = blocks[s : s + chunk]
            sub = self.data[idx]
            y = torch.cat(labels[s : s + chunk]).to(dev)
            psi = self.model.joint_feature(sub, sub.y) - self.model.joint_feature(sub, y)
            ii = idx.to(dev)
            self.w_blocks.index_add_(0, ii, psi * (weights[s : s + chunk].to(dev) * scale)[:, None])
            self.w_blocks_acc.index_add_(0, ii, psi * (accs[s : s + chunk].to(dev) * scale)[:, None])

    def _storage_dict(self) -> dict:
        blocks, labels, weights, accs = self._flat()
        return {
            "blocks": blocks, "weights": weights.clone(), "accs": accs.clone(),
            "labels": torch.cat(labels) if labels else torch.zeros(0, dtype=torch.long),
            "label_lengths": torch.tensor([y.numel() for y in labels], dtype=torch.long),
        }

    def _load_storage(self, sd: dict) -> None:
        ws = WorkingSet.for_data(self.data)
        for i in range(self.n):
            ws.remove(i, range(int(ws.size[i])))
        parts = torch.split(sd["labels"].long(), sd["label_lengths"].tolist())
        blocks = sd["blocks"].tolist()
        losses = self._losses(blocks, parts)
        for i, y, a, acc, loss in zip(blocks, parts, sd["weights"].tolist(), sd["accs"].tolist(), losses):
            j = ws.insert(i, y.numpy(), loss, 0, True)
            ws.fl[ws.start[i] + j, ALPHA] = a
            ws.fl[ws.start[i] + j, ACC] = acc
        self.active_set = ws
        self._rebuild_blocks()

    def _losses(self, blocks: list, labels, chunk: int = 4096) -> list:
        """``L_i(y) / n`` of the labelings ``labels`` of blocks ``blocks`` (batched)."""
        out = []
        for s in range(0, len(blocks), chunk):
            sub = self.data[torch.tensor(blocks[s : s + chunk], dtype=torch.long)]
            y = torch.cat(labels[s : s + chunk]).to(self.w.device)
            out += (self.model.loss(sub, y) / self.n_total).tolist()
        return out
