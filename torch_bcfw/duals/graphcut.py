"""The dual state of the graph-cut model: dense ``w_i`` plus node marginals, re-bindable to new features.

For :class:`~torch_bcfw.models.graphcut.GraphCut` the joint feature map is linear in the labelling's node
indicators (unary block) and depends on the edges only through edge features that do not change when a
backbone network is trained (pairwise block).  So block ``i``'s dual variables ``alpha_i`` (a distribution over
the ``2^N_i`` labelings) enter ``w_i = A alpha_i`` only through

* the node marginals ``mu_p = sum_y alpha_i(y) y_p`` (``Tensor[N_tot]``), and
* the expected pairwise block ``pw_i = sum_y alpha_i(y) phi_P(x_i, y)`` (``Tensor[n, E]``, feature-independent),

and ``w_i = (phi(x_i, y_i) - [U_i(mu) ; pw_i]) / (lam n)`` with ``U_i(mu) = sum_p a_p mu_p x_p / Z_i``.
:class:`GraphCutDualState` keeps the dense ``[n, d]`` table of :class:`~torch_bcfw.duals.dense.DenseDualState`
for the steps and moves ``(mu, pw)`` (and their averaging accumulators) along with it.  Its saved state holds
``(mu, pw)`` only, and loading it under new node features re-derives ``w_i`` exactly
(:meth:`~torch_bcfw.duals.base.DualState.rebind`): ``O(N_tot)`` memory, whatever the number of distinct
labelings visited (an :class:`~torch_bcfw.duals.active_set.ActiveSetDualState` would store every one of them).
"""
from __future__ import annotations

import hashlib
import sys
import time
from typing import NamedTuple

import numpy as np
import torch
from numba import njit, objmode, types
from numba.extending import overload
from numba.typed import List
from torch import Tensor

from ..inference.graphcut import NEGATIVE_TOLERANCE, build_graph, cut_graph
from ..inference.graphcut_pool import cut_inputs
from . import block_ops as ops
from .base import DualState
from .dense import DenseDualState
from .fingerprint import features_fingerprint
from .plan import PlanResult
from .stepsize import average_weight, lazy_weight, step_size

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


@njit(cache=True)
def _fused_block_step(seg, graph, block, wts, state, avg, step):
    """One BCFW block step towards the labelling ``seg`` (bool[N_i]) of block ``i`` (nodes ``a .. a + N_i``).

    Argument groups (tuples, unpacked on entry): ``graph = (x, ns, e0, e1, edge_x, inv_z, truth, omega)`` (the
    block's graph record), ``block = (phi_true_i, a, i)``, ``wts = (V, W, lo, hi, box)``, ``state = (WB, mu, pw,
    bell)``, ``avg = (WBa, mu_acc, pw_acc, acc_w, last_t)`` and ``step = (lam, scale, n, step_code, k, avg_t,
    averaging)``.

    Computes ``phi_s = phi(x_i, seg)`` and ``l_s = L_i(seg) / n``, the direction ``d = w_i - w_s``, the block
    gap ``num = lam <d, w> - l_i + l_s`` and the step ``gamma``, then (``gamma != 0``) the lazy averaging
    update and ``w_i -= gamma d``, ``mu``, ``pw``, ``l_i``, ``v -= gamma d`` and ``w = clip(v)`` (``W`` is
    ``V`` itself without a box), all in place.  Returns ``(num, gamma, l_i old, l_i new)``."""
    x, ns, e0, e1, edge_x, inv_z, truth, omega = graph
    phi_true, a, i = block
    V, W, lo, hi, box = wts
    WB, mu, pw, bell = state
    WBa, mu_acc, pw_acc, acc_w, last_t = avg
    lam, scale, n, step_code, k, avg_t, averaging = step
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
        phi[F + e] = -pair[e] * inv_z
    ell_s = loss / n
    d = np.empty(D)
    dw = 0.0
    dd = 0.0
    for q in range(D):
        d[q] = WB[i, q] - (phi_true[q] - phi[q]) * scale
        dw += d[q] * W[q]
        dd += d[q] * d[q]
    ell_i = bell[i]
    num = lam * dw - ell_i + ell_s
    gamma = step_size(step_code, num, lam * dd, k, n)
    new_ell = ell_i
    if gamma != 0.0:
        S = 0.0
        if averaging:
            S = lazy_weight(avg_t, last_t[i])
            if S != 0.0:
                for q in range(D):
                    WBa[i, q] += S * WB[i, q]
                for e in range(E):
                    pw_acc[i, e] += S * pw[i, e]
                acc_w[i] += S
            last_t[i] = avg_t
        for q in range(D):
            WB[i, q] -= gamma * d[q]
        if S != 0.0:  # one pass over the block's marginals: accumulate the old value, then move it
            for p in range(N):
                m = mu[a + p]
                mu_acc[a + p] += S * m
                mu[a + p] = (1.0 - gamma) * m + gamma * (1.0 if seg[p] else 0.0)
        else:
            for p in range(N):
                mu[a + p] = (1.0 - gamma) * mu[a + p] + gamma * (1.0 if seg[p] else 0.0)
        for e in range(E):
            pw[i, e] = (1.0 - gamma) * pw[i, e] + gamma * phi[F + e]
        new_ell = (1.0 - gamma) * ell_i + gamma * ell_s
        bell[i] = new_ell
        for q in range(D):
            V[q] -= gamma * d[q]
        if box:
            for q in range(D):
                v = V[q]
                if v < lo[q]:
                    v = lo[q]
                if v > hi[q]:
                    v = hi[q]
                W[q] = v
    return num, gamma, ell_i, new_ell


