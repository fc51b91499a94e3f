"""Shared fixtures: tiny enumerable problems, brute-force oracles, paths to the real data."""
from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch: see torch_bcfw/__init__.py

import itertools
import math
from pathlib import Path

import pytest
import torch

from torch_bcfw.data import MulticlassData, SequenceData
from torch_bcfw.models import Chain, GraphCut, Multiclass, TableModel

DATA_ROOT = Path(__file__).resolve().parents[1].parent / "shared" / "data"

CUDA = torch.cuda.is_available()
requires_cuda = pytest.mark.skipif(not CUDA, reason="CUDA is not available on this machine")


@pytest.fixture(scope="module")
def one_torch_thread():
    """One torch intra-op thread for a module (use with ``pytestmark = pytest.mark.usefixtures(...)``): the generic
    step loops make many tiny torch calls, where threads only add contention."""
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


def shared_data(*parts) -> Path:
    """Path below ../shared/data; a clear failure (not a skip) when the data is missing."""
    p = DATA_ROOT.joinpath(*parts)
    if not p.exists():
        pytest.fail(f"real data missing: {p} (the repository expects ../shared/data beside it)")
    return p


def random_chain_problem(n=6, F=4, K=3, max_len=4, seed=0, min_len=1):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(min_len, max_len + 1, (n,), generator=g)
    xs = [torch.randn(int(L), F, generator=g, dtype=torch.float64) for L in lengths]
    ys = [torch.randint(0, K, (int(L),), generator=g) for L in lengths]
    return Chain(F, K), SequenceData.from_sequences(xs, ys)


def random_multiclass_problem(n=8, F=3, K=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, F, generator=g, dtype=torch.float64)
    y = torch.randint(0, K, (n,), generator=g)
    return Multiclass(F, K), MulticlassData(x, y)


def app_c_toy(n: int, K: int) -> tuple[TableModel, MulticlassData, float]:
    """The toy problem of Osokin et al. 2016, App. C, ``(model, data, lam = 1/n)``, on which gap sampling needs
    ``O(n + t)`` oracle calls where uniform sampling needs ``O(n t)`` for ``t`` steps on the hard example.

    Labels ``{0..K}`` (0 is the truth), 0-1 loss, ``phi(x_i, 0) = 0``; example 0 is *hard*:
    ``phi(x_0, k) = -e_k / sqrt(2)``; examples ``1..n-1`` are *easy*: ``phi(x_i, k) = -e_{K+1}``
    (coordinates ``e_1..e_K`` are indices ``0..K-1``, ``e_{K+1}`` is index ``K``).  After ``t <= K`` FW
    steps on the hard example its block gap is ``1/(2 n t)``; the first step on any easy example closes
    every easy gap for good.
    """
    d = K + 1
    feats = torch.zeros(n, K + 1, d, dtype=torch.float64)
    for k in range(1, K + 1):
        feats[0, k, k - 1] = -1.0 / math.sqrt(2.0)
        feats[1:, k, K] = -1.0
    losses = torch.ones(n, K + 1, dtype=torch.float64)
    losses[:, 0] = 0.0
    model = TableModel(feats, losses)
    return model, model.data(torch.zeros(n, dtype=torch.long)), 1.0 / n


def enumerate_labelings(model, data, i):
    """All labelings of example ``i`` as a list of label tensors (brute force)."""
    if isinstance(model, Multiclass):
        return [torch.tensor([c]) for c in range(model.n_labels)]
    if isinstance(model, GraphCut):
        nodes = int(data.offsets[i + 1] - data.offsets[i])
        return [torch.tensor(c) for c in itertools.product(range(2), repeat=nodes)]
    L = int(data.lengths[i])
    return [torch.tensor(c) for c in itertools.product(range(model.n_labels), repeat=L)]


def brute_force_max(model, data, w, i, loss_augmented=True):
    """``(best value, argmax labeling)`` of ``[L_i(y)] + <w, phi(x_i, y)>`` by enumeration."""
    blk = data[[i]]
    best, arg = -float("inf"), None
    for y in enumerate_labelings(model, data, i):
        v = float(model.joint_feature(blk, y)[0] @ w)
        if loss_augmented:
            v += float(model.loss(blk, y)[0])
        if v > best + 1e-12:
            best, arg = v, y
    return best, arg


def brute_force_primal(model, data, w, lam):
    """``P(w)`` by enumerating every labeling of every example."""
    total = 0.0
    for i in range(len(data)):
        blk = data[[i]]
        best, _ = brute_force_max(model, data, w, i)
        total += best - float(model.joint_feature(blk, blk.y)[0] @ w)
    return 0.5 * lam * float(w @ w) + total / len(data)


def partial_matchings(m: int, f: int) -> list[tuple]:
    """Every partial matching of an ``m x f`` bipartite graph as a tuple of links ``(j, k)`` (brute force)."""
    def rec(j, used):
        if j == m:
            yield ()
            return
        yield from rec(j + 1, used)
        for k in range(f):
            if k not in used:
                for rest in rec(j + 1, used | {k}):
                    yield ((j, k),) + rest
    return list(rec(0, frozenset()))
