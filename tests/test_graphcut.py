"""Graph-cut MAP, energies, Hamming losses and the process pool (torch_bcfw.inference.graphcut)."""

from __future__ import annotations

import math
import sys

import pytest
import torch

pytest.importorskip("maxflow", reason="PyMaxflow is the optional [graphcut] dependency")

from torch_bcfw.data import edge_features, grid_edges
from torch_bcfw.inference.graphcut import energy_score, graphcut_map, hamming_loss, hamming_unary_augment  # noqa: E402

LOSSES = [None, "hamming", "balanced"]


def random_problem(gen: torch.Generator, n: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Random graph on ``n`` nodes: unary [n, 2], edges [m, 2] (duplicates allowed), c [m] >= 0."""
    unary = torch.randn(n, 2, generator=gen, dtype=torch.float64)
    m = int(torch.randint(0, 3 * n + 1, (1,), generator=gen)) if n > 1 else 0
    p = torch.randint(0, n, (m,), generator=gen)
    q = (p + torch.randint(1, max(n, 2), (m,), generator=gen)) % n
    pairwise = torch.rand(m, generator=gen, dtype=torch.float64) * 1.5
    pairwise[torch.rand(m, generator=gen) < 0.2] = 0.0
    return unary, torch.stack([p, q], dim=1), pairwise


def all_labelings(n: int) -> torch.Tensor:
    """LongTensor[2**n, n]: row k is the binary expansion of k."""
    return (torch.arange(2**n)[:, None] >> torch.arange(n)[None, :]) & 1


def brute_force_scores(unary, edges, pairwise, labelings) -> torch.Tensor:
    """Tensor[K]: S(y) for every row of labelings[K, N], written independently of energy_score."""
    unary_part = torch.where(labelings == 1, unary[:, 1], unary[:, 0]).sum(dim=1)
    if edges.shape[0] == 0:
        return unary_part
    cut = labelings[:, edges[:, 0]] != labelings[:, edges[:, 1]]
    return unary_part - (cut.double() * pairwise).sum(dim=1)


def augmented(unary: torch.Tensor, y_true: torch.Tensor, loss: str | None) -> torch.Tensor:
    if loss is None:
        return unary
    return unary + hamming_unary_augment(y_true, balanced=(loss == "balanced"))


@pytest.mark.parametrize("loss", LOSSES)
def test_graphcut_matches_brute_force(loss):
    gen = torch.Generator().manual_seed({None: 0, "hamming": 1, "balanced": 2}[loss])
    unique_checked = 0
    for trial in range(40):
        n = 1 + trial % 12
        unary, edges, pairwise = random_problem(gen, n)
        y_true = torch.randint(0, 2, (n,), generator=gen)
        unary = augmented(unary, y_true, loss)
        labels = graphcut_map(unary, edges, pairwise)
        assert labels.dtype == torch.int64 and labels.shape == (n,)
        assert set(labels.tolist()) <= {0, 1}

        labelings = all_labelings(n)
        scores = brute_force_scores(unary, edges, pairwise, labelings)
        found = energy_score(unary, edges, pairwise, labels)
        assert found == pytest.approx(float(scores.max()), abs=1e-9)
        index = int((labels << torch.arange(n)).sum())
        assert found == pytest.approx(float(scores[index]), abs=1e-12)

        top = torch.topk(scores, min(2, scores.numel())).values
        if top.numel() == 1 or float(top[0] - top[1]) > 1e-9:
            assert torch.equal(labels, labelings[int(scores.argmax())])
            unique_checked += 1
    assert unique_checked >= 30


@pytest.mark.parametrize("balanced", [False, True])
def test_augmentation_adds_exactly_the_loss(balanced):
    gen = torch.Generator().manual_seed(3)
    n = 8
    unary, edges, pairwise = random_problem(gen, n)
    labelings = all_labelings(n)
    for y_true in (torch.randint(0, 2, (n,), generator=gen), torch.ones(n, dtype=torch.long)):
        for weights in (None, torch.rand(n, generator=gen) + 0.1):
            aug = unary + hamming_unary_augment(y_true, weights=weights, balanced=balanced)
            gain = brute_force_scores(aug, edges, pairwise, labelings) - brute_force_scores(
                unary, edges, pairwise, labelings
            )
            losses = torch.tensor(
                [hamming_loss(y_true, y, weights=weights, balanced=balanced) for y in labelings],
                dtype=torch.float64,
            )
            torch.testing.assert_close(gain, losses, rtol=0, atol=1e-12)
            assert float(losses.min()) == 0.0 and float(losses.max()) == pytest.approx(1.0)


def test_hamming_loss_values():
    y_true = torch.tensor([1, 1, 0, 0, 0, 0])
    y_pred = torch.tensor([0, 1, 1, 0, 0, 0])  # one false negative, one false positive
    assert hamming_loss(y_true, y_pred) == pytest.approx(2 / 6)
    assert hamming_loss(y_true, y_pred, balanced=True) == pytest.approx(0.5 * (1 / 2 + 1 / 4))
    assert hamming_loss(y_true, y_true, balanced=True) == 0.0
    # only background present: balanced loss is the background error rate, still in [0, 1]
    background = torch.zeros(4, dtype=torch.long)
    one_wrong = torch.tensor([1, 0, 0, 0])
    assert hamming_loss(background, one_wrong, balanced=True) == pytest.approx(0.25)
    assert hamming_loss(background, torch.ones(4, dtype=torch.long), balanced=True) == 1.0
    # node masses (e.g. superpixel areas): area-weighted false-negative and false-positive rates
    areas = torch.tensor([3.0, 1.0, 2.0, 2.0, 2.0, 2.0])
    assert hamming_loss(y_true, y_pred, weights=areas, balanced=True) == pytest.approx(
        0.5 * (3 / 4 + 2 / 8)
    )


def test_augment_layout_and_sign():
    y_true = torch.tensor([0, 1, 1])
    aug = hamming_unary_augment(y_true)
    expected = torch.tensor([[0, 1], [1, 0], [1, 0]], dtype=torch.float64) / 3
    torch.testing.assert_close(aug, expected)
    # zero unaries + augmentation: the loss-augmented MAP is the complement of the truth
    labels = graphcut_map(aug, torch.zeros(0, 2, dtype=torch.long), torch.zeros(0))
    assert labels.tolist() == [1, 0, 0]


def small_valid():
    return torch.randn(3, 2), torch.tensor([[0, 1], [1, 2]]), torch.tensor([0.5, 1.0])


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda u, e, c: (u, e, torch.tensor([0.5, -0.1])), "pairwise penalties must be >= 0"),
        (lambda u, e, c: (u, e, torch.tensor([0.5, -1e-9])), "pairwise penalties must be >= 0"),
        (lambda u, e, c: (u * torch.tensor([[1.0, math.nan]]), e, c), "unary contains NaN"),
        (lambda u, e, c: (u, e, torch.tensor([0.5, math.inf])), "pairwise contains NaN"),
        (lambda u, e, c: (u, e, torch.tensor([0.5, math.nan])), "pairwise contains NaN"),
        (lambda u, e, c: (u, torch.tensor([[0, 1], [1, 3]]), c), "outside"),
        (lambda u, e, c: (u, torch.tensor([[0, 1], [-1, 2]]), c), "outside"),
        (lambda u, e, c: (u, torch.tensor([[0, 1], [2, 2]]), c), "self-loop"),
        (lambda u, e, c: (u, e.float(), c), "integer"),
        (lambda u, e, c: (u[:, :1], e, c), r"\[N, 2\]"),
        (lambda u, e, c: (u, e, c[:1]), r"\[M\]"),
    ],
)
def test_invalid_problems_raise(mutate, message):
    with pytest.raises(ValueError, match=message):
        graphcut_map(*mutate(*small_valid()))


def test_tiny_negative_penalty_is_clamped():
    unary, edges, _ = small_valid()
    labels = graphcut_map(unary, edges, torch.tensor([0.5, -1e-13], dtype=torch.float64))
    assert labels.shape == (3,)


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
        graphcut_map(*small_valid())
