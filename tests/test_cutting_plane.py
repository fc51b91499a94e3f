"""The 1-slack cutting-plane baseline: reaches the optimum, certifies exactly, resumes exactly, refuses what it
cannot do."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from conftest import brute_force_primal, random_chain_problem, random_multiclass_problem
from torch_bcfw import FitResult, fit
from torch_bcfw.solvers.cutting_plane import solve_simplex_qp

LAM = 0.05


@pytest.mark.parametrize("problem", ["chain", "multiclass"])
def test_reaches_the_enumerated_optimum_with_an_exact_certificate(problem):
    model, data = random_chain_problem(n=5, F=3, K=2, max_len=3, seed=2) if problem == "chain" else \
        random_multiclass_problem(n=8, F=3, K=4, seed=2)
    r = fit(model, data, LAM, "cutting-plane", max_passes=200, gap_check=1, gap_tol=1e-8)
    assert r.stopped_by == "gap_tol"
    ref = fit(model, data, LAM, "bcfw", preset="pairwise", max_passes=3000, gap_check=50, gap_tol=1e-10)
    # P* lies below the brute-force primal of any weights and above any dual value of BCFW (an independent method)
    p_star_upper = min(brute_force_primal(model, data, w, LAM) for w in (ref.weights, r.weights))
    p_star_lower = max(d for d in (ref.history[-1].dual, ref.history[-1].dual_avg) if d is not None)
    for rec in r.history:
        assert rec.dual <= p_star_upper + 1e-10
        assert rec.gap_last == pytest.approx(rec.primal - rec.dual, abs=1e-14)
        assert rec.gap_last >= -1e-12
    assert r.gap <= 1e-8 and r.primal - p_star_lower <= 1e-8 + ref.gap
    assert r.primal == pytest.approx(brute_force_primal(model, data, r.weights, LAM), abs=1e-12)


def test_one_plane_per_pass_and_monotone_dual():
    model, data = random_chain_problem(n=6, seed=5)
    r = fit(model, data, LAM, "cutting-plane", max_passes=15, gap_check=1)
    duals = [rec.dual for rec in r.history]
    assert all(b >= a - 1e-12 for a, b in zip(duals, duals[1:]))  # fully corrective: the dual never drops
    assert r.solver_state["a"].shape[0] == 16 and r.history[-1].oracle_calls == 15 * len(data)


def test_resume_through_save_and_load_is_exact(tmp_path):
    model, data = random_chain_problem(n=6, seed=6)
    whole = fit(model, data, LAM, "cutting-plane", max_passes=12, gap_check=3)
    part = fit(model, data, LAM, "cutting-plane", max_passes=5, gap_check=3)
    part.save(tmp_path / "cp.pt")
    rest = fit(model, data, LAM, "cutting-plane", max_passes=7, gap_check=3, init=FitResult.load(tmp_path / "cp.pt"))
    assert torch.equal(whole.w, rest.w)
    assert [r.gap_last for r in whole.history if r.passes % 3 == 0] == \
        [r.gap_last for r in rest.history if r.passes % 3 == 0]


def test_refuses_bounds_refinements_and_other_features():
    model, data = random_multiclass_problem()
    with pytest.raises(ValueError, match="box constraints"):
        fit(model, data, LAM, "cutting-plane", bounds=(torch.zeros(model.n_features), None))
    with pytest.raises(ValueError, match="gap sampling is a BCFW refinement"):
        fit(model, data, LAM, "cutting-plane", sampling="gap")
    r = fit(model, data, LAM, "cutting-plane", max_passes=3)
    other = type(data)(data.x + 1.0, data.y)
    with pytest.raises(ValueError, match="features differ"):
        fit(model, other, LAM, "cutting-plane", max_passes=3, init=r)
    for bad in ({"cp_inner_tol": 0.0}, {"cp_inner_iters": 0}, {"cp_inner_iters": 2.5}):
        with pytest.raises(ValueError, match="cp_inner"):
            fit(model, data, LAM, "cutting-plane", **bad)


def test_inner_qp_matches_a_brute_force_grid():
    rng = np.random.default_rng(0)
    A = rng.normal(size=(3, 4))
    K, b = A @ A.T, rng.uniform(0, 1, 3)
    beta, _, gap = solve_simplex_qp(K, b, 0.7, np.array([1.0, 0.0, 0.0]), 1e-13, 100000)
    assert abs(beta.sum() - 1) < 1e-12 and (beta >= 0).all() and gap <= 1e-13
    f = lambda x: x @ b - 0.35 * x @ K @ x  # noqa: E731
    grid = np.linspace(0, 1, 401)
    best = max(f(np.array([p, q, 1 - p - q])) for p in grid for q in grid if p + q <= 1 + 1e-12)
    assert f(beta) >= best - 1e-12


def test_planes_of_a_sparse_chain_never_build_the_n_by_d_table():
    """The plane ``sum_i psi_i(y*) / (lam n)`` comes from ``joint_feature_sum``: on a sparse chain whose ``[n, d]``
    table ``joint_feature`` refuses (CoNLL: 8936 x 1.6M), the cutting plane still runs and certifies, and its planes
    equal the summed per-example joint features of a small slice."""
    from torch_bcfw.data import SequenceData
    from torch_bcfw.models import Chain

    g = torch.Generator().manual_seed(0)
    n, F, K = 240, 45_000, 25  # n * d = 270M > 2**28
    lengths = torch.randint(1, 4, (n,), generator=g).tolist()
    ids = [torch.stack([torch.randperm(F, generator=g)[:3].sort().values for _ in range(L)]) for L in lengths]
    data = SequenceData.from_attribute_ids(ids, F, [torch.randint(0, K, (a.shape[0],), generator=g) for a in ids])
    model = Chain(F, K)
    with pytest.raises(ValueError, match="dense"):
        model.joint_feature(data, data.y)
    r = fit(model, data, 0.1, "cutting-plane", max_passes=3, gap_check=1, track_train_loss=False)
    assert r.passes == 3 and r.gap is not None and r.gap >= -1e-12
    part = data[list(range(20))]
    y = model.oracle(torch.zeros(model.n_features, dtype=torch.float64), part)
    assert torch.allclose(model.joint_feature_sum(part, y), model.joint_feature(part, y).sum(0))
