"""The core checks again on a CUDA device (skipped only when CUDA is absent)."""
import pytest
import torch

from conftest import brute_force_max, random_chain_problem, random_multiclass_problem, requires_cuda, shared_data
from torch_bcfw import fit
from torch_bcfw.inference.viterbi import viterbi_packed
from torch_bcfw.certificate import certify

pytestmark = [pytest.mark.cuda, requires_cuda]


def test_viterbi_on_cuda_equals_cpu():
    g = torch.Generator().manual_seed(0)
    lengths = torch.randint(1, 9, (50,), generator=g)
    offsets = torch.zeros(51, dtype=torch.long)
    offsets[1:] = torch.cumsum(lengths, 0)
    unary = torch.randn(int(lengths.sum()), 5, generator=g, dtype=torch.float64)
    trans = torch.randn(5, 5, generator=g, dtype=torch.float64)
    a, sa = viterbi_packed(unary, offsets, trans)
    b, sb = viterbi_packed(unary.cuda(), offsets.cuda(), trans.cuda())
    assert torch.equal(a, b.cpu()) and torch.allclose(sa, sb.cpu())


@pytest.mark.parametrize("make", [random_chain_problem, random_multiclass_problem])
def test_oracle_on_cuda_equals_enumeration(make):
    model, data = make(seed=3)
    w = torch.randn(model.n_features, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    y = model.oracle(w.cuda(), data.to("cuda")).cpu()
    for i in range(len(data)):
        best, _ = brute_force_max(model, data, w, i)
        blk = data[[i]]
        yi = y[data.offsets[i]:data.offsets[i + 1]] if hasattr(data, "offsets") else y[i:i + 1]
        assert float(model.joint_feature(blk, yi)[0] @ w + model.loss(blk, yi)[0]) == pytest.approx(best, abs=1e-9)


def test_bcfw_on_cuda_matches_cpu_trajectory():
    model, data = random_chain_problem(n=10, F=4, K=3, max_len=5, seed=1)
    cpu = fit(model, data, 0.05, max_passes=5, gap_check=5, seed=7, batch_size=1)
    gpu = fit(model, data.to("cuda"), 0.05, max_passes=5, gap_check=5, seed=7, batch_size=1)
    assert torch.allclose(cpu.w, gpu.w.cpu(), atol=1e-10)
    assert gpu.history[-1].gap_last == pytest.approx(cpu.history[-1].gap_last, abs=1e-10)
    c = certify(model, data.to("cuda"), gpu.w, gpu.history[-1].dual + 0.025 * float(gpu.w @ gpu.w), 0.05)
    assert c.gap == pytest.approx(gpu.history[-1].gap_last, abs=1e-10)


def test_ocr_gap_pass_on_cuda():
    from torch_bcfw.datasets.ocr import load_ocr_split
    from torch_bcfw.models import Chain

    train, _ = load_ocr_split(shared_data("ocr"), "large", 0)
    model = Chain(128, 26)
    w = torch.randn(model.n_features, dtype=torch.float64, generator=torch.Generator().manual_seed(0)) * 0.05
    c_cpu = certify(model, train, w, 0.0, 0.01)
    c_gpu = certify(model, train.to("cuda"), w.cuda(), 0.0, 0.01)
    assert c_gpu.primal == pytest.approx(c_cpu.primal, rel=1e-10)


@pytest.mark.parametrize("make", [lambda: random_chain_problem(n=12, seed=3), lambda: random_multiclass_problem(n=12)])
def test_minibatch_rounds_on_cuda_follow_the_cpu_rounds(make):
    """Mini-batch BCFW with the data on CUDA (batched torch rounds) against the same rounds on the CPU."""
    model, data = make()
    cpu = fit(model, data, 0.1, batch_size=4, max_passes=10, gap_check=5, seed=2)
    gpu = fit(model, data.to("cuda"), 0.1, batch_size=4, max_passes=10, gap_check=5, seed=2)
    assert torch.allclose(gpu.w.cpu(), cpu.w, atol=1e-10)
    assert gpu.history[-1].gap_last == pytest.approx(cpu.history[-1].gap_last, abs=1e-10)


def test_the_round_size_on_cuda_is_measured():
    """``batch_size="auto"`` with the data on CUDA: rounds (64, 256 or 1024 blocks, at most n / 2), timed."""
    from torch_bcfw.planning import measured_round_size
    from torch_bcfw.solvers.run import options_for

    model, data = random_chain_problem(n=300, F=4, K=3, max_len=5, seed=1)
    assert measured_round_size(model, data.to("cuda"), 0.05, options_for("bcfw", max_passes=2)) in (64,)


def test_fit_on_cuda_solves_where_it_is_fastest_and_reaches_the_gap_as_fast_as_the_cpu_kernel():
    """OCR-large with its data on the GPU and fit's defaults: the measured choice is recorded in the counters (the
    CPU kernel, whose block steps are hundreds of times cheaper), and the time to gap 0.01 is within 1.1x of the
    CPU kernel's on the same machine (the placement's timing included)."""
    import time

    from torch_bcfw.datasets.ocr import load_ocr_split
    from torch_bcfw.models import Chain
    from torch_bcfw.planning import PLACEMENT_COUNTERS as COUNTERS

    train, _ = load_ocr_split(str(shared_data("ocr")), "large", 0)
    fit(Chain(128, 26), train, 0.01, max_passes=1, gap_check=1)  # compile the kernels for both runs
    t0 = time.perf_counter()
    cpu = fit(Chain(128, 26), train, 0.01, gap_tol=0.01, max_passes=200)
    cpu_s = time.perf_counter() - t0
    on_gpu = train.to("cuda")
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    gpu = fit(Chain(128, 26), on_gpu, 0.01, gap_tol=0.01, max_passes=200)
    gpu_s = time.perf_counter() - t0
    assert set(COUNTERS) <= set(gpu.counters) and not set(COUNTERS) & set(cpu.counters)
    moved, cpu_block, gpu_block = (gpu.counters[k] for k in COUNTERS)
    print(f"cpu {cpu_s:.2f} s, data on cuda {gpu_s:.2f} s; block step cpu {cpu_block:.3g} s, cuda {gpu_block:.3g} s")
    assert moved == float(cpu_block <= gpu_block)
    assert cpu.gap <= 0.01 and gpu.gap <= 0.01
    assert gpu_s <= 1.1 * cpu_s


def test_a_forced_one_block_run_on_cuda_is_warned_about():
    """On a GPU one-block steps are hundreds of times slower per pass than rounds: ``fit(batch_size=1)`` measures it
    and warns once, naming the round size ``batch_size="auto"`` would use; the run itself is unchanged."""
    from torch_bcfw.datasets.ocr import load_ocr_split
    from torch_bcfw.models import Chain

    train, _ = load_ocr_split(str(shared_data("ocr")), "small", 0)
    with pytest.warns(UserWarning, match=r"batch_size=1 is predicted \d+x slower per pass than batch_size=\d+"):
        r = fit(Chain(128, 26), train.to("cuda"), 0.1, batch_size=1, max_passes=1, gap_check=1)
    assert r.options.batch_size == 1 and r.gap >= 0
