"""Compiled parts of a mini-batch round (Wang et al. 2016) for the chain's marginal dual state.

A round of blocks ``B`` is three parts, so that a round split over processes can all-reduce between them (the loop
is :func:`~torch_bcfw.duals.plan.run_rounds`, the joint step :meth:`~torch_bcfw.duals.chain.ChainDualState.round_step`):

1. :func:`round_directions` -- per block at the same ``w``: the corner, the direction ``delta_i = e_{y*} - mu_i``
   (kept in the :class:`RoundScratch`) and ``P = sum_i phi_i(delta_i)`` in the layout of ``w`` (the emission entries
   touched listed in :class:`Touched`);
2. the step: ``V = P / (lam n)``, ``num`` the sum of the block gaps, ``den = ||P||^2 / (lam n^2)``
   (:func:`touched_sqnorm`);
3. :func:`round_move` -- ``mu_i``, ``T_i``, ``l_i`` and the lazy average of every block; ``w`` moves by ``-gamma V``
   (:func:`apply_touched`, or the caller with the reduced ``V``) and ``P`` is cleared (:func:`clear_touched`).
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np
from numba import njit

from .chain_kernels import block_corner, move_block, step_scratch, transition_stats
from .stepsize import commit_fw_move, minibatch_step_size

__all__ = ["Touched", "RoundScratch", "round_scratch", "round_directions", "touched_sqnorm", "apply_touched",
           "clear_touched", "round_move", "local_round"]


class Touched(NamedTuple):
    """The emission entries ``f K + c`` of ``P`` touched in a round: ``flag`` (uint8 per entry), the list ``entries``
    and its length ``count`` (``int64[1]``)."""

    flag: np.ndarray
    entries: np.ndarray
    count: np.ndarray


class RoundScratch(NamedTuple):
    """The scratch of a round: a :class:`~.chain_kernels.StepScratch` ``block``, the directions ``D [N, K]`` and
    corners ``Y int64[N]`` of the round's tokens, each block's first token ``tok``, and ``spare`` (``[K, K]``, the
    transition weights of a move that leaves ``w`` alone)."""

    block: tuple
    D: np.ndarray
    Y: np.ndarray
    tok: np.ndarray
    spare: np.ndarray


@njit(cache=True)
def round_scratch(offsets, K, max_tokens, max_blocks):
    """The :class:`RoundScratch` for rounds of at most ``max_blocks`` blocks and ``max_tokens`` tokens."""
    return RoundScratch(step_scratch(offsets, K), np.empty((max_tokens, K)), np.empty(max_tokens, dtype=np.int64),
                        np.empty(max_blocks + 1, dtype=np.int64), np.zeros((K, K)))


@njit(cache=True, _nrt=False)
def _accumulate_direction(s, L, feats, D, acc, touched):
    """``P += phi(delta)`` for the unary part ``D[L, K]`` of a block's direction: the emission entries ``(f, c)`` of
    the non-zeros of ``D`` (listed the first time they are touched) and the biases."""
    indptr, indices, values = feats.indptr, feats.indices, feats.values
    PWe, flag, entries = acc.We, touched.flag, touched.entries
    K = PWe.shape[1]
    for t in range(L):
        lo = indptr[s + t]
        hi = indptr[s + t + 1]
        for c in range(K):
            d = D[t, c]
            if d != 0.0:
                for p in range(lo, hi):
                    f = indices[p]
                    e = f * K + c
                    if flag[e] == 0:
                        flag[e] = 1
                        entries[touched.count[0]] = e
                        touched.count[0] += 1
                    PWe[f, c] += values[p] * d
                acc.bias[c] += d
    for c in range(K):
        acc.start[c] += D[0, c]
        acc.end[c] += D[L - 1, c]


@njit(cache=True)
def round_directions(blocks, n_total, feats, w, marg, acc, touched, scr, bgaps):
    """Part 1 for the blocks ``blocks`` (distinct); ``bgaps[j]`` gets block ``blocks[j]``'s gap.  Returns ``(sum of
    block gaps, sum l_i, sum l_s)``."""
    offsets, T, block_ell, Ptrans = feats.offsets, marg.T, marg.block_ell, acc.trans
    blk = scr.block
    U, ystar = blk.U, blk.ystar
    K = w.We.shape[1]
    num = 0.0
    sum_ell_i = 0.0
    sum_ell_s = 0.0
    pos = 0
    scr.tok[0] = 0
    for j in range(blocks.shape[0]):
        i = blocks[j]
        s = offsets[i]
        L = offsets[i + 1] - s
        D = scr.D[pos:pos + L]
        score_star, score_mu, mistakes = block_corner(s, L, feats, w, marg.mu, U, blk.Ua, ystar, blk.delta, D)
        scr.Y[pos:pos + L] = ystar[:L]
        score_T, _ = transition_stats(T[i], w.trans, ystar[:L])
        ell_s = mistakes * (1.0 / L) / n_total
        ell_i = block_ell[i]
        g = (score_star - score_mu - score_T) / n_total - ell_i + ell_s
        bgaps[j] = g
        num += g
        sum_ell_i += ell_i
        sum_ell_s += ell_s
        # P += phi_i(delta_i): emission entries (listed once), biases, transitions
        _accumulate_direction(s, L, feats, D, acc, touched)
        Ti = T[i]
        for a in range(K):
            for b in range(K):
                Ptrans[a, b] -= Ti[a, b]
        for t in range(1, L):
            Ptrans[ystar[t - 1], ystar[t]] += 1.0
        pos += L
        scr.tok[j + 1] = pos
    return num, sum_ell_i, sum_ell_s


@njit(cache=True, _nrt=False)
def touched_sqnorm(acc, touched):
    """``||P||^2`` over the listed emission entries and the dense bias and transition parts."""
    K = acc.We.shape[1]
    Pf = acc.We.reshape(acc.We.size)
    sq = 0.0
    for q in range(touched.count[0]):
        v = Pf[touched.entries[q]]
        sq += v * v
    for c in range(K):
        sq += acc.bias[c] * acc.bias[c] + acc.start[c] * acc.start[c] + acc.end[c] * acc.end[c]
        for b in range(K):
            sq += acc.trans[c, b] * acc.trans[c, b]
    return sq


@njit(cache=True, _nrt=False)
def apply_touched(a, acc, touched, w):
    """``w += a P`` over the listed emission entries and the dense bias and transition parts."""
    K = acc.We.shape[1]
    Pf = acc.We.reshape(acc.We.size)
    Wf = w.We.reshape(w.We.size)
    for q in range(touched.count[0]):
        e = touched.entries[q]
        Wf[e] += a * Pf[e]
    for c in range(K):
        w.bias[c] += a * acc.bias[c]
        w.start[c] += a * acc.start[c]
        w.end[c] += a * acc.end[c]
        for b in range(K):
            w.trans[c, b] += a * acc.trans[c, b]


@njit(cache=True, _nrt=False)
def clear_touched(acc, touched):
    """``P <- 0`` on the listed entries and the dense parts; the list empties."""
    K = acc.We.shape[1]
    Pf = acc.We.reshape(acc.We.size)
    for q in range(touched.count[0]):
        e = touched.entries[q]
        touched.flag[e] = 0
        Pf[e] = 0.0
    touched.count[0] = 0
    for c in range(K):
        acc.bias[c] = 0.0
        acc.start[c] = 0.0
        acc.end[c] = 0.0
        for b in range(K):
            acc.trans[c, b] = 0.0


@njit(cache=True, _nrt=False)
def round_move(blocks, gamma, n_total, clock, averaging, feats, w, marg, avg, scr):
    """Part 3: move the blocks ``blocks`` with step ``gamma`` (their directions in ``scr`` from part 1): ``mu_i``,
    ``T_i``, ``l_i`` and the lazy average; ``w`` is left to the caller (:func:`apply_touched`, or the reduced ``V``)."""
    y, offsets, tok = feats.y, feats.offsets, scr.tok
    for j in range(blocks.shape[0]):
        i = blocks[j]
        s = offsets[i]
        L = offsets[i + 1] - s
        p0 = tok[j]
        mistakes = 0
        for t in range(L):
            if scr.Y[p0 + t] != y[s + t]:
                mistakes += 1
        S = commit_fw_move(gamma, mistakes * (1.0 / L) / n_total, averaging, clock, avg.last, marg.block_ell, i,
                           marg.totals)
        move_block(i, s, L, gamma, 0.0, S, scr.D[p0:p0 + L], scr.Y[p0:p0 + L], feats, w, marg, avg, scr.spare)


@njit(cache=True)
def local_round(blocks, step_code, lam, k, clock, averaging, n_total, feats, w, marg, avg, acc, touched, scr, bgaps):
    """A whole round of this process' own blocks (nothing to reduce): parts 1-3.  Returns ``(num, gamma)``."""
    num, _, _ = round_directions(blocks, n_total, feats, w, marg, acc, touched, scr, bgaps)
    den = touched_sqnorm(acc, touched) / (lam * n_total * n_total)
    gamma = minibatch_step_size(step_code, num, den, k, n_total, blocks.shape[0])
    if gamma != 0.0:
        round_move(blocks, gamma, n_total, clock, averaging, feats, w, marg, avg, scr)
        apply_touched(-gamma / (lam * n_total), acc, touched, w)
    clear_touched(acc, touched)
    return num, gamma


@njit(cache=True)
def max_round_tokens(order, roffsets, offsets, by_gap):
    """Tokens of the largest round: of its blocks, or with gap sampling (blocks drawn inside the loop) of the longest
    sequences that fit in its slots."""
    max_tok = 0
    if by_gap:
        lens = np.sort(offsets[1:] - offsets[:-1])[::-1]
        for j in range(roffsets.shape[0] - 1):
            m = 0
            for q in range(min(roffsets[j + 1] - roffsets[j], lens.shape[0])):
                m += lens[q]
            max_tok = max(max_tok, m)
        return max_tok
    for j in range(roffsets.shape[0] - 1):
        m = 0
        for q in range(roffsets[j], roffsets[j + 1]):
            i = order[q]
            m += offsets[i + 1] - offsets[i]
        max_tok = max(max_tok, m)
    return max_tok
