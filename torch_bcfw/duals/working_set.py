"""Per-block working sets of labelings: one structure for the cache, the active sets and the MP-BCFW planes.

The refinements of BCFW (Osokin et al. 2016) need an explicit part of each block's ``alpha_i``: the active set
(pairwise and away steps), the cache of past oracle answers, the planes of multi-plane BCFW (Shah et al. 2015) and
the dual variables of :class:`~torch_bcfw.duals.active_set.ActiveSetDualState`.  A :class:`WorkingSet` holds per
block a list of *planes*, each a labeling (``int32``) with its 64-bit FNV-1a ``key`` and the float columns ``ALPHA``
(``alpha_i(y)``), ``LOSS`` (``L_i(y) / n``), ``SCORE`` (``H_i(y; w) / n`` up to a per-block shift, written when the
block is scored), ``LAST`` (MP-BCFW's time of last activity) and ``ACC`` (an averaging accumulator).  Nothing stored
depends on the features, so a working set survives a rebind.  Initially every block holds its ground truth with
``alpha = 1``.

Storage is a pool of numpy arrays (:class:`Pool`) shared by the compiled and the generic loops through the compiled
helpers ``ws_*``: a block owns a contiguous region of slots; a full region moves to the end of the pool with twice
the capacity, a full pool is reallocated (the helpers return the new :class:`Pool`).  Planes keep their insertion
order, so every loop breaks ties the same way.
"""
from __future__ import annotations

from functools import partialmethod
from typing import NamedTuple

import numpy as np
import torch
from numba import njit

from ..checks import saved_tensor

__all__ = ["WorkingSet", "Pool", "block_labelings", "label_hash", "ALPHA", "LOSS", "SCORE", "LAST", "ACC"]

#: columns of the float pool ``plane_values[P, NCOL]``
ALPHA, LOSS, SCORE, LAST, ACC = 0, 1, 2, 3, 4
NCOL = 5
#: the pool's first free plane slot and first free label slot (one record, :attr:`Pool.free`)
FREE = np.dtype([("slot", np.int64), ("label", np.int64)])

_FNV_OFFSET = np.uint64(14695981039346656037)
_FNV_PRIME = np.uint64(1099511628211)


class Pool(NamedTuple):
    """The arrays of a :class:`WorkingSet`, as the compiled helpers ``ws_*`` take them.

    Block ``i`` owns plane slots ``start[i] .. start[i] + cap[i]`` (``size[i]`` used) and label slots from
    ``lab_start[i]`` (``lab_len[i]`` labels per plane); ``key[P]`` (uint64), ``plane_values[P, NCOL]`` (float64
    columns ``ALPHA, LOSS, SCORE, LAST, ACC``) and ``plane_labels`` (int32) are the pool; ``incomplete[i]`` marks a
    block whose listed planes no longer hold all of its mass.  A helper that reallocates the pool returns a new ``Pool``."""

    start: np.ndarray
    cap: np.ndarray
    size: np.ndarray
    lab_start: np.ndarray
    lab_len: np.ndarray
    free: np.ndarray
    key: np.ndarray
    plane_values: np.ndarray
    plane_labels: np.ndarray
    incomplete: np.ndarray


@njit(cache=True)
def label_hash(y) -> np.uint64:
    """64-bit FNV-1a hash of an integer labeling (each label folded in as 4 bytes)."""
    h = _FNV_OFFSET
    for t in range(y.shape[0]):
        v = np.uint64(np.int64(y[t]) & np.int64(0xFFFFFFFF))
        for b in range(4):
            h = h ^ ((v >> np.uint64(8 * b)) & np.uint64(0xFF))
            h = h * _FNV_PRIME
    return h


@njit(cache=True)
def ws_find(ws, i, h, y) -> int:
    """Position (0-based inside block ``i``) of the plane with labeling ``y`` (hash ``h``), or -1."""
    L = ws.lab_len[i]
    s0 = ws.start[i]
    l0 = ws.lab_start[i]
    for j in range(ws.size[i]):
        if ws.key[s0 + j] == h:
            same = True
            base = l0 + j * L
            for t in range(L):
                if ws.plane_labels[base + t] != y[t]:
                    same = False
                    break
            if same:
                return j
    return -1


