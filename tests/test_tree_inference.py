"""Exactness tests of the distance transform, tree max-sum and pose loss (torch_bcfw.inference)."""

from __future__ import annotations

import itertools

import pytest
import torch

from torch_bcfw.inference.distance_transform import distance_transform_2d, distance_transform_2d_packed
from torch_bcfw.inference.tree import (
    LSP_JOINTS,
    LSP_ROOT,
    LSP_TREE_EDGES,
    deformation_features,
    pose_loss,
    pose_loss_unaries,
    tree_max_sum,
    tree_score,
)

SIZES = (1, 2, 5, 7)
METHODS = ("envelope", "dense")
TINY_TREE = ((0, 1), (0, 2), (2, 3))  # 4 nodes: root 0 with a leaf and a chain of 2


def _random_coefficients(gen: torch.Generator, batch: int) -> dict[str, torch.Tensor]:
    """Random 2D coefficients [B]; some quadratic coefficients are exactly zero."""
    coeffs = {name: torch.randn(batch, generator=gen, dtype=torch.float64) * 2 for name in ("b_x", "b_y")}
    for name in ("a_x", "a_y"):
        a = torch.rand(batch, generator=gen, dtype=torch.float64) * 2
        coeffs[name] = torch.where(torch.rand(batch, generator=gen) < 0.3, 0.0, a)
    for name in ("mu_x", "mu_y"):
        coeffs[name] = torch.randn(batch, generator=gen, dtype=torch.float64) * 3
    return coeffs


def _penalty_2d(c: dict[str, torch.Tensor], qy, qx, py, px, i: int) -> torch.Tensor:
    dx = qx - px - c["mu_x"][i]
    dy = qy - py - c["mu_y"][i]
    return c["a_x"][i] * dx**2 + c["b_x"][i] * dx + c["a_y"][i] * dy**2 + c["b_y"][i] * dy


def _brute_force_2d(f: torch.Tensor, c: dict[str, torch.Tensor]) -> torch.Tensor:
    """max over all (py, px) for every (qy, qx): [B, G_y, G_x]."""
    batch, gy, gx = f.shape
    qy, qx, py, px = torch.meshgrid(*(torch.arange(n, dtype=torch.float64) for n in (gy, gx, gy, gx)),
                                    indexing="ij")
    values = [(f[i][None, None] - _penalty_2d(c, qy, qx, py, px, i)).reshape(gy, gx, -1).amax(-1)
              for i in range(batch)]
    return torch.stack(values)


@pytest.mark.parametrize("method", METHODS)
def test_distance_transform_2d_equals_brute_force(method: str) -> None:
    gen = torch.Generator().manual_seed(0)
    for gy, gx in itertools.product(SIZES, SIZES):
        for _ in range(3):
            batch = 4
            f = torch.randn(batch, gy, gx, generator=gen, dtype=torch.float64) * 3
            c = _random_coefficients(gen, batch)
            d, arg_y, arg_x = distance_transform_2d(f, **c, method=method)
            expected = _brute_force_2d(f, c)
            torch.testing.assert_close(d, expected, rtol=0, atol=1e-9)
            # The returned maximisers achieve the maximum.
            qy, qx = torch.meshgrid(torch.arange(gy, dtype=torch.float64), torch.arange(gx, dtype=torch.float64),
                                    indexing="ij")
            for i in range(batch):
                achieved = f[i][arg_y[i], arg_x[i]] - _penalty_2d(c, qy, qx, arg_y[i], arg_x[i], i)
                torch.testing.assert_close(achieved, expected[i], rtol=0, atol=1e-9)


@pytest.mark.parametrize("method", METHODS)
def test_distance_transform_of_one_row_equals_brute_force(method: str) -> None:
    gen = torch.Generator().manual_seed(1)
    for n in (1, 2, 5, 7, 16):
        f = torch.randn(6, n, generator=gen, dtype=torch.float64) * 3
        a = torch.tensor([0.0, 0.0, 0.5, 1.0, 1e-3, 4.0], dtype=torch.float64)
        b = torch.randn(6, generator=gen, dtype=torch.float64)
        mu = torch.randn(6, generator=gen, dtype=torch.float64) * 4
        d, _, arg = distance_transform_2d(f[:, None], a, b, 0.0, 0.0, mu, method=method)
        d, arg = d[:, 0], arg[:, 0]
        grid = torch.arange(n, dtype=torch.float64)
        delta = grid[None, :, None] - grid[None, None, :] - mu[:, None, None]  # [B, q, p]
        values = f[:, None, :] - a[:, None, None] * delta**2 - b[:, None, None] * delta
        torch.testing.assert_close(d, values.amax(-1), rtol=0, atol=1e-9)
        torch.testing.assert_close(values.gather(2, arg[..., None]).squeeze(-1), d, rtol=0, atol=1e-9)


