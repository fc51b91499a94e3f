"""The checks of arguments that every layer shares: nothing is coerced (``n_features=2.5`` or ``bias="no"`` raise),
a bad value raises a clear error.  The lowest module of the package: it imports nothing of it.
"""
from __future__ import annotations

import numbers
import operator

import numpy as np
import torch
from torch import Tensor

__all__ = ["check_lam", "check_n_total", "check_bounds", "check_finite", "check_int", "check_bool", "check_not_meta",
           "check_input_tensor", "check_index_tensor", "check_offsets", "check_known", "saved_tensor", "saved_int", "saved_float"]


def check_lam(lam: float) -> float:
    """``lam`` as a Python float: a finite real number ``> 0`` (int, float, numpy scalar or 0-d real tensor).
    ``TypeError`` for any other type (bool, str, complex...), ``ValueError`` for NaN, an infinity or ``lam <= 0``."""
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
    ``n_total`` as an int ``>= n`` (a shard of a sharded problem).  ``TypeError`` for a non-integer."""
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


def check_finite(x: Tensor, name: str) -> None:
    """Raise ``ValueError`` if ``x`` holds NaN or infinite values."""
    if x.is_floating_point() and not bool(torch.isfinite(x).all()):
        bad = int((~torch.isfinite(x)).sum())
        raise ValueError(f"{name} contains {bad} NaN or infinite value(s)")


def check_int(value, name: str, minimum: int | None = None) -> int:
    """``value`` as a Python ``int``: an ``int`` or a numpy / 0-d torch integer.  ``TypeError`` for anything else
    (a bool, a float even like ``3.0``, a string), ``ValueError`` when ``value < minimum``."""
    if isinstance(value, (bool, np.bool_)) or (isinstance(value, Tensor) and value.dtype == torch.bool):
        raise TypeError(f"{name} must be an integer, got {value!r} (bool)")
    if isinstance(value, Tensor) and (value.is_floating_point() or value.is_complex()):
        raise TypeError(f"{name} must be an integer, got {value!r}")
    try:
        v = operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an integer, got {value!r} ({type(value).__name__})") from None
    if minimum is not None and v < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {v}")
    return int(v)


def check_bool(value, name: str) -> bool:
    """``value`` as a Python ``bool``: ``True`` / ``False`` or a numpy bool; anything else (``"no"``, ``0``,
    ``1.0``...) raises ``TypeError``."""
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    raise TypeError(f"{name} must be a bool (True or False), got {value!r} ({type(value).__name__})")


def check_not_meta(t, name: str) -> None:
    """``ValueError`` for a tensor on the ``meta`` device (shapes only, no values to check or solve with)."""
    if isinstance(t, Tensor) and t.device.type == "meta":
        raise ValueError(f"{name} is on the meta device (a tensor without data); materialise it on a real device "
                         "(cpu / cuda) first")


def check_input_tensor(t: Tensor, name: str) -> None:
    """The checks every feature tensor of a data container passes: not on the ``meta`` device, real, and not
    requiring grad (the head is solved on fixed features: a backbone's output must be detached)."""
    check_not_meta(t, name)
    if t.is_complex():
        raise ValueError(f"{name} must be real, got a complex tensor ({t.dtype}); pass its real part (x.real) or "
                         "its modulus (x.abs()) explicitly")
    if t.requires_grad:
        raise ValueError(f"{name} requires grad: the head is solved on fixed features, so pass {name.split('.')[-1]}"
                         ".detach() (e.g. the detached output of a backbone)")


def check_index_tensor(t, name: str, device=None) -> Tensor:
    """An integer index tensor (offsets, lengths, edges, example indices; lists / arrays of ints too) as
    ``LongTensor``; a floating-point (even integer-valued), complex, bool or ``meta`` tensor raises ``ValueError``."""
    check_not_meta(t, name)
    out = torch.as_tensor(t) if device is None else torch.as_tensor(t, device=device)
    if out.is_floating_point() or out.is_complex() or out.dtype == torch.bool:
        if out.numel() == 0 and not isinstance(t, Tensor):  # [] is a float tensor for torch: an empty index
            return out.long()
        raise ValueError(f"{name} must hold integers, got {out.dtype}" + (
            f" (values {out.reshape(-1)[:6].tolist()}{' ...' if out.numel() > 6 else ''})" if out.numel() else ""))
    return out.long()


def check_offsets(offsets: Tensor, total: int, name: str, total_name: str | None, unit: str, empty_ok: bool = False,
                  min_len: int = 2) -> None:
    """``ValueError`` unless the ``offsets`` of a packed array are 1-D with ``>= min_len`` entries, run from 0 to
    ``total`` (named ``total_name`` in the message, if given) and are strictly increasing (every ``unit``
    non-empty) or, with ``empty_ok``, non-decreasing."""
    if offsets.dim() != 1 or offsets.numel() < min_len:
        raise ValueError(f"{name} must be 1-D with n + 1 >= {min_len} entries (n {unit}s), got shape "
                         f"{tuple(offsets.shape)}")
    if int(offsets[0]) != 0 or int(offsets[-1]) != total:
        end = total if total_name is None else f"{total_name} = {total}"
        raise ValueError(f"{name} must start at 0 and end at {end}, "
                         f"got {int(offsets[0])} .. {int(offsets[-1])}")
    if bool((offsets.diff() < (0 if empty_ok else 1)).any()):
        raise ValueError(f"{name} must be non-decreasing" if empty_ok
                         else f"{name} must be strictly increasing (every {unit} must have length >= 1)")


# ----------------------------------------------------------------------------- values read from a file
# A saved state reaches compiled kernels that index with its arrays: every value is checked (type, dtype, shape,
# finiteness, range) before use, and a bad one raises ``ValueError`` naming the field and the rule.
_KINDS = {"float": "a floating or integer tensor", "int": "an integer tensor", "bool": "a bool tensor"}


def saved_tensor(value, name: str, shape: tuple, kind: str = "float", finite: bool = True, lo=None,
                 hi=None) -> Tensor:
    """The tensor ``value`` read from a file, checked, as a CPU copy: of ``kind`` (``"float"``: floating or integer,
    returned as float64; ``"int"``: returned as int64; ``"bool"``), of ``shape`` (``None`` entries: any size), finite
    (``finite``, float only) and within ``[lo, hi]`` (``None``: unbounded)."""
    if not isinstance(value, Tensor):
        raise ValueError(f"{name} must be a tensor, got {type(value).__name__}")
    if value.layout != torch.strided or value.is_complex() or value.device.type == "meta":
        raise ValueError(f"{name} must be a dense real tensor, got {value.layout} {value.dtype} on {value.device}")
    ok = {"float": value.dtype != torch.bool, "int": not value.is_floating_point() and value.dtype != torch.bool,
          "bool": value.dtype == torch.bool}[kind]
    if not ok:
        raise ValueError(f"{name} must be {_KINDS[kind]}, got {value.dtype}")
    if len(value.shape) != len(shape) or any(s is not None and int(v) != s for v, s in zip(value.shape, shape)):
        want = "[" + ", ".join("*" if s is None else str(s) for s in shape) + "]"
        raise ValueError(f"{name} must have shape {want}, got {list(value.shape)}")
    out = value.detach().to("cpu", {"float": torch.float64, "int": torch.int64, "bool": torch.bool}[kind], copy=True)
    if kind == "float":
        if finite and not bool(torch.isfinite(out).all()):
            raise ValueError(f"{name} holds NaN or infinite values")
        if bool(torch.isnan(out).any()):
            raise ValueError(f"{name} holds NaN")
    if kind != "bool" and out.numel():
        if lo is not None and bool((out < lo).any()):
            raise ValueError(f"{name} must be >= {lo}, got a minimum of {out.min().item()}")
        if hi is not None and bool((out > hi).any()):
            raise ValueError(f"{name} must be <= {hi}, got a maximum of {out.max().item()}")
    return out


def saved_int(value, name: str, lo: int | None = None, hi: int | None = None) -> int:
    """An integer read from a file (a Python or numpy integer, or a 0-d integer tensor) within ``[lo, hi]``."""
    if isinstance(value, Tensor) and value.ndim == 0 and not value.is_floating_point() and value.dtype != torch.bool:
        value = value.item()
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
        raise ValueError(f"{name} must be an integer, got {value!r} ({type(value).__name__})")
    v = int(value)
    if not -2**63 <= v < 2**63:  # every saved integer is an int64 of an array or a counter
        raise ValueError(f"{name} must be a 64-bit integer, got {v}")
    if (lo is not None and v < lo) or (hi is not None and v > hi):
        raise ValueError(f"{name} must lie in [{lo}, {hi}], got {v}")
    return v


def saved_float(value, name: str, finite: bool = True, lo: float | None = None, hi: float | None = None) -> float:
    """A real number read from a file (a Python or numpy number, or a 0-d real tensor), never NaN, finite unless
    ``finite`` is False, within ``[lo, hi]``."""
    if isinstance(value, Tensor) and value.ndim == 0 and value.dtype != torch.bool and not value.is_complex():
        value = value.item()
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise ValueError(f"{name} must be a real number, got {value!r} ({type(value).__name__})")
    v = float(value)
    if v != v or (finite and not np.isfinite(v)):
        raise ValueError(f"{name} must be a finite number, got {v}")
    if (lo is not None and v < lo) or (hi is not None and v > hi):
        raise ValueError(f"{name} must lie in [{lo}, {hi}], got {v}")
    return v


def check_known(given, allowed, what: str) -> None:
    """``ValueError`` naming the entries of ``given`` (a config section's keys) that are not in ``allowed``."""
    unknown = sorted(set(given) - set(allowed))
    if unknown:
        raise ValueError(f"unknown {what}(s) {unknown}; expected {list(allowed)}")
