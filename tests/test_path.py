"""Regularization path (Osokin et al. 2016, Algs. 6-7) and grid searches: certified eps-approximation checked
independently (brute-force primal), the rescaling step (Prop. 1), the closed-form first piece, model selection."""
import math

import numpy as np
import pytest
import torch

from conftest import brute_force_max, brute_force_primal, random_chain_problem, random_multiclass_problem
from torch_bcfw import fit
from torch_bcfw.duals.active_set import ActiveSetDualState
from torch_bcfw.duals.stepsize import LINE_SEARCH
from torch_bcfw.models import Multiclass
from torch_bcfw.certificate import certify, task_loss
from torch_bcfw.solvers.path import RegularizationPath, grid_search, regularization_path


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _lams_to_check(path: RegularizationPath, pieces: int = 25, seed: int = 0):
    """lam values above lam_inf, and in ``pieces`` random pieces of the path (always the first and the last):
    the upper breakpoint, a random interior point and a point just above the lower breakpoint."""
    rng = np.random.default_rng(seed)
    lams = [path.lam_inf * f for f in (1.0, 3.0, 1e3)]
    pts = path.lams + [path.lower_limit if path.lower_limit > 0 else path.lams[-1] / 100]
    pairs = list(zip(pts[:-1], pts[1:]))
    pick = sorted(set([0, len(pairs) - 1]) | set(rng.choice(len(pairs), size=min(pieces, len(pairs)), replace=False).tolist()))
    for j in pick:
        hi, lo = pairs[j]
        lams += [hi, float(np.exp(rng.uniform(math.log(lo), math.log(hi)))), lo * (1 + 1e-9)]
    return lams


def _independent_gap(model, data, path, lam):
    """Primal by enumerating every labeling; dual from the path's dual value at lam (no oracle of the package)."""
    w = path.weights_at(lam)
    primal = brute_force_primal(model, data, w, lam)
    dual = path.dual_ell_at(lam) - 0.5 * lam * float(w @ w)
    return primal - dual, primal


# ------------------------------------------------------------------ the rescaling step (Prop. 1)
@pytest.mark.parametrize("kind", ["chain", "multiclass-dense", "multiclass-active", "chain-working-set"])
def test_rescaling_keeps_w_and_the_dual_feasible_and_moves_the_gap_linearly(kind):
    if kind.startswith("chain"):
        model, data = random_chain_problem(n=6, F=3, K=3, max_len=4, seed=4)
    else:
        model, data = random_multiclass_problem(n=8, F=3, K=3, seed=4)
    lam = 0.2
    if kind == "chain-working-set":
        res = fit(model, data, lam, preset="uniform-pairwise", max_passes=8, averaging=False)
        state = model.dual_state(data, lam)
        from torch_bcfw.solvers.bcfw import BCFW
        from torch_bcfw.solvers.run import options_for

        BCFW(model, data, lam, options_for("bcfw", preset="uniform-pairwise", batch_size=1), state=state).load_state_dict(res.solver_state)
    else:
        state = ActiveSetDualState(model, data, lam) if kind == "multiclass-active" else model.dual_state(data, lam)
        state.run_steps(np.random.default_rng(1).integers(0, len(data), 40), LINE_SEARCH)
    before = certify(model, data, state.w, state.dual_ell(), lam)
    delta = state.path_delta()
    g_before, deltas = state.block_gaps()[0], state.block_deltas()
    assert float(deltas.sum()) == pytest.approx(delta, abs=1e-12)
    w_old, ell_old = state.w.clone(), state.ell
    rho = state.rescale_lam(0.07)
    # per block (Prop. 1): g_i(rho lam) = g_i(lam) + (1 - rho) delta_i
    assert torch.allclose(state.block_gaps()[0], g_before + (1 - rho) * deltas, atol=1e-12)
    assert rho == pytest.approx(0.35)
    assert torch.equal(state.w, w_old)  # w unchanged, bit for bit
    assert state.ell == pytest.approx(rho * ell_old, rel=1e-13)
    # w = A alpha still holds at the new lam: recomputing w from the stored blocks gives the same vector
    assert torch.allclose(state._w_from_blocks(), w_old, atol=1e-12)
    after = certify(model, data, state.w, state.dual_ell(), 0.07)
    assert after.gap == pytest.approx(before.gap + (1 - rho) * delta, abs=1e-12)
    assert after.gap >= -1e-12
    # the dual variables stay on the simplex
    if kind == "chain":
        assert bool((state.mu >= -1e-15).all()) and torch.allclose(state.mu.sum(1), torch.ones(len(state.mu), dtype=torch.float64))
    if kind == "multiclass-active":
        for i in range(len(data)):
            a = state.active_set.alphas(i)
            assert (a >= 0).all() and a.sum() == pytest.approx(1.0)
    if kind == "chain-working-set":
        ws = state.working_set
        for i in range(len(data)):
            a = ws.alphas(i)
            assert (a >= 0).all() and a.sum() == pytest.approx(1.0)
        # w rebuilt from the listed labelings and their weights at the new lam
        v = torch.zeros_like(w_old)
        for i in range(len(data)):
            blk = data[[i]]
            for y, a in zip(ws.labelings(i), ws.alphas(i)):
                y = torch.as_tensor(y, dtype=torch.long)
                v += a * (model.joint_feature(blk, blk.y)[0] - model.joint_feature(blk, y)[0]) / (0.07 * len(data))
        assert torch.allclose(v, w_old, atol=1e-12)


