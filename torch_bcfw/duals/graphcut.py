"""The dual state of the graph-cut model: dense ``w_i`` plus node marginals, re-bindable to new features.

For :class:`~torch_bcfw.models.graphcut.GraphCut` block ``i``'s dual variables ``alpha_i`` enter ``w_i = A alpha_i``
only through the node marginals ``mu_p = sum_y alpha_i(y) y_p`` (``Tensor[N_tot]``) and the expected pairwise block
``pw_i = sum_y alpha_i(y) phi_P(x_i, y)`` (``Tensor[n, E]``, feature-independent): ``w_i = (phi(x_i, y_i) - [U_i(mu)
; pw_i]) / (lam n)`` with ``U_i(mu) = sum_p a_p mu_p x_p / Z_i``.  :class:`GraphCutDualState` keeps the dense
``[n, d]`` table of :class:`~torch_bcfw.duals.dense.DenseTable` for the steps and moves ``(mu, pw)`` along with
it; its saved ``(mu, pw)`` re-derive ``w_i`` exactly under new node features, in ``O(N_tot)`` memory.

Whether saved ``(mu, pw)`` are the marginals of a distribution over the labelings (the marginal polytope of a graph
with cycles) cannot be decided fast, so the blocks of a loaded state are *untrusted*, as a
:class:`~torch_bcfw.duals.dense.DenseTable`'s: the certificate counts their loaded fraction at the ground truth.
"""
from __future__ import annotations

import hashlib
import sys
import time
from typing import NamedTuple

import numpy as np
import torch
from numba import njit, objmode, types
from numba.typed import List
from torch import Tensor

from ..checks import saved_tensor
from ..inference.graphcut import NEGATIVE_TOLERANCE, build_graph, cut_graph
from ..inference.graphcut_pool import GraphRecord, cut_inputs
from .base import LOAD_TOL
from .dense import DenseTable
from .fingerprint import features_fingerprint
from .plan import PlanResult, StepPlan
from .stepsize import fw_commit

__all__ = ["GraphCutDualState"]


def _checked_pairwise(w_p: np.ndarray) -> np.ndarray:
    """``max(w_P, 0)``, raising ``ValueError`` below ``-NEGATIVE_TOLERANCE`` (same rule as ``GraphCut.oracle``)."""
    if w_p.size and float(w_p.min()) < -NEGATIVE_TOLERANCE:
        raise ValueError(f"pairwise weights must be >= 0 for an exact graph cut (submodular energy), got minimum "
                         f"{float(w_p.min()):.6g}; train with the model's weight_bounds()")
    return np.maximum(w_p, 0.0)


if sys.platform.startswith("linux"):
    _clock_gettime = types.ExternalFunction("clock_gettime", types.int32(types.int32, types.voidptr))
    _MONOTONIC = time.CLOCK_MONOTONIC

    @njit(cache=True)
    def _now(ts):
        """Monotonic seconds from compiled code without a round trip through the interpreter (``ts``: int64[2]
        scratch for the ``timespec``)."""
        _clock_gettime(_MONOTONIC, ts.ctypes)
        return ts[0] + 1e-9 * ts[1]
else:  # pragma: no cover - other platforms: the interpreter's clock
    @njit(cache=True)
    def _now(ts):
        """Monotonic seconds (``time.perf_counter`` through object mode)."""
        with objmode(t="float64"):
            t = time.perf_counter()
        return t


def _cut(gain: np.ndarray, edges: np.ndarray, penalties: np.ndarray) -> np.ndarray:
    """The min cut of one loss-augmented problem (PyMaxflow), called back from :func:`_step_loop`: ``bool[N]``."""
    return np.ascontiguousarray(cut_graph(*build_graph(gain, edges, penalties)))


class GraphCutGraphs(NamedTuple):
    """The data of the compiled step loop: ``records`` (typed list of
    :class:`~torch_bcfw.inference.graphcut_pool.GraphRecord`), ``phi_true`` (``float64[n, d]``), ``seg_off``
    (``int64[n + 1]`` node offsets), ``F`` (unary dimension) and ``checked`` (the box keeps ``w_P >= 0``)."""

    records: object
    phi_true: np.ndarray
    seg_off: np.ndarray
    F: int
    checked: bool


