"""The grid graphs, their edge features and PyMaxflow's lazy import (torch_bcfw.data.graphs,
torch_bcfw.inference.graphcut); the model's graph-cut oracle: tests/test_graphcut_model.py."""

from __future__ import annotations

import sys

import numpy as np
import pytest
import torch

pytest.importorskip("maxflow", reason="PyMaxflow is the optional [graphcut] dependency")

from torch_bcfw.data import edge_features, grid_edges  # noqa: E402
from torch_bcfw.inference.graphcut import build_graph  # noqa: E402


def test_grid_edges():
    for h, w in [(1, 1), (1, 5), (4, 1), (3, 4), (7, 9)]:
        edges = grid_edges(h, w)
        assert edges.shape == (h * (w - 1) + w * (h - 1), 2) and edges.dtype == torch.int64
        rows, cols = edges // w, edges % w
        manhattan = (rows[:, 0] - rows[:, 1]).abs() + (cols[:, 0] - cols[:, 1]).abs()
        assert bool((manhattan == 1).all())
        assert len({tuple(e) for e in edges.tolist()}) == edges.shape[0]
    assert grid_edges(2, 3).tolist() == [[0, 1], [1, 2], [3, 4], [4, 5], [0, 3], [1, 4], [2, 5]]


def test_edge_features():
    gen = torch.Generator().manual_seed(5)
    hwc = torch.rand(5, 6, 3, generator=gen)
    edges = grid_edges(5, 6)
    feats = edge_features(hwc, edges)
    assert feats.shape == (edges.shape[0], 2)
    assert bool((feats[:, 0] == 1).all())
    flat = hwc.reshape(-1, 3)
    sq = ((flat[edges[:, 0]] - flat[edges[:, 1]]) ** 2).sum(dim=1)
    torch.testing.assert_close(feats[:, 1], torch.exp(-sq / (2 * sq.mean())))
    torch.testing.assert_close(edge_features(hwc.permute(2, 0, 1), edges), feats)
    torch.testing.assert_close(edge_features(hwc, edges, beta=2.0)[:, 1], torch.exp(-2.0 * sq))
    assert bool((edge_features(torch.ones(4, 5, 3), grid_edges(4, 5))[:, 1] == 1).all())
    with pytest.raises(ValueError, match="layout"):
        edge_features(torch.rand(3, 4, 3), grid_edges(3, 4))


def test_missing_pymaxflow_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "maxflow", None)
    with pytest.raises(ImportError, match=r"pip install torch_bcfw\[graphcut\]"):
        build_graph(np.zeros(1), np.zeros((0, 2), dtype=np.int32), np.zeros(0))
