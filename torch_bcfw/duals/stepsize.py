"""Step-size formulas shared by the solvers and the compiled step kernels.

Both functions are numba-compiled so a fused step kernel can call them; from Python they
behave like ordinary functions.  Codes used by kernels: ``LINE_SEARCH = 0``, ``FIXED = 1``.
"""
from __future__ import annotations

import numpy as np
from numba import njit

LINE_SEARCH = 0
FIXED = 1


@njit(cache=True)
def line_search_step(num: float, den: float) -> float:
    """Exact line search on the SSVM dual, clipped to [0, 1].

    ``num`` is the block (or batch) gap ``lam <w_i - w_s, w> - l_i + l_s`` and ``den`` is
    ``lam ||w_i - w_s||^2``.  When ``den`` is zero the dual is linear in gamma with slope ``num``,
    so the best step is 1 if ``num > 0`` and 0 otherwise (Lacoste-Julien et al. 2013, pitfall 5
    of the reference note) instead of dividing by machine epsilon.
    """
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
    """The fixed step of mini-batch BCFW (Wang et al. 2016), clipped to 1: ``min(1, 2 n tau / (tau k + 2 n))`` after
    ``k`` block steps (``tau k`` is ``tau^2`` times the rounds); ``fixed_block_step(k, n)`` at ``tau = 1``.  Unclipped
    the schedule starts at ``tau`` and would leave the simplex."""
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


#: ``sum_{t=last+1..clock} t = (clock (clock + 1) - last (last + 1)) / 2``: the weight with which a block that last
#: changed at clock ``last`` enters the lazy weighted average when it changes again at ``clock`` (every step kernel and
#: the torch steps use this one definition; ``lazy_weight.py_func`` takes tensors of ``last``).
lazy_weight = njit(cache=True)(_lazy_weight)


@njit(cache=True)
def cache_hit(ghat: float, est_i: float, F: float, glob_thr: float) -> bool:
    """Alg. 5's cache test (Osokin et al. 2016): the cache corner's block gap ``ghat`` is taken when
    ``ghat >= max(F g_i, (nu/n) g_global)`` (``glob_thr`` the second term); a block never measured
    (``g_i = inf``), or ``F = inf`` with ``g_i > 0``, always calls the oracle."""
    thr = glob_thr
    if est_i == np.inf or (F == np.inf and est_i > 0.0):
        thr = np.inf
    elif F * est_i > thr:
        thr = F * est_i
    return ghat >= thr


@njit(cache=True)
def average_weight(k: int) -> float:
    """Coefficient ``k (k + 1) / 2`` of the update made at iteration ``k`` in the lazy weighted average.

    The weighted average ``wbar_K = 2/(K(K+1)) sum_{t=1..K} t w_t`` (Lacoste-Julien et al. 2013,
    eq. 14) equals ``w_K - 2 u_K / (K (K+1))`` with ``u_K = sum_k k(k+1)/2 * (w_{k+1} - w_k)``:
    ``u`` receives the same (sparse) updates as ``w``, scaled by this coefficient.
    """
    return 0.5 * k * (k + 1.0)


# ---------------------------------------------------------------------- step rules (Osokin et al. 2016)
#: step-rule codes of the BCFW family: Frank-Wolfe (Alg. 1), pairwise (Alg. 3), away (Alg. 4)
FW_RULE = 0
PAIRWISE_RULE = 1
AWAY_RULE = 2
STEP_RULES = {"fw": FW_RULE, "pairwise": PAIRWISE_RULE, "away": AWAY_RULE}


@njit(cache=True)
def clipped_step(num: float, den: float, gmax: float):
    """Exact line search clipped to ``[0, gmax]``; returns ``(gamma, hit)`` with ``hit`` when the clip bound
    was reached (a *drop step* for pairwise / away steps: the away atom leaves the active set).

    ``den <= 0`` (a zero direction in feature space): the dual is linear in gamma, so the step is
    ``gmax`` when ``num > 0`` and 0 otherwise (never a division by machine epsilon).
    """
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
    """Largest step of a pairwise (``alpha_a``) or away (:func:`away_max_step`) move off the atom of weight ``alpha_a``."""
    if rule == PAIRWISE_RULE:
        return alpha_a
    return away_max_step(alpha_a)
