"""The chain's marginal dual state: per-position label marginals and per-sequence transition marginals.

For :class:`~torch_bcfw.models.chain.Chain`, ``w_i = (phi_i(y_i) - phi_i(mu_i, T_i)) / (lam n)`` depends on block
``i``'s dual variables only through their token marginals ``mu_i [L_i, K]`` and expected transition counts
``T_i [K, K]``, so :class:`ChainDualState` stores these: memory grows with the number of tokens, not with ``n * d``,
and the state can be re-bound to new token features.  On CPU the steps run in compiled code fed with CSR token
features and per-sequence Gram matrices (:func:`sequence_grams`): the block operations of :mod:`.chain_kernels`,
the step loop of :mod:`.chain_driver` and the mini-batch rounds of :mod:`.chain_rounds`.
"""
from __future__ import annotations

import dataclasses
from typing import NamedTuple

import numpy as np
import torch
from numba import njit
from torch import Tensor

from ..inference.viterbi import viterbi_packed
from .base import LOAD_TOL, DualState
from .chain_driver import chain_plain_bcfw_steps, chain_refined_plan_steps
from .chain_kernels import ChainAverages, ChainFeatures, ChainMarginals, ChainWeights, decode_block
from .chain_rounds import (RoundScratch, Touched, clear_touched, local_round, max_round_tokens, round_directions,
                           round_move, round_scratch)
from .plan import MP_EXACT, NEED_GAP_PASS, PlanResult, RoundStep, StepPlan, compiled_plan
from .stepsize import TOTALS, lazy_weight, minibatch_step_size
from .working_set import FREE, Pool

__all__ = ["ChainDualState", "chain_kernel_features", "sequence_grams", "transitions_decompose"]


def _marginal_scores(U: Tensor, trans: Tensor, data, M: Tensor, T: Tensor) -> Tensor:
    """The score of per-block marginals under ``w``: ``sum_t <U_t, M_t> + <T_i, trans>`` for every block of ``data``
    (``U, M``: ``[N_tok, K]`` unary scores and token marginals, ``T``: ``[n, K, K]``); ``Tensor[n]``."""
    s = torch.zeros(len(data), dtype=torch.float64, device=U.device)
    s.index_add_(0, data.token_sequence_ids(), (U * M).sum(1))
    return s + (T * trans).sum((1, 2))


