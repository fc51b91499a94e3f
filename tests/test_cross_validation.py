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


def test_choose_lam_scores_out_of_fold_predictions_and_picks_the_best():
    from torch_bcfw.cross_validation import choose_lam

    model, data = random_multiclass_problem(n=12, F=4, K=3, seed=2)
    folds = torch.arange(12) % 3
    seen = []

    def score(pred):
        seen.append(pred.clone())
        return float((pred == data.y).double().mean())

    lam, scores = choose_lam(model, data, (10.0, 0.01), lambda w, d: model.oracle(w, d, loss_augmented=False), score,
                             folds=folds, max_passes=5, seed=4)
    for candidate, pred in zip((10.0, 0.01), seen):  # each example predicted by the fit of the folds without it
        expect = torch.empty(12, dtype=torch.long)
        for f in cross_validate(model, data, folds, lam=candidate, max_passes=5, seed=4):
            expect[f.test_index] = model.oracle(f.result.weights, data[f.test_index], loss_augmented=False)
        assert torch.equal(pred, expect)
    assert scores == {10.0: score(seen[0]), 0.01: score(seen[1])}
    assert lam == max(scores, key=scores.get)
    with pytest.raises(ValueError, match="at least one candidate"):
        choose_lam(model, data, (), lambda w, d: d.y, score)
