"""The dual extragradient solver: the projection onto the matching polytope against a brute-force QP and its KKT
conditions, the entropic prox step against enumeration, feasible iterates, the enumerated optimum on tiny chains and
matchings with exact certificates, the memory-efficient form against the full one, exact resume, clear errors."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from conftest import (brute_force_primal, enumerate_labelings, partial_matchings, random_chain_problem,
                      random_multiclass_problem)
from torch_bcfw import FitResult, fit
from torch_bcfw.inference.forward_backward import chain_marginals, shared_transition_marginals
from torch_bcfw.inference.matching_projection import PAD_VALUE, capped_simplex_threshold, project_matching_polytope
from torch_bcfw.data import MatchingData
from torch_bcfw.models import Matching
from torch_bcfw.solvers.extragradient import Extragradient, lipschitz_constant
from torch_bcfw.solvers.options import SolverOptions

LAM = 0.05

pytestmark = pytest.mark.usefixtures("one_torch_thread")


# ----------------------------------------------------------------------------- helpers
def matching_problem(n=5, F=3, seed=0, signal=1.5):
    """Tiny pairs (2-3 words a side) whose first link feature is informative (``w* != 0``)."""
    g = torch.Generator().manual_seed(seed)
    xs, ys = [], []
    for _ in range(n):
        m, f = torch.randint(2, 4, (2,), generator=g).tolist()
        links = partial_matchings(m, f)
        y = torch.zeros(m, f, dtype=torch.long)
        for j, k in links[int(torch.randint(len(links), (1,), generator=g))]:
            y[j, k] = 1
        x = torch.randn(m, f, F, generator=g, dtype=torch.float64)
        x[:, :, 0] += signal * y
        xs.append(x)
        ys.append(y)
    return Matching(F), MatchingData.from_pairs(xs, ys)


def matching_primal(model, data, w, lam):
    """``P(w)`` by enumerating every partial matching, from the definitions (no model code)."""
    total = 0.0
    for i in range(len(data)):
        m, f = (int(v) for v in data.sizes[i])
        X = data.pair_matrix(data.x, i).to(torch.float64)
        Y = data.pair_matrix(data.y, i)
        truth = {(j, k) for j in range(m) for k in range(f) if Y[j, k]}
        Z = m + f

        def value(links, aug):
            v = sum(float(X[j, k] @ w) for j, k in links) / Z
            if aug:
                v += (model.extra_cost * len(set(links) - truth) + model.miss_cost * len(truth - set(links))) / Z
            return v

        total += max(value(M, True) for M in partial_matchings(m, f)) - value(tuple(truth), False)
    return 0.5 * lam * float(w @ w) + total / len(data)


def matching_dual_pair(model, data, z, lam):
    """``(A(z), b(z))`` of link marginals ``z`` from the definitions: ``w = 1/(lam n) sum_i (phi_i(y_i) - phi_i(z_i))``,
    ``l = 1/n sum_i E_z[L_i]``."""
    n = len(data)
    A = torch.zeros(data.n_inputs, dtype=torch.float64)
    b = 0.0
    for i in range(n):
        m, f = (int(v) for v in data.sizes[i])
        X = data.pair_matrix(data.x, i).reshape(m * f, -1).to(torch.float64)
        y = data.pair_matrix(data.y, i).reshape(-1).to(torch.float64)
        zi = data.pair_matrix(z, i).reshape(-1)
        A += X.T @ (y - zi) / (m + f)
        b += float(model.extra_cost * (zi * (1 - y)).sum() + model.miss_cost * ((1 - zi) * y).sum()) / (m + f)
    return A / (lam * n), b / n


def padded(mats):
    M = max(a.shape[0] for a in mats)
    F = max(a.shape[1] for a in mats)
    out = torch.full((len(mats), M, F), PAD_VALUE, dtype=torch.float64)
    for b, a in enumerate(mats):
        out[b, : a.shape[0], : a.shape[1]] = a
    return out


def slsqp_projection(a: np.ndarray) -> np.ndarray:
    from scipy.optimize import minimize

    m, f = a.shape
    cons = [{"type": "ineq", "fun": (lambda z, j=j: 1 - z.reshape(m, f)[j].sum())} for j in range(m)] + \
           [{"type": "ineq", "fun": (lambda z, k=k: 1 - z.reshape(m, f)[:, k].sum())} for k in range(f)]
    res = minimize(lambda z: 0.5 * ((z - a.ravel()) ** 2).sum(), np.full(m * f, 0.0), jac=lambda z: z - a.ravel(),
                   bounds=[(0, None)] * (m * f), constraints=cons, method="SLSQP",
                   options={"ftol": 1e-16, "maxiter": 2000})
    return res.x.reshape(m, f)


# ----------------------------------------------------------------------------- the matching projection
def test_capped_simplex_threshold_against_bisection():
    g = torch.Generator().manual_seed(0)
    v = torch.randn(50, 7, generator=g, dtype=torch.float64) * 2
    tau = capped_simplex_threshold(v)
    for row, t in zip(v, tau):
        lo, hi = 0.0, float(row.abs().max()) + 2
        if float(row.clamp_min(0).sum()) <= 1:
            assert float(t) == 0.0
            continue
        for _ in range(200):
            mid = 0.5 * (lo + hi)
            lo, hi = (mid, hi) if float((row - mid).clamp_min(0).sum()) > 1 else (lo, mid)
        assert float(t) == pytest.approx(lo, abs=1e-12)


def test_projection_equals_a_brute_force_qp_and_satisfies_kkt():
    g = torch.Generator().manual_seed(1)
    shapes = [(1, 1), (1, 3), (2, 2), (2, 3), (3, 2), (3, 3), (2, 4)]
    for scale in (0.3, 1.0, 5.0):
        mats = [torch.randn(*s, generator=g, dtype=torch.float64) * scale + 0.3 for s in shapes]
        res = project_matching_polytope(padded(mats), tol=1e-10)
        assert bool((res.dist <= 1e-10).all())
        for b, a in enumerate(mats):
            m, f = a.shape
            z = res.z[b, :m, :f]
            assert bool((res.z[b, m:] == 0).all()) and bool((res.z[b, :, f:] == 0).all())  # padding untouched
            assert float(z.min()) >= 0 and float(z.sum(1).max()) <= 1 + 1e-12 and float(z.sum(0).max()) <= 1 + 1e-12
            ref = slsqp_projection(a.numpy())
            assert np.abs(ref - z.numpy()).max() < 1e-6
            ref_obj = 0.5 * float(((torch.from_numpy(ref) - a) ** 2).sum())  # SLSQP's point may be infeasible by ~1e-13
            assert 0.5 * float(((z - a) ** 2).sum()) <= ref_obj + 1e-12 * (1 + ref_obj)
            # KKT: z = max(0, a - p_j - q_k), p, q >= 0, complementary slackness
            p, q = res.p[b, :m], res.q[b, :f]
            assert bool((p >= 0).all()) and bool((q >= 0).all())
            assert torch.allclose(z, (a - p[:, None] - q[None, :]).clamp_min(0), atol=1e-10)
            assert float((p * (1 - z.sum(1))).abs().max()) < 1e-10
            assert float((q * (1 - z.sum(0))).abs().max()) < 1e-10


def test_projection_is_exact_at_any_scale_with_and_without_warm_starts():
    g = torch.Generator().manual_seed(2)
    sizes = torch.randint(3, 13, (20, 2), generator=g)
    for scale in (0.05, 3.0, 300.0):
        mats = [torch.randn(int(m), int(f), generator=g, dtype=torch.float64) * scale for m, f in sizes]
        a = padded(mats)
        cold = project_matching_polytope(a, tol=1e-9)
        a2 = torch.where(a > PAD_VALUE / 2, a * 1.01 + 0.01, a)
        warm = project_matching_polytope(a2, cold.p, cold.q, tol=1e-9)
        for res, pts in ((cold, a), (warm, a2)):
            assert bool((res.dist <= 1e-9).all())
            z = res.z
            assert float(z.min()) >= 0 and float(z.sum(2).max()) <= 1 + 1e-12 and float(z.sum(1).max()) <= 1 + 1e-12
            real = pts > PAD_VALUE / 2
            kkt = (torch.where(real, pts, torch.zeros_like(pts)) - res.p[:, :, None] - res.q[:, None, :]).clamp_min(0)
            assert float((kkt - z).abs().max()) <= 1e-9 * max(1.0, scale)


# ----------------------------------------------------------------------------- the entropic prox and the constants
def test_entropic_prox_is_the_gibbs_distribution_by_enumeration():
    model, data = random_chain_problem(n=3, F=2, K=3, max_len=3, seed=4)
    alg = Extragradient(model, data, LAM, SolverOptions())
    g = torch.Generator().manual_seed(0)
    W = torch.randn(model.n_features, generator=g, dtype=torch.float64)
    mu, T = alg.geo.marginals(W, 2.0, 0.7)
    for i in range(len(data)):
        blk = data[[i]]
        ys = enumerate_labelings(model, data, i)
        logp = torch.tensor([0.7 * (float(model.joint_feature(blk, y)[0] @ W) + 2.0 * float(model.loss(blk, y)[0]))
                             + float(alg.geo.centre[int(data.offsets[i]):int(data.offsets[i + 1])]
                                     .gather(1, y[:, None]).sum()) for y in ys])
        p = torch.softmax(logp, 0)
        s, e = int(data.offsets[i]), int(data.offsets[i + 1])
        mu_ref = sum(pk * model.one_hot(y) for pk, y in zip(p, ys))
        T_ref = sum(pk * model.transition_counts(blk, y)[0] for pk, y in zip(p, ys))
        assert torch.allclose(mu[s:e], mu_ref, atol=1e-12) and torch.allclose(T[i], T_ref, atol=1e-12)


def test_shared_transition_marginals_equal_the_log_space_recursions():
    _, data = random_chain_problem(n=30, F=2, K=4, max_len=6, seed=6)  # lengths 1..6
    g = torch.Generator().manual_seed(1)
    for scale in (0.1, 3.0, 30.0, 3000.0):  # the last one overflows probability space: the log-space fallback
        node = torch.randn(data.n_tokens, 4, generator=g, dtype=torch.float64) * scale
        trans = torch.randn(4, 4, generator=g, dtype=torch.float64) * scale
        _, mu_ref, T_ref = chain_marginals(node, trans, data.offsets)
        mu, T = shared_transition_marginals(node, trans, data.offsets)
        assert torch.allclose(mu, mu_ref, atol=1e-11, rtol=0) and torch.allclose(T, T_ref, atol=1e-10, rtol=0)


def test_lipschitz_constant_is_the_operator_norm_on_matchings():
    model, data = matching_problem(n=4, seed=3)
    alg = Extragradient(model, data, LAM, SolverOptions())
    n = len(data)
    Z = model.normalizers(data)[data.pair_ids()]
    B = (data.x / Z[:, None]).T / n  # d x N_links: the coupling of w and z
    d, N = B.shape
    Mop = torch.zeros(d + N, d + N, dtype=torch.float64)
    Mop[:d, :d] = LAM * torch.eye(d, dtype=torch.float64)
    Mop[:d, d:] = B
    Mop[d:, :d] = -B.T
    assert alg.lipschitz == pytest.approx(float(torch.linalg.matrix_norm(Mop, ord=2)), rel=1e-10)
    assert alg.eta == pytest.approx(1.0 / alg.lipschitz)
    assert lipschitz_constant(0.0, 2.0) == 2.0 and lipschitz_constant(3.0, 0.0) == 3.0


# ----------------------------------------------------------------------------- optimum, feasibility, certificates
def _reference(model, data):
    ref = fit(model, data, LAM, "cutting-plane", gap_tol=1e-10, gap_check=1, max_passes=500)
    assert ref.stopped_by == "gap_tol"
    return ref.history[-1].dual


def _check_history(r, p_star_upper):
    for rec in r.history:
        for key in ("", "_avg"):
            if getattr(rec, "dual" + key) is None:
                continue
            assert getattr(rec, "gap" + (key or "_last")) == pytest.approx(getattr(rec, "primal" + key) - getattr(rec, "dual" + key), abs=1e-14)
            assert getattr(rec, "gap" + (key or "_last")) >= -1e-12
            assert getattr(rec, "dual" + key) <= p_star_upper + 1e-10  # weak duality against an enumerated primal


def test_chain_reaches_the_enumerated_optimum_with_exact_certificates():
    model, data = random_chain_problem(n=5, F=3, K=2, max_len=3, seed=2)
    d_star = _reference(model, data)
    r = fit(model, data, LAM, "extragradient", max_passes=1500, gap_check=100, xg_step_scale=3.0, gap_tol=1e-9)
    p_upper = brute_force_primal(model, data, r.weights, LAM)
    _check_history(r, p_upper)
    assert r.primal == pytest.approx(p_upper, abs=1e-12)  # the certified primal is the enumerated one
    assert r.gap <= 1e-9 and r.primal - d_star <= 1e-9
    iterations = r.counters["work"] // len(data)
    assert r.history[-1].oracle_calls == 2 * len(data) * iterations  # 2 projections per example and iteration
    # the default step (1/L) converges too, more slowly
    r1 = fit(model, data, LAM, "extragradient", max_passes=1000, gap_check=250)
    gaps = [rec.gap for rec in r1.history]
    assert gaps[-1] < 1e-3 * gaps[0] and r1.primal - d_star < 1e-3


def test_chain_iterates_are_valid_marginals_and_the_dual_is_recomputed_from_them():
    model, data = random_chain_problem(n=6, F=3, K=3, max_len=4, seed=1)
    opts = SolverOptions(max_passes=15)
    alg = Extragradient(model, data, LAM, opts)
    for _ in range(15):
        alg.advance(len(data))
        mu, T = alg.current_point()
        assert bool((mu >= 0).all()) and torch.allclose(mu.sum(1), torch.ones(data.n_tokens, dtype=torch.float64))
        assert bool((T >= 0).all()) and torch.allclose(T.sum((1, 2)), (data.lengths - 1).double())
        last = data.offsets[1:] - 1
        first = data.offsets[:-1]
        seq = data.token_sequence_ids()
        not_last = torch.ones(data.n_tokens, dtype=torch.bool)
        not_last[last] = False
        not_first = torch.ones(data.n_tokens, dtype=torch.bool)
        not_first[first] = False
        out_ = torch.zeros(len(data), 3, dtype=torch.float64).index_add_(0, seq[not_last], mu[not_last])
        in_ = torch.zeros(len(data), 3, dtype=torch.float64).index_add_(0, seq[not_first], mu[not_first])
        assert torch.allclose(T.sum(2), out_, atol=1e-12) and torch.allclose(T.sum(1), in_, atol=1e-12)
        w, ell = alg.iterate()
        phi_z = model.features_from_marginals(data, mu, T.sum(0))
        w_ref = (model.joint_feature_sum(data, data.y) - phi_z) / (LAM * len(data))
        assert torch.allclose(w, w_ref, atol=1e-12)
        assert ell == pytest.approx(float(model.expected_loss(data, mu).mean()), abs=1e-14)


def test_matching_reaches_the_enumerated_optimum_with_feasible_iterates():
    model, data = matching_problem(n=5, seed=0)
    d_star = _reference(model, data)
    r = fit(model, data, LAM, "extragradient", max_passes=600, gap_check=50, gap_tol=1e-8)
    p_upper = matching_primal(model, data, r.weights, LAM)
    _check_history(r, p_upper)
    assert r.primal == pytest.approx(p_upper, abs=1e-12)
    assert float(r.weights.norm()) > 0.1  # a problem whose optimum is not w = 0
    assert r.gap <= 1e-8 and r.primal - d_star <= 1e-8
    alg = Extragradient(model, data, LAM, SolverOptions())
    alg.load_state_dict(r.solver_state)
    z = alg.current_point()
    assert float(z.min()) >= 0 and float(z.max()) <= 1
    ew, fw = data.link_words()
    for words in (ew, fw):
        deg = torch.zeros(int(words.max()) + 1, dtype=torch.float64).index_add_(0, words, z)
        assert float(deg.max()) <= 1 + 1e-12  # every word in at most one link
    A, b = matching_dual_pair(model, data, z, LAM)
    w, ell = alg.iterate()
    assert torch.allclose(w, A, atol=1e-7) and ell == pytest.approx(b, abs=1e-8)  # regenerated to xg_proj_tol
    dual = b - 0.5 * LAM * float(A @ A)
    assert dual <= matching_primal(model, data, A, LAM) + 1e-12


# ----------------------------------------------------------------------------- the memory-efficient form
def test_memory_efficient_form_equals_the_full_form():
    """A naive dual extrapolation keeping every iterate (Nesterov 2007 / Taskar et al. 2006, Fig. 3) and summing
    ``s = -sum_k G(u^k)`` explicitly gives the same iterates as the solver's O(d) form."""
    model, data = random_chain_problem(n=4, F=2, K=3, max_len=4, seed=5)
    alg = Extragradient(model, data, LAM, SolverOptions())
    eta, n, lam = alg.eta, len(data), LAM
    centre = alg.geo.centre
    phi_true = model.joint_feature_sum(data, data.y)

    def parts(w):  # -G_z(u) * n: loss-augmented part scores at w
        U, trans = model.gibbs_parts(w, data, loss_augmented=True)
        return U, trans

    def A(mu, T):
        return (phi_true - model.features_from_marginals(data, mu, T.sum(0))) / (lam * n)

    iterates = []
    for t in range(12):
        s_w = sum((-lam * (uw - A(mu, T)) for uw, mu, T in iterates),
                  torch.zeros(model.n_features, dtype=torch.float64))
        s_node = sum((parts(uw)[0] for uw, _, _ in iterates), torch.zeros_like(centre)) / n
        s_trans = sum((parts(uw)[1] for uw, _, _ in iterates), torch.zeros(3, 3, dtype=torch.float64)) / n
        v_w = eta * s_w
        _, mu_v, T_v = chain_marginals(centre + eta * s_node, eta * s_trans, data.offsets)
        Un, tn = parts(v_w)
        _, mu_u, T_u = chain_marginals(centre + eta * s_node + eta * Un / n, eta * s_trans + eta * tn / n, data.offsets)
        u_w = v_w - eta * lam * (v_w - A(mu_v, T_v))
        iterates.append((u_w, mu_u, T_u))
        alg.advance(n)
        assert torch.allclose(alg.iterate()[0], A(mu_u, T_u), atol=1e-10)
    avg = alg.averaged()[0]
    assert torch.allclose(avg, sum(A(mu, T) for _, mu, T in iterates) / len(iterates), atol=1e-10)


