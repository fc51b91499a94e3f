"""Online exponentiated gradient (the BCFW paper's online-EG baseline): feasible iterates, an exact
certificate against enumeration, progress to the optimum, exact resume, clear errors."""
from __future__ import annotations

import pytest
import torch

from conftest import brute_force_primal, random_chain_problem, random_multiclass_problem
from torch_bcfw import FitResult, fit

LAM = 0.05


def _optimum_bounds(model, data):
    ref = fit(model, data, LAM, "cutting-plane", max_passes=300, gap_check=5, gap_tol=1e-10)
    return ref.history[-1].dual, brute_force_primal(model, data, ref.weights, LAM)


@pytest.mark.parametrize("seed", [2, 3])
def test_certificates_are_exact_and_the_dual_climbs_to_the_optimum(seed):
    model, data = random_chain_problem(n=5, F=3, K=2, max_len=3, seed=seed)
    lo, hi = _optimum_bounds(model, data)
    r = fit(model, data, LAM, "online-eg", max_passes=400, gap_check=20)
    duals = [rec.dual for rec in r.history]
    assert all(b >= a - 1e-13 for a, b in zip(duals, duals[1:]))  # every accepted step increases the dual
    for rec in r.history:
        assert rec.dual <= hi + 1e-10 and rec.gap_last >= 0
        assert rec.gap_last == pytest.approx(rec.primal - rec.dual, abs=1e-14)
    assert r.primal == pytest.approx(brute_force_primal(model, data, r.weights, LAM), abs=1e-12)
    assert hi - duals[-1] < 0.25 * (hi - duals[0])  # progress (EG is slow: the paper's "substantially worse")
    assert r.history[-1].oracle_calls >= 400 * len(data)  # line-search calls are counted


def test_iterates_are_interior_points_of_the_marginal_polytope():
    model, data = random_chain_problem(n=6, F=3, K=3, max_len=4, seed=1)
    r = fit(model, data, LAM, "online-eg", max_passes=20, gap_check=10)
    st = model.dual_state(data, LAM)
    st.load_state_dict(r.solver_state["state"])
    assert (st.mu > 0).all() and torch.allclose(st.mu.sum(1), torch.ones(data.n_tokens, dtype=torch.float64))
    assert torch.allclose(st.T.sum((1, 2)), (data.lengths - 1).double())
    assert torch.allclose(st.w, st._w_from_blocks(), atol=1e-12)  # w = A alpha
    assert torch.allclose(st.block_ell, model.expected_loss(data, st.mu) / len(data), atol=1e-15)


def test_resume_through_save_and_load_is_exact(tmp_path):
    model, data = random_chain_problem(n=6, seed=8)
    whole = fit(model, data, LAM, "online-eg", max_passes=12, gap_check=4)
    part = fit(model, data, LAM, "online-eg", max_passes=4, gap_check=4)
    part.save(tmp_path / "eg.pt")
    rest = fit(model, data, LAM, "online-eg", max_passes=8, gap_check=4, init=FitResult.load(tmp_path / "eg.pt"))
    assert torch.equal(whole.w, rest.w)
    assert [r.dual for r in whole.history] == [r.dual for r in rest.history]


def test_errors():
    model, data = random_multiclass_problem()
    with pytest.raises(ValueError, match="expectation"):
        fit(model, data, LAM, "online-eg")
    model, data = random_chain_problem()
    with pytest.raises(TypeError, match="belong to solver 'bcfw'"):
        fit(model, data, LAM, "online-eg", cache=True)
    with pytest.raises(ValueError, match="gap sampling is a BCFW refinement"):
        fit(model, data, LAM, "online-eg", sampling="gap")
    for bad in ({"eg_step0": 0}, {"eg_max_halvings": -1}, {"eg_step_growth": float("nan")}):
        with pytest.raises(ValueError, match="eg_"):
            fit(model, data, LAM, "online-eg", **bad)
