"""BCFW, batch FW and SSG on tiny problems checked against enumeration and the BCFW theory."""
import math

import numpy as np
import pytest
import torch

from conftest import brute_force_max, brute_force_primal, enumerate_labelings, random_chain_problem, random_multiclass_problem
from torch_bcfw import fit
from torch_bcfw.duals import ChainDualState, DenseDualState
from torch_bcfw.duals.plan import StepPlan, generic_plan_steps
from torch_bcfw.duals.stepsize import FIXED, LINE_SEARCH
from torch_bcfw.solvers.callbacks import Callback
from torch_bcfw.certificate import certify


def _labels_of(data, y, i):
    return y[data.offsets[i]:data.offsets[i + 1]] if hasattr(data, "offsets") else y[i:i + 1]


@pytest.mark.parametrize("kind", ["chain", "multiclass"])
def test_gap_is_primal_minus_dual_with_explicit_alpha(kind):
    """Track alpha explicitly next to BCFW; primal by enumeration, dual from alpha; compare to the state."""
    lam = 0.3
    if kind == "chain":
        model, data = random_chain_problem(n=4, F=3, K=2, max_len=3, seed=3)
    else:
        model, data = random_multiclass_problem(n=5, F=3, K=3, seed=3)
    n = len(data)
    state = model.dual_state(data, lam)
    alpha = [{tuple(_labels_of(data, data.y, i).tolist()): 1.0} for i in range(n)]
    rng = np.random.default_rng(0)
    for _ in range(25):
        i = int(rng.integers(n))
        _, y = brute_force_max(model, data, state.w, i)
        _, gamma = state.block_step(i, y, LINE_SEARCH)
        for key in alpha[i]:
            alpha[i][key] *= 1.0 - gamma
        alpha[i][tuple(y.tolist())] = alpha[i].get(tuple(y.tolist()), 0.0) + gamma
    # w = A alpha, l = b^T alpha from the explicit alpha
    w = torch.zeros(model.n_features, dtype=torch.float64)
    ell = 0.0
    for i in range(n):
        blk = data[[i]]
        assert sum(alpha[i].values()) == pytest.approx(1.0)
        assert min(alpha[i].values()) >= -1e-15
        for lab, a in alpha[i].items():
            y = torch.tensor(lab)
            w += a * (model.joint_feature(blk, blk.y)[0] - model.joint_feature(blk, y)[0]) / (lam * n)
            ell += a * float(model.loss(blk, y)[0]) / n
    assert torch.allclose(state.w, w, atol=1e-12)
    assert state.ell == pytest.approx(ell, abs=1e-12)
    primal = brute_force_primal(model, data, w, lam)
    dual = ell - 0.5 * lam * float(w @ w)
    cert = certify(model, data, state.w, state.ell, lam)
    assert cert.primal == pytest.approx(primal, abs=1e-10)
    assert cert.dual == pytest.approx(dual, abs=1e-10)
    assert cert.gap == pytest.approx(primal - dual, abs=1e-10)
    assert cert.gap >= 0
    # the gap is the sum of the block gaps at the fixed w
    block_gaps = []
    for i in range(n):
        best, y = brute_force_max(model, data, state.w, i)
        v, ell_s = state.block_direction(i, y)
        block_gaps.append(lam * float(v @ state.w) - float(state.block_ell[i]) + ell_s)
    assert sum(block_gaps) == pytest.approx(cert.gap, abs=1e-10)
    assert min(block_gaps) >= -1e-12


@pytest.mark.parametrize("state_cls", [ChainDualState, DenseDualState])
def test_w_is_sum_of_blocks_after_many_steps(state_cls):
    model, data = random_chain_problem(n=8, F=4, K=3, max_len=5, seed=5)
    state = state_cls(model, data, 0.05)
    rng = np.random.default_rng(1)
    for _ in range(6):
        state.run_steps(rng.integers(0, len(data), 40), LINE_SEARCH)
        blocks = torch.stack([state.block_w(i) for i in range(len(data))])
        assert torch.allclose(blocks.sum(0), state.w, atol=1e-12)
        assert float(state.block_ell.sum()) == pytest.approx(state.ell, abs=1e-12)


