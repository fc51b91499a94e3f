"""Word translation models trained by EM in torch, for the text-only link features of
:mod:`torch_bcfw.features.alignment`: IBM Model 1 with fast_align's diagonal prior (:class:`IBMModel`,
:func:`train_ibm`) and the HMM aligner (:class:`HMMModel`, :func:`train_hmm`).

HMM word alignment (Vogel, Ney & Tillmann 1996):
The model generates the target sentence ``f_1..f_n`` from the source ``e_1..e_m``: hidden alignments ``a_k`` run
over ``2m`` states, the ``m`` source positions and ``m`` NULL states (Och & Ney 2003: NULL state ``m + i``
remembers position ``i``, so the jump after a NULL word is measured from the last real position):

* transitions ``p(a_k = j | a_{k-1} ~ i) = (1 - p0) c(j - i) / sum_j' c(j' - i)`` to a real position ``j``, and
  ``p0`` to the NULL state of ``i``; the first word jumps from a virtual position ``-1``;
* jump weights ``c(d)`` for ``d`` in ``[-max_jump, max_jump]`` (learned; longer jumps are clipped, which the
  default of 100 makes rare on the Hansards);
* emissions ``t(f | e)`` (real states) and ``t(f | NULL)`` (NULL states), initialised from IBM Model 1.

Training runs the scaled forward-backward recursions over batches of sentences of similar length in torch and
accumulates expected emission counts into the key table of :func:`train_ibm` and expected jump counts per jump
bucket (the usual approximate M-step for ``c``).  Posteriors of a single pair are computed in numpy.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import torch
from torch import Tensor

__all__ = ["IBMModel", "train_ibm", "HMMModel", "train_hmm"]


class IBMModel:
    """A translation table ``t(tgt | src)`` over co-occurring word pairs (plus a NULL source word) and its
    alignment prior (``tension = 0``: IBM Model 1; ``> 0``: fast_align's diagonal prior with ``null_prob``)."""

    def __init__(self, keys: Tensor, table: Tensor, n_tgt: int, null_id: int, tension: float, null_prob: float):
        self.keys = keys  # sorted int64 src * n_tgt + tgt
        self.table = table  # float64, t(tgt | src) per key
        self.n_tgt = n_tgt
        self.null_id = null_id
        self.tension = float(tension)
        self.null_prob = float(null_prob)

    def lookup(self, src: np.ndarray, tgt: np.ndarray) -> np.ndarray:
        """``t(tgt | src)`` for id arrays of the same shape (0 for pairs never seen together)."""
        q = torch.as_tensor(np.asarray(src, dtype=np.int64) * self.n_tgt + np.asarray(tgt, dtype=np.int64))
        pos = torch.searchsorted(self.keys, q.reshape(-1)).clamp_max(self.keys.numel() - 1)
        hit = self.keys[pos] == q.reshape(-1)
        out = torch.where(hit, self.table[pos], torch.zeros((), dtype=torch.float64))
        return out.reshape(q.shape).numpy()

    def prior(self, m: int, n: int) -> np.ndarray:
        """``[n, m + 1]``: ``p(a_k = j)`` per target position ``k`` (rows) over NULL (column 0) and the sources."""
        if self.tension <= 0:
            return np.full((n, m + 1), 1.0 / (m + 1))
        d = np.abs((np.arange(n)[:, None] + 0.5) / n - (np.arange(m)[None, :] + 0.5) / m)
        h = np.exp(-self.tension * d)
        h *= (1.0 - self.null_prob) / h.sum(1, keepdims=True)
        return np.concatenate([np.full((n, 1), self.null_prob), h], 1)

    def posteriors(self, src: np.ndarray, tgt: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(post [n, m], null [n])``: ``p(a_k = j | src, tgt)`` per target word ``k`` over source words ``j``."""
        m, n = len(src), len(tgt)
        ids = np.concatenate([[self.null_id], src])
        t = self.lookup(np.broadcast_to(ids[None, :], (n, m + 1)), np.broadcast_to(tgt[:, None], (n, m + 1)))
        p = t * self.prior(m, n)
        z = p.sum(1, keepdims=True)
        p = np.where(z > 0, p / np.where(z > 0, z, 1.0), 1.0 / (m + 1))
        return p[:, 1:], p[:, 0]


def train_ibm(src: Sequence[np.ndarray], tgt: Sequence[np.ndarray], n_src: int, n_tgt: int, iterations: int = 5,
              tension: float = 0.0, null_prob: float = 0.08) -> IBMModel:
    """EM for ``t(tgt | src)`` on id sentences (NULL is source id ``n_src``), vectorised in torch.

    Every (sentence, target position, source position or NULL) triple is one entry; an EM iteration is two
    ``index_add`` passes (posteriors normalised per target word, expected counts normalised per source word).
    """
    if len(src) != len(tgt):
        raise ValueError(f"{len(src)} source sentences but {len(tgt)} target sentences")
    keys, groups, priors = [], [], []
    g0 = 0
    null = n_src
    proto = IBMModel(torch.zeros(1, dtype=torch.long), torch.zeros(1, dtype=torch.float64), n_tgt, null, tension,
                     null_prob)
    for s, t in zip(src, tgt):
        m, n = len(s), len(t)
        ids = np.concatenate([[null], s]).astype(np.int64)
        keys.append((ids[None, :] * n_tgt + t[:, None].astype(np.int64)).reshape(-1))
        groups.append(np.repeat(np.arange(g0, g0 + n), m + 1))
        priors.append(proto.prior(m, n).reshape(-1))
        g0 += n
    keys = torch.from_numpy(np.concatenate(keys))
    group = torch.from_numpy(np.concatenate(groups))
    prior = torch.from_numpy(np.concatenate(priors))
    ukeys, inv = torch.unique(keys, return_inverse=True)
    src_of = ukeys // n_tgt
    table = torch.ones(ukeys.numel(), dtype=torch.float64)
    for _ in range(iterations):
        p = table[inv] * prior
        z = torch.zeros(g0, dtype=torch.float64).index_add_(0, group, p)
        post = p / z[group]
        counts = torch.zeros(ukeys.numel(), dtype=torch.float64).index_add_(0, inv, post)
        tot = torch.zeros(n_src + 1, dtype=torch.float64).index_add_(0, src_of, counts)
        table = counts / tot[src_of]
    return IBMModel(ukeys, table, n_tgt, null, tension, null_prob)


class HMMModel:
    """A trained HMM aligner: emission table (as :class:`IBMModel`), jump weights."""

    def __init__(self, emissions, jumps: np.ndarray, max_jump: int, p0: float):
        self.emissions = emissions  # an IBMModel: lookup(src, tgt) gives t(tgt | src); src id null_id is NULL
        self.jumps = np.asarray(jumps, dtype=np.float64)  # c(d), d = -max_jump..max_jump
        self.max_jump = int(max_jump)
        self.p0 = float(p0)

    def lookup(self, src: np.ndarray, tgt: np.ndarray) -> np.ndarray:
        """``t(tgt | src)`` (the emission table)."""
        return self.emissions.lookup(src, tgt)

    def _jump_matrix(self, m: int) -> np.ndarray:
        """``[m + 1, m]``: rows ``i = -1..m-1`` (row 0 is the virtual start), normalised jump probabilities."""
        i = np.arange(-1, m)[:, None]
        j = np.arange(m)[None, :]
        c = self.jumps[np.clip(j - i, -self.max_jump, self.max_jump) + self.max_jump]
        return c / c.sum(1, keepdims=True)

    def posteriors(self, src: np.ndarray, tgt: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(post [n, m], null [n])``: ``p(a_k = j | src, tgt)`` per target word over the source words (and NULL)."""
        m, n = len(src), len(tgt)
        em = self.emissions
        t_real = em.lookup(np.broadcast_to(src[None, :], (n, m)), np.broadcast_to(tgt[:, None], (n, m)))  # [n, m]
        t_null = em.lookup(np.full(n, em.null_id), tgt)  # [n]
        t_real = np.maximum(t_real, 1e-12)
        t_null = np.maximum(t_null, 1e-12)
        J = self._jump_matrix(m)  # [m + 1, m]
        p0 = self.p0
        S = 2 * m
        A = np.zeros((S, S))
        A[:, :m] = np.tile((1 - p0) * J[1:], (2, 1))  # from a real position or its NULL state
        A[np.arange(S), m + np.arange(S) % m] = p0
        init = np.concatenate([(1 - p0) * J[0], p0 * J[0]])
        emit = np.concatenate([t_real, np.broadcast_to(t_null[:, None], (n, m))], 1)  # [n, 2m]
        alpha = np.zeros((n, S))
        a = init * emit[0]
        alpha[0] = a / a.sum()
        for k in range(1, n):
            a = (alpha[k - 1] @ A) * emit[k]
            alpha[k] = a / a.sum()
        beta = np.ones((n, S))
        for k in range(n - 2, -1, -1):
            b = A @ (emit[k + 1] * beta[k + 1])
            beta[k] = b / b.sum()
        g = alpha * beta
        g /= g.sum(1, keepdims=True)
        return g[:, :m], g[:, m:].sum(1)


def train_hmm(src: Sequence[np.ndarray], tgt: Sequence[np.ndarray], init, iterations: int = 5, max_jump: int = 100,
              p0: float = 0.2, batch_size: int = 128) -> HMMModel:
    """EM for the HMM on id sentences, starting from the IBM Model 1 table ``init`` (an ``IBMModel`` over the same
    vocabularies; its keys fix which (source, target) pairs have a parameter)."""
    keys, null, n_tgt = init.keys, init.null_id, init.n_tgt
    table = init.table.clone()
    src_of = keys // n_tgt
    n_src = null + 1
    jumps = np.ones(2 * max_jump + 1)
    jumps[max_jump + 1] = 3.0  # a mild preference for the monotone step before the first iteration
    order = sorted(range(len(src)), key=lambda s: (len(src[s]), len(tgt[s])))
    batches = [order[b: b + batch_size] for b in range(0, len(order), batch_size)]
    # per batch: padded key indices of the real emissions [B, N, M] and of the NULL emissions [B, N]
    prepared = []
    for idx in batches:
        mlen = np.array([len(src[s]) for s in idx])
        nlen = np.array([len(tgt[s]) for s in idx])
        B, N, M = len(idx), int(nlen.max()), int(mlen.max())
        real = np.zeros((B, N, M), dtype=np.int64)
        nul = np.zeros((B, N), dtype=np.int64)
        for b, s in enumerate(idx):
            e, f = src[s].astype(np.int64), tgt[s].astype(np.int64)
            real[b, : len(f), : len(e)] = f[:, None] + e[None, :] * n_tgt
            nul[b, : len(f)] = null * n_tgt + f
        q_real = torch.searchsorted(keys, torch.from_numpy(real).reshape(-1)).clamp_max(keys.numel() - 1).view(B, N, M)
        q_null = torch.searchsorted(keys, torch.from_numpy(nul)).clamp_max(keys.numel() - 1)
        prepared.append((q_real, q_null, torch.from_numpy(mlen), torch.from_numpy(nlen), M, N))
    D = 2 * max_jump + 1
    for _ in range(iterations):
        counts = torch.zeros_like(table)
        jump_counts = torch.zeros(D, dtype=torch.float64)
        c = torch.from_numpy(jumps)
        for q_real, q_null, mlen, nlen, M, N in prepared:
            B = q_real.shape[0]
            valid_j = torch.arange(M)[None, :] < mlen[:, None]  # [B, M]
            valid_k = torch.arange(N)[None, :] < nlen[:, None]  # [B, N]
            i = torch.arange(-1, M)[:, None]
            j = torch.arange(M)[None, :]
            bucket = (j - i).clamp(-max_jump, max_jump) + max_jump  # [M + 1, M]
            J = c[bucket][None].expand(B, -1, -1) * valid_j[:, None, :]  # [B, M + 1, M]
            J = J / J.sum(2, keepdim=True)
            S = 2 * M
            A = torch.zeros(B, S, S, dtype=torch.float64)
            A[:, :, :M] = ((1 - p0) * J[:, 1:]).repeat(1, 2, 1)  # from a real position or its NULL state
            A[:, torch.arange(S), M + torch.arange(S) % M] = p0
            state_ok = torch.cat([valid_j, valid_j], 1).to(torch.float64)  # [B, 2M]
            init_p = torch.cat([(1 - p0) * J[:, 0], p0 * J[:, 0]], 1) * state_ok
            emit = torch.cat([table[q_real], table[q_null][:, :, None].expand(B, N, M)], 2) * state_ok[:, None, :]
            emit = emit.clamp_min(1e-300) * state_ok[:, None, :]
            alpha = torch.zeros(B, N, S, dtype=torch.float64)
            a = init_p * emit[:, 0]
            alpha[:, 0] = a / a.sum(1, keepdim=True)
            for k in range(1, N):
                a = torch.bmm(alpha[:, k - 1, None, :], A)[:, 0] * emit[:, k]
                a = a / a.sum(1, keepdim=True)
                alpha[:, k] = torch.where(valid_k[:, k, None], a, alpha[:, k - 1])
            beta = torch.ones(B, N, S, dtype=torch.float64)
            for k in range(N - 2, -1, -1):
                b = torch.bmm(A, (emit[:, k + 1] * beta[:, k + 1])[:, :, None])[:, :, 0]
                b = b / b.sum(1, keepdim=True)
                beta[:, k] = torch.where(valid_k[:, k + 1, None], b, beta[:, k])
            gamma = alpha * beta
            gamma = gamma / gamma.sum(2, keepdim=True)
            gamma = gamma * valid_k[:, :, None]
            counts.index_add_(0, q_real.reshape(-1), (gamma[:, :, :M] * valid_j[:, None, :]).reshape(-1))
            counts.index_add_(0, q_null.reshape(-1), (gamma[:, :, M:].sum(2) * valid_k).reshape(-1))
            # expected jumps into real states, summed over k (one bmm):
            # xi_k(s, j) = alpha_{k-1}(s) A(s, j) emit_k(j) beta_k(j) / z_k
            right = emit[:, 1:] * beta[:, 1:]  # [B, N - 1, 2M]
            z = (torch.bmm(alpha[:, :-1], A) * right).sum(2)  # [B, N - 1]
            w_k = valid_k[:, 1:].to(torch.float64) / z.clamp_min(1e-300)
            X = torch.bmm((alpha[:, :-1] * w_k[:, :, None]).transpose(1, 2), right[:, :, :M])  # [B, 2M, M]
            xi = A[:, :, :M] * X
            per_prev = (xi[:, :M] + xi[:, M:]).sum(0)  # from position i (its real or its NULL state)  [M, M]
            jump_counts.index_add_(0, bucket[1:].reshape(-1), per_prev.reshape(-1))
            jump_counts.index_add_(0, bucket[0], gamma[:, 0, :M].sum(0))  # the first word's jump from -1
        tot = torch.zeros(n_src, dtype=torch.float64).index_add_(0, src_of, counts)
        table = counts / tot[src_of].clamp_min(1e-300)
        jumps = (jump_counts.numpy() + 1e-3)
        jumps = jumps / jumps.sum()
    emissions = IBMModel(keys, table, n_tgt, null, 0.0, 0.0)
    return HMMModel(emissions, jumps, max_jump, p0)
