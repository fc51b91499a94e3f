"""Mini-batch BCFW (Wang et al. 2016) in one process: the joint step against the block step, its line search
against the blocks' gaps, feasibility, the optimum of batch FW on enumerable problems, the samplers' rounds and
the options."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as hs

from conftest import brute_force_primal, random_chain_problem, random_multiclass_problem
from test_warm_start import _graph_problem
from torch_bcfw import fit
from torch_bcfw.duals.active_set import ActiveSetDualState
from torch_bcfw.duals.plan import StepPlan, generic_plan_steps
from torch_bcfw.duals.stepsize import FIXED, LINE_SEARCH, fixed_block_step, minibatch_fixed_step
from torch_bcfw.distributed.communicators import round_sizes, share_of
from torch_bcfw.solvers.options import SolverOptions
from torch_bcfw.duals.sumtree import gap_draw_round, tree_build, tree_size
from torch_bcfw.duals.working_set import block_labelings
from torch_bcfw.solvers.sampling import GapEstimates, GapSampler, PermutationSampler, UniformSampler

pytestmark = pytest.mark.usefixtures("one_torch_thread")


PROBLEMS = {
    "chain": lambda: random_chain_problem(n=7, seed=1),
    "multiclass": lambda: random_multiclass_problem(n=9),
    "graphcut": lambda: _graph_problem(),  # 4 chains of 2-4 nodes
}
STATES = {"own": lambda model, data, lam: model.dual_state(data, lam), "active-set": ActiveSetDualState}


@pytest.mark.parametrize("code", [LINE_SEARCH, FIXED])
@pytest.mark.parametrize("kind,storage", [("chain", "own"), ("chain", "active-set"), ("multiclass", "own"),
                                          ("multiclass", "active-set"), ("graphcut", "own")])
def test_rounds_of_one_block_are_bcfw_bit_for_bit(kind, storage, code):
    """The joint step of a round of one block is the block step, bit for bit (and ``fit(batch_size=1)`` is BCFW
    itself: it never builds rounds)."""
    model, data = PROBLEMS[kind]()
    a, b = (STATES[storage](model, data, 0.1) for _ in range(2))
    b.can_run_plan = lambda plan: False  # the torch rounds (the chain's compiled rounds: next tests)
    if model.weight_bounds() is not None:  # graph cut: pairwise weights >= 0 (box constraints)
        for st in (a, b):
            st.set_bounds(*model.weight_bounds())
    order = np.random.default_rng(0).integers(0, len(data), 50)
    ra = generic_plan_steps(a, StepPlan.plain(order, code, True))
    rb = b.run_plan(StepPlan.minibatch(order, np.arange(len(order) + 1), code, True))
    (wa, la), (wb, lb) = a.averaged(), b.averaged()
    assert torch.equal(a.w, b.w) and torch.equal(wa, wb) and la == lb
    assert np.array_equal(ra.gaps, rb.gaps)  # every step's block gap
    assert (a.ell, a.k, a.avg_t) == (b.ell, b.k, b.avg_t) and torch.equal(a.block_ell, b.block_ell)


@pytest.mark.parametrize("kind", ["chain", "multiclass"])
def test_line_search_numerator_is_the_sum_of_the_block_gaps_and_gamma_maximises_the_dual(kind):
    model, data = PROBLEMS[kind]()
    lam, n = 0.1, len(data)
    st = model.dual_state(data, lam)
    st.run_plan(StepPlan.plain(np.random.default_rng(1).integers(0, n, 30), LINE_SEARCH, False))
    idx = torch.tensor([0, 2, 3, 5])
    sub, y = st.subset_oracle(idx)
    g, _, _ = st.block_gaps()  # exact block gaps at the current w, from the batched gap pass
    w0, ell0 = st.w.clone(), st.ell
    # the joint direction from the joint features directly: V = sum_i (w_i - (psi_i(y_i) - psi_i(y_s)) / (lam n))
    psi = model.joint_feature(sub, sub.y) - model.joint_feature(sub, y)
    V = sum(st.block_w(i) for i in idx.tolist()) - psi.sum(0) / (lam * n)
    dl = float(model.loss(sub, y).sum()) / n - float(st.block_ell[idx].sum())
    num, gamma, _ = st.minibatch_step(idx, sub, y, LINE_SEARCH, False)
    assert num == pytest.approx(float(g[idx].sum()), rel=1e-10, abs=1e-13)
    assert num == pytest.approx(lam * float(V @ w0) + dl, rel=1e-10, abs=1e-13)

    def dual(t):
        return ell0 + t * dl - 0.5 * lam * float((w0 - t * V) @ (w0 - t * V))

    assert 0.0 < gamma < 1.0
    assert torch.allclose(st.w, w0 - gamma * V, atol=1e-12)
    d_star = st.ell - 0.5 * lam * float(st.w @ st.w)
    assert d_star == pytest.approx(dual(gamma), abs=1e-12)
    assert all(d_star >= dual(t) - 1e-12 for t in np.linspace(0.0, 1.0, 101))


@pytest.mark.parametrize("code", [LINE_SEARCH, FIXED])
@pytest.mark.parametrize("kind", ["chain", "multiclass"])
def test_rounds_keep_alpha_on_the_simplex_and_w_equal_to_A_alpha(kind, code):
    model, data = PROBLEMS[kind]()
    st = ActiveSetDualState(model, data, 0.1)
    own = model.dual_state(data, 0.1)
    sampler = UniformSampler(len(data), 4)
    for _ in range(15):
        order, offsets = sampler.draw_rounds(round_sizes(len(data), len(data), 4))
        for s in (st, own):
            s.run_plan(StepPlan.minibatch(order, offsets, code, True))
    assert torch.allclose(st.w, own.w, atol=1e-12) and st.ell == pytest.approx(own.ell, abs=1e-14)
    ws = st.active_set
    w = torch.zeros_like(st.w)
    for i in range(len(data)):
        a = ws.column(i, 0) if hasattr(ws, "column") else ws.alphas(i)
        assert a.min() >= 0.0 and a.sum() == pytest.approx(1.0, abs=1e-12)
        w += st.block_w(i)
    assert torch.allclose(w, st.w, atol=1e-12)
    assert st.refresh() < 1e-12 and own.refresh() < 1e-12
    g, _, _ = own.block_gaps()
    assert float(g.min()) >= -1e-12  # every block gap of a feasible point is >= 0


@pytest.mark.parametrize("kind", [pytest.param("chain", marks=pytest.mark.heavy), "multiclass"])
def test_every_minibatch_variant_reaches_the_batch_fw_optimum(kind):
    if kind == "chain":
        model, data = random_chain_problem(n=6, F=3, K=2, max_len=3, seed=7)
    else:
        model, data = random_multiclass_problem(n=8, F=3, K=3, seed=7)
    lam = 1.0
    ref = fit(model, data, lam, "fw", max_passes=1000, gap_check=25, gap_tol=1e-3, averaging=False,
              track_train_loss=False)
    assert ref.gap <= 1e-3
    lo, hi = torch.full((model.n_features,), -0.3, dtype=torch.float64), torch.full((model.n_features,), 0.3,
                                                                                      dtype=torch.float64)
    boxed = fit(model, data, lam, "fw", bounds=(lo, hi), max_passes=2000, gap_check=25, gap_tol=1e-3,
                averaging=False, track_train_loss=False)
    assert boxed.gap <= 1e-3
    for sampling in ("uniform", "perm", "gap"):
        for step in ("line_search", "fixed"):
            for tau in (3, len(data)):
                r = fit(model, data, lam, batch_size=tau, sampling=sampling, step=step, max_passes=3000, gap_check=20,
                        gap_tol=2e-4, track_train_loss=False)
                assert r.history[-1].gap <= 2e-4, (sampling, step, tau)
                assert brute_force_primal(model, data, r.weights, lam) == pytest.approx(r.primal, abs=1e-10)
                assert abs(r.primal - ref.primal) <= r.history[-1].gap + ref.gap + 1e-12
                dist = float((r.weights - ref.weights).norm())
                assert dist <= math.sqrt(2 * r.history[-1].gap / lam) + math.sqrt(2 * ref.gap / lam) + 1e-9
        c = fit(model, data, lam, batch_size=3, sampling=sampling, cache=True, max_passes=3000, gap_check=20,
                gap_tol=2e-4, track_train_loss=False)
        assert c.history[-1].gap <= 2e-4 and abs(c.primal - ref.primal) <= c.history[-1].gap + ref.gap
        assert c.history[-1].cache_hits > 0, sampling
        b = fit(model, data, lam, batch_size=3, sampling=sampling, bounds=(lo, hi), max_passes=3000, gap_check=20,
                gap_tol=2e-4, averaging=False, track_train_loss=False)
        assert b.gap <= 2e-4 and abs(b.primal - boxed.primal) <= b.gap + boxed.gap + 1e-12
        assert float(b.weights.abs().max()) <= 0.3


@pytest.mark.parametrize("code", [LINE_SEARCH, FIXED])
def test_compiled_chain_rounds_follow_the_generic_rounds(code):
    """The chain's compiled rounds (local, or around a reduce) against the torch rounds through ``subset_oracle`` /
    ``minibatch_step``."""
    model, data = random_chain_problem(n=20, seed=2, max_len=6)
    fused, split, generic = (model.dual_state(data, 0.05) for _ in range(3))
    generic.can_run_plan = lambda plan: False
    assert fused.can_run_plan(StepPlan.minibatch(np.arange(3), [0, 3]))
    sampler = UniformSampler(20, 0)
    for _ in range(10):
        order, offsets = sampler.draw_rounds(round_sizes(20, 20, 6))
        rf = fused.run_plan(StepPlan.minibatch(order, offsets, code, True))
        split.run_plan(StepPlan.minibatch(order, offsets, code, True, reduce=lambda V, sums: (V, sums)))
        rg = generic.run_plan(StepPlan.minibatch(order, offsets, code, True))
        np.testing.assert_allclose(rf.gaps, rg.gaps, atol=1e-13)
    for st in (fused, split):
        assert torch.allclose(st.w, generic.w, atol=1e-13) and st.ell == pytest.approx(generic.ell, abs=1e-13)
        assert torch.allclose(st.averaged()[0], generic.averaged()[0], atol=1e-13)
        assert (st.k, st.avg_t) == (generic.k, generic.avg_t)
        assert torch.allclose(st.mu, generic.mu, atol=1e-13) and torch.allclose(st.T, generic.T, atol=1e-13)
        assert st.refresh() < 1e-12


def _gap_plan(est: GapEstimates, sampler: GapSampler, sizes, code, reduce=None) -> StepPlan:
    offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    plan = StepPlan.minibatch(np.zeros(int(offsets[-1]), dtype=np.int64), offsets, code, True, reduce)
    return plan.draw_by_gap(sampler.uniforms(plan.m), sampler.queue, sampler.smeta, est)


@pytest.mark.parametrize("kind,storage", [("chain", "own"), ("chain", "active-set"), ("multiclass", "own"),
                                          ("multiclass", "active-set"), ("graphcut", "own")])
def test_rounds_measure_each_block_gap(kind, storage):
    """The block gaps a round reports (for gap sampling) are the exact block gaps at the round's ``w``, those of the
    batched gap pass, and sum to the line search's numerator."""
    model, data = PROBLEMS[kind]()
    st = STATES[storage](model, data, 0.1)
    st.can_run_plan = lambda plan: False
    if model.weight_bounds() is not None:
        st.set_bounds(*model.weight_bounds())
    st.run_plan(StepPlan.plain(np.random.default_rng(3).integers(0, len(data), 20), LINE_SEARCH, False))
    idx = torch.tensor([3, 0, 2])
    g, _, _ = st.block_gaps()
    sub, y = st.subset_oracle(idx)
    # the batched values of the cache test against the per-block ones
    np.testing.assert_allclose(st.subset_values(idx, sub).numpy(), [st.block_value(i) for i in idx.tolist()],
                               rtol=1e-10, atol=1e-13)
    ys = [np.asarray(lab) for lab in block_labelings(y, getattr(sub, "offsets", None))]
    pairs = [(i, ys[q]) for q, i in enumerate(idx.tolist())] + [(1, block_labelings(data.y, getattr(data, "offsets", None))[1])]
    np.testing.assert_allclose(st.pair_values([i for i, _ in pairs], [t for _, t in pairs]),
                               [st.corner_values(i, [t])[0] for i, t in pairs], rtol=1e-10, atol=1e-13)
    bg = np.empty(3)
    num, gamma, tau = st.minibatch_step(idx, sub, y, LINE_SEARCH, False, block_gaps=bg)
    np.testing.assert_allclose(bg, g[idx].numpy(), rtol=1e-10, atol=1e-13)
    assert num == pytest.approx(bg.sum(), rel=1e-10, abs=1e-13) and tau == 3


