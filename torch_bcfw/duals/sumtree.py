"""Sum tree over per-block gap estimates: exact sampling ``i ~ g_i^p / sum_j g_j^p`` in ``O(log n)``.

Shared by the solvers' gap sampler (:class:`torch_bcfw.solvers.sampling.GapSampler`) and the compiled step loops,
which update a block's estimate right after its oracle call.  Layout: ``tree[1]`` is the total, node ``p`` has
children ``2p`` and ``2p + 1``, block ``i``'s leaf is ``tree[size + i]`` (``size`` the smallest power of two ``>=
n``); inner nodes are always recomputed from their children.  Estimates ``+inf`` mark never-visited blocks: their
leaf is 0 and they are served first, in the order of ``queue`` (position ``smeta[0]``; Osokin et al. 2016, Alg. 2).
"""
from __future__ import annotations

import numpy as np
from numba import njit

__all__ = ["tree_size", "tree_set", "tree_build", "tree_sample", "est_set", "gap_draw", "gap_draw_round"]


def tree_size(n: int) -> int:
    size = 1
    while size < n:
        size *= 2
    return size


@njit(cache=True)
def tree_set(tree, size, i, val) -> None:
    p = size + i
    tree[p] = val
    p //= 2
    while p >= 1:
        tree[p] = tree[2 * p] + tree[2 * p + 1]
        p //= 2


@njit(cache=True)
def _leaf(g, power):
    if not (g < np.inf):
        return 0.0
    if power == 1.0:
        return g
    return g ** power


@njit(cache=True)
def tree_build(tree, size, est, power) -> None:
    tree[:] = 0.0
    for i in range(est.shape[0]):
        tree[size + i] = _leaf(est[i], power)
    for p in range(size - 1, 0, -1):
        tree[p] = tree[2 * p] + tree[2 * p + 1]


@njit(cache=True)
def tree_sample(tree, size, u) -> int:
    """Leaf index drawn with probability ``leaf / total`` for a uniform ``u in [0, 1)`` (total > 0); never a
    zero-weight leaf."""
    x = u * tree[1]
    p = 1
    while p < size:
        left = tree[2 * p]
        right = tree[2 * p + 1]
        if (x < left and left > 0.0) or not (right > 0.0):
            p = 2 * p
        else:
            x -= left
            p = 2 * p + 1
    return p - size


@njit(cache=True)
def est_set(est, tree, size, i, g, power, use_tree) -> None:
    """Store the block gap ``g`` of block ``i`` as its estimate (clipped at 0) and update its leaf."""
    if g < 0.0 or g != g:
        g = 0.0
    est[i] = g
    if use_tree:
        tree_set(tree, size, i, _leaf(g, power))


@njit(cache=True)
def gap_draw(queue, smeta, tree, size, u) -> int:
    """Next block of gap sampling: the unvisited blocks first (``queue``), then ``i ~ tree``; -1 when all
    estimates are zero (the caller must refresh them with an exact gap pass)."""
    if smeta[0] < queue.shape[0]:
        i = queue[smeta[0]]
        smeta[0] += 1
        return i
    if not (tree[1] > 0.0):
        return -1
    return tree_sample(tree, size, u)


@njit(cache=True)
def gap_draw_round(queue, smeta, tree, size, uniforms, out) -> int:
    """Up to ``len(out)`` *distinct* blocks for a mini-batch round, written to ``out``: the unvisited blocks first,
    then draws ``i ~ tree`` without replacement (one of ``uniforms`` per slot; a drawn leaf is 0 until the caller's
    :func:`est_set`).  Returns how many were drawn (0: all estimates are zero)."""
    c = 0
    for j in range(out.shape[0]):
        if smeta[0] < queue.shape[0]:
            out[c] = queue[smeta[0]]
            smeta[0] += 1
        elif tree[1] > 0.0:
            i = tree_sample(tree, size, uniforms[j])
            tree_set(tree, size, i, 0.0)
            out[c] = i
        else:
            break
        c += 1
    return c
