"""A process pool for batches of graph cuts whose graphs stay resident in the workers.

PyMaxflow holds the GIL, so a batch of cuts only runs in parallel in several processes, and shipping every problem
on every call costs as much as the cuts.  :class:`ResidentGraphCutPool` ships each graph's :data:`GraphRecord` once
(keyed by content, :meth:`~torch_bcfw.models.graphcut.GraphCut.record_keys`) to a sticky *slot* (slot 0 is the
calling process, new graphs go to the least loaded slot), then only the weights; every process computes the gains,
penalties, cut, loss and score of its graphs (:func:`solve_records`) by the same numba loops, so the answers are
bit-identical to one process.  Workers start lazily (``forkserver`` by default: a script must guard its entry point
with ``if __name__ == "__main__":``) and stop at :meth:`ResidentGraphCutPool.close`, at exit or on collection.
"""
from __future__ import annotations

from typing import NamedTuple

import contextlib
import multiprocessing
import time
import traceback
import weakref
from collections import OrderedDict
from collections.abc import Callable, Sequence

import numpy as np
from numba import njit

from .graphcut import available_cpus, build_graph, cut_graph

__all__ = ["ResidentGraphCutPool", "GraphRecord", "solve_records"]


class GraphRecord(NamedTuple):
    """All one process needs to decode and score a graph given ``w``: node features ``x float64[N, F]``,
    ``node_scale float64[N]`` (``a_p / Z``), loss augmentation ``aug float64[N]`` (``omega_p (1 - 2 y_p)``),
    ``truth bool[N]``, loss weights ``omega float64[N]`` (these three empty without labels), ``edges int32[M, 2]``,
    their endpoint columns ``e0``, ``e1``, ``edge_x float64[M, E]`` and ``inv_z = 1 / Z``."""

    x: np.ndarray
    node_scale: np.ndarray
    aug: np.ndarray
    truth: np.ndarray
    omega: np.ndarray
    edges: np.ndarray
    e0: np.ndarray
    e1: np.ndarray
    edge_x: np.ndarray
    inv_z: float


@njit(cache=True)
def node_gains(x, w_u, node_scale, aug, augment):
    """``(g, gain)``: ``g_p = (sum_k x_pk w_k) a_p / Z`` (the plain node gain ``u_p(1) - u_p(0)``) and
    ``gain = g + aug`` when ``augment`` (else ``g``).  Fixed summation order: identical in every process."""
    n, f = x.shape
    g = np.empty(n)
    gain = np.empty(n) if augment else g
    for p in range(n):
        s = 0.0
        for k in range(f):
            s += x[p, k] * w_u[k]
        s *= node_scale[p]
        g[p] = s
        if augment:
            gain[p] = s + aug[p]
    return g, gain


@njit(cache=True)
def edge_penalties(edge_x, w_e, inv_z):
    """``c_pq = max(sum_k edge_x_pqk w_k / Z, 0)``: ``float64[M]`` Potts penalties (fixed summation order)."""
    m, e = edge_x.shape
    w = w_e * inv_z
    c = np.empty(m)
    for j in range(m):
        s = 0.0
        for k in range(e):
            s += edge_x[j, k] * w[k]
        c[j] = s if s > 0.0 else 0.0
    return c


@njit(cache=True)
def labeling_terms(seg, g, c, e0, e1, truth, omega, with_loss):
    """``(score, loss)`` of the labelling ``seg`` (bool[N]): ``sum_p g_p y_p - sum_pq c_pq [y_p != y_q]`` and
    ``sum_p omega_p [y_p != truth_p]`` (0 unless ``with_loss``); ``c`` may be empty (no pairwise term)."""
    score = 0.0
    for p in range(seg.shape[0]):
        if seg[p]:
            score += g[p]
    if c.shape[0]:
        pair = 0.0
        for j in range(e0.shape[0]):
            if seg[e0[j]] != seg[e1[j]]:
                pair += c[j]
        score -= pair
    loss = 0.0
    if with_loss:
        for p in range(seg.shape[0]):
            if seg[p] != truth[p]:
                loss += omega[p]
    return score, loss


@njit(cache=True)
def cut_inputs(x, w_u, node_scale, aug, augment, edges, edge_x, w_e, inv_z):
    """``(g, gain, c)`` of one graph: :func:`node_gains` and, when the graph needs a cut (nodes, edges and a
    positive pairwise weight), the :func:`edge_penalties` ``c``; else ``c`` is empty and the answer is
    ``gain > 0``.  The one place that decides whether a graph is cut."""
    g, gain = node_gains(x, w_u, node_scale, aug, augment)
    if x.shape[0] == 0 or edges.shape[0] == 0 or w_e.shape[0] == 0 or not w_e.max() > 0.0:
        return g, gain, np.zeros(0)
    return g, gain, edge_penalties(edge_x, w_e, inv_z)


