"""Property-based tests (hypothesis): random tiny problems, solvers and options, every certificate checked
against brute-force enumeration.

Each example draws a small problem -- a chain (``Chain`` + ``SequenceData``: 2-3 labels, lengths 1-3, 2-5
sequences), a multiclass problem (``Multiclass`` + ``MulticlassData``) or binary graph cuts (``GraphCut`` +
``GraphData``: 1-4 nodes per graph with random edges, ``processes=1``) -- a log-uniform ``lam`` in [1e-3, 1],
a solver and options valid for it (sampling, step rule, cache, step, averaging, gap check, a few passes,
seed...), and checks:

1. the primal values of the last history record are ``P`` (by enumeration) of the returned weights
   (``result.primal`` vs ``P(result.weights)``, ``primal`` vs ``P(result.w)``, ``primal_avg`` vs
   ``P(result.w_avg)``), to 1e-9 relative;
2. every dual value of every record is ``<= P*`` (bounded above by ``min P(w)`` over candidate ``w``: the
   solution of the primal QP over all enumerated labelings by ``scipy``'s SLSQP, projected on the model's
   box, and the returned iterates; a long cold BCFW run when scipy is missing);
3. every gap is ``>= -1e-12`` and equals primal minus dual (``gap = min(primal, primal_avg) -
   max(dual, dual_avg)``), recomputed here;
4. warm starts on perturbed features (same labels; graph cuts: node features) are refused with
   ``ValueError("... features differ ...")`` exactly when the dual state cannot re-derive itself (the dense state
   of ``Multiclass``), and otherwise certify 1-3 on the new data;
5. a Ctrl-C (``KeyboardInterrupt`` from ``Callback.on_chunk``) at a random chunk stops the run with
   ``stopped_by == "interrupted"`` and 1-3 hold; continuing the interrupted run ends as the uninterrupted one;
6. ``fit(a + b passes)`` equals ``fit(a)`` -> ``save`` -> ``FitResult.load`` -> ``fit(b, init=...)`` bit for bit
   (weights, averages, every history value but the timings and the check count) for BCFW (plain and refined),
   FW, MP-BCFW (and SSG at whole passes), splits within a pass included; graph cuts (whose blocks read from a file
   count at the ground truth until steps replace them) in weights, averages and primal values, their certified
   duals at most the in-process resume's and their gaps at least its and ``>= 0``.

Defects these properties found are pinned by deterministic regression tests at the end (each names the property
that found it).

Profiles: ``ci`` (default: few examples, derandomized so that CI is reproducible) and ``thorough``
(500 examples per test, random).  Run it longer with::

    TORCH_BCFW_HYPOTHESIS_PROFILE=thorough pytest tests/test_properties.py

(``TORCH_BCFW_HYPOTHESIS_EXAMPLES=N`` overrides the number of examples of either profile).
"""
from __future__ import annotations

import math
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, event, given, note, settings
from hypothesis import strategies as st

from conftest import brute_force_primal, enumerate_labelings
from torch_bcfw import FitResult, fit
from torch_bcfw.data import GraphData, MulticlassData, SequenceData
from torch_bcfw.models import Chain, GraphCut, Multiclass
from torch_bcfw.solvers.bcfw_options import variant_name
from torch_bcfw.solvers.callbacks import Callback

pytestmark = pytest.mark.usefixtures("one_torch_thread")

# ---------------------------------------------------------------------------------------------- profiles
_COMMON = dict(deadline=None, print_blob=True, database=None,
               suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much])
settings.register_profile("ci", max_examples=30, derandomize=True, **_COMMON)
settings.register_profile("thorough", max_examples=500, **_COMMON)
PROFILE = os.environ.get("TORCH_BCFW_HYPOTHESIS_PROFILE", "ci")
_EXAMPLES = os.environ.get("TORCH_BCFW_HYPOTHESIS_EXAMPLES")


def _settings(**overrides):
    """The selected profile as a decorator (local to this module: the global hypothesis profile is left alone)."""
    kw = dict(overrides)
    if _EXAMPLES:
        kw["max_examples"] = int(_EXAMPLES)
    return settings(settings.get_profile(PROFILE), **kw)


REL = 1e-9  # property 1: reported primal vs enumeration, relative
DUAL_TOL = 1e-9  # property 2: dual <= P* bound + DUAL_TOL
GAP_TOL = 1e-12  # property 3: gap >= -GAP_TOL


