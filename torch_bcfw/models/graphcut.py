"""Binary segmentation of graphs with an attractive (contrast-sensitive) Potts term, decoded by min-cut.

Data: a :class:`~torch_bcfw.data.graphs.GraphData` (per graph: node features ``x_p``, edges with non-negative
features ``f_pq``, labels ``y_p in {0, 1}``, optional node masses ``a_p``).  The joint feature map (``d = F + E``;
``d = F`` with ``pairwise=False``) is normalised by the node mass ``Z_i = sum_p a_p``::

    phi(x_i, y) = 1/Z_i [ sum_p a_p y_p x_p ;  - sum_{pq in E_i} [y_p != y_q] f_pq ]

With the sign of Osokin et al. (2016, App. I) ``w_P >= 0`` means attractive, so every problem is submodular
(:meth:`GraphCut.weight_bounds`, App. H); a negative pairwise weight raises ``ValueError``.  Losses: ``"hamming"``
(normalised by the node mass) and ``"balanced"``, ``(FN / A_1 + FP / A_0) / 2`` (App. I), both in ``[0, 1]``.
A batch of at least ``pool_min_nodes`` nodes is cut in a
:class:`~torch_bcfw.inference.graphcut_pool.ResidentGraphCutPool`, with answers bit-identical to this process's.
"""
from __future__ import annotations

import hashlib

import numpy as np
import torch
from torch import Tensor

from ..checks import check_bool, check_int
from ..duals.graphcut import GraphCutDualState
from ..data.graphs import GraphData
from ..inference.graphcut import NEGATIVE_TOLERANCE, available_cpus
from ..inference.graphcut_pool import GraphRecord, ResidentGraphCutPool, decode_record, solve_records
from .base import StructuredModel

__all__ = ["GraphCut", "LOSSES"]

LOSSES = ("hamming", "balanced")


