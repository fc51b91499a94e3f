"""The chain's compiled step loop: every one-block :class:`~torch_bcfw.duals.plan.StepPlan` -- plain BCFW, gap
sampling, pairwise / away steps, the cache, MP-BCFW's exact and approximate passes -- without returning to Python.

:func:`chain_refined_plan_steps` is the iteration of :func:`~torch_bcfw.duals.plan.generic_plan_steps` (tests compare
them) built from :mod:`.chain_kernels`, :mod:`.sumtree`, :mod:`.working_set` and :mod:`.stepsize`.
:func:`chain_plain_bcfw_steps` is its plain branch compiled on its own (a first plain fit compiles without the working
set's code).  The marginals ``mu_i, T_i`` equal ``sum_y alpha_i(y) (onehot(y), counts(y))`` for the working set's
weights (up to round-off).  Box constraints are not handled here (the state runs the generic loop).
"""
from __future__ import annotations

import numpy as np
from numba import njit

from .chain_kernels import (Corner, active_set_step, add_corner, corner_base, fw_move, labels_score,
                            loss_augmented_decode, prefetch_block, step_scratch, transition_score, transition_stats)
from .plan import DONE, MP_APPROX, MP_EXACT, NEED_GAP_PASS, Progress
from .stepsize import AWAY_RULE, FW_RULE, PAIRWISE_RULE, away_choice, cache_hit
from .sumtree import est_set, gap_draw
from .working_set import LAST, LOSS, SCORE, ws_corners, ws_drop_inactive, ws_drop_stale, ws_fw_update, ws_store

__all__ = ["chain_refined_plan_steps", "chain_plain_bcfw_steps"]


@njit(cache=True)
def _running_average(run, ell) -> None:
    """MP-BCFW-avg: ``(avg_v, l_avg) <- (1 - rho) (avg_v, l_avg) + rho (v, ell)``, ``rho = 2 / (k + 2)``, one more
    update counted in ``k``."""
    tot = run.totals[0]
    rho = 2.0 / (tot.k + 2.0)
    for q in range(run.v.shape[0]):
        run.avg_v[q] = (1.0 - rho) * run.avg_v[q] + rho * run.v[q]
    tot.ell = (1.0 - rho) * tot.ell + rho * ell
    tot.k += 1.0


