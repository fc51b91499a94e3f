"""Pictorial-structures model for human pose: a tree of joints on a ``G x G`` grid (Osokin et al. 2016, 3.5).

Every joint ``j`` takes one cell ``l_j = (y_j, x_j)`` of the grid.  With ``K`` unary features per joint and cell
(a CNN heatmap score, optionally more channels) and the tree's edges ``e = (parent, child)``::

    phi(x_i, l) = [unary_i[j, :, l_j] for j] ++ [-(dx, dx^2, dy, dy^2)_e for e],
    dx = (x_child - x_parent - mu_e[1]) / s_e[1],  dy = (y_child - y_parent - mu_e[0]) / s_e[0]

(the score of :func:`torch_bcfw.inference.tree.tree_max_sum`); ``w = [w_U (J*K, joint-major) | w_e (E*4,
edge-major)]``.  The offsets ``mu_e`` (:func:`mean_offsets`) and scales ``s_e`` (:func:`offset_scales`) are constants
that keep the displacement features ``O(1)``.  The quadratic weights are boxed ``>= 0`` (:meth:`PoseTree.weight_bounds`,
Osokin et al. 2016, App. H).

Loss: the mean over visible joints of ``min(1, ||l_j - l*_j||^2 / (r s_i)^2)`` (the paper's ``max`` is a typo),
``s_i`` the torso size in grid units, ``r`` the ``loss_radius``.  The oracle is exact max-sum with distance-transform
messages, ``O(J G^2)`` per image.  Labelings: ``LongTensor[n * J]`` of flat cells ``y * G + x``.

**Mixture types** (Yang & Ramanan 2011; Chen & Yuille 2014).  With ``mu`` of shape ``[E, K, 2]`` a labeling is the
cells and a type per edge (``J + E`` labels), each type with its own offset, scales, deformation weights and bias
(:func:`~torch_bcfw.inference.tree_mixture.mixture_tree_max_sum`); the loss ignores the types.  ``type_features=True``
adds ``2 E`` features from :class:`PoseData` ``type_unary`` (:meth:`PoseTree.type_feature_weights`).
"""
from __future__ import annotations

import math

import torch
from torch import Tensor

from ..checks import check_bool, check_int
from ..inference.distance_transform import Method
from ..inference.tree import (LSP_TREE_EDGES, Edges, tree_order, deformation_features, edge_ends, pose_loss,
                              pose_loss_unaries, tree_max_sum)
from ..inference.tree_mixture import mixture_tree_max_sum, type_end_scores
from ..data.poses import PoseData, flat_to_positions
from .base import StructuredModel

__all__ = ["PoseTree", "impute_positions", "mean_offsets", "nearest_types", "offset_scales", "offset_types"]


def mean_offsets(positions: Tensor, visible: Tensor, edges: Edges = LSP_TREE_EDGES) -> Tensor:
    """Mean displacement ``child - parent`` of every edge over the examples where both joints are visible: float64
    ``[E, 2]`` ``(mu_y, mu_x)``, ``(0, 0)`` for an edge never seen with both ends visible.  ``positions``: ``[n, J,
    2]`` ``(y, x)`` in grid units (NaN allowed where invisible); ``visible``: bool ``[n, J]``; ``edges``: ``(parent,
    child)`` pairs."""
    pos = torch.as_tensor(positions).to(torch.float64)
    parents, children = edge_ends(edges, pos.device)
    both = visible[:, parents] & visible[:, children]  # [n, E]
    d = torch.nan_to_num(pos[:, children] - pos[:, parents]) * both[..., None]
    count = both.sum(0).clamp(min=1)[:, None].to(torch.float64)
    return d.sum(0) / count