@pytest.mark.parametrize("code", [LINE_SEARCH, FIXED])
def test_gap_sampled_rounds_compiled_follow_the_generic_rounds(code):
    """Gap sampling in rounds: the chain's compiled rounds draw the same blocks from the same estimates and take the
    same steps as the torch rounds; the estimates hold each drawn block's gap at its round."""
    model, data = random_chain_problem(n=20, seed=2, max_len=6)
    states = [model.dual_state(data, 0.05) for _ in range(3)]
    states[2].can_run_plan = lambda plan: False
    ests = [GapEstimates(20) for _ in states]
    samplers = [GapSampler(20, 5, e) for e in ests]
    reduces = [None, lambda V, sums: (V, sums), None]
    results = []
    for _ in range(8):
        results.append([st.run_plan(_gap_plan(e, smp, round_sizes(20, 20, 6), code, red))
                        for st, e, smp, red in zip(states, ests, samplers, reduces)])
    for rf, rs, rg in results:
        assert np.array_equal(rf.blocks, rg.blocks) and np.array_equal(rs.blocks, rg.blocks)
        np.testing.assert_allclose(rf.gaps, rg.gaps, atol=1e-13)
        assert rf.rounds == rg.rounds == 4 and rf.oracle_calls == rg.oracle_calls == 20
    first = np.concatenate([r[2].blocks for r in results[:1]])
    assert sorted(first.tolist()) == list(range(20))  # the first pass visits every block once (the queue)
    for st, e in zip(states[:2], ests[:2]):
        assert torch.allclose(st.w, states[2].w, atol=1e-13) and (st.k, st.avg_t) == (states[2].k, states[2].avg_t)
        np.testing.assert_allclose(e.est, ests[2].est, atol=1e-13)
    assert np.isfinite(ests[2].est).all() and (ests[2].est >= 0).all()


