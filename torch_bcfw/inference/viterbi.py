"""Batched max-plus Viterbi decoding for linear chains packed by ``offsets[n+1]``.  On CPU the compiled
:func:`viterbi_numba` runs over the sequences in parallel threads; elsewhere the torch recursion runs once per group of
equal-length sequences.  Both give the same labels, ties going to the lowest label index.
"""
from __future__ import annotations

import numpy as np
import torch
from numba import njit, prange
from torch import Tensor

__all__ = ["viterbi_packed", "viterbi_packed_torch", "viterbi_numba"]


def _viterbi_same_length(unary: Tensor, transition: Tensor) -> tuple[Tensor, Tensor]:
    """Max-plus recursion for ``unary: [B, L, K]`` all of length L.  Returns ``(labels [B, L], score [B])``."""
    B, L, K = unary.shape
    delta = unary[:, 0]
    backpointers = []
    for t in range(1, L):
        delta, bp = (delta[:, :, None] + transition[None]).max(1)
        delta = delta + unary[:, t]
        backpointers.append(bp)
    score, last = delta.max(1)
    labels = unary.new_empty(B, L, dtype=torch.long)
    labels[:, L - 1] = last
    for t in range(L - 2, -1, -1):
        labels[:, t] = backpointers[t].gather(1, labels[:, t + 1 : t + 2])[:, 0]
    return labels, score


def viterbi_packed(unary: Tensor, offsets: Tensor, transition: Tensor) -> tuple[Tensor, Tensor]:
    """Decode packed sequences: per-token label scores ``unary [N_tok, K]``, boundaries ``offsets [n + 1]``,
    ``transition [K, K]`` (label ``a`` followed by ``b`` at ``[a, b]``).  Returns the argmax labeling and its score,
    ``(labels LongTensor[N_tok], score Tensor[n])``."""
    if unary.dim() != 2 or transition.shape != (unary.shape[1], unary.shape[1]):
        raise ValueError(f"unary must be [N_tok, K] and transition [K, K]; got {tuple(unary.shape)}, {tuple(transition.shape)}")
    transition = transition.to(unary.dtype)
    if unary.device.type == "cpu" and unary.dtype in (torch.float32, torch.float64):
        u = unary.detach().contiguous().numpy()
        labels = np.empty(u.shape[0], dtype=np.int64)
        scores = np.empty(offsets.numel() - 1, dtype=u.dtype)
        threads = torch.get_num_threads()
        # a few sequences: a serial loop (starting numba's thread pool costs more than decoding them)
        batch = _viterbi_batch_serial if scores.shape[0] <= _SERIAL_MAX else _viterbi_batch_numba
        batch(u, offsets.contiguous().numpy(), transition.detach().contiguous().numpy(), labels, scores)
        if torch.get_num_threads() != threads:  # numba's OpenMP region resets the shared libgomp thread count
            torch.set_num_threads(threads)
        return torch.from_numpy(labels), torch.from_numpy(scores)
    return viterbi_packed_torch(unary, offsets, transition)


def viterbi_packed_torch(unary: Tensor, offsets: Tensor, transition: Tensor) -> tuple[Tensor, Tensor]:
    """The device-agnostic torch path of :func:`viterbi_packed`: sequences bucketed by length."""
    transition = transition.to(unary.dtype)
    off = offsets.cpu()
    lengths = off[1:] - off[:-1]
    n = lengths.numel()
    labels = torch.empty(unary.shape[0], dtype=torch.long, device=unary.device)
    scores = unary.new_empty(n)
    for L in torch.unique(lengths).tolist():
        seqs = torch.nonzero(lengths == L)[:, 0]
        tok = (off[:-1][seqs][:, None] + torch.arange(L)[None, :]).to(unary.device)
        lab, sc = _viterbi_same_length(unary[tok], transition)
        labels[tok] = lab
        scores[seqs.to(unary.device)] = sc
    return labels, scores


#: up to this many sequences, :func:`viterbi_packed` decodes in one thread
_SERIAL_MAX = 4


