"""Exact max-sum on a tree of grid-valued nodes (pictorial structures for human pose).

Every node ``j`` (a body joint) takes a position ``l_j = (y_j, x_j)`` on a ``G_y x G_x`` grid (always ``(y, x)`` =
(row, column) integer coordinates).  The score of a configuration is::

    score(l) = sum_j unary[j, y_j, x_j] - sum_{e = (parent, child)} (w_e[0] dx + w_e[1] dx^2 + w_e[2] dy + w_e[3] dy^2)
    dx = x_child - x_parent - mu_e[1],   dy = y_child - y_parent - mu_e[0]

(the feature order of Chen & Yuille 2014 and Osokin et al. 2016, 3.5; ``mu_e`` the expected displacement).  The
quadratic weights ``w_e[1], w_e[3]`` must be ``>= 0`` for the distance transform (else ``ValueError``).
:func:`tree_max_sum` passes 2D distance-transform messages from the leaves to the root and backtracks the argmax
tables: ``O(J G_y G_x)`` per image.

``LSP_JOINTS`` lists the 14 joints in the order of LSP's ``joints.mat``; ``LSP_TREE_EDGES`` (root ``LSP_ROOT`` =
neck) hangs the head top and shoulders from the neck, each arm from its shoulder and each hip from its shoulder.
:func:`pose_loss` is the loss of Osokin et al. (2016, 3.5) with the printed ``max`` corrected to ``min``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch
from torch import Tensor

from torch_bcfw.inference.distance_transform import Method, distance_transform_2d_packed

__all__ = ["LSP_JOINTS", "LSP_ROOT", "LSP_TREE_EDGES", "TreeMaxSum", "deformation_features",
           "edge_ends", "pose_loss", "pose_loss_unaries", "tree_max_sum", "tree_score"]

LSP_JOINTS: tuple[str, ...] = (
    "right_ankle", "right_knee", "right_hip", "left_hip", "left_knee", "left_ankle",
    "right_wrist", "right_elbow", "right_shoulder", "left_shoulder", "left_elbow", "left_wrist",
    "neck", "head_top",
)
LSP_ROOT: int = 12  # neck

LSP_TREE_EDGES: tuple[tuple[int, int], ...] = (
    (12, 13),  # neck -> head top
    (12, 8),   # neck -> right shoulder
    (12, 9),   # neck -> left shoulder
    (8, 7),    # right shoulder -> right elbow
    (7, 6),    # right elbow -> right wrist
    (9, 10),   # left shoulder -> left elbow
    (10, 11),  # left elbow -> left wrist
    (8, 2),    # right shoulder -> right hip
    (2, 1),    # right hip -> right knee
    (1, 0),    # right knee -> right ankle
    (9, 3),    # left shoulder -> left hip
    (3, 4),    # left hip -> left knee
    (4, 5),    # left knee -> left ankle
)

Edges = Sequence[tuple[int, int]]


class TreeMaxSum(NamedTuple):
    """Result of max-sum: ``positions`` LongTensor [B, J, 2] in (y, x) grid coordinates, ``score`` [B]."""

    positions: Tensor
    score: Tensor


def deformation_features(child_pos: Tensor, parent_pos: Tensor, mu: Tensor | Sequence[float]) -> Tensor:
    """Deformation features ``(dx, dx^2, dy, dy^2)`` of an edge (the pairwise score is ``-<w_e, features>``),
    ``dx = x_child - x_parent - mu_x``, ``dy = y_child - y_parent - mu_y``, for positions ``[..., 2]`` and expected
    displacements ``mu`` ``[..., 2]`` (broadcastable), all (y, x): ``[..., 4]`` in ``mu``'s float dtype (else the
    default dtype)."""
    mu = torch.as_tensor(mu)
    dtype = mu.dtype if mu.is_floating_point() else torch.get_default_dtype()
    d = child_pos.to(dtype) - parent_pos.to(dtype) - mu.to(device=child_pos.device, dtype=dtype)
    dy, dx = d[..., 0], d[..., 1]
    return torch.stack((dx, dx * dx, dy, dy * dy), dim=-1)


def tree_order(edges: Edges, num_nodes: int) -> tuple[int, list[int]]:
    """Validate that ``edges`` (parent, child) form a tree over ``num_nodes`` nodes; return the root and the
    indices of ``edges`` in top-down order (every edge after the edge that reaches its parent)."""
    if len(edges) != num_nodes - 1:
        raise ValueError(f"a tree over {num_nodes} nodes has {num_nodes - 1} edges, got {len(edges)}")
    children: dict[int, list[int]] = {j: [] for j in range(num_nodes)}
    has_parent = [False] * num_nodes
    for e, (parent, child) in enumerate(edges):
        if not (0 <= parent < num_nodes and 0 <= child < num_nodes) or parent == child:
            raise ValueError(f"edge {e} = {(parent, child)} is not a pair of distinct nodes in [0, {num_nodes})")
        if has_parent[child]:
            raise ValueError(f"node {child} has more than one parent (edge {e})")
        has_parent[child] = True
        children[parent].append(e)
    root = has_parent.index(False)
    order: list[int] = []
    stack = [root]
    while stack:
        for e in children[stack.pop()]:
            order.append(e)
            stack.append(edges[e][1])
    if len(order) != len(edges):
        raise ValueError("edges are not connected: they do not form a tree")
    return root, order


def edge_ends(edges: Edges, device=None) -> tuple[Tensor, Tensor]:
    """``(parents, children)`` of ``(parent, child)`` pairs: ``LongTensor[E]`` each."""
    return (torch.tensor([p for p, _ in edges], dtype=torch.long, device=device),
            torch.tensor([c for _, c in edges], dtype=torch.long, device=device))


def _edge_parameters(w: Tensor, mu: Tensor, batch: int, num_edges: int) -> tuple[Tensor, Tensor]:
    """Broadcast ``w`` ([E, 4] or [B, E, 4]) and ``mu`` ([E, 2] or [B, E, 2]) to [B, E, 4] and [B, E, 2]."""
    w, mu = torch.as_tensor(w), torch.as_tensor(mu)
    for name, t, k in (("w", w, 4), ("mu", mu, 2)):
        if t.dim() not in (2, 3) or tuple(t.shape[-2:]) != (num_edges, k) or (t.dim() == 3 and t.shape[0] != batch):
            raise ValueError(f"{name} must have shape [{num_edges}, {k}] or [{batch}, {num_edges}, {k}], "
                             f"got {tuple(t.shape)}")
        if not torch.isfinite(t).all():
            raise ValueError(f"{name} must be finite")
    return w.expand(batch, num_edges, 4), mu.expand(batch, num_edges, 2)


def check_pose_unary(unary: Tensor) -> None:
    if unary.dim() != 4 or not unary.is_floating_point():
        raise ValueError(f"unary must be a float tensor [B, J, G_y, G_x], got {unary.dtype} {tuple(unary.shape)}")


def check_convex_deformation(w: Tensor) -> None:
    """Raise ``ValueError`` if a quadratic weight ``w[..., e, 1]`` or ``w[..., e, 3]`` is negative."""
    bad = (w[..., [1, 3]] < 0).any(dim=-1).reshape(-1, w.shape[-2]).any(dim=0)
    if bad.any():
        raise ValueError(f"quadratic deformation weights w[e, 1], w[e, 3] must be >= 0 for the distance "
                         f"transform; negative on edges {bad.nonzero().flatten().tolist()}")


def message_coefficients(w: Tensor, mu: Tensor) -> Tensor:
    """Packed distance-transform coefficients [E, B, 6] of the child-to-parent messages: the transform penalises
    ``d = q - p - mu'`` (``q`` parent, ``p`` child), the features use ``-d`` with ``mu' = -mu``, so ``(a, b, mu') =
    (w1, -w0, -mu_x)`` and ``(w3, -w2, -mu_y)`` (column order ``PACKED_2D``)."""
    w, mu = w.detach().to("cpu", torch.float64), mu.detach().to("cpu", torch.float64)
    packed = torch.stack((w[..., 1], -w[..., 0], -mu[..., 1], w[..., 3], -w[..., 2], -mu[..., 0]), dim=-1)
    return packed.transpose(0, 1).contiguous()


def tree_max_sum(unary: Tensor, w: Tensor, mu: Tensor, edges: Edges = LSP_TREE_EDGES,
                 method: Method = "auto") -> TreeMaxSum:
    """Exact MAP configuration of the tree model (see the module docstring for the score).

    Args:
        unary: unary scores [B, J, G_y, G_x], finite.
        w: deformation weights [E, 4] or [B, E, 4], row ``e`` for ``edges[e]``, in the
            order ``(dx, dx^2, dy, dy^2)``; ``w[..., 1], w[..., 3] >= 0``.
        mu: expected displacements child - parent [E, 2] or [B, E, 2], in (y, x) order.
        edges: (parent, child) pairs forming a tree over the J nodes (default: the LSP skeleton).
        method: distance-transform method, see :mod:`torch_bcfw.inference.distance_transform`.

    Returns ``TreeMaxSum(positions [B, J, 2] long (y, x), score [B])``, the score in the dtype of ``unary``.

    Raises ``ValueError`` on bad shapes, an invalid tree or a negative quadratic weight.
    """
    check_pose_unary(unary)
    batch, num_nodes, _, gx = unary.shape
    root, order = tree_order(edges, num_nodes)
    w, mu = _edge_parameters(w, mu, batch, len(edges))
    check_convex_deformation(w)
    coeffs = message_coefficients(w, mu)
    belief = list(unary.unbind(dim=1))
    argmax: dict[int, Tensor] = {}  # edge -> flat child position [B, P] for every flat parent position
    for e in reversed(order):  # leaves first: a child's belief is complete before it is sent
        parent, child = edges[e]
        message, arg_y, arg_x = distance_transform_2d_packed(belief[child], coeffs[e], method)
        belief[parent] = belief[parent] + message
        argmax[e] = (arg_y * gx + arg_x).reshape(batch, -1)
    score, root_flat = belief[root].reshape(batch, -1).max(dim=1)
    flat = torch.empty(batch, num_nodes, dtype=torch.long, device=unary.device)
    flat[:, root] = root_flat
    for e in order:  # root to leaves
        parent, child = edges[e]
        flat[:, child] = argmax[e].gather(1, flat[:, parent, None]).squeeze(1)
    positions = torch.stack((flat // gx, flat % gx), dim=-1)
    return TreeMaxSum(positions, score)


def tree_score(unary: Tensor, positions: Tensor, w: Tensor, mu: Tensor, edges: Edges = LSP_TREE_EDGES) -> Tensor:
    """Score ``[B]`` of configurations ``positions`` (long [B, J, 2], (y, x); any edge list, tree or not):
    ``sum_j unary[j, l_j] - sum_e <w_e, deformation_features(l_child, l_parent, mu_e)>``, other arguments as in
    :func:`tree_max_sum`."""
    check_pose_unary(unary)
    batch, num_nodes, _, gx = unary.shape
    if positions.shape != (batch, num_nodes, 2):
        raise ValueError(f"positions must have shape [{batch}, {num_nodes}, 2], got {tuple(positions.shape)}")
    w, mu = _edge_parameters(w, mu, batch, len(edges))
    flat = (positions[..., 0] * gx + positions[..., 1]).unsqueeze(-1)
    score = unary.reshape(batch, num_nodes, -1).gather(2, flat).squeeze(-1).sum(dim=1)
    parents, children = edge_ends(edges, unary.device)
    feats = deformation_features(positions[:, children], positions[:, parents], mu.to(unary.dtype))
    return score - (w.to(unary.dtype) * feats).sum(dim=(1, 2))


def _check_loss_inputs(true_pos: Tensor, visible: Tensor, torso_size: Tensor) -> None:
    if true_pos.dim() != 3 or true_pos.shape[-1] != 2:
        raise ValueError(f"true_pos must have shape [B, J, 2], got {tuple(true_pos.shape)}")
    if visible.dtype != torch.bool or visible.shape != true_pos.shape[:2]:
        raise ValueError(f"visible must be a bool tensor [B, J] = {tuple(true_pos.shape[:2])}, "
                         f"got {visible.dtype} {tuple(visible.shape)}")
    if torso_size.shape != true_pos.shape[:1] or not (torch.isfinite(torso_size) & (torso_size > 0)).all():
        raise ValueError(f"torso_size must be a finite positive tensor [B] = [{true_pos.shape[0]}]")


def pose_loss(pred_pos: Tensor, true_pos: Tensor, visible: Tensor, torso_size: Tensor) -> Tensor:
    """Per-image loss ``mean_{visible j} min(1, ||l_j - l*_j||^2 / s^2)`` (0 if no joint is visible).

    ``pred_pos``, ``true_pos``: [B, J, 2] in the same units as ``torso_size`` (``s`` per image, [B], finite and
    > 0); invisible joints (``visible``: bool [B, J]) are ignored (may be NaN).  Returns [B] in [0, 1].
    """
    _check_loss_inputs(true_pos, visible, torso_size)
    d2 = (pred_pos.to(true_pos.dtype) - true_pos).square().sum(dim=-1)
    term = torch.where(visible, (d2 / torso_size[:, None].square()).clamp(max=1.0), 0.0)
    return term.sum(dim=1) / visible.sum(dim=1).clamp(min=1)


def pose_loss_unaries(true_pos: Tensor, visible: Tensor, torso_size: Tensor, grid_size: int) -> Tensor:
    """The loss of :func:`pose_loss` as unary terms on the grid: ``out[b, j, y, x]`` is the contribution of joint
    ``j`` at ``(y, x)``, so ``tree_max_sum(unary + out, w, mu)`` maximises score + loss.

    ``true_pos``: [B, J, 2] in (y, x) grid coordinates (may be fractional); ``visible``: bool [B, J] (invisible
    joints contribute 0); ``torso_size``: [B] in grid units; ``grid_size``: ``G``.  Returns [B, J, G, G] in the
    (float) dtype of ``true_pos``.
    """
    _check_loss_inputs(true_pos, visible, torso_size)
    if not true_pos.is_floating_point():
        true_pos = true_pos.to(torch.get_default_dtype())
    grid = torch.arange(grid_size, dtype=true_pos.dtype, device=true_pos.device)
    dy2 = (grid - true_pos[..., 0, None]).square()[..., :, None]  # [B, J, G, 1]
    dx2 = (grid - true_pos[..., 1, None]).square()[..., None, :]  # [B, J, 1, G]
    s2 = torso_size.to(true_pos.dtype)[:, None, None, None].square()
    count = visible.sum(dim=1).clamp(min=1)[:, None, None, None]
    term = ((dy2 + dx2) / s2).clamp(max=1.0) / count
    return torch.where(visible[..., None, None], term, 0.0)