@settings(max_examples=60, deadline=None)
@given(est=hs.lists(hs.sampled_from([0.0, 0.0, 1e-9, 0.5, 1.0, 3.0]), min_size=1, max_size=40),
       slots=hs.integers(1, 50), queued=hs.integers(0, 5), seed=hs.integers(0, 2**16))
def test_gap_draw_round_draws_distinct_blocks_with_positive_estimates(est, slots, queued, seed):
    n = len(est)
    est = np.array(est)
    queue = np.random.default_rng(seed).permutation(n).astype(np.int64)
    qpos = max(0, n - queued)
    est[queue[qpos:]] = np.inf  # never-visited blocks: zero leaves, served first
    size = tree_size(n)
    tree = np.zeros(2 * size)
    tree_build(tree, size, est, 1.0)
    smeta = np.array([qpos], dtype=np.int64)
    out = np.full(slots, -1, dtype=np.int64)
    c = gap_draw_round(queue, smeta, tree, size, np.random.default_rng(seed).random(slots), out)
    drawn = out[:c].tolist()
    n_queued, n_pos = n - qpos, int((est[np.isfinite(est)] > 0).sum())
    assert c == min(slots, n_queued + n_pos) and (out[c:] == -1).all()
    assert len(set(drawn)) == c  # distinct
    assert drawn[:min(c, n_queued)] == queue[qpos:qpos + min(c, n_queued)].tolist()  # the queue first
    assert all(est[i] > 0 for i in drawn)  # a zero estimate is never drawn