class GraphCutData(NamedTuple):
    """The data group of the graph cut's kernel bundle ``(data, wts, store, avg)`` for the step driver
    (:func:`~torch_bcfw.duals.driver.plan_steps`): ``records`` (typed list of the blocks'
    :data:`~torch_bcfw.inference.graphcut_pool.GraphRecord`), ``phi_true`` (``float64[n, d]``), ``seg_off``
    (``int64[n + 1]`` node offsets), ``F`` (unary dimension) and ``checked`` (the box keeps ``w_P >= 0``: no check
    before a cut).  ``wts`` and ``avg`` are :func:`_fused_block_step`'s, ``store`` its ``state`` plus ``sums = [l,
    avg_l_u, oracle seconds]``.  The scratch of a step is the oracle's answer ``seg`` (``bool[N_max]``)."""

    records: object
    phi_true: np.ndarray
    seg_off: np.ndarray
    F: int
    checked: bool


@njit(cache=True)
def _graph_oracle(data, wts, sums, scr, i, N):
    """The loss-augmented oracle of block ``i`` (``N`` nodes) at the current clipped ``w``, into the scratch ``scr = (answer, clock)``: ``answer[:N]``; node
    gains and edge penalties (:func:`~torch_bcfw.inference.graphcut_pool.cut_inputs`, as the batched oracle), then
    the cut by PyMaxflow (:func:`_cut`, in object mode).  Its wall time is added to ``sums[2]``.  Returns False
    (nothing cut) when the unchecked pairwise weights are below ``-NEGATIVE_TOLERANCE``."""
    x, ns, aug, truth, omega, edges, e0, e1, edge_x, inv_z = data.records[i]
    seg_out, ts = scr
    t0 = _now(ts)
    W = wts[1]
    w_u = W[:data.F]
    w_p = W[data.F:]
    if not data.checked:
        if w_p.size and w_p.min() < -NEGATIVE_TOLERANCE:
            return False
        w_p = np.maximum(w_p, 0.0)
    _, gain, c = cut_inputs(x, w_u, ns, aug, True, edges, edge_x, w_p, inv_z)
    if c.shape[0] == 0:
        seg = gain > 0.0
    else:
        with objmode(seg="boolean[::1]"):
            seg = _cut(gain, edges, c)
    sums[2] += _now(ts) - t0
    for p in range(N):
        seg_out[p] = seg[p]
    return True


