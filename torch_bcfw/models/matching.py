"""Bipartite matching SSVM: word alignment (Taskar, Lacoste-Julien & Klein 2005; the "matching" task of the BCFW
paper, Lacoste-Julien et al. 2013, Sec. 6 and App. F).

Data: a :class:`MatchingData` holds, for every sentence pair ``i`` of ``m_i`` English and ``f_i`` French words, a
feature vector ``x_jk in R^F`` per candidate link (``m_i * f_i`` links, row-major), all pairs concatenated.  A
labeling is 0/1 per link (``LongTensor[N_links]``), a partial matching (every word in at most one link).

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

from typing import Sequence

import numpy as np
import torch
from torch import Tensor

from ..checks import check_index_tensor, check_int, check_not_meta
from ..data import _as_index, _cat_field, _dense_features, counts_to_offsets, _segment_rows, check_cat_parts
from .base import StructuredModel

__all__ = ["Matching", "MatchingData", "max_weight_matching", "NORMALIZATIONS"]

NORMALIZATIONS = ("words", "none")


def _link_labels(t, name: str, n_links: int, device, dtype: torch.dtype) -> Tensor | None:
    """``t`` (or ``None``) checked to hold one 0/1 or bool entry per candidate link, cast to ``dtype``."""
    if t is None:
        return None
    check_not_meta(t, name)
    t = torch.as_tensor(t, device=device)
    if t.is_floating_point() or t.is_complex():
        raise ValueError(f"{name} must be a 0/1 or bool tensor, got {t.dtype}")
    if t.shape != (n_links,):
        raise ValueError(f"{name} must have one entry per candidate link ({n_links}), got shape {tuple(t.shape)}")
    if t.dtype != torch.bool and n_links and (int(t.min()) < 0 or int(t.max()) > 1):
        raise ValueError(f"{name} must hold 0/1 values, got range [{int(t.min())}, {int(t.max())}]")
    return t.to(dtype)


class MatchingData:
    """Sentence pairs as bipartite graphs of candidate links (see the module docstring).

    Args:
        x: ``[N_links, F]`` link features of all pairs concatenated (floating point, finite), link ``j * f_i + k``
            of pair ``i`` at row ``offsets[i] + j * f_i + k``.
        sizes: integer ``[n, 2]``: ``(m_i, f_i)``, the English and French lengths (each >= 1).
        y: ``[N_links]`` 0/1 training labeling (a matching in every pair), or ``None`` (decoding only).
        sure: ``[N_links]`` bool, the gold *sure* links (may break the one-to-one rule; kept for AER), or ``None``.
        possible: ``[N_links]`` bool, the gold *possible* links; the container stores ``possible | sure`` (AER's
            ``P``, which contains ``S``), or ``None``.
        check: validate (default; sub-datasets of a valid one skip it): ``ValueError`` on bad shapes or dtypes,
            NaN / infinite features, a labeling that is not 0/1 or not a matching.

    Attributes: the arguments and ``offsets``, ``LongTensor[n + 1]`` with ``offsets[i + 1] - offsets[i] = m_i * f_i``.
    """

    def __init__(self, x: Tensor, sizes: Tensor, y: Tensor | None = None, sure: Tensor | None = None,
                 possible: Tensor | None = None, check: bool = True):
        if check:
            check_not_meta(x, "MatchingData.x")
            x = _dense_features(x, "MatchingData.x", "[N_links, F]")
            sizes = check_index_tensor(sizes, "MatchingData.sizes", device=x.device)
            if sizes.dim() != 2 or sizes.shape[1] != 2 or sizes.shape[0] == 0:
                raise ValueError(f"MatchingData.sizes must be [n, 2] (English, French lengths) with n >= 1, "
                                 f"got shape {tuple(sizes.shape)}")
            if bool((sizes < 1).any()):
                i = int(torch.nonzero((sizes < 1).any(1))[0, 0])
                raise ValueError(f"every sentence needs at least one word: pair {i} has sizes {sizes[i].tolist()}")
        self.x = x
        self.sizes = sizes
        self.offsets = counts_to_offsets(sizes[:, 0] * sizes[:, 1])
        if check:
            if int(self.offsets[-1]) != x.shape[0]:
                raise ValueError(f"MatchingData.x has {x.shape[0]} rows but the sizes give sum m_i * f_i = "
                                 f"{int(self.offsets[-1])} candidate links")
            y = _link_labels(y, "MatchingData.y", x.shape[0], x.device, torch.long)
            sure = _link_labels(sure, "MatchingData.sure", x.shape[0], x.device, torch.bool)
            possible = _link_labels(possible, "MatchingData.possible", x.shape[0], x.device, torch.bool)
            if possible is not None and sure is not None:
                possible = possible | sure
            if y is not None:
                self.check_labeling(y, "MatchingData.y")
        self.y = y
        self.sure = sure
        self.possible = possible

    @classmethod
    def from_pairs(cls, xs: Sequence[Tensor], ys: Sequence[Tensor] | None = None,
                   sure: Sequence[Tensor] | None = None, possible: Sequence[Tensor] | None = None) -> "MatchingData":
        """From per-pair link features ``xs[i]: [m_i, f_i, F]`` and optional ``[m_i, f_i]`` 0/1 matrices."""
        if len(xs) == 0:
            raise ValueError("MatchingData is empty (no sentence pairs given)")
        xs = [torch.as_tensor(x) for x in xs]
        for i, x in enumerate(xs):
            if x.dim() != 3:
                raise ValueError(f"pair {i}: link features must be [m, f, F], got shape {tuple(x.shape)}")
        sizes = torch.tensor([[x.shape[0], x.shape[1]] for x in xs], dtype=torch.long)

        def flat(mats, name):
            if mats is None:
                return None
            if len(mats) != len(xs):
                raise ValueError(f"got {len(xs)} pairs of features but {len(mats)} {name} matrices")
            out = []
            for i, (x, t) in enumerate(zip(xs, mats)):
                t = torch.as_tensor(t)
                if t.shape != x.shape[:2]:
                    raise ValueError(f"pair {i}: {name} must be [m, f] = {tuple(x.shape[:2])}, got {tuple(t.shape)}")
                out.append(t.reshape(-1))
            return torch.cat(out).to(xs[0].device)

        return cls(torch.cat([x.reshape(-1, x.shape[-1]) for x in xs]), sizes.to(xs[0].device), flat(ys, "label"),
                   flat(sure, "sure"), flat(possible, "possible"))

    def __len__(self) -> int:
        return self.sizes.shape[0]

    @property
    def device(self) -> torch.device:
        return self.x.device

    @property
    def n_links(self) -> int:
        return self.x.shape[0]

    @property
    def n_inputs(self) -> int:
        """Link feature dimension ``F``."""
        return self.x.shape[1]

    def __repr__(self) -> str:
        return (f"MatchingData(n={len(self)}, links={self.n_links}, F={self.n_inputs}, labelled={self.y is not None}, "
                f"device={self.device})")

    def pair_ids(self) -> Tensor:
        """``LongTensor[N_links]``: the pair of every candidate link (cached; treat the container as immutable)."""
        pid = self.__dict__.get("_pair_ids")
        if pid is None:
            pid = torch.repeat_interleave(torch.arange(len(self), device=self.device), self.offsets.diff())
            self._pair_ids = pid
        return pid

    def link_positions(self) -> tuple[Tensor, Tensor]:
        """``(j, k)``, each ``LongTensor[N_links]``: English and French position of every link in its pair."""
        pid = self.pair_ids()
        local = torch.arange(self.n_links, device=self.device) - self.offsets[:-1][pid]
        f = self.sizes[pid, 1]
        return local // f, local % f

    def link_words(self) -> tuple[Tensor, Tensor]:
        """Global ids of each link's English word (in ``[0, sum m_i)``) and French word (in ``[0, sum f_i)``)."""
        j, k = self.link_positions()
        pid = self.pair_ids()
        first = torch.cumsum(self.sizes, 0) - self.sizes  # [n, 2]: each pair's first English and French word
        return first[pid, 0] + j, first[pid, 1] + k

    def check_labeling(self, y: Tensor, name: str = "labeling") -> None:
        """``ValueError`` unless ``y`` is 0/1 and a matching in every pair (each word in at most one link)."""
        if y.numel() and (int(y.min()) < 0 or int(y.max()) > 1):
            raise ValueError(f"{name} must hold 0/1 per candidate link, got range [{int(y.min())}, {int(y.max())}]")
        ew, fw = self.link_words()
        yf = y.to(torch.long)
        for words, total, side in ((ew, int(self.sizes[:, 0].sum()), "English"),
                                   (fw, int(self.sizes[:, 1].sum()), "French")):
            deg = torch.zeros(total, dtype=torch.long, device=self.device).index_add_(0, words, yf)
            if bool((deg > 1).any()):
                bad = int(torch.nonzero(deg > 1)[0, 0])
                link = int(torch.nonzero((words == bad) & (yf > 0))[0, 0])
                pair = int(torch.searchsorted(self.offsets, torch.tensor(link, device=self.device), right=True)) - 1
                raise ValueError(f"{name} is not a matching: a {side} word of pair {pair} is in {int(deg[bad])} links "
                                 "(every word may take part in at most one link)")

    def pair_matrix(self, t: Tensor, i: int) -> Tensor:
        """Pair ``i``'s slice of a per-link tensor ``t`` as an ``[m_i, f_i, ...]`` matrix."""
        m, f = (int(v) for v in self.sizes[i])
        return t[int(self.offsets[i]): int(self.offsets[i + 1])].reshape(m, f, *t.shape[1:])

    def __getitem__(self, idx) -> "MatchingData":
        """The pairs ``idx`` (an int, a slice, a list or ``LongTensor``; repeats allowed), in that order."""
        idx = _as_index(idx, len(self))
        links = _segment_rows(self.offsets.cpu(), idx)[0].to(self.device)
        pick = lambda t: None if t is None else t[links]  # noqa: E731
        return MatchingData(self.x[links], self.sizes[idx.to(self.device)], pick(self.y), pick(self.sure),
                            pick(self.possible), check=False)

    def to(self, *args, **kwargs) -> "MatchingData":
        """Move to a device and / or cast the link features (``to(device)``, ``to(dtype)``, ``to(device, dtype)``)."""
        x = self.x.to(*args, **kwargs)
        mv = lambda t: None if t is None else t.to(x.device)  # noqa: E731
        return MatchingData(x, self.sizes.to(x.device), mv(self.y), mv(self.sure), mv(self.possible), check=False)

    @classmethod
    def cat(cls, parts: Sequence["MatchingData"]) -> "MatchingData":
        """The pairs of ``parts`` one after another (same ``F`` and device; labels, sure and possible links in all
        or none)."""
        check_cat_parts(cls, parts, lambda p: (p.n_inputs, str(p.device), p.sure is None, p.possible is None))
        return cls(*(_cat_field(parts, name) for name in ("x", "sizes", "y", "sure", "possible")), check=False)

    def with_features(self, x: Tensor) -> "MatchingData":
        """The same pairs and links with other link features ``x: [N_links, F']`` (validated)."""
        return MatchingData(x, self.sizes, self.y, self.sure, self.possible)


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