def test_distance_transform_keeps_dtype_and_accepts_scalars() -> None:
    f = torch.randn(2, 5, 4)
    d, arg_y, arg_x = distance_transform_2d(f, 0.5, 0.1, 0.0, -0.2, 1.5, -0.5)
    assert d.dtype == torch.float32 and d.shape == (2, 5, 4)
    assert arg_y.dtype == torch.long and arg_x.dtype == torch.long
    dense = distance_transform_2d(f, 0.5, 0.1, 0.0, -0.2, 1.5, -0.5, method="dense")[0]
    torch.testing.assert_close(d, dense)


def test_distance_transform_rejects_bad_input() -> None:
    f = torch.randn(2, 3, 3)
    with pytest.raises(ValueError, match="a_x"):
        distance_transform_2d(f, -0.1, 0.0, 1.0, 0.0)
    with pytest.raises(ValueError, match="a_y"):
        distance_transform_2d(f, 1.0, 0.0, torch.tensor([1.0, -1.0]), 0.0)
    with pytest.raises(ValueError, match=">= 0"):
        distance_transform_2d_packed(f, torch.tensor([[1.0, 0, 0, -1.0, 0, 0]] * 2))
    with pytest.raises(ValueError, match="finite"):
        distance_transform_2d(torch.full((1, 2, 2), float("-inf")), 1.0, 0.0, 1.0, 0.0)
    with pytest.raises(ValueError, match="shape"):
        distance_transform_2d(f, torch.ones(3), 0.0, 1.0, 0.0)
    with pytest.raises(ValueError, match="method"):
        distance_transform_2d(f, 1.0, 0.0, 1.0, 0.0, method="fast")  # type: ignore[arg-type]


def _random_model(gen: torch.Generator, batch: int, num_nodes: int, num_edges: int, grid: int):
    """unary [B, J, G, G], w [E, 4] with quadratic weights >= 0 (one of them zero), mu [E, 2]."""
    unary = torch.randn(batch, num_nodes, grid, grid, generator=gen, dtype=torch.float64) * 2
    w = torch.randn(num_edges, 4, generator=gen, dtype=torch.float64)
    w[:, [1, 3]] = w[:, [1, 3]].abs()
    w[0, 1] = 0.0
    mu = torch.randn(num_edges, 2, generator=gen, dtype=torch.float64) * grid / 3
    return unary, w, mu


