"""Step-size formulas shared by the solvers and the compiled step kernels (numba-compiled, callable from Python).
Step codes: ``LINE_SEARCH = 0``, ``FIXED = 1``.
"""
from __future__ import annotations

import numpy as np
from numba import njit

LINE_SEARCH = 0
FIXED = 1


@njit(cache=True)
def line_search_step(num: float, den: float) -> float:
    """Exact line search on the SSVM dual, clipped to [0, 1]: ``num`` the gap ``lam <w_i - w_s, w> - l_i + l_s``,
    ``den = lam ||w_i - w_s||^2``; ``den = 0``: 1 if ``num > 0``, else 0 (pitfall 5 of the reference note)."""
    if den <= 0.0:
        return 1.0 if num > 0.0 else 0.0
    g = num / den
    if g < 0.0:
        return 0.0
    if g > 1.0:
        return 1.0
    return g


@njit(cache=True)
def fixed_block_step(k: int, n: int) -> float:
    """The predefined BCFW step ``2n / (k + 2n)`` for global iteration ``k`` (batch FW: ``n = 1``)."""
    return 2.0 * n / (k + 2.0 * n)


@njit(cache=True)
def minibatch_fixed_step(k: int, n: int, tau: int) -> float:
    """The fixed step of mini-batch BCFW (Wang et al. 2016): ``min(1, 2 n tau / (tau k + 2 n))`` after ``k`` block
    steps; ``fixed_block_step(k, n)`` at ``tau = 1``."""
    g = 2.0 * n * tau / (tau * k + 2.0 * n)
    return 1.0 if g > 1.0 else g


@njit(cache=True)
def minibatch_step_size(code: int, num: float, den: float, k: int, n: int, tau: int) -> float:
    """The step of a mini-batch round: the clipped line search (``LINE_SEARCH``) or :func:`minibatch_fixed_step`."""
    if code == 0:
        return line_search_step(num, den)
    return minibatch_fixed_step(k, n, tau)


@njit(cache=True)
def step_size(code: int, num: float, den: float, k: int, n: int) -> float:
    """Dispatch on the step-rule code (``LINE_SEARCH`` or ``FIXED``)."""
    if code == 0:
        return line_search_step(num, den)
    return fixed_block_step(k, n)


def _lazy_weight(clock, last):
    return 0.5 * (clock * (clock + 1.0) - last * (last + 1.0))


#: ``sum_{t=last+1..clock} t``: the weight in the lazy average of a block last changed at ``last`` that changes again
#: at ``clock`` (one definition for every loop; ``lazy_weight.py_func`` takes tensors of ``last``).
lazy_weight = njit(cache=True)(_lazy_weight)


@njit(cache=True)
def cache_hit(ghat: float, est_i: float, F: float, glob_thr: float) -> bool:
    """Alg. 5's cache test (Osokin et al. 2016): ``ghat >= max(F g_i, glob_thr)``, ``glob_thr = (nu/n) g_global``; a
    block never measured (``g_i = inf``), or ``F = inf`` with ``g_i > 0``, always calls the oracle."""
    thr = glob_thr
    if est_i == np.inf or (F == np.inf and est_i > 0.0):
        thr = np.inf
    elif F * est_i > thr:
        thr = F * est_i
    return ghat >= thr


@njit(cache=True)
def average_weight(k: int) -> float:
    """Coefficient ``k (k + 1) / 2`` of iteration ``k``'s update in ``u_K = sum_k k(k+1)/2 (w_{k+1} - w_k)``, with
    ``wbar_K = w_K - 2 u_K / (K (K+1))`` (Lacoste-Julien et al. 2013, eq. 14)."""
    return 0.5 * k * (k + 1.0)


# ---------------------------------------------------------------------- the commit of a block step (compiled loops)
#: the dual's linear part ``l = sum_i l_i`` and the accumulator ``avg_l_u`` of its weighted average: the record the
#: compiled loops keep them in (a loop may keep more fields in its own record)
TOTALS = np.dtype([("ell", np.float64), ("avg_ell_u", np.float64)])


@njit(cache=True, inline="always")
def touch_average(averaging: bool, clock: int, last, i: int) -> float:
    """Block ``i`` is about to change at ``clock``: the weight ``S`` (:data:`lazy_weight`) with which its current value
    enters the lazy average (0 without ``averaging``), and its clock ``last[i]`` (``int64[n]``) set to ``clock``.
    The compiled twin of :meth:`DualState._avg_touch <torch_bcfw.duals.base.DualState._avg_touch>`."""
    S = 0.0
    if averaging:
        S = lazy_weight(clock, last[i])
        last[i] = clock
    return S