@njit(cache=True)
def _viterbi_batch_serial(unary, offsets, transition, labels, scores):
    """:func:`_viterbi_batch_numba` in one thread (a few sequences)."""
    K = unary.shape[1]
    for i in range(offsets.shape[0] - 1):
        s = offsets[i]
        L = offsets[i + 1] - s
        delta = np.empty((L, K), dtype=unary.dtype)
        scores[i] = viterbi_numba(unary[s:s + L], transition, labels[s:s + L], delta)


@njit(cache=True, parallel=True)
def _viterbi_batch_numba(unary, offsets, transition, labels, scores):
    """Decode all packed sequences in parallel threads (CPU); same tie rule as :func:`viterbi_numba`."""
    n = offsets.shape[0] - 1
    K = unary.shape[1]
    for i in prange(n):
        s = offsets[i]
        L = offsets[i + 1] - s
        delta = np.empty((L, K), dtype=unary.dtype)
        scores[i] = viterbi_numba(unary[s:s + L], transition, labels[s:s + L], delta)


@njit(cache=True, _nrt=False)
def viterbi_numba(unary: np.ndarray, transition: np.ndarray, out: np.ndarray, delta: np.ndarray) -> float:
    """Single-sequence max-plus Viterbi (compiled): ``unary: float64[L, K]``, ``transition: float64[K, K]``; writes
    the labels to ``out: int64[L]`` using the scratch messages ``delta: float64[>= L, K]``; returns the score.  The
    backtrack recomputes each backpointer from ``delta`` with the same additions (no backpointer table)."""
    L, K = unary.shape
    for c in range(K):
        delta[0, c] = unary[0, c]
    for t in range(1, L):
        _max_plus_row(delta[t - 1], transition, delta[t])
        for c in range(K):
            delta[t, c] += unary[t, c]
    out[L - 1] = _first_argmax(delta[L - 1])
    for t in range(L - 1, 0, -1):
        out[t - 1] = _best_predecessor(delta[t - 1], transition, out[t])
    return delta[L - 1, out[L - 1]]


@njit(cache=True, _nrt=False)
def _max_plus_row(prev: np.ndarray, transition: np.ndarray, cur: np.ndarray) -> None:
    """``cur[c] = max_a prev[a] + transition[a, c]``, vectorised over ``c``, four previous labels ``a`` per sweep
    (max is exact, so the grouping does not change the values)."""
    K = prev.shape[0]
    for c in range(K):
        cur[c] = prev[0] + transition[0, c]
    a = 1
    while a + 4 <= K:
        d0, d1, d2, d3 = prev[a], prev[a + 1], prev[a + 2], prev[a + 3]
        for c in range(K):
            v0 = d0 + transition[a, c]
            v1 = d1 + transition[a + 1, c]
            v2 = d2 + transition[a + 2, c]
            v3 = d3 + transition[a + 3, c]
            v01 = v0 if v0 > v1 else v1
            v23 = v2 if v2 > v3 else v3
            v = v01 if v01 > v23 else v23
            cur[c] = v if v > cur[c] else cur[c]
        a += 4
    for b in range(a, K):
        db = prev[b]
        for c in range(K):
            v = db + transition[b, c]
            cur[c] = v if v > cur[c] else cur[c]


@njit(cache=True, _nrt=False)
def _first_argmax(v: np.ndarray) -> int:
    """Index of the first maximum of ``v`` (the tie rule of ``torch.max``)."""
    arg = 0
    for c in range(1, v.shape[0]):
        if v[c] > v[arg]:
            arg = c
    return arg


@njit(cache=True, _nrt=False)
def _best_predecessor(prev: np.ndarray, transition: np.ndarray, c: int) -> int:
    """First ``a`` maximising ``prev[a] + transition[a, c]``: the backpointer of label ``c``."""
    best = prev[0] + transition[0, c]
    arg = 0
    for a in range(1, prev.shape[0]):
        v = prev[a] + transition[a, c]
        if v > best:
            best = v
            arg = a
    return arg
