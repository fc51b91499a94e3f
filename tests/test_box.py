"""Box constraints on the weights (Osokin et al. 2016, App. H): untruncated v, truncated w, exact gap."""
import math

import numpy as np
import pytest
import torch

from conftest import brute_force_primal, random_chain_problem, random_multiclass_problem
from torch_bcfw import fit
from torch_bcfw.duals.plan import StepPlan, WorkingSetUse, generic_plan_steps
from torch_bcfw.duals.stepsize import LINE_SEARCH, PAIRWISE_RULE
from torch_bcfw.certificate import certify


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _box(d, seed=0):
    """Positivity on a third of the weights, an upper bound 0.05 on another third, the rest free."""
    g = torch.Generator().manual_seed(seed)
    kind = torch.randint(0, 3, (d,), generator=g)
    lower = torch.where(kind == 0, 0.0, -math.inf).double()
    upper = torch.where(kind == 1, 0.05, math.inf).double()
    return lower, upper


def _dual_with_beta(state):
    """``l - lam/2 ||w||^2 - lam (beta_u^T u - beta_l^T l)`` from ``v`` (the closed form of App. H)."""
    v, lam = state.v, state.lam
    w = torch.clamp(v, state.lower, state.upper)
    bu = (v - state.upper).clamp_min(0.0)
    bl = (state.lower - v).clamp_min(0.0)
    term = float((bu[torch.isfinite(state.upper)] * state.upper[torch.isfinite(state.upper)]).sum())
    term -= float((bl[torch.isfinite(state.lower)] * state.lower[torch.isfinite(state.lower)]).sum())
    return state.ell - 0.5 * lam * float(w @ w) - lam * term


@pytest.mark.parametrize("kind", ["chain", "multiclass"])
def test_infinite_bounds_reproduce_plain_bcfw_exactly(kind):
    if kind == "chain":
        model, data = random_chain_problem(n=6, F=3, K=3, max_len=4, seed=2)
    else:
        model, data = random_multiclass_problem(n=8, F=3, K=3, seed=2)
    d = model.n_features
    order = np.random.default_rng(0).integers(0, len(data), 60)
    plain = model.dual_state(data, 0.05)
    boxed = model.dual_state(data, 0.05)
    boxed.set_bounds(torch.full((d,), -math.inf), torch.full((d,), math.inf))
    assert boxed.has_bounds and boxed.w is not boxed.v
    g1 = generic_plan_steps(plain, StepPlan.plain(order, LINE_SEARCH, True)).gaps  # the generic torch steps (the box path's)
    g2 = boxed.run_steps(order, LINE_SEARCH)
    assert np.array_equal(g1, g2)
    assert torch.equal(plain.w, boxed.w) and torch.equal(plain.v, boxed.v) and plain.ell == boxed.ell
    assert boxed.dual_ell() == boxed.ell
    wa, la = plain.averaged()
    wb, lb = boxed.averaged()
    assert torch.equal(wa, wb) and la == lb
    # pairwise steps through the generic composed loop, bounded and not
    for st in (plain, boxed):
        st.working_set = None
    p2, b2 = model.dual_state(data, 0.05), model.dual_state(data, 0.05)
    b2.set_bounds(None, None)
    for st in (p2, b2):
        st.ensure_working_set()
        generic_plan_steps(st, StepPlan(m=40, rule=PAIRWISE_RULE, order=order[:40], working_set=WorkingSetUse()))
    assert torch.equal(p2.w, b2.w) and p2.ell == b2.ell
    # through fit: bounds that are infinite everywhere are the unconstrained problem (the plain fast path)
    kw = dict(max_passes=6, gap_check=3, seed=3)
    r1 = fit(model, data, 0.05, **kw)
    r2 = fit(model, data, 0.05, bounds=(torch.full((d,), -math.inf), None), **kw)
    assert torch.equal(r1.w, r2.w) and torch.equal(r1.w_avg, r2.w_avg)
    assert [h.gap_last for h in r1.history] == [h.gap_last for h in r2.history]


