"""A batch of graphs with binary node labels: the data container of :class:`~torch_bcfw.models.GraphCut`.

Nodes and edges of all graphs are *packed* (concatenated, with ``offsets`` / ``edge_offsets``); edge endpoints are
*local* node numbers of their graph (``0 .. N_i - 1``), so a sub-batch ``data[idx]`` only gathers rows.

============  ==========================  ==========================================================
field         shape                       meaning
============  ==========================  ==========================================================
``x``         ``Tensor[N_tot, F]``        node (unary) features, finite
``y``         ``LongTensor[N_tot]``       node labels in ``{0, 1}`` (``None`` for prediction only)
``offsets``   ``LongTensor[n + 1]``       graph ``i`` owns nodes ``offsets[i] : offsets[i + 1]``
``edges``     ``LongTensor[M_tot, 2]``    undirected edges, local node numbers, no self-loops
``edge_x``    ``Tensor[M_tot, E]``        edge (pairwise) features, finite and ``>= 0``
``edge_offsets``  ``LongTensor[n + 1]``   graph ``i`` owns edges ``edge_offsets[i] : edge_offsets[i+1]``
``node_weight``   ``Tensor[N_tot]``       optional node masses (e.g. superpixel areas), ``>= 0``,
                                          positive total per graph; ``None``: 1 per node
============  ==========================  ==========================================================

Build one with :meth:`GraphData.from_graphs` or :func:`grid_graph_data`.  Inputs are checked eagerly; the tensors
are then treated as immutable, and derived arrays are cached on the container.
"""
from __future__ import annotations

import hashlib
from collections.abc import Sequence

import numpy as np
import torch
from torch import Tensor

from ..checks import check_finite, check_index_tensor, check_input_tensor, check_not_meta, check_offsets
from .base import as_index, cat_field, cat_offsets, counts_to_offsets, segment_rows

__all__ = ["GraphData", "grid_graph_data", "grid_edges", "edge_features"]


