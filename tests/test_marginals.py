"""The chain's expectation oracle: forward-backward marginals against enumeration, torch-struct's
LinearChainCRF and the compiled single-sequence kernel."""
from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from conftest import random_chain_problem, requires_cuda
from torch_bcfw.inference.forward_backward import chain_marginals, chain_marginals_one
from torch_bcfw.models import Multiclass


def _enumerate(model, data, w, loss_augmented):
    """log Z, node marginals and expected transition counts by enumerating every labeling."""
    log_z, mus, Ts = [], [], []
    for i in range(len(data)):
        blk = data[[i]]
        L = int(blk.lengths[0])
        Y = [torch.tensor(y) for y in itertools.product(range(model.n_labels), repeat=L)]
        s = torch.stack([model.score(w, blk, y)[0] + (model.loss(blk, y)[0] if loss_augmented else 0) for y in Y])
        p = torch.softmax(s, 0)
        log_z.append(torch.logsumexp(s, 0))
        mus.append(sum(pi * model.one_hot(y) for pi, y in zip(p, Y)))
        Ts.append(sum(pi * model.transition_counts(blk, y)[0] for pi, y in zip(p, Y)))
    return torch.stack(log_z), torch.cat(mus), torch.stack(Ts)


@pytest.mark.parametrize("loss_augmented", [False, True])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_marginals_equal_enumeration(seed, loss_augmented):
    model, data = random_chain_problem(n=4, F=3, K=3, max_len=4, seed=seed)
    w = torch.randn(model.n_features, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))
    log_z, mu, T = model.marginals(w, data, loss_augmented=loss_augmented)
    rz, rmu, rT = _enumerate(model, data, w, loss_augmented)
    assert torch.allclose(log_z, rz, atol=1e-12) and torch.allclose(mu, rmu, atol=1e-12)
    assert torch.allclose(T, rT, atol=1e-12)


def test_marginals_equal_torch_struct():
    torch_struct = pytest.importorskip("torch_struct")
    g = torch.Generator().manual_seed(3)
    n, Tm, K = 3, 5, 4
    node = torch.randn(n * Tm, K, dtype=torch.float64, generator=g)
    trans = torch.randn(n, K, K, dtype=torch.float64, generator=g)
    offsets = torch.arange(n + 1) * Tm
    log_z, mu, T = chain_marginals(node, trans, offsets)
    U = node.view(n, Tm, K)
    # torch-struct: edge potentials [B, N-1, C(next), C(prev)]; the first node folded into the first edge
    edge = trans.transpose(1, 2)[:, None].expand(n, Tm - 1, K, K).clone() + U[:, 1:, :, None]
    edge[:, 0] += U[:, 0, None, :]
    dist = torch_struct.LinearChainCRF(edge)
    assert torch.allclose(dist.partition, log_z, atol=1e-10)
    m = dist.marginals  # [B, N-1, next, prev]
    assert torch.allclose(m.sum(1).transpose(1, 2), T, atol=1e-10)
    node_m = torch.cat([m[:, :1].sum(2), m.sum(3)], 1)  # position 0: sum over next; positions 1..: sum over prev
    assert torch.allclose(node_m.reshape(-1, K), mu, atol=1e-10)


def test_compiled_single_sequence_kernel_equals_the_batched_one():
    g = torch.Generator().manual_seed(4)
    for L in (1, 2, 7):
        node = torch.randn(L, 5, dtype=torch.float64, generator=g)
        trans = torch.randn(5, 5, dtype=torch.float64, generator=g)
        z, mu, T = chain_marginals(node, trans, torch.tensor([0, L]))
        z1, mu1, T1 = chain_marginals_one(node.numpy(), trans.numpy())
        assert abs(float(z[0]) - z1) < 1e-12
        assert np.allclose(mu.numpy(), mu1, atol=1e-13) and np.allclose(T[0].numpy(), T1, atol=1e-13)


def test_models_without_marginals_say_so():
    with pytest.raises(NotImplementedError, match="no marginal"):
        Multiclass(3, 2).marginals(torch.zeros(6, dtype=torch.float64), None)


@requires_cuda
@pytest.mark.cuda
def test_marginals_on_cuda_equal_cpu():
    model, data = random_chain_problem(n=5, seed=7)
    w = torch.randn(model.n_features, dtype=torch.float64, generator=torch.Generator().manual_seed(7))
    cpu = model.marginals(w, data, loss_augmented=True)
    gpu = model.marginals(w.cuda(), data.to("cuda"), loss_augmented=True)
    for a, b in zip(cpu, gpu):
        assert torch.allclose(a, b.cpu(), atol=1e-12)
