"""Multi-plane BCFW (Shah et al. 2015) on tiny problems: the reduction to BCFW, the working-set policy, the
certificates against enumeration, the optimum of batch FW, the automatic rule on a synthetic clock, the
averages, checkpoints and option errors."""
import math

import numpy as np
import pytest
import torch

from conftest import brute_force_primal, random_chain_problem, random_multiclass_problem
from torch_bcfw import FitResult, fit
from torch_bcfw.duals.working_set import WorkingSet
from torch_bcfw.models import Multiclass
from torch_bcfw.solvers.run import run_solver
from torch_bcfw.solvers.mpbcfw import MPBCFW, stop_approximate_passes
from torch_bcfw.solvers.run import options_for

INF = math.inf


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _chain():
    return random_chain_problem(n=8, F=3, K=3, max_len=4, seed=4)


def _problem(kind):
    return _chain() if kind == "chain" else random_multiclass_problem(n=8, F=3, K=4, seed=0)


def _alg(model, data, lam=0.05, fused=True, clock=None, **kw):
    alg = MPBCFW(model, data, lam, options_for("mp-bcfw", **kw), clock=clock)
    alg.fused = fused
    return alg


def _dual(alg):
    return alg.dual_value()


# ---------------------------------------------------------------------- reduction to BCFW
@pytest.mark.parametrize("kind", ["chain", "multiclass"])
@pytest.mark.parametrize("sampling", ["uniform", "perm"])
def test_no_planes_no_approximate_passes_is_bcfw(kind, sampling):
    model, data = _problem(kind)
    kw = dict(max_passes=7, gap_check=2, sampling=sampling, seed=3)
    a = fit(model, data, 0.05, "bcfw", **kw)
    b = fit(model, data, 0.05, "mp-bcfw", mp_max_planes=0, mp_max_approx_passes=0, **kw)
    assert torch.equal(a.w, b.w) and torch.equal(a.w_avg, b.w_avg)
    assert [h.gap_last for h in a.history] == [h.gap_last for h in b.history]
    assert [h.gap_avg for h in a.history] == [h.gap_avg for h in b.history]
    assert b.history[-1].approx_steps == 0 and b.history[-1].exact_calls == 7 * len(data)


# ---------------------------------------------------------------------- working set (MP-BCFW policy)
def test_working_set_lru_cap_staleness_and_duplicates():
    ws = WorkingSet([np.array([0, 1]), np.array([2])], init_cap=2)
    assert ws.last_active(0).tolist() == [0.0]
    j = ws.add_plane(0, [1, 1], 0.1, 1.0, max_planes=3)
    assert j == 1 and ws.size[0] == 2
    assert ws.add_plane(0, [1, 1], 0.1, 1.5, max_planes=3) == 1 and ws.size[0] == 2  # duplicate: refreshed only
    assert ws.last_active(0).tolist() == [0.0, 1.5]
    ws.add_plane(0, [2, 2], 0.2, 2.0, max_planes=3)
    ws.touch(0, 0, 2.5)  # the ground truth becomes the most recent
    ws.add_plane(0, [0, 2], 0.3, 3.0, max_planes=3)  # full: evicts the longest inactive, [1, 1] (1.5)
    assert ws.size[0] == 3 and ws.find(0, [1, 1]) == -1
    assert [y.tolist() for y in ws.labelings(0)] == [[0, 1], [2, 2], [0, 2]]
    assert ws.incomplete[0] == 0  # [1, 1] had alpha = 0
    ws.alphas(0)[:] = [0.0, 1.0, 0.0]
    ws.add_plane(0, [2, 1], 0.4, 4.0, max_planes=3)  # evicts [2, 2] (2.0), which carries alpha
    assert ws.find(0, [2, 2]) == -1 and ws.incomplete[0] == 1
    assert ws.drop_stale(0, 3.5) == 2 and [y.tolist() for y in ws.labelings(0)] == [[2, 1]]
    assert ws.drop_stale(0, 10.0) == 0 and ws.size[0] == 1  # never empty: the most recent plane stays
    assert ws.size[1] == 1 and ws.labeling(1, 0).tolist() == [2]
    truth = [np.array([0, 1]), np.array([2])]
    ws2 = WorkingSet.from_state_dict(ws.state_dict(), truth)
    assert ws2.last_active(0).tolist() == [4.0]
    short = ws.state_dict()  # a pool with a column missing is refused, not padded
    short["fl"] = short["fl"][:, :3]
    with pytest.raises(ValueError, match="working_set fl"):
        WorkingSet.from_state_dict(short, truth)