class ChainDualState(DualState):
    """Marginal dual state of the chain: ``mu [N_tok, K]`` and ``T [n, K, K]`` (see the module docstring).

    The initial state is the ground truth (``mu`` one-hot, ``T`` the true transition counts): ``w_i = 0``.  On CPU
    the steps run in :func:`~.chain_driver.chain_refined_plan_steps`, elsewhere through the torch methods of
    :class:`~torch_bcfw.duals.base.DualState`.

    Args:
        model: a :class:`~torch_bcfw.models.chain.Chain`.
        data: its :class:`~torch_bcfw.data.sequences.SequenceData`.
        lam: the regularisation ``lam > 0``.
    """

    #: True: :meth:`state_dict` moves the storage (``mu``, ``T`` and their accumulators, on CPU) into the dict
    #: instead of copying it, and the state cannot step any more (for an owner dropping the state after saving it).
    move_storage_on_save = False
    #: ``(mu [N_tok, K], T [n, K, K])`` a distribution is known to have (online EG's Gibbs marginals of its saved
    #: parameters), set by a solver around :meth:`load_state_dict`: the loaded marginals must be these (within the
    #: load tolerance), which replaces the slower decomposition test (:func:`transitions_decompose`)
    known_marginals = None

    def __init__(self, model, data, lam: float, n_total: int | None = None):
        super().__init__(model, data, lam, n_total)
        self.mu = model.one_hot(data.y)
        self.T = model.transition_counts(data, data.y)
        self.mu_acc = torch.zeros_like(self.mu)
        # only the sum over blocks of the averaged transition marginals enters wbar: one K x K accumulator
        self.T_acc = torch.zeros_like(self.T[0])
        self._phi_true_sum = model.joint_feature_sum(data, data.y)
        self._features = None
        self._acc = None  # the summed direction P of a mini-batch round and its touched entries (compiled rounds)
        self._round = None  # (plan, round scratch) of the compiled rounds

    # ------------------------------------------------------------ storage hooks
    def _tokens(self, i: int) -> slice:
        """The positions of block ``i``'s tokens in ``mu``."""
        return slice(int(self.data.offsets[i]), int(self.data.offsets[i + 1]))

    def _block_marginal_direction(self, i: int, y: Tensor) -> tuple[Tensor, Tensor]:
        blk = self.block_data(i)
        D = self.model.one_hot(y) - self.mu[self._tokens(i)]
        dT = self.model.transition_counts(blk, y)[0] - self.T[i]
        return D, dT

    def block_direction(self, i: int, y: Tensor) -> tuple[Tensor, float]:
        blk = self.block_data(i)
        D, dT = self._block_marginal_direction(i, y)
        v = self.model.features_from_marginals(blk, D, dT) / (self.lam * self.n_total)
        return v, float(self.model.loss(blk, y)[0]) / self.n_total

    def _move_block(self, i: int, y: Tensor, gamma: float, v: Tensor) -> None:
        D, dT = self._block_marginal_direction(i, y)
        tok = self._tokens(i)
        self.mu[tok] += gamma * D
        self.T[i] += gamma * dT

    def _move_block_general(self, i, y_s, y_a, coeffs, gamma, d, drop) -> None:
        p, q, r = coeffs
        blk = self.block_data(i)
        tok = self._tokens(i)
        D = r * self.mu[tok] + p * self.model.one_hot(y_s) + q * self.model.one_hot(y_a)
        counts = self.model.transition_counts
        dT = r * self.T[i] + p * counts(blk, y_s)[0] + q * counts(blk, y_a)[0]
        self.mu[tok] += gamma * D
        self.T[i] += gamma * dT

    def set_block_marginals(self, i: int, mu: Tensor, T: Tensor, ell_i: float) -> None:
        """Move block ``i`` to the (interior) dual point with token marginals ``mu [L_i, K]``, expected transition
        counts ``T [K, K]`` and ``l_i = ell_i`` (online EG): ``w`` and ``l`` follow exactly (``phi`` is linear in
        the marginals).  The weighted average is not kept for such moves."""
        blk = self.block_data(i)
        tok = self._tokens(i)
        dv = self.model.features_from_marginals(blk, self.mu[tok] - mu, self.T[i] - T) / (self.lam * self.n_total)
        self.mu[tok] = mu
        self.T[i] = T
        self.v = self.v + dv
        self._sync_w()
        self.ell += ell_i - float(self.block_ell[i])
        self.block_ell[i] = ell_i

    def block_value(self, i: int) -> float:
        """``l_i - lam <w_i, w> = l_i + (score(mu_i) - score(y_i)) / n`` from the block's unary scores."""
        blk = self.block_data(i)
        U = self.model.unary_scores(self.w, blk)
        trans = self.model.unpack(self.w)[4]
        s_mu = float((U * self.mu[self._tokens(i)]).sum() + (self.T[i] * trans).sum())
        s_true = float(self.model.score_from_unary(U, trans, blk, blk.y)[0])
        return float(self.block_ell[i]) + (s_mu - s_true) / self.n_total

    def block_gaps(self) -> tuple[Tensor, Tensor, Tensor]:
        """All exact block gaps ``(score(y*) - score(mu_i)) / n - l_i + l_s`` from one unary pass and one
        batched Viterbi (see :meth:`DualState.block_gaps`)."""
        model, data = self.model, self.data
        w = self.w
        U = model.unary_scores(w, data)
        trans = model.unpack(w)[4]
        y_star, _ = viterbi_packed(U + model.loss_unaries(data, U.dtype), data.offsets, trans)
        s_true = model.score_from_unary(U, trans, data, data.y)
        H = model.loss(data, y_star) + model.score_from_unary(U, trans, data, y_star) - s_true
        return H / self.n_total - (self.block_ell - self._dots_from(U, trans, s_true)), H, y_star

    def _block_dots(self) -> Tensor:
        U = self.model.unary_scores(self.w, self.data)
        trans = self.model.unpack(self.w)[4]
        return self._dots_from(U, trans, self.model.score_from_unary(U, trans, self.data, self.data.y))

    def _dots_from(self, U: Tensor, trans: Tensor, s_true: Tensor) -> Tensor:
        """``lam <w_i, w>`` of every block from the unary scores ``U`` and transitions of ``w`` and the true
        labelings' scores ``s_true`` (``Tensor[n]``)."""
        return (s_true - _marginal_scores(U, trans, self.data, self.mu, self.T)) / self.n_total

    def _move_all(self, y: Tensor, gamma: float) -> None:
        self.mu.mul_(1.0 - gamma).add_(self.model.one_hot(y), alpha=gamma)
        self.T.mul_(1.0 - gamma).add_(self.model.transition_counts(self.data, y), alpha=gamma)

    def _token_index(self, idx: Tensor) -> Tensor:
        """Positions in ``mu`` of the tokens of the blocks ``idx``, block by block (``LongTensor[N_sub]``)."""
        off = self.data.offsets
        starts, lens = off[idx], off[idx + 1] - off[idx]
        base = torch.repeat_interleave(starts - torch.cumsum(lens, 0) + lens, lens)
        return base + torch.arange(int(lens.sum()), device=off.device)

    def subset_direction(self, idx: Tensor, sub, y: Tensor):
        """Batched on the marginals: ``parts = (tokens, D, dT)`` with ``D = onehot(y) - mu`` on the blocks' tokens
        and ``dT = T(y) - T_i`` per block; ``V`` is one :meth:`features_from_marginals` of ``(D, sum dT)``."""
        tok = self._token_index(idx)
        D = self.model.one_hot(y) - self.mu[tok]
        dT = self.model.transition_counts(sub, y) - self.T[idx]
        V = self.model.features_from_marginals(sub, D, dT.sum(0)) / (self.lam * self.n_total)
        ell_s = self.model.loss(sub, y).to(torch.float64) / self.n_total
        return V, ell_s, (tok, D, dT)

    def subset_values(self, idx: Tensor, sub) -> Tensor:
        """``l_i + (score(mu_i) - score(y_i)) / n`` from one unary pass over the blocks' tokens."""
        U = self.model.unary_scores(self.w, sub)
        trans = self.model.unpack(self.w)[4]
        s_mu = _marginal_scores(U, trans, sub, self.mu[self._token_index(idx)], self.T[idx])
        s_true = self.model.score_from_unary(U, trans, sub, sub.y)
        return self.block_ell[idx] + (s_mu - s_true) / self.n_total

    def _subset_block_gaps(self, idx: Tensor, sub, parts) -> Tensor:
        """``lam <w_i - w_s,i, w> = (score(D_i) + <dT_i, trans>) / n`` from the unary scores of the round's tokens."""
        _, D, dT = parts
        U, trans = self.model.unary_scores(self.w, sub), self.model.unpack(self.w)[4]
        return _marginal_scores(U, trans, sub, D, dT) / self.n_total

    def _move_subset(self, idx: Tensor, y: Tensor, gamma: float, parts) -> None:
        tok, D, dT = parts
        self.mu[tok] += gamma * D
        self.T[idx] += gamma * dT

    def _avg_touch_subset(self, idx: Tensor) -> None:
        ic = idx.cpu()
        S = lazy_weight.py_func(self.avg_t, self.avg_last[ic].to(torch.float64)).to(self.w.device)
        lens = self.data.offsets[idx + 1] - self.data.offsets[idx]
        tok = self._token_index(idx)
        self.mu_acc[tok] += S.repeat_interleave(lens)[:, None] * self.mu[tok]
        self.T_acc.add_((S[:, None, None] * self.T[idx]).sum(0))
        self.avg_last[ic] = self.avg_t

    def block_w(self, i: int) -> Tensor:
        blk = self.block_data(i)
        true = self.model.joint_feature_sum(blk, blk.y)
        cur = self.model.features_from_marginals(blk, self.mu[self._tokens(i)], self.T[i])
        return (true - cur) / (self.lam * self.n_total)

    def _w_from_blocks(self) -> Tensor:
        cur = self.model.features_from_marginals(self.data, self.mu, self.T.sum(0))
        return (self._phi_true_sum - cur) / (self.lam * self.n_total)

    def _subset_w(self, idx: Tensor, sub) -> Tensor:
        """``sum_{i in idx} w_i`` at ``sub``'s features from one :meth:`features_from_marginals` of the blocks."""
        cur = self.model.features_from_marginals(sub, self.mu[self._token_index(idx)], self.T[idx].sum(0))
        return (self.model.joint_feature_sum(sub, sub.y) - cur) / (self.lam * self.n_total)

    def _rebind_storage(self, idx: Tensor, old, sub) -> None:
        """``phi(x, y) = sum_i phi(x_i, y_i)`` follows the blocks' new features; the compiled kernels' features are
        rebuilt when next needed."""
        phi = self.model.joint_feature_sum
        self._phi_true_sum = self._phi_true_sum + (phi(sub, sub.y) - phi(old, old.y))
        self._features = self._round = None

    def _avg_accumulate(self, i, S) -> None:
        if i is None:
            self.mu_acc.add_(S.repeat_interleave(self.data.lengths)[:, None] * self.mu)
            self.T_acc.add_((S[:, None, None] * self.T).sum(0))
        else:
            tok = self._tokens(i)
            self.mu_acc[tok].add_(self.mu[tok], alpha=S)
            self.T_acc.add_(self.T[i], alpha=S)

    def _avg_w(self, S: Tensor, total: float) -> Tensor:
        mu = (self.mu_acc + S.repeat_interleave(self.data.lengths)[:, None] * self.mu) / total
        T = (self.T_acc + (S[:, None, None] * self.T).sum(0)) / total
        return (self._phi_true_sum - self.model.features_from_marginals(self.data, mu, T)) / (self.lam * self.n_total)

    def _rescale_storage(self, rho: float) -> None:
        """``mu <- rho mu + (1 - rho) onehot(y)``, ``T <- rho T + (1 - rho) T(y)`` (:meth:`DualState.rescale_lam`)."""
        self.mu.mul_(rho).add_(self.model.one_hot(self.data.y), alpha=1.0 - rho)
        self.T.mul_(rho).add_(self.model.transition_counts(self.data, self.data.y), alpha=1.0 - rho)

    def _avg_reset_storage(self) -> None:
        self.mu_acc.zero_()
        self.T_acc.zero_()

    # ------------------------------------------------------------ compiled path
    def kernel_features(self) -> ChainFeatures:
        """The data as the compiled kernels take it (:func:`chain_kernel_features`, built once)."""
        if self._features is None:
            self._features = chain_kernel_features(self.data)
        return self._features

    def _kernel_weights(self, v: Tensor) -> ChainWeights:
        """Views of ``v`` (``Tensor[d]`` on CPU, in the layout of ``w``) as the kernels' :class:`ChainWeights`."""
        return ChainWeights(*(t.numpy() for t in self.model.unpack(v)))

    def _groups(self, totals: np.ndarray) -> tuple:
        """The named groups every chain kernel takes (:mod:`.chain_kernels`): the features, ``w`` (views of ``v``), the
        marginals with ``totals`` (a :data:`~.stepsize.TOTALS` record of ``l, avg_l_u``) and the averages."""
        marg = ChainMarginals(self.mu.numpy(), self.T.numpy(), self.block_ell.numpy(), totals)
        return (self.kernel_features(), self._kernel_weights(self.v), marg,
                ChainAverages(self.mu_acc.numpy(), self.T_acc.numpy(), self.avg_last.numpy()))

    def can_run_plan(self, plan: StepPlan) -> bool:
        """The compiled loops run here on CPU tensors without box constraints: every one-block plan over all the
        blocks of the problem (:mod:`.chain_driver`), and the rounds of mini-batch plans without the cache
        (:mod:`.chain_rounds`)."""
        if self.w.device.type != "cpu" or self.has_bounds:
            return False
        return plan.working_set is None if plan.rounds is not None else self.n_total == self.n

    def run_plan(self, plan: StepPlan) -> PlanResult:
        """A one-block plan that :meth:`can_run_plan` in :func:`~.chain_driver.chain_refined_plan_steps` (MP-BCFW's
        exact steps with an overridden oracle: that oracle from Python, one block per call); other plans as every state."""
        if plan.rounds is not None or not self.can_run_plan(plan):
            return super().run_plan(plan)
        planes = plan.working_set.planes if plan.working_set is not None else None
        if planes is not None and planes.mode == MP_EXACT and not self.model.builtin_oracle():
            parts = []
            for i in plan.order.tolist():
                y = self.block_oracle(int(i)).detach().cpu().numpy().astype(np.int64)
                one = dataclasses.replace(plan, m=1, order=np.array([i], dtype=np.int64))
                parts.append(self._compiled_steps(one, y))
            return PlanResult(steps=plan.m, oracle_calls=plan.m, cache_hits=0, need_gap_pass=False,
                              blocks=plan.order, gaps=np.concatenate([r.gaps[:1] for r in parts]))
        return self._compiled_steps(plan, np.zeros(0, dtype=np.int64))

    def block_oracle(self, i: int) -> Tensor:
        """On CPU without box constraints, for the model's own oracle: :func:`~.chain_kernels.decode_block` (the
        compiled loops' Viterbi); else the model's :meth:`~torch_bcfw.models.chain.Chain.oracle`."""
        if self.w.device.type != "cpu" or self.has_bounds or not self.model.builtin_oracle():
            return super().block_oracle(i)
        feats = self.kernel_features()
        y = np.empty(int(feats.offsets[i + 1] - feats.offsets[i]), dtype=np.int64)
        decode_block(i, feats, self._kernel_weights(self.v), y)
        return torch.from_numpy(y)

    def corner_steps(self, blocks: np.ndarray, ys: list, step_code: int, averaging: bool = True) -> np.ndarray:
        """One call of :func:`~.chain_driver.chain_refined_plan_steps` with the given answers when it runs here."""
        plan = StepPlan.plain(np.asarray(blocks, dtype=np.int64), step_code, averaging)
        if not self.can_run_plan(plan):
            return super().corner_steps(blocks, ys, step_code, averaging)
        ylab = np.concatenate([np.asarray(y, dtype=np.int64).reshape(-1) for y in ys])
        return self._compiled_steps(plan, ylab).gaps

    def _compiled_steps(self, plan: StepPlan, ylab: np.ndarray) -> PlanResult:
        """One call of :func:`~.chain_driver.chain_refined_plan_steps` (``ylab``: given oracle answers of the plan's
        blocks), writing back the counters, the working set's pool and MP-BCFW-avg's running average."""
        m = int(plan.m)
        gaps = np.full(m, np.nan)
        blocks = np.full(m, -1, dtype=np.int64)
        totals = np.array([(self.ell, self.avg_ell_u)], dtype=TOTALS)
        flags, sampling, running = compiled_plan(plan, self.v.numpy())
        ws = self.working_set if plan.working_set is not None else None
        pool = ws.arrays() if ws is not None else _NO_POOL
        if plan.is_plain and ylab.shape[0] == 0:  # plain BCFW: its own kernel, without the refinements' code
            progress = chain_plain_bcfw_steps(flags, sampling, self.lam, self.k, self.avg_t, *self._groups(totals),
                                              gaps, blocks)
        else:
            progress, pool = chain_refined_plan_steps(flags, sampling, pool, running, ylab, self.lam, self.k,
                                                      self.avg_t, *self._groups(totals), gaps, blocks)
        if ws is not None:
            ws.adopt(pool)
        if flags.running_average:
            run = plan.working_set.planes.running
            run.ell, run.k = float(running.totals["ell"][0]), int(running.totals["k"][0])
        self.ell, self.avg_ell_u = float(totals["ell"][0]), float(totals["avg_ell_u"][0])
        self.k, self.avg_t = progress.k, progress.clock
        done = progress.done
        return PlanResult(steps=done, oracle_calls=progress.oracle_calls, cache_hits=progress.cache_hits,
                          need_gap_pass=progress.status == NEED_GAP_PASS, blocks=blocks[:done], gaps=gaps[:done])

    def _round_context(self, plan: StepPlan) -> _RoundContext:
        """The compiled rounds' groups for ``plan`` (views of the state's tensors, rebuilt when one was replaced)."""
        ctx = self._round
        if ctx is None or ctx.plan is not plan or ctx.v is not self.v or ctx.mu is not self.mu:
            feats = self.kernel_features()
            K = self.model.n_labels
            rof = plan.rounds.offsets
            tokens = max_round_tokens(plan.order, rof, feats.offsets, plan.gap is not None)
            scr = round_scratch(feats.offsets, K, tokens, int(np.diff(rof).max(initial=0)))
            if self._acc is None:
                FK = self.model.n_inputs * K  # the emission entries
                touched = Touched(np.zeros(FK, dtype=np.uint8), np.zeros(FK, dtype=np.int64), np.zeros(1, np.int64))
                self._acc = (torch.zeros_like(self.v), touched)
            P, touched = self._acc
            acc = self._kernel_weights(P)
            self._round = ctx = _RoundContext(plan, self.v, self.mu, scr, acc, touched, P,
                                              *self._groups(np.zeros(1, dtype=TOTALS)))
        return ctx

    def round_step(self, blocks: np.ndarray, plan: StepPlan) -> RoundStep:
        """One round of a mini-batch plan that :meth:`can_run_plan` in the compiled parts of :mod:`.chain_rounds` (the
        torch round's trajectory up to rounding); with ``plan.rounds.reduce`` the step uses the reduced ``V = P /
        (lam n)``."""
        if not self.can_run_plan(plan):
            return super().round_step(blocks, plan)
        c = self._round_context(plan)
        tot = c.marg.totals[0]
        tot["ell"], tot["avg_ell_u"] = self.ell, self.avg_ell_u
        n, lam, reduce = self.n_total, self.lam, plan.rounds.reduce
        bgaps = np.empty(len(blocks))
        if reduce is None:
            tau = len(blocks)
            num, gamma = local_round(blocks, plan.step_code, lam, self.k, self.avg_t, plan.averaging, n, c.feats, c.w,
                                     c.marg, c.avg, c.acc, c.touched, c.scr, bgaps)
        else:
            _, s_i, s_s = round_directions(blocks, n, c.feats, c.w, c.marg, c.acc, c.touched, c.scr, bgaps)
            sums = torch.tensor([s_i, s_s, float(len(blocks))], dtype=torch.float64)
            V, num, gamma, tau = self._round_step(c.P * (1.0 / (lam * n)), sums, plan.step_code, reduce)
            if tau != 0 and gamma != 0.0:
                if len(blocks):
                    round_move(blocks, gamma, n, self.avg_t, plan.averaging, c.feats, c.w, c.marg, c.avg, c.scr)
                self.v.add_(V, alpha=-gamma)
            clear_touched(c.acc, c.touched)
        if tau == 0:
            return RoundStep(num, 0.0, 0, bgaps)
        self.ell, self.avg_ell_u = float(tot["ell"]), float(tot["avg_ell_u"])
        self.k += tau
        self.avg_t += 1
        return RoundStep(num, gamma, tau, bgaps)

    def _storage_dict(self) -> dict:
        names = ("mu", "T", "mu_acc", "T_acc")
        if not self.move_storage_on_save:
            return {name: getattr(self, name).to("cpu", copy=True) for name in names}
        sd = {name: getattr(self, name).cpu() for name in names}
        for name in names:  # moved out: a later step fails instead of writing into the saved tensors
            setattr(self, name, None)
        return sd

    def _load_storage(self, sd: dict) -> None:
        """The saved marginals and their accumulators, checked (shapes, finite, accumulators ``>= 0``)."""
        N, K, n = self.data.n_tokens, self.model.n_labels, self.n
        self._load_tensors(sd, "chain", {"mu": ((N, K), None, None), "T": ((n, K, K), None, None),
                                         "mu_acc": ((N, K), -LOAD_TOL, None), "T_acc": ((K, K), -LOAD_TOL, None)})

    def _check_dual_variables(self) -> None:
        """The marginals of a distribution over each block's labelings: every token's ``mu_t`` on the simplex, every
        ``T_i >= 0`` summing to ``L_i - 1`` with the token marginals as its row and column sums and a sum of
        per-position tables (:func:`transitions_decompose`), and ``l_i`` the expected loss under ``mu``."""
        mu, T, lengths = self.mu, self.T, self.data.lengths.to(self.mu.device)
        tol = LOAD_TOL
        if bool((mu < -tol).any()) or not bool(torch.allclose(mu.sum(1), torch.ones_like(mu[:, 0]), atol=tol)):
            raise ValueError("state storage mu: a token's marginals are off the simplex")
        sums_ok = torch.allclose(T.sum((1, 2)), (lengths - 1).to(T), atol=tol * (1 + T.shape[1]))
        if bool((T < -tol).any()) or not bool(sums_ok):
            raise ValueError("state storage T: a sequence's transition marginals are negative or do not sum to L_i - 1")
        seq, off = self.data.token_sequence_ids(), self.data.offsets
        first = torch.ones_like(seq, dtype=torch.bool)
        first[off[:-1]] = False  # tokens that have a predecessor
        last = torch.ones_like(seq, dtype=torch.bool)
        last[off[1:] - 1] = False  # tokens that have a successor
        rows = torch.zeros_like(T[:, :, 0]).index_add_(0, seq[last], mu[last])
        cols = torch.zeros_like(T[:, 0, :]).index_add_(0, seq[first], mu[first])
        if not (torch.allclose(T.sum(2), rows, atol=tol * (1 + float(lengths.max()))) and
                torch.allclose(T.sum(1), cols, atol=tol * (1 + float(lengths.max())))):
            raise ValueError("state storage T: the transition marginals disagree with the token marginals mu")
        atol = tol * (1 + float(lengths.max()))
        if self.known_marginals is not None:
            if not all(torch.allclose(a, b.to(a), rtol=0.0, atol=atol) for a, b in zip((mu, T), self.known_marginals)):
                raise ValueError("state storage mu, T: the marginals are not those of the solver's saved parameters")
            bad = -1
        else:
            bad = transitions_decompose(mu.cpu().numpy(), T.cpu().numpy(), off.cpu().numpy(), atol)
        if bad >= 0:
            raise ValueError(f"state storage T: sequence {bad}'s transition marginals are no sum of per-position "
                             "tables with its token marginals mu (no distribution over its labelings has them)")
        ell = torch.zeros(self.n, dtype=torch.float64, device=mu.device)
        ell.index_add_(0, seq, (mu * self.model.loss_unaries(self.data, torch.float64)).sum(1))
        if not torch.allclose(self.block_ell, ell / self.n_total, rtol=tol, atol=tol / self.n_total):
            raise ValueError("state block_ell is not the expected loss of the marginals mu")


