"""The chain's compiled block operations (:mod:`.block_ops`) for the step driver :func:`~torch_bcfw.duals.driver.plan_steps`.

:class:`ChainFeatures` is the data group of the chain's kernel bundle ``(feats, wts, state, avg)`` (the argument
groups of :mod:`.chain_kernels`); the scratch of a block step comes from :func:`~.block_ops.block_scratch`.  The
implementations below, registered with numba's ``overload`` for that data group, compose the chain's block
operations (:mod:`.chain_kernels`: unary scores, Viterbi, corner, direction norm, move) into the contract: every
plan (plain, refined, multi-plane) runs on the chain.

The marginal state ``mu_i, T_i`` equals ``sum_y alpha_i(y) (onehot(y), counts(y))`` for the weights in the
working set (up to round-off), because every move of the marginals is the same combination of corners as
the move of ``alpha``.  Box constraints are not handled here (the state falls back to the generic loop).

All scores are kept shifted by the block constant ``-<w, phi(x_i, y_i)>/n``: ``h(y) = L_i(y)/n +
score(y)/n`` and ``h_i = l_i + score(mu_i)/n``, so ``h(y) - h_i`` is a block gap.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np
from numba import njit
from numba.extending import overload

from . import block_ops as ops
from . import chain_minibatch_kernels as mk
from .chain_kernels import (_add_direction, _direction_sqnorm, _transition_stats, add_corner, corner_base, fw_move,
                            loss_augmented_decode, prefetch_block, step_scratch)
from .stepsize import PAIRWISE_RULE, average_weight, clipped_step, lazy_weight, move_bound
from .working_set import ALPHA, LOSS, SCORE, ws_away_update, ws_pairwise_update

__all__ = ["ChainFeatures"]


class ChainFeatures(NamedTuple):
    """The chain's ``feats`` group (:mod:`.chain_kernels`), the data group of its kernel bundle: CSR token features,
    labels, sequence offsets and the per-sequence Gram matrices (:meth:`~.chain.ChainDualState._prepare_kernel`)."""

    indptr: np.ndarray
    indices: np.ndarray
    values: np.ndarray
    y: np.ndarray
    offsets: np.ndarray
    gram: np.ndarray
    gram_off: np.ndarray


@njit(cache=True, fastmath=True, _nrt=False)
def _plane_score(U, trans, lab, base, L):
    sc = 0.0
    for t in range(L):
        sc += U[t, lab[base + t]]
    for t in range(1, L):
        sc += trans[lab[base + t - 1], lab[base + t]]
    return sc


@njit(cache=True, fastmath=True, _nrt=False)
def _labels_score(U, trans, ys, L):
    sc = 0.0
    for t in range(L):
        sc += U[t, ys[t]]
    for t in range(1, L):
        sc += trans[ys[t - 1], ys[t]]
    return sc


@njit(cache=True, fastmath=True, _nrt=False)
def _general_direction(s, L, p, ys, q, ya, r, mu, Ti, D, dT):
    """``D = r mu_i + p onehot(ys) + q onehot(ya)``, ``dT = r T_i + p counts(ys) + q counts(ya)``; returns ``||dT||^2``."""
    K = D.shape[1]
    for t in range(L):
        for c in range(K):
            D[t, c] = r * mu[s + t, c]
        D[t, ys[t]] += p
        D[t, ya[t]] += q
    for a in range(K):
        for b in range(K):
            dT[a, b] = r * Ti[a, b]
    for t in range(1, L):
        dT[ys[t - 1], ys[t]] += p
        dT[ya[t - 1], ya[t]] += q
    sq = 0.0
    for a in range(K):
        for b in range(K):
            sq += dT[a, b] * dT[a, b]
    return sq


@njit(cache=True, fastmath=True, _nrt=False)
def _general_move(gamma, lam_n, s, L, indptr, indices, values, D, dT, We, bias, start, end, trans, mu, Ti):
    """``mu_i += gamma D``, ``T_i += gamma dT`` and the matching ``w -= gamma phi(D, dT) / (lam n)``."""
    a = -gamma / lam_n
    _add_direction(a, s, L, indptr, indices, values, D, We, bias, start, end)
    K = trans.shape[0]
    for p in range(K):
        for c in range(K):
            v = dT[p, c]
            if v != 0.0:
                trans[p, c] += a * v
                Ti[p, c] += gamma * v
    for t in range(L):
        for c in range(K):
            mu[s + t, c] += gamma * D[t, c]


@njit(cache=True, fastmath=True, _nrt=False)
def _avg_accumulate(i, s, L, clock, last, mu, T, mu_acc, T_acc):
    S = lazy_weight(clock, last[i])
    last[i] = clock
    if S != 0.0:
        K = mu.shape[1]
        for t in range(L):
            for c in range(K):
                mu_acc[s + t, c] += S * mu[s + t, c]
        for p in range(K):
            for c in range(K):
                T_acc[p, c] += S * T[i, p, c]


@njit(cache=True, _nrt=False)
def _active_set_step(kind, i, s, L, j_s, j_a, values, clock, step, planes, feats, wts, state, avg, scratch):
    """A pairwise (``mu_i += gamma (e_s - e_a)``) or away (``mu_i += gamma (mu_i - e_a)``) step of block ``i`` against
    its plane ``j_a`` with the clipped exact line search (a drop step at the bound), the working set's ``alpha``
    following.  ``values = (h_i, h_s, l_i, l_s)``, ``step = (averaging, lam)``, ``planes = (start, size, lab_start,
    fl, lab)`` of the working set, ``scratch = (ystar, D, dT, ya)`` (``ystar``: the FW corner ``s``)."""
    h_i, h_s, ell_i, ell_s = values
    averaging, lam = step
    ws_start, ws_size, ws_labstart, ws_fl, ws_lab = planes
    ystar, D, dT, ya = scratch
    indptr, indices, xvals, y, offsets, gram, gram_off = feats
    We, bias, start, end, trans = wts
    mu, T, block_ell, ells = state
    mu_acc, T_acc, last = avg
    n = offsets.shape[0] - 1
    lam_n = lam * n
    Ti = T[i]
    sa = ws_start[i] + j_a
    base = ws_labstart[i] + j_a * L
    for t in range(L):
        ya[t] = ws_lab[base + t]
    alpha_a = ws_fl[sa, ALPHA]
    ell_a = ws_fl[sa, LOSS]
    h_a = ws_fl[sa, SCORE]
    if kind == PAIRWISE_RULE:
        num = h_s - h_a
        sqT = _general_direction(s, L, 1.0, ystar, -1.0, ya, 0.0, mu, Ti, D, dT)
        dl = ell_s - ell_a
    else:
        num = h_i - h_a
        sqT = _general_direction(s, L, 0.0, ystar, -1.0, ya, 1.0, mu, Ti, D, dT)
        dl = ell_i - ell_a
    den = (_direction_sqnorm(i, L, D, gram, gram_off) + sqT) / (lam_n * n)
    gamma, drop = clipped_step(num, den, move_bound(kind, alpha_a))
    if gamma != 0.0:
        if averaging:
            _avg_accumulate(i, s, L, clock, last, mu, T, mu_acc, T_acc)
        new_ell_i = ell_i + gamma * dl
        ells[1] += average_weight(clock) * (new_ell_i - ell_i)
        _general_move(gamma, lam_n, s, L, indptr, indices, xvals, D, dT, We, bias, start, end, trans, mu, Ti)
        ells[0] += new_ell_i - ell_i
        block_ell[i] = new_ell_i
        if kind == PAIRWISE_RULE:
            ws_pairwise_update(i, j_s, j_a, gamma, drop, ws_start, ws_fl)
        else:
            ws_away_update(i, j_a, gamma, drop, ws_start, ws_size, ws_fl)


@njit(cache=True, _nrt=False)
def _transition_score(Ti, trans):
    """``<T_i, trans>``, the transition part of ``mu_i``'s score."""
    K = trans.shape[0]
    score = 0.0
    for p in range(K):
        for c in range(K):
            score += Ti[p, c] * trans[p, c]
    return score




