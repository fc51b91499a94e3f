"""The composed BCFW iteration of Osokin et al. 2016, generic over models: sampling policy, oracle with
an optional working set (cache), step rule.

:func:`generic_plan_steps` runs a :class:`~torch_bcfw.duals.plan.StepPlan` through the public methods
of any dual state (``block_value``, ``corner_values``, ``block_oracle``, ``block_step``, ``block_move``)
and the shared compiled parts (the sum tree of :mod:`torch_bcfw.duals.sumtree`, the working-set helpers of
:mod:`torch_bcfw.duals.working_set`, the step rules of :mod:`torch_bcfw.duals.stepsize`).  One iteration:

1. **sample** a block: the next of ``order``, or (gap sampling) the next never-visited block, else
   ``i ~ est^p`` from the sum tree; all estimates zero: stop and ask for an exact gap pass;
2. **score the working set** of the block (if kept) at the current ``w``: the cache corner (best plane)
   and the away corner (worst *active* plane);
3. **cache test** (Alg. 5): ``g_hat_i = H(cache corner) - H(alpha_i) >= max(F g_i, (nu/n) g_global)``: a hit
   takes the cache corner, no oracle call, the estimate is left alone; a miss calls the **oracle**, stores
   the exact block gap as the block's estimate (and its tree leaf) and adds the answer to the working set
   (evicting the worst inactive plane when full);
4. **step rule**: FW towards the corner (:meth:`DualState.block_step`, the plain BCFW step), pairwise
   (corner vs away atom, clip ``alpha_a``) or away (Alg. 4: FW if ``g_FW > g_A`` else away, clip
   ``alpha_a / (1 - alpha_a)``), with drop steps; the working set's ``alpha`` follows the same move;
5. without a cache, labelings whose weight became 0 leave the working set (it is the active set).

A state with a fused kernel (:meth:`~torch_bcfw.duals.base.DualState.run_plan`, e.g. the chain's on CPU) runs
the same iteration compiled; tests check both give the same trajectory.
"""
from __future__ import annotations

import numpy as np
import torch

from ..duals.plan import GAP_SAMPLING, PlanResult, StepPlan
from ..duals.working_set import ws_away_update, ws_corners, ws_fw_update, ws_pairwise_update
from ..duals.stepsize import AWAY_RULE, FW_RULE, PAIRWISE_RULE, away_choice, away_max_step
from ..duals.sumtree import est_set, gap_draw

__all__ = ["generic_plan_steps", "run_plan"]


def _as_labels(y, device) -> torch.Tensor:
    return torch.as_tensor(np.asarray(y), dtype=torch.long).reshape(-1).to(device)


def generic_plan_steps(state, plan: StepPlan) -> PlanResult:
    """Run ``plan`` on ``state`` one block at a time through the state's public methods."""
    m = int(plan.m)
    gaps = np.full(m, np.nan)
    blocks = np.full(m, -1, dtype=np.int64)
    ws = state.working_set if plan.use_ws else None
    dev = state.w.device
    n_oracle = n_hits = done = 0
    need_pass = False
    for j in range(m):
        if plan.sample_mode == GAP_SAMPLING:
            i = int(gap_draw(plan.queue, plan.smeta, plan.tree, plan.tsize, float(plan.uniforms[j])))
            if i < 0:
                need_pass = True
                break
        else:
            i = int(plan.order[j])
        blocks[j] = i
        h_i = state.block_value(i)
        jmax = jmin = -1
        nact = 0
        hit = False
        if ws is not None:
            ys = ws.labelings(i)
            ws.scores(i)[:] = state.corner_values(i, ys)
            jmax, jmin, nact = (int(v) for v in ws_corners(i, ws.start, ws.size, ws.key, ws.fl))
            if plan.cache:
                ghat = float(ws.scores(i)[jmax]) - h_i
                est_i = float(plan.est[i])
                if est_i == np.inf or (plan.F == np.inf and est_i > 0.0):
                    thr = np.inf
                else:
                    thr = max(plan.glob_thr, plan.F * est_i)
                hit = ghat >= thr
        if hit:
            n_hits += 1
            j_s = jmax
            y_s = _as_labels(ws.labeling(i, j_s), dev)
            h_s = float(ws.scores(i)[j_s])
        else:
            n_oracle += 1
            y_s = state.block_oracle(i)
            h_s = float(state.corner_values(i, [y_s.cpu().numpy()])[0])
            g = h_s - h_i
            gaps[j] = g
            if plan.track_est:
                est_set(plan.est, plan.tree, plan.tsize, i, g, plan.power, plan.sample_mode == GAP_SAMPLING)
            j_s = -1
            if ws is not None:
                ynp = y_s.cpu().numpy()
                j_s = ws.find(i, ynp)
                if j_s < 0:
                    ell_s = float(state.model.loss(state.block_data(i), y_s)[0]) / state.n
                    j_s = ws.insert(i, ynp, ell_s, plan.max_size, plan.rule != FW_RULE)
                    ws.scores(i)[j_s] = h_s
        kind = plan.rule
        if plan.rule == AWAY_RULE:
            kind = int(away_choice(h_s - h_i, h_i - float(ws.scores(i)[jmin]), nact))
        if kind == FW_RULE:
            _, gamma = state.block_step(i, y_s, plan.step_code, plan.averaging)
            if ws is not None and gamma != 0.0:
                ws_fw_update(i, j_s, gamma, ws.start, ws.size, ws.fl)
        elif kind in (PAIRWISE_RULE, AWAY_RULE) and not (kind == PAIRWISE_RULE and jmin == j_s):
            alpha_a = float(ws.alphas(i)[jmin])
            gmax = alpha_a if kind == PAIRWISE_RULE else float(away_max_step(alpha_a))
            y_a = _as_labels(ws.labeling(i, jmin), dev)
            _, gamma, drop = state.block_move(i, y_s, y_a, kind, gmax, averaging=plan.averaging)
            if gamma != 0.0:
                if kind == PAIRWISE_RULE:
                    ws_pairwise_update(i, j_s, jmin, gamma, drop, ws.start, ws.fl)
                else:
                    ws_away_update(i, jmin, gamma, drop, ws.start, ws.size, ws.fl)
        else:
            state.skip_step()
        if ws is not None and not plan.keep_inactive:
            ws.drop_inactive(i)
        done += 1
    return PlanResult(steps=done, oracle_calls=n_oracle, cache_hits=n_hits, need_gap_pass=need_pass,
                      blocks=blocks[:done], gaps=gaps[:done])


def run_plan(state, plan: StepPlan, generic: bool = False) -> PlanResult:
    """Run ``plan`` in the state's fused kernel when it has one (and ``generic`` is False), else generically."""
    if not generic and state.can_run_plan():
        return state.run_plan(plan)
    return generic_plan_steps(state, plan)