def test_rescaling_to_a_larger_lam_is_refused():
    model, data = random_multiclass_problem(n=4, seed=0)
    state = model.dual_state(data, 0.1)
    with pytest.raises(ValueError, match="smaller lam"):
        state.rescale_lam(0.2)


# ------------------------------------------------------------------ the path
@pytest.fixture(scope="module")
def chain_path():
    model, data = random_chain_problem(n=6, F=3, K=2, max_len=4, seed=7)
    path = regularization_path(model, data, eps=0.1, kappa=0.9, lam_min=2e-3)
    return model, data, path


def test_path_is_eps_approximate_between_breakpoints_by_independent_checks(chain_path):
    model, data, path = chain_path
    assert path.stopped_by in ("lam_min", "complete")
    assert len(path.points) > 5
    assert all(b < a for a, b in zip(path.lams, path.lams[1:]))
    assert path.lower_limit is not None and path.lower_limit <= 2e-3
    for p in path.points:
        assert p.gap <= 0.9 * 0.1 + 1e-12  # every breakpoint optimised to kappa eps (exact gap)
    assert max(path.predicted_gaps) <= 0.1 + 1e-9
    for lam in _lams_to_check(path):
        gap, primal = _independent_gap(model, data, path, lam)
        assert -1e-10 <= gap <= 0.1 + 1e-9, (lam, gap)
        # the package's own certificate agrees with the brute-force one
        c = path.certificate(model, data, lam)
        assert c.gap == pytest.approx(gap, abs=1e-10) and c.primal == pytest.approx(primal, abs=1e-10)


def test_path_suboptimality_against_an_accurate_solve(chain_path):
    model, data, path = chain_path
    for lam in (path.lam_inf * 0.5, 1.0, 0.1):  # small enough lam for BCFW to reach a tiny gap quickly
        ref = fit(model, data, lam, "bcfw", max_passes=1000, gap_tol=1e-5, track_train_loss=False)
        assert ref.gap <= 1e-2  # the check below uses the lower bound P_ref - gap_ref: conservative
        p_star_upper = brute_force_primal(model, data, ref.w, lam)
        p_star_lower = p_star_upper - ref.gap
        subopt = brute_force_primal(model, data, path.weights_at(lam), lam) - p_star_lower
        assert subopt <= 0.1 + 1e-9, (lam, subopt)


def test_first_piece_is_the_closed_form(chain_path):
    model, data, path = chain_path
    n = len(data)
    # Alg. 6 by enumeration: y~_i = argmax_y L_i(y) (unique for a binary chain: flip every label)
    psi = torch.zeros(model.n_features, dtype=torch.float64)
    for i in range(n):
        blk = data[[i]]
        _, y_t = brute_force_max(model, data, torch.zeros(model.n_features, dtype=torch.float64), i)
        assert bool((y_t != blk.y).all())
        psi += model.joint_feature(blk, blk.y)[0] - model.joint_feature(blk, y_t)[0]
    psi /= n
    theta = []
    for i in range(n):
        blk = data[[i]]
        best, _ = brute_force_max(model, data, psi, i, loss_augmented=False)
        theta.append(best - float(model.joint_feature(blk, blk.y)[0] @ psi))
    lam_inf = (float(psi @ psi) + float(np.mean(theta))) / (0.9 * 0.1)
    assert path.lam_inf == pytest.approx(lam_inf, rel=1e-12)
    for f in (1.0, 2.0, 10.0, 1e4):
        lam = lam_inf * f
        assert torch.allclose(path.weights_at(lam), psi / lam, atol=1e-14)
        gap, _ = _independent_gap(model, data, path, lam)
        assert gap <= 0.9 * 0.1 / f + 1e-12  # eq. (11): g(lam) <= (||psi~||^2 + mean theta) / lam
    # far above lam_inf the closed form is the optimum itself (the max-loss labelings stay the oracle answers)
    lam = lam_inf * 1e4
    ref = fit(model, data, lam, "fw", max_passes=200, gap_tol=1e-12, averaging=False, track_train_loss=False)
    assert torch.allclose(ref.w, psi / lam, atol=1e-9 * float(psi.norm() / lam) + 1e-15)