# ---------------------------------------------------------------------------------------------- problems
@dataclass
class Problem:
    kind: str
    model: object
    data: object
    lam: float
    parts: dict = field(repr=False)  # per-example tensors, to rebuild the data with other features

    def perturbed(self, seed: int, scale: float):
        """The same labels (and graphs) with features + Gaussian noise.  Graph cuts: node features only (other
        edge features are refused: ``test_graphcut_warm_start_on_other_edge_features``)."""
        g = torch.Generator().manual_seed(seed)
        noise = lambda t: t + scale * torch.randn(t.shape, generator=g, dtype=torch.float64)  # noqa: E731
        p = self.parts
        if self.kind == "chain":
            return SequenceData.from_sequences([noise(x) for x in p["xs"]], p["ys"])
        if self.kind == "multiclass":
            return MulticlassData(noise(p["x"]), p["y"])
        return GraphData.from_graphs([noise(x) for x in p["xs"]], p["es"], p["exs"], p["ys"], p["ws"])


def _features(draw, g, shape):
    style = draw(st.sampled_from(["gauss", "gauss", "gauss", "integer", "zero"]))
    if style == "gauss":
        scale = draw(st.sampled_from([0.3, 1.0, 3.0]))
        return scale * torch.randn(shape, generator=g, dtype=torch.float64)
    if style == "integer":  # many ties in the oracles
        return torch.randint(-1, 2, shape, generator=g).double()
    return torch.zeros(shape, dtype=torch.float64)


def _labels(draw, K, length):
    return torch.tensor(draw(st.lists(st.integers(0, K - 1), min_size=length, max_size=length)), dtype=torch.long)


@st.composite
def problems(draw, kinds=("chain", "multiclass", "graphcut")):
    kind = draw(st.sampled_from(kinds))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    n = draw(st.integers(2, 5))
    if kind == "chain":
        K, F = draw(st.integers(2, 3)), draw(st.integers(1, 3))
        lengths = draw(st.lists(st.integers(1, 3), min_size=n, max_size=n))
        xs = [_features(draw, g, (L, F)) for L in lengths]
        ys = [_labels(draw, K, L) for L in lengths]
        model, data, parts = Chain(F, K), SequenceData.from_sequences(xs, ys), {"xs": xs, "ys": ys}
    elif kind == "multiclass":
        K, F = draw(st.integers(2, 4)), draw(st.integers(1, 3))
        x, y = _features(draw, g, (n, F)), _labels(draw, K, n)
        model, data, parts = Multiclass(F, K, bias=draw(st.booleans())), MulticlassData(x, y), {"x": x, "y": y}
    else:
        F, E = draw(st.integers(1, 2)), draw(st.integers(1, 2))
        pairwise = draw(st.booleans() | st.just(True))
        xs, es, exs, ys = [], [], [], []
        for _ in range(n):
            N = draw(st.integers(1, 4))
            pairs = [(a, b) for a in range(N) for b in range(a + 1, N)]
            keep = draw(st.lists(st.booleans(), min_size=len(pairs), max_size=len(pairs)))
            chosen = [pq for pq, k in zip(pairs, keep) if k] or pairs[:1]  # at least one edge when N >= 2
            xs.append(_features(draw, g, (N, F)))
            es.append(torch.tensor(chosen, dtype=torch.long).reshape(-1, 2))
            exs.append(torch.rand(len(chosen), E, generator=g, dtype=torch.float64))
            ys.append(_labels(draw, 2, N))
        ws = None
        if draw(st.booleans()):
            ws = [0.2 + torch.rand(x.shape[0], generator=g, dtype=torch.float64) for x in xs]
        loss = draw(st.sampled_from(["hamming", "balanced"]))
        model = GraphCut(F, E, loss=loss, pairwise=pairwise, processes=1)
        data = GraphData.from_graphs(xs, es, exs, ys, ws)
        parts = {"xs": xs, "es": es, "exs": exs, "ys": ys, "ws": ws}
    lam = 10.0 ** draw(st.floats(-3.0, 0.0))
    return Problem(kind, model, data, lam, parts)


# ---------------------------------------------------------------------------------------------- solvers
ALL_SOLVERS = ("bcfw", "fw", "ssg", "mp-bcfw")