def test_compiled_kernel_equals_generic_steps():
    """The fused numba kernel, the torch step on the marginal state and the dense state agree."""
    model, data = random_chain_problem(n=12, F=5, K=4, max_len=6, seed=11)
    order = np.random.default_rng(2).integers(0, len(data), 150)
    for code in (LINE_SEARCH, FIXED):
        fused = ChainDualState(model, data, 0.02)
        generic = ChainDualState(model, data, 0.02)
        dense = DenseDualState(model, data, 0.02)
        g1 = fused.run_steps(order, code)
        g2 = generic_plan_steps(generic, StepPlan.plain(order, code, True)).gaps
        g3 = dense.run_steps(order, code)
        np.testing.assert_allclose(g1, g2, atol=1e-12)
        np.testing.assert_allclose(g1, g3, atol=1e-12)
        for other in (generic, dense):
            assert torch.allclose(fused.w, other.w, atol=1e-12)
            assert fused.ell == pytest.approx(other.ell, abs=1e-12)
            wa, la = fused.averaged()
            wb, lb = other.averaged()
            assert torch.allclose(wa, wb, atol=1e-10)
            assert la == pytest.approx(lb, abs=1e-10)


def test_the_plain_kernel_takes_the_full_kernels_steps_bit_for_bit(monkeypatch):
    """Plain BCFW on a chain runs in ``chain_plain_bcfw_steps`` (compiled on its own, fast to compile); the full plan
    kernel ``chain_refined_plan_steps`` takes the same steps on a plain plan, to the last bit."""
    from torch_bcfw.duals import chain_driver

    model, data = random_chain_problem(n=12, F=5, K=4, max_len=6, seed=11)
    order = np.random.default_rng(2).integers(0, len(data), 150)
    calls = []
    for name in ("chain_plain_bcfw_steps", "chain_refined_plan_steps"):
        monkeypatch.setattr(f"torch_bcfw.duals.chain.{name}",
                            lambda *a, _f=getattr(chain_driver, name), _n=name: calls.append(_n) or _f(*a))
    plain = ChainDualState(model, data, 0.02)
    g1 = plain.run_plan(StepPlan.plain(order, LINE_SEARCH, True)).gaps
    monkeypatch.setattr(StepPlan, "is_plain", property(lambda self: False))
    full = ChainDualState(model, data, 0.02)
    g2 = full.run_plan(StepPlan.plain(order, LINE_SEARCH, True)).gaps
    assert calls == ["chain_plain_bcfw_steps", "chain_refined_plan_steps"]
    assert np.array_equal(g1, g2) and torch.equal(plain.w, full.w) and plain.ell == full.ell
    assert torch.equal(plain.averaged()[0], full.averaged()[0])


def test_lazy_average_equals_closed_form():
    model, data = random_multiclass_problem(n=6, F=3, K=3, seed=1)
    state = model.dual_state(data, 0.1)
    rng = np.random.default_rng(0)
    iterates, ells = [], []
    for _ in range(30):
        i = int(rng.integers(len(data)))
        y = model.oracle(state.w, data[[i]])
        state.block_step(i, y, LINE_SEARCH)
        iterates.append(state.w.clone())
        ells.append(state.ell)
    K = len(iterates)
    closed = sum(t * w for t, w in enumerate(iterates, start=1)) * 2 / (K * (K + 1))
    closed_ell = sum(t * e for t, e in enumerate(ells, start=1)) * 2 / (K * (K + 1))
    w_avg, ell_avg = state.averaged()
    assert torch.allclose(w_avg, closed, atol=1e-12)
    assert ell_avg == pytest.approx(closed_ell, abs=1e-12)