class GraphData:
    """Packed batch of binary-labelled graphs (the fields and shapes are in the module docstring; ``E`` may be 0,
    a graph may have no edge).  ``ValueError`` for any inconsistency, naming the field."""

    def __init__(self, x: Tensor, y: Tensor | None, offsets: Tensor, edges: Tensor, edge_x: Tensor,
                 edge_offsets: Tensor, node_weight: Tensor | None = None, *, _check: bool = True):
        if _check:
            for name, t in (("x", x), ("y", y), ("offsets", offsets), ("edges", edges), ("edge_x", edge_x),
                            ("edge_offsets", edge_offsets), ("node_weight", node_weight)):
                check_not_meta(t, f"GraphData.{name}")
        self.x = torch.as_tensor(x)
        dev = self.x.device
        self.y = None if y is None else torch.as_tensor(y, device=dev)
        self.offsets = torch.as_tensor(offsets, device=dev)
        self.edges = torch.as_tensor(edges, device=dev)
        self.edge_x = torch.as_tensor(edge_x, device=dev)
        self.edge_offsets = torch.as_tensor(edge_offsets, device=dev)
        self.node_weight = None if node_weight is None else torch.as_tensor(node_weight, device=dev)
        self._cache: dict = {}
        if _check:
            self._validate()

    def _validate(self) -> None:
        x = self.x
        _check_node_features(x)
        self.offsets = check_index_tensor(self.offsets, "GraphData.offsets")
        check_offsets(self.offsets, x.shape[0], "GraphData.offsets", None, "graph")
        n = self.offsets.numel() - 1
        self.edges = check_index_tensor(self.edges, "GraphData.edges")
        if self.edges.dim() != 2 or self.edges.shape[1] != 2:
            raise ValueError(f"GraphData.edges must have shape [M_tot, 2], got {tuple(self.edges.shape)}")
        ex = self.edge_x
        check_input_tensor(ex, "GraphData.edge_x")
        if ex.dim() != 2 or ex.shape[0] != self.edges.shape[0] or not ex.is_floating_point():
            raise ValueError(
                f"GraphData.edge_x must be a floating [M_tot, E] tensor with M_tot = {self.edges.shape[0]}, "
                f"got {ex.dtype} of shape {tuple(ex.shape)}"
            )
        check_finite(ex, "GraphData.edge_x")
        if ex.numel() and float(ex.min()) < 0:
            raise ValueError("GraphData.edge_x must be >= 0 (non-negative edge features keep the energy submodular "
                             f"for pairwise weights >= 0); minimum {float(ex.min()):.6g}")
        self.edge_offsets = check_index_tensor(self.edge_offsets, "GraphData.edge_offsets")
        if self.edge_offsets.shape != (n + 1,):
            raise ValueError(f"GraphData.edge_offsets must have shape [{n + 1}], got {tuple(self.edge_offsets.shape)}")
        check_offsets(self.edge_offsets, self.edges.shape[0], "GraphData.edge_offsets", None, "graph", empty_ok=True)
        if self.edges.numel():
            size = self.lengths[self.edge_graph()]
            if bool((self.edges < 0).any()) or bool((self.edges >= size[:, None]).any()):
                bad = int(torch.nonzero((self.edges < 0).any(1) | (self.edges >= size[:, None]).any(1))[0, 0])
                raise ValueError(f"GraphData.edges: edge {bad} {self.edges[bad].tolist()} references a node outside "
                                 f"its graph (local node numbers 0 .. N_i - 1 = {int(size[bad]) - 1})")
            loops = self.edges[:, 0] == self.edges[:, 1]
            if bool(loops.any()):
                raise ValueError(f"GraphData.edges contains a self-loop (edge {int(torch.nonzero(loops)[0, 0])})")
        if self.y is not None:
            if self.y.is_floating_point() or self.y.is_complex() or self.y.dtype == torch.bool:
                raise ValueError(f"GraphData.y must hold integer labels in {{0, 1}}, got {self.y.dtype}")
            self.y = self.y.long()
            if self.y.shape != (x.shape[0],):
                raise ValueError(f"GraphData.y must have one label per node ({x.shape[0]}), got shape {tuple(self.y.shape)}")
            if self.y.numel() and (int(self.y.min()) < 0 or int(self.y.max()) > 1):
                raise ValueError(f"GraphData.y must be in {{0, 1}}, got range [{int(self.y.min())}, {int(self.y.max())}]")
        if self.node_weight is not None:
            a = self.node_weight
            check_input_tensor(a, "GraphData.node_weight")
            if a.shape != (x.shape[0],) or not a.is_floating_point():
                raise ValueError(f"GraphData.node_weight must be a floating [{x.shape[0]}] tensor, got shape {tuple(a.shape)}")
            check_finite(a, "GraphData.node_weight")
            if bool((a < 0).any()):
                raise ValueError("GraphData.node_weight must be >= 0")
            if bool((self.mass() <= 0).any()):
                raise ValueError("GraphData.node_weight must have a positive total in every graph")

    @classmethod
    def from_graphs(cls, xs: Sequence[Tensor], edges: Sequence[Tensor], edge_xs: Sequence[Tensor],
                    ys: Sequence[Tensor] | None = None, node_weights: Sequence[Tensor] | None = None) -> "GraphData":
        """Pack per-graph tensors ``xs[i]: [N_i, F]``, ``edges[i]: [M_i, 2]``, ``edge_xs[i]: [M_i, E]``,
        ``ys[i]: [N_i]``, ``node_weights[i]: [N_i]``."""
        n = len(xs)
        if n == 0:
            raise ValueError("GraphData is empty (no graph given)")
        for name, seq in (("edges", edges), ("edge_xs", edge_xs), ("ys", ys), ("node_weights", node_weights)):
            if seq is not None and len(seq) != n:
                raise ValueError(f"got {n} node feature tensors but {len(seq)} {name}")
        xs = [torch.as_tensor(t) for t in xs]
        for i, t in enumerate(xs):
            if t.dim() != 2:
                raise ValueError(f"graph {i}: node features must be [N_i, F], got shape {tuple(t.shape)}")
        edges = [torch.as_tensor(e).reshape(-1, 2) for e in edges]
        edge_xs = [torch.as_tensor(e) for e in edge_xs]
        offsets = counts_to_offsets(torch.tensor([t.shape[0] for t in xs]))
        edge_offsets = counts_to_offsets(torch.tensor([e.shape[0] for e in edges]))
        dev = xs[0].device
        y = None if ys is None else torch.cat([torch.as_tensor(v).reshape(-1) for v in ys]).to(dev)
        a = None if node_weights is None else torch.cat([torch.as_tensor(v).reshape(-1) for v in node_weights]).to(dev)
        return cls(torch.cat(xs), y, offsets.to(dev), torch.cat(edges).to(dev), torch.cat(edge_xs).to(dev),
                   edge_offsets.to(dev), a)

    @classmethod
    def cat(cls, parts: Sequence["GraphData"]) -> "GraphData":
        """Concatenate batches of graphs (same ``F``, ``E`` and device; node weights in all or none)."""
        if not parts:
            raise ValueError("GraphData.cat needs at least one batch")
        if len({(p.n_inputs, p.n_edge_inputs, p.device) for p in parts}) != 1:
            raise ValueError("GraphData.cat: batches differ in feature sizes or device")
        if len({p.y is None for p in parts}) != 1 or len({p.node_weight is None for p in parts}) != 1:
            raise ValueError("GraphData.cat: labels / node weights must be given in all batches or in none")
        out = cls(cat_field(parts, "x"), cat_field(parts, "y"), cat_offsets([p.offsets for p in parts]),
                  cat_field(parts, "edges"), cat_field(parts, "edge_x"),
                  cat_offsets([p.edge_offsets for p in parts]), cat_field(parts, "node_weight"), _check=False)
        for name in ("cpu_graphs", "graph_keys"):
            if all(name in p._cache for p in parts):
                out._cache[name] = [k for p in parts for k in p._cache[name]]
        return out

    def __len__(self) -> int:
        return self.offsets.numel() - 1

    def __repr__(self) -> str:
        return (f"GraphData(n={len(self)}, nodes={self.n_nodes}, edges={self.edges.shape[0]}, F={self.n_inputs}, "
                f"E={self.n_edge_inputs}, labels={self.y is not None}, device={self.device})")

    @property
    def device(self) -> torch.device:
        return self.x.device

    @property
    def n_nodes(self) -> int:
        return self.x.shape[0]

    @property
    def n_inputs(self) -> int:
        """Node feature dimension ``F``."""
        return self.x.shape[1]

    @property
    def n_edge_inputs(self) -> int:
        """Edge feature dimension ``E``."""
        return self.edge_x.shape[1]

    @property
    def lengths(self) -> Tensor:
        """``LongTensor[n]``: nodes per graph."""
        return self.offsets[1:] - self.offsets[:-1]

    @property
    def edge_counts(self) -> Tensor:
        """``LongTensor[n]``: edges per graph."""
        return self.edge_offsets[1:] - self.edge_offsets[:-1]

    def cached(self, name: str, make):
        """``make()``, computed once per ``name`` for these graphs (a model keeps its per-data quantities here; a
        name starting with ``gc_`` holds a list with one entry per graph, which :meth:`__getitem__` and :meth:`to`
        carry along)."""
        if name not in self._cache:
            self._cache[name] = make()
        return self._cache[name]

    def node_graph(self) -> Tensor:
        """``LongTensor[N_tot]``: the graph of every node."""
        return self.cached("node_graph", lambda: torch.repeat_interleave(
            torch.arange(len(self), device=self.device), self.lengths))

    def edge_graph(self) -> Tensor:
        """``LongTensor[M_tot]``: the graph of every edge."""
        return self.cached("edge_graph", lambda: torch.repeat_interleave(
            torch.arange(len(self), device=self.device), self.edge_counts))

    def global_edges(self) -> Tensor:
        """``LongTensor[M_tot, 2]``: edge endpoints as indices into the packed nodes."""
        return self.cached("global_edges", lambda: self.edges + self.offsets[:-1][self.edge_graph()][:, None])

    def mass(self) -> Tensor:
        """``Tensor[n]`` (float64): total node mass of every graph (the node count without ``node_weight``)."""
        def make():
            if self.node_weight is None:
                return self.lengths.to(torch.float64)
            out = torch.zeros(len(self), dtype=torch.float64, device=self.device)
            return out.index_add_(0, self.node_graph(), self.node_weight.to(torch.float64))
        return self.cached("mass", make)

    def node_mass(self) -> Tensor:
        """``Tensor[N_tot]`` (float64): ``node_weight`` (or 1) per node."""
        return self.cached("node_mass", lambda: torch.ones(self.n_nodes, dtype=torch.float64, device=self.device)
                            if self.node_weight is None else self.node_weight.to(torch.float64))

    def x64(self) -> Tensor:
        """``x`` as float64 (cached)."""
        return self.cached("x64", lambda: self.x.to(torch.float64).contiguous())

    def edge_x64(self) -> Tensor:
        """``edge_x`` as float64 (cached)."""
        return self.cached("edge_x64", lambda: self.edge_x.to(torch.float64).contiguous())

    def node_scale(self) -> Tensor:
        """``a_p / Z_i`` per node (``Tensor[N_tot]`` float64, cached): node mass over its graph's mass."""
        return self.cached("node_scale", lambda: self.node_mass() / self.mass()[self.node_graph()])

    def edge_scale(self) -> Tensor:
        """``1 / Z_i`` per edge (``Tensor[M_tot]`` float64, cached)."""
        return self.cached("edge_scale", lambda: 1.0 / self.mass()[self.edge_graph()])

    def cpu_graphs(self) -> list[tuple[np.ndarray, np.ndarray]]:
        """Per graph ``(edges int32[M_i, 2], edge_x float64[M_i, E])`` as CPU numpy arrays (for the min-cut);
        graphs with equal edge lists share one read-only ``edges`` array."""
        def make():
            e = self.edges.detach().cpu().numpy().astype(np.int32)
            ex = self.edge_x.detach().cpu().to(torch.float64).numpy()
            eo = self.edge_offsets.cpu().numpy()
            shared: dict = {}  # equal edge lists (e.g. every image of one grid) share one array: stays in cache
            out = []
            for i in range(len(self)):
                ei = np.ascontiguousarray(e[eo[i]:eo[i + 1]])
                same = shared.setdefault((ei.shape[0], hash(ei.tobytes())), ei)
                out.append((same if np.array_equal(same, ei) else ei, np.ascontiguousarray(ex[eo[i]:eo[i + 1]])))
            return out
        return self.cached("cpu_graphs", make)

    def graph_keys(self) -> list[bytes]:
        """A content key per graph: a 16-byte BLAKE2b digest of ``(N_i, edges_i, edge_x_i)`` (equal keys: a worker
        of :class:`~torch_bcfw.inference.graphcut_pool.ResidentGraphCutPool` holding one serves the other)."""
        def make():
            keys = []
            for (e, ex), n_i in zip(self.cpu_graphs(), self.lengths.tolist()):
                h = hashlib.blake2b(digest_size=16)
                h.update(np.array([n_i, e.shape[0], ex.shape[1]], dtype=np.int64).tobytes())
                h.update(e.tobytes())
                h.update(ex.tobytes())
                keys.append(h.digest())
            return keys
        return self.cached("graph_keys", make)

    def __getitem__(self, idx) -> "GraphData":
        """The graphs ``idx`` (an int, a slice, a list or a ``LongTensor``; repeats allowed) as a new ``GraphData``."""
        idx = as_index(idx, len(self))
        node_idx, new_off = segment_rows(self.offsets.cpu(), idx)
        edge_idx, new_eoff = segment_rows(self.edge_offsets.cpu(), idx)
        dev = self.device
        node_idx, edge_idx = node_idx.to(dev), edge_idx.to(dev)
        out = GraphData(
            self.x[node_idx], None if self.y is None else self.y[node_idx], new_off.to(dev), self.edges[edge_idx],
            self.edge_x[edge_idx], new_eoff.to(dev), None if self.node_weight is None else self.node_weight[node_idx],
            _check=False,
        )
        sel = idx.tolist()
        for name, value in self._cache.items():
            if _per_graph(name):
                out._cache[name] = [value[i] for i in sel]
        return out

    def to(self, *args, **kwargs) -> "GraphData":
        """Move to a device and / or cast the node and edge features (``to(device)``, ``to(dtype)``,
        ``to(device, dtype)``)."""
        x = self.x.to(*args, **kwargs)
        device = x.device
        out = GraphData(
            x, None if self.y is None else self.y.to(device), self.offsets.to(device),
            self.edges.to(device), self.edge_x.to(*args, **kwargs), self.edge_offsets.to(device),
            None if self.node_weight is None else self.node_weight.to(device), _check=False,
        )
        if x.dtype == self.x.dtype and out.edge_x.dtype == self.edge_x.dtype:
            for name, value in self._cache.items():  # CPU-side per-graph lists are device-independent
                if _per_graph(name):
                    out._cache[name] = value
        return out

    def with_features(self, x: Tensor) -> "GraphData":
        """The same graphs and labels with new node features ``x: [N_tot, F']`` (checked)."""
        check_not_meta(x, "GraphData.x")
        x = torch.as_tensor(x, device=self.device)
        _check_node_features(x, self.n_nodes)
        out = GraphData(x, self.y, self.offsets, self.edges, self.edge_x, self.edge_offsets, self.node_weight,
                        _check=False)
        out._cache.update({k: v for k, v in self._cache.items()  # all else is feature-independent
                           if k != "x64" and not k.startswith(("phi_true", "gc_"))})
        return out

    def split_labels(self, labels: Tensor) -> list[Tensor]:
        """Split packed labels ``[N_tot]`` into a list of per-graph ``[N_i]`` tensors."""
        return list(torch.split(labels, self.lengths.tolist()))