@pytest.mark.parametrize("fused", [True, False])
def test_working_set_invariants_during_a_run(fused):
    model, data = _chain()
    N, T = 3, 1
    alg = _alg(model, data, 0.02, fused=fused, mp_max_planes=N, mp_inactive_iters=T, mp_max_approx_passes=3,
               mp_approx_ratio=INF, sampling="perm")
    seen_drop = False
    for k in range(1, 16):
        before = alg.ws.size.copy()
        alg.advance(len(data))
        ws = alg.ws
        assert alg.iteration == k
        for i in range(len(data)):
            labs = [tuple(y.tolist()) for y in ws.labelings(i)]
            assert 1 <= len(labs) <= N
            assert len(set(labs)) == len(labs)  # no duplicate labelings
            assert (ws.last_active(i) >= k - T).all()  # nothing inactive for more than T iterations
            assert (np.floor(ws.last_active(i)) <= k).all()
        seen_drop |= bool((ws.size < before).any())
    assert seen_drop
    assert alg.approx_passes == 15 * 3


def test_compiled_chain_steps_equal_the_generic_loop():
    model, data = _chain()
    kw = dict(mp_max_planes=3, mp_inactive_iters=2, mp_max_approx_passes=3, mp_approx_ratio=INF)
    a, b = _alg(model, data, fused=True, **kw), _alg(model, data, fused=False, **kw)
    for _ in range(10):
        a.advance(len(data))
        b.advance(len(data))
    assert torch.allclose(a.state.w, b.state.w, atol=1e-12) and a.state.ell == pytest.approx(b.state.ell, abs=1e-12)
    for x, y in ((a.averages.exact, b.averages.exact), (a.averages.approx, b.averages.approx)):
        assert torch.allclose(x.v, y.v, atol=1e-12) and x.k == y.k
    for i in range(len(data)):
        assert [t.tolist() for t in a.ws.labelings(i)] == [t.tolist() for t in b.ws.labelings(i)]
        np.testing.assert_allclose(a.ws.last_active(i), b.ws.last_active(i))
        np.testing.assert_allclose(a.ws.alphas(i), b.ws.alphas(i), atol=1e-12)


def test_compiled_steps_call_an_overridden_oracle_from_python():
    """A chain whose oracle is overridden (here: counted) runs MP-BCFW's exact steps in the compiled driver with that
    oracle's answers, one block per call: every exact step calls it, and the trajectory is the built-in one's."""
    from torch_bcfw.models import Chain

    calls = []

    class CountingChain(Chain):
        def oracle(self, w, data, loss_augmented=True):
            calls.append(len(data))
            return super().oracle(w, data, loss_augmented)

    model, data = _chain()
    counted = CountingChain(model.n_inputs, model.n_labels)
    assert not counted.builtin_oracle() and model.builtin_oracle()
    kw = dict(mp_max_planes=3, mp_inactive_iters=2, mp_max_approx_passes=2, mp_approx_ratio=INF)
    a, b = _alg(model, data, **kw), _alg(counted, data, **kw)
    for _ in range(4):
        a.advance(len(data))
        b.advance(len(data))
    assert sum(calls) == 4 * len(data) and set(calls) == {1}
    assert torch.allclose(a.state.w, b.state.w, atol=1e-12) and a.state.ell == pytest.approx(b.state.ell, abs=1e-12)
    for i in range(len(data)):
        assert [t.tolist() for t in a.ws.labelings(i)] == [t.tolist() for t in b.ws.labelings(i)]