def test_first_steps_match_the_paper():
    """A3 of the reference note: BCFW's first step and batch FW's first step sizes."""
    model, data = random_multiclass_problem(n=5, F=3, K=3, seed=4)
    lam, n = 0.2, 5
    state = model.dual_state(data, lam)
    i = 2
    y = model.oracle(state.w, data[[i]])
    blk = data[[i]]
    psi = model.joint_feature(blk, blk.y)[0] - model.joint_feature(blk, y)[0]
    L = float(model.loss(blk, y)[0])
    _, gamma = state.block_step(i, y, LINE_SEARCH)
    assert gamma == pytest.approx(min(1.0, lam * n * L / float(psi @ psi)))
    fw = model.dual_state(data, lam)
    yall = model.oracle(fw.w, data)
    w_s = (model.joint_feature_sum(data, data.y) - model.joint_feature_sum(data, yall)) / (lam * n)
    ell_s = float(model.loss(data, yall).mean())
    gap, g = fw.batch_step(yall, LINE_SEARCH, 0)
    assert g == pytest.approx(min(1.0, ell_s / (lam * float(w_s @ w_s))))
    assert gap == pytest.approx(ell_s)  # at w = 0 the gap is P(0) = mean max loss


@pytest.mark.parametrize("solver", ["bcfw", "fw"])
def test_line_search_never_decreases_the_dual(solver):
    model, data = random_chain_problem(n=6, F=3, K=3, max_len=4, seed=8)
    state = model.dual_state(data, 0.05)
    rng = np.random.default_rng(3)
    prev = 0.0
    for it in range(40):
        if solver == "bcfw":
            i = int(rng.integers(len(data)))
            state.block_step(i, model.oracle(state.w, data[[i]]), LINE_SEARCH)
        else:
            state.batch_step(model.oracle(state.w, data), LINE_SEARCH, it)
        dual = state.ell - 0.5 * state.lam * float(state.w @ state.w)
        assert dual >= prev - 1e-13
        prev = dual


def test_fw_and_bcfw_reach_the_same_optimum():
    model, data = random_chain_problem(n=10, F=4, K=3, max_len=4, seed=2)
    lam = 1.0
    rb = fit(model, data, lam, "bcfw", max_passes=2000, gap_check=100, gap_tol=1e-3, averaging=False)
    rf = fit(model, data, lam, "fw", max_passes=2000, gap_check=100, gap_tol=1e-3, averaging=False)
    assert rb.gap <= 1e-3 and rf.gap <= 1e-3
    # both primal values are certified to within their gaps of P*
    assert abs(rb.primal - rf.primal) <= rb.gap + rf.gap + 1e-12
    # lam-strong convexity: lam/2 ||w - w*||^2 <= gap
    dist = float((rb.weights - rf.weights).norm())
    assert dist <= math.sqrt(2 * rb.gap / lam) + math.sqrt(2 * rf.gap / lam)
    # and the primal matches brute-force enumeration
    assert brute_force_primal(model, data, rb.weights, lam) == pytest.approx(rb.primal, abs=1e-10)


def _exact_block_curvature(model, data, lam):
    n = len(data)
    total = 0.0
    for i in range(n):
        blk = data[[i]]
        phis = torch.stack([model.joint_feature(blk, y)[0] for y in enumerate_labelings(model, data, i)])
        diff = phis[:, None, :] - phis[None, :, :]
        total += float((diff**2).sum(-1).max())
    return total / (lam * n * n)


