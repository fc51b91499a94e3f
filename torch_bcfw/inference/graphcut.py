"""Exact MAP inference for binary pairwise (Potts) models by graph cuts.

Labels are ``y_p in {0, 1}`` for ``N`` nodes; a problem is ``unary: Tensor[N, 2]`` (the score ``u_p[k]`` of label
``k``), ``edges: LongTensor[M, 2]`` (undirected, ``p != q``, duplicates add up) and ``pairwise: Tensor[M]`` (a Potts
*penalty* ``c_pq`` paid when the labels differ).  The score maximised is::

    S(y) = sum_p u_p[y_p]  -  sum_{(p, q) in E} c_pq [y_p != y_q].

It is submodular iff every ``c_pq >= 0``.  Penalties below ``-NEGATIVE_TOLERANCE`` raise ``ValueError`` (PyMaxflow
silently returns a wrong cut for them); those in ``[-NEGATIVE_TOLERANCE, 0)`` count as ``0``.  Loss-augmented
decoding adds :func:`hamming_unary_augment` to ``unary``.

The solver is PyMaxflow (Boykov-Kolmogorov), imported lazily (``pip install torch_bcfw[graphcut]``); PyMaxflow is
licensed under the **GPL** (version 3 or later): a program that distributes it must comply with its licence.
"""

from __future__ import annotations

import os
from types import ModuleType

import numpy as np
import torch
from torch import Tensor

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


def _check_finite(name: str, values: np.ndarray) -> None:
    """Raise ValueError if ``values`` holds NaN or +-inf."""
    if not np.all(np.isfinite(values)):
        raise ValueError(f"{name} contains NaN or infinite values")


def _validate_edges(edges: Tensor, n: int) -> np.ndarray:
    """Check ``edges: LongTensor[M, 2]`` of an ``n``-node graph; return CPU ``int32[M, 2]``
    (``int64`` if ``n >= 2**31``)."""
    if edges.dim() != 2 or edges.shape[1] != 2:
        raise ValueError(f"edges must have shape [M, 2], got {tuple(edges.shape)}")
    if edges.dtype.is_floating_point or edges.dtype.is_complex or edges.dtype == torch.bool:
        raise ValueError(f"edges must be an integer tensor, got {edges.dtype}")
    e = edges.detach().to("cpu", torch.int64).numpy()
    if e.size and (e.min() < 0 or e.max() >= n):
        raise ValueError(f"edges reference nodes outside [0, {n}): min {e.min()}, max {e.max()}")
    loops = e[:, 0] == e[:, 1]
    if np.any(loops):
        raise ValueError(f"edges contain self-loops, e.g. edge {int(np.argmax(loops))}")
    return e.astype(np.int32 if n < 2**31 else np.int64)


