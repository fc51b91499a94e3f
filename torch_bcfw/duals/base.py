"""Per-block dual state of the BCFW family.

The SSVM dual ``alpha`` has one simplex block per example; BCFW needs only ``w_i = A alpha_[i]`` and ``l_i = b^T
alpha_[i]`` (Lacoste-Julien et al. 2013, Alg. 4), ``w = sum_i w_i``, ``l = sum_i l_i``.  :class:`DualState` holds
the bookkeeping every storage shares; a subclass stores the blocks through the hooks of ``docs/anatomy.md``.

**Weighted averaging** (``wbar_T = 2/(T(T+1)) sum_t t w_t``, eq. 14 of the BCFW paper) is lazy and per block: each
block keeps an accumulator and the clock of its last change, and ``wbar`` is assembled on demand.  ``lbar`` uses
``lbar_T = l_T - 2/(T(T+1)) sum_t t(t+1)/2 (l_{t+1} - l_t)``.

**New features** (:meth:`DualState.rebind`, :meth:`DualState.from_state_dict`): a state storing the dual variables
themselves re-derives ``w = A(x) alpha`` and its caches under new features (``l = b^T alpha`` is unchanged); a
storage of ``w_i = A(x_old) alpha_[i]`` cannot (``rebindable = False``).

**Box constraints** (Osokin et al. 2016, App. H).  After :meth:`DualState.set_bounds` the state keeps the
untruncated ``v = sum_i v_i`` and exposes ``w = clip(v, lower, upper)``: the oracle and inner products use ``w``,
directions and their norms ``v``.  The dual gains the box multipliers: ``D = l - lam/2 ||w||^2 - lam (beta_u^T u -
beta_l^T l)`` with ``beta_u = [v - u]_+``, ``beta_l = [l - v]_+`` (:meth:`DualState.dual_ell`), and the block gaps
still sum to the exact gap.

**Working sets**: pairwise and away steps, the cache and MP-BCFW use an optional
:class:`~torch_bcfw.duals.working_set.WorkingSet` (``working_set``, saved and kept by a rebind) whose ``alpha``
follow every move.
"""
from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod

import numpy as np
import torch
from torch import Tensor

from ..checks import check_bounds, check_lam, check_n_total, saved_float, saved_int, saved_tensor
from ..data.base import segment_rows
from ..data.sequences import MulticlassData, SequenceData
from .fingerprint import features_fingerprint, labels_fingerprint
from .plan import PlanResult, RoundStep, StepPlan, generic_plan_steps, round_corners, run_rounds
from .stepsize import (PAIRWISE_RULE, average_weight, clipped_step, lazy_weight, minibatch_step_size,
                       step_size)
from .working_set import ALPHA, WorkingSet, block_labelings

__all__ = ["DualState", "LOAD_TOL"]

#: relative tolerance of the checks of a loaded state: simplex sums, ``w = A alpha``, ``l = sum_i l_i``, losses
LOAD_TOL = 1e-8


