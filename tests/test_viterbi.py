"""Viterbi against brute force, torch-struct, and the compiled decoder."""
import itertools

import numpy as np
import pytest
import torch

from torch_bcfw.inference.viterbi import viterbi_numba, viterbi_packed, viterbi_packed_torch


def brute_force(unary, trans):
    L, K = unary.shape
    best, arg = -float("inf"), None
    for y in itertools.product(range(K), repeat=L):
        v = sum(float(unary[t, y[t]]) for t in range(L)) + sum(float(trans[y[t - 1], y[t]]) for t in range(1, L))
        if v > best:
            best, arg = v, y
    return best, list(arg)


@pytest.mark.parametrize("decoder", [viterbi_packed, viterbi_packed_torch])
@pytest.mark.parametrize("seed", range(5))
def test_packed_viterbi_equals_brute_force(seed, decoder):
    g = torch.Generator().manual_seed(seed)
    K = 3
    lengths = torch.tensor([1, 2, 3, 4, 5, 3, 1])
    offsets = torch.zeros(len(lengths) + 1, dtype=torch.long)
    offsets[1:] = torch.cumsum(lengths, 0)
    unary = torch.randn(int(lengths.sum()), K, generator=g, dtype=torch.float64)
    trans = torch.randn(K, K, generator=g, dtype=torch.float64)
    labels, scores = decoder(unary, offsets, trans)
    for i in range(len(lengths)):
        s, e = int(offsets[i]), int(offsets[i + 1])
        best, arg = brute_force(unary[s:e], trans)
        assert labels[s:e].tolist() == arg
        assert scores[i].item() == pytest.approx(best, abs=1e-12)


def test_viterbi_matches_torch_struct_argmax():
    torch_struct = pytest.importorskip("torch_struct")
    g = torch.Generator().manual_seed(7)
    B, N, C = 6, 7, 4
    lengths = torch.tensor([7, 5, 2, 7, 3, 6])
    unary = torch.randn(B, N, C, generator=g, dtype=torch.float64)
    trans = torch.randn(C, C, generator=g, dtype=torch.float64)
    # torch-struct's LinearChainCRF potentials: [B, N-1, C(next), C(prev)]; fold unary into edges
    edge = trans.T[None, None].repeat(B, N - 1, 1, 1).clone()
    edge = edge + unary[:, 1:, :, None]
    edge[:, 0] += unary[:, 0, None, :]
    dist = torch_struct.LinearChainCRF(edge, lengths=lengths)
    parts = dist.argmax  # [B, N-1, C, C] one-hot edges
    offsets = torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)])
    ours, score = viterbi_packed(unary[torch.arange(N)[None] < lengths[:, None]], offsets, trans)
    for b in range(B):
        L = int(lengths[b])
        if L == 1:
            continue
        seq = [None] * L
        for t in range(L - 1):
            nz = torch.nonzero(parts[b, t])
            assert nz.shape[0] == 1
            seq[t + 1], seq[t] = int(nz[0, 0]), int(nz[0, 1])
        assert ours[offsets[b]:offsets[b + 1]].tolist() == seq
    assert torch.allclose(dist.max, score)


def test_numba_viterbi_matches_torch_including_ties():
    rng = np.random.default_rng(0)
    for L in (1, 2, 5, 9):
        for K in (2, 5):
            unary = rng.integers(-2, 3, size=(L, K)).astype(np.float64)  # integer scores create ties
            trans = rng.integers(-1, 2, size=(K, K)).astype(np.float64)
            out = np.empty(L, dtype=np.int64)
            score = viterbi_numba(unary, trans, out, np.empty((L, K)))
            labels, s2 = viterbi_packed(torch.from_numpy(unary), torch.tensor([0, L]), torch.from_numpy(trans))
            assert out.tolist() == labels.tolist()
            assert score == pytest.approx(float(s2[0]))


def test_cpu_and_torch_paths_agree_on_ties():
    """Integer scores make many ties: the compiled CPU path and the torch path pick the same labels."""
    g = torch.Generator().manual_seed(1)
    lengths = torch.randint(1, 8, (40,), generator=g)
    offsets = torch.zeros(41, dtype=torch.long)
    offsets[1:] = torch.cumsum(lengths, 0)
    unary = torch.randint(-2, 3, (int(lengths.sum()), 4), generator=g).double()
    trans = torch.randint(-1, 2, (4, 4), generator=g).double()
    a, sa = viterbi_packed(unary, offsets, trans)
    b, sb = viterbi_packed_torch(unary, offsets, trans)
    assert torch.equal(a, b) and torch.equal(sa, sb)


def test_packed_viterbi_keeps_the_callers_torch_thread_count():
    # numba's OpenMP layer shares libgomp with torch; its parallel region must not undo torch.set_num_threads
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        unary = torch.randn(40, 4, dtype=torch.float64)
        offsets = torch.tensor([0, 10, 25, 40])
        viterbi_packed(unary, offsets, torch.randn(4, 4, dtype=torch.float64))
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


def test_serial_path_for_a_few_sequences_equals_the_parallel_batch():
    g = torch.Generator().manual_seed(11)
    lengths = torch.randint(1, 9, (12,), generator=g)
    offsets = torch.zeros(13, dtype=torch.long)
    offsets[1:] = torch.cumsum(lengths, 0)
    unary = torch.randn(int(offsets[-1]), 5, dtype=torch.float64, generator=g)
    trans = torch.randn(5, 5, dtype=torch.float64, generator=g)
    labels, scores = viterbi_packed(unary, offsets, trans)  # 12 sequences: the parallel batch
    for i in range(12):  # one at a time: the serial path
        s, e = int(offsets[i]), int(offsets[i + 1])
        lab, sc = viterbi_packed(unary[s:e], torch.tensor([0, e - s]), trans)
        assert torch.equal(lab, labels[s:e]) and float(sc[0]) == float(scores[i])