def _allowed(problem: Problem, solvers):
    # SSG has no box constraints: not for graph cuts with (non-negative) pairwise weights
    return [s for s in solvers if not (s == "ssg" and problem.model.weight_bounds() is not None)]


@st.composite
def solver_options(draw, problem: Problem, solvers=ALL_SOLVERS, resumable=False):
    """``(solver, options)``: options valid for the solver.  ``resumable``: nothing that depends on the clock
    (``preset="auto"``, ``mp_clock="wall"``) or stops early (``gap_tol``), integer passes for FW."""
    solver = draw(st.sampled_from(_allowed(problem, solvers)))
    o = {"gap_check": draw(st.integers(1, 4)), "seed": draw(st.integers(0, 2**32 - 1)),
         "averaging": draw(st.booleans()), "check_averaged": draw(st.booleans() | st.just(True)),
         "track_train_loss": draw(st.booleans())}
    if solver == "bcfw":
        if not resumable and draw(st.integers(0, 9)) == 0:
            o["preset"] = "auto"
        elif draw(st.booleans()):
            o["preset"] = draw(st.sampled_from(["uniform", "perm", "gap", "pairwise", "away", "gap-pairwise",
                                                "gap-away", "gap-fw-cache", "gap-pairwise-cache", "perm-away-cache",
                                                "uniform-pairwise-cache"]))
        else:
            o["sampling"] = draw(st.sampled_from(["uniform", "perm", "gap"]))
            o["step_rule"] = draw(st.sampled_from(["fw", "pairwise", "away"]))
            o["cache"] = draw(st.booleans())
            if o["step_rule"] == "fw" and not o["cache"]:
                o["step"] = draw(st.sampled_from(["line_search", "fixed"]))
        if draw(st.booleans()):  # the knobs of the refinements (harmless for plain BCFW)
            o["cache_size"] = draw(st.integers(1, 4))
            o["cache_F"] = draw(st.sampled_from([0.0625, 0.25, 1.0, math.inf]))
            o["cache_nu"] = draw(st.sampled_from([1e-4, 0.01, 1.0]))
            o["gap_power"] = draw(st.sampled_from([0.5, 1.0, 2.0]))
    elif solver == "fw":
        o["step"] = draw(st.sampled_from(["line_search", "fixed"]))
    elif solver == "ssg":
        o["sampling"] = draw(st.sampled_from(["uniform", "perm"]))
    else:
        o["sampling"] = draw(st.sampled_from(["uniform", "perm"]))
        o["mp_max_planes"] = draw(st.sampled_from([0, 1, 2, 1000]))
        if o["mp_max_planes"] == 0:
            o["step"] = draw(st.sampled_from(["line_search", "fixed"]))
        o["mp_inactive_iters"] = draw(st.sampled_from([0, 1, 3, 10]))
        o["mp_max_approx_passes"] = draw(st.sampled_from([0, 1, 3, 1000]))
        o["mp_approx_ratio"] = draw(st.sampled_from([0.0, 0.5, 1.0, math.inf]))
        o["mp_clock"] = draw(st.sampled_from(["auto", "work"] if resumable else ["auto", "work", "wall"]))
    if not resumable and solver != "ssg" and draw(st.integers(0, 4)) == 0:
        o["gap_tol"] = draw(st.sampled_from([1e-6, 1e-3, 0.1]))
        if draw(st.booleans()) and solver == "bcfw":
            o["early_gap_check"] = 0.8
    return solver, o


def _passes(draw, solver, n, lo=1, hi=8, fractions=("bcfw", "mp-bcfw", "ssg")):
    """A number of passes: whole, or (for the solvers in ``fractions``; never FW, whose iterations are whole
    passes) a fraction k / n."""
    if solver in fractions and draw(st.booleans()):
        return draw(st.integers(lo * n, hi * n)) / n
    return float(draw(st.integers(lo, hi)))


