"""The generic re-bindable dual state: dense ``w_i`` plus the dual variables themselves, in a working set."""
from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from ..checks import saved_tensor
from .base import LOAD_TOL
from .dense import DenseTable
from .working_set import ACC, ALPHA, WorkingSet

__all__ = ["ActiveSetDualState"]


class ActiveSetDualState(DenseTable):
    """Dense ``w_i`` plus the dual variables themselves: per block, the labelings with non-zero weight (the active
    set) and their weights.  Works for any model; can be re-bound to new features.

    ``alpha`` lives in a :class:`~torch_bcfw.duals.working_set.WorkingSet` (attribute ``active_set``, complete at all
    times, separate from a solver's :attr:`~torch_bcfw.duals.base.DualState.working_set`): per block the labelings
    with their weight (``ALPHA``), loss ``L_i(y)/n`` (``LOSS``) and averaging accumulator (``ACC``); a labeling
    leaves when its weight and accumulator are both 0.  The dense ``w_i`` table is a cache, recomputed by
    :meth:`_rebuild_blocks` (``w_i = sum_y alpha_i(y) psi_i(y) / (lam n)``).
    """

    #: the stored dual variables determine every ``l_i`` (:meth:`_check_dual_variables`)
    determines_duals = True

    rebindable = True

    def __init__(self, model, data, lam: float, n_total: int | None = None):
        super().__init__(model, data, lam, n_total)
        self.active_set = WorkingSet.for_data(data)

    # ------------------------------------------------------------ moves of alpha
    def _plane(self, i: int, y: Tensor, loss: float | None = None) -> int:
        """Position of labeling ``y`` in block ``i``'s active set, added with ``alpha = 0`` and ``L_i(y) / n``
        (``loss``, or computed) when absent."""
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
        ws.plane_values[ws.start[i] + j, ALPHA] += gamma
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
                ws.plane_values[ws.start[i] + j, ALPHA] += gamma * c
        if drop:
            ws.plane_values[ws.start[i] + ws.find(i, y_a.detach().cpu().numpy().reshape(-1)), ALPHA] = 0.0
        self._prune(i, nonpositive=True)

    def _move_all(self, y: Tensor, gamma: float) -> None:
        super()._move_all(y, gamma)
        losses = (self.model.loss(self.data, y) / self.n_total).tolist()
        for i, yi in enumerate(self._labelings(y)):
            self._add(i, torch.from_numpy(yi), gamma, losses[i])

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
        for i, yi in enumerate(self._labelings(self.data.y)):
            ws.column(i, ALPHA)[:] *= rho
            j = ws.put(i, yi, 0.0)
            ws.plane_values[ws.start[i] + j, ALPHA] += 1.0 - rho
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

    def _rebuild_blocks(self, chunk: int = 4096, rows: Tensor | None = None) -> None:
        """The ``w_i`` table and its accumulator from the active sets at ``self.data``'s features (``rows``: only
        these blocks, ``LongTensor``)."""
        blocks, labels, weights, accs = self._flat()
        dev = self.w.device
        self._phi_true = None
        if rows is None:
            self.w_blocks = torch.zeros(self.n, self.d, dtype=torch.float64, device=dev)
            self.w_blocks_acc = torch.zeros_like(self.w_blocks)
        else:
            keep = torch.isin(blocks, rows.cpu()).nonzero()[:, 0].tolist()
            blocks, labels, weights, accs = blocks[keep], [labels[j] for j in keep], weights[keep], accs[keep]
            self.w_blocks[rows.to(dev)] = 0.0
            self.w_blocks_acc[rows.to(dev)] = 0.0
        scale = 1.0 / (self.lam * self.n_total)
        for s in range(0, blocks.numel(), chunk):
            idx = blocks[s : s + chunk]
            sub = self.data[idx]
            y = torch.cat(labels[s : s + chunk]).to(dev)
            psi = self.model.joint_feature(sub, sub.y) - self.model.joint_feature(sub, y)
            ii = idx.to(dev)
            self.w_blocks.index_add_(0, ii, psi * (weights[s : s + chunk].to(dev) * scale)[:, None])
            self.w_blocks_acc.index_add_(0, ii, psi * (accs[s : s + chunk].to(dev) * scale)[:, None])

    def _rebind_storage(self, idx: Tensor, old, sub) -> None:
        """The rows ``idx`` of the ``w_i`` table and its accumulator, recomputed at the blocks' new features."""
        self._rebuild_blocks(rows=idx)

    def _storage_dict(self) -> dict:
        blocks, labels, weights, accs = self._flat()
        return {
            "blocks": blocks, "weights": weights.clone(), "accs": accs.clone(),
            "labels": torch.cat(labels) if labels else torch.zeros(0, dtype=torch.long),
            "label_lengths": torch.tensor([y.numel() for y in labels], dtype=torch.long),
        }

    def _load_storage(self, sd: dict) -> None:
        """The saved active sets, checked: block ids in range, each labeling one of its block's (length, model's loss
        and joint features), weights on each block's simplex, accumulators ``>= 0``, no labeling twice in a block."""
        if not {"blocks", "weights", "accs", "labels", "label_lengths"} <= sd.keys():
            raise ValueError("the saved active-set state lacks blocks, weights, accs, labels or label_lengths")
        blocks = saved_tensor(sd["blocks"], "state storage blocks", (None,), "int", lo=0, hi=self.n - 1)
        m = blocks.shape[0]
        lengths = saved_tensor(sd["label_lengths"], "state storage label_lengths", (m,), "int")
        want = torch.tensor([len(y) for y in self._labelings(self.data.y)], dtype=torch.int64)
        if m and not torch.equal(lengths, want[blocks]):
            raise ValueError("state storage label_lengths: a labeling is not of its block's length")
        labels = saved_tensor(sd["labels"], "state storage labels", (int(lengths.sum()),), "int", lo=0)
        weights = saved_tensor(sd["weights"], "state storage weights", (m,), lo=-LOAD_TOL, hi=1 + LOAD_TOL)
        accs = saved_tensor(sd["accs"], "state storage accs", (m,), lo=-LOAD_TOL)
        total = torch.zeros(self.n, dtype=torch.float64).index_add_(0, blocks, weights)
        if not torch.allclose(total, torch.ones_like(total), atol=LOAD_TOL):
            raise ValueError("state storage weights: a block's weights do not sum to 1")
        ws = WorkingSet.for_data(self.data)
        for i in range(self.n):
            ws.remove(i, range(int(ws.size[i])))
        parts = torch.split(labels, lengths.tolist())
        blocks = blocks.tolist()
        try:
            losses = self._losses(blocks, parts)
        except (ValueError, IndexError, RuntimeError) as exc:
            raise ValueError(f"state storage labels: a labeling is none of its block's: {exc}") from None
        for i, y, a, acc, loss in zip(blocks, parts, weights.tolist(), accs.tolist(), losses):
            if ws.find(i, y.numpy()) >= 0:
                raise ValueError(f"state storage labels: block {i} lists a labeling twice")
            j = ws.insert(i, y.numpy(), loss, 0, True)
            ws.plane_values[ws.start[i] + j, ALPHA] = a
            ws.plane_values[ws.start[i] + j, ACC] = acc
        self.active_set = ws
        try:
            self._rebuild_blocks()
        except (IndexError, RuntimeError) as exc:
            raise ValueError(f"state storage labels: a labeling is none of its block's: {exc}") from None

    def _check_dual_variables(self) -> None:
        """``l_i`` is ``sum_y alpha_i(y) L_i(y) / n`` of the listed labelings (their losses recomputed on load)."""
        ws = self.active_set
        ell = torch.tensor([float(ws.alphas(i) @ ws.losses(i)) for i in range(self.n)], dtype=torch.float64)
        if not torch.allclose(self.block_ell.cpu(), ell, rtol=LOAD_TOL, atol=LOAD_TOL / self.n_total):
            raise ValueError("state block_ell is not the expected loss of the listed labelings")

    def _losses(self, blocks: list, labels, chunk: int = 4096) -> list:
        """``L_i(y) / n`` of the labelings ``labels`` of blocks ``blocks`` (batched)."""
        out = []
        for s in range(0, len(blocks), chunk):
            sub = self.data[torch.tensor(blocks[s : s + chunk], dtype=torch.long)]
            y = torch.cat(labels[s : s + chunk]).to(self.w.device)
            out += (self.model.loss(sub, y) / self.n_total).tolist()
        return out