def offset_types(positions: Tensor, visible: Tensor, n_types: int, edges: Edges = LSP_TREE_EDGES,
                 iterations: int = 50, seed: int = 0) -> tuple[Tensor, Tensor]:
    """Mixture types of every edge: k-means (Lloyd) of the displacements ``child - parent`` over the examples
    where both joints are visible.

    Args:
        positions: ``[n, J, 2]`` ``(y, x)`` in grid units (NaN allowed where invisible); visible: bool ``[n, J]``.
        n_types: ``K >= 1``; edges: ``(parent, child)`` pairs.
        iterations: Lloyd iterations; seed: the initial centres are ``K`` distinct visible displacements drawn
            with this seed.

    Returns ``(centres float64 [E, K, 2], types long [n, E])``: each example's type is the nearest centre to its
    displacement (also for pairs with an invisible joint, whose positions must then be imputed, e.g. by
    :func:`impute_positions`); an edge with fewer than ``K`` visible displacements repeats its last centre.
    """
    K = int(n_types)
    if K < 1:
        raise ValueError(f"n_types must be >= 1, got {n_types}")
    pos = torch.as_tensor(positions).to(torch.float64)
    gen = torch.Generator().manual_seed(int(seed))
    centres = torch.zeros(len(edges), K, 2, dtype=torch.float64)
    types = torch.zeros(pos.shape[0], len(edges), dtype=torch.long)
    for e, (p, c) in enumerate(edges):
        d = pos[:, c] - pos[:, p]
        seen = d[visible[:, p] & visible[:, c]]
        if seen.shape[0] == 0:
            continue
        distinct = torch.unique(seen, dim=0)
        pick = distinct[torch.randperm(distinct.shape[0], generator=gen)[:K]]
        cent = torch.cat([pick, pick[-1:].expand(K - pick.shape[0], 2)]) if pick.shape[0] < K else pick.clone()
        for _ in range(int(iterations)):
            lab = torch.cdist(seen, cent).argmin(1)
            new = cent.clone()
            for k in range(K):
                members = seen[lab == k]
                if members.shape[0]:
                    new[k] = members.mean(0)
            if torch.equal(new, cent):
                break
            cent = new
        centres[e] = cent
        types[:, e] = torch.cdist(torch.nan_to_num(d), cent).argmin(1)
    return centres, types


def nearest_types(positions: Tensor, centres: Tensor, edges: Edges = LSP_TREE_EDGES) -> Tensor:
    """The type of every edge whose offset ``centres[e, k]`` (``[E, K, 2]``, :func:`offset_types`) is nearest to the
    displacement ``child - parent`` of ``positions`` (``[n, J, 2]`` ``(y, x)``, every joint placed):
    ``LongTensor[n, E]`` (ties to the lower type)."""
    pos = torch.as_tensor(positions).to(torch.float64)
    parents, children = edge_ends(edges, pos.device)
    d = pos[:, children] - pos[:, parents]  # [n, E, 2]
    c = torch.as_tensor(centres, dtype=torch.float64).to(pos.device).reshape(len(edges), -1, 2)
    return ((d[:, :, None, :] - c) ** 2).sum(-1).argmin(-1)


def offset_scales(positions: Tensor, visible: Tensor, edges: Edges = LSP_TREE_EDGES, minimum: float = 1.0,
                  types: Tensor | None = None, n_types: int | None = None) -> Tensor:
    """Standard deviation of every edge's displacement ``child - parent`` per axis (at least ``minimum``).

    Same arguments as :func:`mean_offsets`; returns float64 ``[E, 2]`` ``(s_y, s_x)`` (``minimum`` for an
    edge seen fewer than twice with both ends visible).  With ``types`` (long ``[n, E]``, e.g. from
    :func:`offset_types`) and ``n_types = K``: the deviation within every type, ``[E, K, 2]``.
    """
    pos = torch.as_tensor(positions).to(torch.float64)
    parents, children = edge_ends(edges, pos.device)
    both = visible[:, parents] & visible[:, children]  # [n, E]
    d = torch.nan_to_num(pos[:, children] - pos[:, parents])

    def deviation(member: Tensor) -> Tensor:  # member: bool [n, E] -> [E, 2]
        m = member[..., None]
        count = m.sum(0).to(torch.float64)
        mean = (d * m).sum(0) / count.clamp(min=1)
        var = (((d - mean) ** 2) * m).sum(0) / (count - 1).clamp(min=1)
        return torch.where(count >= 2, var.sqrt(), torch.zeros_like(var)).clamp(min=minimum)

    if types is None:
        return deviation(both)
    types = torch.as_tensor(types, device=pos.device)
    K = int(n_types) if n_types is not None else int(types.max()) + 1
    return torch.stack([deviation(both & (types == k)) for k in range(K)], dim=1)


