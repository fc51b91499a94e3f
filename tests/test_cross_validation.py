"""torch_bcfw.cross_validate: one fit per fold, on exactly the other folds' examples."""
import pytest
import torch

import torch_bcfw
from torch_bcfw import cross_validate, fit

from conftest import random_chain_problem, random_multiclass_problem


def test_each_fold_is_the_fit_on_the_other_folds():
    model, data = random_multiclass_problem(n=12, seed=3)
    folds = torch.tensor([2, 0, 1, 2, 0, 1, 2, 0, 1, 2, 0, 1]) * 5  # any integer ids
    fits = cross_validate(model, data, folds, lam=0.1, max_passes=5, seed=4)
    assert [f.fold for f in fits] == [0, 5, 10]
    for f in fits:
        assert torch.equal(f.test_index, torch.nonzero(folds == f.fold).squeeze(1))
        assert torch.equal(f.train_index, torch.nonzero(folds != f.fold).squeeze(1))
        alone = fit(model, data[f.train_index], 0.1, max_passes=5, seed=4)
        assert torch.equal(f.result.weights, alone.weights)
        assert f.result.gap == pytest.approx(alone.gap)
    # the three folds' fits see different data, so they differ
    assert not torch.equal(fits[0].result.weights, fits[1].result.weights)
    assert torch.equal(torch.sort(torch.cat([f.test_index for f in fits])).values, torch.arange(12))


def test_sequences_and_other_solvers():
    model, data = random_chain_problem(n=8, seed=1)
    fits = torch_bcfw.cross_validate(model, data, torch.arange(8) % 2, lam=0.05, solver="fw", max_passes=3)
    assert len(fits) == 2 and all(f.result.solver == "fw" for f in fits)
    assert all(len(f.train_index) == 4 for f in fits)


@pytest.mark.parametrize("folds, match", [
    (torch.zeros(12, dtype=torch.long), "at least 2 distinct folds"),
    (torch.arange(11) % 2, "one fold id per example"),
    ((torch.arange(24) % 2).reshape(12, 2), "one fold id per example"),
    (torch.arange(12) % 2 * 1.0, "integer fold ids"),
])
def test_bad_folds_raise(folds, match):
    model, data = random_multiclass_problem(n=12)
    with pytest.raises(ValueError, match=match):
        cross_validate(model, data, folds, lam=0.1, max_passes=1)


def test_bad_lam_raises_like_fit():
    model, data = random_multiclass_problem(n=12)
    with pytest.raises(ValueError, match="lam"):
        cross_validate(model, data, torch.arange(12) % 3, lam=0.0)