# ---------------------------------------------------------------------------------------------- enumeration
class Enumerated:
    """Every labeling of every example: ``P(w)`` in closed form and an upper bound on ``P*``."""

    def __init__(self, problem: Problem):
        model, data = problem.model, problem.data
        self.lam, self.n = problem.lam, len(data)
        self.phi, self.loss, true = [], [], []
        for i in range(self.n):
            blk = data[[i]]
            ys = enumerate_labelings(model, data, i)
            self.phi.append(torch.stack([model.joint_feature(blk, y)[0] for y in ys]).double().numpy())
            self.loss.append(np.array([float(model.loss(blk, y)[0]) for y in ys]))
            true.append(model.joint_feature(blk, blk.y)[0].double().numpy())
        self.true = np.stack(true)
        self.d = self.true.shape[1]
        bounds = model.weight_bounds()
        self.lower = np.full(self.d, -np.inf) if bounds is None else bounds[0].double().numpy()
        self.upper = np.full(self.d, np.inf) if bounds is None else bounds[1].double().numpy()
        self._bound = None

    def primal(self, w) -> float:
        """``P(w) = lam/2 ||w||^2 + 1/n sum_i max_y [L_i(y) + <w, phi_i(y) - phi_i(y_i)>]`` by enumeration."""
        w = w.detach().cpu().double().numpy() if isinstance(w, torch.Tensor) else np.asarray(w, dtype=np.float64)
        H = [float(np.max(L + P @ w)) - float(t @ w) for P, L, t in zip(self.phi, self.loss, self.true)]
        return 0.5 * self.lam * float(w @ w) + float(np.mean(H))

    def _qp_solution(self):
        """``w`` minimising the primal QP over all enumerated constraints (SLSQP; not necessarily exact: any
        ``w`` in the box gives an upper bound on ``P*``), or ``None`` without scipy."""
        try:
            from scipy.optimize import minimize
        except ImportError:
            return None
        d, n, lam = self.d, self.n, self.lam
        rows, rhs = [], []
        for i in range(n):  # xi_i >= L_i(y) + <w, phi_i(y) - phi_i(y_i)>
            for P_y, L_y in zip(self.phi[i], self.loss[i]):
                r = np.zeros(d + n)
                r[:d] = self.true[i] - P_y
                r[d + i] = 1.0
                rows.append(r)
                rhs.append(L_y)
        A, b = np.array(rows), np.array(rhs)
        box = [(lo if np.isfinite(lo) else None, hi if np.isfinite(hi) else None)
               for lo, hi in zip(self.lower, self.upper)]
        res = minimize(lambda z: 0.5 * lam * z[:d] @ z[:d] + z[d:].mean(),
                       np.concatenate([np.zeros(d), [L.max() for L in self.loss]]),
                       jac=lambda z: np.concatenate([lam * z[:d], np.full(n, 1.0 / n)]), method="SLSQP",
                       bounds=box + [(None, None)] * n,
                       constraints=[{"type": "ineq", "fun": lambda z: A @ z - b, "jac": lambda z: A}],
                       options={"ftol": 1e-15, "maxiter": 500})
        return np.clip(res.x[:d], self.lower, self.upper)

    def optimum_bound(self, problem: Problem, *candidates) -> float:
        """An upper bound on ``P*``: ``min P(w)`` over the QP solution and ``candidates`` (iterates of the box)."""
        if self._bound is None:
            w = self._qp_solution()
            if w is None:  # no scipy: a long cold BCFW run
                w = fit(problem.model, problem.data, problem.lam, "bcfw", max_passes=3000, gap_check=50,
                        gap_tol=1e-10, track_train_loss=False).weights
            self._bound = self.primal(w)
        vals = [self._bound] + [self.primal(c) for c in candidates if c is not None]
        return min(vals)


# ---------------------------------------------------------------------------------------------- the checks
def _close(reported: float, exact: float) -> bool:
    return abs(reported - exact) <= REL * max(1.0, abs(exact))


