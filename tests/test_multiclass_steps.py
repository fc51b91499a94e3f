"""The compiled plain steps of the multiclass dual state take the generic loop's steps (up to the rounding of the dot
products), with and without the bias feature, line search or the fixed step, the averaged iterate included; a model
with its own oracle, box constraints and refined plans stay in the generic loops."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from conftest import random_multiclass_problem
from torch_bcfw import fit
from torch_bcfw.duals.multiclass import MulticlassDualState
from torch_bcfw.duals.plan import StepPlan
from torch_bcfw.models import Multiclass


class OwnOracle(Multiclass):
    """The same argmax through an overridden method: the generic loop calls it from Python."""

    def oracle(self, w, data, loss_augmented=True):
        return super().oracle(w, data, loss_augmented)


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("step", ["line_search", "fixed"])
def test_compiled_steps_equal_the_generic_loop(bias, step):
    _, data = random_multiclass_problem(n=40, F=5, K=4, seed=3)
    runs = [fit(cls(5, 4, bias=bias), data, 0.05, max_passes=6, gap_check=2, step=step, sampling="perm", seed=2)
            for cls in (Multiclass, OwnOracle)]
    a, b = runs
    assert torch.allclose(a.w, b.w, rtol=0, atol=1e-13) and torch.allclose(a.w_avg, b.w_avg, rtol=0, atol=1e-13)
    for ra, rb in zip(a.history, b.history):
        assert ra.gap == pytest.approx(rb.gap, abs=1e-12) and ra.steps == rb.steps
        assert ra.dual == pytest.approx(rb.dual, abs=1e-12)


def test_which_plans_run_compiled():
    _, data = random_multiclass_problem(n=12, F=3, K=3, seed=1)
    state = Multiclass(3, 3).dual_state(data, 0.1)
    assert isinstance(state, MulticlassDualState)
    plain = StepPlan.plain(np.arange(12), 0, True)
    assert state.can_run_plan(plain)
    assert not OwnOracle(3, 3).dual_state(data, 0.1).can_run_plan(plain)
    state.set_bounds(torch.zeros(state.d), None)
    assert not state.can_run_plan(plain)
    res = Multiclass(3, 3).dual_state(data, 0.1).run_plan(plain)
    assert res.steps == res.oracle_calls == 12 and np.all(res.gaps >= -1e-12)  # exact oracle: block gaps >= 0
