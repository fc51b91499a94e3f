"""pose_hinge: the pose tree's structured hinge, differentiable in its unary (and type) maps.

Checked against brute-force enumeration of every labeling on a 3-joint chain over a 3 x 3 grid, its gradient
against central finite differences (the hinge is piecewise linear in the maps: exact away from ties), and a few
gradient steps on free maps driving the hinge to zero (the margin reached)."""
from __future__ import annotations

import itertools

import pytest
import torch

from torch_bcfw.data import PoseData
from torch_bcfw.models import PoseTree
from torch_bcfw.nn import pose_hinge

EDGES = ((0, 1), (1, 2))
G, J = 3, 3


def _problem(seed: int, n: int = 2, K: int = 1):
    gen = torch.Generator().manual_seed(seed)
    unary = torch.randn(n, J, 1, G, G, generator=gen, dtype=torch.float64)
    positions = torch.randint(0, G, (n, J, 2), generator=gen)
    torso = torch.full((n,), 1.5, dtype=torch.float64)
    if K == 1:
        model = PoseTree(G, torch.randn(2, 2, generator=gen, dtype=torch.float64), n_joints=J, edges=EDGES)
        data = PoseData(unary, positions, torso=torso)
        type_unary = None
    else:
        mu = torch.randn(2, K, 2, generator=gen, dtype=torch.float64)
        model = PoseTree(G, mu, n_joints=J, edges=EDGES, type_features=True)
        type_unary = torch.randn(n, 2, K, 2, G, G, generator=gen, dtype=torch.float64)
        data = PoseData(unary, positions, torso=torso, types=model.nearest_types(positions), type_unary=type_unary)
    w = torch.randn(model.n_features, generator=gen, dtype=torch.float64)
    w[model.quadratic_index()] = w[model.quadratic_index()].abs() * 0.3
    return model, w, data, unary, type_unary


def _brute_force_hinge(model: PoseTree, w, data: PoseData) -> torch.Tensor:
    """max over every labeling (cells, and types with K > 1) of L(y) + <w, psi(y)>, minus the truth's score."""
    n, E, K = len(data), model.n_edges, model.n_types
    cells = range(G * G)
    types = list(itertools.product(range(K), repeat=E)) if K > 1 else [()]
    labelings = torch.tensor([c + t for c in itertools.product(cells, repeat=J) for t in types])
    out = []
    for i in range(n):
        d = data[torch.tensor([i])]
        ys = labelings.reshape(-1)
        many = d[torch.zeros(len(labelings), dtype=torch.long)]
        scores = model.loss(many, ys) + model.joint_feature(many, ys) @ w
        out.append(scores.max() - model.joint_feature(d, d.y)[0] @ w)
    return torch.stack(out)


@pytest.mark.parametrize("K", [1, 2])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_hinge_equals_brute_force_enumeration(seed, K):
    model, w, data, unary, type_unary = _problem(seed, K=K)
    H = pose_hinge(model, w, data, unary, type_unary, reduction="none")
    torch.testing.assert_close(H, _brute_force_hinge(model, w, data), rtol=1e-10, atol=1e-10)
    assert bool((H >= -1e-12).all())
    torch.testing.assert_close(pose_hinge(model, w, data, unary, type_unary), H.mean())
    torch.testing.assert_close(pose_hinge(model, w, data, unary, type_unary, reduction="sum"), H.sum())


@pytest.mark.parametrize("K", [1, 2])
@pytest.mark.parametrize("seed", [3, 4])
def test_the_gradient_matches_finite_differences(seed, K):
    model, w, data, unary, type_unary = _problem(seed, K=K)
    live_u = unary.clone().requires_grad_()
    live_t = None if type_unary is None else type_unary.clone().requires_grad_()
    pose_hinge(model, w, data, live_u, live_t, reduction="sum").backward()
    assert live_u.grad is not None and bool(live_u.grad.abs().sum() > 0)

    def value(u, t) -> float:
        d = PoseData(u, data.positions, data.visible, data.torso, data.types, t)
        return float(pose_hinge(model, w, d, u, t, reduction="sum"))

    eps = 1e-6
    for which, base, grad in (("unary", unary, live_u.grad), ("type_unary", type_unary,
                                                             None if live_t is None else live_t.grad)):
        if base is None:
            continue
        fd = torch.zeros_like(base)
        for idx in itertools.product(*(range(s) for s in base.shape)):
            up, down = base.clone(), base.clone()
            up[idx] += eps
            down[idx] -= eps
            args_up = (up, type_unary) if which == "unary" else (unary, up)
            args_down = (down, type_unary) if which == "unary" else (unary, down)
            fd[idx] = (value(*args_up) - value(*args_down)) / (2 * eps)
        torch.testing.assert_close(grad, fd, rtol=1e-6, atol=1e-6)


def test_gradient_steps_on_the_maps_reach_the_margin():
    """Free maps trained by the hinge alone: the tree then decodes the truth with margin (hinge 0)."""
    model, w, data, unary, _ = _problem(5, n=3)
    u = torch.zeros_like(unary).requires_grad_()
    opt = torch.optim.SGD([u], lr=0.5)
    first = None
    for _ in range(200):
        d = PoseData(u.detach(), data.positions, data.visible, data.torso)
        H = pose_hinge(model, w.abs() + 0.1, d, u)  # positive unary weights: higher maps, higher scores
        first = float(H.detach()) if first is None else first
        opt.zero_grad()
        H.backward()
        opt.step()
    assert first > 0 and float(H.detach()) < 1e-9
    d = PoseData(u.detach(), data.positions, data.visible, data.torso)
    assert torch.equal(model.decode_positions(w.abs() + 0.1, d), data.positions)


def test_bad_inputs_are_refused():
    model, w, data, unary, _ = _problem(6)
    with pytest.raises(ValueError, match="unary.detach"):
        pose_hinge(model, w, data, unary + 1.0)
    with pytest.raises(ValueError, match="shape and device"):
        pose_hinge(model, w, data, unary[:1])
    with pytest.raises(ValueError, match="type_unary exactly"):
        pose_hinge(model, w, data, unary, torch.zeros(2, 2, 1, 2, G, G, dtype=torch.float64))
    with pytest.raises(TypeError, match="PoseTree"):
        pose_hinge(object(), w, data, unary)
    with pytest.raises(ValueError, match="reduction"):
        pose_hinge(model, w, data, unary, reduction="max")
    unlabelled = PoseData(unary)
    with pytest.raises(ValueError, match="true positions"):
        pose_hinge(model, w, unlabelled, unary)
