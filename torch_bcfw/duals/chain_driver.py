"""The compiled step driver of the chain: BCFW and its refinements (gap sampling, pairwise / away steps, caching).

:func:`chain_plan_steps` runs a whole chunk of block iterations of a :class:`~torch_bcfw.duals.plan.StepPlan`
without returning to Python, composed from the chain's compiled block operations (:mod:`.chain_kernels`: unary
scores, decoding, corner, direction norm, move, average accumulation) and the same small parts as the generic step
loop :func:`~torch_bcfw.duals.plan.generic_plan_steps` (which it must reproduce; tests compare them):

* **sampling** (:mod:`torch_bcfw.duals.sumtree`): a pre-drawn order (uniform / permutation; the next block's state
  is prefetched), or gap sampling from a sum tree over the block-gap estimates, updated right after every oracle
  call, with the never-visited blocks served first from a random permutation;
* **oracle with a working set** (:mod:`.working_set`): all planes of the block are scored from the unary
  scores the oracle needs anyway (``O(L)`` per plane); with a cache, the best plane is taken instead of
  calling the oracle when ``g_hat_i >= max(F g_i, (nu/n) g_global)`` (Alg. 5); otherwise Viterbi, and the
  answer joins the working set;
* **step rule** (:mod:`torch_bcfw.duals.stepsize`): FW (:func:`.chain_kernels.fw_move`), pairwise
  (``mu_i += gamma (e_s - e_a)``) or away (``mu_i += gamma (mu_i - e_a)``) with the clipped exact line search
  and drop steps.

Plain BCFW is the plan with none of the refinements: each iteration is then the oracle and the FW step, nothing
measured or kept.  MP-BCFW's exact and approximate passes are plans too (the working set as the planes, with their
stamps, eviction and staleness, and the running average; ``mp`` below).  The mini-batch rounds
(:mod:`.chain_minibatch_kernels`) are built from the same block operations.

The marginal state ``mu_i, T_i`` equals ``sum_y alpha_i(y) (onehot(y), counts(y))`` for the weights in the
working set (up to round-off), because every move of the marginals is the same combination of corners as
the move of ``alpha``.  Box constraints are not handled here (the state falls back to the generic loop).

All scores are kept shifted by the block constant ``-<w, phi(x_i, y_i)>/n``: ``h(y) = L_i(y)/n +
score(y)/n`` and ``h_i = l_i + score(mu_i)/n``, so ``h(y) - h_i`` is a block gap.
"""
from __future__ import annotations

import numpy as np
from numba import njit

from .chain_kernels import (_add_direction, _direction_sqnorm, _transition_stats, add_corner, corner_base, fw_move,
                            loss_augmented_decode, prefetch_block, step_scratch)
from .plan import MP_APPROX, MP_EXACT
from .stepsize import (AWAY_RULE, FW_RULE, PAIRWISE_RULE, average_weight, away_choice, cache_hit, clipped_step,
                       lazy_weight, move_bound)
from .sumtree import est_set, gap_draw
from .working_set import (ALPHA, LAST, LOSS, SCORE, label_hash, ws_away_update, ws_corners, ws_drop_inactive,
                          ws_drop_stale, ws_evict_lru, ws_find, ws_fw_update, ws_insert, ws_pairwise_update)

__all__ = ["chain_plan_steps", "DONE", "NEED_GAP_PASS"]

#: status codes returned in ``counters[3]``
DONE, NEED_GAP_PASS = 0, 1



@njit(cache=True, fastmath=True)
def _plane_score(U, trans, lab, base, L):
    sc = 0.0
    for t in range(L):
        sc += U[t, lab[base + t]]
    for t in range(1, L):
        sc += trans[lab[base + t - 1], lab[base + t]]
    return sc


@njit(cache=True, fastmath=True)
def _labels_score(U, trans, ys, L):
    sc = 0.0
    for t in range(L):
        sc += U[t, ys[t]]
    for t in range(1, L):
        sc += trans[ys[t - 1], ys[t]]
    return sc