@njit(cache=True, inline="always")
def _graph_fw_step(data, wts, store, avg, seg, i, s, N, step, clock):
    """:func:`_fused_block_step` towards ``seg[:N]``, and the losses ``sums[:2]`` it moves."""
    step_code, averaging, lam, k = step
    WB, mu, pw, bell, sums = store
    x, ns, aug, truth, omega, edges, e0, e1, edge_x, inv_z = data.records[i]
    n = data.phi_true.shape[0]
    num, gamma, ell_i, new_ell = _fused_block_step(
        seg[0][:N], (x, ns, e0, e1, edge_x, inv_z, truth, omega), (data.phi_true[i], s, i), wts, (WB, mu, pw, bell), avg,
        (lam, 1.0 / (lam * n), n, step_code, k, clock, averaging))
    if gamma != 0.0:
        sums[0] += new_ell - ell_i
        sums[1] += average_weight(clock) * (new_ell - ell_i)
    return num, gamma


# ---------------------------------------------------------------- the contract (:mod:`.block_ops`) for the graph cut
# Plain plans only (:meth:`GraphCutDualState.can_run_plan`): the FW step computes the answer's features and loss
# itself, so the oracle reports no corner scores (nan), and the working-set operations are not supplied.
_graph = ops.bundle_of(GraphCutData)


@njit(cache=True)
def _fail():
    raise NotImplementedError("the graph-cut state runs plain plans only in the compiled driver")


@overload(ops.block_scratch, jit_options={"cache": True})
def _block_scratch(data, wts, store, avg):
    if _graph(data):
        def impl(data, wts, store, avg):
            off = data.seg_off
            nmax = 0
            for i in range(off.shape[0] - 1):
                nmax = max(nmax, off[i + 1] - off[i])
            return np.empty(nmax, dtype=np.bool_), np.zeros(2, dtype=np.int64)
        return impl


@overload(ops.n_blocks, jit_options={"cache": True})
def _n_blocks(data, wts, store, avg):
    if _graph(data):
        return lambda data, wts, store, avg: data.phi_true.shape[0]


@overload(ops.block_span, jit_options={"cache": True})
def _block_span(data, wts, store, avg, i):
    if _graph(data):
        return lambda data, wts, store, avg, i: (data.seg_off[i], data.seg_off[i + 1] - data.seg_off[i])


@overload(ops.block_loss, jit_options={"cache": True})
def _block_loss(data, wts, store, avg, i):
    if _graph(data):
        return lambda data, wts, store, avg, i: store[3][i]


@overload(ops.dual_loss, jit_options={"cache": True})
def _dual_loss(data, wts, store, avg):
    if _graph(data):
        return lambda data, wts, store, avg: store[4][0]


@overload(ops.prefetch, jit_options={"cache": True})
def _prefetch(data, wts, store, avg, i, averaging):
    if _graph(data):
        return lambda data, wts, store, avg, i, averaging: None


@overload(ops.begin_block, jit_options={"cache": True})
def _begin_block(data, wts, store, avg, scr, i, s, L, measure):
    if _graph(data):
        def impl(data, wts, store, avg, scr, i, s, L, measure):
            if measure:
                _fail()
            return np.nan
        return impl


@overload(ops.oracle_corner, jit_options={"cache": True})
def _oracle_corner(data, wts, store, avg, scr, i, s, L, ylab):
    if _graph(data):
        def impl(data, wts, store, avg, scr, i, s, L, ylab):
            return np.nan, np.nan, _graph_oracle(data, wts, store[4], scr, i, L)
        return impl


@overload(ops.fw_step, jit_options={"cache": True})
def _fw_step(data, wts, store, avg, scr, i, s, L, step, clock, corner):
    if _graph(data):
        def impl(data, wts, store, avg, scr, i, s, L, step, clock, corner):
            return _graph_fw_step(data, wts, store, avg, scr, i, s, L, step, clock)
        return impl


