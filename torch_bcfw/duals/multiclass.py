"""The multiclass dual state: the dense ``w_i`` table with plain BCFW steps in one compiled loop.

:func:`multiclass_plain_steps` runs a whole plain plan (uniform or permuted order, FW steps, line search or the fixed
step, the lazy weighted average) in numba, oracle included (the loss-augmented argmax over the class scores), with the
generic loop's arithmetic up to the rounding of the dot products.  Every other plan runs in the generic loops.
"""
from __future__ import annotations

import numpy as np
import torch
from numba import njit

from .base import LOAD_TOL
from .dense import DenseDualState
from .plan import PlanResult, StepPlan
from .stepsize import TOTALS, fw_commit

__all__ = ["MulticlassDualState", "multiclass_plain_steps"]


@njit(cache=True)
def multiclass_plain_steps(order, x, y, bias, w_blocks, w_blocks_acc, w, block_ell, avg_last, lam, n_total, step_code,
                           averaging, k, avg_t, totals, gaps):
    """Plain BCFW steps on the blocks ``order`` (``int64[m]``) of a multiclass problem, in place.

    ``x: float64[n, F]`` the inputs, ``y: int64[n]`` the labels, ``bias``: a constant feature appended;
    ``w_blocks`` / ``w_blocks_acc: float64[n, d]`` the ``w_i`` table and its accumulator, ``w: float64[d]``,
    ``block_ell: float64[n]``, ``avg_last: int64[n]``, ``totals``: ``l`` and ``avg_l_u`` (a
    :data:`~.stepsize.TOTALS` record).  Returns ``(k, avg_t)`` updated; ``gaps[j]`` receives the block gap of step
    ``j``."""
    n_feat = x.shape[1]
    fp = n_feat + (1 if bias else 0)
    n_labels = w.shape[0] // fp
    scale = 1.0 / (lam * n_total)
    d = w.shape[0]
    direction = np.empty(d)
    for j in range(order.shape[0]):
        i = order[j]
        yi = y[i]
        # the oracle: argmax_c <w_c, [x_i, 1]> + [c != y_i] (the first maximum)
        best = -np.inf
        ys = 0
        for c in range(n_labels):
            s = 0.0
            base = c * fp
            for f in range(n_feat):
                s += w[base + f] * x[i, f]
            if bias:
                s += w[base + n_feat]
            if c != yi:
                s += 1.0
            if s > best:
                best = s
                ys = c
        ell_s = (1.0 if ys != yi else 0.0) / n_total
        # direction v = w_i - w_s, w_s = (phi(x_i, y_i) - phi(x_i, y_s)) / (lam n)
        for t in range(d):
            direction[t] = w_blocks[i, t]
        if ys != yi:
            for f in range(fp):
                xf = x[i, f] if f < n_feat else 1.0
                direction[yi * fp + f] -= xf * scale
                direction[ys * fp + f] += xf * scale
        ell_i = block_ell[i]
        vw = 0.0
        vv = 0.0
        for t in range(d):
            vw += direction[t] * w[t]
            vv += direction[t] * direction[t]
        num = lam * vw - ell_i + ell_s
        den = lam * vv
        gaps[j] = num
        gamma, s_acc = fw_commit(step_code, num, den, k, n_total, ell_s, averaging, avg_t, avg_last, block_ell, i,
                                 totals)
        if gamma != 0.0:
            if s_acc != 0.0:
                for t in range(d):
                    w_blocks_acc[i, t] += s_acc * w_blocks[i, t]
            for t in range(d):
                w_blocks[i, t] -= gamma * direction[t]
                w[t] -= gamma * direction[t]
        k += 1
        avg_t += 1
    return k, avg_t