def decode_record(rec: GraphRecord, w_u: np.ndarray, w_e: np.ndarray,
                  loss_augmented: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Decode one graph: ``(seg bool[N], g float64[N], c float64[M])`` (``c`` empty without a cut,
    :func:`cut_inputs`)."""
    g, gain, c = cut_inputs(rec.x, w_u, rec.node_scale, rec.aug, loss_augmented, rec.edges, rec.edge_x, w_e,
                            rec.inv_z)
    if c.shape[0] == 0:
        return gain > 0, g, c
    return cut_graph(*build_graph(gain, rec.edges, c)), g, c


def solve_records(records: Sequence[GraphRecord], w_u: np.ndarray, w_e: np.ndarray, loss_augmented: bool,
                  terms: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Decode the ``records`` (:data:`GraphRecord`) in this process from unary weights ``w_u float64[F]`` and
    pairwise weights ``w_e float64[E]`` (``>= 0``, checked by the caller), with the records' loss augmentation when
    ``loss_augmented``; with ``terms`` also each answer's score ``<w, phi(x_i, y*)>`` and (with labels) loss.

    Returns ``(seg bool[sum N_i], loss float64[n], score float64[n])`` (zero ``loss``, ``score`` without ``terms``).
    """
    out = np.empty(sum(r.x.shape[0] for r in records), dtype=bool)
    loss = np.zeros(len(records))
    score = np.zeros(len(records))
    pos = 0
    for j, rec in enumerate(records):
        seg, g, c = decode_record(rec, w_u, w_e, loss_augmented)
        n = seg.shape[0]
        out[pos:pos + n] = seg
        pos += n
        if terms:
            score[j], loss[j] = labeling_terms(seg, g, c, rec.e0, rec.e1, rec.truth, rec.omega, rec.truth.shape[0] == n)
    return out, loss, score


def _worker_main(conn) -> None:
    """Worker loop: keep graph records by key, answer ``("records", ...)`` messages, stop on ``None``."""
    cache: dict[bytes, GraphRecord] = {}
    while True:
        try:
            msg = conn.recv()
        except EOFError:
            return
        if msg is None:
            return
        try:
            c0 = time.process_time()
            _, keys, new_records, evict, args = msg
            for key in evict:
                cache.pop(key, None)
            cache.update(new_records)
            res = solve_records([cache[k] for k in keys], *args)
            conn.send(("ok", res, time.process_time() - c0))
        except Exception:  # noqa: BLE001 - reported to the caller, which raises
            conn.send(("error", traceback.format_exc()))


def _shutdown(workers: list) -> None:
    for proc, conn in workers:
        with contextlib.suppress(OSError, ValueError):
            conn.send(None)
            conn.close()
    for proc, _ in workers:
        proc.join(timeout=5)
        if proc.is_alive():
            proc.terminate()
    workers.clear()


class ResidentGraphCutPool:
    """``P - 1`` worker processes plus the caller that solve batches of cuts on resident graphs.

    Args:
        processes: total processes solving cuts, the caller included (``None``: the CPUs this process may
            run on).  ``1`` never starts a worker.
        start_method: multiprocessing start method (``"forkserver"`` default, ``"spawn"``, ``"fork"``).
        max_resident: most graphs a worker keeps; the oldest are dropped (and re-sent when needed).

    Use :meth:`solve_records`; :meth:`close` stops the workers (also a context manager).
    """

    def __init__(self, processes: int | None = None, start_method: str = "forkserver",
                 max_resident: int = 100_000):
        self.processes = available_cpus() if processes is None else int(processes)
        if self.processes < 1:
            raise ValueError(f"processes must be >= 1, got {processes}")
        self.start_method = start_method
        self.max_resident = int(max_resident)
        self._workers: list = []
        self._finalizer = None
        self._slot: dict[bytes, int] = {}
        self._resident: list[OrderedDict] = []
        #: graph records shipped to the workers so far, and the number of solve calls
        self.shipped_graphs = 0
        self.calls = 0
        #: CPU seconds the workers spent in :meth:`solve_records` calls (all workers, summed)
        self.worker_cpu_s = 0.0

    def _start(self) -> None:
        if self._workers or self.processes == 1:
            return
        ctx = multiprocessing.get_context(self.start_method)
        for _ in range(self.processes - 1):
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=_worker_main, args=(child,), daemon=True)
            proc.start()
            child.close()
            self._workers.append((proc, parent))
        self._resident = [OrderedDict() for _ in range(self.processes)]
        self._slot.clear()
        self._finalizer = weakref.finalize(self, _shutdown, self._workers)

    def close(self) -> None:
        """Stop the workers (idempotent); a later :meth:`solve_records` starts new ones."""
        if self._finalizer is not None:
            self._finalizer()
            self._finalizer = None
        self._workers = []
        self._slot.clear()
        self._resident = []

    def __enter__(self) -> "ResidentGraphCutPool":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __getstate__(self):
        raise TypeError("a ResidentGraphCutPool holds processes and cannot be pickled")

    def _assign(self, keys: Sequence[bytes], sizes: Sequence[int]) -> list[list[int]]:
        """Per slot, the positions of the call's graphs it solves (sticky; new graphs to the least loaded)."""
        load = [0] * self.processes
        slots: list[list[int]] = [[] for _ in range(self.processes)]
        new = []
        for j, (k, n) in enumerate(zip(keys, sizes)):
            s = self._slot.get(k)
            if s is None:
                new.append(j)
            else:
                load[s] += n
                slots[s].append(j)
        for j in sorted(new, key=lambda j: -sizes[j]):
            s = min(range(self.processes), key=lambda t: load[t])
            self._slot[keys[j]] = s
            load[s] += sizes[j]
            slots[s].append(j)
        return [sorted(s) for s in slots]

    def solve_records(self, keys: Sequence[bytes], record: Callable[[int], GraphRecord], sizes: Sequence[int],
                      w_u: np.ndarray, w_e: np.ndarray, loss_augmented: bool,
                      terms: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """:func:`solve_records` on graphs spread over the processes (bit-identical answers): ``keys``, the content
        key of every graph's :data:`GraphRecord`; ``record(j)`` returns graph ``j``'s record (called only where
        needed); ``sizes``: ``N_j`` per graph; other arguments as :func:`solve_records`.

        Returns ``(seg bool[sum N_j], loss float64[n], score float64[n])`` in the order of ``keys``.
        """
        self._start()
        sizes = [int(n) for n in sizes]
        slots = self._assign(keys, sizes) if self._workers else [list(range(len(keys)))]
        args = (np.ascontiguousarray(w_u, dtype=np.float64), np.ascontiguousarray(w_e, dtype=np.float64),
                bool(loss_augmented), bool(terms))
        offsets = np.zeros(len(sizes) + 1, dtype=np.int64)
        np.cumsum(sizes, out=offsets[1:])
        sent = []
        try:
            for s, pos in enumerate(slots[1:], start=1):
                if not pos:
                    continue
                sent.append((s, pos))
                new, evict = self._ship(s, pos, keys, record)
                self._workers[s - 1][1].send(("records", [keys[j] for j in pos], new, evict, args))
            out = np.empty(int(offsets[-1]), dtype=bool)
            loss, score = np.zeros(len(keys)), np.zeros(len(keys))
            mine = slots[0]
            if mine:
                _gather(out, loss, score, solve_records([record(j) for j in mine], *args), mine, offsets)
            for s, pos in sent:
                status, res, *cpu = self._workers[s - 1][1].recv()
                if status != "ok":
                    raise RuntimeError(f"graph-cut worker {s} failed:\n{res}")
                _gather(out, loss, score, res, pos, offsets)
                self.worker_cpu_s += cpu[0]
        except BaseException:
            self.close()
            raise
        self.calls += 1
        return out, loss, score

    def _ship(self, s: int, pos: list[int], keys, make) -> tuple[dict, list]:
        """The structures slot ``s`` lacks for the call's graphs ``pos`` (``{key: make(j)}``) and the keys it
        must drop (least recently used beyond ``max_resident``); updates the bookkeeping."""
        resident = self._resident[s]
        new, evict = {}, []
        for j in pos:
            k = keys[j]
            if k in resident:
                resident.move_to_end(k)
            elif k not in new:
                new[k] = make(j)
        for k in new:
            resident[k] = True
        needed = {keys[j] for j in pos}
        while len(resident) > self.max_resident:
            old = next(iter(resident))
            if old in needed:  # never evict what this call needs (the oldest needed key: all others are too)
                break
            del resident[old]
            evict.append(old)
            self._slot.pop(old, None)
        self.shipped_graphs += len(new)
        return new, evict


def _gather(out, loss, score, res, pos: list[int], offsets: np.ndarray) -> None:
    """Scatter one slot's ``(seg, loss, score)`` answers for the call's graphs ``pos`` into the call's arrays."""
    seg, loss[pos], score[pos] = res
    p = 0
    for j in pos:
        n = int(offsets[j + 1] - offsets[j])
        out[offsets[j]:offsets[j + 1]] = seg[p:p + n]
        p += n
