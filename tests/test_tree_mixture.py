"""Mixture-type tree max-sum: brute-force enumeration of positions and types, and the K = 1 reduction."""
from __future__ import annotations

import itertools

import pytest
import torch

from torch_bcfw.inference.tree import LSP_TREE_EDGES, tree_max_sum, tree_score
from torch_bcfw.inference.tree_mixture import mixture_tree_max_sum

TINY_EDGES = ((0, 1), (0, 2), (2, 3))  # a root with a leaf and a chain of two


def random_mixture(gen, batch, joints, edges, K, gy, gx):
    unary = torch.randn(batch, joints, gy, gx, generator=gen, dtype=torch.float64)
    w = torch.randn(batch, len(edges), K, 4, generator=gen, dtype=torch.float64)
    w[..., 1] = w[..., 1].abs() * 0.5
    w[..., 3] = w[..., 3].abs() * 0.5
    b = torch.randn(batch, len(edges), K, generator=gen, dtype=torch.float64)
    mu = 2.0 * torch.randn(batch, len(edges), K, 2, generator=gen, dtype=torch.float64)
    return unary, w, b, mu


def mixture_tree_score(unary, positions, types, w, b, mu, edges):
    """Score [n] of positions [n, J, 2] with edge types [n, E] (``w [E, K, 4]``, ``b [E, K]``, ``mu [E, K, 2]``): the
    plain tree's score with each edge's weights and offset of its type, plus the types' biases."""
    e = torch.arange(len(edges))
    return tree_score(unary, positions, w[e, types], mu[e, types], edges) + b[e, types].sum(1)


