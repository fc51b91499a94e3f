"""PoseTree with mixture types per edge: joint features, oracle against enumeration of cells and types, the box,
the certified gap, data layout and errors."""
from __future__ import annotations

import itertools

import pytest
import torch

from torch_bcfw import fit
from torch_bcfw.models.pose import PoseTree, offset_scales, offset_types
from torch_bcfw.data import PoseData

TINY = ((0, 1), (0, 2))  # a 3-joint star rooted at joint 0
G, K = 3, 2


def _mixture_model(seed: int = 0, Ku: int = 2, types: int = K, type_features: bool = False) -> PoseTree:
    gen = torch.Generator().manual_seed(100 + seed)
    mu = torch.randn(2, types, 2, generator=gen, dtype=torch.float64) * 1.5
    scales = torch.rand(2, types, 2, generator=gen, dtype=torch.float64) + 0.5
    return PoseTree(G, mu, n_joints=3, n_unary=Ku, edges=TINY, scales=scales, type_features=type_features)


def _data(model: PoseTree, n: int = 4, seed: int = 0) -> PoseData:
    gen = torch.Generator().manual_seed(seed)
    unary = torch.randn(n, 3, model.n_unary, G, G, generator=gen, dtype=torch.float64)
    positions = torch.randint(0, G, (n, 3, 2), generator=gen)
    visible = torch.rand(n, 3, generator=gen) < 0.8
    torso = torch.rand(n, generator=gen, dtype=torch.float64) * 2 + 0.5
    tu = torch.randn(n, 2, model.n_types, 2, G, G, generator=gen, dtype=torch.float64) if model.type_features else None
    return PoseData(unary, positions, visible, torso, types=model.nearest_types(positions), type_unary=tu)