# ---------------------------------------------------------------------- certificates and the optimum
@pytest.mark.parametrize("kind", ["chain", "multiclass"])
def test_gap_is_primal_minus_dual_by_enumeration(kind):
    """With no eviction the working set lists alpha exactly: w = A alpha and l = b^T alpha from it; the
    primal by enumeration minus that dual is the history's gap (last and averaged iterate)."""
    model, data = _problem(kind)
    lam, n = 0.05, len(data)
    r = fit(model, data, lam, "mp-bcfw", max_passes=6, gap_check=3, mp_inactive_iters=0, seed=2)
    h = r.history[-1]
    alg = MPBCFW(model, data, lam, r.options)
    alg.load_state_dict(r.solver_state)
    ws = alg.state.working_set
    assert not ws.incomplete.any()
    w = torch.zeros(model.n_features, dtype=torch.float64)
    ell = 0.0
    for i in range(n):
        blk = data[[i]]
        assert ws.alphas(i).sum() == pytest.approx(1.0, abs=1e-12) and ws.alphas(i).min() >= 0.0
        for y, a in zip(ws.labelings(i), ws.alphas(i)):
            y = torch.as_tensor(y, dtype=torch.long)
            w += float(a) * (model.joint_feature(blk, blk.y)[0] - model.joint_feature(blk, y)[0]) / (lam * n)
            ell += float(a) * float(model.loss(blk, y)[0]) / n
    assert torch.allclose(r.w, w, atol=1e-12)
    primal = brute_force_primal(model, data, w, lam)
    assert h.primal == pytest.approx(primal, abs=1e-10)
    assert h.gap_last == pytest.approx(primal - (ell - 0.5 * lam * float(w @ w)), abs=1e-10)
    assert h.gap_last >= 0 and h.gap_avg >= 0
    assert h.primal_avg == pytest.approx(brute_force_primal(model, data, r.w_avg, lam), abs=1e-10)
    assert h.approx_steps > 0 and h.exact_calls == 6 * n and 0.0 <= h.avg_mix <= 1.0


@pytest.mark.parametrize("kind", ["chain", "multiclass"])
def test_reaches_the_batch_fw_optimum_with_fewer_oracle_calls_than_bcfw(kind):
    model, data = random_chain_problem(n=6, F=3, K=2, max_len=3, seed=7) if kind == "chain" else \
        random_multiclass_problem(n=8, F=3, K=3, seed=7)
    lam = 1.0
    common = dict(max_passes=2000, gap_tol=1e-4, averaging=False, track_train_loss=False)
    rf = fit(model, data, lam, "fw", gap_check=25, **{**common, "gap_tol": 1e-3})
    rb = fit(model, data, lam, "bcfw", gap_check=1, sampling="perm", **common)
    rm = fit(model, data, lam, "mp-bcfw", gap_check=1, sampling="perm", **common)
    assert rm.gap <= 1e-4 and rb.gap <= 1e-4 and rf.gap <= 1e-3
    assert abs(rm.primal - rf.primal) <= rm.gap + rf.gap + 1e-12
    assert float((rm.weights - rf.weights).norm()) <= math.sqrt(2 * rm.gap / lam) + math.sqrt(2 * rf.gap / lam)
    assert brute_force_primal(model, data, rm.weights, lam) == pytest.approx(rm.primal, abs=1e-10)
    assert rm.history[-1].oracle_calls <= rb.history[-1].oracle_calls


# ---------------------------------------------------------------------- the automatic rule
def test_stop_rule_formula():
    # slope of B (1/1) vs slope of A (10/10): equal, not below: continue; r scales B's side
    assert not stop_approximate_passes(10.0, 10.0, 1.0, 1.0, 1.0, 0.0, 5.0)
    assert stop_approximate_passes(10.0, 10.0, 0.9, 1.0, 1.0, 0.0, 5.0)
    assert not stop_approximate_passes(10.0, 10.0, 0.9, 1.0, 2.0, 0.0, 5.0)
    assert stop_approximate_passes(10.0, 10.0, 5.0, 1.0, 0.0, 0.0, 5.0)  # r = 0: one pass
    assert not stop_approximate_passes(10.0, 10.0, 1e-9, 1.0, INF, 0.0, 5.0)  # r = inf: the timing rule off
    assert stop_approximate_passes(0.0, 10.0, 0.0, 1.0, 1.0, 0.0, 5.0)  # the guard: 0 < 0 would not stop
    assert stop_approximate_passes(0.0, 10.0, 0.0, 1.0, INF, 1e-12, 5.0)
    assert stop_approximate_passes(1.0, 10.0, 1e-13, 1.0, INF, 1e-12, 1.0)


