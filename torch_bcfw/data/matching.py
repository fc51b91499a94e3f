"""Sentence pairs for word alignment (:class:`~torch_bcfw.models.matching.Matching`): for every pair ``i`` of
``m_i`` English and ``f_i`` French words, a feature vector ``x_jk in R^F`` per candidate link (``m_i * f_i`` links,
row-major), all pairs concatenated.  A labeling is 0/1 per link (``LongTensor[N_links]``), a partial matching (every
word in at most one link).
"""
from __future__ import annotations

from typing import Sequence

import torch
from torch import Tensor

from ..checks import check_index_tensor, check_not_meta
from .base import as_index, cat_field, check_cat_parts, counts_to_offsets, dense_features, segment_rows

__all__ = ["MatchingData"]


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
            x = dense_features(x, "MatchingData.x", "[N_links, F]")
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
        idx = as_index(idx, len(self))
        links = segment_rows(self.offsets.cpu(), idx)[0].to(self.device)
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
        return cls(*(cat_field(parts, name) for name in ("x", "sizes", "y", "sure", "possible")), check=False)

    def with_features(self, x: Tensor) -> "MatchingData":
        """The same pairs and links with other link features ``x: [N_links, F']`` (validated)."""
        return MatchingData(x, self.sizes, self.y, self.sure, self.possible)