def test_box_gap_is_the_exact_constrained_gap_and_the_dual_never_decreases():
    model, data = random_multiclass_problem(n=10, F=3, K=3, seed=5)
    lam, d = 0.05, model.n_features
    lower, upper = _box(d, seed=1)
    st = model.dual_state(data, lam)
    st.set_bounds(lower, upper)
    rng = np.random.default_rng(1)
    prev = -math.inf
    for _ in range(80):
        i = int(rng.integers(len(data)))
        st.block_step(i, st.block_oracle(i), LINE_SEARCH)
        assert bool((st.w >= lower).all()) and bool((st.w <= upper).all())
        dual = st.dual_ell() - 0.5 * lam * float(st.w @ st.w)
        assert dual == pytest.approx(_dual_with_beta(st), abs=1e-13)
        assert dual >= prev - 1e-14  # exact line search with beta frozen, then re-optimised beta
        prev = dual
    assert not torch.equal(st.w, st.v)  # the bounds are active
    cert = certify(model, data, st.w, st.dual_ell(), lam)
    assert cert.primal == pytest.approx(brute_force_primal(model, data, st.w, lam), abs=1e-12)
    g, _, _ = st.block_gaps()
    assert float(g.sum()) == pytest.approx(cert.gap, abs=1e-12) and float(g.min()) >= -1e-13
    # weak duality: the constrained dual bounds the primal of any feasible weights from below
    for _ in range(5):
        w = torch.clamp(torch.randn(d, dtype=torch.float64) * 0.3, lower, upper)
        assert brute_force_primal(model, data, w, lam) >= cert.dual - 1e-12


@pytest.mark.parametrize("kind", ["multiclass", "chain"])
def test_all_solvers_reach_the_same_box_constrained_optimum(kind):
    lam = 0.1
    if kind == "chain":  # the chain's compiled loops do not take bounds: the generic torch steps run (slow)
        model, data = random_chain_problem(n=5, F=2, K=2, max_len=3, seed=3)
        presets = ["gap-pairwise-cache"]
    else:
        model, data = random_multiclass_problem(n=10, F=3, K=3, seed=3)
        presets = ["uniform-fw", "gap-fw", "uniform-pairwise", "gap-away", "gap-pairwise-cache"]
    d = model.n_features
    bounds = _box(d, seed=2)
    free = fit(model, data, lam, preset="uniform-pairwise", max_passes=300, gap_check=25, gap_tol=1e-6,
               averaging=False, track_train_loss=False)
    runs = []
    if kind == "multiclass":
        runs.append(fit(model, data, lam, "fw", bounds=bounds, max_passes=1500, gap_check=50, gap_tol=1e-4,
                        averaging=False, track_train_loss=False))
    for preset in presets:
        # FW steps converge sublinearly, pairwise linearly (the chain's generic torch steps are slow: looser)
        tol = 1e-3 if preset.endswith("fw") else (1e-5 if kind == "chain" else 1e-6)
        r = fit(model, data, lam, preset=preset, bounds=bounds, max_passes=600, gap_check=25, gap_tol=tol,
                averaging=False, track_train_loss=False)
        assert r.gap <= tol, preset
        runs.append(r)
    for r in runs:
        assert bool((r.w >= bounds[0]).all()) and bool((r.w <= bounds[1]).all())
        assert brute_force_primal(model, data, r.w, lam) == pytest.approx(r.primal, abs=1e-10)
        for other in runs:
            assert abs(r.primal - other.primal) <= r.gap + other.gap + 1e-12
    # the constraints bind: the constrained optimum is worse than the free one
    assert min(r.primal for r in runs) - max(r.gap for r in runs) > free.primal


def test_model_bounds_and_errors():
    model, data = random_multiclass_problem(n=6, F=2, K=3, seed=0)
    d = model.n_features

    class Positive(type(model)):
        def weight_bounds(self):
            return torch.zeros(d), None

    pos = Positive(2, 3)
    r = fit(pos, data, 0.1, max_passes=20, gap_check=10)
    assert float(r.w.min()) >= 0.0 and float(r.w_avg.min()) >= 0.0 and r.gap >= -1e-12
    with pytest.raises(ValueError, match="shape"):
        fit(model, data, 0.1, bounds=(torch.zeros(3), None))
    with pytest.raises(ValueError, match="exceeds"):
        fit(model, data, 0.1, bounds=(torch.ones(d), torch.zeros(d)))
    with pytest.raises(ValueError, match="NaN"):
        fit(model, data, 0.1, bounds=(torch.full((d,), float("nan")), None))
    with pytest.raises(ValueError, match="ssg"):
        fit(model, data, 0.1, "ssg", bounds=(torch.zeros(d), None))
