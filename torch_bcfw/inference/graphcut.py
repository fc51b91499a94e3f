"""Exact MAP inference for binary pairwise (Potts) models by graph cuts.

Labels are ``y_p in {0, 1}`` for ``N`` nodes; a problem is ``unary: Tensor[N, 2]`` (the score ``u_p[k]`` of label
``k``), ``edges: LongTensor[M, 2]`` (undirected, ``p != q``, duplicates add up) and ``pairwise: Tensor[M]`` (a Potts
*penalty* ``c_pq`` paid when the labels differ).  The score maximised is::

    S(y) = sum_p u_p[y_p]  -  sum_{(p, q) in E} c_pq [y_p != y_q].

It is submodular iff every ``c_pq >= 0``.  The models refuse penalties below ``-NEGATIVE_TOLERANCE`` (PyMaxflow
silently returns a wrong cut for them) and count those in ``[-NEGATIVE_TOLERANCE, 0)`` as ``0``.  :func:`build_graph`
builds the max-flow graph of a problem and :func:`cut_graph` solves it.

The solver is PyMaxflow (Boykov-Kolmogorov), imported lazily (``pip install torch_bcfw[graphcut]``); PyMaxflow is
licensed under the **GPL** (version 3 or later): a program that distributes it must comply with its licence.
"""

from __future__ import annotations

import os
from types import ModuleType

import numpy as np

NEGATIVE_TOLERANCE = 1e-12
"""Penalties in ``[-NEGATIVE_TOLERANCE, 0)`` are clamped to 0; anything lower is an error."""


def _import_maxflow() -> ModuleType:
    """Import PyMaxflow, or raise an ImportError that says how to install it."""
    try:
        import maxflow
    except ImportError as err:
        raise ImportError(
            "Graph-cut inference needs PyMaxflow: pip install torch_bcfw[graphcut] "
            "(or pip install PyMaxflow). Note that PyMaxflow is GPL-licensed."
        ) from err
    return maxflow


def build_graph(gain: np.ndarray, edges: np.ndarray, pairwise: np.ndarray):
    """The PyMaxflow graph of a validated problem.

    A node in the sink segment gets label 1 and pays its source capacity ``max(u0 - u1, 0)``, one in the source
    segment label 0 and its sink capacity ``max(u1 - u0, 0)``; each Potts edge is a pair of arcs of capacity ``c_pq``.
    ``gain``: ``float64[N]``, ``u1 - u0`` per node; ``edges``: ``int32[M, 2]``; ``pairwise``: ``float64[M]``, ``>= 0``.
    Returns ``(graph, nodes)``: a ``maxflow.Graph[float]`` and its node ids (``int[N]``).
    """
    maxflow = _import_maxflow()
    n, m = gain.shape[0], edges.shape[0]
    graph = maxflow.Graph[float](n, m)
    nodes = graph.add_nodes(n)
    graph.add_grid_tedges(nodes, np.maximum(-gain, 0.0), np.maximum(gain, 0.0))
    if m:
        graph.add_edges(edges[:, 0], edges[:, 1], pairwise, pairwise)
    return graph, nodes


def cut_graph(graph, nodes) -> np.ndarray:
    """Run the max-flow of a graph from :func:`build_graph`; ``bool[N]``, True where the label is 1."""
    graph.maxflow()
    return graph.get_grid_segments(nodes)


def available_cpus() -> int:
    """Number of CPUs this process may run on (affinity-aware where the OS supports it)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1
