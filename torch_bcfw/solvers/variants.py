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

Plain BCFW is the plan with no refinement (:meth:`~torch_bcfw.duals.plan.StepPlan.plain`): no working set, no
cache, no estimates, FW steps whose block gaps come from the steps themselves.  A state with a fused kernel
(:meth:`~torch_bcfw.duals.base.DualState.run_plan`, e.g. the chain's on CPU) runs the same iteration compiled;
tests check both give the same trajectory.  The loop and the dispatch :func:`run_plan` live with the plan in
:mod:`torch_bcfw.duals.plan` (the dual states run plain plans through them too); this module names them for
the solvers.
"""
from __future__ import annotations

from ..duals.plan import generic_plan_steps, run_plan

__all__ = ["generic_plan_steps", "run_plan"]