def brute_force(unary, w, b, mu, edges, K):
    """Best score over every (positions, types) pair, enumerated jointly."""
    batch, joints, gy, gx = unary.shape
    positions = torch.tensor(list(itertools.product(range(gy * gx), repeat=joints)))
    positions = torch.stack((positions // gx, positions % gx), -1)
    types = torch.tensor(list(itertools.product(range(K), repeat=len(edges))))
    best = torch.full((batch,), -float("inf"), dtype=torch.float64)
    for t in types:
        n = positions.shape[0]
        for i in range(batch):
            s = mixture_tree_score(unary[i].expand(n, -1, -1, -1), positions, t.expand(n, -1), w[i], b[i], mu[i], edges)
            best[i] = torch.maximum(best[i], s.max())
    return best


@pytest.mark.parametrize("K", [1, 2, 3])
def test_mixture_max_sum_equals_brute_force_over_positions_and_types(K):
    gen = torch.Generator().manual_seed(K)
    unary, w, b, mu = random_mixture(gen, 3, 4, TINY_EDGES, K, 2, 3)
    res = mixture_tree_max_sum(unary, w, b, mu, TINY_EDGES)
    torch.testing.assert_close(res.score, brute_force(unary, w, b, mu, TINY_EDGES, K), rtol=0, atol=1e-10)
    # the returned positions and types achieve the returned score
    for i in range(3):
        torch.testing.assert_close(mixture_tree_score(unary[i:i + 1], res.positions[i:i + 1], res.types[i:i + 1], w[i],
                                                      b[i], mu[i], TINY_EDGES), res.score[i:i + 1], rtol=0, atol=1e-10)
    assert res.types.shape == (3, len(TINY_EDGES)) and int(res.types.max()) < K


def _type_term(type_unary, positions, types, edges):
    """sum_e type_unary[e, t_e, 0, l_child] + type_unary[e, t_e, 1, l_parent], written with loops: [n]."""
    out = torch.zeros(positions.shape[0], dtype=torch.float64)
    for m in range(positions.shape[0]):
        for e, (p, c) in enumerate(edges):
            k = int(types[m, e])
            out[m] += type_unary[e, k, 0, positions[m, c, 0], positions[m, c, 1]]
            out[m] += type_unary[e, k, 1, positions[m, p, 0], positions[m, p, 1]]
    return out


@pytest.mark.parametrize("K", [2, 3])
def test_image_dependent_type_scores_equal_brute_force(K):
    """Chen & Yuille's image-dependent pairwise terms: a type score at both ends of every edge."""
    gen = torch.Generator().manual_seed(10 + K)
    edges = ((0, 1), (0, 2))
    unary, w, b, mu = random_mixture(gen, 2, 3, edges, K, 2, 3)
    tu = torch.randn(2, len(edges), K, 2, 2, 3, generator=gen, dtype=torch.float64)
    res = mixture_tree_max_sum(unary, w, b, mu, edges, type_unary=tu)
    positions = torch.tensor(list(itertools.product(range(6), repeat=3)))
    positions = torch.stack((positions // 3, positions % 3), -1)
    n = positions.shape[0]
    for i in range(2):
        best = -float("inf")
        for t in itertools.product(range(K), repeat=len(edges)):
            tt = torch.tensor(t).expand(n, -1)
            s = mixture_tree_score(unary[i].expand(n, -1, -1, -1), positions, tt, w[i], b[i], mu[i], edges)
            s = s + _type_term(tu[i], positions, tt, edges)
            best = max(best, float(s.max()))
        assert abs(float(res.score[i]) - best) < 1e-10
        # the returned labeling achieves the maximum
        got = mixture_tree_score(unary[i:i + 1], res.positions[i:i + 1], res.types[i:i + 1], w[i], b[i], mu[i], edges)
        assert abs(float(got + _type_term(tu[i], res.positions[i:i + 1], res.types[i:i + 1], edges)) - best) < 1e-10
    # without type scores the answer differs (the test can fail): the scores matter
    plain = mixture_tree_max_sum(unary, w, b, mu, edges)
    assert not torch.allclose(plain.score, res.score)
    with pytest.raises(ValueError, match="type_unary must have shape"):
        mixture_tree_max_sum(unary, w, b, mu, edges, type_unary=tu[:, :, :, :1])
    with pytest.raises(ValueError, match="finite"):
        mixture_tree_max_sum(unary, w, b, mu, edges, type_unary=tu * float("inf"))


def test_one_type_without_bias_is_the_plain_tree():
    gen = torch.Generator().manual_seed(5)
    unary, w, _, mu = random_mixture(gen, 4, 14, LSP_TREE_EDGES, 1, 7, 6)
    res = mixture_tree_max_sum(unary, w, torch.zeros(4, 13, 1, dtype=torch.float64), mu, LSP_TREE_EDGES)
    ref = tree_max_sum(unary, w[:, :, 0], mu[:, :, 0], LSP_TREE_EDGES)
    torch.testing.assert_close(res.score, ref.score, rtol=0, atol=1e-10)
    assert torch.equal(res.positions, ref.positions) and int(res.types.abs().max()) == 0


def test_a_dominant_type_is_chosen_and_its_offset_used():
    """Two types with offsets (0, +3) and (0, -3): a large bias on the second puts every child left of its parent."""
    G = 9
    unary = torch.zeros(1, 2, G, G, dtype=torch.float64)
    unary[0, 0, 4, 4] = 5.0  # the root is pinned at (4, 4)
    w = torch.tensor([[[0.0, 1.0, 0.0, 1.0], [0.0, 1.0, 0.0, 1.0]]], dtype=torch.float64)
    mu = torch.tensor([[[0.0, 3.0], [0.0, -3.0]]], dtype=torch.float64)
    for bias, col, typ in (((2.0, 0.0), 7, 0), ((0.0, 2.0), 1, 1)):
        res = mixture_tree_max_sum(unary, w, torch.tensor([bias], dtype=torch.float64), mu, ((0, 1),))
        assert res.positions[0, 1].tolist() == [4, col] and int(res.types[0, 0]) == typ


def test_mixture_rejects_bad_input():
    gen = torch.Generator().manual_seed(0)
    unary, w, b, mu = random_mixture(gen, 2, 4, TINY_EDGES, 2, 3, 3)
    bad = w.clone()
    bad[1, 2, 1, 3] = -0.1
    with pytest.raises(ValueError, match="quadratic"):
        mixture_tree_max_sum(unary, bad, b, mu, TINY_EDGES)
    with pytest.raises(ValueError, match="b must have shape"):
        mixture_tree_max_sum(unary, w, b[:, :, :1], mu, TINY_EDGES)
    with pytest.raises(ValueError, match="mu must have shape"):
        mixture_tree_max_sum(unary, w, b, mu[..., :1], TINY_EDGES)
    with pytest.raises(ValueError, match="finite"):
        mixture_tree_max_sum(unary, w, b * float("nan"), mu, TINY_EDGES)


def test_offset_types_are_a_k_means_fixed_point_of_the_visible_offsets():
    from torch_bcfw.models.pose import offset_types

    gen = torch.Generator().manual_seed(3)
    n, J = 60, 3
    edges = ((0, 1), (0, 2))
    parent = torch.randint(4, 8, (n, 2), generator=gen).double()
    side = torch.where(torch.rand(n, generator=gen) < 0.5, -3.0, 3.0)  # two clusters of offsets on edge 0
    pos = torch.stack([parent, parent + torch.stack([torch.zeros(n), side], 1), parent + 1.0], 1)
    visible = torch.ones(n, J, dtype=torch.bool)
    visible[:5, 1] = False
    pos[:5, 1] = float("nan")  # invisible joints are not used for the centres
    centres, types = offset_types(pos, visible, 2, edges, seed=1)
    assert centres.shape == (2, 2, 2) and types.shape == (n, 2)
    assert sorted(centres[0, :, 1].tolist()) == [-3.0, 3.0] and torch.all(centres[0, :, 0] == 0)
    d = pos[5:, 1] - pos[5:, 0]
    assert torch.equal(centres[0, types[5:, 0], 1], d[:, 1])  # every visible offset sits in its own cluster
    for k in range(2):  # a fixed point: each centre is the mean of its members
        members = d[types[5:, 0] == k]
        torch.testing.assert_close(centres[0, k], members.mean(0), rtol=0, atol=1e-12)
    assert torch.all(centres[1] == 1.0)  # a single distinct offset: repeated centre
    with pytest.raises(ValueError, match="n_types"):
        offset_types(pos, visible, 0, edges)