@njit(cache=True)
def transitions_decompose(mu, T, offsets, tol) -> int:
    """The first block whose expected transition counts ``T[i]`` (``float64[n, K, K]``) are no sum ``sum_t P_t`` of
    per-position tables ``P_t >= 0`` with the token marginals ``mu`` (``float64[N_tok, K]``) as row and column sums
    (``-1``: none; ``tol`` the absolute tolerance of the sums).  On a chain such tables are the pairwise marginals of
    a distribution over the block's labelings, so this is the exact test that a state's marginals are feasible.  The
    tables' entries are solved for one constraint at a time (a row, a column or a total with one unknown entry left);
    the entries this leaves open, a few in a plain BCFW state, go to :func:`_feasible`."""
    K = T.shape[1]
    for i in range(offsets.shape[0] - 1):
        s, L = offsets[i], offsets[i + 1] - offsets[i]
        if L < 2:
            continue
        # the entries: P_t[a, b] with mu_t[a], mu_{t+1}[b] and T[a, b] all positive (the first n_var rows of var)
        var = np.empty(((L - 1) * K * K, 3), dtype=np.int64)  # its row, column and total constraint
        # constraints: rows (t, a) at t * K + a, columns (t, b) at (L - 1 + t) * K + b, totals (a, b) at 2 (L - 1) K
        n_con = 2 * (L - 1) * K + K * K
        rhs = np.empty(n_con)
        for t in range(L - 1):
            for a in range(K):
                rhs[t * K + a] = mu[s + t, a]
                rhs[(L - 1 + t) * K + a] = mu[s + t + 1, a]
        for a in range(K):
            for b in range(K):
                rhs[2 * (L - 1) * K + a * K + b] = T[i, a, b]
        unknown = np.zeros(n_con, dtype=np.int64)
        j = 0
        for t in range(L - 1):
            for a in range(K):
                if mu[s + t, a] > 0.0:
                    for b in range(K):
                        if mu[s + t + 1, b] > 0.0 and T[i, a, b] > 0.0:
                            var[j, 0], var[j, 1] = t * K + a, (L - 1 + t) * K + b
                            var[j, 2] = 2 * (L - 1) * K + a * K + b
                            for c in range(3):
                                unknown[var[j, c]] += 1
                            j += 1
        n_var = j
        value = np.full(n_var, np.nan)
        open_vars = n_var
        changed = True
        while changed:  # an entry alone unknown in one of its constraints is that constraint's rest
            changed = False
            for j in range(n_var):
                if not np.isnan(value[j]):
                    continue
                for c in range(3):
                    if unknown[var[j, c]] == 1:
                        v = rhs[var[j, c]]
                        value[j] = v
                        for c2 in range(3):
                            rhs[var[j, c2]] -= v
                            unknown[var[j, c2]] -= 1
                        open_vars -= 1
                        changed = True
                        break
        bad = False
        for j in range(n_var):
            if value[j] < -tol:
                bad = True
        for c in range(n_con):
            if unknown[c] == 0 and abs(rhs[c]) > tol:
                bad = True
        if not bad and open_vars:
            bad = not _feasible(var, value, rhs, unknown, tol)
        if bad:
            return i
    return -1


