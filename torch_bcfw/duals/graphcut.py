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

import numpy as np
import torch
from numba import njit, objmode, types
from numba.typed import List
from torch import Tensor

from ..inference.graphcut import NEGATIVE_TOLERANCE, build_graph, cut_graph
from ..inference.graphcut_pool import cut_inputs
from .base import DualState
from .dense import DenseDualState
from .fingerprint import features_fingerprint
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


@njit(cache=True)
def _step_loop(order, blocks, wts, state, avg, params, out):
    """The sequential BCFW steps of :meth:`GraphCutDualState.run_steps` in one compiled loop.

    Argument groups (tuples, unpacked on entry): ``blocks = (records, phi_true, seg_off)``, ``wts``, ``state`` and
    ``avg`` as :func:`_fused_block_step`'s, ``params = (F, checked, lam, scale, n, step_code, averaging)`` and
    ``out = (counts, sums, gaps)``.

    Per step ``j`` (block ``i = order[j]``): the loss-augmented oracle -- node gains and edge penalties
    (:func:`~torch_bcfw.inference.graphcut_pool.cut_inputs`, as the batched oracle) and the cut by PyMaxflow
    (:func:`_cut`, in object mode) -- then :func:`_fused_block_step`.  ``records``: typed list of the blocks'
    :data:`~torch_bcfw.inference.graphcut_pool.GraphRecord`; ``phi_true``: ``float64[n, d]``; ``seg_off``:
    ``int64[n + 1]`` node offsets.  The counters live in arrays updated after every step, so an exception raised
    by the cut (Ctrl-C) leaves them consistent with the finished steps: ``counts = [k, avg_t]`` (int64),
    ``sums = [ell, avg_ell_u, oracle seconds]`` (float64); ``gaps[j]`` receives each step's block gap.
    Returns the number of steps done: ``j < len(order)`` when the unchecked pairwise weights (``checked``
    False) are below ``-NEGATIVE_TOLERANCE`` at step ``j`` (the caller raises)."""
    records, phi_true, seg_off = blocks
    W = wts[1]
    F, checked, lam, scale, n, step_code, averaging = params
    counts, sums, gaps = out
    ts = np.zeros(2, dtype=np.int64)
    for j in range(order.shape[0]):
        i = order[j]
        x, ns, aug, truth, omega, edges, e0, e1, edge_x, inv_z = records[i]
        t0 = _now(ts)
        w_u = W[:F]
        w_p = W[F:]
        if not checked:
            if w_p.size and w_p.min() < -NEGATIVE_TOLERANCE:
                return j
            w_p = np.maximum(w_p, 0.0)
        _, gain, c = cut_inputs(x, w_u, ns, aug, True, edges, edge_x, w_p, inv_z)
        if c.shape[0] == 0:
            seg = gain > 0.0
        else:
            with objmode(seg="boolean[::1]"):
                seg = _cut(gain, edges, c)
        sums[2] += _now(ts) - t0
        num, gamma, ell_i, new_ell = _fused_block_step(
            seg, (x, ns, e0, e1, edge_x, inv_z, truth, omega), (phi_true[i], seg_off[i], i), wts, state, avg,
            (lam, scale, n, step_code, counts[0], counts[1], averaging))
        gaps[j] = num
        if gamma != 0.0:
            sums[0] += new_ell - ell_i
            sums[1] += average_weight(counts[1]) * (new_ell - ell_i)
        counts[0] += 1
        counts[1] += 1
    return order.shape[0]


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
        """For :meth:`run_steps` (built once): the blocks' :data:`~torch_bcfw.inference.graphcut_pool.GraphRecord`
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

    def run_steps(self, order: np.ndarray, step_code: int, averaging: bool = True) -> np.ndarray:
        """Sequential BCFW steps as :meth:`~torch_bcfw.duals.base.DualState.run_steps` (same iterates up to
        rounding), fused on CPU: one compiled loop (:func:`_step_loop`) runs the loss-augmented oracle of the
        batched oracle's per-graph code (gains and penalties compiled, the cut by PyMaxflow called back in object
        mode) and one compiled kernel per step (:func:`_fused_block_step`: ``phi`` and the loss of the answer,
        the line search, the averaging and the updates of ``w_i``, ``mu``, ``pw``, ``v`` and ``w``), without
        per-step interpreter work besides the cut.  The oracle's share of the time is added to
        :attr:`oracle_seconds`."""
        if (self.data.device.type != "cpu" or not self.model.pairwise or not self.model.builtin_oracle()
                or self.n_total != self.n):
            return super().run_steps(order, step_code, averaging)  # e.g. a subclass with its own oracle
        F, lam, n = self.F, self.lam, self.n
        V, WB, WBa = self.v.numpy(), self.w_blocks.numpy(), self.w_blocks_acc.numpy()
        box = bool(self._box)
        lo = self.lower.numpy() if box else V[:0]
        hi = self.upper.numpy() if box else V[:0]
        W = np.clip(V, lo, hi) if box else V  # updated in place by the kernel
        checked = box and bool((lo[F:] >= 0.0).all())  # the box keeps w_P >= 0: no per-step check needed
        records, phi_true, seg_off = self._blocks()
        order = np.ascontiguousarray(order, dtype=np.int64)
        gaps = np.empty(len(order), dtype=np.float64)
        counts = np.array([self.k, self.avg_t], dtype=np.int64)
        sums = np.array([self.ell, self.avg_ell_u, 0.0])
        done = len(order)
        try:
            done = _step_loop(order, (records, phi_true, seg_off), (V, W, lo, hi, box),
                              (WB, self.mu.numpy(), self.pw.numpy(), self.block_ell.numpy()),
                              (WBa, self.mu_acc.numpy(), self.pw_acc.numpy(), self.acc_w.numpy(),
                               self.avg_last.numpy()),
                              (F, checked, lam, 1.0 / (lam * n), n, step_code, averaging), (counts, sums, gaps))
        finally:  # also when interrupted: the arrays already hold every finished step
            self.k, self.avg_t = int(counts[0]), int(counts[1])
            self.ell, self.avg_ell_u = float(sums[0]), float(sums[1])
            self.oracle_seconds += float(sums[2])
            self._sync_w()
        if done < len(order):
            _checked_pairwise(W[F:])  # raises: negative pairwise weights without a box
        return gaps

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
