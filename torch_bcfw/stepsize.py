"""Step-size formulas shared by the solvers and the compiled step kernels.

Both functions are numba-compiled so a fused step kernel can call them; from Python they
behave like ordinary functions.  Codes used by kernels: ``LINE_SEARCH = 0``, ``FIXED = 1``.
"""
from __future__ import annotations

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
def step_size(code: int, num: float, den: float, k: int, n: int) -> float:
    """Dispatch on the step-rule code (``LINE_SEARCH`` or ``FIXED``)."""
    if code == 0:
        return line_search_step(num, den)
    return fixed_block_step(k, n)


@njit(cache=True)
def average_weight(k: int) -> float:
    """Coefficient ``k (k + 1) / 2`` of the update made at iteration ``k`` in the lazy weighted average.

    The weighted average ``wbar_K = 2/(K(K+1)) sum_{t=1..K} t w_t`` (Lacoste-Julien et al. 2013,
    eq. 14) equals ``w_K - 2 u_K / (K (K+1))`` with ``u_K = sum_k k(k+1)/2 * (w_{k+1} - w_k)``:
    ``u`` receives the same (sparse) updates as ``w``, scaled by this coefficient.
    """
    return 0.5 * k * (k + 1.0)