def impute_positions(positions: Tensor, visible: Tensor, grid_size: int, mu: Tensor,
                     edges: Edges = LSP_TREE_EDGES) -> Tensor:
    """Grid cells for every joint: visible joints rounded, invisible ones placed breadth first from the visible
    ones at a placed neighbour's cell plus (down) or minus (up) the edge's mean offset, rounded and clamped (an image
    without visible joints starts from the grid centre at the root).

    ``positions``: float ``[n, J, 2]`` ``(y, x)`` in grid units (NaN where invisible); ``visible``: bool ``[n, J]``;
    ``mu``: ``[E, 2]`` mean offsets (:func:`mean_offsets`); ``edges`` form a tree.  Returns ``LongTensor[n, J, 2]``
    in ``[0, G)``.
    """
    n, J, _ = positions.shape
    root, _ = tree_order(edges, J)
    mu = torch.as_tensor(mu, dtype=torch.float64).cpu()
    G = int(grid_size)
    pos = torch.as_tensor(positions, dtype=torch.float64).cpu().clone()
    vis = torch.as_tensor(visible).cpu().bool()
    neighbours: dict[int, list[tuple[int, int, float]]] = {j: [] for j in range(J)}
    for e, (p, c) in enumerate(edges):
        neighbours[p].append((c, e, 1.0))   # child = parent + mu
        neighbours[c].append((p, e, -1.0))  # parent = child - mu
    for i in range(n):
        placed = vis[i].clone()
        if not bool(placed.any()):
            pos[i, root] = (G - 1) / 2.0
            placed[root] = True
        frontier = placed.nonzero().flatten().tolist()
        while frontier:
            nxt = []
            for a in frontier:
                for b, e, sign in neighbours[a]:
                    if not placed[b]:
                        pos[i, b] = pos[i, a] + sign * mu[e]
                        placed[b] = True
                        nxt.append(b)
            frontier = nxt
    return pos.round().clamp(0, G - 1).long().to(torch.as_tensor(positions).device)