@njit(cache=True)
def _feasible(var, value, rhs, unknown, tol) -> bool:
    """Whether the open entries (``value`` NaN) can be ``>= 0`` with each open constraint's sum ``rhs`` (``unknown > 0``
    of them): phase 1 of the simplex method, Bland's rule, on a dense tableau."""
    cols = np.flatnonzero(np.isnan(value))
    rows = np.flatnonzero(unknown > 0)
    where = np.full(unknown.shape[0], -1, dtype=np.int64)
    for r in range(rows.shape[0]):
        where[rows[r]] = r
    m, nx = rows.shape[0], cols.shape[0]
    tab = np.zeros((m + 1, nx + m + 1))
    for k in range(nx):
        for c in range(3):
            tab[where[var[cols[k], c]], k] = 1.0
    for r in range(m):
        tab[r, -1] = rhs[rows[r]]
        if tab[r, -1] < 0.0:
            tab[r, :nx] *= -1.0
            tab[r, -1] *= -1.0
        tab[r, nx + r] = 1.0
        tab[m, :nx] -= tab[r, :nx]
        tab[m, -1] -= tab[r, -1]
    basis = np.arange(nx, nx + m)
    for _ in range(50 * (nx + m) + 100):
        enter = -1
        for k in range(nx + m):
            if tab[m, k] < -1e-12:
                enter = k
                break
        if enter < 0:
            break
        leave, best = -1, np.inf
        for r in range(m):
            if tab[r, enter] > 1e-12:
                q = tab[r, -1] / tab[r, enter]
                if q < best or (q == best and basis[r] < basis[leave]):
                    leave, best = r, q
        if leave < 0:
            break
        tab[leave] /= tab[leave, enter]
        for r in range(m + 1):
            if r != leave and tab[r, enter] != 0.0:
                tab[r] -= tab[r, enter] * tab[leave]
        basis[leave] = enter
    return -tab[m, -1] <= tol * (1.0 + m)


