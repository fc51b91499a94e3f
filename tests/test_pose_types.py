"""Edge-type maps of a pose decoder (image-dependent pairwise relations): channel layout, normalisation, the
type loss against a loop, and a tree head fed one type map per edge, checked against enumeration."""
from __future__ import annotations

import itertools

import pytest
import torch

from torch_bcfw.data import PoseData
from torch_bcfw.inference.tree import LSP_TREE_EDGES, edge_ends
from torch_bcfw.models.pose import PoseTree, nearest_types, offset_types
from torch_bcfw.vision.heatmaps import (
    log_heatmaps,
    soft_targets,
    split_type_logits,
    type_channels,
    type_loss,
)

E = len(LSP_TREE_EDGES)


def test_type_channels_of_three_to_eight_types() -> None:
    assert type_channels(E, range(3, 9)) == 13 * (3 + 4 + 5 + 6 + 7 + 8) == 429
    with pytest.raises(ValueError, match="distinct integers >= 2"):
        type_channels(E, (1, 3))
    with pytest.raises(ValueError, match="distinct integers >= 2"):
        type_channels(E, (3, 3))


def test_split_type_logits_layout_and_normalisation() -> None:
    J, Es, counts, G = 4, 3, (2, 3), 5
    logits = torch.randn(2, J + Es * 5, G, G, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    joint, logq = split_type_logits(logits, J, Es, counts)
    assert joint.shape == (2, J, G, G) and torch.equal(joint, logits[:, :J])
    assert set(logq) == {2, 3} and logq[2].shape == (2, Es, 2, G, G) and logq[3].shape == (2, Es, 3, G, G)
    for K, p in logq.items():  # each K a separate softmax over its types at every cell
        torch.testing.assert_close(p.exp().sum(2), torch.ones(2, Es, G, G, dtype=torch.float64))
    # channel J + E (K_1 + ...) + K e + k is type k of edge e
    start = {2: J, 3: J + Es * 2}
    for K in counts:
        for e, k in itertools.product(range(Es), range(K)):
            block = logits[:, start[K] + K * e : start[K] + K * (e + 1)]
            torch.testing.assert_close(logq[K][:, e, k], torch.log_softmax(block, 1)[:, k])
    with pytest.raises(ValueError, match="type channels"):
        split_type_logits(logits[:, :-1], J, Es, counts)
    assert split_type_logits(logits[:, :J], J, Es, ())[1] == {}


def test_type_loss_equals_a_loop_and_trains_the_type_channels_only() -> None:
    gen = torch.Generator().manual_seed(1)
    B, Es, K, G = 3, 2, 3, 4
    logits = torch.randn(B, 2 + Es * K, G, G, generator=gen, dtype=torch.float64, requires_grad=True)
    _, logq = split_type_logits(logits, 2, Es, (K,))
    types = torch.randint(0, K, (B, Es), generator=gen)
    ends = torch.rand(B, Es, 2, G, G, generator=gen, dtype=torch.float64)
    ends = ends / ends.sum((-2, -1), keepdim=True)
    known = torch.tensor([[True, False], [True, True], [False, False]])
    loss = type_loss(logq[K], types, ends, known)
    total, count = 0.0, 0
    for b, e, s in itertools.product(range(B), range(Es), range(2)):
        if known[b, e]:
            total -= float((ends[b, e, s] * logq[K][b, e, types[b, e]]).sum().detach())
            count += 1
    assert float(loss.detach()) == pytest.approx(total / count, rel=1e-12)
    loss.backward()
    assert torch.equal(logits.grad[:, :2], torch.zeros_like(logits.grad[:, :2])) and logits.grad[:, 2:].abs().sum() > 0
    none = type_loss(logq[K], types, ends, torch.zeros(B, Es, dtype=torch.bool))
    assert float(none.detach()) == 0.0
    with pytest.raises(ValueError, match="expected types"):
        type_loss(logq[K], types[:, :1], ends, known)
    bad = types.clone()
    bad[known] = K  # a type out of range on a known edge is refused, not clamped
    if bool(known.any()):
        with pytest.raises(ValueError, match="known edges"):
            type_loss(logq[K], bad, ends, known)
    unknown = types.masked_fill(~known, -7)  # unknown edges carry no weight, whatever their type says
    assert float(type_loss(logq[K], unknown, ends, known).detach()) == pytest.approx(float(loss.detach()), rel=1e-12)


def test_type_targets_of_real_looking_poses() -> None:
    """Nearest types of a batch of poses: ``[B, E]`` in ``[0, K)``, the k-means labels of the training poses."""
    gen = torch.Generator().manual_seed(2)
    pos = torch.rand(20, 14, 2, generator=gen, dtype=torch.float64) * 16
    vis = torch.ones(20, 14, dtype=torch.bool)
    centres, labels = offset_types(pos, vis, 4, LSP_TREE_EDGES, seed=0)
    types = nearest_types(pos, centres, LSP_TREE_EDGES)
    assert types.shape == (20, E) and int(types.min()) >= 0 and int(types.max()) < 4
    assert torch.equal(types, labels)
    target = soft_targets(pos, 16, 2.0)
    parents, children = edge_ends(LSP_TREE_EDGES, "cpu")
    ends = torch.stack((target[:, children], target[:, parents]), dim=2)
    assert ends.shape == (20, E, 2, 16, 16)
    torch.testing.assert_close(ends.sum((-2, -1)), torch.ones(20, E, 2, dtype=torch.float64))
    logq = torch.log_softmax(torch.zeros(20, E, 4, 16, 16, dtype=torch.float64), 2)  # uniform: loss log 4
    assert float(type_loss(logq, types, ends, vis[:, children])) == pytest.approx(float(torch.log(torch.tensor(4.0))))


TINY = ((0, 1), (0, 2))  # 3 joints, 2 edges, on a 3 x 3 grid


def test_tree_with_one_type_map_per_edge_decodes_the_enumerated_optimum() -> None:
    """The example feeds the same type map to both ends of an edge (an expanded view); the tree's MAP over cells
    and types equals brute-force enumeration of the score written out."""
    G, K, Es = 3, 3, 2
    gen = torch.Generator().manual_seed(3)
    for trial in range(3):
        mu = torch.randn(Es, K, 2, generator=gen, dtype=torch.float64)
        scales = torch.rand(Es, K, 2, generator=gen, dtype=torch.float64) + 0.5
        model = PoseTree(G, mu, n_joints=3, edges=TINY, scales=scales, type_features=True)
        heat = log_heatmaps(torch.randn(2, 3, G, G, generator=gen, dtype=torch.float64))
        _, logq = split_type_logits(torch.randn(2, 3 + Es * K, G, G, generator=gen, dtype=torch.float64), 3, Es,
                                    (K,))
        tu = logq[K][:, :, :, None].expand(2, Es, K, 2, G, G)
        data = PoseData(heat.unsqueeze(2), type_unary=tu)
        w = torch.randn(model.n_features, generator=gen, dtype=torch.float64)
        w[model.quadratic_index()] = w[model.quadratic_index()].abs()
        w_u, w_def = model.unpack(w)
        bias, w_t = model.type_biases(w), model.type_feature_weights(w)
        y = model.oracle(w, data, loss_augmented=False)
        cells, types = model.split_labels(y, 2)
        for i in range(2):
            best, best_label = -float("inf"), None
            for flat in itertools.product(range(G * G), repeat=3):
                for t in itertools.product(range(K), repeat=Es):
                    yx = [(f // G, f % G) for f in flat]
                    s = sum(float(w_u[j, 0] * heat[i, j, yx[j][0], yx[j][1]]) for j in range(3))
                    for e, (p, c) in enumerate(TINY):
                        k = t[e]
                        dx = (yx[c][1] - yx[p][1] - float(mu[e, k, 1])) / float(scales[e, k, 1])
                        dy = (yx[c][0] - yx[p][0] - float(mu[e, k, 0])) / float(scales[e, k, 0])
                        s -= float(w_def[e, k] @ torch.tensor([dx, dx * dx, dy, dy * dy], dtype=torch.float64))
                        s += float(bias[e, k])
                        s += float(w_t[e, 0] * logq[K][i, e, k, yx[c][0], yx[c][1]])
                        s += float(w_t[e, 1] * logq[K][i, e, k, yx[p][0], yx[p][1]])
                    if s > best + 1e-12:
                        best, best_label = s, (flat, t)
            got = model.score(w, data[[i]], model.pack_labels(cells[[i]], types[[i]]))
            assert float(got) == pytest.approx(best, abs=1e-9), (trial, i)
            flat, t = best_label
            assert tuple(types[i].tolist()) == t and tuple((cells[i, :, 0] * G + cells[i, :, 1]).tolist()) == flat