class PoseTree(StructuredModel):
    """Tree-structured pictorial-structures SSVM, optionally with mixture types per edge (module docstring).

    Args:
        grid_size: ``G`` (positions on a ``G x G`` grid).
        mu: offsets ``child - parent`` in ``(y, x)`` grid units: ``[E, 2]`` (one type per edge; the mean offsets
            of :func:`mean_offsets`) or ``[E, K, 2]`` (``K`` types per edge, e.g. the k-means centres of
            :func:`offset_types`); default zeros ``[E, 2]``.
        scales: positive scales ``(s_y, s_x)`` of the displacements, ``[E, 2]`` or ``[E, K, 2]`` like ``mu``
            (:func:`offset_scales`; an ``[E, 2]`` table serves every type); default ones.
        n_joints: ``J`` (default 14, the LSP skeleton).
        n_unary: ``K_u`` unary features per joint and cell (default 1: the heatmap score).
        edges: ``(parent, child)`` pairs forming a tree over the joints (default ``LSP_TREE_EDGES``).
        min_quadratic: lower bound of the quadratic deformation weights (default 0: a convex penalty).
        method: distance-transform method of the oracle (``"auto"``: compiled envelope on CPU, dense on CUDA).
        type_features: image-dependent pairwise relations (needs ``K > 1``): the data's ``type_unary`` at both ends
            of every edge, for its type, with one weight per edge and side, ``w_T [E, 2]`` at the end of ``w``.
        loss_radius: ``r > 0``: the loss of a joint saturates at 1 from ``r`` torso sizes away (default 1).

    ``d = J K_u + 4 E`` with one type per edge, ``J K_u + 5 E K`` with ``K > 1`` types (four deformation weights
    and a bias per edge and type), ``+ 2 E`` with ``type_features``; :meth:`unpack` splits ``w``.
    """

    #: the oracle is a tree of distance transforms over every position: ``preset="auto"`` caches its answers
    expensive_oracle = True

    def __init__(self, grid_size: int, mu: Tensor | None = None, n_joints: int = 14, n_unary: int = 1,
                 edges: Edges = LSP_TREE_EDGES, min_quadratic: float = 0.0, method: Method = "auto",
                 scales: Tensor | None = None, type_features: bool = False, loss_radius: float = 1.0):
        grid_size, n_joints, n_unary = (check_int(v, name) for v, name in
                                        ((grid_size, "grid_size"), (n_joints, "n_joints"), (n_unary, "n_unary")))
        if grid_size < 1 or n_joints < 1 or n_unary < 1:
            raise ValueError(f"grid_size, n_joints and n_unary must be >= 1, got {grid_size}, {n_joints}, {n_unary}")
        self.edges = tuple((check_int(p, "edges (a parent joint)"), check_int(c, "edges (a child joint)"))
                           for p, c in edges)
        self.n_joints, self.grid_size, self.n_unary = n_joints, grid_size, n_unary
        tree_order(self.edges, self.n_joints)  # raises on a bad tree
        E = len(self.edges)
        mu = torch.zeros(E, 2, dtype=torch.float64) if mu is None else torch.as_tensor(mu, dtype=torch.float64)
        if mu.dim() not in (2, 3) or mu.shape[0] != E or mu.shape[-1] != 2 or (mu.dim() == 3 and mu.shape[1] < 1) \
                or not bool(torch.isfinite(mu).all()):
            raise ValueError(f"mu must be a finite [E, 2] or [E, K, 2] tensor with E = {E}, got shape {tuple(mu.shape)}")
        if mu.dim() == 3 and mu.shape[1] == 1:
            mu = mu[:, 0]
        K = 1 if mu.dim() == 2 else mu.shape[1]
        if not min_quadratic >= 0:
            raise ValueError(f"min_quadratic must be >= 0 (the distance transform needs a convex penalty), "
                             f"got {min_quadratic}")
        scales = torch.ones(E, 2, dtype=torch.float64) if scales is None else torch.as_tensor(scales, dtype=torch.float64)
        if scales.dim() == 3 and scales.shape[1] == 1:
            scales = scales[:, 0]
        if scales.dim() == 2 and K > 1 and scales.shape == (E, 2):
            scales = scales[:, None].expand(E, K, 2).clone()
        if scales.shape != mu.shape or not bool((torch.isfinite(scales) & (scales > 0)).all()):
            raise ValueError(f"scales must be a finite positive tensor shaped like mu {tuple(mu.shape)} (or [E, 2]), "
                             f"got {tuple(scales.shape)}")
        self.mu = mu.cpu()
        self.scales = scales.cpu()
        self.n_types = K
        self.min_quadratic = float(min_quadratic)
        self.method = method
        self.type_features = check_bool(type_features, "type_features")
        if not (math.isfinite(loss_radius) and loss_radius > 0):
            raise ValueError(f"loss_radius must be finite and > 0, got {loss_radius}")
        self.loss_radius = float(loss_radius)
        if self.type_features and K == 1:
            raise ValueError("type_features needs mixture types: give mu as [E, K, 2] with K > 1")
        self.n_features = self.n_joints * self.n_unary + (4 * E if K == 1 else 5 * E * K) + 2 * E * self.type_features
        self._parents, self._children = edge_ends(self.edges, "cpu")

    def config(self) -> dict:
        return {"grid_size": self.grid_size, "mu": self.mu.tolist(), "scales": self.scales.tolist(),
                "n_joints": self.n_joints,
                "n_unary": self.n_unary, "edges": [list(e) for e in self.edges],
                "min_quadratic": self.min_quadratic, "method": self.method, "type_features": self.type_features,
                "loss_radius": self.loss_radius}

    @property
    def n_edges(self) -> int:
        return len(self.edges)

    @property
    def n_labels(self) -> int:
        """Labels per image: the ``J`` cells, then (with ``K > 1`` types) the ``E`` edge types."""
        return self.n_joints + (self.n_edges if self.n_types > 1 else 0)

    def unpack(self, w: Tensor) -> tuple[Tensor, Tensor]:
        """``w [d]`` -> ``(w_U [J, K_u], w_def)`` (views): ``w_def`` is ``[E, 4]`` with one type per edge,
        ``[E, K, 4]`` with ``K > 1`` (the type biases: :meth:`type_biases`)."""
        JK, E, K = self.n_joints * self.n_unary, self.n_edges, self.n_types
        w_def = w[JK : JK + 4 * E * K]
        return w[:JK].view(self.n_joints, self.n_unary), (w_def.view(E, 4) if K == 1 else w_def.view(E, K, 4))

    def type_biases(self, w: Tensor) -> Tensor:
        """The bias of every edge type, ``[E, K]`` (a view; zeros ``[E, 1]`` with one type per edge)."""
        if self.n_types == 1:
            return torch.zeros(self.n_edges, 1, dtype=w.dtype, device=w.device)
        start = self.n_joints * self.n_unary + 4 * self.n_edges * self.n_types
        return w[start : start + self.n_edges * self.n_types].view(self.n_edges, self.n_types)

    def type_feature_weights(self, w: Tensor) -> Tensor:
        """``w_T [E, 2]`` (a view): the weight of the type features at the child (column 0) and parent (column 1)
        end of every edge; ``type_features`` models only."""
        if not self.type_features:
            raise ValueError("the model has no type features (PoseTree(..., type_features=True))")
        return w[self.n_features - 2 * self.n_edges :].view(self.n_edges, 2)

    def _feature_divisors(self, device) -> Tensor:
        """``[E, K, 4]`` divisors ``(s_x, s_x^2, s_y, s_y^2)`` of the raw deformation features."""
        s = self.scales.to(device).reshape(self.n_edges, self.n_types, 2)
        return torch.stack((s[..., 1], s[..., 1] ** 2, s[..., 0], s[..., 0] ** 2), dim=-1)

    def pixel_weights(self, w: Tensor) -> Tensor:
        """The deformation weights on the raw grid displacements (what the oracle uses): ``[E, 4]`` with one
        type per edge, ``[E, K, 4]`` with ``K > 1``."""
        _, w_def = self.unpack(w.to(torch.float64))
        return w_def / self._feature_divisors(w_def.device).reshape(w_def.shape)

    def quadratic_index(self) -> Tensor:
        """Indices in ``w`` of the quadratic deformation weights ``w_e[1], w_e[3]`` of every edge (and type):
        ``LongTensor[2 E K]``."""
        base = self.n_joints * self.n_unary + 4 * torch.arange(self.n_edges * self.n_types)
        return torch.stack((base + 1, base + 3), dim=1).reshape(-1)

    def weight_bounds(self):
        """``(lower, upper)``: quadratic deformation weights ``>= min_quadratic``, the rest free."""
        lower = torch.full((self.n_features,), -float("inf"), dtype=torch.float64)
        lower[self.quadratic_index()] = self.min_quadratic
        return lower, torch.full((self.n_features,), float("inf"), dtype=torch.float64)

    def nearest_types(self, positions: Tensor) -> Tensor:
        """:func:`nearest_types` of ``positions`` (``[n, J, 2]``) to the model's offsets: ``LongTensor[n, E]``."""
        return nearest_types(positions, self.mu.reshape(self.n_edges, self.n_types, 2), self.edges)

    def pack_labels(self, positions: Tensor, types: Tensor | None = None) -> Tensor:
        """Packed labelings ``LongTensor[n * n_labels]`` of cells ``[n, J, 2]`` ``(y, x)`` and (with ``K > 1``
        types) edge types ``[n, E]`` (default: :meth:`nearest_types` of the cells)."""
        positions = torch.as_tensor(positions).long()
        cells = positions[..., 0] * self.grid_size + positions[..., 1]
        if self.n_types == 1:
            return cells.reshape(-1)
        types = self.nearest_types(positions) if types is None else torch.as_tensor(types, device=cells.device)
        return torch.cat((cells, types.long()), dim=1).reshape(-1)

    def check_data(self, data, require_labels: bool = True) -> None:
        if not isinstance(data, PoseData):
            raise TypeError(f"PoseTree expects PoseData, got {type(data).__name__}")
        _, J, K, G, _ = data.unary.shape
        if (J, K, G) != (self.n_joints, self.n_unary, self.grid_size):
            raise ValueError(f"data has J={J} joints, K={K} unary features on a {G}x{G} grid but the model "
                             f"expects J={self.n_joints}, K={self.n_unary}, G={self.grid_size}")
        if require_labels and data.y is None:
            raise ValueError("training data needs true positions (PoseData(..., positions=...))")
        if data.types is not None:
            if self.n_types == 1:
                raise ValueError("the data has edge types but the model has one type per edge (give mu as [E, K, 2] "
                                 "for mixture types, or build the data without types)")
            if data.types.shape[1] != self.n_edges or int(data.types.max()) >= self.n_types:
                raise ValueError(f"edge types must be [n, {self.n_edges}] with values in [0, {self.n_types}), got "
                                 f"{tuple(data.types.shape)} with max {int(data.types.max())}")
        elif require_labels and self.n_types > 1:
            raise ValueError(f"the model has {self.n_types} types per edge: training data needs the true types "
                             f"(PoseData(..., types=model.nearest_types(positions)))")
        if self.type_features:
            tu = data.type_unary
            want = (len(data), self.n_edges, self.n_types, 2, self.grid_size, self.grid_size)
            if tu is None or tuple(tu.shape) != want:
                raise ValueError(f"the model uses type features: the data needs type_unary of shape {list(want)}, "
                                 f"got {None if tu is None else tuple(tu.shape)}")

    def split_labels(self, y: Tensor, n: int) -> tuple[Tensor, Tensor]:
        """Packed labelings ``[n * n_labels]`` -> ``(cells LongTensor[n, J, 2] (y, x), types LongTensor[n, E])``
        (types all zero with one type per edge)."""
        y = torch.as_tensor(y).long().reshape(-1)
        J, G, L = self.n_joints, self.grid_size, self.n_labels
        if y.numel() != n * L:
            raise ValueError(f"expected {n} labelings of {L} values ({J} cells"
                             + (f" + {self.n_edges} edge types" if L > J else "") + f"), got {y.numel()}")
        y = y.view(n, L)
        cells = y[:, :J]
        if cells.numel() and (int(cells.min()) < 0 or int(cells.max()) >= G * G):
            raise ValueError(f"cells must lie in [0, {G * G - 1}] (flat y * G + x), got range "
                             f"[{int(cells.min())}, {int(cells.max())}]")
        if L > J:
            types = y[:, J:]
            if types.numel() and (int(types.min()) < 0 or int(types.max()) >= self.n_types):
                raise ValueError(f"edge types must lie in [0, {self.n_types}), got range "
                                 f"[{int(types.min())}, {int(types.max())}]")
        else:
            types = torch.zeros(n, self.n_edges, dtype=torch.long, device=y.device)
        return flat_to_positions(cells, n, J, G), types

    def _positions(self, data: PoseData, y: Tensor) -> tuple[Tensor, Tensor]:
        return self.split_labels(torch.as_tensor(y, device=data.device), len(data))

    def unary_scores(self, w: Tensor, data: PoseData) -> Tensor:
        """``sum_k w_U[j, k] unary[i, j, k]``: float64 ``[n, J, G, G]``."""
        w_u, _ = self.unpack(w.to(device=data.device, dtype=torch.float64))
        return torch.einsum("njkyx,jk->njyx", data.unary.to(torch.float64), w_u)

    def joint_feature(self, data: PoseData, y: Tensor) -> Tensor:
        pos, types = self._positions(data, y)
        n, J, Ku, G, E, K = len(data), self.n_joints, self.n_unary, self.grid_size, self.n_edges, self.n_types
        dev = data.device
        flat = (pos[..., 0] * G + pos[..., 1])  # [n, J]
        cells = data.unary.reshape(n, J, Ku, G * G)
        phi_u = cells.gather(3, flat[:, :, None, None].expand(n, J, Ku, 1)).reshape(n, J * Ku).to(torch.float64)
        e = torch.arange(E, device=dev)
        mu = self.mu.to(dev).reshape(E, K, 2)[e, types]  # [n, E, 2]: the offset of each edge's type
        feats = deformation_features(pos[:, self._children.to(dev)], pos[:, self._parents.to(dev)], mu)
        feats = feats / self._feature_divisors(dev)[e, types]
        if K == 1:
            return torch.cat((phi_u, -feats.reshape(n, -1)), dim=1)
        one_hot = torch.nn.functional.one_hot(types, K).to(torch.float64)  # [n, E, K]
        phi_def = -(one_hot[..., None] * feats[:, :, None, :])  # [n, E, K, 4]
        parts = [phi_u, phi_def.reshape(n, -1), one_hot.reshape(n, -1)]
        if self.type_features:  # [n, E, 2]: the type feature of each edge's type at its child and parent cell
            parts.append(type_end_scores(data.type_unary, flat, types, self.edges).reshape(n, 2 * E).to(torch.float64))
        return torch.cat(parts, dim=1)

    def loss(self, data: PoseData, y: Tensor) -> Tensor:
        """The pose loss of the cells (edge types do not count)."""
        pos = self._positions(data, y)[0].to(torch.float64)
        true = data.positions.to(torch.float64)
        return pose_loss(pos, true, data.visible, self._loss_scale(data)).to(torch.float64)

    def _loss_scale(self, data: PoseData) -> Tensor:
        """``r s_i`` (float64 ``[n]``): where each image's loss saturates (grid units)."""
        return data.torso.to(torch.float64) * self.loss_radius

    def oracle(self, w: Tensor, data: PoseData, loss_augmented: bool = True) -> Tensor:
        """Exact (loss-augmented) MAP of every image: packed labelings ``LongTensor[n * n_labels]`` (flat cells,
        then the edge types with ``K > 1``); ``ValueError`` when a quadratic deformation weight is negative."""
        self.check_weights(w, data)
        U = self.unary_scores(w, data)
        if loss_augmented:
            if data.y is None:
                raise ValueError("loss-augmented decoding needs the true positions")
            U = U + pose_loss_unaries(data.positions.to(torch.float64), data.visible, self._loss_scale(data),
                                      self.grid_size)
        if self.n_types == 1:
            pos = tree_max_sum(U, self.pixel_weights(w), self.mu.to(U.device), self.edges, self.method).positions
            return (pos[..., 0] * self.grid_size + pos[..., 1]).reshape(-1)
        w64 = w.to(U.device, torch.float64)
        type_unary = None
        if self.type_features:  # [n, E, K, 2, G, G] weighted by w_T[e, side]
            type_unary = data.type_unary.to(torch.float64) * self.type_feature_weights(w64)[None, :, None, :, None, None]
        result = mixture_tree_max_sum(U, self.pixel_weights(w), self.type_biases(w64), self.mu.to(U.device),
                                      self.edges, self.method, type_unary=type_unary)
        pos = result.positions
        return torch.cat((pos[..., 0] * self.grid_size + pos[..., 1], result.types), dim=1).reshape(-1)

    def decode_positions(self, w: Tensor, data: PoseData) -> Tensor:
        """MAP cells ``LongTensor[n, J, 2]`` ``(y, x)``."""
        return self.split_labels(self.oracle(w, data, loss_augmented=False), len(data))[0]