class _CountingMulticlass(Multiclass):
    """Counts oracle examples: the synthetic clock charges them."""

    calls = 0

    def oracle(self, w, data, loss_augmented=True):
        self.calls += len(data)
        return super().oracle(w, data, loss_augmented)


def _clocked(exact_cost, approx_cost, lam=0.01, **kw):
    """MP-BCFW whose clock is a cost model: ``exact_cost`` per oracle call, ``approx_cost`` per approximate
    step (block steps that called no oracle); only differences inside a pass are read."""
    base, data = random_multiclass_problem(n=10, F=3, K=4, seed=5)
    model = _CountingMulticlass(base.n_inputs, base.n_labels)
    holder = {}

    def clock():
        st = holder["alg"].state
        return exact_cost * model.calls + approx_cost * (st.k - model.calls)

    alg = MPBCFW(model, data, lam, options_for("mp-bcfw", sampling="perm", **kw), clock=clock)
    holder["alg"] = alg
    return alg


def _passes_per_iteration(alg, iters):
    out = []
    for _ in range(iters):
        alg.advance(alg.n)
        out.append(alg.last_approx_passes)
    return out


def test_automatic_rule_on_a_synthetic_clock():
    cheap = _passes_per_iteration(_clocked(100.0, 1.0), 4)
    dear = _passes_per_iteration(_clocked(1.0, 1.0), 4)
    assert min(cheap) >= 1 and min(dear) >= 1  # always at least one approximate pass
    assert sum(cheap) > 3 * sum(dear)  # a costly oracle buys many approximate passes
    assert max(dear) <= 3
    # from the same state the passes are the same until the rule stops them: their number grows with r
    by_ratio = [_passes_per_iteration(_clocked(100.0, 1.0, mp_approx_ratio=r), 1)[0] for r in (0.25, 1.0, 4.0)]
    assert by_ratio[0] <= by_ratio[1] <= by_ratio[2] and by_ratio[0] < by_ratio[2]
    assert _passes_per_iteration(_clocked(100.0, 1.0, mp_approx_ratio=0.0), 3) == [1, 1, 1]
    capped = _clocked(100.0, 1.0, mp_max_approx_passes=2, mp_approx_ratio=INF)
    assert _passes_per_iteration(capped, 3) == [2, 2, 2]


def test_guard_stops_when_nothing_is_gained():
    """On the toy of Osokin et al. (App. C) the optimum is reached exactly; then an approximate pass gains
    nothing and the guard stops after it although the timing rule is off (``0 < 0`` would never stop)."""
    from conftest import app_c_toy

    model, data, lam = app_c_toy(6, 3)
    alg = MPBCFW(model, data, lam, options_for("mp-bcfw", mp_approx_ratio=INF, mp_max_approx_passes=50))
    for _ in range(60):
        alg.advance(alg.n)
        if alg.certificate().gap <= 1e-13:
            break
    assert alg.certificate().gap <= 1e-13
    assert _passes_per_iteration(alg, 3) == [1, 1, 1]  # without the guard: 50 each


