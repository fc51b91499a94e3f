"""The compiled step driver: BCFW and its refinements (gap sampling, pairwise / away steps, caching, MP-BCFW's planes)
for every dual state that supplies the compiled block operations of :mod:`.block_ops`.

:func:`plan_steps` runs a whole chunk of block iterations of a :class:`~torch_bcfw.duals.plan.StepPlan` without
returning to Python.  It is composed from the state's block operations (scores, oracle, corner, step, move;
dispatched on the type of the state's kernel bundle, so it is compiled once per state) and the same small parts as
the generic step loop :func:`~torch_bcfw.duals.plan.generic_plan_steps` (which it must reproduce; tests compare
them):

* **sampling** (:mod:`torch_bcfw.duals.sumtree`): a pre-drawn order (uniform / permutation; the next block's state
  is prefetched), or gap sampling from a sum tree over the block-gap estimates, updated right after every oracle
  call, with the never-visited blocks served first from a random permutation;
* **oracle with a working set** (:mod:`.working_set`): all planes of the block are scored
  (:func:`~.block_ops.plane_score`); with a cache, the best plane is taken instead of calling the oracle when
  ``g_hat_i >= max(F g_i, (nu/n) g_global)`` (Alg. 5); otherwise the oracle, and the answer joins the working set;
* **step rule** (:mod:`torch_bcfw.duals.stepsize`): FW (:func:`~.block_ops.fw_step`), pairwise or away
  (:func:`~.block_ops.active_set_step`) with the clipped exact line search and drop steps.

Plain BCFW is the plan with none of the refinements: each iteration is then the oracle and the FW step, nothing
measured or kept.  MP-BCFW's exact and approximate passes are plans too (the working set as the planes, with their
stamps, eviction and staleness, and the running average; ``mp`` below).

Instances: the chain (:mod:`.chain_ops`, every plan) and the graph cut (:mod:`.graphcut`, plain plans).
"""
from __future__ import annotations

import numpy as np
import torch
from numba import njit

from .block_ops import (active_set_step, begin_block, block_loss, block_scratch, block_span, corner_labels, dual_loss,
                        fw_step, n_blocks, oracle_corner, plane_corner, plane_score, prefetch, round_apply, round_clear,
                        round_directions, round_move, round_scratch, round_sqnorm)
from .plan import MP_APPROX, MP_EXACT, CacheTest, MultiPlane, PlanResult, WorkingSetUse, gap_groups
from .stepsize import AWAY_RULE, FW_RULE, PAIRWISE_RULE, away_choice, cache_hit, minibatch_step_size
from .sumtree import est_set, gap_draw, gap_draw_round
from .working_set import (LAST, LOSS, SCORE, label_hash, ws_corners, ws_drop_inactive, ws_drop_stale, ws_evict_lru,
                          ws_find, ws_fw_update, ws_insert)

__all__ = ["plan_steps", "round_steps", "drive", "drive_rounds", "DONE", "NEED_GAP_PASS", "ORACLE_REFUSED"]

