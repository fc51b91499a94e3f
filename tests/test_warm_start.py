"""Warm starts on changed features never certify a dual value above the optimum of the new problem.

``fit(model, data2, init=result_on_data1)`` with the same labels but other features: a state that keeps
its dual variables re-derives ``w = A(x2) alpha``; a state that keeps only feature-space images refuses.
Every certificate after the warm start is checked against brute-force enumeration.
"""
from __future__ import annotations

import pytest
import torch

from conftest import brute_force_primal, random_chain_problem, random_multiclass_problem
from torch_bcfw import fit
from torch_bcfw.data import GraphData, MulticlassData, SequenceData
from torch_bcfw.duals import ActiveSetDualState
from torch_bcfw.models import GraphCut, Multiclass

LAM = 0.05


class ActiveSetMulticlass(Multiclass):
    """Multiclass with the explicit active-set state (rebindable) instead of the dense one."""

    def dual_state(self, data, lam):
        return ActiveSetDualState(self, data, lam)


def _perturbed(data, seed):
    g = torch.Generator().manual_seed(seed)
    if isinstance(data, MulticlassData):
        return MulticlassData(data.x + 0.7 * torch.randn(data.x.shape, generator=g, dtype=torch.float64), data.y)
    if isinstance(data, SequenceData):
        return SequenceData(data.x + 0.7 * torch.randn(data.x.shape, generator=g, dtype=torch.float64), data.y,
                            data.offsets)
    return data.with_features(data.x + 0.7 * torch.randn(data.x.shape, generator=g, dtype=torch.float64))


def _graph_problem(seed=0):
    g = torch.Generator().manual_seed(seed)
    xs, es, exs, ys = [], [], [], []
    for _ in range(4):
        n = int(torch.randint(2, 5, (1,), generator=g))
        p = torch.arange(n - 1)
        xs.append(torch.randn(n, 2, generator=g, dtype=torch.float64))
        es.append(torch.stack([p, p + 1], 1))
        exs.append(torch.rand(n - 1, 1, generator=g, dtype=torch.float64))
        ys.append(torch.randint(0, 2, (n,), generator=g))
    return GraphCut(2, 1, processes=1), GraphData.from_graphs(xs, es, exs, ys)


def _problem(kind):
    if kind == "chain":
        model, data = random_chain_problem(n=5, F=3, K=2, max_len=3, seed=3)
    elif kind == "multiclass":
        model, data = random_multiclass_problem(n=7, F=3, K=4, seed=3)
    elif kind == "multiclass-active-set":
        _, data = random_multiclass_problem(n=7, F=3, K=4, seed=3)
        model = ActiveSetMulticlass(3, 4)
    else:
        model, data = _graph_problem(3)
    return model, data, _perturbed(data, 11)


SOLVERS = [("bcfw", {}), ("bcfw", {"preset": "gap-pairwise-cache"}), ("fw", {}), ("mp-bcfw", {})]


@pytest.mark.parametrize("solver,kw", SOLVERS, ids=["bcfw", "bcfw-gap-pairwise-cache", "fw", "mp-bcfw"])
@pytest.mark.parametrize("kind", ["chain", "multiclass", "multiclass-active-set", "graphcut"])
def test_warm_start_on_other_features_never_overstates_the_dual(kind, solver, kw):
    model, data1, data2 = _problem(kind)
    first = fit(model, data1, LAM, solver, max_passes=20, gap_check=5, **kw)
    if not model.dual_state(data1, LAM).rebindable:
        with pytest.raises(ValueError, match="features differ"):
            fit(model, data2, LAM, solver, max_passes=5, init=first, **kw)
        return
    second = fit(model, data2, LAM, solver, max_passes=6, gap_check=2, init=first, **kw)
    # an upper bound on the optimum of the new problem: P at a well-converged cold start, by enumeration
    ref = fit(model, data2, LAM, "bcfw", max_passes=3000, gap_check=50, gap_tol=1e-10)
    p_star_bound = brute_force_primal(model, data2, ref.weights, LAM)
    new = second.history[len(first.history):]
    assert new
    for rec in new:
        for dual in (rec.dual, rec.dual_avg):
            if dual is not None:
                assert dual <= p_star_bound + 1e-9
        assert rec.gap >= -1e-12
    # the reported primal is the brute-force primal of the returned weights
    assert second.primal == pytest.approx(brute_force_primal(model, data2, second.weights, LAM), abs=1e-10)


def test_same_features_resume_is_exact_for_the_dense_state():
    model, data, _ = _problem("multiclass")
    whole = fit(model, data, LAM, max_passes=10, gap_check=5)
    half = fit(model, data, LAM, max_passes=5, gap_check=5)
    again = fit(model, data.to("cpu"), LAM, max_passes=5, gap_check=5, init=half)
    assert torch.equal(whole.w, again.w)
    assert [r.gap_last for r in whole.history] == [r.gap_last for r in again.history]


def test_features_fingerprint_sees_in_place_changes():
    from torch_bcfw.duals.fingerprint import features_fingerprint

    _, data, _ = _problem("chain")
    before = features_fingerprint(data)
    data.x[0, 0] += 1e-12
    assert features_fingerprint(data) != before