def brute_force_max_score(unary, w, mu, edges) -> torch.Tensor:
    """Tensor[B]: the best :func:`tree_score` of each image over all ``P**J`` configurations (any edge list)."""
    batch, num_nodes, gy, gx = unary.shape
    flat = torch.tensor(list(itertools.product(range(gy * gx), repeat=num_nodes)), dtype=torch.long)
    configs = torch.stack((flat // gx, flat % gx), dim=-1)  # [P**J, J, 2]
    w, mu = w.expand(batch, *w.shape[-2:]), mu.expand(batch, *mu.shape[-2:])
    return torch.stack([tree_score(unary[b].expand(len(configs), -1, -1, -1), configs, w[b], mu[b], edges).max()
                        for b in range(batch)])


def _assert_map_matches(result, unary, w, mu, edges) -> None:
    best = brute_force_max_score(unary, w, mu, edges)
    torch.testing.assert_close(result.score, best, rtol=0, atol=1e-9)
    torch.testing.assert_close(tree_score(unary, result.positions, w, mu, edges), best, rtol=0, atol=1e-9)


@pytest.mark.parametrize("grid", (2, 3))
def test_tree_max_sum_equals_brute_force(grid: int) -> None:
    gen = torch.Generator().manual_seed(grid)
    for _ in range(4):
        unary, w, mu = _random_model(gen, 3, 4, len(TINY_TREE), grid)
        result = tree_max_sum(unary, w, mu, TINY_TREE)
        assert result.positions.shape == (3, 4, 2) and result.positions.dtype == torch.long
        _assert_map_matches(result, unary, w, mu, TINY_TREE)


def test_tree_max_sum_with_edges_in_any_order_and_per_image_weights() -> None:
    gen = torch.Generator().manual_seed(5)
    edges = ((2, 3), (0, 1), (0, 2))  # child edge listed before its parent edge
    unary, w, mu = _random_model(gen, 2, 4, 3, 3)
    w_batch = torch.stack((w, w.flip(0)))
    w_batch[..., [1, 3]] = w_batch[..., [1, 3]].abs()
    result = tree_max_sum(unary, w_batch, mu, edges)
    _assert_map_matches(result, unary, w_batch, mu, edges)


def test_loss_augmented_max_sum_equals_brute_force() -> None:
    gen = torch.Generator().manual_seed(7)
    grid = 3
    unary, w, mu = _random_model(gen, 3, 4, len(TINY_TREE), grid)
    true_pos = torch.rand(3, 4, 2, generator=gen, dtype=torch.float64) * (grid - 1)
    visible = torch.tensor([[True] * 4, [True, False, True, True], [False] * 4])
    torso = torch.tensor([1.0, 2.5, 0.7], dtype=torch.float64)
    augmented = unary + pose_loss_unaries(true_pos, visible, torso, grid)
    result = tree_max_sum(augmented, w, mu, TINY_TREE)
    _assert_map_matches(result, augmented, w, mu, TINY_TREE)


def _dense_lsp_max(unary: torch.Tensor, w: torch.Tensor, mu: torch.Tensor) -> torch.Tensor:
    """Independent max-sum: O(P^2) messages from explicit pairwise tables, recursion from the root."""
    batch, num_nodes, grid, _ = unary.shape
    cells = torch.tensor([(y, x) for y in range(grid) for x in range(grid)], dtype=torch.float64)  # [P, 2]
    children = {j: [(e, c) for e, (p, c) in enumerate(LSP_TREE_EDGES) if p == j] for j in range(num_nodes)}

    def upward(node: int) -> torch.Tensor:  # best score of the subtree below node, per position [B, P]
        belief = unary[:, node].reshape(batch, -1).clone()
        for e, child in children[node]:
            dy = cells[None, :, 0] - cells[:, None, 0] - mu[e, 0]  # [P parent, P child]
            dx = cells[None, :, 1] - cells[:, None, 1] - mu[e, 1]
            pairwise = -(w[e, 0] * dx + w[e, 1] * dx**2 + w[e, 2] * dy + w[e, 3] * dy**2)
            belief = belief + (upward(child)[:, None, :] + pairwise[None]).amax(-1)
        return belief

    return upward(LSP_ROOT).amax(-1)


def test_lsp_tree_max_sum_equals_dense_messages() -> None:
    gen = torch.Generator().manual_seed(11)
    for _ in range(3):
        unary, w, mu = _random_model(gen, 2, 14, 13, 4)
        result = tree_max_sum(unary, w, mu)
        expected = _dense_lsp_max(unary, w, mu)
        torch.testing.assert_close(result.score, expected, rtol=0, atol=1e-9)
        torch.testing.assert_close(tree_score(unary, result.positions, w, mu), expected, rtol=0, atol=1e-9)
        dense = tree_max_sum(unary, w, mu, method="dense")
        torch.testing.assert_close(dense.score, expected, rtol=0, atol=1e-9)


def test_lsp_skeleton_is_a_tree_rooted_at_the_neck() -> None:
    assert len(LSP_JOINTS) == 14 and LSP_JOINTS[LSP_ROOT] == "neck"
    assert len(LSP_TREE_EDGES) == 13
    assert sorted(c for _, c in LSP_TREE_EDGES) == [j for j in range(14) if j != LSP_ROOT]
    positions = tree_max_sum(torch.zeros(1, 14, 3, 3), torch.ones(13, 4) * torch.tensor([0, 1, 0, 1]),
                             torch.zeros(13, 2)).positions
    assert positions.shape == (1, 14, 2)


def test_deformation_features_sign_convention() -> None:
    child, parent = torch.tensor([[5, 2]]), torch.tensor([[1, 4]])  # (y, x)
    mu = torch.tensor([3.0, -1.0])  # (mu_y, mu_x)
    dx, dy = 2 - 4 - (-1.0), 5 - 1 - 3.0
    torch.testing.assert_close(deformation_features(child, parent, mu), torch.tensor([[dx, dx**2, dy, dy**2]]))
    unary = torch.zeros(1, 2, 6, 6)
    w = torch.tensor([[0.5, 2.0, -1.0, 3.0]])
    positions = torch.stack((parent, child), dim=1)  # node 0 = parent, node 1 = child
    expected = -(0.5 * dx + 2.0 * dx**2 - 1.0 * dy + 3.0 * dy**2)
    torch.testing.assert_close(tree_score(unary, positions, w, mu[None], ((0, 1),)), torch.tensor([expected]))


def test_tree_rejects_negative_quadratic_weight_and_bad_trees() -> None:
    unary = torch.zeros(1, 3, 2, 2)
    w, mu = torch.ones(2, 4), torch.zeros(2, 2)
    w[1, 3] = -0.5
    with pytest.raises(ValueError, match=r"negative on edges \[1\]"):
        tree_max_sum(unary, w, mu, ((0, 1), (1, 2)))
    w[1, 3] = 0.5
    with pytest.raises(ValueError, match="more than one parent"):
        tree_max_sum(unary, w, mu, ((0, 2), (1, 2)))
    with pytest.raises(ValueError, match="not connected"):
        tree_max_sum(unary, w, mu, ((1, 2), (2, 1)))  # a cycle beside the root 0
    with pytest.raises(ValueError, match="edges"):
        tree_max_sum(unary, w[:1], mu[:1], ((0, 1),))
    with pytest.raises(ValueError, match="shape"):
        tree_max_sum(unary, torch.ones(2, 3), mu, ((0, 1), (1, 2)))


def test_pose_loss_values() -> None:
    true = torch.tensor([[[0.0, 0.0], [1.0, 1.0], [float("nan"), float("nan")]]])
    visible = torch.tensor([[True, True, False]])
    torso = torch.tensor([2.0])
    assert pose_loss(true.clone(), true, visible, torso).item() == 0.0
    pred = torch.tensor([[[1.0, 0.0], [9.0, 9.0], [0.0, 0.0]]])
    # joint 0: 1/4; joint 1: capped at 1; joint 2 ignored.
    torch.testing.assert_close(pose_loss(pred, true, visible, torso), torch.tensor([(0.25 + 1.0) / 2]))
    assert pose_loss(pred, true, torch.zeros(1, 3, dtype=torch.bool), torso).item() == 0.0
    with pytest.raises(ValueError, match="torso_size"):
        pose_loss(pred, true, visible, torch.tensor([0.0]))


def test_pose_loss_unaries_decompose_the_loss() -> None:
    gen = torch.Generator().manual_seed(3)
    batch, grid = 5, 6
    num_edges = len(LSP_TREE_EDGES)
    unary, w, mu = _random_model(gen, batch, 14, num_edges, grid)
    true_pos = torch.rand(batch, 14, 2, generator=gen, dtype=torch.float64) * (grid - 1)
    visible = torch.rand(batch, 14, generator=gen) < 0.8
    true_pos[~visible] = float("nan")
    torso = torch.rand(batch, generator=gen, dtype=torch.float64) * 3 + 0.5
    loss_unary = pose_loss_unaries(true_pos, visible, torso, grid)
    assert loss_unary.shape == (batch, 14, grid, grid) and torch.isfinite(loss_unary).all()
    for _ in range(10):
        positions = torch.randint(0, grid, (batch, 14, 2), generator=gen)
        direct = tree_score(unary, positions, w, mu) + pose_loss(positions, true_pos, visible, torso)
        torch.testing.assert_close(tree_score(unary + loss_unary, positions, w, mu), direct, rtol=0, atol=1e-12)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_dense_transform_on_cuda_matches_cpu() -> None:
    gen = torch.Generator().manual_seed(13)
    unary, w, mu = _random_model(gen, 2, 14, 13, 8)
    cpu = tree_max_sum(unary, w, mu)
    cuda = tree_max_sum(unary.cuda(), w.cuda(), mu.cuda())
    assert cuda.positions.is_cuda
    torch.testing.assert_close(cuda.score.cpu(), cpu.score, rtol=0, atol=1e-9)