#: status codes returned in ``counters[3]``: the chunk ran; gap sampling found every estimate zero; the oracle could
#: not run at the current ``w`` (e.g. negative pairwise weights of a graph cut)
DONE, NEED_GAP_PASS, ORACLE_REFUSED = 0, 1, 2


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
def plan_steps(K, parts, sampling, ws, mp, step, out):
    """Run up to ``m`` block iterations on the state whose kernel bundle is ``K = (data, weights, storage,
    averages)`` (:mod:`.block_ops`); see the module docstring.

    Argument groups (tuples): ``parts = (m, rule, use_ws, cache, F, glob_thr, max_size, keep_inactive, track_est)``,
    ``sampling = (sample_mode, order, uniforms, queue, smeta, est, tree, tsize, power)``, ``ws`` the working set's
    :meth:`~.working_set.WorkingSet.arrays`, ``mp = (planes, ylab, stamp, cutoff, max_planes, avg_on, v, avg_v,
    avg_s)``, ``step = (step_code, averaging, lam, k0, t0)``, ``out = (gaps, blocks, counters)``.

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
    (``nan`` on a cache hit).  ``counters`` (out, written after every iteration, so an exception raised inside an
    oracle leaves them true to the finished iterations): ``[iterations, oracle calls, cache hits, status, k, clock]``
    with status :data:`NEED_GAP_PASS` when gap sampling found every estimate zero, :data:`ORACLE_REFUSED` when the
    oracle could not run.  Returns the (possibly reallocated) working-set pool ``(key, fl, lab)``.
    """
    m, rule, use_ws, cache, F, glob_thr, max_size, keep_inactive, track_est = parts
    sample_mode, order, uniforms, queue, smeta, est, tree, tsize, power = sampling
    ws_start, ws_cap, ws_size, ws_labstart, ws_lablen, ws_meta, ws_key, ws_fl, ws_lab, ws_incomplete = ws
    planes, ylab, stamp, cutoff, max_planes, avg_on, v, avg_v, avg_s = mp
    step_code, averaging, lam, k0, t0 = step
    gaps, blocks, counters = out
    data, wts, store, avg = K  # once: the operations take the groups, not the bundle
    n = n_blocks(data, wts, store, avg)
    scr = block_scratch(data, wts, store, avg)  # allocated here: known to alias none of the state's arrays
    measure = (use_ws and planes == 0) or track_est  # h_i before the oracle (cache test, block gaps of the estimates)
    k = k0
    clock = t0
    n_oracle = 0
    n_hits = 0
    counters[0] = 0
    counters[1] = 0
    counters[2] = 0
    counters[3] = DONE
    counters[4] = k
    counters[5] = clock
    for j in range(m):
        # ---- sampling policy
        if sample_mode == 0:
            i = order[j]
            if j + 1 < m:
                prefetch(data, wts, store, avg, order[j + 1], averaging)
        else:
            i = gap_draw(queue, smeta, tree, tsize, uniforms[j])
            if i < 0:
                counters[3] = NEED_GAP_PASS
                break
        blocks[j] = i
        s, L = block_span(data, wts, store, avg, i)
        ell_i = block_loss(data, wts, store, avg, i)
        score_mu = begin_block(data, wts, store, avg, scr, i, s, L, measure)
        h_i = 0.0
        if measure:
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
                sc = plane_score(data, wts, store, avg, scr, s, L, ws_lab, l0 + q * L)
                ws_fl[s0 + q, SCORE] = ws_fl[s0 + q, LOSS] + sc / n
            jmax, jmin, nact = ws_corners(i, ws_start, ws_size, ws_key, ws_fl)
            if cache:
                hit = cache_hit(ws_fl[s0 + jmax, SCORE] - h_i, est[i], F, glob_thr)
            hit = hit or planes == MP_APPROX  # MP-BCFW's approximate step: always the best plane
        j_s = -1
        if hit:
            n_hits += 1
            j_s = jmax
            score_star = plane_corner(data, wts, store, avg, scr, s, L, ws_lab, ws_labstart[i] + j_s * L)
            ell_s = ws_fl[ws_start[i] + j_s, LOSS]
            gaps[j] = np.nan
        else:
            score_star, ell_s, ok = oracle_corner(data, wts, store, avg, scr, i, s, L, ylab)
            if not ok:
                counters[3] = ORACLE_REFUSED
                break
            n_oracle += 1
            if measure:
                g = (score_star - score_mu) / n - ell_i + ell_s
                gaps[j] = g
                if track_est:
                    est_set(est, tree, tsize, i, g, power, sample_mode == 1)
            if use_ws:
                # MP-BCFW: a new plane evicts the longest inactive beyond max_planes, and may grow the active set
                evict = max_planes if planes != 0 else 0
                j_s, ws_key, ws_fl, ws_lab = _store_answer(
                    i, corner_labels(data, wts, store, avg, scr, L), ell_s, ell_s + score_star / n, max_size,
                    evict, rule != FW_RULE or planes != 0,
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
            num, gamma = fw_step(data, wts, store, avg, scr, i, s, L, (step_code, averaging, lam, k), clock,
                                 (score_star, score_mu, measure, ell_i, ell_s))
            if not measure:
                gaps[j] = num
            if use_ws and gamma != 0.0:
                ws_fw_update(i, j_s, gamma, ws_start, ws_size, ws_fl)
        elif (kind == PAIRWISE_RULE or kind == AWAY_RULE) and not (kind == PAIRWISE_RULE and jmin == j_s):
            active_set_step(data, wts, store, avg, scr, kind, i, s, L, j_s, jmin, (h_i, h_s, ell_i, ell_s), clock,
                            (averaging, lam), (ws_start, ws_size, ws_labstart, ws_fl, ws_lab))
        if use_ws and not keep_inactive:
            ws_drop_inactive(i, ws_start, ws_size, ws_labstart, ws_lablen, ws_key, ws_fl, ws_lab)
        if planes == MP_APPROX and cutoff > -np.inf:
            ws_drop_stale(i, cutoff, ws_start, ws_size, ws_labstart, ws_lablen, ws_key, ws_fl, ws_lab, ws_incomplete)
        k += 1
        clock += 1
        if avg_on:
            _running_average(v, dual_loss(data, wts, store, avg), avg_v, avg_s)
        counters[0] = j + 1
        counters[1] = n_oracle
        counters[2] = n_hits
        counters[4] = k
        counters[5] = clock
    return ws_key, ws_fl, ws_lab


@njit(cache=True)
def round_steps(K, R, order, roffsets, step, sampling, gaps):
    """Mini-batch rounds (Wang et al. 2016) ``order[roffsets[j]:roffsets[j + 1]]`` of one process that owns every
    block of the problem, on the state whose kernel bundle is ``K`` and round accumulators ``R`` (the round
    operations of :mod:`.block_ops`).

    Per round of distinct blocks ``B`` at the same ``w``: the corners and the summed direction
    ``P = sum_i phi_i(delta_i)`` (:func:`~.block_ops.round_directions`, which gives the sum of the block gaps),
    ``den = ||P||^2 / (lam n^2)`` (:func:`~.block_ops.round_sqnorm`), the step ``gamma`` (clipped line search or the
    fixed step), then the blocks' move (:func:`~.block_ops.round_move`) and ``w -= gamma P / (lam n)``
    (:func:`~.block_ops.round_apply`); ``P`` is cleared.  ``step = (step_code, averaging, lam, n_total, k, clock)``;
    ``gaps[j]`` gets round ``j``'s line-search numerator.  ``sampling = (by_gap, uniforms, queue, smeta, est, tree,
    tsize, power)``: with ``by_gap`` the slots of ``order`` are filled round by round from the sum tree
    (:func:`~.sumtree.gap_draw_round`) and the estimates take the block gaps; a round that finds every estimate zero
    ends the call.  Returns ``(k, clock, rounds taken, blocks stepped)``."""
    step_code, averaging, lam, n_total, k, clock = step
    by_gap, uniforms, queue, smeta, est, tree, tsize, power = sampling
    data, wts, store, avg = K
    rscr = round_scratch(data, wts, store, avg, R, order, roffsets, by_gap)
    bgaps = np.empty(order.shape[0])
    taken = 0
    stepped = 0
    for j in range(roffsets.shape[0] - 1):
        a = roffsets[j]
        b = roffsets[j + 1]
        if by_gap:
            b = a + gap_draw_round(queue, smeta, tree, tsize, uniforms[a:b], order[a:b])
            if b == a:
                break
        blocks = order[a:b]
        tau = blocks.shape[0]
        taken += 1
        if tau == 0:
            continue
        num, _, _ = round_directions(data, wts, store, avg, R, rscr, blocks, n_total, bgaps)
        den = round_sqnorm(data, wts, store, avg, R) / (lam * n_total * n_total)
        gamma = minibatch_step_size(step_code, num, den, k, n_total, tau)
        if gamma != 0.0:
            round_move(data, wts, store, avg, R, rscr, blocks, gamma, n_total, clock, averaging)
            round_apply(data, wts, store, avg, R, -gamma / (lam * n_total))
        round_clear(data, wts, store, avg, R)
        if by_gap:
            for q in range(tau):
                est_set(est, tree, tsize, blocks[q], bgaps[q], power, True)
        gaps[j] = num
        k += tau
        clock += 1
        stepped += tau
    return k, clock, taken, stepped


# The round operations one at a time, for rounds split over processes (an all-reduce between them; :func:`drive_rounds`)
@njit(cache=True)
def _rounds_scratch(K, R, order, roffsets, by_gap):
    data, wts, store, avg = K
    return round_scratch(data, wts, store, avg, R, order, roffsets, by_gap)


@njit(cache=True)
def _rounds_directions(K, R, rscr, blocks, n_total, bgaps):
    data, wts, store, avg = K
    return round_directions(data, wts, store, avg, R, rscr, blocks, n_total, bgaps)


@njit(cache=True)
def _rounds_move(K, R, rscr, blocks, gamma, n_total, clock, averaging):
    data, wts, store, avg = K
    round_move(data, wts, store, avg, R, rscr, blocks, gamma, n_total, clock, averaging)


@njit(cache=True)
def _rounds_clear(K, R):
    data, wts, store, avg = K
    round_clear(data, wts, store, avg, R)


def drive(state, K, ells: np.ndarray, plan, ylab: np.ndarray | None = None) -> tuple[PlanResult, int]:
    """One call of :func:`plan_steps` on ``plan`` for ``state`` (a :class:`~torch_bcfw.duals.base.DualState`) with its
    kernel bundle ``K``.  ``ells``: the float64 array the bundle's operations keep ``[l, avg_l_u, ...]`` in;
    ``ylab``: given oracle answers of a one-block plan (int64; ``None``: the state's compiled oracle).

    The plan's parts become the driver's argument groups (the working set's pool when the plan keeps one, empty
    arrays for the parts it does not have).  Afterwards -- also when an oracle raised (Ctrl-C inside a callback) --
    the state's counters ``k, avg_t`` and ``l, avg_l_u`` are those of the finished iterations, the working set
    holds the (possibly reallocated) pool and MP-BCFW-avg's running average its new weight.
    Returns ``(PlanResult, status)`` (status: :data:`DONE`, :data:`NEED_GAP_PASS` or :data:`ORACLE_REFUSED`)."""
    m = int(plan.m)
    gaps = np.full(m, np.nan)
    blocks = np.full(m, -1, dtype=np.int64)
    counters = np.array([0, 0, 0, DONE, state.k, state.avg_t], dtype=np.int64)
    ws = state.working_set if plan.working_set is not None else None
    if ws is not None:
        wsa = ws.arrays()
    else:
        z = np.zeros(1, dtype=np.int64)
        wsa = (z, z.copy(), z.copy(), z.copy(), z.copy(), np.zeros(2, dtype=np.int64), np.zeros(1, dtype=np.uint64),
               np.zeros((1, 3)), np.zeros(1, dtype=np.int32), np.zeros(1, dtype=np.uint8))
    order = plan.order if plan.order is not None else np.zeros(0, dtype=np.int64)
    wsu = plan.working_set if plan.working_set is not None else WorkingSetUse()
    cache = wsu.cache if wsu.cache is not None else CacheTest()
    parts = (m, int(plan.rule), plan.working_set is not None, wsu.cache is not None, float(cache.F),
             float(cache.glob_thr), int(wsu.max_size), bool(wsu.keep_inactive), plan.estimates is not None)
    sampling = (1 if plan.gap is not None else 0, np.ascontiguousarray(order, dtype=np.int64)) + gap_groups(plan)
    planes = wsu.planes if wsu.planes is not None else MultiPlane(0, 0.0)
    run = planes.running
    avg_v = run.v.numpy() if run is not None else np.zeros(1)
    avg_s = np.array([run.ell, run.k], dtype=np.float64) if run is not None else np.zeros(2)
    ylab = np.zeros(0, dtype=np.int64) if ylab is None else np.ascontiguousarray(ylab, dtype=np.int64)
    mp = (int(planes.mode), ylab, float(planes.stamp), float(planes.cutoff), int(planes.max_planes),
          run is not None, state.v.numpy(), avg_v, avg_s)
    step = (int(plan.step_code), bool(plan.averaging), state.lam, state.k, state.avg_t)
    try:
        key, fl, lab = plan_steps(K, parts, sampling, tuple(wsa), mp, step, (gaps, blocks, counters))
        if ws is not None:
            ws.set_pool(key, fl, lab)
    finally:  # the arrays hold every finished iteration
        if run is not None:
            run.ell, run.k = float(avg_s[0]), int(avg_s[1])
        state.ell, state.avg_ell_u = float(ells[0]), float(ells[1])
        state.k, state.avg_t = int(counters[4]), int(counters[5])
    done = int(counters[0])
    result = PlanResult(steps=done, oracle_calls=int(counters[1]), cache_hits=int(counters[2]),
                        need_gap_pass=int(counters[3]) == NEED_GAP_PASS, blocks=blocks[:done], gaps=gaps[:done])
    return result, int(counters[3])


def drive_rounds(state, K, R, P, ells: np.ndarray, plan) -> PlanResult:
    """The mini-batch rounds of ``plan`` for ``state`` with its kernel bundle ``K`` and round accumulators ``R``
    (``P``: the summed direction as a tensor in the layout of ``w``, the storage of ``R``; ``ells`` as in
    :func:`drive`): all rounds in one :func:`round_steps` call when this process owns the problem's every block and
    nothing is reduced, else one compiled call per round part with the all-reduce ``plan.rounds.reduce`` of
    ``(V, sums)`` between the directions and the move (``w`` then moves by the summed ``V``, the same on every
    process).  Gap sampling draws each round from the sum tree; a round that finds every estimate zero (on every
    process) ends the call."""
    order = plan.order  # filled round by round with gap sampling
    rof = np.ascontiguousarray(plan.rounds.offsets, dtype=np.int64)
    rgaps = np.zeros(len(rof) - 1)
    sampling = (plan.gap is not None,) + gap_groups(plan)
    step = (int(plan.step_code), bool(plan.averaging), state.lam, state.n_total, state.k, state.avg_t)
    if plan.rounds.reduce is None and state.n_total == state.n:
        state.k, state.avg_t, taken, stepped = round_steps(K, R, order, rof, step, sampling, rgaps)
    else:
        taken, stepped = _reduced_rounds(state, K, R, P, plan, sampling, rof, rgaps)
    state.ell, state.avg_ell_u = float(ells[0]), float(ells[1])
    slots = int(rof[taken])
    gaps = np.full(slots, np.nan)
    j = np.flatnonzero(rof[:taken] < rof[1:taken + 1])
    j = j[order[rof[j]] >= 0]  # rounds with a block here (gap sampling fills a round's first slot first)
    gaps[rof[j]] = rgaps[j]
    return PlanResult(steps=slots, oracle_calls=int(stepped), cache_hits=0, need_gap_pass=taken < len(rof) - 1,
                      blocks=order[:slots], gaps=gaps, rounds=int(taken))


def _reduced_rounds(state, K, R, P, plan, sampling, rof, rgaps) -> tuple[int, int]:
    """Rounds split over processes (see :func:`drive_rounds`).  Returns the rounds taken and the blocks they stepped
    over all processes."""
    by_gap, uniforms, queue, smeta, est, tree, tsize, power = sampling
    order = plan.order
    rscr = _rounds_scratch(K, R, order, rof, by_gap)
    bgaps = np.empty(len(order))
    scale = 1.0 / (state.lam * state.n_total)
    taken = stepped = 0
    for j in range(len(rof) - 1):
        a, b = int(rof[j]), int(rof[j + 1])
        if by_gap:
            b = a + int(gap_draw_round(queue, smeta, tree, tsize, uniforms[a:b], order[a:b]))
        blocks = order[a:b]
        num, s_i, s_s = _rounds_directions(K, R, rscr, blocks, state.n_total, bgaps)
        sums = torch.tensor([s_i, s_s, float(len(blocks))], dtype=torch.float64)
        V, _, gamma, tau = state._round_step(P * scale, sums, plan.step_code, plan.rounds.reduce)
        if tau == 0:  # gap sampling: every estimate is zero on every process
            break
        if gamma != 0.0 and len(blocks):
            _rounds_move(K, R, rscr, blocks, gamma, state.n_total, state.avg_t, bool(plan.averaging))
        if gamma != 0.0:
            state.v.add_(V, alpha=-gamma)
        _rounds_clear(K, R)
        if by_gap:
            for q in range(len(blocks)):
                est_set(est, tree, tsize, int(blocks[q]), float(bgaps[q]), power, True)
        rgaps[j] = num
        state.k += tau
        state.avg_t += 1
        taken += 1
        stepped += tau
    return taken, stepped
