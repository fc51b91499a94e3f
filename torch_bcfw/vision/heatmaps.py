"""What a dense decoder's outputs mean for pose: joint heatmaps and edge-type maps, and their training losses.

A pose decoder outputs ``[B, C, G, G]`` logits on the ``G x G`` grid of the tree head.  The first ``J`` channels
are joint heatmaps (:func:`log_heatmaps`: a log-softmax over the cells of each; trained towards Gaussian soft
targets, :func:`soft_targets`).  The others may be **edge-type maps** (image-dependent pairwise relations, Chen &
Yuille 2014): for every tree edge ``e`` and a number of types ``K``, ``K`` channels whose softmax over the types at
a cell is the decoder's belief about the relation type of ``e`` (a k-means cluster of the displacements ``child -
parent``, :func:`~torch_bcfw.models.pose.offset_types`) when a joint of ``e`` is at that cell.  Several ``K`` can be
predicted at once (:func:`type_channels`, :func:`split_type_logits`), one separate softmax per ``K``, so that
``K`` can be chosen on held-out images without training one network per ``K``.  :func:`type_loss` is their
cross-entropy against the true types, weighted by the soft targets of both ends of each edge.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor
from torch.nn import functional as F

__all__ = ["log_heatmaps", "soft_targets", "split_type_logits", "type_channels", "type_loss"]


def log_heatmaps(logits: Tensor) -> Tensor:
    """Log-softmax over the cells of every joint map: ``[B, J, G, G]`` -> ``[B, J, G, G]``."""
    B, J, G, _ = logits.shape
    return F.log_softmax(logits.reshape(B, J, -1), dim=-1).reshape(B, J, G, G)


def soft_targets(grid_pos: Tensor, grid_size: int, sigma: float) -> Tensor:
    """Normalised Gaussians of ``sigma`` cells around ``grid_pos`` ``[B, J, 2]`` (y, x): ``[B, J, G, G]``
    (NaN positions give NaN maps: mask them)."""
    g = torch.arange(grid_size, dtype=grid_pos.dtype, device=grid_pos.device)
    dy2 = (g - grid_pos[..., 0, None]).square()[..., :, None]
    dx2 = (g - grid_pos[..., 1, None]).square()[..., None, :]
    t = torch.exp(-(dy2 + dx2) / (2 * sigma * sigma))
    return t / t.sum(dim=(-2, -1), keepdim=True)


def _check_types_list(type_counts: Sequence[int]) -> tuple[int, ...]:
    counts = tuple(int(k) for k in type_counts)
    if any(k < 2 for k in counts) or len(set(counts)) != len(counts):
        raise ValueError(f"type counts must be distinct integers >= 2, got {list(type_counts)}")
    return counts


def type_channels(n_edges: int, type_counts: Sequence[int]) -> int:
    """The decoder channels of the edge-type maps of every ``K`` in ``type_counts``: ``n_edges * sum(K)`` (13
    edges and ``K = 3..8``: 429)."""
    return int(n_edges) * sum(_check_types_list(type_counts))


def split_type_logits(logits: Tensor, n_joints: int, n_edges: int,
                      type_counts: Sequence[int]) -> tuple[Tensor, dict[int, Tensor]]:
    """Split decoder outputs ``[B, J + E sum(K), G, G]`` into joint logits and edge-type log-probabilities.

    Channel layout: the ``J`` joint maps, then for each ``K`` of ``type_counts`` in order a block of ``E K``
    channels, edge-major (channel ``J + E (K_1 + ... + K_{m-1}) + K e + k`` is type ``k`` of edge ``e``).

    Returns ``(joint logits [B, J, G, G] (a view, not normalised), {K: log-probs [B, E, K, G, G]})``: each ``K``'s
    log-softmax over its types at every cell.
    """
    counts = _check_types_list(type_counts)
    if logits.dim() != 4:
        raise ValueError(f"logits must be [B, C, G, G], got {tuple(logits.shape)}")
    B, C, gy, gx = logits.shape
    want = n_joints + type_channels(n_edges, counts) if counts else n_joints
    if C != want:
        raise ValueError(f"expected {n_joints} joint + {n_edges} x {list(counts)} type channels = {want}, got {C}")
    out, start = {}, n_joints
    for K in counts:
        block = logits[:, start : start + n_edges * K].reshape(B, n_edges, K, gy, gx)
        out[K] = F.log_softmax(block, dim=2)
        start += n_edges * K
    return logits[:, :n_joints], out


def type_loss(type_logp: Tensor, types: Tensor, end_targets: Tensor, known: Tensor) -> Tensor:
    """Cross-entropy of the edge-type maps against the true types, at both ends of every edge.

    Args:
        type_logp: ``[B, E, K, G, G]`` log-probabilities over the ``K`` types (:func:`split_type_logits`).
        types: long ``[B, E]``, the true type of every edge (e.g. :func:`~torch_bcfw.models.pose.nearest_types`).
        end_targets: ``[B, E, 2, G, G]``: where to apply the loss for each edge, e.g. the soft targets of its child
            (side 0) and of its parent (side 1), each summing to one.
        known: bool ``[B, E]``: the edges whose type is known (both joints visible).

    Returns the mean over the known edges and both sides of ``-sum_cells end_target * log p(true type)`` (0-d;
    zero when no edge is known).
    """
    B, E, K, G, _ = type_logp.shape
    if types.shape != (B, E) or end_targets.shape != (B, E, 2, G, G) or known.shape != (B, E):
        raise ValueError(f"expected types [B, E] = [{B}, {E}], end_targets [{B}, {E}, 2, {G}, {G}] and known "
                         f"[{B}, {E}], got {tuple(types.shape)}, {tuple(end_targets.shape)}, {tuple(known.shape)}")
    types = types.long()
    if bool(((types[known] < 0) | (types[known] >= K)).any()):
        raise ValueError(f"the types of known edges must be in [0, {K}), got {types[known].unique().tolist()}")
    index = types.where(known, 0)[:, :, None, None, None].expand(B, E, 1, G, G)  # unknown edges: weight 0
    chosen = type_logp.gather(2, index)  # [B, E, 1, G, G]: broadcasts over the two sides
    ce = -(torch.nan_to_num(end_targets) * chosen).sum(dim=(-2, -1))  # [B, E, 2]
    w = known.to(ce.dtype)[..., None]
    return (ce * w).sum() / (2 * known.sum()).clamp(min=1)
