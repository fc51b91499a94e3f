"""Exact max-sum on a pose tree whose edges have mixture types (Yang & Ramanan 2011, Chen & Yuille 2014).

With ``K`` *types* per edge, each with its own offset, deformation weights and bias, a configuration is a position
``l_j`` per joint and a type ``t_e`` per edge::

    score(l, t) = sum_j unary[j, l_j]
                + sum_{e = (parent, child)} ( b[e, t_e] - <w[e, t_e], deformation_features(l_child, l_parent, mu[e, t_e])> )

(:func:`~torch_bcfw.inference.tree.deformation_features` relative to the type's offset).  A type enters only its
own edge's term, so every message is the pointwise maximum over ``k`` of ``K`` distance transforms of the child's
belief, each shifted by ``b[e, k]``: ``O(K J P)`` per image.  Ties between types go to the lowest type index.

An optional ``type_unary`` ``[B, E, K, 2, G_y, G_x]`` (image-dependent pairwise relations, Chen & Yuille 2014) adds
a score at the child's cell (side 0) and at the parent's cell (side 1)::

    score(l, t) += sum_e ( type_unary[e, t_e, 0, l_child] + type_unary[e, t_e, 1, l_parent] )
"""
from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from .distance_transform import Method, distance_transform_2d_packed
from .tree import (LSP_TREE_EDGES, Edges, check_convex_deformation, check_pose_unary, edge_ends, message_coefficients,
                   tree_order)

__all__ = ["MixtureTreeMaxSum", "mixture_tree_max_sum", "select_types", "type_end_scores"]


class MixtureTreeMaxSum(NamedTuple):
    """``positions`` LongTensor [B, J, 2] (y, x), ``types`` LongTensor [B, E] (per edge), ``score`` [B]."""

    positions: Tensor
    types: Tensor
    score: Tensor


def _mixture_parameters(w: Tensor, b: Tensor, mu: Tensor, batch: int,
                        num_edges: int) -> tuple[Tensor, Tensor, Tensor, int]:
    """Broadcast ``w`` ([E, K, 4] or [B, E, K, 4]), ``b`` ([E, K] / [B, E, K]) and ``mu`` ([E, K, 2] / [B, E, K, 2])
    to batch shape; returns them and ``K``."""
    w, b, mu = torch.as_tensor(w), torch.as_tensor(b), torch.as_tensor(mu)
    if w.dim() not in (3, 4) or w.shape[-1] != 4 or w.shape[-3] != num_edges:
        raise ValueError(f"w must have shape [{num_edges}, K, 4] or [B, {num_edges}, K, 4], got {tuple(w.shape)}")
    K = int(w.shape[-2])
    if K < 1:
        raise ValueError("each edge needs at least one type (K >= 1)")
    for name, t, tail in (("w", w, (num_edges, K, 4)), ("b", b, (num_edges, K)), ("mu", mu, (num_edges, K, 2))):
        lead = t.dim() - len(tail)
        if lead not in (0, 1) or tuple(t.shape[lead:]) != tail or (lead == 1 and t.shape[0] != batch):
            raise ValueError(f"{name} must have shape {list(tail)} or [{batch}, {', '.join(map(str, tail))}], "
                             f"got {tuple(t.shape)}")
        if not torch.isfinite(t).all():
            raise ValueError(f"{name} must be finite")
    return (w.expand(batch, num_edges, K, 4), b.expand(batch, num_edges, K), mu.expand(batch, num_edges, K, 2), K)


def _check_type_unary(type_unary: Tensor | None, unary: Tensor, num_edges: int, K: int) -> Tensor | None:
    if type_unary is None:
        return None
    B, _, gy, gx = unary.shape
    shape = (B, num_edges, K, 2, gy, gx)
    if tuple(type_unary.shape) != shape:
        raise ValueError(f"type_unary must have shape {list(shape)} ([B, E, K, child/parent side, G_y, G_x]), "
                         f"got {tuple(type_unary.shape)}")
    if type_unary.device != unary.device:
        raise ValueError(f"type_unary is on {type_unary.device} but unary on {unary.device}")
    if not torch.isfinite(type_unary).all():
        raise ValueError("type_unary must be finite")
    return type_unary.to(unary.dtype)


def select_types(maps: Tensor, types: Tensor) -> Tensor:
    """The maps of each edge's own type: ``maps [B, E, K, ...]``, ``types`` long ``[B, E]`` -> ``[B, E, ...]``."""
    index = types.reshape(types.shape + (1,) * (maps.dim() - 2)).expand(maps.shape[:2] + (1,) + maps.shape[3:])
    return maps.gather(2, index).squeeze(2)