def _check_node_features(x: Tensor, n_nodes: int | None = None) -> None:
    """``GraphData.x``: a finite, floating ``[N_tot, F]`` tensor (``N_tot = n_nodes`` when given)."""
    check_input_tensor(x, "GraphData.x")
    if x.dim() != 2 or not x.is_floating_point() or n_nodes not in (None, x.shape[0]):
        n = "N_tot" if n_nodes is None else f"N_tot = {n_nodes}"
        raise ValueError(f"GraphData.x must be a floating [{n}, F] tensor, got {x.dtype} of shape {tuple(x.shape)}")
    check_finite(x, "GraphData.x")


def _per_graph(cache_key: str) -> bool:
    """Whether a cache entry is a per-graph list (CPU arrays, content keys, decoding records)."""
    return cache_key in ("cpu_graphs", "graph_keys") or cache_key.startswith("gc_")


def grid_graph_data(features, images, labels=None, beta: float | None = None, contrast: bool = True,
                    connectivity: int = 4, contrast_scales: Sequence[float] = (1.0,)) -> GraphData:
    """Graphs of ``B`` images on their pixel grids (:func:`grid_edges`; pixel ``(r, c)`` is node ``r * W_i + c``).

    Args:
        features: ``Tensor[B, F, H, W]`` per-pixel node features, or a sequence of ``B`` tensors ``[F, H_i, W_i]``
            (images of different sizes).
        images: ``Tensor[B, C, H, W]`` (or ``B`` tensors ``[C, H_i, W_i]``), the images of the contrast features.
        labels: optional ``LongTensor[B, H, W]`` (or ``B`` tensors ``[H_i, W_i]``) in ``{0, 1}``.
        beta: contrast scale of :func:`edge_features` (default: per image).
        contrast: edge features ``[1, exp(-s beta ||I_p - I_q||^2) for s in contrast_scales]``
            (``E = 1 + len(contrast_scales)``); ``False``: ``[1]`` (Potts, ``E = 1``).
        connectivity: 4, or 8 (diagonal edges too; every edge's features divided by its length, 1 or sqrt 2).
    """
    for name, t in (("features", features), ("images", images), ("labels", labels)):
        for part in ([] if t is None else [t] if isinstance(t, Tensor) else t):
            check_not_meta(part, name)
    if isinstance(features, Tensor) and features.dim() != 4:
        raise ValueError(f"features must be [B, F, H, W] or a sequence of [F, H, W], got {tuple(features.shape)}")
    if len(images) != len(features) or (labels is not None and len(labels) != len(features)):
        raise ValueError(f"features, images and labels must hold one entry per image, got {len(features)}, "
                         f"{len(images)} and {'-' if labels is None else len(labels)}")
    xs, ex, grids = [], [], {}
    for b, (f, image) in enumerate(zip(features, images)):
        if f.dim() != 3 or image.dim() != 3 or f.shape[1:] != image.shape[1:]:
            raise ValueError(f"image {b}: features [F, H, W] and images [C, H, W] must agree, got "
                             f"{tuple(f.shape)} and {tuple(image.shape)}")
        H, W = f.shape[1:]
        if labels is not None and tuple(labels[b].shape) != (H, W):
            raise ValueError(f"image {b}: labels must be [H, W] = {(H, W)}, got {tuple(labels[b].shape)}")
        if (H, W) not in grids:
            edges = grid_edges(H, W, connectivity).to(f.device)
            axis = H * (W - 1) + W * (H - 1)  # the 4-connected edges come first
            grids[H, W] = edges, torch.cat([torch.ones(axis), torch.full((len(edges) - axis,), 2 ** 0.5)])
        edges, length = grids[H, W]
        e = edge_features(image.to(torch.float64), edges, beta=beta, layout="chw", scales=contrast_scales)
        e = e if contrast else e[:, :1]
        ex.append(e if connectivity == 4 else e / length.to(e)[:, None])
        xs.append(f.permute(1, 2, 0).reshape(H * W, f.shape[0]))
    ys = None if labels is None else [y.long() if y.dtype == torch.bool else y for y in labels]
    return GraphData.from_graphs(xs, [grids[tuple(f.shape[1:])][0] for f in features], ex, ys)