def check_certificates(result, problem: Problem, enum: Enumerated, records=None, *, solver=None):
    """Properties 1-3 for ``result`` on ``problem`` (``records``: those certified on this data; default all)."""
    records = result.history if records is None else records
    assert records, "no certificate"
    last = result.history[-1]
    assert last is records[-1]
    # 1. reported primals = enumeration at the returned weights
    assert _close(last.primal, enum.primal(result.w)), (last.primal, enum.primal(result.w))
    if last.primal_avg is not None:
        assert result.w_avg is not None
        assert _close(last.primal_avg, enum.primal(result.w_avg)), (last.primal_avg, enum.primal(result.w_avg))
    assert _close(result.primal, enum.primal(result.weights))
    assert result.primal == min(p for p in (last.primal, last.primal_avg) if p is not None)
    has_dual = (solver or result.solver) != "ssg"
    # 2. no dual value above P*
    bound = enum.optimum_bound(problem, result.w, result.w_avg)
    for rec in records:
        for key in ("dual", "dual_avg"):
            if getattr(rec, key) is not None:
                assert has_dual
                assert getattr(rec, key) <= bound + DUAL_TOL, f"{key} = {getattr(rec, key)!r} > P* <= {bound!r} at {rec.passes} passes"
    # 3. gaps: primal - dual, recomputed, and >= 0 up to rounding
    for rec in records:
        for p, d, g in (("primal", "dual", "gap_last"), ("primal_avg", "dual_avg", "gap_avg")):
            if getattr(rec, d) is None:
                assert getattr(rec, g) is None
                continue
            assert getattr(rec, g) == pytest.approx(getattr(rec, p) - getattr(rec, d), rel=1e-12, abs=1e-15)
            assert getattr(rec, g) >= -GAP_TOL
        duals = [v for v in (rec.dual, rec.dual_avg) if v is not None]
        if not duals:
            assert rec.gap is None
            continue
        best = min(v for v in (rec.primal, rec.primal_avg) if v is not None) - max(duals)
        assert rec.gap == pytest.approx(best, rel=1e-12, abs=1e-15)
        assert rec.gap >= -GAP_TOL
    if has_dual:
        assert result.gap == last.gap
    else:
        assert result.gap is None


def _describe(problem, solver, options):
    event(f"{problem.kind} / {solver}")
    note(f"problem: {problem.kind} n={len(problem.data)} lam={problem.lam!r} model={problem.model.config()}")
    note(f"data: {problem.parts}")
    note(f"fit(..., solver={solver!r}, **{options!r})")


# ---------------------------------------------------------------------------------------------- 1-3
@_settings()
@given(data=st.data())
def test_certificates_match_enumeration(data):
    problem = data.draw(problems(), label="problem")
    solver, options = data.draw(solver_options(problem), label="solver/options")
    options["max_passes"] = _passes(data.draw, solver, len(problem.data))
    _describe(problem, solver, options)
    result = fit(problem.model, problem.data, problem.lam, solver, **options)
    enum = Enumerated(problem)
    assert enum.primal(result.weights) == pytest.approx(
        brute_force_primal(problem.model, problem.data, result.weights, problem.lam), rel=1e-12, abs=1e-12)
    check_certificates(result, problem, enum)
    assert result.stopped_by in ("max_passes", "gap_tol", "converged")
    if result.stopped_by == "gap_tol":
        assert result.gap <= options["gap_tol"]
    assert result.passes <= options["max_passes"] + 1e-12


# ---------------------------------------------------------------------------------------------- 4
@_settings()
@given(data=st.data())
def test_warm_start_on_perturbed_features(data):
    problem = data.draw(problems(), label="problem")
    solver, options = data.draw(solver_options(problem), label="solver/options")
    options.pop("gap_tol", None)
    options.pop("early_gap_check", None)
    first_passes = _passes(data.draw, solver, len(problem.data), 1, 5)
    second_passes = _passes(data.draw, solver, len(problem.data), 1, 5)
    scale = data.draw(st.sampled_from([1e-3, 0.1, 1.0]), label="noise scale")
    other = Problem(problem.kind, problem.model, problem.perturbed(data.draw(st.integers(0, 2**31 - 1)), scale),
                    problem.lam, problem.parts)
    _describe(problem, solver, options)
    note(f"passes {first_passes} then {second_passes} on features + {scale} noise")
    first = fit(problem.model, problem.data, problem.lam, solver, max_passes=first_passes, **options)
    rebindable = solver == "ssg" or problem.model.dual_state(problem.data, problem.lam).rebindable
    if not rebindable:
        with pytest.raises(ValueError, match="features differ"):
            fit(problem.model, other.data, problem.lam, solver, max_passes=second_passes, init=first, **options)
        return
    if options.get("preset") == "auto":
        # "auto" measures the oracle again in the second call and may choose another combination, whose state
        # cannot continue this one (documented): give the combination the first call chose
        options["preset"] = variant_name(first.options)
    second = fit(problem.model, other.data, problem.lam, solver, max_passes=second_passes, init=first, **options)
    new = second.history[len(first.history):]
    assert new, "the warm start certified nothing on the new data"
    assert second.history[:len(first.history)] == first.history
    check_certificates(second, other, Enumerated(other), new)