@njit(cache=True, fastmath=True)
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


@njit(cache=True, fastmath=True)
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


@njit(cache=True, fastmath=True)
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


@njit(cache=True)
def _store_answer(i, yh, ell_s, score, max_size, evict, grow, ws):
    """Put the oracle answer ``yh`` of block ``i`` in the working set ``ws`` (its :meth:`arrays`) unless it is there:
    a new plane (``alpha = 0``, loss ``ell_s``, score ``score``) after evicting the longest-inactive planes down to
    ``evict - 1`` when ``evict > 0`` (MP-BCFW), at most ``max_size`` planes otherwise (see :func:`ws_insert`).
    Returns ``(position, key, fl, lab)``, the pool arrays possibly reallocated."""
    ws_start, ws_cap, ws_size, ws_labstart, ws_lablen, ws_meta, ws_key, ws_fl, ws_lab, ws_incomplete = ws
    hkey = label_hash(yh)
    j = ws_find(i, hkey, yh, ws_start, ws_size, ws_labstart, ws_lablen, ws_key, ws_lab)
    if j < 0:
        while evict > 0 and ws_size[i] >= evict:
            ws_evict_lru(i, ws_start, ws_size, ws_labstart, ws_lablen, ws_key, ws_fl, ws_lab, ws_incomplete)
        j, ws_key, ws_fl, ws_lab = ws_insert(i, hkey, yh, ell_s, max_size, grow, ws_start, ws_cap, ws_size,
                                             ws_labstart, ws_lablen, ws_meta, ws_key, ws_fl, ws_lab, ws_incomplete)
        ws_fl[ws_start[i] + j, SCORE] = score
    return j, ws_key, ws_fl, ws_lab


@njit(cache=True)
def _running_average(v, ell, avg_v, avg_s) -> None:
    """MP-BCFW-avg: ``(avg_v, avg_s[0]) <- (1 - rho) (avg_v, avg_s[0]) + rho (v, ell)``, ``rho = 2 / (avg_s[1] + 2)``,
    and one more update counted in ``avg_s[1]``."""
    rho = 2.0 / (avg_s[1] + 2.0)
    for q in range(v.shape[0]):
        avg_v[q] = (1.0 - rho) * avg_v[q] + rho * v[q]
    avg_s[0] = (1.0 - rho) * avg_s[0] + rho * ell
    avg_s[1] += 1.0


@njit(cache=True)
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


@njit(cache=True)
def _transition_score(Ti, trans):
    """``<T_i, trans>``, the transition part of ``mu_i``'s score."""
    K = trans.shape[0]
    score = 0.0
    for p in range(K):
        for c in range(K):
            score += Ti[p, c] * trans[p, c]
    return score


