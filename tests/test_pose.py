"""The pictorial-structures SSVM (torch_bcfw.models.pose): contract, oracle, box constraints, certified gap."""
from __future__ import annotations

import itertools
import math

import pytest
import torch

from torch_bcfw import fit
from torch_bcfw.models.pose import PoseTree, impute_positions, mean_offsets, offset_scales
from torch_bcfw.data import PoseData

TINY = ((0, 1), (0, 2))  # a 3-joint star rooted at joint 0
G = 3


def _tiny_data(n: int = 4, K: int = 2, seed: int = 0, G: int = G) -> PoseData:
    gen = torch.Generator().manual_seed(seed)
    unary = torch.randn(n, 3, K, G, G, generator=gen, dtype=torch.float64)
    positions = torch.randint(0, G, (n, 3, 2), generator=gen)
    visible = torch.rand(n, 3, generator=gen) < 0.8
    visible[:, 0] = True
    torso = torch.rand(n, generator=gen, dtype=torch.float64) * 2 + 0.5
    return PoseData(unary, positions, visible, torso)


def _configs(J: int, G: int) -> torch.Tensor:
    """Every labeling of J joints on a G x G grid as flat cells, ``LongTensor[G^(2J), J]``."""
    return torch.tensor(list(itertools.product(range(G * G), repeat=J)), dtype=torch.long)


def _phi(data: PoseData, i: int, cfg: torch.Tensor, mu: torch.Tensor, edges, scales=None) -> torch.Tensor:
    """Independent joint features of example i for labelings cfg [m, J] (flat cells): [m, d]."""
    scales = torch.ones(len(edges), 2, dtype=torch.float64) if scales is None else scales
    Gs = data.grid_size
    ys, xs = cfg // Gs, cfg % Gs
    J = cfg.shape[1]
    unary = [data.unary[i, j][:, ys[:, j], xs[:, j]].T for j in range(J)]  # [m, K] each
    pair = []
    for e, (p, c) in enumerate(edges):
        dx = ((xs[:, c] - xs[:, p]).double() - mu[e, 1]) / scales[e, 1]
        dy = ((ys[:, c] - ys[:, p]).double() - mu[e, 0]) / scales[e, 0]
        pair.append(-torch.stack((dx, dx * dx, dy, dy * dy), 1))
    return torch.cat(unary + pair, 1)