class GraphCutWeights(NamedTuple):
    """``V`` (the untruncated ``v``), ``W`` (``w = clip(v, lo, hi)`` with a ``box``, else ``V`` itself)."""

    V: np.ndarray
    W: np.ndarray
    lo: np.ndarray
    hi: np.ndarray
    box: bool


class GraphCutBlocks(NamedTuple):
    """The dual state: the dense ``w_i`` table ``WB[n, d]``, node marginals ``mu``, expected pairwise features
    ``pw[n, E]`` and ``block_ell`` (``l_i``)."""

    WB: np.ndarray
    mu: np.ndarray
    pw: np.ndarray
    block_ell: np.ndarray


class GraphCutAverages(NamedTuple):
    """The lazy weighted average: ``WBa``, ``mu_acc``, ``pw_acc``, ``acc_w`` (``sum_t S_t`` per block), ``last``."""

    WBa: np.ndarray
    mu_acc: np.ndarray
    pw_acc: np.ndarray
    acc_w: np.ndarray
    last: np.ndarray


#: the counters the step loop keeps up to date after every step (one record): ``l``, ``avg_l_u``, the oracle's
#: seconds, ``k`` and the averaging clock
LOOP_TOTALS = np.dtype([("ell", np.float64), ("avg_ell_u", np.float64), ("oracle_seconds", np.float64),
                        ("k", np.int64), ("clock", np.int64)])


@njit(cache=True)
def _fused_block_step(seg, rec, i, a, phi_true, w, blocks, avg, lam, step_code, totals, averaging):
    """One BCFW block step towards the labelling ``seg`` (bool[N_i]) of block ``i`` (graph record ``rec``, nodes ``a ..
    a + N_i``, true features ``phi_true``): ``phi(x_i, seg)``, ``L_i(seg) / n``, the direction ``d = w_i - w_s``, the
    gap ``num = lam <d, w> - l_i + l_s``, the step and its commit (:func:`~.stepsize.fw_commit`: the lazy average,
    ``l_i``, ``l`` and ``avg_l_u`` in ``totals[0]``, whose ``k`` and ``clock`` it reads) and the in-place moves of
    ``w_i``, ``mu``, ``pw``, ``v`` and ``w = clip(v)``.  Returns ``(num, gamma)``."""
    x, ns, e0, e1, edge_x, truth, omega = rec.x, rec.node_scale, rec.e0, rec.e1, rec.edge_x, rec.truth, rec.omega
    V, W = w.V, w.W
    WB, mu, pw = blocks.WB, blocks.mu, blocks.pw
    n = WB.shape[0]
    scale = 1.0 / (lam * n)
    N, F = x.shape
    E = edge_x.shape[1]
    D = F + E
    phi = np.zeros(D)
    loss = 0.0
    for p in range(N):
        if seg[p]:
            s = ns[p]
            for f in range(F):
                phi[f] += x[p, f] * s
        if seg[p] != truth[p]:
            loss += omega[p]
    pair = np.zeros(E)
    if E == 2:  # the contrast-sensitive Potts features: scalar accumulators
        p0 = 0.0
        p1 = 0.0
        for j in range(e0.shape[0]):
            if seg[e0[j]] != seg[e1[j]]:
                p0 += edge_x[j, 0]
                p1 += edge_x[j, 1]
        pair[0] = p0
        pair[1] = p1
    else:
        for j in range(e0.shape[0]):
            if seg[e0[j]] != seg[e1[j]]:
                for e in range(E):
                    pair[e] += edge_x[j, e]
    for e in range(E):
        phi[F + e] = -pair[e] * rec.inv_z
    ell_s = loss / n
    d = np.empty(D)
    dw = 0.0
    dd = 0.0
    for q in range(D):
        d[q] = WB[i, q] - (phi_true[q] - phi[q]) * scale
        dw += d[q] * W[q]
        dd += d[q] * d[q]
    ell_i = blocks.block_ell[i]
    num = lam * dw - ell_i + ell_s
    tot = totals[0]
    gamma, S = fw_commit(step_code, num, lam * dd, tot.k, n, ell_s, averaging, tot.clock, avg.last, blocks.block_ell, i,
                         totals)
    if gamma != 0.0:
        if S != 0.0:
            for q in range(D):
                avg.WBa[i, q] += S * WB[i, q]
            for e in range(E):
                avg.pw_acc[i, e] += S * pw[i, e]
            avg.acc_w[i] += S
        for q in range(D):
            WB[i, q] -= gamma * d[q]
        if S != 0.0:  # one pass over the block's marginals: accumulate the old value, then move it
            for p in range(N):
                m = mu[a + p]
                avg.mu_acc[a + p] += S * m
                mu[a + p] = (1.0 - gamma) * m + gamma * (1.0 if seg[p] else 0.0)
        else:
            for p in range(N):
                mu[a + p] = (1.0 - gamma) * mu[a + p] + gamma * (1.0 if seg[p] else 0.0)
        for e in range(E):
            pw[i, e] = (1.0 - gamma) * pw[i, e] + gamma * phi[F + e]
        for q in range(D):
            V[q] -= gamma * d[q]
        if w.box:
            for q in range(D):
                v = V[q]
                if v < w.lo[q]:
                    v = w.lo[q]
                if v > w.hi[q]:
                    v = w.hi[q]
                W[q] = v
    return num, gamma