def test_gap_sampled_rounds_stop_for_an_exact_gap_pass_when_every_estimate_is_zero():
    model, data = random_multiclass_problem(n=9)
    st = model.dual_state(data, 0.1)
    est = GapEstimates(9)
    est.refresh(np.zeros(9))
    smp = GapSampler(9, 0, est)
    smp.end_first_visits()
    res = st.run_plan(_gap_plan(est, smp, [3, 3, 3], LINE_SEARCH))
    assert res.need_gap_pass and res.rounds == 0 and res.steps == 0 and (st.k, st.avg_t) == (0, 0)
    est.refresh(np.r_[1.0, np.zeros(8)])  # one positive estimate: rounds of that block alone (its new gap > 0)
    res = st.run_plan(_gap_plan(est, smp, [3, 3, 3], LINE_SEARCH))
    assert not res.need_gap_pass and res.rounds == 3 and res.oracle_calls == 3 and st.k == 3
    assert res.blocks.tolist() == [0, -1, -1] * 3 and est.est[0] > 0 and (est.est[1:] == 0).all()


@pytest.mark.parametrize("kind", ["chain", "multiclass", "graphcut"])
def test_cached_rounds_keep_the_working_set_equal_to_the_state(kind):
    """With the cache, a round's blocks move towards cached corners (hits) or oracle answers (misses, one batched
    call): the working set's ``alpha`` stay on the simplex and ``w_i = sum_j alpha_ij w_s(y_j)`` for every block."""
    model, data = PROBLEMS[kind]()
    n, lam = len(data), 0.1
    r = fit(model, data, lam, batch_size=3, cache=True, max_passes=30, gap_check=10,
            track_train_loss=False)
    last = r.history[-1]
    assert last.cache_hits > 0 and last.oracle_calls + last.cache_hits == r.counters["work"] == 30 * n
    st = model.dual_state(data, lam)
    st.load_state_dict(r.solver_state["state"])
    ws = st.working_set
    for i in range(n):
        a = ws.alphas(i)
        assert a.min() >= -1e-15 and a.sum() == pytest.approx(1.0, abs=1e-12)
        blk = st.block_data(i)
        w_i = torch.zeros_like(st.w)
        for j, y in enumerate(ws.labelings(i)):
            y = torch.as_tensor(np.asarray(y), dtype=torch.long).reshape(blk.y.shape)
            psi = model.joint_feature(blk, blk.y)[0] - model.joint_feature(blk, y)[0]
            w_i += float(a[j]) * psi / (lam * n)
        assert torch.allclose(st.block_w(i), w_i, atol=1e-12), i
    assert st.refresh() < 1e-12


