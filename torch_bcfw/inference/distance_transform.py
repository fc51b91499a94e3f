"""Generalized distance transform with a separable quadratic penalty, max form (Felzenszwalb & Huttenlocher 2012).

In 1D, for scores ``f[p]`` on ``p = 0..N-1`` and every query ``q``::

    D[q] = max_p f[p] - (a d**2 + b d),   d = q - p - mu,   arg[q] = the maximising p

with ``a >= 0`` (convex), any ``b`` and offset ``mu``.  In 2D the penalty is an x term plus a y term: the 1D
transform along x, then along y.  Methods: ``"envelope"`` (F&H's linear-time upper envelope, a numba kernel on CPU in
float64; ``a = 0`` takes an ``O(N)`` path), ``"dense"`` (exact ``O(N^2)`` tensor ops in the input dtype and device)
and ``"auto"`` (``"envelope"`` on CPU, ``"dense"`` elsewhere).  Both equal brute force up to rounding; tied positions
may differ.  Scores must be finite (forbid a position with a large negative number, not ``-inf``).
"""

from __future__ import annotations

from typing import Literal

import numba
import numpy as np
import torch
from torch import Tensor

Method = Literal["auto", "envelope", "dense"]

#: Column order of the packed 2D coefficients of :func:`distance_transform_2d_packed`.
PACKED_2D: tuple[str, ...] = ("a_x", "b_x", "mu_x", "a_y", "b_y", "mu_y")

__all__ = ["PACKED_2D", "Method", "distance_transform_2d", "distance_transform_2d_packed"]


@numba.njit(cache=True)
def _envelope_row(f: np.ndarray, a: float, b: float, mu: float, out: np.ndarray, arg: np.ndarray, v: np.ndarray,
                  z: np.ndarray) -> None:
    """1D transform of one row with ``a > 0``; ``v`` (int64[N]) and ``z`` (float64[N+1]) are workspace."""
    n = f.shape[0]
    k = 0
    v[0] = 0
    z[0] = -np.inf
    z[1] = np.inf
    for p in range(1, n):
        s = 0.0
        while k >= 0:
            u = v[k]
            # Query s where the lines of u and p are equal (p wins for larger s).
            s = (f[u] - f[p] - b * (p - u)) / (2.0 * a * (p - u)) + 0.5 * (p + u)
            if s > z[k]:
                break
            k -= 1
        if k < 0:  # p dominates every line kept so far (possible only through overflow)
            k = 0
            z[0] = -np.inf
        else:
            k += 1
            z[k] = s
        v[k] = p
        z[k + 1] = np.inf
    k = 0
    for q in range(n):
        s = q - mu
        while z[k + 1] < s:
            k += 1
        p = v[k]
        d = s - p
        out[q] = f[p] - a * d * d - b * d
        arg[q] = p


@numba.njit(cache=True)
def _linear_row(f: np.ndarray, b: float, mu: float, out: np.ndarray, arg: np.ndarray) -> None:
    """1D transform of one row with ``a == 0`` (linear penalty): one maximiser for all queries."""
    best = 0
    for p in range(1, f.shape[0]):
        if f[p] + b * p > f[best] + b * best:
            best = p
    for q in range(f.shape[0]):
        out[q] = f[best] - b * (q - mu - best)
        arg[q] = best


@numba.njit(cache=True)
def _transform_row(f: np.ndarray, a: float, b: float, mu: float, out: np.ndarray, arg: np.ndarray, v: np.ndarray,
                   z: np.ndarray) -> None:
    """1D transform of one row, dispatching on ``a == 0``; ``v``, ``z`` are workspace of length >= N, N+1."""
    if a == 0.0:
        _linear_row(f, b, mu, out, arg)
    else:
        _envelope_row(f, a, b, mu, out, arg, v, z)