class MulticlassDualState(DenseDualState):
    """:class:`~torch_bcfw.duals.dense.DenseDualState` of a :class:`~torch_bcfw.models.Multiclass` model whose plain
    plans run in :func:`multiclass_plain_steps` (CPU tensors, no box constraints, the model's own oracle, all the
    blocks of the problem in this process)."""

    def __init__(self, model, data, lam: float, n_total: int | None = None):
        super().__init__(model, data, lam, n_total)
        self._x64 = self._y64 = None

    #: ``w_i`` determines the block's simplex weights (:meth:`_check_dual_variables`)
    determines_duals = True

    def _check_dual_variables(self) -> None:
        """``w_i`` determines block ``i``'s dual variables when its features ``x~_i = [x_i, 1]`` are non-zero:
        ``w_i[c] = -alpha_i(c) x~_i / (lam n)`` for ``c != y_i`` and ``w_i[y_i] = sum_{c != y_i} alpha_i(c) x~_i /
        (lam n)``.  ``ValueError`` unless every ``w_i`` is that image of weights on the simplex and the saved ``l_i``
        is their expected loss ``sum_c alpha_i(c) L_i(c) / n``; a block of zero features must have ``w_i = 0`` (its
        ``l_i`` is then any value in its bounds, each the loss of some ``alpha_i``)."""
        if not self.n:
            return
        K, scale = self.model.n_labels, self.lam * self.n_total
        W = self.w_blocks.view(self.n, K, -1)  # [n, K, F']
        zeros = torch.zeros_like(self.data.y)
        x = self.model.joint_feature(self.data, zeros).to(self.w_blocks).view(self.n, K, -1)[:, 0]  # [n, F']: x~_i
        first = self.block_data(0)
        for c in range(K):  # the layout this check relies on: phi(x, c) is x~ in class c's block, zero elsewhere
            phi = self.model.joint_feature(first, torch.full_like(first.y, c)).to(x).view(K, -1)
            if not (torch.equal(phi[c], x[0]) and int(torch.count_nonzero(phi)) == int(torch.count_nonzero(x[0]))):
                raise ValueError(f"{type(self.model).__name__} changes the multiclass joint feature: its saved state "
                                 "cannot be checked against its dual variables")
        sq = (x * x).sum(1)  # [n]
        live = sq > 0
        alpha = -scale * torch.einsum("nkf,nf->nk", W, x) / torch.where(live, sq, torch.ones_like(sq))[:, None]
        rows = torch.arange(self.n, device=W.device)
        y = self.data.y.to(W.device)
        alpha[rows, y] = 0.0
        alpha[rows, y] = 1.0 - alpha.sum(1)
        alpha[~live] = 0.0
        alpha[~live, y[~live]] = 1.0
        image = -alpha[:, :, None] * x[:, None, :] / scale
        image[rows, y] += x / scale
        size = 1.0 + float(W.abs().max()) if W.numel() else 1.0
        if float((image - W).abs().max()) > LOAD_TOL * size or bool((alpha < -LOAD_TOL).any()):
            raise ValueError("state storage w_blocks: a block's w_i is not the image of dual variables on its simplex")
        losses = torch.stack([self.model.loss(self.data, torch.full_like(y, c)) for c in range(K)], 1).to(alpha)
        ell = (alpha * losses).sum(1) / self.n_total
        lifted = live & ((self.block_ell - ell).abs() > LOAD_TOL * (1.0 / self.n_total + ell.abs()))
        if bool(lifted.any()):
            i = int(lifted.nonzero()[0])
            raise ValueError(f"state block_ell: block {i}'s l_i = {float(self.block_ell[i])!r} is not the expected "
                             f"loss {float(ell[i])!r} of the dual variables its w_i determines")

    def can_run_plan(self, plan: StepPlan) -> bool:
        return (plan.is_plain and self.w.device.type == "cpu" and not self.has_bounds
                and self.model.builtin_oracle() and self.n_total == self.n)

    def run_plan(self, plan: StepPlan) -> PlanResult:
        if not self.can_run_plan(plan):
            return super().run_plan(plan)
        if self._x64 is None:  # the inputs as the kernel reads them, made once
            self._x64 = np.ascontiguousarray(self.data.x.detach().to(torch.float64).numpy())
            self._y64 = np.ascontiguousarray(self.data.y.detach().to(torch.int64).numpy())
        order = np.ascontiguousarray(plan.order, dtype=np.int64)
        gaps = np.empty(len(order))
        totals = np.array([(self.ell, self.avg_ell_u)], dtype=TOTALS)
        self.k, self.avg_t = multiclass_plain_steps(
            order, self._x64, self._y64, bool(self.model.bias), self.w_blocks.numpy(), self.w_blocks_acc.numpy(),
            self.v.numpy(), self.block_ell.numpy(), self.avg_last.numpy(), float(self.lam), int(self.n_total),
            int(plan.step_code), bool(plan.averaging), int(self.k), int(self.avg_t), totals, gaps)
        self.ell, self.avg_ell_u = float(totals[0]["ell"]), float(totals[0]["avg_ell_u"])
        return PlanResult(steps=len(order), oracle_calls=len(order), cache_hits=0, need_gap_pass=False,
                          blocks=order.copy(), gaps=gaps)