def test_fixed_step_is_bcfw_at_one_block_and_never_leaves_the_simplex():
    for n in (1, 7, 6251):
        for k in range(0, 5 * n, max(1, n // 7)):
            assert minibatch_fixed_step(k, n, 1) == fixed_block_step(k, n)
            for tau in (2, 16, 256):
                g = minibatch_fixed_step(k, n, tau)
                assert 0.0 < g <= 1.0
                assert g == pytest.approx(min(1.0, 2 * n * tau / (tau * k + 2 * n)), rel=1e-15)
    assert minibatch_fixed_step(0, 100, 16) == 1.0  # unclipped it would be tau = 16


@pytest.mark.parametrize("cls", [UniformSampler, PermutationSampler])
def test_rounds_hold_distinct_blocks(cls):
    n = 11
    s = cls(n, 0)
    order, offsets = s.draw_rounds(round_sizes(3 * n + 5, 3 * n + 5, 4))
    assert offsets[0] == 0 and offsets[-1] == len(order) == 3 * n + 5
    for a, b in zip(offsets[:-1], offsets[1:]):
        assert len(set(order[a:b].tolist())) == b - a  # distinct within a round
    if cls is PermutationSampler:  # rounds straddling two permutations still visit each block once per permutation
        counts = np.bincount(order[: 3 * n], minlength=n)
        assert (counts == 3).all()
    with pytest.raises(ValueError, match="distinct blocks"):
        s.draw_rounds([n + 1])


def test_shares_and_round_sizes():
    for sizes in ([5], [3, 3], [7, 6], [1, 5, 9]):
        for m in (0, 1, 7, 13, 100):
            parts = [share_of(m, sizes, r) for r in range(len(sizes))]
            assert sum(parts) == m and all(p >= 0 for p in parts)
            assert max(abs(p - m * s / sum(sizes)) for p, s in zip(parts, sizes)) < 1.0
    r = round_sizes(250, 500, 64)
    assert len(r) == 8 and r.sum() == 250 and r.max() - r.min() <= 1


def test_batch_size_option_is_checked():
    for bad in (0, -3, True, 2.0, "4"):
        with pytest.raises(ValueError, match="batch_size"):
            SolverOptions(batch_size=bad)
    model, data = random_multiclass_problem(n=8)
    with pytest.raises(ValueError, match="exceeds the number of examples"):
        fit(model, data, 0.1, batch_size=9, max_passes=1)
    for refined in ({"step_rule": "pairwise"}, {"step_rule": "away"}, {"preset": "gap-pairwise-cache"}):
        with pytest.raises(ValueError, match="one-block refinements"):
            fit(model, data, 0.1, batch_size=2, max_passes=1, **refined)
    with pytest.raises(TypeError, match="distributed must be"):
        fit(model, data, 0.1, distributed="yes", max_passes=1)
    with pytest.raises(ValueError, match="initialised torch.distributed process group"):
        fit(model, data, 0.1, distributed=True, max_passes=1)


def test_minibatch_run_continues_exactly_from_its_result():
    """Passes are cut into the same rounds whatever the chunks: a split at a round boundary continues exactly."""
    model, data = random_chain_problem(n=10, seed=4)
    for sampling in ("uniform", "perm", "gap"):
        whole = fit(model, data, 0.1, batch_size=3, sampling=sampling, max_passes=7, gap_check=2)
        for split in (3, 3.6):  # 3.6 passes: 36 blocks, the end of a round of the cut 3 + 3 + 2 + 2
            first = fit(model, data, 0.1, batch_size=3, sampling=sampling, max_passes=split, gap_check=2)
            assert first.counters["work"] == round(10 * split)
            rest = fit(model, data, 0.1, batch_size=3, sampling=sampling, max_passes=7 - split, gap_check=2,
                       init=first)
            assert torch.equal(whole.w, rest.w) and torch.equal(whole.w_avg, rest.w_avg)
            assert whole.history[-1].gap_last == rest.history[-1].gap_last
        cut = fit(model, data, 0.1, batch_size=3, sampling=sampling, max_passes=3.5, gap_check=2)
        assert cut.counters["work"] == 36  # a chunk ending inside a round finishes it


@pytest.mark.heavy  # a slower check: the run of the fast tier stays under 5 minutes cold
def test_rounds_on_pose_trees_and_matchings_reach_the_optimum():
    """The other structures (dense states, box constraints of the pose model) through the generic rounds."""
    from test_matching import random_problem as matching_problem
    from test_pose import TINY, G, _tiny_data

    from torch_bcfw.models import Matching
    from torch_bcfw.models.pose import PoseTree, mean_offsets

    pose = _tiny_data(n=6, seed=4)
    problems = [(PoseTree(G, mean_offsets(pose.positions, pose.visible, TINY), n_joints=3, n_unary=2, edges=TINY),
                 pose, 0.2),
                (Matching(3), matching_problem(n=6, seed=2), 0.1)]
    for model, data, lam in problems:
        ref = fit(model, data, lam, preset="uniform-pairwise", max_passes=300, gap_tol=1e-6, gap_check=50)
        r = fit(model, data, lam, batch_size=3, max_passes=300, gap_tol=1e-3, gap_check=50, seed=1)
        g = r.history[-1].gap
        assert g <= 0.05, type(model).__name__
        best = min(r.primal, r.history[-1].primal_avg)
        assert abs(best - ref.primal) <= g + ref.gap + 1e-12  # both certificates bracket the same optimum
        # a round of every block with the line search is the batch Frank-Wolfe step
        full = fit(model, data, lam, batch_size=len(data), max_passes=40, gap_check=10, averaging=False)
        fw = fit(model, data, lam, solver="fw", max_passes=40, gap_check=10, averaging=False)
        assert torch.allclose(full.w, fw.w, atol=1e-10)
        assert [h.gap_last for h in full.history] == pytest.approx([h.gap_last for h in fw.history], abs=1e-10)