# ---------------------------------------------------------------------- averages
def test_two_averages_closed_form_and_best_mixture():
    model, data = _chain()
    alg = _alg(model, data, 0.05, mp_max_approx_passes=2, mp_approx_ratio=INF, fused=False)
    exact, approx = [], []

    def recording(avg, seq):  # the iterate after every step, as the plan hands it to the running average
        update = avg.update

        def rec(v, ell):
            assert torch.equal(v, alg.state.v) and ell == alg.state.ell
            seq.append((v.clone(), ell))
            update(v, ell)
        return rec

    alg.averages.exact.update = recording(alg.averages.exact, exact)
    alg.averages.approx.update = recording(alg.averages.approx, approx)
    for _ in range(3):
        alg.advance(len(data))
    for avg, seq in ((alg.averages.exact, exact), (alg.averages.approx, approx)):
        K = len(seq)
        closed = sum(t * v for t, (v, _) in enumerate(seq, start=1)) * 2 / (K * (K + 1))
        closed_ell = sum(t * e for t, (_, e) in enumerate(seq, start=1)) * 2 / (K * (K + 1))
        assert avg.k == K and torch.allclose(avg.v, closed, atol=1e-12) and avg.ell == pytest.approx(closed_ell, abs=1e-12)
    lam = alg.lam

    def D(v, ell):
        return ell - 0.5 * lam * float(v @ v)

    w_mix, ell_mix = alg.averaged()
    best = max(D(alg.averages.exact.v, alg.averages.exact.ell), D(alg.averages.approx.v, alg.averages.approx.ell))
    assert D(w_mix, ell_mix) >= best - 1e-15
    for g in np.linspace(0, 1, 21):  # the mixture maximises the dual on the segment
        v = (1 - g) * alg.averages.exact.v + g * alg.averages.approx.v
        e = (1 - g) * alg.averages.exact.ell + g * alg.averages.approx.ell
        assert D(w_mix, ell_mix) >= D(v, e) - 1e-14


# ---------------------------------------------------------------------- checkpoints, options, tools
def test_checkpoint_resumes_exactly(tmp_path):
    model, data = _chain()
    kw = dict(gap_check=5, seed=2, mp_max_approx_passes=3, mp_approx_ratio=INF, mp_max_planes=4,
              mp_inactive_iters=2, sampling="perm")
    full = fit(model, data, 0.05, "mp-bcfw", max_passes=20, **kw)
    first = fit(model, data, 0.05, "mp-bcfw", max_passes=10, **kw)
    first.save(tmp_path / "r.pt")
    second = fit(model, data, 0.05, "mp-bcfw", max_passes=10, init=FitResult.load(tmp_path / "r.pt"), **kw)
    assert torch.equal(full.w, second.w) and torch.equal(full.w_avg, second.w_avg)
    keys = ("gap_last", "gap", "gap_avg", "approx_steps", "planes_mean", "outer_iterations")
    assert [[getattr(h, k) for k in keys] for h in full.history] == [[getattr(h, k) for k in keys] for h in second.history]
    # mid-pass: a fractional number of passes leaves an exact pass in progress, which the resume completes
    a = fit(model, data, 0.05, "mp-bcfw", max_passes=2.5, **kw)
    b = fit(model, data, 0.05, "mp-bcfw", max_passes=2.5, init=a, **kw)
    c = fit(model, data, 0.05, "mp-bcfw", max_passes=5, **kw)
    assert torch.equal(b.w, c.w)


def test_bad_options_raise_clear_errors():
    model, data = _chain()
    for bad, msg in ((dict(mp_max_planes=-1), "mp_max_planes"), (dict(mp_inactive_iters=1.5), "mp_inactive_iters"),
                     (dict(mp_max_approx_passes=-2), "mp_max_approx_passes"), (dict(mp_approx_ratio=-1.0), "mp_approx_ratio"),
                     (dict(mp_min_gain=float("nan")), "mp_min_gain")):
        with pytest.raises(ValueError, match=msg):
            fit(model, data, 0.1, "mp-bcfw", **bad)
    with pytest.raises(TypeError, match="belong to solver 'bcfw'"):
        fit(model, data, 0.1, "mp-bcfw", preset="gap-fw")
    with pytest.raises(TypeError, match="belong to solver 'bcfw'"):
        fit(model, data, 0.1, "mp-bcfw", cache=True)
    with pytest.raises(ValueError, match="refinement of solver='bcfw'"):
        fit(model, data, 0.1, "mp-bcfw", sampling="gap")
    with pytest.raises(ValueError, match="line_search"):
        fit(model, data, 0.1, "mp-bcfw", step="fixed")
    with pytest.raises(TypeError, match="unknown solver option"):
        fit(model, data, 0.1, "mp-bcfw", mp_planes=3)
    with pytest.raises(ValueError, match="cannot warm-start"):
        fit(model, data, 0.1, "mp-bcfw", max_passes=1, init=fit(model, data, 0.1, max_passes=1))