@njit(cache=True)
def _step_loop(order, step_code, averaging, lam, graphs, w, blocks, avg, totals, gaps, loaded):
    """The plain BCFW steps of :meth:`GraphCutDualState.run_plan`: per step ``j`` the oracle (gains and penalties by
    :func:`~torch_bcfw.inference.graphcut_pool.cut_inputs`, the cut by PyMaxflow in object mode) and
    :func:`_fused_block_step`; ``gaps[j]`` receives the block gap, and a step of size ``gamma`` on block ``i``
    multiplies ``loaded[i]`` by ``1 - gamma`` (``float64[n]``, or empty when no block is untrusted).  ``totals[0]`` (:data:`LOOP_TOTALS`) is updated
    after every step, so an interruption leaves it consistent.  Returns the number of steps done: fewer than
    ``len(order)`` when the unchecked pairwise weights are below ``-NEGATIVE_TOLERANCE`` (the caller raises)."""
    tot = totals[0]
    W = w.W
    F = graphs.F
    ts = np.zeros(2, dtype=np.int64)
    for j in range(order.shape[0]):
        i = order[j]
        rec = graphs.records[i]
        t0 = _now(ts)
        w_u = W[:F]
        w_p = W[F:]
        if not graphs.checked:
            if w_p.size and w_p.min() < -NEGATIVE_TOLERANCE:
                return j
            w_p = np.maximum(w_p, 0.0)
        edges = rec.edges
        _, gain, c = cut_inputs(rec.x, w_u, rec.node_scale, rec.aug, True, edges, rec.edge_x, w_p, rec.inv_z)
        if c.shape[0] == 0:
            seg = gain > 0.0
        else:
            with objmode(seg="boolean[::1]"):
                seg = _cut(gain, edges, c)
        tot.oracle_seconds += _now(ts) - t0
        num, gamma = _fused_block_step(seg, rec, i, graphs.seg_off[i], graphs.phi_true[i], w, blocks, avg, lam,
                                       step_code, totals, averaging)
        gaps[j] = num
        if loaded.shape[0]:  # the loaded fraction of alpha_i (DenseTable._shrink_untrusted)
            loaded[i] *= 1.0 - gamma
        tot.k += 1
        tot.clock += 1
    return order.shape[0]


