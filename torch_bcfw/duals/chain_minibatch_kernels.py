"""Compiled mini-batch rounds (Wang et al. 2016) for the chain's marginal dual state.

A round of blocks ``B`` is three compiled parts, so that a round split over processes can all-reduce between them:

1. :func:`round_directions` -- for every block of ``B`` at the same ``w``: unary scores, loss-augmented Viterbi,
   the scores of the corner and of ``mu_i``, the direction ``delta_i = e_{y*} - mu_i`` (kept in the round's
   scratch), and the sum ``P = sum_i phi_i(delta_i)`` accumulated in the feature space (``P`` has the layout of
   ``w``; the emission entries touched are listed so only they are read, applied and cleared).  Returns the sum of the block
   gaps and of ``l_i`` and ``l_s``.
2. the step: ``V = P / (lam n)`` is the joint direction ``sum_i (w_i - w_s,i)``, ``num`` the sum of the block gaps,
   ``den = lam ||V||^2 = ||P||^2 / (lam n^2)`` from the summed direction (:func:`touched_sqnorm` when ``P`` is
   this process' own), ``gamma`` the clipped line search or the fixed step.
3. :func:`round_move` -- every block of ``B`` moves with ``gamma``: ``mu_i``, ``T_i``, ``l_i`` and the lazy
   average; ``w`` moves by ``-gamma V`` in one sweep over the touched entries of ``P`` (:func:`apply_acc`), or by the
   caller with the reduced ``V``; ``P`` is cleared.

:func:`~torch_bcfw.duals.driver.round_steps` runs whole chunks of rounds of one process in one call with these
parts (given to it by :mod:`.chain_ops`).  The per-block parts are those of the BCFW kernel (:mod:`.chain_kernels`): unary scores, decoding, direction, transition statistics.
Argument groups as there: ``feats``, ``wts`` (views of ``w``), ``state = (mu, T, block_ell, ells)``, ``avg =
(mu_acc, T_acc, last)``; here also ``acc = (PWe, Pbias, Pstart, Pend, Ptrans)`` (views of ``P``), ``marks =
(flag uint8[F K], entries int64[F K], count int64[1])`` and the round scratch ``scr = (D [N, K], Y int64[N], tok
int64[r + 1])`` with ``N`` at least the tokens of the round.
"""
from __future__ import annotations

import numpy as np
from numba import njit

from .chain_kernels import _transition_stats, block_corner, move_block, step_scratch

__all__ = ["round_directions", "touched_sqnorm", "round_move", "apply_acc", "clear_acc", "round_scratch"]


@njit(cache=True)
def round_scratch(offsets, K, max_tokens):
    """The per-block scratch of :func:`~.chain_kernels.step_scratch` and the round scratch for ``max_tokens``."""
    return step_scratch(offsets, K), (np.empty((max_tokens, K)), np.empty(max_tokens, dtype=np.int64))


@njit(cache=True, _nrt=False)
def _accumulate_direction(s, L, indptr, indices, values, D, acc, marks):
    """``P += phi(delta)`` for the unary part ``D[L, K]`` of a block's direction: the emission entries ``(f, c)`` of
    the non-zeros of ``D`` (listed in ``marks`` the first time they are touched, as ``f K + c``) and the biases."""
    PWe, Pbias, Pstart, Pend, _ = acc
    flag, entries, count = marks
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
                        entries[count[0]] = e
                        count[0] += 1
                    PWe[f, c] += values[p] * d
                Pbias[c] += d
    for c in range(K):
        Pstart[c] += D[0, c]
        Pend[c] += D[L - 1, c]