def test_history_csv_and_compare_tool(tmp_path):
    from torch_bcfw.compare import run_comparison, summarise

    model, data = _chain()
    r = fit(model, data, 0.05, "mp-bcfw", max_passes=4, gap_check=2)
    r.write_history_csv(tmp_path / "h.csv")
    header = (tmp_path / "h.csv").read_text().splitlines()[0].split(",")
    assert {"exact_calls", "approx_steps", "approx_time", "exact_time"} <= set(header)
    cfg = {"lam": 0.05, "seeds": [1, 2], "options": {"max_passes": 4, "gap_check": 2},
           "solvers": [{"label": "BCFW"}, {"label": "MP-BCFW", "solver": "mp-bcfw"}]}
    res = run_comparison(cfg, model=model, train=data, log=lambda *a: None)
    rows = {row["solver"]: row for row in summarise(res)}
    assert rows["MP-BCFW"]["approx_steps"] > 0 and rows["BCFW"]["approx_steps"] == 0


def test_run_solver_with_an_algorithm_built_by_hand():
    model, data = _chain()
    alg = _alg(model, data, 0.05, max_passes=3, gap_check=1)
    out = run_solver(alg, alg.options)
    assert out.stopped_by == "max_passes" and len(out.history) == 3 and alg.iteration == 3


def test_lightning_callback_runs_mp_bcfw(tmp_path):
    """BCFWCallback(solver="mp-bcfw"): the planes survive the rebind to new features and the logged gap is
    the exact gap (enumeration) of the head at the current features."""
    pytest.importorskip("lightning", reason="the [lightning] extra is not installed")
    from test_lightning import Toy, _features, _trainer, _trainer_metrics

    from torch_bcfw.lightning import BCFWCallback

    _, raw = random_chain_problem(n=8, F=4, K=3, max_len=3, seed=1)
    lam = 0.1
    cb = BCFWCallback(lam=lam, passes_per_call=3, solver="mp-bcfw", averaging=False)
    module = Toy(raw)
    _trainer(tmp_path, [cb], epochs=2).fit(module)
    rec = cb.last_record
    assert rec.approx_steps > 0 and rec.outer_iterations == 9
    assert cb.dual_sd.get("working_set") is not None
    data = _features(module, raw)
    model, w_head = module.head.model, module.head.w
    st = cb.dual_sd["storage"]
    w_alpha = (model.joint_feature_sum(data, data.y)
               - model.features_from_marginals(data, st["mu"], st["T"].sum(0))) / (lam * len(data))
    assert torch.allclose(w_alpha, w_head, atol=1e-12)
    dual = float(cb.dual_sd["block_ell"].sum()) - 0.5 * lam * float(w_alpha @ w_alpha)
    logged = {k: float(v) for k, v in _trainer_metrics(module).items()}
    assert logged["ssvm/gap"] == pytest.approx(brute_force_primal(model, data, w_head, lam) - dual, abs=1e-10)


def test_command_line_fit_with_mp_bcfw(tmp_path):
    import json
    import subprocess
    import sys
    from pathlib import Path

    from conftest import shared_data

    root = Path(__file__).resolve().parents[1]
    out = tmp_path / "run"
    p = subprocess.run([sys.executable, "-m", "torch_bcfw", "fit", "--config", "configs/ocr_mpbcfw.yaml",
                        "--set", f"data.path={shared_data('ocr')}", "--set", "data.limit=200",
                        "--set", "options.max_passes=3", "--set", "options.gap_check=3", "--output", str(out),
                        "--quiet"], capture_output=True, text=True, cwd=root)
    assert p.returncode == 0, p.stderr
    hist = json.loads((out / "history.json").read_text())
    assert hist["solver"] == "mp-bcfw" and hist["history"][-1]["outer_iterations"] == 3
    assert hist["history"][-1]["approx_steps"] > 0