class _RoundContext(NamedTuple):
    """The groups of the compiled rounds of one plan (:meth:`ChainDualState._round_context`)."""

    plan: StepPlan
    v: Tensor
    mu: Tensor
    scr: RoundScratch
    acc: ChainWeights
    touched: Touched
    P: Tensor
    feats: ChainFeatures
    w: ChainWeights
    marg: ChainMarginals
    avg: ChainAverages


#: the working set of a plan that keeps none (the compiled loop reads nothing from it)
_NO_POOL = Pool(*(np.zeros(1, dtype=np.int64) for _ in range(5)), np.zeros(1, dtype=FREE), np.zeros(1, dtype=np.uint64),
                np.zeros((1, 5)), np.zeros(1, dtype=np.int32), np.zeros(1, dtype=np.uint8))


def chain_kernel_features(data) -> ChainFeatures:
    """``data`` (:class:`~torch_bcfw.data.sequences.SequenceData`) as the compiled kernels take it: CSR token features
    (:meth:`~torch_bcfw.data.sequences.SequenceData.x_csr`, so dense and sparse storage give identical inputs) and the
    per-sequence Gram matrices ``X_i X_i^T + 1`` (:func:`sequence_grams`).  Ids, values and Gram entries come in the
    narrowest types that hold them exactly (:func:`_narrow_ids`, :func:`_narrow_exact`): fewer cache misses, and
    widening them in the kernels is exact."""
    indptr, indices, values = (t.cpu().contiguous() for t in data.x_csr())
    values = values.to(torch.float64)
    off = data.offsets.cpu()
    gram, gram_off = sequence_grams(indptr, indices, values, off, data.n_inputs)
    return ChainFeatures(indptr.numpy(), _narrow_ids(indices, data.n_inputs), _narrow_exact(values),
                         data.y.cpu().numpy(), off.numpy(), _narrow_exact(gram), gram_off.numpy())


