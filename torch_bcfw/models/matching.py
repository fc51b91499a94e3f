"""Bipartite matching SSVM: word alignment (Taskar, Lacoste-Julien & Klein 2005; the "matching" task of the BCFW
paper, Lacoste-Julien et al. 2013, Sec. 6 and App. F).

Data: a :class:`~torch_bcfw.data.matching.MatchingData` holds, for every sentence pair ``i`` of ``m_i`` English and
``f_i`` French words, a feature vector ``x_jk in R^F`` per candidate link (``m_i * f_i`` links, row-major), all pairs
concatenated.  A labeling is 0/1 per link (``LongTensor[N_links]``), a partial matching (every word in at most one link).

* joint feature ``phi(x_i, y) = 1/Z_i sum_jk y_jk x_jk`` (``d = F``);
* loss (App. F): ``L_i(y) = 1/Z_i (extra_cost * #extra links + miss_cost * #missed true links)``;
* ``Z_i = m_i + f_i`` (``normalize="words"``, default; ``shared/reference/word_alignment_matching.md``) or 1
  (``normalize="none"``);
* oracle: loss-augmented decoding adds ``c_jk`` (``extra_cost`` off the truth, ``-miss_cost`` on it) to the link
  scores; each pair is solved exactly by :func:`max_weight_matching`.

The training truth must be a matching (:func:`torch_bcfw.datasets.hansards.matching_target`).  Requires scipy
(``pip install torch_bcfw[alignment]``).
"""
from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from ..checks import check_int
from ..data.matching import MatchingData
from .base import StructuredModel

__all__ = ["Matching", "max_weight_matching", "NORMALIZATIONS"]

NORMALIZATIONS = ("words", "none")


