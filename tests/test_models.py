"""Model contract: joint features, loss, oracles against enumeration."""
import pytest
import torch

from conftest import brute_force_max, enumerate_labelings, random_chain_problem, random_multiclass_problem
from torch_bcfw.models import Chain


def problems():
    yield random_chain_problem(n=6, F=4, K=3, max_len=4, seed=1)
    yield random_multiclass_problem(n=8, F=3, K=4, seed=2)


@pytest.mark.parametrize("model,data", list(problems()))
def test_oracle_equals_enumeration(model, data):
    g = torch.Generator().manual_seed(5)
    for trial in range(3):
        w = torch.randn(model.n_features, generator=g, dtype=torch.float64) * (0.2 + trial)
        for aug in (True, False):
            y = model.oracle(w, data, loss_augmented=aug)
            for i in range(len(data)):
                best, _ = brute_force_max(model, data, w, i, loss_augmented=aug)
                blk = data[[i]]
                yi = y[data.offsets[i]:data.offsets[i + 1]] if hasattr(data, "offsets") else y[i:i + 1]
                got = float(model.joint_feature(blk, yi)[0] @ w) + (float(model.loss(blk, yi)[0]) if aug else 0.0)
                assert got == pytest.approx(best, abs=1e-10)


@pytest.mark.parametrize("model,data", list(problems()))
def test_score_loss_and_feature_sums_are_consistent(model, data):
    g = torch.Generator().manual_seed(0)
    w = torch.randn(model.n_features, generator=g, dtype=torch.float64)
    y = model.oracle(w, data)
    phi = model.joint_feature(data, y)
    assert phi.shape == (len(data), model.n_features)
    assert torch.allclose(model.score(w, data, y), phi @ w)
    assert torch.allclose(model.joint_feature_sum(data, y), phi.sum(0))
    assert torch.all(model.loss(data, data.y) == 0)  # L(y, y) = 0
    loss = model.loss(data, y)
    assert torch.all((loss >= 0) & (loss <= 1))


def test_chain_dimension_matches_the_ocr_model():
    assert Chain(128, 26).n_features == 4082  # 26*128 emission + 3*26 biases + 26^2 transitions


def test_chain_normalised_hamming():
    model, data = random_chain_problem(n=3, F=2, K=3, max_len=4, min_len=4, seed=0)
    y = data.y.clone()
    y[0] = (y[0] + 1) % 3  # one mistake in the first word of length 4
    assert model.loss(data, y).tolist() == [0.25, 0.0, 0.0]


def test_hinge_terms_match_enumeration():
    model, data = random_chain_problem(n=5, F=3, K=2, max_len=5, seed=4)
    w = torch.randn(model.n_features, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    _, H = model.hinge_terms(w, data)
    for i in range(len(data)):
        best, _ = brute_force_max(model, data, w, i)
        blk = data[[i]]
        assert float(H[i]) == pytest.approx(best - float(model.joint_feature(blk, blk.y)[0] @ w), abs=1e-10)
    assert torch.all(H >= -1e-12)


def test_enumeration_helper_is_complete():
    model, data = random_chain_problem(n=2, F=2, K=3, max_len=3, min_len=3, seed=0)
    assert len(enumerate_labelings(model, data, 0)) == 27
