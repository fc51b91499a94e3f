"""Checks of the problem parameters a dual state is built with: ``lam`` and box bounds on the weights."""
from __future__ import annotations

import numbers

import numpy as np
import torch
from torch import Tensor

__all__ = ["check_lam", "check_bounds", "check_n_total"]


def check_lam(lam: float) -> float:
    """``lam`` as a Python float: a real number (int, float, numpy scalar or 0-d real tensor) that is finite and
    ``> 0``.  ``TypeError`` for a bool, a string, a complex number or any other type (nothing is coerced);
    ``ValueError`` for NaN, an infinity or ``lam <= 0``."""
    v = lam
    if isinstance(v, torch.Tensor) and v.ndim == 0 and v.dtype != torch.bool and not v.dtype.is_complex:
        v = v.item()
    elif isinstance(v, np.ndarray) and v.ndim == 0 and v.dtype.kind in "iuf":
        v = v.item()
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, numbers.Real):
        raise TypeError(f"lam must be a real number > 0, got {lam!r} ({type(lam).__name__})")
    v = float(v)
    if not np.isfinite(v) or v <= 0.0:
        raise ValueError(f"lam must be a finite number > 0, got {v}")
    return v


def check_n_total(n_total, n: int) -> int:
    """The problem's number of examples: ``n`` (the state's own blocks) when ``n_total`` is ``None``, else
    ``n_total`` as an int ``>= n`` (a state holding one shard of a sharded problem scales its blocks by the
    problem's ``1 / (lam n_total)`` and ``L_i / n_total``).  ``TypeError`` for a non-integer, ``ValueError`` for
    ``n_total < n``."""
    if n_total is None:
        return int(n)
    if isinstance(n_total, (bool, np.bool_)) or not isinstance(n_total, numbers.Integral):
        raise TypeError(f"n_total must be an int, got {n_total!r} ({type(n_total).__name__})")
    if int(n_total) < n:
        raise ValueError(f"n_total = {n_total} is smaller than the state's {n} examples")
    return int(n_total)


def check_bounds(lower, upper, d: int, device) -> tuple[Tensor, Tensor]:
    """Validate box bounds: ``Tensor[d]`` (or scalars, or ``None`` = unbounded), no NaN, ``lower <= upper``.

    Returns float64 tensors on ``device`` (``-inf`` / ``+inf`` where unbounded).
    """
    def one(b, fill, name):
        if b is None:
            return torch.full((d,), fill, dtype=torch.float64, device=device)
        b = torch.as_tensor(b, dtype=torch.float64)
        if b.dim() == 0:
            b = b.expand(d)
        if b.shape != (d,):
            raise ValueError(f"{name} bound must have shape [{d}] (one entry per weight), got {tuple(b.shape)}")
        if bool(torch.isnan(b).any()):
            raise ValueError(f"{name} bound contains NaN")
        return b.to(device).clone()

    lo, hi = one(lower, -np.inf, "lower"), one(upper, np.inf, "upper")
    if bool((lo > hi).any()):
        j = int(torch.nonzero(lo > hi)[0, 0])
        raise ValueError(f"lower bound exceeds upper bound at weight {j}: {float(lo[j])} > {float(hi[j])}")
    if bool((lo == np.inf).any()) or bool((hi == -np.inf).any()):
        raise ValueError("a lower bound of +inf or an upper bound of -inf leaves no feasible weight")
    return lo, hi