def test_path_with_pairwise_cache_and_box_constraints():
    model, data = random_chain_problem(n=6, F=3, K=3, max_len=3, seed=11)
    d = model.n_features
    lower = torch.full((d,), -math.inf, dtype=torch.float64)
    lower[: d // 2] = 0.0
    bounds = (lower, torch.full((d,), math.inf, dtype=torch.float64))
    path = regularization_path(model, data, eps=0.2, lam_min=5e-3, preset="gap-pairwise-cache", bounds=bounds)
    assert len(path.points) > 3
    for lam in _lams_to_check(path, pieces=10, seed=3):
        w = path.weights_at(lam)
        assert bool((w[: d // 2] >= 0).all())
        c = path.certificate(model, data, lam)
        assert c.gap <= 0.2 + 1e-9
        assert c.primal == pytest.approx(brute_force_primal(model, data, w, lam), abs=1e-10)


def test_path_below_its_lower_limit_raises(chain_path):
    _, _, path = chain_path
    with pytest.raises(ValueError, match="below the part of the path"):
        path.weights_at(path.lower_limit / 10)
    with pytest.raises(ValueError, match="positive"):
        path.weights_at(-1.0)


def test_model_selection_on_validation_data():
    model, train = random_multiclass_problem(n=30, F=4, K=3, seed=5)
    _, val = random_multiclass_problem(n=40, F=4, K=3, seed=6)
    path = regularization_path(model, train, eps=0.1, lam_min=1e-2, val_data=val)
    losses = [p.val_loss for p in path.points]
    assert all(v is not None for v in losses)
    best = path.best()
    assert best.val_loss == min(losses)
    # predictions are scale-free, so the validation loss is constant on a piece: check inside the pieces
    for j, (hi, lo) in enumerate(zip(path.lams[:-1], path.lams[1:])):
        mid = math.sqrt(hi * lo)
        assert task_loss(model, val, path.weights_at(mid)) == path.points[j].val_loss
    d = path.to_dict()
    assert d["lam_inf"] == path.lam_inf and len(d["points"]) == len(path.points)


# ------------------------------------------------------------------ grid searches
def test_grid_search_warm_and_cold_reach_eps_and_warm_is_cheaper():
    model, data = random_chain_problem(n=8, F=3, K=3, max_len=4, seed=9)
    grid = [2.0 ** k for k in range(4, -7, -1)]
    warm = grid_search(model, data, grid, eps=0.1, warm_start=True)
    cold = grid_search(model, data, list(reversed(grid)), eps=0.1, warm_start=False)
    for sw in (warm, cold):
        assert sw.stopped_by == "grid_done"
        assert sw.lams == sorted(grid, reverse=True)
        for p in sw.points:
            assert p.gap <= 0.1 + 1e-12
            w = p.w
            assert p.primal == pytest.approx(brute_force_primal(model, data, w, p.lam), abs=1e-10)
    assert warm.points[-1].passes < cold.points[-1].passes


def test_bad_inputs():
    model, data = random_multiclass_problem(n=5, seed=1)
    with pytest.raises(ValueError, match="eps"):
        regularization_path(model, data, eps=0.0)
    with pytest.raises(ValueError, match="kappa"):
        regularization_path(model, data, kappa=1.0)
    with pytest.raises(ValueError, match="lam_min"):
        regularization_path(model, data, lam_min=0.0)
    with pytest.raises(ValueError, match="gap_tol"):
        regularization_path(model, data, gap_tol=0.1)
    with pytest.raises(ValueError, match="lams"):
        grid_search(model, data, [1.0, -2.0])

    class OwnLoss(Multiclass):
        def loss(self, data, y):
            return super().loss(data, y) + 0.5

    with pytest.raises(ValueError, match="L_i"):
        regularization_path(OwnLoss(3, 4), data)


def test_a_state_that_stores_alpha_must_rescale_it_for_the_path():
    """``_rescale_storage`` is required: a state missing it cannot be built, and a state storing the dual variables
    (rebindable) cannot inherit the dense table's ``w_i``-only rescale (it would keep stale ``alpha`` on the path)."""
    from torch_bcfw.duals.base import DualState
    from torch_bcfw.duals.dense import DenseTable

    with pytest.raises(TypeError, match="inherits _rescale_storage from DenseTable"):
        type("AlphaBesideTable", (DenseTable,), {"rebindable": True})
    hooks = {name: (lambda self, *a: None) for name in ("block_direction", "_move_block", "block_w",
                                                       "_avg_accumulate", "_avg_w", "_avg_reset_storage",
                                                       "_storage_dict", "_load_storage")}
    no_rescale = type("NoRescale", (DualState,), hooks)
    model, data = random_multiclass_problem(seed=0)
    with pytest.raises(TypeError, match="_rescale_storage"):
        no_rescale(model, data, 0.1)
