"""Alignment error rate (Och & Ney 2003), precision and recall with sure and possible links.

For predicted links ``A`` and gold links ``S`` (sure) ``subset of P`` (possible, which includes the sure ones)::

    precision = |A & P| / |A|        recall = |A & S| / |S|
    AER = 1 - (|A & S| + |A & P|) / (|A| + |S|)

Corpus level: the counts are summed over all sentence pairs before dividing (never an average of per-pair
rates).  Empty denominators: precision is 0 when nothing is predicted (AER is then 1), recall is 0 when there is
no sure link, and AER is 0 when there are neither predicted nor sure links.  ``P`` is taken as ``P | S`` whatever
is passed, so a possible set given without its sure links is fine.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence

import torch
from torch import Tensor

__all__ = ["AlignmentScores", "alignment_counts", "alignment_scores", "alignment_scores_from_labelings"]


@dataclass(frozen=True)
class AlignmentScores:
    """Corpus-level counts and rates (fractions in ``[0, 1]``)."""

    predicted: int  # |A|
    sure: int  # |S|
    hit_sure: int  # |A & S|
    hit_possible: int  # |A & P|
    precision: float
    recall: float
    aer: float

    def as_dict(self) -> dict:
        return {"aer": self.aer, "precision": self.precision, "recall": self.recall, "predicted": self.predicted,
                "sure": self.sure, "hit_sure": self.hit_sure, "hit_possible": self.hit_possible}


def alignment_counts(predicted: Iterable, sure: Iterable, possible: Iterable) -> tuple[int, int, int, int]:
    """``(|A|, |S|, |A & S|, |A & P|)`` for one sentence pair's link sets (any hashable links, e.g. ``(j, k)``)."""
    A, S = set(predicted), set(sure)
    P = set(possible) | S
    return len(A), len(S), len(A & S), len(A & P)


def _scores(a: int, s: int, a_s: int, a_p: int) -> AlignmentScores:
    precision = a_p / a if a else 0.0
    recall = a_s / s if s else 0.0
    aer = 1.0 - (a_s + a_p) / (a + s) if (a + s) else 0.0
    return AlignmentScores(a, s, a_s, a_p, precision, recall, aer)


def alignment_scores(predicted: Sequence[Iterable], sure: Sequence[Iterable],
                     possible: Sequence[Iterable]) -> AlignmentScores:
    """Corpus AER / precision / recall from per-pair link sets (``predicted[i]``, ``sure[i]``, ``possible[i]``).

    The links of one pair must be in one orientation (e.g. (English, French) positions); ``possible[i]`` may or may
    not include ``sure[i]``.
    """
    if not (len(predicted) == len(sure) == len(possible)):
        raise ValueError(f"got {len(predicted)} predicted, {len(sure)} sure and {len(possible)} possible link sets; "
                         "one of each per sentence pair")
    counts = [alignment_counts(a, s, p) for a, s, p in zip(predicted, sure, possible)]
    return _scores(*[sum(c[t] for c in counts) for t in range(4)])


def alignment_scores_from_labelings(data, y: Tensor) -> AlignmentScores:
    """Corpus scores of a 0/1 labeling ``y [N_links]`` of a :class:`~torch_bcfw.data.matching.MatchingData`
    against its ``sure`` and ``possible`` links (``ValueError`` when the data has none)."""
    if data.sure is None or data.possible is None:
        raise ValueError("the data holds no gold sure / possible links (MatchingData.sure / .possible are None)")
    y = torch.as_tensor(y, device=data.device).reshape(-1)
    if y.shape[0] != data.n_links:
        raise ValueError(f"expected {data.n_links} link labels, got {y.shape[0]}")
    A = y.bool()
    S = data.sure
    P = data.possible | S
    return _scores(int(A.sum()), int(S.sum()), int((A & S).sum()), int((A & P).sum()))