@njit(cache=True)
def chain_refined_plan_steps(plan, sampling, ws, running, ylab, lam, k0, t0, feats, w, marg, avg, gaps, blocks):
    """Run up to ``plan.m`` block iterations of a one-block plan on the chain's state.

    ``plan``, ``sampling``, ``running``: :func:`~.plan.compiled_plan`'s groups; ``ws``: the working set's
    :class:`~.working_set.Pool`; ``ylab``: oracle answers given by the caller, the plan's blocks' labelings
    concatenated (else empty); ``lam``, ``k0``, ``t0``: the state's ``lam``, step counter and averaging clock;
    ``feats``, ``w``, ``marg``, ``avg``: the chain's groups (:mod:`.chain_kernels`).  MP-BCFW's planes and the
    running average as in :class:`~.plan.MultiPlane`.  Per iteration ``j``: ``blocks[j]`` the block, ``gaps[j]`` its
    exact block gap (``nan`` on a cache hit).  Returns ``(Progress, pool)``, the pool possibly reallocated.
    """
    offsets, y = feats.offsets, feats.y
    mu, T, block_ell = marg.mu, marg.T, marg.block_ell
    trans = w.trans
    order = sampling.order
    m = plan.m
    n = offsets.shape[0] - 1
    scr = step_scratch(offsets, w.We.shape[1])
    U, D, ystar = scr.U, scr.D, scr.ystar
    mp = plan.planes
    measure = (plan.use_working_set and mp == 0) or plan.track_estimates  # h_i before the oracle
    k = k0
    clock = t0
    status = DONE
    n_oracle = 0
    n_hits = 0
    done = 0
    yo = 0  # where the next given answer starts in ylab
    for j in range(m):
        # ---- sampling policy
        if not plan.by_gap:
            i = order[j]
            if j + 1 < m:
                prefetch_block(order[j + 1], offsets, feats.indptr, feats.indices, feats.values, feats.gram,
                               feats.gram_off, mu, T, avg.mu_acc, plan.averaging)
        else:
            i = gap_draw(sampling.queue, sampling.queue_pos, sampling.tree, sampling.tree_size, sampling.uniforms[j])
            if i < 0:
                status = NEED_GAP_PASS
                break
        blocks[j] = i
        s = offsets[i]
        L = offsets[i + 1] - s
        ell_i = block_ell[i]
        score_mu = corner_base(s, L, feats, w, mu, U, D)  # D = -mu_i
        h_i = 0.0
        if measure:
            score_mu += transition_score(T[i], trans)
            h_i = ell_i + score_mu / n
        # ---- oracle with the working set
        jmax = -1
        jmin = -1
        nact = 0
        hit = False
        if plan.use_working_set and mp != MP_EXACT:
            s0 = ws.start[i]
            l0 = ws.lab_start[i]
            for q in range(ws.size[i]):
                plane_score = labels_score(U, trans, ws.plane_labels, l0 + q * L, L)
                ws.plane_values[s0 + q, SCORE] = ws.plane_values[s0 + q, LOSS] + plane_score / n
            jmax, jmin, nact = ws_corners(ws, i)
            if plan.cache:
                hit = cache_hit(ws.plane_values[s0 + jmax, SCORE] - h_i, sampling.est[i], plan.cache_F,
                                plan.cache_threshold)
            hit = hit or mp == MP_APPROX  # MP-BCFW's approximate step: always the best plane
        j_s = -1
        if hit:
            n_hits += 1
            j_s = jmax
            base = ws.lab_start[i] + j_s * L
            for t in range(L):
                ystar[t] = ws.plane_labels[base + t]
            ell_s = ws.plane_values[ws.start[i] + j_s, LOSS]
            score_star = labels_score(U, trans, ystar, 0, L)
            for t in range(L):
                D[t, ystar[t]] += 1.0
            gaps[j] = np.nan
        else:
            n_oracle += 1
            if ylab.shape[0] > 0:
                for t in range(L):
                    ystar[t] = ylab[yo + t]
                yo += L
            else:
                loss_augmented_decode(U, scr.Ua, L, s, y, 1.0 / L, trans, ystar, scr.delta)
            score_star, mistakes = add_corner(s, L, y, trans, U, ystar, D)
            ell_s = mistakes * (1.0 / L) / n
            if measure:
                g = (score_star - score_mu) / n - ell_i + ell_s
                gaps[j] = g
                if plan.track_estimates:
                    est_set(sampling.est, sampling.tree, sampling.tree_size, i, g, sampling.power, plan.by_gap)
            if plan.use_working_set:
                yh = scr.yh
                for t in range(L):
                    yh[t] = ystar[t]
                # MP-BCFW: a new plane evicts the longest inactive beyond max_planes, and may grow the active set
                evict = plan.max_planes if mp != 0 else 0
                j_s, ws = ws_store(ws, i, yh[:L], ell_s, ell_s + score_star / n, plan.max_size, evict,
                                   plan.rule != FW_RULE or mp != 0)
        if mp != 0:
            ws.plane_values[ws.start[i] + j_s, LAST] = plan.stamp
        # ---- step rule
        kind = plan.rule
        h_s = ell_s + score_star / n
        if plan.rule == AWAY_RULE:
            g_fw = (score_star - score_mu) / n - ell_i + ell_s
            g_a = h_i - ws.plane_values[ws.start[i] + jmin, SCORE]
            kind = away_choice(g_fw, g_a, nact)
        if kind == FW_RULE:
            score_T, sq_T = transition_stats(T[i], trans, ystar[:L])
            corner = Corner(score_star, score_mu if measure else score_mu + score_T, ell_i, ell_s, sq_T)
            num, gamma = fw_move(i, s, L, plan.step_code, plan.averaging, lam, k, clock, corner, ystar, D, feats, w,
                                 marg, avg)
            if not measure:
                gaps[j] = num
            if plan.use_working_set and gamma != 0.0:
                ws_fw_update(ws, i, j_s, gamma)
        elif (kind == PAIRWISE_RULE or kind == AWAY_RULE) and not (kind == PAIRWISE_RULE and jmin == j_s):
            active_set_step(kind, i, s, L, j_s, jmin, h_i, h_s, ell_i, ell_s, clock, plan.averaging, lam, ws, feats, w,
                            marg, avg, scr)
        if plan.use_working_set and not plan.keep_inactive:
            ws_drop_inactive(ws, i)
        if mp == MP_APPROX and plan.cutoff > -np.inf:
            ws_drop_stale(ws, i, plan.cutoff)
        k += 1
        clock += 1
        done += 1
        if plan.running_average:
            _running_average(running, marg.totals[0].ell)
    return Progress(done, n_oracle, n_hits, status, k, clock), ws


@njit(cache=True)
def chain_plain_bcfw_steps(plan, sampling, lam, k0, t0, feats, w, marg, avg, gaps, blocks):
    """Plain BCFW: the branch of :func:`chain_refined_plan_steps` for a plan without refinements, the same operations in
    the same order (the same bits).  Arguments as for :func:`chain_refined_plan_steps`; returns the :class:`~.plan.Progress`."""
    offsets, y = feats.offsets, feats.y
    mu, T, block_ell = marg.mu, marg.T, marg.block_ell
    trans = w.trans
    order = sampling.order
    m = plan.m
    n = offsets.shape[0] - 1
    scr = step_scratch(offsets, w.We.shape[1])
    U, D, ystar = scr.U, scr.D, scr.ystar
    k = k0
    clock = t0
    for j in range(m):
        i = order[j]
        if j + 1 < m:
            prefetch_block(order[j + 1], offsets, feats.indptr, feats.indices, feats.values, feats.gram,
                           feats.gram_off, mu, T, avg.mu_acc, plan.averaging)
        blocks[j] = i
        s = offsets[i]
        L = offsets[i + 1] - s
        ell_i = block_ell[i]
        score_mu = corner_base(s, L, feats, w, mu, U, D)  # D = -mu_i
        loss_augmented_decode(U, scr.Ua, L, s, y, 1.0 / L, trans, ystar, scr.delta)
        score_star, mistakes = add_corner(s, L, y, trans, U, ystar, D)
        ell_s = mistakes * (1.0 / L) / n
        score_T, sq_T = transition_stats(T[i], trans, ystar[:L])
        corner = Corner(score_star, score_mu + score_T, ell_i, ell_s, sq_T)
        num, gamma = fw_move(i, s, L, plan.step_code, plan.averaging, lam, k, clock, corner, ystar, D, feats, w,
                             marg, avg)
        gaps[j] = num
        k += 1
        clock += 1
    return Progress(m, m, 0, DONE, k, clock)