@njit(cache=True)
def ws_grow(ws, i):
    """Give block ``i`` a region of twice its capacity at the end of the pool; returns the (maybe new) :class:`Pool`."""
    key, fl, lab = ws.key, ws.plane_values, ws.plane_labels
    free = ws.free[0]
    L = ws.lab_len[i]
    newcap = 2 * ws.cap[i] if ws.cap[i] > 0 else 4
    need_s = free.slot + newcap
    if need_s > key.shape[0]:
        P = max(2 * key.shape[0], need_s)
        k2 = np.zeros(P, dtype=key.dtype)
        f2 = np.zeros((P, fl.shape[1]), dtype=fl.dtype)
        k2[: key.shape[0]] = key
        f2[: fl.shape[0]] = fl
        key, fl = k2, f2
    need_l = free.label + newcap * L
    if need_l > lab.shape[0]:
        Q = max(2 * lab.shape[0], need_l)
        l2 = np.zeros(Q, dtype=lab.dtype)
        l2[: lab.shape[0]] = lab
        lab = l2
    s_new = free.slot
    l_new = free.label
    s_old = ws.start[i]
    l_old = ws.lab_start[i]
    for j in range(ws.size[i]):
        key[s_new + j] = key[s_old + j]
        for c in range(fl.shape[1]):
            fl[s_new + j, c] = fl[s_old + j, c]
    for t in range(ws.size[i] * L):
        lab[l_new + t] = lab[l_old + t]
    ws.start[i] = s_new
    ws.lab_start[i] = l_new
    ws.cap[i] = newcap
    free.slot = s_new + newcap
    free.label = l_new + newcap * L
    return Pool(ws.start, ws.cap, ws.size, ws.lab_start, ws.lab_len, ws.free, key, fl, lab, ws.incomplete)


@njit(cache=True)
def ws_write(ws, i, j, h, y, loss, alpha):
    """Overwrite plane ``j`` of block ``i`` with labeling ``y``."""
    s = ws.start[i] + j
    ws.key[s] = h
    ws.plane_values[s, ALPHA] = alpha
    ws.plane_values[s, LOSS] = loss
    ws.plane_values[s, SCORE] = 0.0
    ws.plane_values[s, LAST] = 0.0
    ws.plane_values[s, ACC] = 0.0
    L = ws.lab_len[i]
    base = ws.lab_start[i] + j * L
    for t in range(L):
        ws.plane_labels[base + t] = y[t]


@njit(cache=True)
def ws_remove(ws, i, j) -> None:
    """Remove plane ``j`` of block ``i`` (later planes shift down: the order is kept)."""
    s0 = ws.start[i]
    L = ws.lab_len[i]
    l0 = ws.lab_start[i]
    key, fl, lab = ws.key, ws.plane_values, ws.plane_labels
    for q in range(j, ws.size[i] - 1):
        key[s0 + q] = key[s0 + q + 1]
        for c in range(fl.shape[1]):
            fl[s0 + q, c] = fl[s0 + q + 1, c]
        for t in range(L):
            lab[l0 + q * L + t] = lab[l0 + (q + 1) * L + t]
    ws.size[i] -= 1


@njit(cache=True)
def ws_drop_inactive(ws, i) -> None:
    """Remove every plane of block ``i`` with ``alpha == 0`` (keeping the order of the others)."""
    j = 0
    while j < ws.size[i]:
        if ws.plane_values[ws.start[i] + j, ALPHA] == 0.0:
            ws_remove(ws, i, j)
        else:
            j += 1


@njit(cache=True)
def ws_evict_lru(ws, i) -> int:
    """MP-BCFW's capacity rule (Shah et al. 2015, Alg. 3, line 5): remove block ``i``'s plane inactive longest
    (smallest ``last``, the earliest among equals) and return its old position (-1 for an empty block).  Evicting a
    plane with ``alpha > 0`` sets ``incomplete[i]`` (its mass stays in ``w_i``, unlisted)."""
    if ws.size[i] == 0:
        return -1
    s0 = ws.start[i]
    best = 0
    for j in range(1, ws.size[i]):
        if ws.plane_values[s0 + j, LAST] < ws.plane_values[s0 + best, LAST]:
            best = j
    if ws.plane_values[s0 + best, ALPHA] > 0.0:
        ws.incomplete[i] = 1
    ws_remove(ws, i, best)
    return best