def _narrow_ids(ids: Tensor, n: int) -> np.ndarray:
    """``ids`` (in ``[0, n)``) as the narrowest of uint8, uint16, uint32 that holds ``n - 1`` (int64 beyond)."""
    dtype = next((t for t in (np.uint8, np.uint16, np.uint32) if n - 1 <= np.iinfo(t).max), np.int64)
    return ids.numpy().astype(dtype)


def _narrow_exact(x: Tensor) -> np.ndarray:
    """The float64 ``x`` as uint8 when its entries are integers in ``[0, 255]``, else as float32 when that is exact,
    else unchanged."""
    if bool(((x >= 0) & (x <= 255) & (x == x.round())).all()):
        return x.to(torch.uint8).numpy()
    y = x.to(torch.float32)
    return y.numpy() if torch.equal(y.to(torch.float64), x) else x.numpy()


def sequence_grams(indptr: Tensor, indices: Tensor, values: Tensor, offsets: Tensor,
                   n_features: int) -> tuple[Tensor, Tensor]:
    """Per-sequence Gram matrices ``G_i = X_i X_i^T + 1`` of CSR token features (CPU; the ``+1`` is the per-label bias
    feature), each ``L_i x L_i`` row-major at ``gram[gram_off[i] : gram_off[i+1]]``, from sparse dot products.
    Returns ``(gram Tensor[sum_i L_i^2] float64, gram_off LongTensor[n + 1])``."""
    offsets = offsets.cpu().long()
    lengths = offsets.diff()
    gram_off = torch.zeros(lengths.numel() + 1, dtype=torch.long)
    gram_off[1:] = torch.cumsum(lengths**2, 0)
    gram = torch.empty(int(gram_off[-1]), dtype=torch.float64)
    _sequence_grams(
        indptr.cpu().long().numpy(), indices.cpu().long().numpy(), values.cpu().to(torch.float64).numpy(),
        offsets.numpy(), gram_off.numpy(), int(n_features), gram.numpy(),
    )
    return gram, gram_off


@njit(cache=True)
def _sequence_grams(indptr, indices, values, offsets, gram_off, n_features, gram):
    scratch = np.zeros(n_features)
    for i in range(offsets.shape[0] - 1):
        s = offsets[i]
        L = offsets[i + 1] - s
        g0 = gram_off[i]
        for t in range(L):
            a = s + t
            for p in range(indptr[a], indptr[a + 1]):
                scratch[indices[p]] += values[p]
            for t2 in range(t, L):
                b = s + t2
                dot = 0.0
                for p in range(indptr[b], indptr[b + 1]):
                    dot += scratch[indices[p]] * values[p]
                gram[g0 + t * L + t2] = dot + 1.0
                gram[g0 + t2 * L + t] = dot + 1.0
            for p in range(indptr[a], indptr[a + 1]):
                scratch[indices[p]] = 0.0
