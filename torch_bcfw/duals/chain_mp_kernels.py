"""Compiled MP-BCFW steps for the chain (Shah et al. 2015): the fast path of
:class:`torch_bcfw.solvers.mpbcfw.MPBCFW` on a CPU :class:`~torch_bcfw.duals.chain.ChainDualState`.

:func:`chain_mp_steps` runs the block steps of :meth:`MPBCFW._exact_step` / :meth:`MPBCFW._approx_step`
(which it must reproduce; a test compares them) on the marginal state, with the FW-step arithmetic of
:func:`_fw_step` and the working-set helpers of :mod:`.working_set`:

* ``mode = EXACT``: the oracle answer (given in ``ylab`` by the caller, one block per call, or Viterbi on
  the loss-augmented unary scores when ``ylab`` is empty) joins the block's planes (``last = stamp``; LRU
  eviction at ``max_planes``), then the line-search step towards it;
* ``mode = APPROX``: every plane of the block is scored from the block's unary scores (``O(L)`` each), the
  best one (ties as :func:`.working_set.ws_corners`) is marked active and stepped to, then the planes last
  active before ``cutoff`` are dropped.

After every step, if ``avg_on``, the average ``(avg_v, avg_s[0])`` of ``(v, l)`` is updated with weight
``2/(avg_s[1] + 2)`` (MP-BCFW-avg; the caller passes the exact or the approximate average).
"""
from __future__ import annotations

import numpy as np
from numba import njit

from .chain_driver import _labels_score, _plane_score
from .chain_kernels import _transition_stats, _unary_scores, fw_move, loss_augmented_decode, step_scratch
from .working_set import LAST, LOSS, SCORE, label_hash, ws_corners, ws_drop_stale, ws_evict_lru, ws_find, ws_fw_update, ws_insert

__all__ = ["chain_mp_steps", "EXACT", "APPROX"]

EXACT, APPROX = 0, 1


@njit(cache=True, fastmath=True)
def _fw_step(i, s, L, step, clock, score_star, score_mu, ell_i, ell_s, ystar, D, feats, wts, state, avg):
    """The FW step towards the labeling ``ystar`` (``score_mu`` with transitions): forms the direction ``D`` and calls
    :func:`.chain_kernels.fw_move`; returns gamma."""
    trans = wts[4]
    mu, T = state[0], state[1]
    K = trans.shape[0]
    for t in range(L):
        for c in range(K):
            D[t, c] = -mu[s + t, c]
        D[t, ystar[t]] += 1.0
    _, sq_T = _transition_stats(T[i], trans, ystar[:L])
    _, gamma = fw_move(i, s, L, step, clock, (score_star, score_mu, ell_i, ell_s, sq_T), ystar, D, feats, wts, state,
                       avg)
    return gamma


@njit(cache=True)
def chain_mp_steps(mode, order, ylab, planes, ws, step, feats, wts, state, avg, mp_avg, counters):
    """Steps on the blocks ``order`` (see the module docstring).  Argument groups (tuples): ``planes = (stamp,
    cutoff, max_planes)``, ``ws`` the working set's :meth:`~.working_set.WorkingSet.arrays`, ``step = (lam, k0,
    t0)``, ``feats``, ``wts``, ``state``, ``avg`` as in :mod:`.chain_kernels`, ``mp_avg = (avg_on, v, avg_v, avg_s)``.
    ``counters`` (out): ``[k, avg clock]``.  Returns the (possibly reallocated) working-set pool ``(key, fl, lab)``."""
    stamp, cutoff, max_planes = planes
    ws_start, ws_cap, ws_size, ws_labstart, ws_lablen, ws_meta, ws_key, ws_fl, ws_lab, ws_incomplete = ws
    lam, k0, t0 = step
    indptr, indices, values, y, offsets, gram, gram_off = feats
    We, bias, start, end, trans = wts
    mu, T, block_ell, ells = state
    avg_on, v, avg_v, avg_s = mp_avg
    n = offsets.shape[0] - 1
    K = We.shape[1]
    U, Ua, D, ystar, delta = step_scratch(offsets, K)
    yh = np.empty(ystar.shape[0], dtype=np.int32)
    k = k0
    clock = t0
    for j in range(order.shape[0]):
        i = order[j]
        s = offsets[i]
        L = offsets[i + 1] - s
        _unary_scores(s, L, indptr, indices, values, We, bias, start, end, U)
        score_mu = 0.0
        for t in range(L):
            for c in range(K):
                score_mu += U[t, c] * mu[s + t, c]
        for p in range(K):
            for c in range(K):
                score_mu += T[i, p, c] * trans[p, c]
        ell_i = block_ell[i]
        if mode == EXACT:
            inv_L = 1.0 / L
            if ylab.shape[0] > 0:
                for t in range(L):
                    ystar[t] = ylab[t]
            else:
                loss_augmented_decode(U, Ua, L, s, y, inv_L, trans, ystar, delta)
            mistakes = 0
            for t in range(L):
                if ystar[t] != y[s + t]:
                    mistakes += 1
                yh[t] = ystar[t]
            ell_s = mistakes * inv_L / n
            score_star = _labels_score(U, trans, ystar, L)
            hkey = label_hash(yh[:L])
            js = ws_find(i, hkey, yh[:L], ws_start, ws_size, ws_labstart, ws_lablen, ws_key, ws_lab)
            if js < 0:
                while max_planes > 0 and ws_size[i] >= max_planes:
                    ws_evict_lru(i, ws_start, ws_size, ws_labstart, ws_lablen, ws_key, ws_fl, ws_lab, ws_incomplete)
                js, ws_key, ws_fl, ws_lab = ws_insert(
                    i, hkey, yh[:L], ell_s, 0, True,
                    ws_start, ws_cap, ws_size, ws_labstart, ws_lablen, ws_meta, ws_key, ws_fl, ws_lab, ws_incomplete)
        else:
            s0 = ws_start[i]
            l0 = ws_labstart[i]
            for q in range(ws_size[i]):
                ws_fl[s0 + q, SCORE] = ws_fl[s0 + q, LOSS] + _plane_score(U, trans, ws_lab, l0 + q * L, L) / n
            js = ws_corners(i, ws_start, ws_size, ws_key, ws_fl)[0]
            base = l0 + js * L
            for t in range(L):
                ystar[t] = ws_lab[base + t]
            ell_s = ws_fl[s0 + js, LOSS]
            score_star = _labels_score(U, trans, ystar, L)
        ws_fl[ws_start[i] + js, LAST] = stamp
        gamma = _fw_step(i, s, L, (0, False, lam, k), clock, score_star, score_mu, ell_i, ell_s, ystar, D, feats, wts,
                         state, avg)
        if gamma != 0.0:
            ws_fw_update(i, js, gamma, ws_start, ws_size, ws_fl)
        if mode == APPROX and cutoff > -np.inf:
            ws_drop_stale(i, cutoff, ws_start, ws_size, ws_labstart, ws_lablen, ws_key, ws_fl, ws_lab, ws_incomplete)
        k += 1
        clock += 1
        if avg_on:
            rho = 2.0 / (avg_s[1] + 2.0)
            for q in range(v.shape[0]):
                avg_v[q] = (1.0 - rho) * avg_v[q] + rho * v[q]
            avg_s[0] = (1.0 - rho) * avg_s[0] + rho * ells[0]
            avg_s[1] += 1.0
    counters[0] = k
    counters[1] = clock
    return ws_key, ws_fl, ws_lab