def type_end_scores(type_unary: Tensor, cells: Tensor, types: Tensor, edges: Edges = LSP_TREE_EDGES) -> Tensor:
    """``[B, E, 2]``: ``type_unary [B, E, K, 2, G_y, G_x]`` at ``types[b, e]`` (long ``[B, E]``) and the child's
    (side 0) and the parent's (side 1) flat cell ``y * G_x + x`` of edge ``e`` (``cells``: long ``[B, J]``)."""
    B, E = types.shape
    parents, children = edge_ends(edges, cells.device)
    chosen = select_types(type_unary, types).reshape(B, E, 2, -1)  # [B, E, 2, G_y G_x]
    ends = torch.stack((cells[:, children], cells[:, parents]), dim=-1)  # [B, E, 2]
    return chosen.gather(3, ends[..., None]).squeeze(3)


def mixture_tree_max_sum(unary: Tensor, w: Tensor, b: Tensor, mu: Tensor, edges: Edges = LSP_TREE_EDGES,
                         method: Method = "auto", type_unary: Tensor | None = None) -> MixtureTreeMaxSum:
    """Exact MAP positions and edge types of the mixture tree model (see the module docstring).

    Arguments as :func:`~torch_bcfw.inference.tree.tree_max_sum` with a type axis: ``w`` [E, K, 4] or
    [B, E, K, 4], ``mu`` [E, K, 2] or [B, E, K, 2]; type biases ``b`` [E, K] or [B, E, K]; optional ``type_unary``
    [B, E, K, 2, G_y, G_x] (finite, on the device of ``unary``; see the module docstring).

    Returns :class:`MixtureTreeMaxSum` (positions [B, J, 2], types [B, E], score [B] in the dtype of ``unary``).

    Raises ``ValueError`` on bad shapes, non-finite parameters, an invalid tree or a negative quadratic weight.
    """
    check_pose_unary(unary)
    batch, num_nodes, _, gx = unary.shape
    root, order = tree_order(edges, num_nodes)
    E = len(edges)
    w, b, mu, K = _mixture_parameters(w, b, mu, batch, E)
    check_convex_deformation(w.reshape(batch, E * K, 4))
    tu = _check_type_unary(type_unary, unary, E, K)
    coeffs = message_coefficients(w.reshape(batch, E * K, 4), mu.reshape(batch, E * K, 2))  # [E*K, B, 6]
    bias = b.to(unary.device, unary.dtype)
    belief = list(unary.unbind(dim=1))
    best_child: dict[int, Tensor] = {}  # edge -> flat child position [B, P] per flat parent position
    best_type: dict[int, Tensor] = {}  # edge -> type [B, P] per flat parent position
    for e in reversed(order):  # leaves first
        parent, child = edges[e]
        message = arg = kind = None
        for k in range(K):
            source = belief[child] if tu is None else belief[child] + tu[:, e, k, 0]
            m, arg_y, arg_x = distance_transform_2d_packed(source, coeffs[e * K + k], method)
            m = m + bias[:, e, k, None, None]
            if tu is not None:
                m = m + tu[:, e, k, 1]
            m = m.reshape(batch, -1)
            flat = (arg_y * gx + arg_x).reshape(batch, -1)
            if message is None:
                message, arg, kind = m, flat, torch.zeros_like(flat)
            else:
                better = m > message  # ties keep the lower type
                message = torch.where(better, m, message)
                arg = torch.where(better, flat, arg)
                kind = torch.where(better, torch.full_like(kind, k), kind)
        belief[parent] = belief[parent] + message.reshape(belief[parent].shape)
        best_child[e], best_type[e] = arg, kind
    score, root_flat = belief[root].reshape(batch, -1).max(dim=1)
    flat = torch.empty(batch, num_nodes, dtype=torch.long, device=unary.device)
    types = torch.empty(batch, E, dtype=torch.long, device=unary.device)
    flat[:, root] = root_flat
    for e in order:  # root to leaves
        parent, child = edges[e]
        at = flat[:, parent, None]
        flat[:, child] = best_child[e].gather(1, at).squeeze(1)
        types[:, e] = best_type[e].gather(1, at).squeeze(1)
    return MixtureTreeMaxSum(torch.stack((flat // gx, flat % gx), dim=-1), types, score)