@numba.njit(cache=True)
def _envelope_2d(f: np.ndarray, coeffs: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """2D transform of ``f`` float64[B, G_y, G_x]; ``coeffs`` float64[B, 6] = (a_x, b_x, mu_x, a_y, b_y, mu_y)."""
    batch, gy, gx = f.shape
    n = max(gy, gx)
    v = np.empty(n, np.int64)
    z = np.empty(n + 1, np.float64)
    row_out, row_arg = np.empty(gx, np.float64), np.empty(gx, np.int64)
    col_out, col_arg = np.empty(gy, np.float64), np.empty(gy, np.int64)
    h = np.empty((gx, gy), np.float64)  # x pass, transposed: h[qx, py] = max_px f[py, px] - pen_x
    h_arg = np.empty((gx, gy), np.int64)  # its maximiser px
    out = np.empty((batch, gy, gx), np.float64)
    arg_y = np.empty((batch, gy, gx), np.int64)
    arg_x = np.empty((batch, gy, gx), np.int64)
    for i in range(batch):
        for py in range(gy):
            _transform_row(f[i, py], coeffs[i, 0], coeffs[i, 1], coeffs[i, 2], row_out, row_arg, v, z)
            h[:, py] = row_out
            h_arg[:, py] = row_arg
        for qx in range(gx):
            _transform_row(h[qx], coeffs[i, 3], coeffs[i, 4], coeffs[i, 5], col_out, col_arg, v, z)
            for qy in range(gy):
                out[i, qy, qx] = col_out[qy]
                arg_y[i, qy, qx] = col_arg[qy]
                arg_x[i, qy, qx] = h_arg[qx, col_arg[qy]]
    return out, arg_y, arg_x


def _dense_rows(f: Tensor, coeffs: Tensor) -> tuple[Tensor, Tensor]:
    """1D transform along the last dim of ``f`` [R, N]; ``coeffs`` [R, 3] = (a, b, mu); O(N^2) per row."""
    n = f.shape[-1]
    a, b, mu = coeffs.to(device=f.device, dtype=f.dtype)[:, :, None, None].unbind(dim=1)
    grid = torch.arange(n, device=f.device, dtype=f.dtype)
    d = grid[:, None] - grid[None, :] - mu  # [R, N (query q), N (source p)]
    return (f[:, None, :] - (a * d + b) * d).max(dim=-1)


def _dense_2d(f: Tensor, coeffs: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """2D transform of ``f`` [B, G_y, G_x] as two passes of :func:`_dense_rows`."""
    batch, gy, gx = f.shape
    h, h_arg = _dense_rows(f.reshape(batch * gy, gx), coeffs[:, :3].repeat_interleave(gy, dim=0))
    h_cols = h.reshape(batch, gy, gx).transpose(1, 2).reshape(batch * gx, gy)
    d, arg_y = _dense_rows(h_cols, coeffs[:, 3:].repeat_interleave(gx, dim=0))
    d = d.reshape(batch, gx, gy).transpose(1, 2).contiguous()
    arg_y = arg_y.reshape(batch, gx, gy).transpose(1, 2).contiguous()
    arg_x = h_arg.reshape(batch, gy, gx).gather(1, arg_y)  # px of row py = arg_y, column qx
    return d, arg_y, arg_x


def _check_scores(f: Tensor, dim: int) -> None:
    if f.dim() != dim + 1 or not f.is_floating_point() or f.numel() == 0:
        shape = "[B, G_y, G_x]" if dim == 2 else "[B, N]"
        raise ValueError(f"scores must be a non-empty float tensor {shape}, got {f.dtype} {tuple(f.shape)}")
    if not torch.isfinite(f).all():
        raise ValueError("scores must be finite (use a large negative number to forbid a position)")


def _check_coefficients(coeffs: Tensor, batch: int, names: tuple[str, ...], quadratic: tuple[int, ...]) -> np.ndarray:
    """Validate packed coefficients [batch, len(names)]; return them as a float64 numpy array."""
    if coeffs.shape != (batch, len(names)):
        raise ValueError(f"coefficients must have shape [{batch}, {len(names)}] ({', '.join(names)}), "
                         f"got {tuple(coeffs.shape)}")
    c = np.ascontiguousarray(coeffs.detach().cpu().numpy(), dtype=np.float64)
    if not np.isfinite(c).all():
        raise ValueError(f"coefficients ({', '.join(names)}) must be finite")
    for k in quadratic:
        if (c[:, k] < 0).any():
            raise ValueError(f"{names[k]} must be >= 0 (the penalty must be convex), got {c[:, k].min()}")
    return c


def _pack(batch: int, **values: float | Tensor) -> Tensor:
    """Stack numbers / tensors [B] (or [1], 0-d) into a float64 CPU tensor [batch, len(values)]."""
    columns = []
    for name, value in values.items():
        t = torch.as_tensor(value, dtype=torch.float64).detach().cpu().reshape(-1)
        if t.shape[0] not in (1, batch):
            raise ValueError(f"{name} must be a number or a tensor of shape [{batch}], got {t.shape[0]} values")
        columns.append(t.expand(batch))
    return torch.stack(columns, dim=1)


def _resolve_method(method: Method, device: torch.device) -> Literal["envelope", "dense"]:
    if method == "auto":
        return "envelope" if device.type == "cpu" else "dense"
    if method not in ("envelope", "dense"):
        raise ValueError(f"method must be 'auto', 'envelope' or 'dense', got {method!r}")
    return method


def _numpy_f64(f: Tensor) -> np.ndarray:
    return np.ascontiguousarray(f.detach().cpu().numpy(), dtype=np.float64)


def distance_transform_2d_packed(f: Tensor, coeffs: Tensor, method: Method = "auto") -> tuple[Tensor, Tensor, Tensor]:
    """:func:`distance_transform_2d` with the coefficients packed in one tensor (one call per tree edge).

    ``coeffs``: tensor [B, 6], columns ``PACKED_2D = (a_x, b_x, mu_x, a_y, b_y, mu_y)``, ``a_x, a_y >= 0``; ``f``,
    ``method`` and the result as in :func:`distance_transform_2d`.
    """
    _check_scores(f, 2)
    c = _check_coefficients(coeffs, f.shape[0], PACKED_2D, (0, 3))
    if _resolve_method(method, f.device) == "dense":
        return _dense_2d(f, coeffs)
    out, arg_y, arg_x = _envelope_2d(_numpy_f64(f), c)
    return (torch.from_numpy(out).to(device=f.device, dtype=f.dtype),
            torch.from_numpy(arg_y).to(f.device), torch.from_numpy(arg_x).to(f.device))


def distance_transform_2d(f: Tensor, a_x: float | Tensor, b_x: float | Tensor, a_y: float | Tensor,
                          b_y: float | Tensor, mu_x: float | Tensor = 0.0, mu_y: float | Tensor = 0.0,
                          method: Method = "auto") -> tuple[Tensor, Tensor, Tensor]:
    """Batched 2D transform ``D[qy, qx] = max_{py, px} f[py, px] - (a_x dx^2 + b_x dx + a_y dy^2 + b_y dy)``,
    ``dx = qx - px - mu_x``, ``dy = qy - py - mu_y``.

    Args:
        f: scores, float tensor [B, G_y, G_x], finite.
        a_x, a_y / b_x, b_y / mu_x, mu_y: quadratic coefficients ``>= 0`` / linear coefficients / offsets, numbers
            or tensors [B].
        method: ``"auto"``, ``"envelope"`` or ``"dense"`` (see the module docstring).

    Returns ``(D, arg_y, arg_x)``: ``D`` [B, G_y, G_x] in the dtype and on the device of ``f``, ``arg_y``, ``arg_x``
    LongTensor [B, G_y, G_x] the maximising ``(py, px)`` of every query ``(qy, qx)``.  ``ValueError`` on bad shapes,
    non-finite values or a negative quadratic coefficient.
    """
    _check_scores(f, 2)
    coeffs = _pack(f.shape[0], a_x=a_x, b_x=b_x, mu_x=mu_x, a_y=a_y, b_y=b_y, mu_y=mu_y)
    return distance_transform_2d_packed(f, coeffs, method)