class GraphCut(StructuredModel):
    """Binary graph labelling SSVM with unary features and a non-negative contrast-sensitive Potts term.

    Args:
        n_node_features: node feature dimension ``F``.
        n_edge_features: edge feature dimension ``E`` (ignored with ``pairwise=False``).
        loss: ``"hamming"`` (normalised) or ``"balanced"`` (class-balanced) Hamming loss.
        pairwise: include the Potts term (``d = F + E``); ``False``: independent nodes (``d = F``).
        processes: processes of the worker pool for batched oracle calls, at most the available CPUs (``None``:
            the available CPUs; ``1``: always in this process).
        pool_min_nodes: batches with fewer nodes in all are cut in this process (a pool round trip costs
            about a millisecond).

    ``w = [w_U (F), w_P (E)]``.
    """

    #: the oracle is a max-flow per image
    expensive_oracle = True
    #: the dual state runs plain BCFW steps in one compiled loop (the cut called back), the refinements interpreted
    compiled_steps = "plain"

    def __init__(self, n_node_features: int, n_edge_features: int = 2, loss: str = "hamming", pairwise: bool = True,
                 processes: int | None = None, pool_min_nodes: int = 20_000):
        n_node_features = check_int(n_node_features, "n_node_features", minimum=1)
        n_edge_features = check_int(n_edge_features, "n_edge_features")
        pairwise = check_bool(pairwise, "pairwise")
        processes = None if processes is None else check_int(processes, "processes")
        pool_min_nodes = check_int(pool_min_nodes, "pool_min_nodes")
        if n_edge_features < 0 or (pairwise and n_edge_features < 1):
            raise ValueError(f"n_edge_features must be >= 1 with pairwise terms, got {n_edge_features}")
        if loss not in LOSSES:
            raise ValueError(f"loss must be one of {LOSSES}, got {loss!r}")
        if processes is not None and processes < 1:
            raise ValueError(f"processes must be >= 1 or None, got {processes}")
        self.n_inputs = n_node_features
        self.n_edge_inputs = n_edge_features
        self.loss_name = loss
        self.pairwise = pairwise
        self.processes = processes
        self.pool_min_nodes = pool_min_nodes
        self.n_features = self.n_inputs + (self.n_edge_inputs if self.pairwise else 0)
        self._pool: ResidentGraphCutPool | None = None

    def config(self) -> dict:
        return {"n_node_features": self.n_inputs, "n_edge_features": self.n_edge_inputs, "loss": self.loss_name,
                "pairwise": self.pairwise, "processes": self.processes, "pool_min_nodes": self.pool_min_nodes}

    def __getstate__(self):  # the pool's processes stay behind
        state = dict(self.__dict__)
        state["_pool"] = None
        return state

    def __deepcopy__(self, memo):
        return type(self)(**self.config())

    def close(self) -> None:
        """Stop the worker pool (a later batched call starts a new one)."""
        if self._pool is not None:
            self._pool.close()
            self._pool = None

    def check_data(self, data, require_labels: bool = True) -> None:
        if not isinstance(data, GraphData):
            raise TypeError(f"GraphCut expects GraphData, got {type(data).__name__}")
        if data.n_inputs != self.n_inputs:
            raise ValueError(f"node features have dimension {data.n_inputs} but the model expects {self.n_inputs}")
        if self.pairwise and data.n_edge_inputs != self.n_edge_inputs:
            raise ValueError(f"edge features have dimension {data.n_edge_inputs} but the model expects "
                             f"{self.n_edge_inputs}")
        self._check_labels(data.y, require_labels)

    def weight_bounds(self):
        """``(lower, upper)``: ``w_P >= 0`` (attractive Potts, submodular cuts), ``w_U`` free; ``None`` without
        pairwise terms."""
        if not self.pairwise:
            return None
        lower = torch.full((self.n_features,), -float("inf"), dtype=torch.float64)
        lower[self.n_inputs:] = 0.0
        return lower, torch.full((self.n_features,), float("inf"), dtype=torch.float64)

    def _labels(self, data: GraphData, y: Tensor) -> Tensor:
        y = torch.as_tensor(y, device=data.device).reshape(-1)
        if y.shape[0] != data.n_nodes:
            raise ValueError(f"expected {data.n_nodes} node labels, got {y.shape[0]}")
        if y.is_floating_point():
            raise ValueError("labelings must hold integer labels in {0, 1}")
        if y.numel():
            lo, hi = torch.aminmax(y)
            if int(lo) < 0 or int(hi) > 1:
                raise ValueError("labelings must be in {0, 1}")
        return y.long()

    def joint_feature(self, data: GraphData, y: Tensor) -> Tensor:
        """``phi(x_i, y_i')``: ``Tensor[n, d]`` float64 (see the module docstring)."""
        y = self._labels(data, y)
        unary = self.unary_feature(data, y.to(torch.float64))
        if not self.pairwise:
            return unary
        cut = _cut_edges(data, y) * data.edge_scale()
        if len(data) == 1:
            pair = (cut @ data.edge_x64())[None]
        else:
            pair = torch.zeros(len(data), self.n_edge_inputs, dtype=torch.float64, device=data.device)
            pair.index_add_(0, data.edge_graph(), data.edge_x64() * cut[:, None])
        return torch.cat([unary, -pair], 1)

    def unary_feature(self, data: GraphData, mu: Tensor) -> Tensor:
        """Unary block of ``phi`` for (possibly fractional) node labels ``mu: Tensor[N_tot]`` (float64):
        ``sum_p a_p mu_p x_p / Z_i``, ``Tensor[n, F]`` (linear in ``mu``)."""
        yw = data.node_scale() * mu
        if len(data) == 1:
            return (yw @ data.x64())[None]
        unary = torch.zeros(len(data), self.n_inputs, dtype=torch.float64, device=data.device)
        return unary.index_add_(0, data.node_graph(), data.x64() * yw[:, None])

    def dual_state(self, data, lam: float, n_total: int | None = None) -> GraphCutDualState:
        """A :class:`~torch_bcfw.duals.graphcut.GraphCutDualState` (dense ``w_i`` plus node marginals)."""
        return GraphCutDualState(self, data, lam, n_total)

    def builtin_oracle(self) -> bool:
        """True unless a subclass overrides :meth:`oracle` (it then gets the generic steps)."""
        return type(self).oracle is GraphCut.oracle

    def loss_weights(self, data: GraphData) -> Tensor:
        """``omega: Tensor[N_tot]`` float64 with ``L_i(y) = sum_{p in i} omega_p [y_p != y_i,p]`` (cached on ``data``)."""
        return data.cached(f"omega_{self.loss_name}", lambda: _loss_weights(data, self.loss_name == "balanced"))

    def loss(self, data: GraphData, y: Tensor) -> Tensor:
        y = self._labels(data, y)
        return _segment_sum(data, self.loss_weights(data) * (y != data.y).to(torch.float64), nodes=True)

    def score(self, w: Tensor, data: GraphData, y: Tensor) -> Tensor:
        """``<w, phi(x_i, y_i')>`` per graph (``Tensor[n]`` float64) without forming ``phi``: node gains and
        edge penalties at ``w`` (any sign) summed over the labelling."""
        y = self._labels(data, y)
        w64 = w.to(torch.float64)
        out = _segment_sum(data, self.unary_gains(w64, data) * y.to(torch.float64), nodes=True)
        if self.pairwise and data.edges.shape[0]:
            c = (data.edge_x64() @ w64[self.n_inputs:]) * data.edge_scale()
            out = out - _segment_sum(data, c * _cut_edges(data, y), nodes=False)
        return out

    def hinge_terms(self, w: Tensor, data: GraphData) -> tuple[Tensor, Tensor]:
        """``(y*, H)`` as :meth:`~torch_bcfw.models.base.StructuredModel.hinge_terms`; with pairwise terms each
        graph's answer, loss and score come together from :func:`~torch_bcfw.inference.graphcut_pool.solve_records`."""
        self.check_weights(w, data)
        if data.y is None:
            raise ValueError("loss-augmented decoding needs labels (y is None)")
        w64 = w.to(torch.float64)
        truth = data.cached(f"phi_true_{self.pairwise}", lambda: self.joint_feature(data, data.y))
        if not self.pairwise or type(self).oracle is not GraphCut.oracle:  # e.g. a subclass with its own oracle
            y_star = self.oracle(w64, data, loss_augmented=True)
            return y_star, self.loss(data, y_star) + self.score(w64, data, y_star) - truth @ w64
        seg, loss, score = self._decode(w64, data, loss_augmented=True, terms=True)
        y_star = torch.from_numpy(seg).to(device=data.device, dtype=torch.long)
        H = torch.from_numpy(loss + score).to(data.device) - truth @ w64
        return y_star, H

    def unary_gains(self, w: Tensor, data: GraphData, loss_augmented: bool = False) -> Tensor:
        """``u_p(1) - u_p(0) = a_p <w_U, x_p> / Z_i`` (plus ``omega_p (1 - 2 y_p)`` when loss-augmented): ``[N_tot]``."""
        gain = (data.x64() @ w.to(torch.float64)[: self.n_inputs]) * data.node_scale()
        if loss_augmented:
            if data.y is None:
                raise ValueError("loss-augmented decoding needs labels (y is None)")
            gain = gain + data.cached(f"aug_{self.loss_name}",
                                       lambda: self.loss_weights(data) * (1.0 - 2.0 * data.y.to(torch.float64)))
        return gain

    def pairwise_weights(self, w: Tensor) -> Tensor:
        """``w_P: Tensor[E]`` (float64), checked to be ``>= 0``; raises ``ValueError`` otherwise."""
        w_p = w.to(torch.float64)[self.n_inputs:]
        if w_p.numel() and float(w_p.min()) < -NEGATIVE_TOLERANCE:
            raise ValueError(
                f"pairwise weights must be >= 0 for an exact graph cut (submodular energy), got minimum "
                f"{float(w_p.min()):.6g}; train with the model's weight_bounds() (the default of fit / BCFW)"
            )
        return w_p.clamp_min(0.0)

    def penalties(self, w: Tensor, data: GraphData) -> Tensor:
        """Potts penalties ``c_pq = <w_P, f_pq> / Z_i`` of every edge: ``Tensor[M_tot]`` float64, ``>= 0``."""
        return (data.edge_x64() @ self.pairwise_weights(w)) * data.edge_scale()

    def oracle(self, w: Tensor, data: GraphData, loss_augmented: bool = True) -> Tensor:
        """``argmax_y [L_i(y)] + <w, phi(x_i, y)>`` for every graph: packed ``LongTensor[N_tot]``."""
        self.check_weights(w, data)
        if loss_augmented and data.y is None:
            raise ValueError("loss-augmented decoding needs labels (y is None)")
        if not self.pairwise or data.edges.shape[0] == 0:
            return (self.unary_gains(w, data, loss_augmented) > 0).long()
        seg, _, _ = self._decode(w.to(torch.float64), data, loss_augmented, terms=False)
        return torch.from_numpy(seg).to(device=data.device, dtype=torch.long)

    def _decode(self, w64: Tensor, data: GraphData, loss_augmented: bool,
                terms: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """:func:`~torch_bcfw.inference.graphcut_pool.solve_records` on all graphs, here or in the worker pool."""
        w_e = self.pairwise_weights(w64).cpu().numpy()
        w_u = w64[: self.n_inputs].cpu().numpy()
        records = self.graph_records(data)
        if len(data) == 1 and not terms:
            seg, _, _ = decode_record(records[0], w_u, w_e, loss_augmented)
            return seg, None, None
        if self._use_pool(data):
            return self._get_pool().solve_records(self.record_keys(data), records.__getitem__, data.lengths.tolist(),
                                                  w_u, w_e, loss_augmented, terms)
        return solve_records(records, w_u, w_e, loss_augmented, terms)

    def graph_records(self, data: GraphData) -> list:
        """Per graph a :data:`~torch_bcfw.inference.graphcut_pool.GraphRecord` (CPU numpy views; cached on
        ``data`` per loss)."""
        return data.cached(f"gc_records_{self.loss_name}", lambda: _graph_records(self, data))

    def record_keys(self, data: GraphData) -> list[bytes]:
        """A content key per graph record (BLAKE2b of the graph key and record arrays; cached on ``data``): the
        worker pool keeps records by these keys."""
        def make():
            keys = []
            for gk, rec in zip(data.graph_keys(), self.graph_records(data)):
                h = hashlib.blake2b(gk, digest_size=16)
                for a in (rec.x, rec.node_scale, rec.aug, rec.truth, rec.omega):
                    h.update(np.ascontiguousarray(a).tobytes())
                h.update(np.array([rec.inv_z]).tobytes())
                keys.append(h.digest())
            return keys
        return data.cached(f"gc_keys_{self.loss_name}", make)

    def _processes(self) -> int:
        """The pool's processes: ``processes``, never more than the CPUs this process may run on."""
        cpus = available_cpus()
        return cpus if self.processes is None else min(self.processes, cpus)

    def _use_pool(self, data: GraphData) -> bool:
        return self._processes() > 1 and len(data) > 1 and data.n_nodes >= self.pool_min_nodes

    def _get_pool(self) -> ResidentGraphCutPool:
        if self._pool is None:
            self._pool = ResidentGraphCutPool(self._processes())
        return self._pool


def _graph_records(model: GraphCut, data: GraphData) -> list:
    """:data:`~torch_bcfw.inference.graphcut_pool.GraphRecord` of every graph (views into whole-data arrays)."""
    x = data.x64().detach().cpu().numpy()
    ns = data.node_scale().cpu().numpy()
    inv_z = (1.0 / data.mass()).cpu().tolist()
    off = data.offsets.cpu().tolist()
    if data.y is not None:
        omega = model.loss_weights(data)
        aug = (omega * (1.0 - 2.0 * data.y.to(torch.float64))).cpu().numpy()
        truth = data.y.cpu().numpy().astype(bool)
        om = omega.cpu().numpy()
    records = []
    empty_f, empty_b = np.zeros(0), np.zeros(0, dtype=bool)
    ends: dict = {}  # graphs sharing an edges array (cpu_graphs) share its endpoint columns too
    for j, (edges, edge_x) in enumerate(data.cpu_graphs()):
        a, b = off[j], off[j + 1]
        lab = (aug[a:b], truth[a:b], om[a:b]) if data.y is not None else (empty_f, empty_b, empty_f)
        if id(edges) not in ends:
            ends[id(edges)] = (edges, np.ascontiguousarray(edges[:, 0]), np.ascontiguousarray(edges[:, 1]))
        records.append(GraphRecord(x[a:b], ns[a:b], *lab, edges, *ends[id(edges)][1:], edge_x, float(inv_z[j])))
    return records


def _cut_edges(data: GraphData, y: Tensor) -> Tensor:
    """``[y_p != y_q]`` of every edge as float64 ``Tensor[M_tot]``."""
    ge = data.global_edges()
    return (y[ge[:, 0]] != y[ge[:, 1]]).to(torch.float64)


def _segment_sum(data: GraphData, values: Tensor, nodes: bool) -> Tensor:
    """Per-graph sums of per-node (``nodes=True``) or per-edge ``values``: ``Tensor[n]``."""
    if len(data) == 1:
        return values.sum().reshape(1)
    index = data.node_graph() if nodes else data.edge_graph()
    return torch.zeros(len(data), dtype=values.dtype, device=values.device).index_add_(0, index, values)


def _loss_weights(data: GraphData, balanced: bool) -> Tensor:
    """Node weights of the Hamming loss, ``Tensor[N_nodes]``: each node's mass over its graph's mass (normalised), or
    ``balanced``, over the mass of its true class in its graph times the number of classes present there (each
    present class weighs 1/#classes of the graph's loss)."""
    if data.y is None:
        raise ValueError("the task loss needs labels (y is None)")
    a, g = data.node_mass(), data.node_graph()
    if not balanced:
        return a / data.mass()[g]
    cls = g * 2 + data.y
    class_mass = torch.zeros(2 * len(data), dtype=torch.float64, device=data.device).index_add_(0, cls, a)
    present = (class_mass.view(-1, 2) > 0).sum(1).to(torch.float64)
    safe = torch.where(class_mass > 0, class_mass, torch.ones_like(class_mass))
    return a / (present[g] * safe[cls])