@pytest.mark.parametrize("step", [LINE_SEARCH, FIXED])
def test_lacoste_julien_bound_holds_on_average(step):
    """E[f(alpha_k)] - f* <= 2n/(k+2n) (C_f^x + h0), averaged over 20 seeds (Theorem 2)."""
    model, data = random_chain_problem(n=5, F=3, K=2, max_len=3, seed=6)
    lam = 0.1
    opt = fit(model, data, lam, "bcfw", max_passes=2000, gap_check=100, averaging=False, track_train_loss=False)
    # conservative: P(w_best) >= D* on the left-hand side, D(alpha_best) <= D* = h0 on the right
    d_star = min(h.primal for h in opt.history)
    h0 = max(h.dual for h in opt.history)
    C = _exact_block_curvature(model, data, lam)  # h0 = D* - D(alpha_0) and D(alpha_0) = 0
    n, K_steps = len(data), 150
    subopt = np.zeros(K_steps)
    seeds = 20
    for seed in range(seeds):
        state = model.dual_state(data, lam)
        order = np.random.default_rng(seed).integers(0, n, K_steps)
        for k, i in enumerate(order):
            state.run_steps(np.array([i]), step)
            subopt[k] += d_star - (state.ell - 0.5 * lam * float(state.w @ state.w))
    subopt /= seeds
    ks = np.arange(1, K_steps + 1)
    bound = 2 * n / (ks + 2 * n) * (C + h0)
    assert np.all(subopt >= -1e-9)
    assert np.all(subopt <= bound)
    assert subopt[-1] < subopt[0]


def test_identical_seeds_give_identical_results():
    model, data = random_chain_problem(n=12, F=4, K=3, max_len=5, seed=9)
    a = fit(model, data, 0.01, max_passes=7, gap_check=2, seed=3)
    b = fit(model, data, 0.01, max_passes=7, gap_check=2, seed=3)
    c = fit(model, data, 0.01, max_passes=7, gap_check=2, seed=4)
    assert torch.equal(a.w, b.w) and torch.equal(a.w_avg, b.w_avg)
    assert [h.gap_last for h in a.history] == [h.gap_last for h in b.history]
    assert not torch.equal(a.w, c.w)


@pytest.mark.parametrize("solver,sampling", [("bcfw", "uniform"), ("bcfw", "perm"), ("fw", "uniform"), ("ssg", "uniform")])
def test_warm_start_continues_exactly(solver, sampling, tmp_path):
    model, data = random_chain_problem(n=10, F=4, K=3, max_len=5, seed=10)
    kw = dict(gap_check=5, sampling=sampling, seed=2)
    full = fit(model, data, 0.02, solver, max_passes=20, **kw)
    first = fit(model, data, 0.02, solver, max_passes=10, **kw)
    first.save(tmp_path / "r.pt")
    from torch_bcfw import FitResult

    second = fit(model, data, 0.02, solver, max_passes=10, init=FitResult.load(tmp_path / "r.pt"), **kw)
    assert torch.equal(full.w, second.w)
    assert torch.equal(full.w_avg, second.w_avg)
    assert [h.primal for h in full.history] == [h.primal for h in second.history]
    assert second.passes == 20


def test_ssg_first_step_and_progress():
    model, data = random_multiclass_problem(n=20, F=3, K=3, seed=2)
    lam = 0.1
    r = fit(model, data, lam, "ssg", max_passes=1 / 20, gap_check=1, averaging=False)
    # after one step w = psi_i(y*) / lam for the sampled example
    i = int(np.random.Generator(np.random.PCG64(1)).integers(0, 20, 1)[0])
    blk = data[[i]]
    y = model.oracle(torch.zeros(model.n_features, dtype=torch.float64), blk)
    psi = model.joint_feature(blk, blk.y)[0] - model.joint_feature(blk, y)[0]
    assert torch.allclose(r.w, psi / lam)
    long = fit(model, data, lam, "ssg", max_passes=50, gap_check=50)
    assert long.gap is None  # SSG has no dual
    opt = fit(model, data, lam, "bcfw", max_passes=500, gap_check=50, gap_tol=1e-8)
    assert long.primal <= opt.primal + 0.05


def test_interrupt_returns_a_certified_model():
    model, data = random_chain_problem(n=10, F=4, K=3, max_len=5, seed=1)

    class Interrupt(Callback):
        def on_chunk(self, passes, elapsed):
            if passes >= 3:
                raise KeyboardInterrupt

    r = fit(model, data, 0.05, max_passes=100, gap_check=10, callbacks=[Interrupt()])
    assert r.stopped_by == "interrupted"
    assert r.passes == 3
    cert = certify(model, data, r.w, r.history[-1].dual + 0.5 * 0.05 * float(r.w @ r.w), 0.05)
    assert r.history[-1].gap_last == pytest.approx(cert.gap)
    assert r.gap >= 0


