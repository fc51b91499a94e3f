"""What a solver hands to a dual state for a chunk of composed BCFW iterations, and what comes back.

A :class:`StepPlan` names the parts of one iteration (sampling policy, oracle with an optional working
set and cache test, step rule) and holds the solver-side arrays they work on (gap estimates and their
sum tree, the sampler's queue and pre-drawn randomness).  The generic step loop
(:func:`torch_bcfw.solvers.variants.generic_plan_steps`) runs a plan through the state's public
methods; a state may run it faster in a fused kernel (:meth:`~torch_bcfw.duals.base.DualState.run_plan`, e.g.
the chain's on CPU) and must then give the same trajectory.  Neither side imports the other's module: this file
is the contract.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

__all__ = ["StepPlan", "PlanResult", "ORDER_SAMPLING", "GAP_SAMPLING"]

ORDER_SAMPLING = 0  #: blocks come from ``order`` (uniform / permutation sampling)
GAP_SAMPLING = 1    #: blocks come from the sum tree over the gap estimates (plus the unvisited queue)


@dataclass
class StepPlan:
    """One chunk of iterations.

    Attributes:
        m: maximum number of block iterations.
        rule: step-rule code (``FW_RULE``, ``PAIRWISE_RULE``, ``AWAY_RULE`` of :mod:`torch_bcfw.duals.stepsize`).
        step_code: ``LINE_SEARCH`` or ``FIXED`` (FW steps only).
        averaging: keep the weighted average of the iterates.
        sample_mode: ``ORDER_SAMPLING`` or ``GAP_SAMPLING``.
        order: ``int64[m]`` blocks (``ORDER_SAMPLING``).
        uniforms: ``float64[m]`` uniforms in [0, 1) for the tree draws (``GAP_SAMPLING``).
        queue, smeta: never-visited blocks and the position in ``queue`` (``int64[1]``, updated).
        est, tree, tsize, power: gap estimates ``g_i^(k_i)``, their sum tree over ``est^power``.
        track_est: write the oracle's block gap into ``est`` after every oracle call.
        use_ws: keep the state's working set (active sets / cache).
        cache: test the cache corner before calling the oracle; ``F``, ``glob_thr = (nu / n) g_global``.
        max_size: cache size per block (0: unbounded).
        keep_inactive: keep labelings whose ``alpha`` dropped to 0 (a cache); else the working set is the
            active set exactly.
    """

    m: int
    rule: int
    step_code: int = 0
    averaging: bool = False
    sample_mode: int = ORDER_SAMPLING
    order: np.ndarray | None = None
    uniforms: np.ndarray | None = None
    queue: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    smeta: np.ndarray = field(default_factory=lambda: np.zeros(1, dtype=np.int64))
    est: np.ndarray = field(default_factory=lambda: np.zeros(0))
    tree: np.ndarray = field(default_factory=lambda: np.zeros(2))
    tsize: int = 1
    power: float = 1.0
    track_est: bool = False
    use_ws: bool = False
    cache: bool = False
    F: float = 0.25
    glob_thr: float = np.inf
    max_size: int = 0
    keep_inactive: bool = False


@dataclass
class PlanResult:
    """Outcome of a chunk: iterations done, oracle calls, cache hits, ``need_gap_pass`` (gap sampling found
    every estimate zero), and per iteration the block (``blocks``) and its oracle block gap (``gaps``,
    ``nan`` on a cache hit)."""

    steps: int
    oracle_calls: int
    cache_hits: int
    need_gap_pass: bool
    blocks: np.ndarray
    gaps: np.ndarray