# Each operation below is one call of one of these helpers (inlined), which takes just the arrays it uses.
@njit(cache=True, inline="always")
def _span(offsets, i):
    s = offsets[i]
    return s, offsets[i + 1] - s


@njit(cache=True, inline="always")
def _begin(i, s, L, measure, feats, wts, mu, T, U, D):
    """:func:`~.chain_kernels.corner_base` (``U``, ``D = -mu_i``), plus the transition score when ``measure``."""
    score_mu = corner_base(s, L, feats, wts, mu, U, D)
    if measure:
        score_mu += _transition_score(T[i], wts[4])
    return score_mu


@njit(cache=True, inline="always")
def _stored_corner(L, lab, base, trans, U, D, ystar):
    """The stored labeling ``lab[base : base + L]`` as the corner ``ystar``: its score, ``D += onehot``."""
    for t in range(L):
        ystar[t] = lab[base + t]
    score_star = _labels_score(U, trans, ystar, L)
    for t in range(L):
        D[t, ystar[t]] += 1.0
    return score_star


@njit(cache=True, inline="always")
def _decoded_corner(s, L, ylab, y, n, trans, U, Ua, D, ystar, delta):
    """Viterbi on the loss-augmented scores (or the given ``ylab``) as the corner: ``(score, l_s, True)``."""
    if ylab.shape[0] > 0:
        for t in range(L):
            ystar[t] = ylab[t]
    else:
        loss_augmented_decode(U, Ua, L, s, y, 1.0 / L, trans, ystar, delta)
    score_star, mistakes = add_corner(s, L, y, trans, U, ystar, D)
    return score_star, mistakes * (1.0 / L) / n, True