@njit(cache=True)
def chain_plan_steps(parts, sampling, ws, mp, step, feats, wts, state, avg, out):
    """Run up to ``m`` block iterations; see the module docstring.

    Argument groups (tuples): ``parts = (m, rule, use_ws, cache, F, glob_thr, max_size, keep_inactive, track_est)``,
    ``sampling = (sample_mode, order, uniforms, queue, smeta, est, tree, tsize, power)``, ``ws`` the working set's
    :meth:`~.working_set.WorkingSet.arrays`, ``mp = (planes, ylab, stamp, cutoff, max_planes, avg_on, v, avg_v,
    avg_s)``, ``step = (step_code, averaging, lam, k0, t0)``, ``feats``, ``wts``, ``state``, ``avg`` as in
    :mod:`.chain_kernels`, ``out = (gaps, blocks, counters)``.

    ``planes``: multi-plane BCFW's steps (:class:`~torch_bcfw.duals.plan.StepPlan`): ``MP_EXACT``, the oracle answer
    (``ylab`` when given: the model's own oracle, called by the caller for a one-block plan) joins the planes, the
    longest-inactive evicted beyond ``max_planes``; ``MP_APPROX``, the best stored plane is the corner, and the planes
    last active before ``cutoff`` are dropped after the step; either stamps the corner's plane ``stamp``.  With
    ``avg_on`` the running average ``(avg_v, avg_s[0])`` of ``(v, l)`` takes weight ``2 / (avg_s[1] + 2)`` after
    every step (MP-BCFW-avg; ``v`` is ``w``'s storage).

    ``sample_mode`` 0: block ``order[j]`` (the next block's state is prefetched while one is processed); 1: gap
    sampling (``queue``/``smeta``, ``tree`` of size ``tsize`` over ``est``, uniforms ``uniforms[j]``).
    ``track_est``: store the oracle's block gap as the block's estimate (and update the tree when gap sampling).
    ``rule``: FW / pairwise / away code; ``use_ws``: keep the working set (``ws_*`` arrays); ``cache``: cache-hit
    test with ``F`` and ``glob_thr = nu/n g_global``; ``max_size``: cache size (0: unbounded); ``keep_inactive``:
    keep planes with ``alpha = 0`` (the cache).  With none of these (a plain plan) an iteration is exactly a BCFW
    step: oracle, FW step, nothing measured or kept.

    Per iteration ``j``: ``blocks[j]`` the block, ``gaps[j]`` its exact block gap when the oracle was called
    (``nan`` on a cache hit).  ``counters`` (out): ``[iterations, oracle calls, cache hits, status, k, clock]``
    with status ``NEED_GAP_PASS`` when gap sampling found every estimate zero.  Returns the (possibly
    reallocated) working-set pool ``(key, fl, lab)``.
    """
    m, rule, use_ws, cache, F, glob_thr, max_size, keep_inactive, track_est = parts
    sample_mode, order, uniforms, queue, smeta, est, tree, tsize, power = sampling
    ws_start, ws_cap, ws_size, ws_labstart, ws_lablen, ws_meta, ws_key, ws_fl, ws_lab, ws_incomplete = ws
    planes, ylab, stamp, cutoff, max_planes, avg_on, v, avg_v, avg_s = mp
    step_code, averaging, lam, k0, t0 = step
    indptr, indices, values, y, offsets, gram, gram_off = feats
    We, bias, start, end, trans = wts
    mu, T, block_ell, ells = state
    mu_acc, T_acc, last = avg
    gaps, blocks, counters = out
    n = offsets.shape[0] - 1
    K = We.shape[1]
    U, Ua, D, ystar, delta = step_scratch(offsets, K)
    dT = np.empty((K, K))
    ya = np.empty(ystar.shape[0], dtype=np.int64)
    yh = np.empty(ystar.shape[0], dtype=np.int32)
    measure = (use_ws and planes == 0) or track_est  # h_i before the oracle (cache test, block gaps of the estimates)
    k = k0
    clock = t0
    status = DONE
    n_oracle = 0
    n_hits = 0
    done = 0
    for j in range(m):
        # ---- sampling policy
        if sample_mode == 0:
            i = order[j]
            if j + 1 < m:
                prefetch_block(order[j + 1], offsets, indptr, indices, values, gram, gram_off, mu, T, mu_acc, averaging)
        else:
            i = gap_draw(queue, smeta, tree, tsize, uniforms[j])
            if i < 0:
                status = NEED_GAP_PASS
                break
        blocks[j] = i
        s = offsets[i]
        L = offsets[i + 1] - s
        Ti = T[i]
        ell_i = block_ell[i]
        score_mu = corner_base(s, L, feats, wts, mu, U, D)  # D = -mu_i
        h_i = 0.0
        if measure:
            score_mu += _transition_score(Ti, trans)
            h_i = ell_i + score_mu / n
        # ---- oracle with the working set
        jmax = -1
        jmin = -1
        nact = 0
        hit = False
        if use_ws and planes != MP_EXACT:
            s0 = ws_start[i]
            l0 = ws_labstart[i]
            for q in range(ws_size[i]):
                ws_fl[s0 + q, SCORE] = ws_fl[s0 + q, LOSS] + _plane_score(U, trans, ws_lab, l0 + q * L, L) / n
            jmax, jmin, nact = ws_corners(i, ws_start, ws_size, ws_key, ws_fl)
            if cache:
                hit = cache_hit(ws_fl[s0 + jmax, SCORE] - h_i, est[i], F, glob_thr)
            hit = hit or planes == MP_APPROX  # MP-BCFW's approximate step: always the best plane
        j_s = -1
        if hit:
            n_hits += 1
            j_s = jmax
            base = ws_labstart[i] + j_s * L
            for t in range(L):
                ystar[t] = ws_lab[base + t]
            ell_s = ws_fl[ws_start[i] + j_s, LOSS]
            score_star = _labels_score(U, trans, ystar, L)
            for t in range(L):
                D[t, ystar[t]] += 1.0
            gaps[j] = np.nan
        else:
            n_oracle += 1
            if ylab.shape[0] > 0:
                for t in range(L):
                    ystar[t] = ylab[t]
            else:
                loss_augmented_decode(U, Ua, L, s, y, 1.0 / L, trans, ystar, delta)
            score_star, mistakes = add_corner(s, L, y, trans, U, ystar, D)
            ell_s = mistakes * (1.0 / L) / n
            if measure:
                g = (score_star - score_mu) / n - ell_i + ell_s
                gaps[j] = g
                if track_est:
                    est_set(est, tree, tsize, i, g, power, sample_mode == 1)
            if use_ws:
                for t in range(L):
                    yh[t] = ystar[t]
                # MP-BCFW: a new plane evicts the longest inactive beyond max_planes, and may grow the active set
                evict = max_planes if planes != 0 else 0
                j_s, ws_key, ws_fl, ws_lab = _store_answer(
                    i, yh[:L], ell_s, ell_s + score_star / n, max_size, evict, rule != FW_RULE or planes != 0,
                    (ws_start, ws_cap, ws_size, ws_labstart, ws_lablen, ws_meta, ws_key, ws_fl, ws_lab, ws_incomplete))
        if planes != 0:
            ws_fl[ws_start[i] + j_s, LAST] = stamp
        # ---- step rule
        kind = rule
        h_s = ell_s + score_star / n
        if rule == AWAY_RULE:
            g_fw = (score_star - score_mu) / n - ell_i + ell_s
            g_a = h_i - ws_fl[ws_start[i] + jmin, SCORE]
            kind = away_choice(g_fw, g_a, nact)
        if kind == FW_RULE:
            score_T, sq_T = _transition_stats(Ti, trans, ystar[:L])
            corner = (score_star, score_mu if measure else score_mu + score_T, ell_i, ell_s, sq_T)
            num, gamma = fw_move(i, s, L, (step_code, averaging, lam, k), clock, corner, ystar, D, feats, wts, state,
                                 avg)
            if not measure:
                gaps[j] = num
            if use_ws and gamma != 0.0:
                ws_fw_update(i, j_s, gamma, ws_start, ws_size, ws_fl)
        elif (kind == PAIRWISE_RULE or kind == AWAY_RULE) and not (kind == PAIRWISE_RULE and jmin == j_s):
            _active_set_step(kind, i, s, L, j_s, jmin, (h_i, h_s, ell_i, ell_s), clock, (averaging, lam),
                             (ws_start, ws_size, ws_labstart, ws_fl, ws_lab), feats, wts, state, avg, (ystar, D, dT, ya))
        if use_ws and not keep_inactive:
            ws_drop_inactive(i, ws_start, ws_size, ws_labstart, ws_lablen, ws_key, ws_fl, ws_lab)
        if planes == MP_APPROX and cutoff > -np.inf:
            ws_drop_stale(i, cutoff, ws_start, ws_size, ws_labstart, ws_lablen, ws_key, ws_fl, ws_lab, ws_incomplete)
        k += 1
        clock += 1
        done += 1
        if avg_on:
            _running_average(v, ells[0], avg_v, avg_s)
    counters[0] = done
    counters[1] = n_oracle
    counters[2] = n_hits
    counters[3] = status
    counters[4] = k
    counters[5] = clock
    return ws_key, ws_fl, ws_lab
