"""K-fold cross-validation of a structured model: one :func:`~torch_bcfw.fit` per fold, on the other folds.

Typical use is an honest estimate of what a head gains over a baseline on the *training* images, next to the
test split: with out-of-fold features (e.g. heatmaps of a cross-fitted CNN, where no image's features come from
a network that saw it), every training image is predicted by a head that never saw it either::

    fits = torch_bcfw.cross_validate(model, data, folds, lam=0.01, max_passes=20)
    for f in fits:
        pred = model.oracle(f.result.weights, data[f.test_index], loss_augmented=False)

``folds`` gives every example's fold id (any integers; e.g. ``torch.arange(n) % K``); fold ``k``'s fit trains
on every example whose id is not ``k``, with the same solver and options for every fold.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from .fit import FitResult, fit

__all__ = ["FoldFit", "cross_validate"]


@dataclass
class FoldFit:
    """One fold of :func:`cross_validate`.

    Attributes:
        fold: the held-out fold id.
        train_index: ``LongTensor[n_train]``, the examples the fit trained on (ascending).
        test_index: ``LongTensor[n_test]``, the held-out examples (ascending).
        result: the :class:`~torch_bcfw.fit.FitResult` of the fit on ``data[train_index]``.
    """

    fold: int
    train_index: Tensor
    test_index: Tensor
    result: FitResult


def _check_folds(folds, n: int) -> Tensor:
    folds = torch.as_tensor(folds)
    if folds.dim() != 1 or folds.numel() != n:
        raise ValueError(f"folds must be a 1-D tensor with one fold id per example ({n}), got shape "
                         f"{tuple(folds.shape)}")
    if folds.is_floating_point() or folds.is_complex() or folds.dtype == torch.bool:
        raise ValueError(f"folds must hold integer fold ids, got dtype {folds.dtype}")
    folds = folds.cpu().long()
    if torch.unique(folds).numel() < 2:
        raise ValueError("cross-validation needs at least 2 distinct folds")
    return folds


def cross_validate(model, data, folds, lam: float, solver: str = "bcfw", **options) -> list[FoldFit]:
    """Fit ``model`` once per fold on the examples outside it (:func:`~torch_bcfw.fit` arguments).

    Args:
        model: a :class:`~torch_bcfw.models.StructuredModel`.
        data: its labelled data (any data class that indexes with a ``LongTensor``), ``n`` examples.
        folds: integer fold id of every example, ``[n]`` (at least two distinct ids).
        lam, solver, **options: as :func:`~torch_bcfw.fit` (the same for every fold).

    Returns:
        One :class:`FoldFit` per distinct fold id, in ascending id order.

    Raises:
        ValueError: ``folds`` of the wrong shape or dtype, or fewer than two folds; whatever :func:`fit`
            raises for the data, ``lam`` or the options.
    """
    n = len(data)
    if n == 0:
        raise ValueError("cross-validation needs a non-empty dataset")
    folds = _check_folds(folds, n)
    out = []
    for k in torch.unique(folds).tolist():
        held = folds == k
        train_index, test_index = torch.nonzero(~held).squeeze(1), torch.nonzero(held).squeeze(1)
        result = fit(model, data[train_index], lam, solver, **options)
        out.append(FoldFit(int(k), train_index, test_index, result))
    return out