# ----------------------------------------------------------------------------- graphs of pixel grids
def grid_edges(height: int, width: int, connectivity: int = 4) -> Tensor:
    """Edges of an ``height x width`` pixel grid, nodes numbered ``r * width + c``: ``LongTensor[M, 2]``, all
    horizontal edges (row-major), then all vertical ones (``M = height (width - 1) + width (height - 1)``), then
    with ``connectivity=8`` the diagonals ``(r, c)-(r+1, c+1)`` and then ``(r, c+1)-(r+1, c)``."""
    if connectivity not in (4, 8):
        raise ValueError(f"connectivity must be 4 or 8, got {connectivity}")
    ids = torch.arange(height * width).reshape(height, width)
    pairs = [(ids[:, :-1], ids[:, 1:]), (ids[:-1, :], ids[1:, :])]
    if connectivity == 8:
        pairs += [(ids[:-1, :-1], ids[1:, 1:]), (ids[:-1, 1:], ids[1:, :-1])]
    return torch.cat([torch.stack([a.reshape(-1), b.reshape(-1)], dim=1) for a, b in pairs], dim=0)


def _pixels(image: Tensor, layout: str) -> Tensor:
    """Flatten ``image`` (``[H, W]``, ``[H, W, C]`` or ``[C, H, W]``) to ``Tensor[H * W, C]`` in row-major pixel
    order.  ``layout``: ``"hwc"``, ``"chw"`` or ``"auto"`` (channels-first iff the first dimension is 1 or 3 and
    the last is not; ambiguous shapes raise ``ValueError``)."""
    if image.dim() == 2:
        return image.reshape(-1, 1)
    if image.dim() != 3:
        raise ValueError(f"image must be [H, W], [H, W, C] or [C, H, W]; got {tuple(image.shape)}")
    if layout == "auto":
        first, last = image.shape[0] in (1, 3), image.shape[2] in (1, 3)
        if first == last:
            raise ValueError(
                f"cannot tell channels-first from channels-last for shape {tuple(image.shape)}; "
                "pass layout='chw' or layout='hwc'"
            )
        layout = "chw" if first else "hwc"
    if layout == "chw":
        image = image.permute(1, 2, 0)
    elif layout != "hwc":
        raise ValueError(f"layout must be 'auto', 'hwc' or 'chw', got {layout!r}")
    return image.reshape(-1, image.shape[2])


