"""Exact primal and dual values and the duality gap, computed independently of each other.

``primal = lam/2 ||w||^2 + 1/n sum_i max_y H_i(y; w)`` from a full pass of the batched
loss-augmented oracle at a fixed ``w``; ``dual = l - lam/2 ||w||^2`` from the dual state's
``l = b^T alpha`` (valid only when ``w = A alpha``, which the solvers maintain);
``gap = primal - dual >= 0`` certifies ``P(w) - P* <= gap``.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = ["Certificate", "certify", "primal_value", "squared_norm", "task_loss"]


def squared_norm(w: Tensor) -> float:
    """``||w||^2`` in float64, the same bits wherever ``w`` lies in memory: torch's own reduction, not the BLAS dot,
    whose SIMD path depends on the vector's alignment (a resumed run's weights, read from a file, would certify a
    last bit apart from the uninterrupted run's)."""
    w64 = w.to(torch.float64)
    return float((w64 * w64).sum())


@dataclass
class Certificate:
    primal: float
    dual: float | None
    gap: float | None
    y_star: Tensor


def primal_value(model, data, w: Tensor, lam: float) -> tuple[float, Tensor]:
    """``P(w)`` and the oracle answers ``y*`` (one batched oracle pass)."""
    w64 = w.to(torch.float64)
    y_star, H = model.hinge_terms(w64, data)
    return 0.5 * lam * squared_norm(w64) + float(H.mean()), y_star


def certify(model, data, w: Tensor, ell: float | None, lam: float) -> Certificate:
    """Primal, dual and gap of the primal-dual pair ``(w, l)`` (``l = None``: primal only)."""
    primal, y_star = primal_value(model, data, w, lam)
    if ell is None:
        return Certificate(primal, None, None, y_star)
    dual = float(ell) - 0.5 * lam * squared_norm(w)
    return Certificate(primal, dual, primal - dual, y_star)


def task_loss(model, data, w: Tensor) -> float:
    """Mean task loss of the plain (not loss-augmented) prediction at ``w``."""
    y = model.decode(w.to(torch.float64), data)
    return float(model.loss(data, y).mean())