@njit(cache=True)
def ws_drop_stale(ws, i, cutoff) -> int:
    """MP-BCFW's inactivity rule (Alg. 3, line 6): remove block ``i``'s planes with ``last < cutoff`` except the most
    recently active one; returns the number removed (``incomplete[i]`` as in :func:`ws_evict_lru`)."""
    s0 = ws.start[i]
    keep = -1
    for j in range(ws.size[i]):
        if keep < 0 or ws.plane_values[s0 + j, LAST] > ws.plane_values[s0 + keep, LAST]:
            keep = j
    removed = 0
    j = 0
    while j < ws.size[i]:
        if j != keep and ws.plane_values[s0 + j, LAST] < cutoff:
            if ws.plane_values[s0 + j, ALPHA] > 0.0:
                ws.incomplete[i] = 1
            ws_remove(ws, i, j)
            if keep > j:
                keep -= 1
            removed += 1
        else:
            j += 1
    return removed


@njit(cache=True)
def ws_insert(ws, i, h, y, loss, max_size, allow_grow_active):
    """Add labeling ``y`` (not stored yet; hash ``h``, ``alpha = 0``) to block ``i``; return ``(j, pool)``.  When the
    block holds ``max_size > 0`` planes already, the inactive plane with the lowest stored score is replaced; without
    one, the block grows if ``allow_grow_active`` (pairwise / away steps), else the lowest-scored active plane is
    replaced and ``incomplete[i]`` set."""
    if max_size > 0 and ws.size[i] >= max_size:
        s0 = ws.start[i]
        fl = ws.plane_values
        best = -1
        for j in range(ws.size[i]):
            if fl[s0 + j, ALPHA] == 0.0 and (best < 0 or fl[s0 + j, SCORE] < fl[s0 + best, SCORE]):
                best = j
        if best < 0 and not allow_grow_active:
            for j in range(ws.size[i]):
                if best < 0 or fl[s0 + j, SCORE] < fl[s0 + best, SCORE]:
                    best = j
            ws.incomplete[i] = 1
        if best >= 0:
            ws_write(ws, i, best, h, y, loss, 0.0)
            return best, ws
    if ws.size[i] >= ws.cap[i]:
        ws = ws_grow(ws, i)
    j = ws.size[i]
    ws.size[i] += 1
    ws_write(ws, i, j, h, y, loss, 0.0)
    return j, ws


@njit(cache=True)
def ws_store(ws, i, y, loss, score, max_size, evict, grow):
    """Put labeling ``y`` in block ``i`` unless it is there (``alpha = 0``, loss ``loss``, score ``score``), evicting
    the longest-inactive planes down to ``evict - 1`` when ``evict > 0`` (MP-BCFW), else at most ``max_size`` planes
    (:func:`ws_insert`).  Returns ``(position, pool)``."""
    h = label_hash(y)
    j = ws_find(ws, i, h, y)
    if j < 0:
        while evict > 0 and ws.size[i] >= evict:
            ws_evict_lru(ws, i)
        j, ws = ws_insert(ws, i, h, y, loss, max_size, grow)
        ws.plane_values[ws.start[i] + j, SCORE] = score
    return j, ws


@njit(cache=True)
def ws_fw_update(ws, i, j_s, gamma) -> None:
    """``alpha_i <- (1 - gamma) alpha_i + gamma e_s`` (a full step ``gamma = 1`` leaves exactly ``e_s``)."""
    s0 = ws.start[i]
    fl = ws.plane_values
    if gamma >= 1.0:
        for j in range(ws.size[i]):
            fl[s0 + j, ALPHA] = 0.0
        fl[s0 + j_s, ALPHA] = 1.0
        return
    keep = 1.0 - gamma
    for j in range(ws.size[i]):
        fl[s0 + j, ALPHA] *= keep
    fl[s0 + j_s, ALPHA] += gamma


@njit(cache=True)
def ws_pairwise_update(ws, i, j_s, j_a, gamma, drop) -> None:
    """``alpha_i <- alpha_i + gamma (e_s - e_a)``; a drop step sets ``alpha(a) = 0`` exactly."""
    s0 = ws.start[i]
    if drop:
        ws.plane_values[s0 + j_a, ALPHA] = 0.0
    else:
        ws.plane_values[s0 + j_a, ALPHA] -= gamma
    ws.plane_values[s0 + j_s, ALPHA] += gamma