@njit(cache=True)
def round_directions(blocks, n_total, feats, wts, state, acc, marks, blk_scr, D, Y, tok, bgaps):
    """Part 1 for the blocks ``blocks`` (distinct); ``bgaps[j]`` gets block ``blocks[j]``'s gap.  Returns ``(sum of
    block gaps, sum l_i, sum l_s)``."""
    indptr, indices, values, y, offsets, gram, gram_off = feats
    We, bias, start, end, trans = wts
    mu, T, block_ell, ells = state
    PWe, Pbias, Pstart, Pend, Ptrans = acc
    U, Ua, _, ystar, delta = blk_scr
    K = We.shape[1]
    num = 0.0
    sum_ell_i = 0.0
    sum_ell_s = 0.0
    pos = 0
    tok[0] = 0
    for j in range(blocks.shape[0]):
        i = blocks[j]
        s = offsets[i]
        L = offsets[i + 1] - s
        score_star, score_mu, mistakes = block_corner(s, L, feats, wts, mu, U, Ua, ystar, delta, D[pos:pos + L])
        Y[pos:pos + L] = ystar[:L]
        score_T, _ = _transition_stats(T[i], trans, ystar[:L])
        ell_s = mistakes * (1.0 / L) / n_total
        ell_i = block_ell[i]
        g = (score_star - score_mu - score_T) / n_total - ell_i + ell_s
        bgaps[j] = g
        num += g
        sum_ell_i += ell_i
        sum_ell_s += ell_s
        # P += phi_i(delta_i): emission entries (listed once), biases, transitions
        _accumulate_direction(s, L, indptr, indices, values, D[pos:pos + L], acc, marks)
        Ti = T[i]
        for a in range(K):
            for b in range(K):
                Ptrans[a, b] -= Ti[a, b]
        for t in range(1, L):
            Ptrans[ystar[t - 1], ystar[t]] += 1.0
        pos += L
        tok[j + 1] = pos
    return num, sum_ell_i, sum_ell_s


@njit(cache=True, _nrt=False)
def touched_sqnorm(acc, marks):
    """``||P||^2`` over the emission entries listed in ``marks`` and the dense bias and transition parts."""
    PWe, Pbias, Pstart, Pend, Ptrans = acc
    flag, entries, count = marks
    K = PWe.shape[1]
    Pf = PWe.reshape(PWe.size)
    sq = 0.0
    for q in range(count[0]):
        v = Pf[entries[q]]
        sq += v * v
    for c in range(K):
        sq += Pbias[c] * Pbias[c] + Pstart[c] * Pstart[c] + Pend[c] * Pend[c]
        for b in range(K):
            sq += Ptrans[c, b] * Ptrans[c, b]
    return sq


@njit(cache=True, _nrt=False)
def apply_acc(a, acc, marks, wts):
    """``w += a P`` over the listed emission entries and the dense bias and transition parts: the move of ``w`` by
    the round's summed direction, one sweep instead of one sparse update per block."""
    PWe, Pbias, Pstart, Pend, Ptrans = acc
    We, bias, start, end, trans = wts
    flag, entries, count = marks
    K = PWe.shape[1]
    Pf = PWe.reshape(PWe.size)
    Wf = We.reshape(We.size)
    for q in range(count[0]):
        e = entries[q]
        Wf[e] += a * Pf[e]
    for c in range(K):
        bias[c] += a * Pbias[c]
        start[c] += a * Pstart[c]
        end[c] += a * Pend[c]
        for b in range(K):
            trans[c, b] += a * Ptrans[c, b]


@njit(cache=True, _nrt=False)
def clear_acc(acc, marks):
    """``P <- 0`` on the listed entries and the dense parts; the list empties."""
    PWe, Pbias, Pstart, Pend, Ptrans = acc
    flag, entries, count = marks
    K = PWe.shape[1]
    Pf = PWe.reshape(PWe.size)
    for q in range(count[0]):
        e = entries[q]
        flag[e] = 0
        Pf[e] = 0.0
    count[0] = 0
    for c in range(K):
        Pbias[c] = 0.0
        Pstart[c] = 0.0
        Pend[c] = 0.0
        for b in range(K):
            Ptrans[c, b] = 0.0


@njit(cache=True, _nrt=False)
def round_move(blocks, gamma, n_total, clock, averaging, feats, wts, state, avg, D, Y, tok, spare):
    """Part 3: move the blocks ``blocks`` with step ``gamma`` (their directions in ``D, Y, tok`` from part 1): ``mu_i``,
    ``T_i``, ``l_i`` and the lazy average.  ``w`` is left to the caller (:func:`apply_acc`, or the reduced ``V``);
    ``spare``: a ``K x K`` scratch standing in for the transition weights."""
    y, offsets = feats[3], feats[4]
    for j in range(blocks.shape[0]):
        i = blocks[j]
        s = offsets[i]
        L = offsets[i + 1] - s
        p0 = tok[j]
        mistakes = 0
        for t in range(L):
            if Y[p0 + t] != y[s + t]:
                mistakes += 1
        ell_s = mistakes * (1.0 / L) / n_total
        move_block(i, s, L, gamma, 0.0, ell_s, clock, averaging, D[p0:p0 + L], Y[p0:p0 + L], feats, wts, state, avg,
                   spare)


@njit(cache=True)
def _max_round_tokens(order, roffsets, offsets, by_gap):
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