def _labelings(types: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Every (cells, types) of the tiny tree: cells [m, 3] flat, types [m, 2]."""
    rows = list(itertools.product(range(G * G), range(G * G), range(G * G), range(types), range(types)))
    t = torch.tensor(rows, dtype=torch.long)
    return t[:, :3], t[:, 3:]


def _phi(model: PoseTree, data: PoseData, i: int, cells: torch.Tensor, types: torch.Tensor) -> torch.Tensor:
    """Independent joint features [m, d] of example i (written from the module docstring's definition)."""
    Kt = model.n_types
    ys, xs = cells // G, cells % G
    parts = [data.unary[i, j][:, ys[:, j], xs[:, j]].T for j in range(3)]
    m = cells.shape[0]
    deform = torch.zeros(m, 2, Kt, 4, dtype=torch.float64)
    bias = torch.zeros(m, 2, Kt, dtype=torch.float64)
    for e, (p, c) in enumerate(TINY):
        for k in range(Kt):
            on = types[:, e] == k
            mu, s = model.mu[e, k], model.scales[e, k]
            dx = ((xs[:, c] - xs[:, p]).double() - mu[1]) / s[1]
            dy = ((ys[:, c] - ys[:, p]).double() - mu[0]) / s[0]
            deform[on, e, k] = -torch.stack((dx, dx * dx, dy, dy * dy), 1)[on]
            bias[on, e, k] = 1.0
    parts += [deform.reshape(m, -1), bias.reshape(m, -1)]
    if model.type_features:  # the type feature of the edge's type at its child (side 0) and parent (side 1) cell
        tf = torch.zeros(m, 2, 2, dtype=torch.float64)
        for e, (p, c) in enumerate(TINY):
            tu = data.type_unary[i, e]  # [K, 2, G, G]
            tf[:, e, 0] = tu[types[:, e], 0, ys[:, c], xs[:, c]]
            tf[:, e, 1] = tu[types[:, e], 1, ys[:, p], xs[:, p]]
        parts.append(tf.reshape(m, -1))
    return torch.cat(parts, 1)


def _loss(data: PoseData, i: int, cells: torch.Tensor) -> torch.Tensor:
    true = data.positions[i].double()
    pos = torch.stack((cells // G, cells % G), -1).double()
    d2 = ((pos - true) ** 2).sum(-1) / float(data.torso[i]) ** 2
    vis = data.visible[i]
    return (d2.clamp(max=1.0) * vis).sum(1) / max(int(vis.sum()), 1)


def _random_w(model: PoseTree, gen: torch.Generator) -> torch.Tensor:
    w = torch.randn(model.n_features, generator=gen, dtype=torch.float64)
    q = model.quadratic_index()
    w[q] = w[q].abs()
    return w


def _enumerate(model, w, data, loss_augmented):
    cells, types = _labelings(model.n_types)
    values = []
    for i in range(len(data)):
        s = _phi(model, data, i, cells, types) @ w
        if loss_augmented:
            s = s + _loss(data, i, cells)
        values.append(s.max())
    return torch.stack(values)


@pytest.mark.parametrize("type_features", [False, True])
def test_layout_joint_feature_and_loss_match_the_definition(type_features: bool) -> None:
    model = _mixture_model(type_features=type_features)
    assert model.n_types == K and model.n_labels == 3 + 2
    assert model.n_features == 3 * 2 + 2 * K * 5 + 2 * 2 * type_features
    data = _data(model)
    assert data.n_labels == 5 and data.offsets.tolist() == [0, 5, 10, 15, 20]
    gen = torch.Generator().manual_seed(1)
    cells = torch.randint(0, G * G, (len(data), 3), generator=gen)
    types = torch.randint(0, K, (len(data), 2), generator=gen)
    y = torch.cat((cells, types), 1).reshape(-1)
    phi = model.joint_feature(data, y)
    for i in range(len(data)):
        torch.testing.assert_close(phi[i], _phi(model, data, i, cells[i : i + 1], types[i : i + 1])[0])
        torch.testing.assert_close(model.loss(data, y)[i], _loss(data, i, cells[i : i + 1])[0])
    assert torch.equal(model.loss(data, data.y), torch.zeros(len(data), dtype=torch.float64))
    w = _random_w(model, gen)
    torch.testing.assert_close(model.score(w, data, y), phi @ w)
    w_u, w_def = model.unpack(w)
    assert w_u.shape == (3, 2) and w_def.shape == (2, K, 4) and model.type_biases(w).shape == (2, K)
    torch.testing.assert_close(model.type_biases(w).reshape(-1), w[3 * 2 + 2 * K * 4 : 3 * 2 + 2 * K * 5])
    if type_features:
        assert torch.equal(model.type_feature_weights(w).reshape(-1), w[-4:])
    # the loss ignores the types; the weight box covers the quadratic weights of every type
    other = torch.cat((cells, (types + 1) % K), 1).reshape(-1)
    torch.testing.assert_close(model.loss(data, other), model.loss(data, y))
    lower, _ = model.weight_bounds()
    assert int(torch.isfinite(lower).sum()) == 2 * 2 * K and bool((lower[model.quadratic_index()] == 0).all())


@pytest.mark.parametrize("type_features", [False, True])
@pytest.mark.parametrize("loss_augmented", [False, True])
@pytest.mark.parametrize("types", [2, 3])
def test_oracle_equals_enumeration_of_cells_and_types(loss_augmented: bool, types: int, type_features: bool) -> None:
    gen = torch.Generator().manual_seed(2)
    for seed in range(2):
        model = _mixture_model(seed, types=types, type_features=type_features)
        data = _data(model, n=3, seed=seed)
        w = _random_w(model, gen)
        y = model.oracle(w, data, loss_augmented=loss_augmented)
        assert y.shape == (len(data) * 5,) and y.dtype == torch.long
        best = _enumerate(model, w, data, loss_augmented)
        value = model.score(w, data, y) + (model.loss(data, y) if loss_augmented else 0.0)
        torch.testing.assert_close(value, best, rtol=0, atol=1e-9)
        if loss_augmented:
            _, H = model.hinge_terms(w, data)
            torch.testing.assert_close(H, best - model.score(w, data, data.y), rtol=0, atol=1e-9)


def test_one_type_per_edge_keeps_the_plain_layout() -> None:
    mu = torch.randn(2, 2, dtype=torch.float64)
    plain, squeezed = PoseTree(G, mu, n_joints=3, edges=TINY), PoseTree(G, mu[:, None], n_joints=3, edges=TINY)
    assert plain.n_types == squeezed.n_types == 1 and plain.n_features == squeezed.n_features == 3 + 2 * 4
    assert plain.n_labels == 3 and torch.equal(plain.nearest_types(torch.zeros(2, 3, 2)), torch.zeros(2, 2).long())


@pytest.mark.parametrize("type_features", [False, True])
def test_fit_keeps_every_type_in_the_box_and_certifies_the_gap(type_features: bool) -> None:
    mu = torch.tensor([[[0.0, 1.0], [1.0, -1.0]], [[-1.0, 0.0], [0.0, 1.0]]], dtype=torch.float64)
    model = PoseTree(G, mu, n_joints=3, edges=TINY, scales=torch.full((2, 2, 2), 1.5, dtype=torch.float64),
                     type_features=type_features)
    data = _data(model, n=6, seed=3)
    lam = 1.0
    res = fit(model, data, lam, preset="gap-pairwise-cache", max_passes=60, gap_check=20, gap_tol=1e-8, seed=0)
    assert bool((res.weights[model.quadratic_index()] >= 0).all())
    assert res.history[-1].gap_last < 0.5 * res.history[0].gap_last
    # primal from an independent enumeration; the gap is that primal minus the dual
    truth = torch.stack([_phi(model, data, i, data.y.view(-1, 5)[i : i + 1, :3], data.types[i : i + 1])[0]
                         for i in range(len(data))]) @ res.weights
    primal = lam / 2 * float(res.weights @ res.weights) + float((_enumerate(model, res.weights, data, True) - truth).mean())
    assert res.primal == pytest.approx(primal, abs=1e-9)
    rec = res.history[-1]
    dual = max(d for d in (rec.dual, rec.dual_avg) if d is not None)
    assert res.gap == pytest.approx(primal - dual, abs=1e-9) and 0.0 <= res.gap < 0.02


def test_type_statistics_and_data_layout() -> None:
    # two clusters of displacements per edge: k-means finds them and the per-type spread is within-cluster
    gen = torch.Generator().manual_seed(4)
    n = 40
    pos = torch.zeros(n, 3, 2, dtype=torch.float64)
    side = (torch.arange(n) % 2).double()
    pos[:, 1, 1] = 4 * side - 2 + 0.1 * torch.randn(n, generator=gen, dtype=torch.float64)
    pos[:, 2, 0] = 3 * side + 0.2 * torch.randn(n, generator=gen, dtype=torch.float64)
    vis = torch.ones(n, 3, dtype=torch.bool)
    centres, types = offset_types(pos, vis, 2, TINY)
    assert sorted(round(float(x)) for x in centres[0, :, 1]) == [-2, 2]
    s = offset_scales(pos, vis, TINY, minimum=0.01, types=types, n_types=2)
    assert s.shape == (2, 2, 2) and float(s[0, :, 1].max()) < 0.2 and float(s[1, :, 0].max()) < 0.4
    model = PoseTree(8, centres, n_joints=3, edges=TINY, scales=s)
    assert torch.equal(model.nearest_types(pos), types)
    cells = pos.round().long() + 3
    data = PoseData(torch.zeros(n, 3, 1, 8, 8), cells, vis, types=model.nearest_types(cells))
    sub = data[[5, 1]]
    assert torch.equal(sub.types, data.types[[5, 1]]) and sub.offsets.tolist() == [0, 5, 10]
    assert torch.equal(sub.positions, cells[[5, 1]])
    both = PoseData.cat([sub, data[:3]])
    assert both.n_labels == 5 and len(both) == 5 and torch.equal(both.y[:10], sub.y)
    with pytest.raises(ValueError, match="same edge types"):
        PoseData.cat([sub, PoseData(torch.zeros(1, 3, 1, 8, 8), cells[:1], vis[:1])])
    model.check_data(data)
    assert model.decode_positions(torch.zeros(model.n_features, dtype=torch.float64), data).shape == (n, 3, 2)


def test_bad_types_raise_clear_errors() -> None:
    model = _mixture_model()
    gen = torch.Generator().manual_seed(5)
    u = torch.zeros(2, 3, 2, G, G)
    pos = torch.randint(0, G, (2, 3, 2), generator=gen)
    with pytest.raises(ValueError, match="true types"):
        model.check_data(PoseData(u, pos))  # training data of a mixture model needs its types
    with pytest.raises(ValueError, match=r"values in \[0, 2\)"):
        model.check_data(PoseData(u, pos, types=torch.full((2, 2), 2)))
    with pytest.raises(ValueError, match="one type per edge"):
        PoseTree(G, n_joints=3, n_unary=2, edges=TINY).check_data(PoseData(u, pos, types=torch.zeros(2, 2).long()))
    with pytest.raises(ValueError, match="integer"):
        PoseData(u, pos, types=torch.zeros(2, 2))
    with pytest.raises(ValueError, match="shape"):
        PoseData(u, pos, types=torch.zeros(3, 2).long())
    with pytest.raises(ValueError, match="positions"):
        PoseData(u, types=torch.zeros(2, 2).long())
    with pytest.raises(ValueError, match="edge types must lie"):
        model.loss(PoseData(u, pos, types=torch.zeros(2, 2).long()), torch.full((10,), 5))


def test_type_features_data_layout_and_errors() -> None:
    model = _mixture_model(type_features=True)
    data = _data(model, n=4, seed=7)
    sub = data[[3, 0]]
    assert torch.equal(sub.type_unary, data.type_unary[[3, 0]])
    both = PoseData.cat([sub, data[:1]])
    assert torch.equal(both.type_unary, torch.cat((data.type_unary[[3, 0]], data.type_unary[:1])))
    assert both.to(torch.float32).type_unary.dtype == torch.float32
    with pytest.raises(ValueError, match="type features of the same shape"):
        PoseData.cat([sub, _data(_mixture_model(), n=1)])
    plain = _data(_mixture_model(), n=4, seed=7)
    with pytest.raises(ValueError, match="needs type_unary"):
        model.check_data(plain)
    with pytest.raises(ValueError, match="needs type_unary"):  # K = 3 type features for a K = 2 model
        model.check_data(_data(_mixture_model(types=3, type_features=True), n=2))
    with pytest.raises(ValueError, match="NaN or infinite"):
        PoseData(plain.unary, plain.positions, types=plain.types, type_unary=data.type_unary * float("nan"))
    with pytest.raises(ValueError, match="side 0"):
        PoseData(plain.unary, plain.positions, types=plain.types, type_unary=data.type_unary[:, :, :, :1])
    with pytest.raises(ValueError, match="needs mixture types"):
        PoseTree(G, torch.zeros(2, 2), n_joints=3, edges=TINY, type_features=True)
    with pytest.raises(ValueError, match="no type features"):
        _mixture_model().type_feature_weights(torch.zeros(20))
    with pytest.raises(ValueError, match="scales"):
        PoseTree(G, torch.zeros(2, 3, 2), n_joints=3, edges=TINY, scales=torch.ones(2, 2, 2))
