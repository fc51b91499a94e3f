"""Bad input gets a clear error."""
import math

import pytest
import torch

from conftest import random_chain_problem, random_multiclass_problem
from torch_bcfw import MulticlassData, SequenceData, fit
from torch_bcfw.convert import lam_from_pystruct_C, lam_from_svmstruct_C, pystruct_C_from_lam, svmstruct_C_from_lam
from torch_bcfw.models import Chain, Multiclass


def test_labels_out_of_range():
    model, data = random_chain_problem(K=3)
    bad = SequenceData(data.x, data.y.clone(), data.offsets)
    bad.y[0] = 3
    with pytest.raises(ValueError, match="labels must lie in"):
        fit(model, bad, 0.1)
    with pytest.raises(ValueError, match="labels must lie in"):
        fit(Multiclass(3, 2), MulticlassData(torch.randn(4, 3), torch.tensor([0, 1, 2, 1])), 0.1)
    with pytest.raises(ValueError, match="labels must lie in"):
        fit(Multiclass(3, 2), MulticlassData(torch.randn(4, 3), torch.tensor([0, 1, -1, 1])), 0.1)


def test_shape_and_length_mismatches():
    with pytest.raises(ValueError, match="one label per token"):
        SequenceData(torch.randn(5, 2), torch.zeros(4, dtype=torch.long), torch.tensor([0, 5]))
    with pytest.raises(ValueError, match="offsets must start at 0"):
        SequenceData(torch.randn(5, 2), torch.zeros(5, dtype=torch.long), torch.tensor([0, 4]))
    with pytest.raises(ValueError, match="2 feature rows but 3 labels"):
        SequenceData.from_sequences([torch.randn(2, 3)], [torch.zeros(3, dtype=torch.long)])
    with pytest.raises(ValueError, match="lengths must lie"):
        SequenceData.from_padded(torch.randn(2, 3, 4), torch.tensor([3, 4]))
    with pytest.raises(ValueError, match="must have shape"):
        MulticlassData(torch.randn(4, 3), torch.zeros(5, dtype=torch.long))
    model, data = random_chain_problem(F=4)
    with pytest.raises(ValueError, match="dimension 4 but the model expects 5"):
        fit(Chain(5, 3), data, 0.1)
    with pytest.raises(ValueError, match="weights must have shape"):
        model.oracle(torch.zeros(7, dtype=torch.float64), data)


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_nan_and_inf_features(value):
    x = torch.randn(6, 3)
    x[2, 1] = value
    with pytest.raises(ValueError, match="NaN or infinite"):
        SequenceData(x, torch.zeros(6, dtype=torch.long), torch.tensor([0, 2, 6]))
    with pytest.raises(ValueError, match="NaN or infinite"):
        MulticlassData(x, torch.zeros(6, dtype=torch.long))


@pytest.mark.parametrize("lam", [0.0, -1.0, math.nan, math.inf])
def test_bad_lam(lam):
    model, data = random_multiclass_problem()
    with pytest.raises(ValueError, match="lam must be"):
        fit(model, data, lam)


def test_empty_data():
    with pytest.raises(ValueError, match="empty"):
        MulticlassData(torch.zeros(0, 3), torch.zeros(0, dtype=torch.long))
    with pytest.raises(ValueError, match="empty"):
        SequenceData.from_sequences([], [])
    with pytest.raises(ValueError, match="length >= 1"):
        SequenceData(torch.zeros(2, 3), torch.zeros(2, dtype=torch.long), torch.tensor([0, 0, 2]))


def test_unknown_solver_and_options():
    model, data = random_multiclass_problem()
    with pytest.raises(ValueError, match="unknown solver"):
        fit(model, data, 0.1, solver="sgd")
    with pytest.raises(TypeError, match=r"unknown solver option\(s\) \['max_pases'\]; did you mean 'max_passes'\?"):
        fit(model, data, 0.1, max_pases=3)
    with pytest.raises(TypeError, match="did you mean 'mp_max_planes'"):
        fit(model, data, 0.1, "mp-bcfw", mp_max_plane=3)
    with pytest.raises(TypeError, match=r"belong to solver 'mp-bcfw', not 'bcfw' \(its options: mp_\* \(mp_max_planes"):
        fit(model, data, 0.1, mp_max_planes=3)
    with pytest.raises(TypeError, match="belong to solver 'bcfw'"):
        fit(model, data, 0.1, "fw", preset="gap-fw")
    with pytest.raises(ValueError, match="step must be"):
        fit(model, data, 0.1, step="armijo")


def test_a_device_option_says_how_a_gpu_run_is_asked_for():
    """``fit(..., device="cuda")`` answers with the way a GPU run is asked for (the data on the device), not a list of
    option names."""
    model, data = random_multiclass_problem()
    with pytest.raises(TypeError, match=r"put the data on the device, data\.to\('cuda'\)$") as info:
        fit(model, data, 0.1, device="cuda")
    assert "max_passes" not in str(info.value)


def test_missing_labels_for_training():
    model, data = random_multiclass_problem()
    with pytest.raises(ValueError, match="needs labels"):
        fit(model, MulticlassData(data.x), 0.1)


def test_warm_start_mismatch():
    model, data = random_multiclass_problem()
    r = fit(model, data, 0.1, max_passes=1, gap_check=1)
    with pytest.raises(ValueError, match="different|lam"):
        fit(model, data, 0.2, init=r)
    with pytest.raises(ValueError, match="cannot warm-start"):
        fit(model, data, 0.1, solver="fw", init=r)
    other_model, other = random_multiclass_problem(n=9)
    with pytest.raises(ValueError, match="n = 8"):
        fit(model, other, 0.1, init=r)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA is not available on this machine")
def test_mismatched_devices():
    model, data = random_chain_problem()
    with pytest.raises(ValueError, match="device|on cuda|on cpu"):
        fit(model, data, 0.1, test_data=data.to("cuda"))
    with pytest.raises(ValueError, match="weights are on"):
        model.oracle(torch.zeros(model.n_features, dtype=torch.float64, device="cuda"), data)


def test_mismatched_devices_meta():
    """Device checks also work without CUDA (the meta device stands for 'another device')."""
    model, data = random_chain_problem()
    with pytest.raises(ValueError, match="weights are on"):
        model.oracle(torch.zeros(model.n_features, dtype=torch.float64, device="meta"), data)
    with pytest.raises(ValueError, match="x is on"):
        MulticlassData(torch.randn(3, 2), torch.zeros(3, dtype=torch.long, device="meta"))


def test_lam_c_converters():
    assert lam_from_pystruct_C(pystruct_C_from_lam(0.01, 6251), 6251) == pytest.approx(0.01)
    assert pystruct_C_from_lam(0.01, 100) == pytest.approx(1.0)
    assert lam_from_svmstruct_C(100.0) == pytest.approx(0.01)
    assert svmstruct_C_from_lam(lam_from_svmstruct_C(3.0)) == pytest.approx(3.0)
    with pytest.raises(ValueError):
        lam_from_pystruct_C(0.0, 10)


def test_warm_start_with_other_variant_options_is_a_clear_error():
    model, data = random_chain_problem()
    r = fit(model, data, 0.1, max_passes=2, preset="gap-pairwise-cache")
    with pytest.raises(ValueError, match="pass the options of the run being continued"):
        fit(model, data, 0.1, max_passes=2, init=r)
    fit(model, data, 0.1, max_passes=2, init=r, preset="gap-pairwise-cache")