@njit(cache=True, inline="always")
def _as_int32(L, ystar, yh):
    for t in range(L):
        yh[t] = ystar[t]
    return yh[:L]


@njit(cache=True, inline="always")
def _fw(i, s, L, step, clock, corner, D, ystar, feats, wts, state, avg):
    """:func:`~.chain_kernels.fw_move` with the transition statistics of the corner."""
    score_star, score_mu, measure, ell_i, ell_s = corner
    score_T, sq_T = _transition_stats(state[1][i], wts[4], ystar[:L])
    full = (score_star, score_mu if measure else score_mu + score_T, ell_i, ell_s, sq_T)
    return fw_move(i, s, L, step, clock, full, ystar, D, feats, wts, state, avg)


# ---------------------------------------------------------------- the contract (:mod:`.block_ops`) for the chain
_chain = ops.bundle_of(ChainFeatures)


@overload(ops.n_blocks, jit_options={"cache": True}, inline="always")
def _n_blocks(data, wts, state, avg):
    if _chain(data):
        return lambda data, wts, state, avg: data[4].shape[0] - 1


@overload(ops.block_span, jit_options={"cache": True}, inline="always")
def _block_span(data, wts, state, avg, i):
    if _chain(data):
        return lambda data, wts, state, avg, i: _span(data[4], i)


@overload(ops.block_loss, jit_options={"cache": True}, inline="always")
def _block_loss(data, wts, state, avg, i):
    if _chain(data):
        return lambda data, wts, state, avg, i: state[2][i]


@overload(ops.dual_loss, jit_options={"cache": True}, inline="always")
def _dual_loss(data, wts, state, avg):
    if _chain(data):
        return lambda data, wts, state, avg: state[3][0]


@overload(ops.prefetch, jit_options={"cache": True}, inline="always")
def _prefetch(data, wts, state, avg, i, averaging):
    if _chain(data):
        def impl(data, wts, state, avg, i, averaging):
            prefetch_block(i, data[4], data[0], data[1], data[2], data[5], data[6], state[0], state[1], avg[0],
                           averaging)
        return impl


@overload(ops.block_scratch, jit_options={"cache": True}, inline="always")
def _block_scratch(data, wts, state, avg):
    """``(U, Ua, D, ystar, delta)`` of :func:`~.chain_kernels.step_scratch`, the transition direction ``dT``
    (``[K, K]``), an active-set corner ``ya`` (int64) and the corner as stored in the working set ``yh`` (int32)."""
    if _chain(data):
        def impl(data, wts, state, avg):
            nl = wts[0].shape[1]
            U, Ua, D, ystar, delta = step_scratch(data[4], nl)
            return (U, Ua, D, ystar, delta, np.empty((nl, nl)), np.empty(ystar.shape[0], dtype=np.int64),
                    np.empty(ystar.shape[0], dtype=np.int32))
        return impl


@overload(ops.begin_block, jit_options={"cache": True}, inline="always")
def _begin_block(data, wts, state, avg, scr, i, s, L, measure):
    """Unary scores ``U`` and ``D = -mu_i``; the unary score of ``mu_i``, plus its transition score when ``measure``
    (:func:`_fw_step` adds it otherwise, from the sweep it makes anyway)."""
    if _chain(data):
        def impl(data, wts, state, avg, scr, i, s, L, measure):
            return _begin(i, s, L, measure, data, wts, state[0], state[1], scr[0], scr[2])
        return impl


@overload(ops.plane_score, jit_options={"cache": True}, inline="always")
def _plane_score_op(data, wts, state, avg, scr, s, L, lab, base):
    if _chain(data):
        return lambda data, wts, state, avg, scr, s, L, lab, base: _plane_score(scr[0], wts[4], lab, base, L)