@njit(cache=True)
def ws_away_update(ws, i, j_a, gamma, drop) -> None:
    """``alpha_i <- (1 + gamma) alpha_i - gamma e_a``; a drop step sets ``alpha(a) = 0`` exactly."""
    s0 = ws.start[i]
    fl = ws.plane_values
    grow = 1.0 + gamma
    for j in range(ws.size[i]):
        fl[s0 + j, ALPHA] *= grow
    if drop:
        fl[s0 + j_a, ALPHA] = 0.0
    else:
        fl[s0 + j_a, ALPHA] -= gamma


#: relative tolerance under which two plane scores count as tied in :func:`ws_corners`
TIE_TOL = 1e-11


@njit(cache=True)
def ws_corners(ws, i):
    """``(j_max, j_min_active, n_active)``: the best plane by score and the worst *active* plane.  Scores within
    ``TIE_TOL * (1 + max |score|)`` of the extreme are tied (exact pairwise steps equalise scores), and the smallest
    key wins: the choice does not depend on the last bits or the storage order, so equivalent loops agree."""
    s0 = ws.start[i]
    fl, key = ws.plane_values, ws.key
    hi = -np.inf
    lo = np.inf
    scale = 0.0
    nact = 0
    for j in range(ws.size[i]):
        sc = fl[s0 + j, SCORE]
        if sc > hi:
            hi = sc
        if abs(sc) > scale:
            scale = abs(sc)
        if fl[s0 + j, ALPHA] > 0.0:
            nact += 1
            if sc < lo:
                lo = sc
    tol = TIE_TOL * (1.0 + scale)
    jmax = -1
    jmin = -1
    for j in range(ws.size[i]):
        sc = fl[s0 + j, SCORE]
        if sc >= hi - tol and (jmax < 0 or key[s0 + j] < key[s0 + jmax]):
            jmax = j
        if fl[s0 + j, ALPHA] > 0.0 and sc <= lo + tol and (jmin < 0 or key[s0 + j] < key[s0 + jmin]):
            jmin = j
    return jmax, jmin, nact


def block_labelings(y, offsets=None) -> list[np.ndarray]:
    """The labeling of every block of labels ``y`` (``LongTensor[N]``, packed like a dataset's ``y``): the slices
    ``offsets[i]:offsets[i + 1]`` for sequences, else one label per example.  1-D int64 numpy views."""
    y = y.detach().cpu().numpy() if isinstance(y, torch.Tensor) else np.asarray(y)
    if offsets is not None:
        off = offsets.detach().cpu().numpy() if isinstance(offsets, torch.Tensor) else np.asarray(offsets)
        return [y[off[i]:off[i + 1]] for i in range(len(off) - 1)]
    return [y[i:i + 1] for i in range(len(y))]


