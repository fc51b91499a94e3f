"""Every data container follows the StructuredData protocol: len, indexing, to, cat."""
from __future__ import annotations

import pytest
import torch

import torch_bcfw as tb
from torch_bcfw.data import (GraphData, MatchingData, MulticlassData, PoseData, SequenceData, SparseFeatures,
                             StructuredData)

N = 6


def _multiclass(g):
    return MulticlassData(torch.randn(N, 3, generator=g, dtype=torch.float64), torch.randint(0, 4, (N,), generator=g))


def _sequences(g, sparse=False):
    lengths = [1, 3, 2, 4, 1, 2]
    ys = [torch.randint(0, 3, (L,), generator=g) for L in lengths]
    if sparse:
        ids = [torch.randint(-1, 7, (L, 2), generator=g) for L in lengths]
        return SequenceData.from_attribute_ids(ids, 7, ys)
    return SequenceData.from_sequences([torch.randn(L, 4, generator=g, dtype=torch.float64) for L in lengths], ys)


def _graphs(g):
    sizes = [3, 1, 4, 2, 3, 2]
    edges = [torch.tensor([[j, j + 1] for j in range(n - 1)], dtype=torch.long).reshape(-1, 2) for n in sizes]
    return GraphData.from_graphs([torch.randn(n, 2, generator=g, dtype=torch.float64) for n in sizes], edges,
                                 [torch.rand(len(e), 2, generator=g, dtype=torch.float64) for e in edges],
                                 ys=[torch.randint(0, 2, (n,), generator=g) for n in sizes])


def _poses(g):
    J, G = 3, 5
    return PoseData(torch.randn(N, J, 1, G, G, generator=g), torch.randint(0, G, (N, J, 2), generator=g),
                    torch.rand(N, J, generator=g) > 0.3, torch.rand(N, generator=g, dtype=torch.float64) + 1)


def _matchings(g):
    pairs = [(1, 2), (2, 2), (3, 1), (2, 3), (1, 1), (2, 2)]
    ys = []
    for m, f in pairs:  # a matching: link (j, j) where both words exist
        y = torch.zeros(m, f, dtype=torch.long)
        y[torch.arange(min(m, f)), torch.arange(min(m, f))] = 1
        ys.append(y)
    return MatchingData.from_pairs([torch.randn(m, f, 3, generator=g, dtype=torch.float64) for m, f in pairs], ys,
                                   sure=[y.bool() for y in ys])


CONTAINERS = {"multiclass": _multiclass, "sequences": _sequences, "sparse-sequences": lambda g: _sequences(g, True),
              "graphs": _graphs, "poses": _poses, "matchings": _matchings}


def _fields(data) -> dict:
    """Every public tensor the container holds (sparse token features as their CSR arrays; caches left out)."""
    out = {}
    for name, value in vars(data).items():
        if name.startswith("_"):
            continue
        if isinstance(value, SparseFeatures):
            out.update({f"{name}.{k}": getattr(value, k) for k in ("indptr", "indices", "values")})
        elif isinstance(value, torch.Tensor):
            out[name] = value
    return out


def _assert_same(a, b) -> None:
    assert type(a) is type(b) and len(a) == len(b)
    fa, fb = _fields(a), _fields(b)
    assert set(fa) == set(fb)
    for name in fa:
        assert fa[name].dtype == fb[name].dtype and torch.equal(fa[name], fb[name]), name


@pytest.fixture(params=sorted(CONTAINERS))
def data(request):
    return CONTAINERS[request.param](torch.Generator().manual_seed(0))


def test_every_container_is_structured_data(data) -> None:
    assert isinstance(data, StructuredData)
    assert len(data) == N and data.y is not None and data.device == torch.device("cpu")


def test_indexing_round_trip(data) -> None:
    _assert_same(data[torch.arange(N)], data)
    _assert_same(data[:], data)
    _assert_same(data[list(range(N))], data)
    _assert_same(data[2:5], data[[2, 3, 4]])
    _assert_same(data[-1], data[[N - 1]])
    assert len(data[[1, 1, 0]]) == 3
    back = data[[4, 0, 2]][torch.tensor([1, 2, 0])]  # -> examples 0, 2, 4
    _assert_same(back, data[::2])


#: the floating-point features, which ``to(dtype)`` casts (labels, offsets, masks, torso sizes ... keep their dtype)
FEATURES = {"x", "x.values", "edge_x", "unary", "type_unary"}


def test_to_moves_and_casts_the_features(data) -> None:
    _assert_same(data.to("cpu"), data)
    low = data.to(torch.float32)
    before, after = _fields(data), _fields(low)
    assert type(low) is type(data) and len(low) == N and set(after) == set(before)
    for name, t in after.items():
        assert t.dtype == (torch.float32 if name in FEATURES else before[name].dtype), name
    _assert_same(low.to("cpu", torch.float64).to(torch.float32), low)


def test_cat_of_the_halves_is_the_whole(data) -> None:
    _assert_same(type(data).cat([data[:2], data[2:]]), data)
    _assert_same(type(data).cat([data]), data)
    with pytest.raises(ValueError):
        type(data).cat([])


def test_cat_refuses_mixed_containers() -> None:
    g = torch.Generator().manual_seed(1)
    mc, seq = _multiclass(g), _sequences(g)
    with pytest.raises(TypeError, match="MulticlassData parts only"):
        MulticlassData.cat([mc, seq])
    unlabelled = MulticlassData(mc.x)
    with pytest.raises(ValueError, match="labelled"):
        MulticlassData.cat([mc, unlabelled])
    with pytest.raises(ValueError, match="feature sizes"):
        SequenceData.cat([seq, _sequences(g, sparse=True)])


def test_top_level_exports() -> None:
    assert tb.StructuredData is StructuredData and tb.PoseData is PoseData and tb.data.PoseData is PoseData