def max_weight_matching(S: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A maximum-weight partial matching of the ``m x f`` score matrix ``S``: ``(rows, cols)`` of its links.

    :func:`scipy.optimize.linear_sum_assignment` on the ``(m + f) x (f + m)`` cost matrix ``[[-S, N_e], [N_f, 0]]``
    (a private "unaligned" slot of cost 0 per word, forbidden elsewhere).  Links of score ``<= 0`` are dropped.
    """
    from scipy.optimize import linear_sum_assignment

    S = np.asarray(S, dtype=np.float64)
    m, f = S.shape
    C = np.full((m + f, f + m), np.inf)
    C[:m, :f] = -S
    C[m:, f:] = 0.0
    C[np.arange(m), f + np.arange(m)] = 0.0  # English word j unaligned
    C[m + np.arange(f), np.arange(f)] = 0.0  # French word k unaligned
    r, c = linear_sum_assignment(C)
    keep = (r < m) & (c < f)
    r, c = r[keep], c[keep]
    pos = S[r, c] > 0
    return r[pos], c[pos]


class Matching(StructuredModel):
    """Word alignment as a maximum-weight bipartite matching (see the module docstring).

    Args:
        n_features: link feature dimension ``F`` (``d = F``).
        miss_cost: cost of a true link left out (a recall error; 3 in the BCFW paper).
        extra_cost: cost of a predicted link not in the truth (a precision error; 1 in the BCFW paper).
        normalize: ``"words"`` (default: joint feature and loss divided by ``m_i + f_i``) or ``"none"``.
    """

    #: the oracle solves an assignment problem per pair: ``preset="auto"`` caches its answers
    expensive_oracle = True

    def __init__(self, n_features: int, miss_cost: float = 3.0, extra_cost: float = 1.0, normalize: str = "words"):
        n_features = check_int(n_features, "n_features", minimum=1)
        for name, v in (("miss_cost", miss_cost), ("extra_cost", extra_cost)):
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not np.isfinite(v) or v < 0:
                raise ValueError(f"{name} must be a finite number >= 0, got {v!r}")
        if miss_cost + extra_cost <= 0:
            raise ValueError("miss_cost and extra_cost cannot both be 0 (the loss would vanish)")
        if normalize not in NORMALIZATIONS:
            raise ValueError(f"normalize must be one of {NORMALIZATIONS}, got {normalize!r}")
        self.n_inputs = n_features
        self.n_features = n_features
        self.miss_cost = float(miss_cost)
        self.extra_cost = float(extra_cost)
        self.normalize = normalize

    def config(self) -> dict:
        return {"n_features": self.n_inputs, "miss_cost": self.miss_cost, "extra_cost": self.extra_cost,
                "normalize": self.normalize}

    def check_data(self, data, require_labels: bool = True) -> None:
        if not isinstance(data, MatchingData):
            raise TypeError(f"Matching expects MatchingData, got {type(data).__name__}")
        if data.n_inputs != self.n_inputs:
            raise ValueError(f"link features have dimension {data.n_inputs} but the model expects {self.n_inputs}")
        self._check_labels(data.y, require_labels)

    def normalizers(self, data: MatchingData) -> Tensor:
        """``Z_i`` per pair (``Tensor[n]``, float64): ``m_i + f_i``, or 1 with ``normalize="none"``."""
        if self.normalize == "words":
            return data.sizes.sum(1).to(torch.float64)
        return torch.ones(len(data), dtype=torch.float64, device=data.device)

    def loss_link_costs(self, data: MatchingData) -> Tensor:
        """``c [N_links]``: ``extra_cost`` off the truth, ``-miss_cost`` on it, so that
        ``Z_i L_i(y) = miss_cost |y_i| + sum_{links of i} y_jk c_jk`` (not normalised)."""
        truth = data.y.to(torch.float64)
        return self.extra_cost - (self.extra_cost + self.miss_cost) * truth

    def loss(self, data: MatchingData, y: Tensor) -> Tensor:
        y = self._flat_labels(data, y, data.n_links, "link labels")
        extra = ((y == 1) & (data.y == 0)).to(torch.float64)
        missed = ((y == 0) & (data.y == 1)).to(torch.float64)
        per_link = self.extra_cost * extra + self.miss_cost * missed
        return self._pair_sum(data, per_link) / self.normalizers(data)

    @staticmethod
    def _pair_sum(data: MatchingData, per_link: Tensor) -> Tensor:
        """``Tensor[n, ...]``: per-link values summed over each pair's links."""
        if len(data) == 1:  # one pair (a BCFW block step): no scatter
            return per_link.sum(0, keepdim=True)
        out = per_link.new_zeros((len(data), *per_link.shape[1:]))
        return out.index_add_(0, data.pair_ids(), per_link)

    def max_loss(self, data: MatchingData) -> Tensor:
        """``max_y L_i(y)`` per pair, exactly (the loss-augmented oracle at ``w = 0``)."""
        return self.loss(data, self._decode_scores(self.loss_link_costs(data), data))

    def link_scores(self, w: Tensor, data: MatchingData) -> Tensor:
        """``s_jk = <w, x_jk>`` for every candidate link: ``Tensor[N_links]`` (float64)."""
        self.check_weights(w, data)
        return data.x.to(torch.float64) @ w.to(torch.float64)

    def _decode_scores(self, s: Tensor, data: MatchingData) -> Tensor:
        """The maximum-weight matching of every pair for link scores ``s [N_links]``: a 0/1 ``LongTensor[N_links]``."""
        s_np = s.detach().to("cpu", torch.float64).numpy()
        off = data.offsets.cpu().numpy()
        sizes = data.sizes.cpu().numpy()
        y = np.zeros(s_np.shape[0], dtype=np.int64)
        for i in range(sizes.shape[0]):
            m, f = int(sizes[i, 0]), int(sizes[i, 1])
            r, c = max_weight_matching(s_np[off[i]: off[i + 1]].reshape(m, f))
            y[off[i] + r * f + c] = 1
        return torch.from_numpy(y).to(data.device)

    def oracle(self, w: Tensor, data: MatchingData, loss_augmented: bool = True) -> Tensor:
        s = self.link_scores(w, data)
        if loss_augmented:
            s = s + self.loss_link_costs(data)
        return self._decode_scores(s, data)

    def score(self, w: Tensor, data: MatchingData, y: Tensor) -> Tensor:
        y = self._flat_labels(data, y, data.n_links, "link labels")
        s = self.link_scores(w, data)
        return self._pair_sum(data, s * y.to(torch.float64)) / self.normalizers(data)

    def hinge_terms(self, w: Tensor, data: MatchingData) -> tuple[Tensor, Tensor]:
        """As :meth:`StructuredModel.hinge_terms`, computing the link scores once."""
        s = self.link_scores(w, data)
        y_star = self._decode_scores(s + self.loss_link_costs(data), data)
        diff = self._pair_sum(data, s * (y_star - data.y).to(torch.float64))
        return y_star, self.loss(data, y_star) + diff / self.normalizers(data)

    def joint_feature(self, data: MatchingData, y: Tensor) -> Tensor:
        y = self._flat_labels(data, y, data.n_links, "link labels")
        if len(data) == 1:
            return (y.to(torch.float64) @ data.x.to(torch.float64))[None] / self.normalizers(data)[:, None]
        sel = torch.nonzero(y)[:, 0]  # the chosen links only
        out = torch.zeros(len(data), self.n_features, dtype=torch.float64, device=data.device)
        out.index_add_(0, data.pair_ids()[sel], data.x[sel].to(torch.float64))
        return out / self.normalizers(data)[:, None]

    def joint_feature_sum(self, data: MatchingData, y: Tensor) -> Tensor:
        y = self._flat_labels(data, y, data.n_links, "link labels")
        weights = y.to(torch.float64) / self.normalizers(data)[data.pair_ids()]
        return weights @ data.x.to(torch.float64)

    def prox_geometry(self, data: MatchingData, lam: float, proj_tol: float, proj_iters: int):
        """Euclidean projections onto the matching polytope (:class:`~torch_bcfw.duals.prox.EuclideanMatchingGeometry`),
        each to a certified distance ``<= proj_tol`` in at most ``proj_iters`` iterations."""
        from ..duals.prox import EuclideanMatchingGeometry

        return EuclideanMatchingGeometry(self, data, lam, proj_tol, proj_iters)