@njit(cache=True, inline="always")
def commit_ell(totals, block_ell, i: int, ell_i: float, new_ell_i: float, clock: int) -> None:
    """Block ``i``'s ``l_i`` (``block_ell: float64[n]``) goes from ``ell_i`` to ``new_ell_i``; ``l`` and the average's
    accumulator ``avg_l_u`` (``totals[0]``, a :data:`TOTALS` record) follow.  The compiled twin of
    :meth:`DualState._commit_block <torch_bcfw.duals.base.DualState._commit_block>`'s ``l`` part."""
    tot = totals[0]
    block_ell[i] = new_ell_i
    tot.ell += new_ell_i - ell_i
    tot.avg_ell_u += average_weight(clock) * (new_ell_i - ell_i)


@njit(cache=True, inline="always")
def commit_fw_move(gamma: float, ell_s: float, averaging: bool, clock: int, last, block_ell, i: int, totals) -> float:
    """Block ``i`` moves by ``gamma`` towards a corner of loss ``l_s = ell_s``: the lazy average touched
    (:func:`touch_average`) and ``l_i <- (1 - gamma) l_i + gamma l_s`` committed (:func:`commit_ell`).  Returns ``S``,
    the weight of the block's old value in its average accumulator: the caller moves its storage (accumulating ``S``
    times the old value first)."""
    S = touch_average(averaging, clock, last, i)
    ell_i = block_ell[i]
    commit_ell(totals, block_ell, i, ell_i, (1.0 - gamma) * ell_i + gamma * ell_s, clock)
    return S


@njit(cache=True, inline="always")
def fw_commit(step_code: int, num: float, den: float, k: int, n: int, ell_s: float, averaging: bool, clock: int,
              last, block_ell, i: int, totals):
    """The commit of a compiled FW block step, shared by every compiled loop: the step (:func:`step_size` of the gap
    ``num`` and ``den = lam ||w_i - w_s||^2``) and, when it moves, :func:`commit_fw_move`.  Returns ``(gamma, S)``;
    the caller moves its storage by ``gamma``.  The specification is the torch loop,
    :meth:`DualState.block_step <torch_bcfw.duals.base.DualState.block_step>`."""
    gamma = step_size(step_code, num, den, k, n)
    S = 0.0
    if gamma != 0.0:
        S = commit_fw_move(gamma, ell_s, averaging, clock, last, block_ell, i, totals)
    return gamma, S


# ---------------------------------------------------------------------- step rules (Osokin et al. 2016)
#: step-rule codes of the BCFW family: Frank-Wolfe (Alg. 1), pairwise (Alg. 3), away (Alg. 4)
FW_RULE = 0
PAIRWISE_RULE = 1
AWAY_RULE = 2
STEP_RULES = {"fw": FW_RULE, "pairwise": PAIRWISE_RULE, "away": AWAY_RULE}


@njit(cache=True)
def clipped_step(num: float, den: float, gmax: float):
    """Exact line search clipped to ``[0, gmax]``: ``(gamma, hit)``, ``hit`` when the bound was reached (a *drop
    step*); ``den <= 0``: ``gmax`` when ``num > 0``, else 0."""
    if den <= 0.0:
        if num > 0.0:
            return gmax, True
        return 0.0, False
    g = num / den
    if not (g > 0.0):
        return 0.0, False
    if g >= gmax:
        return gmax, True
    return g, False


@njit(cache=True)
def away_max_step(alpha_a: float) -> float:
    """Largest away step ``alpha_a / (1 - alpha_a)`` keeping ``(1 + gamma) alpha - gamma e_a`` feasible."""
    if alpha_a >= 1.0:
        return np.inf
    return alpha_a / (1.0 - alpha_a)


@njit(cache=True)
def away_choice(g_fw: float, g_away: float, n_active: int) -> int:
    """Alg. 4's choice: the FW step when ``g_FW > g_A`` (strict), else the away step; -1: no step
    (``g_A <= 0``, or a single active atom, whose away direction is zero)."""
    if g_fw > g_away:
        return FW_RULE
    if n_active <= 1 or not (g_away > 0.0):
        return -1
    return AWAY_RULE


@njit(cache=True)
def move_bound(rule: int, alpha_a: float) -> float:
    """Largest pairwise (``alpha_a``) or away (:func:`away_max_step`) step off the atom of weight ``alpha_a``."""
    if rule == PAIRWISE_RULE:
        return alpha_a
    return away_max_step(alpha_a)