@overload(ops.plane_corner, jit_options={"cache": True}, inline="always")
def _plane_corner(data, wts, state, avg, scr, s, L, lab, base):
    if _chain(data):
        def impl(data, wts, state, avg, scr, s, L, lab, base):
            return _stored_corner(L, lab, base, wts[4], scr[0], scr[2], scr[3])
        return impl


@overload(ops.oracle_corner, jit_options={"cache": True}, inline="always")
def _oracle_corner(data, wts, state, avg, scr, i, s, L, ylab):
    """Viterbi on the loss-augmented scores (or the given ``ylab``); ``D = e_{y*} - mu_i``."""
    if _chain(data):
        def impl(data, wts, state, avg, scr, i, s, L, ylab):
            return _decoded_corner(s, L, ylab, data[3], data[4].shape[0] - 1, wts[4], scr[0], scr[1], scr[2], scr[3],
                                   scr[4])
        return impl


@overload(ops.corner_labels, jit_options={"cache": True}, inline="always")
def _corner_labels(data, wts, state, avg, scr, L):
    if _chain(data):
        return lambda data, wts, state, avg, scr, L: _as_int32(L, scr[3], scr[7])


@overload(ops.fw_step, jit_options={"cache": True}, inline="always")
def _fw_step(data, wts, state, avg, scr, i, s, L, step, clock, corner):
    """:func:`~.chain_kernels.fw_move` with the transition statistics of the corner."""
    if _chain(data):
        def impl(data, wts, state, avg, scr, i, s, L, step, clock, corner):
            return _fw(i, s, L, step, clock, corner, scr[2], scr[3], data, wts, state, avg)
        return impl


@overload(ops.active_set_step, jit_options={"cache": True}, inline="always")
def _active_set_step_op(data, wts, state, avg, scr, kind, i, s, L, j_s, j_a, values, clock, step, planes):
    if _chain(data):
        def impl(data, wts, state, avg, scr, kind, i, s, L, j_s, j_a, values, clock, step, planes):
            _active_set_step(kind, i, s, L, j_s, j_a, values, clock, step, planes, data, wts, state, avg,
                             (scr[3], scr[2], scr[5], scr[6]))
        return impl


# ---------------------------------------------------------------- round operations: R = (acc, marks) of
# :mod:`.chain_minibatch_kernels` (views of the summed direction P, its touched emission entries); the round scratch
# rscr = (blk_scr, D, Y, tok, spare)
@overload(ops.round_scratch, jit_options={"cache": True}, inline="always")
def _round_scratch(data, wts, state, avg, R, order, roffsets, by_gap):
    if _chain(data):
        def impl(data, wts, state, avg, R, order, roffsets, by_gap):
            nl = wts[0].shape[1]
            blk, (D, Y) = mk.round_scratch(data[4], nl, mk._max_round_tokens(order, roffsets, data[4], by_gap))
            return blk, D, Y, np.empty(order.shape[0] + 1, dtype=np.int64), np.zeros((nl, nl))
        return impl


@overload(ops.round_directions, jit_options={"cache": True}, inline="always")
def _round_directions(data, wts, state, avg, R, rscr, blocks, n_total, bgaps):
    if _chain(data):
        def impl(data, wts, state, avg, R, rscr, blocks, n_total, bgaps):
            return mk.round_directions(blocks, n_total, data, wts, state, R[0], R[1], rscr[0], rscr[1], rscr[2],
                                       rscr[3], bgaps)
        return impl


@overload(ops.round_sqnorm, jit_options={"cache": True}, inline="always")
def _round_sqnorm(data, wts, state, avg, R):
    if _chain(data):
        return lambda data, wts, state, avg, R: mk.touched_sqnorm(R[0], R[1])


@overload(ops.round_apply, jit_options={"cache": True}, inline="always")
def _round_apply(data, wts, state, avg, R, a):
    if _chain(data):
        return lambda data, wts, state, avg, R, a: mk.apply_acc(a, R[0], R[1], wts)


@overload(ops.round_clear, jit_options={"cache": True}, inline="always")
def _round_clear(data, wts, state, avg, R):
    if _chain(data):
        return lambda data, wts, state, avg, R: mk.clear_acc(R[0], R[1])


@overload(ops.round_move, jit_options={"cache": True}, inline="always")
def _round_move(data, wts, state, avg, R, rscr, blocks, gamma, n_total, clock, averaging):
    if _chain(data):
        def impl(data, wts, state, avg, R, rscr, blocks, gamma, n_total, clock, averaging):
            mk.round_move(blocks, gamma, n_total, clock, averaging, data, wts, state, avg, rscr[1], rscr[2], rscr[3],
                          rscr[4])
        return impl