# ----------------------------------------------------------------------------- resume and errors
@pytest.mark.parametrize("problem", ["chain", "matching"])
def test_resume_through_save_and_load_is_exact(tmp_path, problem):
    model, data = random_chain_problem(n=6, seed=8) if problem == "chain" else matching_problem(n=4, seed=5)
    whole = fit(model, data, LAM, "extragradient", max_passes=12, gap_check=4)
    part = fit(model, data, LAM, "extragradient", max_passes=4, gap_check=4)
    part.save(tmp_path / "xg.pt")
    rest = fit(model, data, LAM, "extragradient", max_passes=8, gap_check=4, init=FitResult.load(tmp_path / "xg.pt"))
    assert torch.equal(whole.w, rest.w) and torch.equal(whole.w_avg, rest.w_avg)
    assert [r.dual for r in whole.history] == [r.dual for r in rest.history]
    assert whole.history[-1].oracle_calls == rest.history[-1].oracle_calls == 24 * len(data)


def test_errors():
    model, data = random_multiclass_problem()
    with pytest.raises(ValueError, match="neither"):
        fit(model, data, LAM, "extragradient")
    model, data = random_chain_problem()
    with pytest.raises(ValueError, match="gap sampling is a BCFW refinement"):
        fit(model, data, LAM, "extragradient", sampling="gap")
    with pytest.raises(ValueError, match="box constraints"):
        fit(model, data, LAM, "extragradient", bounds=(torch.zeros(model.n_features), None))
    for bad in ({"xg_step_scale": 0}, {"xg_step_scale": math.inf}, {"xg_proj_tol": -1.0}, {"xg_proj_iters": 0},
                {"xg_proj_iters": 2.5}):
        with pytest.raises(ValueError, match="xg_"):
            fit(model, data, LAM, "extragradient", **bad)
    r = fit(model, data, LAM, "extragradient", max_passes=2)
    with pytest.raises(ValueError, match="xg_step_scale"):
        fit(model, data, LAM, "extragradient", max_passes=2, xg_step_scale=2.0, init=r)
    other = type(data).from_sequences([data.x[int(data.offsets[i]):int(data.offsets[i + 1])] + 1.0
                                       for i in range(len(data))],
                                      [data.y[int(data.offsets[i]):int(data.offsets[i + 1])] for i in range(len(data))])
    with pytest.raises(ValueError, match="features differ"):
        fit(model, other, LAM, "extragradient", max_passes=2, init=r)