class GraphCutDualState(DenseTable):
    """Dense ``w_i`` plus node marginals ``mu`` and expected pairwise features ``pw`` (see the module docstring).

    Attributes:
        mu: ``Tensor[N_tot]`` float64 node marginals of the label 1.
        pw: ``Tensor[n, d - F]`` float64 expected pairwise block of ``phi``.
        mu_acc, pw_acc, acc_w: averaging accumulators (``sum_t S_t mu_t`` etc. and ``sum_t S_t`` per block).

    A checkpoint holds ``(mu, pw)`` and their accumulators (``w_i`` re-derived under any features) plus, valid
    under the same features (a fingerprint), the ``w_i`` table itself, so resuming on the same data is bit-exact.
    Loaded blocks are untrusted (see the module docstring).
    """

    rebindable = True

    def __init__(self, model, data, lam: float, n_total: int | None = None):
        super().__init__(model, data, lam, n_total)
        self.F = model.n_inputs
        self._seg = data.offsets.tolist()
        self.mu = data.y.to(torch.float64).clone()
        self.pw = self._true_pairwise().clone()
        self.mu_acc = torch.zeros_like(self.mu)
        self.pw_acc = torch.zeros_like(self.pw)
        self.acc_w = torch.zeros(self.n, dtype=torch.float64, device=data.device)
        #: wall time spent in the loss-augmented oracle of the fused step loop (features + graph + max-flow)
        self.oracle_seconds = 0.0

    # ------------------------------------------------------------ helpers
    def _true_pairwise(self) -> Tensor:
        return self._true_features(slice(None))[:, self.F:]

    def _pairwise_fingerprint(self) -> str:
        """Hash of what the expected pairwise block ``pw`` depends on: the edges, their features and the node
        weights (the node mass normalises both terms).  ``pw`` cannot be re-derived when these change."""
        d = self.data
        return features_fingerprint([d.offsets, d.edges, d.edge_x, d.edge_offsets, d.node_weight])

    def _features_fingerprint(self) -> bytes:
        """BLAKE2b of the graph records' keys (features, scales, labels, edges, edge features)."""
        h = hashlib.blake2b(digest_size=16)
        for key in self.model.record_keys(self.data):
            h.update(key)
        return h.digest()

    def _nodes(self, i: int) -> slice:
        return slice(self._seg[i], self._seg[i + 1])

    def _pair_of(self, i: int, y: Tensor) -> Tensor:
        """Pairwise block of ``phi(x_i, y)`` (reuses the one :meth:`block_direction` just computed)."""
        if self._last_phi is not None and self._last_phi[0] == i and self._last_phi[1] is y:
            return self._last_phi[2][self.F:]
        return self.model.joint_feature(self.block_data(i), y)[0, self.F:]

    # ------------------------------------------------------------ the compiled step loop
    def _graphs(self) -> GraphCutGraphs:
        """For :meth:`run_plan` (built once): the model's per-graph records as a numba typed list, ``phi(x_i, y_i):
        float64[n, d]`` and the node offsets ``int64[n + 1]``; ``checked`` is set per call."""
        graphs = self.__dict__.get("_np_graphs")
        if graphs is None:
            self._true_pairwise()
            records = List()
            for rec in self.model.graph_records(self.data):
                arrays = {k: np.ascontiguousarray(v) for k, v in rec._asdict().items() if k != "inv_z"}
                records.append(GraphRecord(**arrays, inv_z=float(rec.inv_z)))
            graphs = GraphCutGraphs(records, np.ascontiguousarray(self._phi_true.cpu().numpy()),
                                    np.asarray(self._seg, dtype=np.int64), self.F, False)
            self._np_graphs = graphs
        return graphs

    def can_run_plan(self, plan: StepPlan) -> bool:
        """Plain plans run in the compiled loop on CPU, with the model's own oracle, over all the blocks of the
        problem (see :meth:`run_plan`)."""
        return (plan.is_plain and self.data.device.type == "cpu" and self.model.pairwise
                and self.model.builtin_oracle() and self.n_total == self.n)

    def run_plan(self, plan: StepPlan) -> PlanResult:
        """A plain plan that :meth:`can_run_plan` in the compiled loop :func:`_step_loop` (the generic loop's iterates
        up to rounding; the oracle's time is added to :attr:`oracle_seconds`; interrupted, the state holds exactly the
        finished steps).  Other plans: as every state."""
        if not self.can_run_plan(plan):
            return super().run_plan(plan)
        F = self.F
        V, WB, WBa = self.v.numpy(), self.w_blocks.numpy(), self.w_blocks_acc.numpy()
        box = bool(self._box)
        lo = self.lower.numpy() if box else V[:0]
        hi = self.upper.numpy() if box else V[:0]
        W = np.clip(V, lo, hi) if box else V  # updated in place by the kernel
        graphs = self._graphs()._replace(checked=box and bool((lo[F:] >= 0.0).all()))  # w_P >= 0: no check needed
        order = np.ascontiguousarray(plan.order, dtype=np.int64)
        gaps = np.empty(len(order), dtype=np.float64)
        totals = np.array([(self.ell, self.avg_ell_u, 0.0, self.k, self.avg_t)], dtype=LOOP_TOTALS)
        loaded = V[:0]
        if self._untrusted is not None:  # capture the wholly untrusted blocks; the loop shrinks their fractions
            self._shrink_untrusted(torch.from_numpy(np.unique(order)), 0.0)
            loaded = self._untrusted[0].numpy()
        done = len(order)
        try:
            done = _step_loop(order, int(plan.step_code), bool(plan.averaging), self.lam, graphs,
                              GraphCutWeights(V, W, lo, hi, box),
                              GraphCutBlocks(WB, self.mu.numpy(), self.pw.numpy(), self.block_ell.numpy()),
                              GraphCutAverages(WBa, self.mu_acc.numpy(), self.pw_acc.numpy(), self.acc_w.numpy(),
                                               self.avg_last.numpy()), totals, gaps, loaded)
        finally:  # also when interrupted: the record already holds every finished step
            tot = totals[0]
            self.k, self.avg_t = int(tot["k"]), int(tot["clock"])
            self.ell, self.avg_ell_u = float(tot["ell"]), float(tot["avg_ell_u"])
            self.oracle_seconds += float(tot["oracle_seconds"])
            self._sync_w()
        if done < len(order):
            _checked_pairwise(W[F:])  # raises: negative pairwise weights without a box
        return PlanResult(steps=done, oracle_calls=done, cache_hits=0, need_gap_pass=False, blocks=order[:done],
                          gaps=gaps[:done])

    # ------------------------------------------------------------ storage hooks
    def _move_block(self, i: int, y: Tensor, gamma: float, v: Tensor) -> None:
        super()._move_block(i, y, gamma, v)
        seg = self._nodes(i)
        self.mu[seg] = (1.0 - gamma) * self.mu[seg] + gamma * y.to(self.mu)
        self.pw[i] = (1.0 - gamma) * self.pw[i] + gamma * self._pair_of(i, y)

    def _move_block_general(self, i, y_s, y_a, coeffs, gamma, d, drop) -> None:
        super()._move_block_general(i, y_s, y_a, coeffs, gamma, d, drop)
        p, q, r = coeffs
        seg = self._nodes(i)
        mu, pw = self.mu[seg].clone(), self.pw[i].clone()
        for y, c in ((y_s, p), (y_a, q)):
            if c != 0.0:
                mu += gamma * c * y.to(mu)
                pw += gamma * c * self.model.joint_feature(self.block_data(i), y)[0, self.F:]
        if r != 0.0:
            mu += gamma * r * self.mu[seg]
            pw += gamma * r * self.pw[i]
        self.mu[seg], self.pw[i] = mu, pw

    def _move_all(self, y: Tensor, gamma: float) -> None:
        super()._move_all(y, gamma)
        self.mu.mul_(1.0 - gamma).add_(y.to(self.mu), alpha=gamma)
        self.pw.mul_(1.0 - gamma).add_(self.model.joint_feature(self.data, y)[:, self.F:], alpha=gamma)

    def _rescale_storage(self, rho: float) -> None:
        super()._rescale_storage(rho)
        self.mu.mul_(rho).add_(self.data.y.to(self.mu), alpha=1.0 - rho)
        self.pw.mul_(rho).add_(self._true_pairwise(), alpha=1.0 - rho)

    def _avg_accumulate(self, i, S) -> None:
        super()._avg_accumulate(i, S)
        if i is None:
            self.mu_acc.add_(S[self.data.node_graph()] * self.mu)
            self.pw_acc.add_(S[:, None] * self.pw)
            self.acc_w.add_(S)
        else:
            seg = self._nodes(i)
            self.mu_acc[seg] += S * self.mu[seg]
            self.pw_acc[i] += S * self.pw[i]
            self.acc_w[i] += S

    def _avg_reset_storage(self) -> None:
        super()._avg_reset_storage()
        for t in (self.mu_acc, self.pw_acc, self.acc_w):
            t.zero_()

    def _storage_dict(self) -> dict:
        sd = {name: getattr(self, name).cpu().clone() for name in ("mu", "pw", "mu_acc", "pw_acc", "acc_w")}
        # valid under the same features only (checked by the fingerprint): a bit-exact resume
        sd["pairwise"] = self._pairwise_fingerprint()
        sd["same_features"] = {"fingerprint": self._features_fingerprint(), "w_blocks": self.w_blocks.cpu().clone(),
                               "w_blocks_acc": self.w_blocks_acc.cpu().clone()}
        return sd

    def _load_storage(self, sd: dict) -> None:
        if sd.get("pairwise") != self._pairwise_fingerprint():
            raise ValueError(
                "cannot move a graph-cut dual state to graphs whose edges, edge features or node weights differ "
                "from those it was saved with: it keeps the expected pairwise features, which cannot be re-derived "
                "(only the node features may change). Start from scratch"
            )
        dev = self.w.device
        N, E, n = self.data.n_nodes, self.d - self.F, self.n
        self._load_tensors(sd, "graph-cut", {"mu": ((N,), -LOAD_TOL, 1 + LOAD_TOL), "pw": ((n, E), None, None),
                                             "mu_acc": ((N,), -LOAD_TOL, None), "pw_acc": ((n, E), None, None),
                                             "acc_w": ((n,), -LOAD_TOL, None)})
        phi_true = self.model.joint_feature(self.data, self.data.y)
        scale = 1.0 / (self.lam * self.n_total)
        expected = torch.cat([self.model.unary_feature(self.data, self.mu), self.pw], 1)
        expected_acc = torch.cat([self.model.unary_feature(self.data, self.mu_acc), self.pw_acc], 1)
        self.w_blocks = (phi_true - expected) * scale
        self.w_blocks_acc = (self.acc_w[:, None] * phi_true - expected_acc) * scale
        self._phi_true = phi_true
        same = sd.get("same_features")  # absent in states saved before it existed
        if isinstance(same, dict) and same.get("fingerprint") == self._features_fingerprint():
            saved = {k: saved_tensor(same.get(k), f"state storage {k}", (n, self.d)).to(dev)
                     for k in ("w_blocks", "w_blocks_acc")}
            for k, derived in (("w_blocks", self.w_blocks), ("w_blocks_acc", self.w_blocks_acc)):
                scale = 1.0 + float(derived.abs().max()) if derived.numel() else 1.0
                if derived.numel() and float((saved[k] - derived).abs().max()) > LOAD_TOL * scale:
                    raise ValueError(f"state storage {k} is not the w_i of the saved marginals (mu, pw)")
            self.w_blocks, self.w_blocks_acc = saved["w_blocks"], saved["w_blocks_acc"]

    def _check_dual_variables(self) -> None:
        """``l_i`` is the expected loss of the node marginals ``mu`` (the loss is linear in them), and each expected
        pairwise feature lies between 0 and its value with every edge cut."""
        y = self.data.y.to(self.mu)
        wrong = self.mu * (1.0 - y) + (1.0 - self.mu) * y  # P(y_p != y*_p)
        ell = torch.zeros(self.n, dtype=torch.float64, device=self.mu.device)
        ell.index_add_(0, self.data.node_graph(), self.model.loss_weights(self.data).to(self.mu) * wrong)
        if not torch.allclose(self.block_ell, ell / self.n_total, rtol=LOAD_TOL, atol=LOAD_TOL / self.n_total):
            raise ValueError("state block_ell is not the expected loss of the node marginals mu")
        if self.pw.shape[1]:  # pw_i = -(1/Z_i) sum_pq P(y_p != y_q) f_pq, f_pq >= 0: between -(all edges cut) and 0
            full = torch.zeros_like(self.pw).index_add_(0, self.data.edge_graph(), self.data.edge_x.to(self.pw))
            full = full / self.data.mass().to(self.pw)[:, None]
            low = self.pw < -full * (1 + LOAD_TOL) - LOAD_TOL
            if bool((self.pw > LOAD_TOL * (1 + full)).any()) or bool(low.any()):
                raise ValueError("state storage pw: an expected pairwise feature lies outside [-(every edge cut), 0]")