class DualState(ABC):
    """Shared bookkeeping of a primal-dual BCFW state (see the module docstring).  A subclass implements the abstract
    storage hooks (``docs/anatomy.md``); a :attr:`rebindable` one keeps its own :meth:`_rescale_storage`.

    Attributes:
        n: number of blocks the state holds (``len(data)``).
        n_total: the problem's number of examples ``n`` in the scalings ``1 / (lam n)`` and ``L_i / n`` (``n``,
            unless the state holds one shard of a problem sharded over processes).
        w: ``Tensor[d]`` float64, ``sum_i w_i`` (with box constraints: ``clip(v, lower, upper)``).
        v: ``Tensor[d]`` float64, the untruncated ``sum_i w_i`` (the same tensor as ``w`` without bounds).
        ell: float, ``sum_i l_i`` (the linear part of the dual).
        working_set: optional :class:`~torch_bcfw.duals.working_set.WorkingSet` of explicit
            ``alpha_i`` (active sets, caches), or ``None``.
        block_ell: ``Tensor[n]`` float64, ``l_i``.
        k: int, number of block steps taken (the global counter of the fixed step size).
        avg_t: int, number of iterates produced so far (the clock of the weighted average).
        avg_last: ``LongTensor[n]`` (CPU), clock of each block's last change.
        avg_ell_u: scalar accumulator of the averaged ``l``.
    """

    #: True when the stored blocks are the dual variables themselves (not feature-space images ``w_i``), so that
    #: the state can be moved to new features (:meth:`rebind`); its ``_load_storage`` must derive any feature-space
    #: cache at ``self.data``'s features.
    rebindable = True
    #: True when a load checks that the stored blocks are feasible dual variables with their ``l_i``
    #: (:meth:`_check_dual_variables`); a storage that cannot (a ``w_i`` table, a graph cut's marginals) must track
    #: what a loaded state contributes (:meth:`untrusted_part`)
    determines_duals = True

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        owner = next(c for c in cls.__mro__ if "_rescale_storage" in vars(c))
        if cls.rebindable and not owner.rebindable:
            raise TypeError(f"{cls.__name__} stores the dual variables (rebindable) but inherits _rescale_storage "
                            f"from {owner.__name__}, which stores w_i only: implement it (the regularization path's "
                            "alpha_i <- rho alpha_i + (1 - rho) e_{y_i})")

    def __init__(self, model, data, lam: float, n_total: int | None = None):
        model.check_data(data)
        self.model = model
        self.data = data
        self.lam = check_lam(lam)
        self.n = len(data)
        self.n_total = check_n_total(n_total, self.n)
        self.d = model.n_features
        dev = data.device
        self.v = torch.zeros(self.d, dtype=torch.float64, device=dev)
        self.w = self.v  # clip(v, lower, upper) once bounds are set (see the module docstring)
        self.lower = self.upper = None
        self._box = False
        self.working_set = None
        self.ell = 0.0
        self.block_ell = torch.zeros(self.n, dtype=torch.float64, device=dev)
        self.k = 0
        self.avg_t = 0
        self.avg_last = torch.zeros(self.n, dtype=torch.long)
        self.avg_ell_u = 0.0
        #: True after :meth:`load_state_dict` re-derived ``w`` under features other than the saved ones
        self.rebound = False
        #: False from a load until the average restarts: the saved accumulators do not determine the averaged ``l``,
        #: so the averaged pair's dual value certifies nothing (its primal value still holds)
        self.avg_trusted = True

    # ------------------------------------------------------------ storage hooks
    @abstractmethod
    def block_direction(self, i: int, y: Tensor) -> tuple[Tensor, float]:
        """``(v, l_s)``: ``v = w_i - w_s`` (``Tensor[d]``) and ``l_s = L_i(y)/n`` for labeling ``y`` of block ``i``."""

    @abstractmethod
    def _move_block(self, i: int, y: Tensor, gamma: float, v: Tensor) -> None:
        """``alpha_i <- (1 - gamma) alpha_i + gamma e_y`` in the storage (``v``: :meth:`block_direction`'s)."""

    @abstractmethod
    def block_w(self, i: int) -> Tensor:
        """``w_i`` as a dense ``Tensor[d]``."""

    def _labelings(self, y) -> list[np.ndarray]:
        """Each block's labeling in ``y`` (laid out like ``data.y``; :func:`~.working_set.block_labelings`)."""
        return block_labelings(y, getattr(self.data, "offsets", None))

    def _move_all(self, y: Tensor, gamma: float) -> None:
        """Batch move: ``alpha <- (1 - gamma) alpha + gamma s`` with ``s`` the corners ``y`` (all blocks, laid out like
        ``data.y``).  Default: one :meth:`_move_block` per block."""
        for i, yi in enumerate(self._labelings(y)):
            yi = torch.as_tensor(yi, dtype=torch.long, device=self.w.device)
            self._move_block(i, yi, gamma, self.block_direction(i, yi)[0])

    def _w_from_blocks(self) -> Tensor:
        """``sum_i w_i`` recomputed from the stored blocks (``Tensor[d]``).  Default: the sum of :meth:`block_w`."""
        return sum((self.block_w(i) for i in range(self.n)), torch.zeros_like(self.v))

    @abstractmethod
    def _avg_accumulate(self, i: int | None, S) -> None:
        """Add ``S`` times block ``i``'s state to its average accumulator (``i=None``: all blocks, ``S: Tensor[n]``)."""

    @abstractmethod
    def _avg_w(self, S: Tensor, total: float) -> Tensor:
        """``sum_i (acc_i + S_i state_i) / total`` mapped to weights: the averaged ``w`` (``Tensor[d]``)."""

    def _avg_touch(self, i: int) -> None:
        """Block ``i`` is about to change at clock ``avg_t``: bring its accumulator up to date."""
        S = lazy_weight(self.avg_t, int(self.avg_last[i]))
        if S != 0.0:
            self._avg_accumulate(i, S)
        self.avg_last[i] = self.avg_t

    def _commit_block(self, i: int, ell_i: float, new_ell_i: float, d: Tensor, alpha: float) -> None:
        """After block ``i``'s dual variables moved: ``v += alpha d`` (``Tensor[d]``), its ``l_i`` becomes
        ``new_ell_i``, and ``l`` and the averaging accumulator of ``l`` follow."""
        self.block_ell[i] = new_ell_i
        self.v.add_(d, alpha=alpha)
        self._sync_w()
        self.ell += new_ell_i - ell_i
        self.avg_ell_u += average_weight(self.avg_t) * (new_ell_i - ell_i)

    # ------------------------------------------------------------ solver API
    def block_step(self, i: int, y: Tensor, step_code: int, averaging: bool = True) -> tuple[float, float]:
        """One Frank-Wolfe step on block ``i`` towards the corner of labeling ``y``.  Returns ``(num, gamma)``: ``num =
        lam <w_i - w_s, w> - l_i + l_s`` (the block gap when ``y`` is an exact oracle answer), ``gamma`` the step."""
        v, ell_s = self.block_direction(i, y)
        ell_i = float(self.block_ell[i])
        num = self.lam * float(v @ self.w) - ell_i + ell_s
        den = self.lam * float(v @ v)
        gamma = step_size(step_code, num, den, self.k, self.n_total)
        if gamma != 0.0:
            if averaging:
                self._avg_touch(i)
            self._move_block(i, y, gamma, v)
            self._commit_block(i, ell_i, (1.0 - gamma) * ell_i + gamma * ell_s, v, -gamma)
        self.k += 1
        self.avg_t += 1
        return num, gamma

    def corner_steps(self, blocks: np.ndarray, ys: list, step_code: int, averaging: bool = True) -> np.ndarray:
        """One :meth:`block_step` per block of ``blocks`` (``int64[m]``) in order, towards the given labelings ``ys``
        (oracle answers, maybe at an earlier ``w``: ``strategy="split-oracle"``).  Returns the numerators
        (``float64[m]``)."""
        return np.array([self.block_step(i, y, step_code, averaging)[0] for i, y in zip(blocks.tolist(), ys)],
                        dtype=np.float64)

    def block_move(self, i: int, y_s: Tensor, y_a: Tensor, rule: int, gmax: float, drop_exact: bool = True,
                   averaging: bool = True) -> tuple[float, float, bool]:
        """A pairwise or away step on block ``i`` (Osokin et al. 2016, Algs. 3 and 4), exact line search.

        ``rule = PAIRWISE_RULE``: ``alpha_i <- alpha_i + gamma (e_s - e_a)``; ``AWAY_RULE``: ``alpha_i <- (1 + gamma)
        alpha_i - gamma e_a``.  ``gamma`` is clipped to ``[0, gmax]``.  Returns ``(num, gamma, drop)``: ``num`` the
        numerator (``H_s - H_a`` resp. ``sum_y alpha(y) H(y) - H_a``, over ``n``), ``drop`` when the clip bound was
        hit (``alpha_i(a)`` becomes exactly 0 with ``drop_exact``).
        """
        v_s, ell_s = self.block_direction(i, y_s)  # v_i - w_s
        v_a, ell_a = self.block_direction(i, y_a)  # v_i - w_a
        ell_i = float(self.block_ell[i])
        if rule == PAIRWISE_RULE:
            d, dl, coeffs = v_a - v_s, ell_s - ell_a, (1.0, -1.0, 0.0)
        else:
            d, dl, coeffs = v_a, ell_i - ell_a, (0.0, -1.0, 1.0)
        num = dl - self.lam * float(d @ self.w)
        den = self.lam * float(d @ d)
        gamma, drop = clipped_step(num, den, gmax)
        if gamma != 0.0:
            if averaging:
                self._avg_touch(i)
            self._move_block_general(i, y_s, y_a, coeffs, gamma, d, drop and drop_exact)
            self._commit_block(i, ell_i, ell_i + gamma * dl, d, gamma)
        self.k += 1
        self.avg_t += 1
        return num, gamma, drop

    def skip_step(self) -> None:
        """Count a block iteration that made no move (keeps the step counter and averaging clock in step)."""
        self.k += 1
        self.avg_t += 1

    def _move_block_general(self, i: int, y_s: Tensor, y_a: Tensor, coeffs: tuple, gamma: float, d: Tensor,
                            drop: bool) -> None:
        """``alpha_i <- alpha_i + gamma (p e_s + q e_a + r alpha_i)``, ``(p, q, r) = coeffs``, ``d`` the feature-space
        direction; ``drop``: ``alpha_i(y_a)`` must become exactly 0.  Optional: only pairwise and away steps move so
        (``step_rule="pairwise"`` / ``"away"``)."""
        raise NotImplementedError(f"{type(self).__name__} takes FW steps only: it has no _move_block_general for "
                                  "pairwise and away steps (step_rule='pairwise' / 'away')")

    # ------------------------------------------------------------ explicit corners (generic step loop)
    def block_value(self, i: int) -> float:
        """``sum_y alpha_i(y) H_i(y; w) / n = l_i - lam <v_i, w>`` (up to the per-block constant of
        :meth:`corner_values`)."""
        return float(self.block_ell[i]) - self.lam * float(self.block_w(i) @ self.w)

    def corner_values(self, i: int, ys: list) -> np.ndarray:
        """``H_i(y; w) / n = (L_i(y) - <w, phi(x_i, y_i) - phi(x_i, y)>) / n`` for labelings ``ys`` (1-D integer
        arrays or tensors) of block ``i``: ``float64[len(ys)]``, minus :meth:`block_value` a block gap."""
        return self.pair_values([i] * len(ys), ys)

    def pair_values(self, blocks, ys: list) -> np.ndarray:
        """:meth:`corner_values` for the pairs ``(blocks[q], ys[q])`` in one batched call (``float64[len(ys)]``)."""
        rep = self.data[torch.as_tensor(np.asarray(blocks, dtype=np.int64), device=self.w.device)]
        y = torch.cat([torch.as_tensor(np.asarray(t), dtype=torch.long).reshape(-1) for t in ys]).to(self.w.device)
        y = y.reshape(rep.y.shape)
        w = self.w
        H = self.model.loss(rep, y) + self.model.score(w, rep, y) - self.model.score(w, rep, rep.y)
        return (H / self.n_total).cpu().numpy().astype(np.float64)

    def subset_values(self, idx: Tensor, sub) -> Tensor:
        """:meth:`block_value` of the blocks ``idx`` (``sub = data[idx]``): ``l_i - lam <v_i, w>`` (``Tensor[tau]``).
        Default: one :meth:`block_value` per block; dense and compact storages batch it."""
        return torch.tensor([self.block_value(i) for i in idx.tolist()], dtype=torch.float64)

    def block_oracle(self, i: int) -> Tensor:
        """Loss-augmented decoding of example ``i`` at the current (truncated) ``w``."""
        return self.model.oracle(self.w, self.block_data(i), loss_augmented=True)

    def block_gaps(self) -> tuple[Tensor, Tensor, Tensor]:
        """Exact block gaps at the current ``w`` in one batched oracle pass (no step is taken).  Returns ``(g, H,
        y_star)``: ``g_i = H_i / n - (l_i - lam <v_i, w>)`` (``Tensor[n]`` float64, summing to the duality gap), the
        hinge values ``H_i = max_y L_i(y) - <w, psi_i(y)>`` and the oracle answers."""
        y_star, H = self.model.hinge_terms(self.w, self.data)
        dots = self._block_dots()
        return H / self.n_total - (self.block_ell - dots), H, y_star

    def block_deltas(self) -> Tensor:
        """``delta_i = l_i - lam <v_i, w>`` for every block (``Tensor[n]`` float64): block ``i``'s share of the gap's
        growth under :meth:`rescale_lam` (``g_i(rho lam) = g_i(lam) + (1 - rho) delta_i``; they sum to
        :meth:`path_delta` without box constraints)."""
        return self.block_ell - self._block_dots()

    def _block_dots(self) -> Tensor:
        """``lam <v_i, w>`` for every block (``Tensor[n]``)."""
        return torch.stack([self.lam * (self.block_w(i) @ self.w) for i in range(self.n)])

    # ------------------------------------------------------------ box constraints (App. H)
    def set_bounds(self, lower: Tensor | None, upper: Tensor | None) -> None:
        """Constrain the weights to ``lower <= w <= upper`` (``Tensor[d]``, +-inf allowed, or ``None``): ``w``
        becomes ``clip(v, lower, upper)`` (see the module docstring)."""
        lo, hi = check_bounds(lower, upper, self.d, self.v.device)
        self.lower, self.upper = lo, hi
        self._box = True
        self._sync_w()

    @property
    def has_bounds(self) -> bool:
        return self._box

    def _sync_w(self) -> None:
        self.w = torch.clamp(self.v, self.lower, self.upper) if self._box else self.v

    def box_term(self, v: Tensor | None = None) -> float:
        """``lam (beta_u^T u - beta_l^T l)`` with ``beta_u = [v - u]_+``, ``beta_l = [l - v]_+`` (0 without bounds)."""
        if not self._box:
            return 0.0
        v = self.v if v is None else v
        fin_u = torch.isfinite(self.upper)
        fin_l = torch.isfinite(self.lower)
        t = float(((v - self.upper).clamp_min(0.0)[fin_u] * self.upper[fin_u]).sum())
        t -= float(((self.lower - v).clamp_min(0.0)[fin_l] * self.lower[fin_l]).sum())
        return self.lam * t

    def dual_ell(self) -> float:
        """The linear part of the dual value: ``l`` minus the box term (``D = dual_ell - lam/2 ||w||^2``)."""
        return self.ell - self.box_term() if self._box else self.ell

    # ------------------------------------------------------------ working set
    def ensure_working_set(self, cache_only: bool = False) -> WorkingSet:
        """The state's :class:`WorkingSet`, created at the ground truth if the state has none (only consistent at the
        initial point ``alpha_i = e_{y_i}``: a state that has moved raises ``ValueError``, or with ``cache_only`` gets
        the ground-truth planes as a cache, every block ``incomplete``)."""
        if self.working_set is None:
            moved = self.k != 0 or (self.d > 0 and float(self.v.abs().max()) != 0.0)
            if moved and not cache_only:
                raise ValueError(
                    "this dual state has moved without a working set, so its dual variables alpha are not "
                    "listed; pairwise / away steps and caching must start from a fresh state (or one saved "
                    "with its working set)"
                )
            self.working_set = WorkingSet.for_data(self.data)
            if moved:  # the ground-truth planes are a valid cache; their alpha = 1 is not the state's
                self.working_set.incomplete[:] = 1
        return self.working_set

    # ------------------------------------------------------------ moving along lambda (regularization path)
    def set_corners(self, y: Tensor) -> None:
        """Put every block on one corner: ``alpha_i = e_{y_i'}`` for the labelings ``y`` (all blocks, laid out like
        ``data.y``; the regularization path's max-loss labelings, Osokin et al. 2016, Alg. 6).  The averages
        restart; a working set (if any) lists exactly these corners."""
        self._move_all(y, 1.0)
        self.block_ell = self.model.loss(self.data, y).to(self.block_ell) / self.n_total
        self.refresh()
        self._restart_average()
        ws = self.working_set
        if ws is not None:
            losses = self.block_ell.detach().cpu().numpy()
            for i, yi in enumerate(self._labelings(y)):
                ws.alphas(i)[:] = 0.0
                j = ws.put(i, yi, float(losses[i]))  # may move the block's region: index after it
                ws.plane_values[ws.start[i] + j, ALPHA] = 1.0
                ws.incomplete[i] = 0

    def rescale_lam(self, lam_new: float) -> float:
        """Move the state to a smaller ``lam_new = rho lam`` keeping ``w`` (Osokin et al. 2016, Prop. 1): ``alpha_i <-
        rho alpha_i + (1 - rho) e_{y_i}``, so ``w_i`` and ``w`` are unchanged and ``l_i <- rho l_i``; the gap at
        ``lam_new`` is ``g_old + (1 - rho) Delta`` (:meth:`path_delta`).  The averages restart.  Returns ``rho``,
        which must lie in ``(0, 1]``."""
        lam_new = check_lam(lam_new)
        rho = lam_new / self.lam
        if not rho <= 1.0:
            raise ValueError(
                f"rescale_lam keeps w and moves dual mass to the ground truth, which only works for a smaller lam "
                f"(lam_new = {lam_new} > lam = {self.lam}); start a new state for a larger lam"
            )
        self._rescale_storage(rho)
        ws = self.working_set
        if ws is not None:
            for i, yi in enumerate(self._labelings(self.data.y)):
                ws.alphas(i)[:] *= rho
                j = ws.put(i, yi, 0.0)
                ws.plane_values[ws.start[i] + j, ALPHA] += 1.0 - rho
        self.block_ell.mul_(rho)
        self.ell = float(self.block_ell.sum())
        self.lam = lam_new
        self._restart_average()
        return rho

    def path_delta(self) -> float:
        """``Delta = l - lam <v, w>``: the growth rate of the duality gap under :meth:`rescale_lam`, ``g(lam rho) =
        g(lam) + (1 - rho) Delta`` (Osokin et al. 2016, Prop. 1; box multipliers included)."""
        return self.ell - self.lam * float(self.v @ self.w)

    @abstractmethod
    def _rescale_storage(self, rho: float) -> None:
        """Storage hook of :meth:`rescale_lam`: ``alpha_i <- rho alpha_i + (1 - rho) e_{y_i}`` at ``lam <- rho lam``
        (which leaves every ``w_i`` unchanged).  Required: a storage of ``alpha`` that skipped it would give wrong
        weights on the regularization path."""

    def _restart_average(self) -> None:
        """Forget the weighted average (its accumulators restart at the current iterate)."""
        self.avg_trusted = True
        self.avg_t = 0
        self.avg_last.zero_()
        self.avg_ell_u = 0.0
        self._avg_reset_storage()

    @abstractmethod
    def _avg_reset_storage(self) -> None:
        """Zero the storage's average accumulators."""

    # ------------------------------------------------------------ what a loaded state certifies
    def has_untrusted_blocks(self) -> bool:
        """True while part of the dual variables came from a file that does not determine them (see
        :meth:`untrusted_part`; never for a storage that :attr:`determines_duals`)."""
        return False

    def untrusted_part(self) -> tuple[Tensor, float] | None:
        """``(u, l_u)``: the part of ``(v, l)`` loaded from a file that does not determine it, or ``None``.  ``(v - u,
        l - l_u)`` is then the image and linear part of a feasible dual point (the untrusted part at the ground
        truth)."""
        return None

    def trust_marks(self) -> tuple[bool, bool]:
        """``(blocks, average)``: whether this state's dual variables and averaged dual value certify, for a warm start
        from an in-memory result of this process (:meth:`restore_trust`)."""
        return not self.has_untrusted_blocks(), self.avg_trusted

    def restore_trust(self, marks: tuple[bool, bool]) -> None:
        """After :meth:`load_state_dict` of a state this process computed (not read from a file): what
        :meth:`trust_marks` said of it holds again."""
        blocks, average = marks
        if blocks:
            self._clear_untrusted()
        self.avg_trusted = bool(average)

    def _clear_untrusted(self) -> None:
        """Storage hook of :meth:`restore_trust`: forget the loaded part (nothing by default)."""

    def trusted_dual(self, ell: float, reduce=None) -> float | None:
        """The dual value of the feasible point without the untrusted part (``None``: the state's own dual value
        holds).  ``ell``: ``l`` of all processes; ``reduce``: for a state holding one shard, the callable summing
        ``(vector, scalar)`` over the processes."""
        part = self.untrusted_part()
        if part is None:
            return None
        u, lu = part
        if reduce is not None:
            u, lu = reduce(u, lu)
        v = self.v - u
        w = torch.clamp(v, self.lower, self.upper) if self._box else v
        return float(ell) - float(lu) - self.box_term(v) - 0.5 * self.lam * float((w * w).sum())

    # ------------------------------------------------------------ running plans
    def run_plan(self, plan: StepPlan) -> PlanResult:
        """Run a :class:`~torch_bcfw.duals.plan.StepPlan`: mini-batch plans in :func:`~.plan.run_rounds`, one-block
        plans in :func:`~.plan.generic_plan_steps` (a compiled override must give the same trajectory)."""
        if plan.rounds is not None:
            return run_rounds(self, plan)
        return generic_plan_steps(self, plan)

    def can_run_plan(self, plan: StepPlan) -> bool:
        """True when this state runs ``plan`` in compiled code of its own (none by default)."""
        return False

    def run_steps(self, order: np.ndarray, step_code: int, averaging: bool = True) -> np.ndarray:
        """Plain :class:`~.plan.StepPlan` on the blocks ``order`` (``int64[m]``); its block gaps (``float64[m]``)."""
        return self.run_plan(StepPlan.plain(order, step_code, averaging)).gaps

    # ------------------------------------------------------------ mini-batch steps (Wang et al. 2016)
    def subset_oracle(self, idx: Tensor):
        """One batched loss-augmented oracle call on the distinct blocks ``idx`` (``LongTensor[tau]``): ``(sub, y)``,
        the examples ``data[idx]`` and their answers laid out like ``sub.y``."""
        sub = self.data[idx] if len(idx) != 1 else self.block_data(int(idx[0]))
        return sub, self.model.oracle(self.w, sub, loss_augmented=True)

    def subset_direction(self, idx: Tensor, sub, y: Tensor) -> tuple[Tensor, Tensor, object]:
        """The joint direction of blocks ``idx`` towards the corners ``y`` (``sub = data[idx]``): ``(V, ell_s,
        parts)``, ``V = sum_{i in idx} (w_i - w_s,i)`` (``Tensor[d]``), ``ell_s = L_i(y_i) / n`` (``Tensor[tau]``)
        and what :meth:`_move_subset` needs.  Default: one :meth:`block_direction` per block."""
        labs = block_labelings(y, getattr(sub, "offsets", None))
        V = torch.zeros_like(self.v)
        vs, ells = [], []
        for j, i in enumerate(idx.tolist()):
            yj = torch.as_tensor(np.asarray(labs[j]), dtype=torch.long).reshape(-1).to(self.w.device)
            v, ell_s = self.block_direction(i, yj)
            V = v if j == 0 else V + v
            vs.append((yj, v))
            ells.append(ell_s)
        return V, torch.tensor(ells, dtype=torch.float64, device=self.w.device), vs

    def _move_subset(self, idx: Tensor, y: Tensor, gamma: float, parts) -> None:
        """Move the blocks ``idx``: ``alpha_i <- (1 - gamma) alpha_i + gamma e_{y_i}`` (``parts`` from
        :meth:`subset_direction`).  Default: one :meth:`_move_block` per block."""
        for i, (yj, v) in zip(idx.tolist(), parts):
            self._move_block(i, yj, gamma, v)

    def _avg_touch_subset(self, idx: Tensor) -> None:
        """The blocks ``idx`` are about to change at clock ``avg_t`` (:meth:`_avg_touch` for each)."""
        for i in idx.tolist():
            self._avg_touch(i)

    def round_step(self, blocks: np.ndarray, plan: StepPlan) -> RoundStep:
        """One round of the mini-batch ``plan`` on this process' distinct blocks ``blocks`` (``int64[tau]``, maybe
        none): their corners (:meth:`subset_oracle`, or with the cache :func:`~.plan.round_corners`), then one joint
        step (:meth:`minibatch_step` with the plan's ``reduce``)."""
        idx = torch.as_tensor(blocks, dtype=torch.long).to(self.w.device)
        js = hit = None
        if not len(blocks):  # a process without a block in the round
            sub = y = None
        elif plan.working_set is not None:
            sub, y, js, hit = round_corners(self, plan, blocks.tolist())
        else:
            sub, y = self.subset_oracle(idx)
        bgaps = np.empty(len(blocks)) if plan.estimates is not None else None
        num, gamma, tau = self.minibatch_step(idx, sub, y, plan.step_code, plan.averaging, plan.rounds.reduce, bgaps)
        return RoundStep(num, gamma, tau, bgaps, js, hit)

    def minibatch_step(self, idx: Tensor, sub, y: Tensor, step_code: int, averaging: bool = True,
                       reduce=None, block_gaps: np.ndarray | None = None) -> tuple[float, float, int]:
        """One mini-batch Frank-Wolfe step (Wang et al. 2016): the distinct blocks ``idx`` move together towards their
        corners ``y`` with one step ``gamma``.  With ``V = sum_i (w_i - w_s,i)``, ``dl = sum_i (l_s,i - l_i)`` the
        line search is ``clip(num / den, 0, 1)``, ``num = lam <V, w> + dl`` (the sum of the block gaps), ``den = lam
        ||V||^2``; ``FIXED``: ``min(1, 2 n tau / (tau k + 2 n))``.  At ``tau = 1`` this is :meth:`block_step`, bit
        for bit.

        ``reduce``: ``None``, or a callable summing ``(V, [sum_i l_i, sum_i l_s,i, len(idx)])`` over the processes
        sharing the round (``w`` replicated; each moves only its own blocks).  ``block_gaps``: ``float64[len(idx)]``
        receiving each block's gap before the step.  Returns ``(num, gamma, tau)``, ``tau`` the round's blocks over
        all processes (none: no step, the clocks stay).
        """
        if len(idx):
            V, ell_s, parts = self.subset_direction(idx, sub, y)
        else:  # a process with no block in a round split over processes: it still takes the round's step
            V, ell_s, parts = torch.zeros_like(self.v), self.block_ell[:0], None
        ell_i = self.block_ell[idx]
        if block_gaps is not None and len(idx):
            block_gaps[:] = (self._subset_block_gaps(idx, sub, parts) - ell_i + ell_s).cpu().numpy()
        sums = torch.stack([ell_i.sum(), ell_s.sum(), ell_i.new_tensor(float(len(idx)))])
        V, num, gamma, tau = self._round_step(V, sums, step_code, reduce)
        if tau == 0:
            return num, 0.0, 0
        if gamma != 0.0:
            if averaging and len(idx):
                if len(idx) == 1:
                    self._avg_touch(int(idx[0]))
                else:
                    self._avg_touch_subset(idx)
            if len(idx):
                self._move_subset(idx, y, gamma, parts)
            new_ell = (1.0 - gamma) * ell_i + gamma * ell_s
            self.block_ell[idx] = new_ell
            self.v.add_(V, alpha=-gamma)
            self._sync_w()
            dl = float((new_ell - ell_i).sum())
            self.ell += dl
            self.avg_ell_u += average_weight(self.avg_t) * dl
        self.k += tau
        self.avg_t += 1
        return num, gamma, tau

    def _subset_block_gaps(self, idx: Tensor, sub, parts) -> Tensor:
        """``lam <w_i - w_s,i, w>`` for each block of a round (``Tensor[tau]``; ``parts`` from
        :meth:`subset_direction`), the direction part of the block gaps."""
        return torch.stack([self.lam * (v @ self.w) for _, v in parts])

    def _round_step(self, V: Tensor, sums: Tensor, step_code: int, reduce=None) -> tuple[Tensor, float, float, int]:
        """The step of a round from ``V`` (``Tensor[d]``) and ``sums = [sum l_i, sum l_s, blocks]`` (first summed by
        ``reduce`` when given): ``(V, num, gamma, tau)``."""
        if reduce is not None:
            V, sums = reduce(V, sums)
        tau = int(sums[2])
        num = self.lam * float(V @ self.w) - float(sums[0]) + float(sums[1])
        den = self.lam * float(V @ V)
        return V, num, minibatch_step_size(step_code, num, den, self.k, self.n_total, tau), tau

    def batch_step(self, y: Tensor, step_code: int, fw_iter: int, averaging: bool = True) -> tuple[float, float]:
        """One batch Frank-Wolfe step towards the corners ``y`` (oracle answers for all blocks).  Returns ``(gap,
        gamma)``, ``gap`` the duality gap before the step (for exact answers)."""
        n, lam = self.n_total, self.lam
        phi = self.model.joint_feature_sum
        w_s = (phi(self.data, self.data.y) - phi(self.data, y)) / (lam * n)
        ell_s = float(self.model.loss(self.data, y).sum()) / n
        v = self.v - w_s
        gap = lam * float(v @ self.w) - self.ell + ell_s
        den = lam * float(v @ v)
        gamma = step_size(step_code, gap, den, fw_iter, 1)
        if gamma != 0.0:
            old_ell = self.ell
            if averaging:
                S = lazy_weight.py_func(self.avg_t, self.avg_last.to(torch.float64))
                self._avg_accumulate(None, S.to(self.w.device))
                self.avg_last.fill_(self.avg_t)
            self._move_all(y, gamma)
            self.block_ell.mul_(1.0 - gamma).add_(self.model.loss(self.data, y) / n, alpha=gamma)
            self.v.add_(v, alpha=-gamma)
            self._sync_w()
            self.ell = (1.0 - gamma) * old_ell + gamma * ell_s
            self.avg_ell_u += average_weight(self.avg_t) * (self.ell - old_ell)
        self.k += n
        self.avg_t += 1
        return gap, gamma

    def averaged(self, reduce=None) -> tuple[Tensor, float]:
        """The weighted average ``(wbar, lbar)`` of the iterates (weights ``t``, eq. 14 of the BCFW paper), meaningful
        when every step ran with ``averaging=True``.  With box constraints ``wbar`` is the truncated averaged ``v``
        and ``lbar`` includes its box term.  ``reduce``: for a state holding one shard, the callable summing
        ``(vector, scalar)`` over the processes."""
        T = self.avg_t
        if T == 0:
            ell = self.ell if reduce is None else reduce(self.v[:0], self.ell)[1]
            return self.w.clone(), ell - self.box_term()
        total = average_weight(T)
        S = lazy_weight.py_func(T, self.avg_last.to(torch.float64)).to(self.w.device)
        v_avg, ell_avg = self._avg_w(S, total), self.ell - self.avg_ell_u / total
        if reduce is not None:
            v_avg, ell_avg = reduce(v_avg, ell_avg)
        if self._box:  # the averaged alpha gives v_avg; its feasible pair is (clip(v_avg), l_avg - box term)
            return torch.clamp(v_avg, self.lower, self.upper), ell_avg - self.box_term(v_avg)
        return v_avg, ell_avg

    def refresh(self, reduce=None) -> float:
        """Recompute ``w = sum_i w_i`` and ``l = sum_i l_i`` from the blocks; return the drift removed.  ``reduce``:
        for a state holding one shard, the callable summing ``(vector, scalar)`` over the processes (for ``w``)."""
        v = self._w_from_blocks()
        if reduce is not None:
            v, _ = reduce(v, 0.0)
        drift = float((v - self.v).abs().max()) if self.d else 0.0
        self.v = v
        self._sync_w()
        self.ell = float(self.block_ell.sum())
        return drift

    # ------------------------------------------------------------ new features
    @classmethod
    def _check_rebindable(cls) -> None:
        if not cls.rebindable:
            raise NotImplementedError(
                f"{cls.__name__} stores w_i = A(x) alpha_[i] in feature space and not the dual variables "
                "alpha, so it cannot be moved to new features; use a state that keeps the dual variables "
                "(ChainDualState for chains, ActiveSetDualState for any model)"
            )

    @classmethod
    def from_state_dict(cls, model, data, lam: float, sd: dict) -> "DualState":
        """A state on ``data`` (the saved examples, labels and order; the features may differ) carrying the dual
        variables saved in ``sd`` (:meth:`state_dict`): ``w`` and the caches are re-derived under ``data``'s
        features."""
        cls._check_rebindable()
        state = cls(model, data, lam, sd.get("n_total"))
        state.load_state_dict(sd)  # a rebindable storage derives its feature-space caches at data's features
        state.refresh()
        return state

    def rebind(self, data) -> float:
        """Move this state to new features ``data`` (same examples and labels, in the same order): the dual
        variables, ``l_i``, the counters and the averages are kept, ``w`` and every feature-dependent cache
        recomputed.  Returns ``max |w_new - w_old|``.  Raises ``NotImplementedError`` for a state that is not
        :attr:`rebindable` and ``ValueError`` when ``data`` holds other examples."""
        self._check_rebindable()
        self.model.check_data(data)
        if len(data) != self.n:
            raise ValueError(f"rebind: the state has n = {self.n} examples but the new data has {len(data)}")
        if labels_fingerprint(data) != labels_fingerprint(self.data):
            raise ValueError(
                "rebind: the new data has other labels or sequence boundaries than the state's data "
                "(same examples in the same order are required; only the features may change)"
            )
        old_w = self.w.to(data.device)
        fresh = type(self).from_state_dict(self.model, data, self.lam, self.state_dict())
        fresh.restore_trust(self.trust_marks())  # the same state in this process, not one read from a file
        self.__dict__.clear()
        self.__dict__.update(fresh.__dict__)
        return float((self.w - old_w).abs().max()) if self.d else 0.0

    def rebind_blocks(self, idx: Tensor, sub) -> float:
        """Move the distinct blocks ``idx`` (``LongTensor[tau]``) to new features ``sub`` (the examples ``data[idx]``
        in that order, same labels and boundaries; a :class:`~torch_bcfw.data.sequences.SequenceData` or
        :class:`~torch_bcfw.data.sequences.MulticlassData` with dense features): their dual variables, ``l_i``, the
        counters and averages are kept, their ``w_i`` recomputed at ``sub``'s features and ``w`` moved by the
        difference, so that ``w = sum_i w_i`` with every ``w_i`` at the features its block was last bound to.  The
        state's data then holds ``sub``'s features for these blocks (written into a copy of the caller's features,
        made at the first call).  Returns ``max |w_new - w_old|``; errors as :meth:`rebind`."""
        self._check_rebindable()
        idx = torch.as_tensor(idx, dtype=torch.long).reshape(-1).cpu()
        if len(torch.unique(idx)) != len(idx) or (len(idx) and not 0 <= int(idx.min()) <= int(idx.max()) < self.n):
            raise ValueError(f"rebind_blocks: block ids must be distinct and in [0, {self.n}), got {idx.tolist()}")
        old = self.data[idx]
        sub = sub.to(self.w.device, torch.float64)
        if labels_fingerprint(sub) != labels_fingerprint(old):
            raise ValueError("rebind_blocks: the new data has other labels or sequence boundaries than the blocks "
                             "idx of the state's data (the examples idx in that order are required)")
        if not isinstance(old.x, Tensor) or not isinstance(self.data, (SequenceData, MulticlassData)):
            raise NotImplementedError("rebind_blocks moves SequenceData / MulticlassData with dense features, got "
                                      f"{type(self.data).__name__}")
        didx = idx.to(self.w.device)
        before = self._subset_w(didx, old)
        if not self.__dict__.get("_own_features"):  # never write into the caller's tensor
            self.data = dataclasses.replace(self.data, x=self.data.x.clone())
            self._own_features = True
        off = getattr(self.data, "offsets", None)
        rows = idx if off is None else segment_rows(off.cpu(), idx)[0]
        self.data.x[rows.to(self.w.device)] = sub.x.to(self.data.x.dtype)
        cache = self.__dict__.get("_block_cache", {})
        for i in idx.tolist():
            cache.pop(i, None)
        self._rebind_storage(didx, old, sub)
        delta = self._subset_w(didx, sub) - before
        self.v.add_(delta)
        self._sync_w()
        return float(delta.abs().max()) if self.d else 0.0

    def _subset_w(self, idx: Tensor, sub) -> Tensor:
        """``sum_{i in idx} w_i`` (``Tensor[d]``) at the features of ``sub = data[idx]``.  Default: the sum of
        :meth:`block_w`."""
        return sum((self.block_w(i) for i in idx.tolist()), torch.zeros_like(self.v))

    def _rebind_storage(self, idx: Tensor, old, sub) -> None:
        """Storage hook of :meth:`rebind_blocks`: the blocks ``idx`` moved from the features of ``old`` to those of
        ``sub`` (already in ``self.data``): update the feature-dependent caches (nothing by default)."""

    def block_data(self, i: int):
        """Example ``i`` as a one-example dataset (cached)."""
        cache = self.__dict__.setdefault("_block_cache", {})
        if i not in cache:
            cache[i] = self.data[[i]]
        return cache[i]

    # ------------------------------------------------------------ checkpointing
    @abstractmethod
    def _storage_dict(self) -> dict:
        """The storage for checkpoints: a dict of CPU tensors (copies)."""

    @abstractmethod
    def _load_storage(self, sd: dict) -> None:
        """Set the storage from :meth:`_storage_dict`'s output, checked (``ValueError`` naming a bad entry)."""

    def _load_tensors(self, sd: dict, kind: str, specs: dict) -> None:
        """Set each attribute ``name`` of ``specs`` (``name: (shape, lo, hi)``) from ``sd[name]``, checked by
        :func:`~torch_bcfw.checks.saved_tensor`; ``ValueError`` naming the ``kind`` of state when one is missing."""
        for name, (shape, lo, hi) in specs.items():
            if name not in sd:
                raise ValueError(f"the saved {kind} state lacks {name!r}")
            value = saved_tensor(sd[name], f"state storage {name}", shape, lo=lo, hi=hi)
            setattr(self, name, value.to(self.w.device))

    def state_dict(self) -> dict:
        """Everything needed to continue exactly (tensors on CPU)."""
        sd = {
            "kind": type(self).__name__,
            "lam": self.lam,
            "n": self.n,
            "n_total": self.n_total,
            "d": self.d,
            "w": self.v.cpu().clone(),  # untruncated (equal to w without bounds)
            "ell": self.ell,
            "block_ell": self.block_ell.cpu().clone(),
            "k": self.k,
            "avg_t": self.avg_t,
            "avg_last": self.avg_last.clone(),
            "avg_ell_u": self.avg_ell_u,
            "labels": labels_fingerprint(self.data),
            "features": features_fingerprint(self.data),
        }
        sd["storage"] = self._storage_dict()
        if self._box:
            sd["bounds"] = (self.lower.cpu().clone(), self.upper.cpu().clone())
        if self.working_set is not None:
            sd["working_set"] = self.working_set.state_dict()
        return sd

    def load_state_dict(self, sd: dict) -> None:
        """Continue from :meth:`state_dict`'s output on this state's data (same examples, labels and order).

        Nothing of ``sd`` is used unchecked: every field's type, dtype, shape, finiteness and range
        (:func:`~torch_bcfw.checks.saved_tensor`), ``lam``, the storage (``_load_storage``), the dual variables'
        feasibility (``_check_dual_variables``) and the derived ``w`` and ``l`` (within :data:`LOAD_TOL`); a failure
        raises ``ValueError`` before anything runs.  On the same data the state resumes bit for bit; under other
        features a :attr:`rebindable` state re-derives ``w = A(x) alpha`` (``rebound`` is then True) and any other
        raises ``ValueError``.
        """
        if not isinstance(sd, dict) or "kind" not in sd:
            raise ValueError("not a dual state (expected the dict written by DualState.state_dict)")
        if sd["kind"] != type(self).__name__:
            raise ValueError(f"cannot load a {sd['kind']!r} state into a {type(self).__name__}")
        missing = [k for k in ("lam", "n", "d", "w", "ell", "block_ell", "k", "avg_t", "avg_last", "avg_ell_u",
                               "storage") if k not in sd]
        if missing:
            raise ValueError(f"the saved dual state lacks {missing}")
        n, d = saved_int(sd["n"], "state n", 0), saved_int(sd["d"], "state d", 0)
        if n != self.n or d != self.d:
            raise ValueError(f"state was saved for n = {n}, d = {d} but this problem has n = {self.n}, d = {self.d}")
        n_total = saved_int(sd.get("n_total", n), "state n_total", n)
        if n_total != self.n_total:
            raise ValueError(f"state was saved for a problem of n_total = {n_total} examples, this one has "
                             f"n_total = {self.n_total}")
        lam = saved_float(sd["lam"], "state lam", lo=0.0)
        if lam != self.lam:
            raise ValueError(f"state was saved at lam = {lam!r}, this problem has lam = {self.lam!r}")
        if "labels" in sd and sd["labels"] != labels_fingerprint(self.data):
            raise ValueError(
                "state was saved for other examples (labels or sequence boundaries differ, or their order changed)"
            )
        same_features = sd.get("features") == features_fingerprint(self.data)
        if not same_features and not self.rebindable:
            raise ValueError(
                f"cannot warm-start a {type(self).__name__} on data whose features differ from the data it was saved "
                "from: it stores w_i = A(x) alpha_[i] under the old features, so its dual value would not be a "
                "valid bound here. Start from scratch, or use a state that keeps the dual variables "
                "(ActiveSetDualState for any model)"
            )
        dev = self.w.device
        v = saved_tensor(sd["w"], "state w", (d,)).to(dev)
        bounds = sd.get("bounds")
        if bounds is not None:
            if not isinstance(bounds, (tuple, list)) or len(bounds) != 2:
                raise ValueError("state bounds must be a pair (lower, upper)")
            lower, upper = check_bounds(*(saved_tensor(b, f"state bounds[{j}]", (d,), finite=False)
                                          for j, b in enumerate(bounds)), d, dev)
        max_loss = (self.model.max_loss(self.data).to(torch.float64).cpu() / self.n_total) if n else torch.zeros(0)
        block_ell = saved_tensor(sd["block_ell"], "state block_ell", (n,), lo=-LOAD_TOL)
        if bool((block_ell > max_loss * (1 + LOAD_TOL) + LOAD_TOL).any()):
            raise ValueError("state block_ell exceeds the examples' largest losses L_i / n")
        ell = saved_float(sd["ell"], "state ell")
        avg_t = saved_int(sd["avg_t"], "state avg_t", 0)
        k = saved_int(sd["k"], "state k", 0)
        avg_last = saved_tensor(sd["avg_last"], "state avg_last", (n,), "int", lo=0, hi=avg_t)
        avg_ell_u = saved_float(sd["avg_ell_u"], "state avg_ell_u")
        ws = sd.get("working_set")
        ws = WorkingSet.from_state_dict(ws, self._labelings(self.data.y)) if ws is not None else None
        self.v = v
        if bounds is not None:
            self.lower, self.upper, self._box = lower, upper, True
        self._sync_w()
        self.working_set = ws
        self.ell, self.block_ell = ell, block_ell.to(dev)
        self.k, self.avg_t, self.avg_last, self.avg_ell_u = k, avg_t, avg_last, avg_ell_u
        if not isinstance(sd["storage"], dict):
            raise ValueError("state storage must be a dict")
        self._load_storage(sd["storage"])
        if ws is not None:
            self._check_working_set(ws)
        self._check_dual_variables()
        self.avg_trusted = False
        if not self.determines_duals:
            self._mark_untrusted()
        self.rebound = not same_features
        if self.rebound:  # w = A(x_new) alpha from the stored dual variables (l = b^T alpha is unchanged)
            self.refresh()
        self._check_derived()

    def _check_working_set(self, ws: WorkingSet, chunk: int = 256) -> None:
        """The loaded working set's labelings are their blocks' (the model's loss must accept them and match the saved
        ``L_i(y) / n``), its weights lie on the simplex (or below it, in an ``incomplete`` block), and a complete
        block's mixture is the block: ``sum_y alpha_i(y) psi_i(y) / (lam n) = w_i`` and ``sum_y alpha_i(y) L_i(y) / n =
        l_i`` (so that pairwise and away steps, which move the listed weights, stay feasible)."""
        owners = np.repeat(np.arange(self.n), ws.size)
        if not len(owners):
            return
        ys = [y for i in range(self.n) for y in ws.labelings(i)]
        rep = self.data[torch.as_tensor(owners, device=self.w.device)]
        y = torch.cat([torch.as_tensor(t, dtype=torch.long).reshape(-1) for t in ys]).to(self.w.device)
        try:
            loss = self.model.loss(rep, y.reshape(rep.y.shape)).to(torch.float64).cpu().numpy() / self.n_total
        except (ValueError, IndexError, RuntimeError) as exc:
            raise ValueError(f"state working_set holds a labeling that is none of its block: {exc}") from None
        saved = np.concatenate([ws.losses(i) for i in range(self.n)])
        if not np.allclose(saved, loss, rtol=LOAD_TOL, atol=LOAD_TOL):
            raise ValueError("state working_set: a plane's loss is not the loss of its labeling")
        for i in range(self.n):
            a = ws.alphas(i)
            total = float(a.sum())
            if a.size and (float(a.min()) < -LOAD_TOL or total > 1 + LOAD_TOL or (
                    not ws.incomplete[i] and abs(total - 1.0) > LOAD_TOL)):
                raise ValueError(f"state working_set: the weights of block {i} are off the simplex (sum {total})")
        dev, scale = self.w.device, 1.0 / (self.lam * self.n_total)
        complete = [i for i in range(self.n) if not ws.incomplete[i] and ws.size[i]]
        for c in range(0, len(complete), chunk):
            rows = complete[c:c + chunk]
            at = torch.from_numpy(np.repeat(np.arange(len(rows)), ws.size[rows])).to(dev)
            rep = self.data[torch.tensor(rows, device=dev)[at]]
            y = np.concatenate([ws.plane_labels[ws.lab_start[i]:ws.lab_start[i] + ws.size[i] * ws.lab_len[i]]
                                for i in rows])
            y = torch.from_numpy(y.astype(np.int64)).to(dev).reshape(rep.y.shape)
            psi = self.model.joint_feature(rep, rep.y) - self.model.joint_feature(rep, y)
            a = torch.from_numpy(np.concatenate([ws.alphas(i) for i in rows])).to(dev)
            mix = torch.zeros(len(rows), self.d + 1, dtype=torch.float64, device=dev)  # [w_i, l_i] of the mixture
            mix[:, :-1].index_add_(0, at, psi * (a * scale)[:, None])
            mix[:, -1] = torch.from_numpy(np.array([float(ws.alphas(i) @ ws.losses(i)) for i in rows])).to(dev)
            blocks = torch.cat([torch.stack([self.block_w(i) for i in rows]), self.block_ell[rows, None]], 1)
            off = ((mix - blocks).abs() > LOAD_TOL * (1.0 + blocks.abs().amax(1, keepdim=True))).any(1)
            if bool(off.any()):
                raise ValueError(f"state working_set: the weights of block {rows[int(off.nonzero()[0])]} do not give "
                                 "back its w_i and l_i")

    def _mark_untrusted(self) -> None:
        """Storage hook of :meth:`load_state_dict` for a storage that does not :attr:`determine its dual variables
        <determines_duals>`: start tracking the loaded part (:meth:`untrusted_part`)."""
        raise NotImplementedError

    def _check_dual_variables(self) -> None:
        """Storage hook of :meth:`load_state_dict`: ``ValueError`` unless the loaded blocks are feasible dual variables
        with ``block_ell`` their ``b^T alpha_i`` (where the storage determines it; default: nothing to check)."""

    def _check_derived(self) -> None:
        """``v`` and ``l`` must be ``sum_i w_i`` and ``sum_i l_i`` within :data:`LOAD_TOL` (relative); the saved values
        are kept.  A state holding one shard checks ``w`` later with :meth:`check_w`."""
        if self.n_total == self.n:
            self.check_w()
        total = float(self.block_ell.sum())
        if abs(total - self.ell) > LOAD_TOL * (1.0 + abs(total)):
            raise ValueError(f"state ell = {self.ell!r} is not the sum of block_ell ({total!r})")

    def check_w(self, reduce=None) -> None:
        """``ValueError`` unless ``w`` (``v``) is ``sum_i w_i`` within :data:`LOAD_TOL` (relative); ``reduce``: for a
        state holding one shard, the callable summing ``(vector, scalar)`` over the processes."""
        if not self.d:
            return
        v = self._w_from_blocks()
        if reduce is not None:
            v, _ = reduce(v, 0.0)
        if float((v - self.v).abs().max()) > LOAD_TOL * (1.0 + float(self.v.abs().max())):
            raise ValueError("state w is not the sum of its blocks' w_i")