def _validate_problem(unary: Tensor, edges: Tensor, pairwise: Tensor) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Check a problem (finite values, edges in ``[0, N)`` without self-loops, penalties ``>= -NEGATIVE_TOLERANCE``);
    return ``(u1 - u0 float64[N], edges int32[M, 2], pairwise float64[M])``, tiny negative penalties clamped to 0."""
    if unary.dim() != 2 or unary.shape[1] != 2:
        raise ValueError(f"unary must have shape [N, 2], got {tuple(unary.shape)}")
    n = unary.shape[0]
    e = _validate_edges(edges, n)
    if pairwise.shape != (e.shape[0],):
        raise ValueError(f"pairwise must have shape [M] = [{e.shape[0]}], got {tuple(pairwise.shape)}")
    u = unary.detach().to("cpu", torch.float64).numpy()
    c = pairwise.detach().to("cpu", torch.float64).numpy()
    _check_finite("unary", u)
    _check_finite("pairwise", c)
    if c.size and c.min() < -NEGATIVE_TOLERANCE:
        raise ValueError(
            f"pairwise penalties must be >= 0 for an exact graph cut (submodular energy); "
            f"got minimum {c.min():.6g} at edge {int(np.argmin(c))}"
        )
    return u[:, 1] - u[:, 0], e, np.maximum(c, 0.0)


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


def graphcut_map(unary: Tensor, edges: Tensor, pairwise: Tensor) -> Tensor:
    """Exact ``argmax_y S(y)`` of a submodular binary Potts model (``unary [N, 2]``, ``edges [M, 2]``, non-negative
    ``pairwise [M]``, see the module docstring): ``LongTensor[N]`` in ``{0, 1}`` on ``unary.device`` (ties broken
    deterministically).  ``ValueError`` on bad shapes, NaN/inf, bad edges or negative penalties; ``ImportError``
    without PyMaxflow."""
    gain, e, c = _validate_problem(unary, edges, pairwise)
    seg = cut_graph(*build_graph(gain, e, c)) if gain.shape[0] else np.zeros(0, dtype=bool)
    return torch.from_numpy(seg.astype(np.int64)).to(unary.device)


def energy_score(unary: Tensor, edges: Tensor, pairwise: Tensor, labels: Tensor) -> float:
    """Score ``S(y) = sum_p u_p[y_p] - sum_pq c_pq [y_p != y_q]`` of ``labels`` (``LongTensor[N]`` in ``{0, 1}``)
    as a Python float (computed in float64; ``pairwise`` may have any sign here)."""
    if labels.shape != (unary.shape[0],):
        raise ValueError(f"labels must have shape [{unary.shape[0]}], got {tuple(labels.shape)}")
    y = labels.to(unary.device, torch.int64)
    if y.numel() and (y.min() < 0 or y.max() > 1):
        raise ValueError("labels must be in {0, 1}")
    e = edges.to(unary.device, torch.int64)
    unary_part = unary.to(torch.float64).gather(1, y[:, None]).sum()
    cut = (y[e[:, 0]] != y[e[:, 1]]).to(torch.float64)
    return float(unary_part - (pairwise.to(unary.device, torch.float64) * cut).sum())


def available_cpus() -> int:
    """Number of CPUs this process may run on (affinity-aware where the OS supports it)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def hamming_node_weights(y_true: Tensor, weights: Tensor | None = None, balanced: bool = False) -> Tensor:
    """Per-node loss weights ``omega_p`` so that ``L(y) = sum_p omega_p [y_p != y_true_p]``.

    * ``balanced=False`` (normalised Hamming): ``omega_p = a_p / sum_q a_q``.
    * ``balanced=True`` (Osokin et al. 2016, App. I, as in the authors' code): ``omega_p = a_p / (2 A_c)``,
      ``A_c`` the mass of the true class ``c = y_true_p``, i.e. ``L = (FN / A_1 + FP / A_0) / 2`` (*inversely*
      proportional to the class area: the paper's "proportional" is a slip); ``a_p / A_c`` with one class present.

    ``a_p`` is the node mass: ``weights`` (optional non-negative ``Tensor[N]`` with positive total) or 1 per node.
    ``y_true``: ``LongTensor[N]`` in ``{0, 1}``.  Returns ``Tensor[N]`` (float64, on ``y_true.device``); both losses
    lie in ``[0, 1]``.
    """
    if y_true.dim() != 1:
        raise ValueError(f"y_true must have shape [N], got {tuple(y_true.shape)}")
    if y_true.numel() and (y_true.min() < 0 or y_true.max() > 1):
        raise ValueError("y_true must be in {0, 1}")
    if weights is None:
        mass = torch.ones(y_true.shape, dtype=torch.float64, device=y_true.device)
    else:
        if weights.shape != y_true.shape:
            raise ValueError(f"weights must have shape {tuple(y_true.shape)}")
        mass = weights.to(y_true.device, torch.float64)
        if not bool(torch.isfinite(mass).all()) or bool((mass < 0).any()):
            raise ValueError("weights must be finite and non-negative")
    if float(mass.sum()) <= 0:
        raise ValueError("Hamming loss needs at least one node with positive weight")
    if not balanced:
        return mass / mass.sum()
    class_mass = torch.zeros(2, dtype=torch.float64, device=y_true.device)
    class_mass.index_add_(0, y_true, mass)
    present = int((class_mass > 0).sum())
    safe_class_mass = torch.where(class_mass > 0, class_mass, torch.ones_like(class_mass))
    return mass / (present * safe_class_mass[y_true])


def hamming_unary_augment(y_true: Tensor, weights: Tensor | None = None, balanced: bool = False) -> Tensor:
    """Unary terms to add to the scores for loss-augmented decoding: ``graphcut_map(unary + aug, edges, pairwise)``
    returns ``argmax_y S(y) + L(y)``.  Arguments as :func:`hamming_node_weights`; returns ``Tensor[N, 2]``
    (float64), entry ``[p, k]`` is ``omega_p [k != y_true_p]``."""
    omega = hamming_node_weights(y_true, weights, balanced)
    wrong = torch.ones(y_true.shape[0], 2, dtype=torch.float64, device=y_true.device)
    wrong.scatter_(1, y_true[:, None], 0.0)
    return wrong * omega[:, None]


def hamming_loss(y_true: Tensor, y_pred: Tensor, weights: Tensor | None = None, balanced: bool = False) -> float:
    """Normalised or class-balanced Hamming loss ``sum_p omega_p [y_pred_p != y_true_p]`` in ``[0, 1]``, a Python
    float (``y_pred``: ``LongTensor[N]`` in ``{0, 1}``; other arguments as :func:`hamming_node_weights`)."""
    if y_pred.shape != y_true.shape:
        raise ValueError(f"y_pred shape {tuple(y_pred.shape)} != y_true {tuple(y_true.shape)}")
    omega = hamming_node_weights(y_true, weights, balanced)
    return float((omega * (y_pred.to(y_true.device) != y_true)).sum())