def _loss(data: PoseData, i: int, cfg: torch.Tensor, radius: float = 1.0) -> torch.Tensor:
    Gs = data.grid_size
    true = data.positions[i].double()
    pos = torch.stack((cfg // Gs, cfg % Gs), -1).double()
    d2 = ((pos - true) ** 2).sum(-1) / (radius * float(data.torso[i])) ** 2
    vis = data.visible[i]
    return (d2.clamp(max=1.0) * vis).sum(1) / max(int(vis.sum()), 1)


def _enumerate(model: PoseTree, w: torch.Tensor, data: PoseData, loss_augmented: bool):
    """Brute-force (loss-augmented) max over all labelings: (values [n], argmax cells [n, J])."""
    cfg = _configs(model.n_joints, model.grid_size)
    values, best = [], []
    for i in range(len(data)):
        s = _phi(data, i, cfg, model.mu, model.edges, model.scales) @ w
        if loss_augmented:
            s = s + _loss(data, i, cfg, model.loss_radius)
        v, k = s.max(0)
        values.append(v)
        best.append(cfg[k])
    return torch.stack(values), torch.stack(best)


def _random_w(model: PoseTree, gen: torch.Generator) -> torch.Tensor:
    w = torch.randn(model.n_features, generator=gen, dtype=torch.float64)
    q = model.quadratic_index()
    w[q] = w[q].abs()
    w[q[0]] = 0.0  # a zero quadratic weight (linear penalty) is allowed
    return w


# ----------------------------------------------------------------------------- contract and oracle
def test_joint_feature_loss_and_score_match_independent_formulas() -> None:
    data = _tiny_data()
    mu = torch.tensor([[0.5, -1.0], [1.0, 0.25]], dtype=torch.float64)
    scales = torch.tensor([[1.5, 0.5], [2.0, 1.0]], dtype=torch.float64)
    model = PoseTree(G, mu, n_joints=3, n_unary=2, edges=TINY, scales=scales)
    assert model.n_features == 3 * 2 + 2 * 4
    gen = torch.Generator().manual_seed(1)
    y = torch.randint(0, G * G, (len(data) * 3,), generator=gen)
    phi = model.joint_feature(data, y)
    cfg = y.view(-1, 3)
    for i in range(len(data)):
        torch.testing.assert_close(phi[i], _phi(data, i, cfg[i : i + 1], mu, TINY, scales)[0])
        torch.testing.assert_close(model.loss(data, y)[i], _loss(data, i, cfg[i : i + 1])[0])
    assert torch.equal(model.loss(data, data.y), torch.zeros(len(data), dtype=torch.float64))
    narrow = PoseTree(G, mu, n_joints=3, n_unary=2, edges=TINY, scales=scales, loss_radius=0.3)
    for i in range(len(data)):
        torch.testing.assert_close(narrow.loss(data, y)[i], _loss(data, i, cfg[i : i + 1], 0.3)[0])
    assert bool((narrow.loss(data, y) >= model.loss(data, y)).all())  # a smaller radius saturates sooner
    w = _random_w(model, gen)
    torch.testing.assert_close(model.score(w, data, y), phi @ w)
    torch.testing.assert_close(model.joint_feature_sum(data, y), phi.sum(0))


@pytest.mark.parametrize("loss_augmented,loss_radius", [(False, 1.0), (True, 1.0), (True, 0.4)])
def test_oracle_equals_brute_force_enumeration(loss_augmented: bool, loss_radius: float) -> None:
    gen = torch.Generator().manual_seed(2)
    for seed in range(3):
        data = _tiny_data(seed=seed)
        mu = torch.randn(2, 2, generator=gen, dtype=torch.float64)
        scales = torch.rand(2, 2, generator=gen, dtype=torch.float64) + 0.5 if seed else None
        model = PoseTree(G, mu, n_joints=3, n_unary=2, edges=TINY, scales=scales, loss_radius=loss_radius)
        w = _random_w(model, gen)
        y = model.oracle(w, data, loss_augmented=loss_augmented)
        assert y.shape == (len(data) * 3,) and y.dtype == torch.long
        best, _ = _enumerate(model, w, data, loss_augmented)
        value = model.score(w, data, y) + (model.loss(data, y) if loss_augmented else 0.0)
        torch.testing.assert_close(value, best, rtol=0, atol=1e-9)  # ties: any maximiser is fine
        if loss_augmented:
            _, H = model.hinge_terms(w, data)
            torch.testing.assert_close(H, best - model.score(w, data, data.y), rtol=0, atol=1e-9)


def test_oracle_on_the_lsp_skeleton_matches_dense_transform() -> None:
    gen = torch.Generator().manual_seed(3)
    n, Gs = 3, 6
    unary = torch.randn(n, 14, 1, Gs, Gs, generator=gen)
    positions = torch.randint(0, Gs, (n, 14, 2), generator=gen)
    data = PoseData(unary, positions, torso=torch.full((n,), 2.0))
    mu = torch.randn(13, 2, generator=gen, dtype=torch.float64)
    scales = torch.rand(13, 2, generator=gen, dtype=torch.float64) + 0.5
    model, dense = PoseTree(Gs, mu, scales=scales), PoseTree(Gs, mu, method="dense", scales=scales)
    w = _random_w(model, gen)
    a, b = model.oracle(w, data), dense.oracle(w, data)
    torch.testing.assert_close(model.score(w, data, a) + model.loss(data, a),
                               dense.score(w, data, b) + dense.loss(data, b), rtol=0, atol=1e-9)
    assert model.decode_positions(w, data).shape == (n, 14, 2)


# ----------------------------------------------------------------------------- box constraints
class _EnumeratedPose(PoseTree):
    """Same model, oracle by enumeration: valid for any sign of the weights (the unconstrained problem)."""

    def oracle(self, w, data, loss_augmented=True):
        return _enumerate(self, w.double(), data, loss_augmented)[1].reshape(-1)


class _WatchedPose(PoseTree):
    """The real oracle, recording the smallest quadratic weight it was ever called with."""

    lowest = math.inf

    def oracle(self, w, data, loss_augmented=True):
        self.lowest = min(self.lowest, float(w[self.quadratic_index()].min()))
        return super().oracle(w, data, loss_augmented)


def _spread_data(n: int = 8) -> PoseData:
    """Parent at the centre, children always one cell off diagonally, at a cell whose unary is below that of
    the centre: only a reward for displacement (negative quadratic weights) lets the truth win."""
    unary = torch.zeros(n, 3, 1, G, G, dtype=torch.float64)
    unary[:, :, 0, 1, 1] = torch.tensor([1.0, 1.5, 1.5])  # the centre looks best for every joint ...
    corners = torch.tensor([[0, 0], [2, 2], [0, 2], [2, 0]])
    positions = torch.empty(n, 3, 2, dtype=torch.long)
    positions[:, 0] = 1
    positions[:, 1] = corners[torch.arange(n) % 4]
    positions[:, 2] = corners[(torch.arange(n) + 1) % 4]
    for j in (1, 2):  # ... but the children's true corners score 1 too
        unary[torch.arange(n), j, 0, positions[:, j, 0], positions[:, j, 1]] = 1.0
    return PoseData(unary, positions, torso=torch.full((n,), 1.5, dtype=torch.float64))


def test_deformation_weights_never_leave_their_box() -> None:
    data = _spread_data()
    mu = mean_offsets(data.positions, data.visible, TINY)
    torch.testing.assert_close(mu, torch.zeros(2, 2, dtype=torch.float64))
    kw = dict(n_joints=3, n_unary=1, edges=TINY)
    q = PoseTree(G, mu, **kw).quadratic_index()
    free = fit(_EnumeratedPose(G, mu, **kw), data, 0.1, bounds=(torch.full((9,), -math.inf), None),
               max_passes=200, gap_check=20, gap_tol=1e-6, seed=0)
    assert float(free.weights[q].min()) < -0.05  # the unconstrained optimum violates the box
    for preset, passes, tol in ((None, 100, 0.05), ("gap-pairwise-cache", 200, 1e-6)):
        watched = _WatchedPose(G, mu, **kw)
        opts = {"preset": preset} if preset else {}
        boxed = fit(watched, data, 0.1, max_passes=passes, gap_check=20, gap_tol=1e-6, seed=0, **opts)
        assert watched.lowest >= 0.0  # every oracle call (every iterate) was inside the box
        for w in (boxed.w, boxed.w_avg, boxed.weights):
            assert w is None or bool((w[q] >= 0).all())
        assert 0.0 <= boxed.gap <= tol
        assert boxed.primal - boxed.gap > free.primal + 0.1  # the box is active: it costs objective


# ----------------------------------------------------------------------------- certified gap
def _primal(model, data, w, lam) -> float:
    values, _ = _enumerate(model, w, data, loss_augmented=True)
    truth = torch.stack([_phi(data, i, data.y.view(-1, 3)[i : i + 1], model.mu, model.edges, model.scales)[0] @ w
                         for i in range(len(data))])
    return 0.5 * lam * float(w @ w) + float((values - truth).mean())


def test_gap_is_primal_minus_dual_on_a_tiny_problem() -> None:
    data = _tiny_data(n=5, seed=4)
    mu = mean_offsets(data.positions, data.visible, TINY)
    model = PoseTree(G, mu, n_joints=3, n_unary=2, edges=TINY)
    lam = 0.2
    res = fit(model, data, lam, solver="bcfw", max_passes=30, gap_check=10, seed=0)
    rec = res.history[-1]
    primal = _primal(model, data, res.weights, lam)
    assert res.primal == pytest.approx(primal, abs=1e-9)
    dual = max(d for d in (rec.dual, rec.dual_avg) if d is not None)
    assert res.gap == pytest.approx(primal - dual, abs=1e-9)
    assert res.gap >= -1e-12
    # weak duality: the dual bounds the primal of every feasible w from below
    gen = torch.Generator().manual_seed(5)
    for _ in range(5):
        w = _random_w(model, gen) * 0.3
        assert _primal(model, data, w, lam) >= dual - 1e-9
    # continuing the run closes the gap further; every primal stays above every dual (weak duality)
    longer = fit(model, data, lam, solver="bcfw", init=res, max_passes=90, gap_check=30)
    assert 0.0 <= longer.gap < res.gap
    assert _primal(model, data, longer.weights, lam) == pytest.approx(longer.primal, abs=1e-9)
    assert longer.primal >= dual - 1e-9 and primal >= longer.primal - longer.gap - 1e-9


# ----------------------------------------------------------------------------- data helpers and errors
def test_mean_offsets_and_imputation_follow_the_tree() -> None:
    pos = torch.tensor([[[1.0, 1.0], [3.0, 2.0], [0.0, 4.0]],
                        [[2.0, 2.0], [float("nan"), float("nan")], [1.0, 5.0]],
                        [[float("nan")] * 2, [3.0, 1.0], [float("nan")] * 2]])
    vis = ~torch.isnan(pos[..., 0])
    mu = mean_offsets(pos, vis, TINY)
    torch.testing.assert_close(mu, torch.tensor([[2.0, 1.0], [-1.0, 3.0]], dtype=torch.float64))
    cells = impute_positions(pos, vis, 6, mu, TINY)
    assert cells.dtype == torch.long
    assert cells[0].tolist() == [[1, 1], [3, 2], [0, 4]]
    assert cells[1, 1].tolist() == [4, 3]  # parent (2, 2) + mu (2, 1)
    assert cells[2, 0].tolist() == [1, 0] and cells[2, 2].tolist() == [0, 3]  # up then down, clamped to the grid
    # edge (0, 1) seen once: minimum; edge (0, 2): displacements (-1, 3) twice: spread 0 -> minimum
    torch.testing.assert_close(offset_scales(pos, vis, TINY, minimum=0.1), torch.full((2, 2), 0.1, dtype=torch.float64))
    spread = torch.tensor([[[0.0, 0.0], [0.0, 1.0], [0.0, 0.0]], [[0.0, 0.0], [2.0, 1.0], [0.0, 0.0]],
                           [[0.0, 0.0], [4.0, 1.0], [0.0, 0.0]]])
    sd = offset_scales(spread, torch.ones(3, 3, dtype=torch.bool), TINY, minimum=0.1)
    torch.testing.assert_close(sd, torch.tensor([[2.0, 0.1], [0.1, 0.1]], dtype=torch.float64))
    none = impute_positions(torch.full((1, 3, 2), float("nan")), torch.zeros(1, 3, dtype=torch.bool), 5, mu, TINY)
    assert none[0, 0].tolist() == [2, 2]


def test_data_subsets_and_packed_labels() -> None:
    data = _tiny_data(n=4)
    assert len(data) == 4 and data.y.shape == (12,) and data.offsets.tolist() == [0, 3, 6, 9, 12]
    sub = data[[2, 0, 2]]
    assert len(sub) == 3 and torch.equal(sub.positions, data.positions[[2, 0, 2]])
    assert torch.equal(sub.unary, data.unary[[2, 0, 2]]) and sub.offsets.tolist() == [0, 3, 6, 9]
    assert torch.equal(data[1:3].torso, data.torso[1:3])
    unlabelled = PoseData(data.unary)
    model = PoseTree(G, n_joints=3, n_unary=2, edges=TINY)
    model.check_data(unlabelled, require_labels=False)
    assert model.decode(torch.zeros(model.n_features, dtype=torch.float64), unlabelled).shape == (12,)


def test_bad_input_raises_clear_errors() -> None:
    u = torch.zeros(2, 3, 1, G, G)
    pos = torch.zeros(2, 3, 2, dtype=torch.long)
    with pytest.raises(ValueError, match=r"\[n, J, K, G, G\]"):
        PoseData(torch.zeros(2, 3, G, G, 1, 1))
    with pytest.raises(ValueError, match="square"):
        PoseData(torch.zeros(2, 3, 1, G, G + 1))
    bad = u.clone()
    bad[0, 1, 0, 0, 0] = float("nan")
    with pytest.raises(ValueError, match="NaN"):
        PoseData(bad, pos)
    with pytest.raises(ValueError, match="grid"):
        PoseData(u, pos + G)
    with pytest.raises(ValueError, match="integer"):
        PoseData(u, pos.double())
    with pytest.raises(ValueError, match="shape"):
        PoseData(u, pos[:, :2])
    with pytest.raises(ValueError, match="visible"):
        PoseData(u, pos, visible=torch.ones(2, 3))
    with pytest.raises(ValueError, match="torso"):
        PoseData(u, pos, torso=torch.tensor([1.0, float("nan")]))
    with pytest.raises(ValueError, match="torso"):
        PoseData(u, pos, torso=torch.tensor([1.0, 0.0]))
    data = PoseData(u, pos)
    with pytest.raises(ValueError, match="expects"):
        PoseTree(G + 1, n_joints=3, edges=TINY).check_data(data)
    with pytest.raises(TypeError, match="PoseData"):
        PoseTree(G, n_joints=3, edges=TINY).check_data(u)
    model = PoseTree(G, n_joints=3, edges=TINY)
    w = torch.zeros(model.n_features, dtype=torch.float64)
    w[model.quadratic_index()[1]] = -0.1
    with pytest.raises(ValueError, match="quadratic"):
        model.oracle(w, data)
    with pytest.raises(ValueError, match="weights"):
        model.oracle(torch.zeros(3), data)
    with pytest.raises(ValueError, match="labelings"):
        model.loss(data, torch.zeros(5, dtype=torch.long))
    with pytest.raises(ValueError, match="cells"):
        model.loss(data, torch.full((6,), G * G))
    with pytest.raises(ValueError, match="positions"):
        model.check_data(PoseData(u))
    with pytest.raises(ValueError, match="mu"):
        PoseTree(G, torch.zeros(3, 2), n_joints=3, edges=TINY)
    with pytest.raises(ValueError, match="scales"):
        PoseTree(G, n_joints=3, edges=TINY, scales=torch.zeros(2, 2))
    with pytest.raises(ValueError, match="min_quadratic"):
        PoseTree(G, n_joints=3, edges=TINY, min_quadratic=-1.0)
    for radius in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="loss_radius"):
            PoseTree(G, n_joints=3, edges=TINY, loss_radius=radius)
    with pytest.raises(ValueError, match="tree"):
        PoseTree(G, n_joints=3, edges=((0, 1), (1, 0)))


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_oracle_and_fit_on_cuda_match_cpu() -> None:
    gen = torch.Generator().manual_seed(6)
    n, Gs = 4, 8
    data = PoseData(torch.randn(n, 14, 1, Gs, Gs, generator=gen), torch.randint(0, Gs, (n, 14, 2), generator=gen),
                    torso=torch.full((n,), 2.0, dtype=torch.float64))
    model = PoseTree(Gs, torch.randn(13, 2, generator=gen, dtype=torch.float64))
    w = _random_w(model, gen)
    cpu = model.oracle(w, data)
    cuda = model.oracle(w.cuda(), data.to("cuda"))
    assert cuda.is_cuda
    torch.testing.assert_close(model.score(w, data, cuda.cpu()) + model.loss(data, cuda.cpu()),
                               model.score(w, data, cpu) + model.loss(data, cpu), rtol=0, atol=1e-9)
    res = fit(model, data.to("cuda"), 0.1, max_passes=5, gap_check=5, seed=0)
    # (fit solves where its block steps are measured cheaper: the weights are on that device)
    assert res.gap >= 0 and bool((res.weights.cpu()[model.quadratic_index()] >= 0).all())
