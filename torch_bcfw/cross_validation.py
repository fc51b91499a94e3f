"""K-fold cross-validation of a structured model: one :func:`~torch_bcfw.fit` per fold, on the other folds.

With out-of-fold features (e.g. heatmaps of a cross-fitted CNN), every training example is predicted by a head
that never saw it::

    fits = torch_bcfw.cross_validate(model, data, folds, lam=0.01, max_passes=20)
    for f in fits:
        pred = model.oracle(f.result.weights, data[f.test_index], loss_augmented=False)

``folds`` gives every example's fold id (any integers, e.g. ``torch.arange(n) % K``).  **Ctrl-C** ends the whole
cross-validation with :class:`CrossValidationInterrupted` (a ``KeyboardInterrupt``) carrying the finished folds:
a partial list is never returned, so no estimate is computed over a cut fit or fewer folds::

    try:
        fits = torch_bcfw.cross_validate(model, data, folds, lam=0.01)
    except torch_bcfw.cross_validation.CrossValidationInterrupted as stop:
        fits = stop.folds        # finished folds only (stop.interrupted: the cut one, or None)

:func:`choose_lam` picks the candidate ``lam`` whose out-of-fold predictions score best.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from .fit import FitResult, fit

__all__ = ["FoldFit", "choose_lam", "cross_validate", "CrossValidationInterrupted"]


@dataclass
class FoldFit:
    """One fold of :func:`cross_validate`: the held-out ``fold`` id, the ascending ``train_index`` /
    ``test_index`` (``LongTensor``) and the ``result`` of the fit on ``data[train_index]``."""

    fold: int
    train_index: Tensor
    test_index: Tensor
    result: FitResult

    @property
    def status(self) -> str:
        """``"finished"``, or ``"interrupted"`` when the fit was cut by Ctrl-C."""
        return "interrupted" if self.result.stopped_by == "interrupted" else "finished"


class CrossValidationInterrupted(KeyboardInterrupt):
    """Raised by :func:`cross_validate` when Ctrl-C cuts a fold's fit (or comes between two fits).

    Attributes:
        folds: the :class:`FoldFit` of every *finished* fold, in the order they were fitted.
        interrupted: the :class:`FoldFit` of the cut fit (its weights solve nothing), or ``None`` when the
            interrupt came outside a fit.
    """

    def __init__(self, folds: list, interrupted: FoldFit | None = None):
        self.folds = list(folds)
        self.interrupted = interrupted
        where = f"during fold {interrupted.fold}" if interrupted is not None else "between folds"
        super().__init__(f"cross-validation interrupted {where}: {len(self.folds)} fold(s) finished")


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

    ``folds``: integer fold id of every example of ``data``, ``[n]`` (at least two distinct ids); ``lam``,
    ``solver`` and ``options`` as :func:`~torch_bcfw.fit`, the same for every fold.  Returns one finished
    :class:`FoldFit` per fold id, in ascending order; Ctrl-C raises :class:`CrossValidationInterrupted`.
    """
    n = len(data)
    if n == 0:
        raise ValueError("cross-validation needs a non-empty dataset")
    folds = _check_folds(folds, n)
    out = []
    try:
        for k in torch.unique(folds).tolist():
            held = folds == k
            train_index, test_index = torch.nonzero(~held).squeeze(1), torch.nonzero(held).squeeze(1)
            result = fit(model, data[train_index], lam, solver, **options)
            fold_fit = FoldFit(int(k), train_index, test_index, result)
            if fold_fit.status == "interrupted":
                raise CrossValidationInterrupted(out, fold_fit)
            out.append(fold_fit)
    except CrossValidationInterrupted:
        raise
    except KeyboardInterrupt as exc:  # outside a fit: between two folds, or while one is set up
        raise CrossValidationInterrupted(out) from exc
    return out


def choose_lam(model, data, lams: Sequence[float], predict: Callable[[Tensor, object], Tensor],
               score: Callable[[Tensor], float], folds=None, solver: str = "bcfw",
               **options) -> tuple[float, dict[float, float]]:
    """The ``lam`` of ``lams`` whose out-of-fold predictions score highest: ``(lam, {lam: score})``.

    For every candidate, :func:`cross_validate` (``folds``: fold id per example, ``[n]``; default 2 folds,
    ``arange(n) % 2``); ``predict(weights, data[test_index])`` -> predictions ``[m, ...]`` of a fold's fit on its
    held-out examples, gathered in ``data``'s order into ``[n, ...]`` and passed to ``score`` (higher is better).
    Ties go to the earlier candidate.
    """
    if not lams:
        raise ValueError("choose_lam needs at least one candidate lam")
    folds = torch.arange(len(data)) % 2 if folds is None else folds
    scores = {}
    for lam in lams:
        pred = None
        for f in cross_validate(model, data, folds, lam, solver, **options):
            p = predict(f.result.weights, data[f.test_index])
            pred = p.new_empty((len(data), *p.shape[1:])) if pred is None else pred
            pred[f.test_index] = p
        scores[lam] = float(score(pred))
    return max(scores, key=scores.get), scores