class WorkingSet:
    """Per-block planes (labelings with ``alpha``, ``L/n`` and a score slot); see the module docstring.

    Args:
        true_labels: a list of ``n`` 1-D integer arrays, the ground-truth labeling of each block (all
            planes of block ``i`` have ``len(true_labels[i])`` labels).
        init_cap: initial plane capacity per block (regions double when full).
    """

    def __init__(self, true_labels, init_cap: int = 4):
        nb = len(true_labels)
        lab_len = np.array([len(y) for y in true_labels], dtype=np.int64)
        self._allocate(lab_len, np.ones(nb, dtype=np.int64), np.full(nb, max(1, int(init_cap)), dtype=np.int64),
                       np.zeros(nb, dtype=np.uint8))
        pool = self.arrays()
        for i, y in enumerate(true_labels):
            y = np.asarray(y, dtype=np.int32)
            ws_write(pool, i, 0, np.uint64(label_hash(y)), y, 0.0, 1.0)

    def _allocate(self, lab_len: np.ndarray, size: np.ndarray, cap: np.ndarray, incomplete: np.ndarray) -> None:
        """Empty pool arrays for blocks of ``lab_len`` labels, ``size`` planes and ``cap`` slots each (int64[n])."""
        self.n = len(lab_len)
        self.lab_len, self.size, self.cap, self.incomplete = lab_len, size, cap, incomplete
        self.start = np.zeros(self.n, dtype=np.int64)
        self.start[1:] = np.cumsum(cap[:-1])
        self.lab_start = np.zeros(self.n, dtype=np.int64)
        self.lab_start[1:] = np.cumsum((cap * lab_len)[:-1])
        P, Q = int(cap.sum()), int((cap * lab_len).sum())
        self.key = np.zeros(P, dtype=np.uint64)
        self.plane_values = np.zeros((P, NCOL), dtype=np.float64)
        self.plane_labels = np.zeros(max(Q, 1), dtype=np.int32)
        self.free = np.array([(P, Q)], dtype=FREE)

    @classmethod
    def for_data(cls, data, init_cap: int = 4) -> "WorkingSet":
        """Ground-truth working set of ``data`` (packed sequences or one label per example)."""
        return cls(block_labelings(data.y, getattr(data, "offsets", None)), init_cap)

    # ------------------------------------------------------------------ kernel arguments
    def arrays(self) -> Pool:
        """The :class:`Pool` of arrays the ``ws_*`` helpers take (views of this working set's)."""
        return Pool(self.start, self.cap, self.size, self.lab_start, self.lab_len, self.free, self.key,
                    self.plane_values, self.plane_labels, self.incomplete)

    def adopt(self, pool: Pool) -> None:
        """Adopt the pool a kernel returned (its arrays may have been reallocated)."""
        self.key, self.plane_values, self.plane_labels = pool.key, pool.plane_values, pool.plane_labels

    # ------------------------------------------------------------------ per-block views
    def slots(self, i: int) -> slice:
        return slice(int(self.start[i]), int(self.start[i] + self.size[i]))

    def labeling(self, i: int, j: int) -> np.ndarray:
        L = int(self.lab_len[i])
        b = int(self.lab_start[i]) + j * L
        return self.plane_labels[b:b + L]

    def labelings(self, i: int) -> list[np.ndarray]:
        return [self.labeling(i, j) for j in range(int(self.size[i]))]

    def find(self, i: int, y) -> int:
        y = np.asarray(y, dtype=np.int32)
        return int(ws_find(self.arrays(), i, np.uint64(label_hash(y)), y))

    def insert(self, i: int, y, loss: float, max_size: int, allow_grow_active: bool) -> int:
        """Add labeling ``y`` with ``alpha = 0`` (see :func:`ws_insert`); returns its position in the block."""
        y = np.asarray(y, dtype=np.int32)
        j, pool = ws_insert(self.arrays(), i, np.uint64(label_hash(y)), y, float(loss), int(max_size),
                            bool(allow_grow_active))
        self.adopt(pool)
        return int(j)

    def put(self, i: int, y, loss: float, max_size: int = 0, allow_grow_active: bool = True) -> int:
        """Position of labeling ``y`` in block ``i``, added by :meth:`insert` (``alpha = 0``) when absent."""
        j = self.find(i, y)
        return j if j >= 0 else self.insert(i, y, loss, max_size, allow_grow_active)

    def drop_inactive(self, i: int) -> None:
        ws_drop_inactive(self.arrays(), i)

    def remove(self, i: int, js) -> None:
        """Remove the planes at positions ``js`` of block ``i`` (the others keep their order)."""
        for j in sorted((int(j) for j in js), reverse=True):
            ws_remove(self.arrays(), i, j)

    def column(self, i: int, col: int) -> np.ndarray:
        """Column ``col`` (``ALPHA``, ``LOSS``, ``SCORE``, ``LAST``, ``ACC``) of the planes of block ``i`` (a view)."""
        return self.plane_values[self.slots(i), col]

    #: ``alpha_i``, ``L_i(y) / n``, scores and MP-BCFW's ``last`` timestamps of the planes of block ``i`` (views)
    alphas = partialmethod(column, col=ALPHA)
    losses = partialmethod(column, col=LOSS)
    scores = partialmethod(column, col=SCORE)
    last_active = partialmethod(column, col=LAST)

    # ------------------------------------------------------------------ MP-BCFW policy (Shah et al. 2015)
    def touch(self, i: int, j: int, stamp: float) -> None:
        """Mark plane ``j`` of block ``i`` active at time ``stamp``."""
        self.plane_values[int(self.start[i]) + j, LAST] = stamp

    def add_plane(self, i: int, y, loss: float, stamp: float, max_planes: int) -> int:
        """MP-BCFW insertion of an exact oracle answer ``y``: a labeling already stored is only marked active
        (no duplicates); a new one is added (``alpha = 0``) after evicting the longest-inactive plane when the
        block holds ``max_planes`` already (``max_planes > 0``).  Returns the plane's position."""
        j, pool = ws_store(self.arrays(), i, np.asarray(y, dtype=np.int32), float(loss), 0.0, 0, int(max_planes), True)
        self.adopt(pool)
        self.touch(i, int(j), stamp)
        return int(j)

    def drop_stale(self, i: int, cutoff: float) -> int:
        """Remove the planes of block ``i`` last active before ``cutoff`` (keeping at least one); see
        :func:`ws_drop_stale`."""
        return int(ws_drop_stale(self.arrays(), i, float(cutoff)))

    def sizes(self) -> np.ndarray:
        return self.size.copy()

    # ------------------------------------------------------------------ persistence
    def state_dict(self) -> dict:
        """Compact copy: per block its planes in order (labels concatenated)."""
        idx = np.concatenate([np.arange(self.start[i], self.start[i] + self.size[i]) for i in range(self.n)])
        labs = np.concatenate([self.plane_labels[self.lab_start[i]:self.lab_start[i] + self.size[i] * self.lab_len[i]]
                               for i in range(self.n)])
        return {"size": torch.from_numpy(self.size.copy()), "lab_len": torch.from_numpy(self.lab_len.copy()),
                "key": torch.from_numpy(self.key[idx].view(np.int64).copy()),
                "fl": torch.from_numpy(self.plane_values[idx].copy()), "lab": torch.from_numpy(labs.astype(np.int32)),
                "incomplete": torch.from_numpy(self.incomplete.copy())}

    @classmethod
    def from_state_dict(cls, sd: dict, true_labels) -> "WorkingSet":
        """The working set saved by :meth:`state_dict`, for blocks whose ground-truth labelings are ``true_labels``.
        Every array is checked (``ValueError`` naming the field): block count and labeling lengths those of
        ``true_labels``, sizes consistent, values finite, ``incomplete`` 0 or 1; the keys are recomputed.  The labels'
        range and losses are for the owner to check (:meth:`~torch_bcfw.duals.base.DualState.load_state_dict`)."""
        if not isinstance(sd, dict) or not {"size", "lab_len", "fl", "lab", "incomplete"} <= sd.keys():
            raise ValueError("state working_set must be the dict of WorkingSet.state_dict")
        n = len(true_labels)
        want = torch.tensor([len(y) for y in true_labels], dtype=torch.int64)
        size = saved_tensor(sd["size"], "working_set size", (n,), "int", lo=0)
        lab_len = saved_tensor(sd["lab_len"], "working_set lab_len", (n,), "int")
        if not torch.equal(lab_len, want):
            raise ValueError("working_set lab_len differs from the lengths of the blocks' labelings")
        P, Q = int(size.sum()), int((size * lab_len).sum())
        fl = saved_tensor(sd["fl"], "working_set fl", (P, NCOL))
        lab = saved_tensor(sd["lab"], "working_set lab", (Q,), "int", lo=0, hi=np.iinfo(np.int32).max)
        incomplete = saved_tensor(sd["incomplete"], "working_set incomplete", (n,), "int", lo=0, hi=1)
        ws = cls.__new__(cls)
        size = size.numpy().copy()
        ws._allocate(lab_len.numpy().copy(), size, np.maximum(size, 4).astype(np.int64),
                     incomplete.numpy().astype(np.uint8))
        fl, lab = fl.numpy(), lab.numpy().astype(np.int32)
        p = q = 0
        for i in range(n):
            m, L = int(ws.size[i]), int(ws.lab_len[i])
            s, ls = int(ws.start[i]), int(ws.lab_start[i])
            ws.plane_values[s:s + m] = fl[p:p + m]
            ws.plane_labels[ls:ls + m * L] = lab[q:q + m * L]
            p += m
            q += m * L
        _rehash(ws.arrays())
        return ws


@njit(cache=True)
def _rehash(ws) -> None:
    """Every plane's key from its labels."""
    for i in range(ws.size.shape[0]):
        L = ws.lab_len[i]
        for j in range(ws.size[i]):
            base = ws.lab_start[i] + j * L
            ws.key[ws.start[i] + j] = label_hash(ws.plane_labels[base:base + L])