def test_time_budget_and_gap_tol_stop_the_run():
    model, data = random_chain_problem(n=30, F=4, K=3, max_len=5, seed=1)
    r = fit(model, data, 0.05, max_passes=10**6, gap_check=1, time_budget=0.5)
    assert r.stopped_by == "time_budget"
    r = fit(model, data, 1.0, max_passes=10**4, gap_check=5, gap_tol=1e-2)
    assert r.stopped_by == "gap_tol" and r.gap <= 1e-2


def test_result_save_load_roundtrip(tmp_path):
    model, data = random_chain_problem(n=10, F=4, K=3, max_len=5, seed=3)
    r = fit(model, data, 0.05, max_passes=5, gap_check=5, test_data=data)
    r.save(tmp_path / "m.pt")
    r.write_history_csv(tmp_path / "h.csv")
    r.write_history_json(tmp_path / "h.json")
    from torch_bcfw import FitResult

    r2 = FitResult.load(tmp_path / "m.pt")
    assert torch.equal(r2.predict(data), r.predict(data))
    assert r2.gap == r.gap and r2.evaluate(data) == r.evaluate(data)
    assert (tmp_path / "h.csv").read_text().startswith("passes,")


@pytest.mark.parametrize("solver", ["fw", "ssg", "mp-bcfw", "cutting-plane", "online-eg", "extragradient"])
def test_batch_size_is_refused_by_the_solvers_that_cannot_use_it(solver):
    """Mini-batch rounds are a mode of BCFW: another solver would ignore ``batch_size`` (and record it as used)."""
    model, data = random_chain_problem(n=6, seed=1)
    with pytest.raises(ValueError, match="batch_size = 2.*takes no batch_size"):
        fit(model, data, 0.1, solver, batch_size=2, max_passes=1, gap_check=1)


@pytest.mark.parametrize("solver", ["fw", "cutting-plane", "extragradient"])
def test_batch_methods_refuse_a_fractional_number_of_passes(solver):
    """An iteration of a batch method visits every example: 7.5 passes cannot be run exactly (they were rounded
    up, so fit(7.5) then fit(12.5, init=...) ran 21 passes)."""
    model, data = random_chain_problem(n=6, seed=1)
    with pytest.raises(ValueError, match="whole passes"):
        fit(model, data, 0.1, solver, max_passes=1.5, gap_check=1)
    first = fit(model, data, 0.1, solver, max_passes=2, gap_check=1)
    second = fit(model, data, 0.1, solver, max_passes=3, gap_check=1, init=first)
    assert second.counters["work"] == 5 * len(data)


def test_the_device_choice_of_a_fit_on_a_gpu_is_measured():
    """``fit`` with its data on a GPU solves where one-block BCFW steps are measured fastest
    (:func:`torch_bcfw.planning.solver_placement`): the rule takes the cheaper device (the CPU on a tie), the timing
    runs on any device, and data already on the CPU (or a forced round size) is left alone with nothing recorded."""
    from torch_bcfw.planning import faster_device, plain_seconds_per_block, plan_run
    from torch_bcfw.solvers.options import SolverOptions

    assert faster_device(1e-5, 5.8e-3) == "cpu" and faster_device(1e-3, 1e-4) == "cuda"
    assert faster_device(1e-4, 1e-4) == "cpu"
    model, data = random_chain_problem(n=20, F=4, K=3, max_len=4, seed=2)
    opts = SolverOptions(max_passes=1)
    assert 0 < plain_seconds_per_block(model, data, 0.1, opts, 1, 8) < 1
    plan = plan_run(model, data, 0.1, "bcfw", opts)
    assert plan.data is data and plan.placement == {} and plan.round_size == 1
    assert plan_run(model, data, 0.1, "bcfw", SolverOptions(batch_size=4)).placement == {}
    r = fit(model, data, 0.1, max_passes=2)
    assert not any(k.startswith("placement_") for k in r.counters)