def edge_features(image: Tensor, edges: Tensor, beta: float | None = None, layout: str = "auto",
                  scales: Sequence[float] = (1.0,)) -> Tensor:
    """Contrast-sensitive Potts edge features (GrabCut, Rother et al. 2004).

    Args:
        image: ``Tensor[H, W, C]``, ``Tensor[C, H, W]`` or ``Tensor[H, W]`` (``layout``: see :func:`_pixels`).
        edges: ``LongTensor[M, 2]`` of pixel indices ``r * W + c``.
        beta: contrast scale; default ``1 / (2 mean_pq ||I_p - I_q||^2)`` over ``edges`` (0 for a constant image).
        scales: multiples of ``beta``, one contrast feature each.

    Returns:
        ``Tensor[M, 1 + len(scales)]`` (``image``'s floating dtype, float32 for integers):
        ``[1, exp(-s beta ||I_p - I_q||^2) for s in scales]``.
    """
    pixels = _pixels(image, layout)
    if not pixels.dtype.is_floating_point:
        pixels = pixels.to(torch.float32)
    sq_dist = (pixels[edges[:, 0]] - pixels[edges[:, 1]]).pow(2).sum(dim=1)
    if beta is None:
        mean = float(sq_dist.mean()) if sq_dist.numel() else 0.0
        beta = 1.0 / (2.0 * mean) if mean > 0 else 0.0
    return torch.stack([torch.ones_like(sq_dist), *(torch.exp(-(s * beta) * sq_dist) for s in scales)], dim=1)