# ---------------------------------------------------------------------------------------------- same run
# timings, and the cost of the checks (the first run of a split pays one more final check at the split)
_TIMINGS = {"solver_time", "gap_time", "exact_time", "approx_time", "gap_oracle_calls"}


def _values(history):
    return [{k: v for k, v in rec.to_dict().items() if k not in _TIMINGS} for rec in history]


def assert_same_run(rest, whole, part):
    """``rest`` (a warm start from ``part``) ends exactly as ``whole`` (one run): bit for bit."""
    assert torch.equal(rest.w, whole.w)
    assert (rest.w_avg is None) == (whole.w_avg is None)
    if whole.w_avg is not None:
        assert torch.equal(rest.w_avg, whole.w_avg)
    got, want = _values(rest.history), _values(whole.history)
    if got != want:
        # the first run ends with a check at the split, which the uninterrupted run has only when one of its checks
        # falls there (scheduled, or asked for by gap sampling): the one difference allowed (documented)
        k = len(part.history) - 1
        assert got[k] == _values(part.history)[k]
        del got[k]
        assert got == want
    assert rest.stopped_by == whole.stopped_by


# ---------------------------------------------------------------------------------------------- 5
class CtrlCAt(Callback):
    def __init__(self, chunk: int):
        self.chunk, self.seen, self.fired = chunk, 0, False

    def on_chunk(self, passes, elapsed):
        self.seen += 1
        if self.seen == self.chunk:
            self.fired = True
            raise KeyboardInterrupt


@_settings()
@given(data=st.data())
def test_interrupt_at_a_random_chunk(data):
    problem = data.draw(problems(), label="problem")
    solver, options = data.draw(solver_options(problem), label="solver/options")
    chunk = data.draw(st.integers(1, 6), label="interrupted chunk")
    options["max_passes"] = float(max(1, chunk + data.draw(st.integers(-1, 3))))  # mostly long enough for the Ctrl-C
    _describe(problem, solver, options)
    cb = CtrlCAt(chunk)
    result = fit(problem.model, problem.data, problem.lam, solver, callbacks=[cb], **options)
    if cb.fired:
        assert result.stopped_by == "interrupted"
        # the returned iterate is the one at the interrupt, certified by a final check
        assert result.history[-1].steps == result.solver_state.get("steps", result.history[-1].steps)
    else:
        assert result.stopped_by in ("max_passes", "gap_tol", "converged")
    check_certificates(result, problem, Enumerated(problem))
    # an interrupted run continues as if it had not been interrupted (when its options do not read the clock), also
    # when the interrupt lands where a scheduled check was due (test_resume_after_ctrl_c_at_a_scheduled_check)
    resumable = not (options.get("preset") == "auto" or options.get("mp_clock") == "wall" or "gap_tol" in options)
    n = len(problem.data)
    work = result.counters["work"]
    left = int(round(options["max_passes"] * n)) - work
    if cb.fired and resumable and left > 0:
        event("interrupted run resumed")
        rest = fit(problem.model, problem.data, problem.lam, solver, init=result, **dict(options, max_passes=left / n))
        whole = fit(problem.model, problem.data, problem.lam, solver, **options)
        assert_same_run(rest, whole, result)


# ---------------------------------------------------------------------------------------------- 6
@_settings()
@given(data=st.data())
def test_resume_after_save_and_load_is_exact(data):
    problem = data.draw(problems(), label="problem")
    solver, options = data.draw(solver_options(problem, resumable=True), label="solver/options")
    n = len(problem.data)
    # splits within a pass too (test_ssg_resume_within_a_pass_keeps_the_check_schedule)
    a = _passes(data.draw, solver, n, 1, 5, fractions=("bcfw", "mp-bcfw", "ssg"))
    b = _passes(data.draw, solver, n, 1, 5, fractions=("bcfw", "mp-bcfw", "ssg"))
    _describe(problem, solver, options)
    note(f"fit({a} + {b}) vs fit({a}) -> save -> load -> fit({b}, init=...)")
    m, d, lam = problem.model, problem.data, problem.lam
    whole = fit(m, d, lam, solver, max_passes=a + b, **options)
    part = fit(m, d, lam, solver, max_passes=a, **options)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "part.pt"
        part.save(path)
        loaded = FitResult.load(path)
    rest = fit(loaded.model, d, lam, solver, max_passes=b, init=loaded, **options)
    if problem.kind != "graphcut":
        assert_same_run(rest, whole, part)
        return
    honest = fit(m, d, lam, solver, max_passes=b, init=part, **options)  # this process' own result: trusted
    assert_same_run(honest, whole, part)
    assert torch.equal(rest.w, honest.w) and len(rest.history) == len(honest.history)
    certified = {"dual", "gap", "gap_last"}
    for got, want in zip(_values(rest.history), _values(honest.history)):
        assert {k: v for k, v in got.items() if k not in certified} == {
            k: v for k, v in want.items() if k not in certified}
        if want.get("dual") is not None:
            assert got["dual"] <= want["dual"] + 1e-12 * (1 + abs(want["dual"]))
            assert got["gap"] >= max(want["gap"] - 1e-12 * (1 + abs(want["gap"])), -GAP_TOL)


