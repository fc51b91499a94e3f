"""Exact primal and dual values and the duality gap: ``primal = lam/2 ||w||^2 + 1/n sum_i max_y H_i(y; w)`` from a
full oracle pass at a fixed ``w``; ``dual = l - lam/2 ||w||^2`` with ``l = b^T alpha`` (valid when ``w = A alpha``);
``gap = primal - dual >= 0`` certifies ``P(w) - P* <= gap``.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = ["Certificate", "certify", "primal_value", "squared_norm", "task_loss", "with_dual"]


def squared_norm(w: Tensor) -> float:
    """``||w||^2`` in float64, the same bits wherever ``w`` lies in memory (not the BLAS dot, whose SIMD path depends
    on the vector's alignment)."""
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


def with_dual(primal: float, ell: float | None, lam: float, sq: float, y_star: Tensor) -> Certificate:
    """The certificate of ``primal`` and the dual ``ell - lam/2 sq`` (``sq = ||w||^2``; ``ell = None``: primal only)."""
    if ell is None:
        return Certificate(primal, None, None, y_star)
    dual = float(ell) - 0.5 * lam * sq
    return Certificate(primal, dual, primal - dual, y_star)


def certify(model, data, w: Tensor, ell: float | None, lam: float) -> Certificate:
    """Primal, dual and gap of the primal-dual pair ``(w, l)`` (``l = None``: primal only)."""
    primal, y_star = primal_value(model, data, w, lam)
    return with_dual(primal, ell, lam, squared_norm(w), y_star)


def task_loss(model, data, w: Tensor) -> float:
    """Mean task loss of the plain (not loss-augmented) prediction at ``w``."""
    y = model.decode(w.to(torch.float64), data)
    return float(model.loss(data, y).mean())