@overload(ops.plane_score, jit_options={"cache": True})
@overload(ops.plane_corner, jit_options={"cache": True})
def _stored_plane(data, wts, store, avg, scr, s, L, lab, base):
    """Both working-set plane operations (same signature): refused."""
    if _graph(data):
        def impl(data, wts, store, avg, scr, s, L, lab, base):
            _fail()
            return np.nan
        return impl


@overload(ops.corner_labels, jit_options={"cache": True})
def _corner_labels(data, wts, store, avg, scr, L):
    if _graph(data):
        def impl(data, wts, store, avg, scr, L):
            _fail()
            return np.zeros(0, dtype=np.int32)
        return impl


@overload(ops.active_set_step, jit_options={"cache": True})
def _active_set_step(data, wts, store, avg, scr, kind, i, s, L, j_s, j_a, values, clock, step, planes):
    if _graph(data):
        def impl(data, wts, store, avg, scr, kind, i, s, L, j_s, j_a, values, clock, step, planes):
            _fail()
        return impl


class GraphCutDualState(DenseDualState):
    """Dense ``w_i`` plus node marginals ``mu`` and expected pairwise features ``pw`` (see the module docstring).

    Attributes:
        mu: ``Tensor[N_tot]`` float64 node marginals of the label 1.
        pw: ``Tensor[n, d - F]`` float64 expected pairwise block of ``phi``.
        mu_acc, pw_acc, acc_w: averaging accumulators (``sum_t S_t mu_t`` etc. and ``sum_t S_t`` per block).

    A checkpoint (:meth:`state_dict`) holds ``(mu, pw)`` and their accumulators, from which ``w_i`` is re-derived
    under whatever features the state is loaded with (rebind), plus -- valid only under the same features,
    checked by a fingerprint -- the ``w_i`` table itself, so resuming on the same data is bit-exact.
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
        self._stash = None
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
        if self._stash is not None and self._stash[0] == i and self._stash[1] is y:
            return self._stash[2]
        return self.model.joint_feature(self.block_data(i), y)[0, self.F:]

    # ------------------------------------------------------------ the fused step loop
    def _blocks(self) -> tuple:
        """For :meth:`kernel` (built once): the blocks' :data:`~torch_bcfw.inference.graphcut_pool.GraphRecord`
        (the model's cached per-graph CPU arrays, shared with the batched oracle) as a numba typed list,
        ``phi(x_i, y_i): float64[n, d]`` and the node offsets ``int64[n + 1]``."""
        blocks = self.__dict__.get("_np_blocks")
        if blocks is None:
            self._true_pairwise()
            records = List()
            for rec in self.model.graph_records(self.data):
                records.append(tuple(np.ascontiguousarray(a) for a in rec[:9]) + (float(rec[9]),))
            blocks = (records, np.ascontiguousarray(self._phi_true.cpu().numpy()),
                      np.asarray(self._seg, dtype=np.int64))
            self._np_blocks = blocks
        return blocks

    def can_run_plan(self, plan) -> bool:
        """Plain plans run in the compiled driver on CPU, with the model's own oracle, over all the blocks of the
        problem (see :meth:`run_plan`)."""
        return (plan.is_plain and self.data.device.type == "cpu" and self.model.pairwise
                and self.model.builtin_oracle() and self.n_total == self.n)

    def kernel(self, sums: np.ndarray) -> tuple:
        """The kernel bundle ``(data, wts, store, avg)`` of the current state (:class:`GraphCutData`; views of its
        tensors; ``sums = [l, avg_l_u, 0]``)."""
        F = self.F
        V, WB, WBa = self.v.numpy(), self.w_blocks.numpy(), self.w_blocks_acc.numpy()
        box = bool(self._box)
        lo = self.lower.numpy() if box else V[:0]
        hi = self.upper.numpy() if box else V[:0]
        W = np.clip(V, lo, hi) if box else V  # updated in place by the kernel
        checked = box and bool((lo[F:] >= 0.0).all())  # the box keeps w_P >= 0: no per-step check needed
        records, phi_true, seg_off = self._blocks()
        return (GraphCutData(records, phi_true, seg_off, F, checked), (V, W, lo, hi, box),
                (WB, self.mu.numpy(), self.pw.numpy(), self.block_ell.numpy(), sums),
                (WBa, self.mu_acc.numpy(), self.pw_acc.numpy(), self.acc_w.numpy(), self.avg_last.numpy()))

    def run_plan(self, plan) -> PlanResult:
        """A plain plan in the compiled driver (:func:`~torch_bcfw.duals.driver.plan_steps`; same iterates as the
        generic loop up to rounding) with the graph cut's block operations: the loss-augmented oracle of the batched
        oracle's per-graph code (gains and penalties compiled, the cut by PyMaxflow called back in object mode) and
        one compiled kernel per step (:func:`_fused_block_step`: ``phi`` and the loss of the answer, the line
        search, the averaging and the updates of ``w_i``, ``mu``, ``pw``, ``v`` and ``w``), without per-step
        interpreter work besides the cut.  The oracle's share of the time is added to :attr:`oracle_seconds`.
        Interrupted (Ctrl-C inside the cut), the state holds exactly the finished steps."""
        from .driver import ORACLE_REFUSED, drive

        sums = np.array([self.ell, self.avg_ell_u, 0.0])
        K = self.kernel(sums)
        try:
            result, status = drive(self, K, sums, plan)
        finally:
            self.oracle_seconds += float(sums[2])
            self._sync_w()
        if status == ORACLE_REFUSED:
            _checked_pairwise(K[1][1][self.F:])  # raises: negative pairwise weights without a box
        return result

    # ------------------------------------------------------------ storage hooks
    def block_direction(self, i: int, y: Tensor) -> tuple[Tensor, float]:
        blk = self.block_data(i)
        phi_y = self.model.joint_feature(blk, y)[0]
        self._stash = (i, y, phi_y[self.F:])
        w_s = (self._true_features(i) - phi_y) / (self.lam * self.n_total)
        ell_s = float(self.model.loss(blk, y)[0]) / self.n_total
        return self.w_blocks[i] - w_s, ell_s

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

    # the moves keep more than w_blocks: the per-block default of DualState
    subset_direction = DualState.subset_direction
    _move_subset = DualState._move_subset
    _avg_touch_subset = DualState._avg_touch_subset
    _subset_block_gaps = DualState._subset_block_gaps

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
        # valid under the same features only (checked by the fingerprint when loading): the w_i table itself,
        # so that a checkpoint resumes bit-exactly instead of re-deriving w_i from (mu, pw) up to rounding
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
        for name in ("mu", "pw", "mu_acc", "pw_acc", "acc_w"):
            setattr(self, name, sd[name].to(dev, torch.float64).clone())
        if self.mu.shape != (self.data.n_nodes,) or self.pw.shape != (self.n, self.d - self.F):
            raise ValueError("saved graph-cut dual state does not match the data (node count or feature sizes)")
        phi_true = self.model.joint_feature(self.data, self.data.y)
        scale = 1.0 / (self.lam * self.n_total)
        expected = torch.cat([self.model.unary_feature(self.data, self.mu), self.pw], 1)
        expected_acc = torch.cat([self.model.unary_feature(self.data, self.mu_acc), self.pw_acc], 1)
        self.w_blocks = (phi_true - expected) * scale
        self.w_blocks_acc = (self.acc_w[:, None] * phi_true - expected_acc) * scale
        self._phi_true = phi_true
        same = sd.get("same_features")  # absent in states saved before it existed
        if same is not None and same["fingerprint"] == self._features_fingerprint():
            self.w_blocks = same["w_blocks"].to(dev, torch.float64).clone()
            self.w_blocks_acc = same["w_blocks_acc"].to(dev, torch.float64).clone()