def test_ssg_resume_within_a_pass_keeps_the_check_schedule():
    from conftest import random_multiclass_problem

    model, data = random_multiclass_problem(n=3, seed=0)
    whole = fit(model, data, 0.1, "ssg", max_passes=4 / 3 + 2, gap_check=1)
    part = fit(model, data, 0.1, "ssg", max_passes=4 / 3, gap_check=1)
    rest = fit(model, data, 0.1, "ssg", max_passes=2, gap_check=1, init=part)
    assert torch.equal(rest.w, whole.w)
    # whole: checks at 1, 2, 3 and 3.33 passes; rest: 1, 1.33 (the split), then only 3.33
    assert [r.passes for r in rest.history if r.passes != 4 / 3] == [r.passes for r in whole.history]


def test_graphcut_warm_start_on_other_edge_features():
    xs = [torch.zeros(3, 1, dtype=torch.float64), torch.tensor([[-0.6536], [0.1705]], dtype=torch.float64)]
    es = [torch.tensor([[0, 1]]), torch.tensor([[0, 1]])]
    exs = [torch.tensor([[0.9701, 0.7078]], dtype=torch.float64), torch.tensor([[0.6450, 0.7911]], dtype=torch.float64)]
    ys = [torch.tensor([0, 0, 0]), torch.tensor([0, 0])]
    model, lam = GraphCut(1, 2, processes=1), 0.03
    data = GraphData.from_graphs(xs, es, exs, ys)
    other = GraphData.from_graphs(xs, es, [3.0 * e for e in exs], ys)  # same graphs, labels, node features
    first = fit(model, data, lam, max_passes=2, gap_check=1)
    with pytest.raises(ValueError, match="edge features or node weights differ"):
        fit(model, other, lam, max_passes=1, gap_check=1, init=first)
    moved = GraphData.from_graphs([x + 1.0 for x in xs], es, exs, ys)  # node features only: re-derived exactly
    second = fit(model, moved, lam, max_passes=1, gap_check=1, init=first)
    problem = Problem("graphcut", model, moved, lam, {})
    check_certificates(second, problem, Enumerated(problem), second.history[len(first.history):])


def test_resume_at_a_converged_point_adds_no_record():
    model = Multiclass(1, 2, bias=False)
    data = MulticlassData(torch.tensor([[0.4623], [-0.0880]], dtype=torch.float64), torch.tensor([0, 0]))
    kw = dict(gap_check=1, seed=0, averaging=False, track_train_loss=False, preset="gap")
    whole = fit(model, data, 1.0, max_passes=2, **kw)
    part = fit(model, data, 1.0, max_passes=1, **kw)
    rest = fit(model, data, 1.0, max_passes=1, init=part, **kw)
    assert whole.stopped_by == rest.stopped_by == "converged"
    assert _values(rest.history) == _values(whole.history)


@pytest.mark.parametrize("kw", [{}, {"preset": "gap"}], ids=["plain", "gap"])
def test_resume_after_ctrl_c_at_a_scheduled_check(kw):
    from conftest import random_chain_problem

    model, data = random_chain_problem(n=5, F=3, K=3, max_len=3, seed=1)
    options = dict(max_passes=8, gap_check=2, **kw)
    part = fit(model, data, 0.01, callbacks=[CtrlCAt(2)], **options)  # Ctrl-C after pass 2: a check is due
    assert part.stopped_by == "interrupted" and part.counters["work"] == 2 * len(data)
    rest = fit(model, data, 0.01, init=part, **dict(options, max_passes=6))
    assert_same_run(rest, fit(model, data, 0.01, **options), part)
