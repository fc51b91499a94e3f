"""Marginals of a linear chain (forward-backward in log space): the expectation oracle of online EG.

For node potentials ``u_t(k)`` (``[L_i, K]``) and transition potentials ``A_i(j, k)`` (``[K, K]``) the Gibbs
distribution is ``p(y) = exp(sum_t u_t(y_t) + sum_t A_i(y_t, y_{t+1})) / Z_i``.  :func:`chain_marginals` (batched,
any device), :func:`chain_marginals_one` (one sequence, numba) and :func:`shared_transition_marginals` (one shared
transition matrix, probability space) return its node marginals and expected transition counts in float64.
"""
from __future__ import annotations

import numpy as np
import torch
from numba import njit
from torch import Tensor

__all__ = ["chain_marginals", "chain_marginals_one", "shared_transition_marginals"]


def chain_marginals(node: Tensor, trans: Tensor, offsets: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Batched forward-backward over packed sequences: node log-potentials ``node [N_tok, K]``, transition
    log-potentials ``trans [n, K, K]`` (or ``[K, K]`` shared), boundaries ``offsets [n + 1]`` (no empty sequence).
    Returns ``(log_Z [n], mu [N_tok, K], T [n, K, K])``, float64."""
    node = node.to(torch.float64)
    dev = node.device
    offsets = offsets.to(dev)
    lengths = offsets[1:] - offsets[:-1]
    n, K = lengths.numel(), node.shape[1]
    if bool((lengths < 1).any()):
        raise ValueError("chain_marginals: every sequence needs at least one token")
    trans = trans.to(dev, torch.float64)
    if trans.dim() == 2:
        trans = trans.expand(n, K, K)
    Tm = int(lengths.max())
    pos = torch.arange(Tm, device=dev)
    mask = pos[None, :] < lengths[:, None]                        # [n, Tm]
    U = node.new_zeros(n, Tm, K)
    U[mask] = node
    alpha = node.new_empty(n, Tm, K)
    alpha[:, 0] = U[:, 0]
    for t in range(1, Tm):
        step = torch.logsumexp(alpha[:, t - 1, :, None] + trans, dim=1) + U[:, t]
        alpha[:, t] = torch.where(mask[:, t, None], step, alpha[:, t - 1])
    log_z = torch.logsumexp(alpha[torch.arange(n, device=dev), lengths - 1], dim=1)
    beta = node.new_zeros(n, Tm, K)
    for t in range(Tm - 2, -1, -1):
        step = torch.logsumexp(trans + (U[:, t + 1] + beta[:, t + 1])[:, None, :], dim=2)
        beta[:, t] = torch.where(mask[:, t + 1, None], step, beta[:, t])
    mu = torch.exp(alpha + beta - log_z[:, None, None])[mask]
    T = node.new_zeros(n, K, K)
    for t in range(1, Tm):
        pair = alpha[:, t - 1, :, None] + trans + (U[:, t] + beta[:, t])[:, None, :] - log_z[:, None, None]
        T += torch.where(mask[:, t, None, None], torch.exp(pair), torch.zeros((), dtype=pair.dtype, device=dev))
    return log_z, mu, T


@njit(cache=True)
def _lse(a):
    m = a.max()
    return m + np.log(np.exp(a - m).sum())


@njit(cache=True)
def chain_marginals_one(node, trans):
    """One sequence: ``node float64[L, K]``, ``trans float64[K, K]`` -> ``(log_Z, mu [L, K], T [K, K])``."""
    L, K = node.shape
    alpha = np.empty((L, K))
    beta = np.zeros((L, K))
    alpha[0] = node[0]
    tmp = np.empty(K)
    for t in range(1, L):
        for k in range(K):
            for j in range(K):
                tmp[j] = alpha[t - 1, j] + trans[j, k]
            alpha[t, k] = _lse(tmp) + node[t, k]
    log_z = _lse(alpha[L - 1])
    for t in range(L - 2, -1, -1):
        for j in range(K):
            for k in range(K):
                tmp[k] = trans[j, k] + node[t + 1, k] + beta[t + 1, k]
            beta[t, j] = _lse(tmp)
    mu = np.exp(alpha + beta - log_z)
    T = np.zeros((K, K))
    for t in range(1, L):
        for j in range(K):
            for k in range(K):
                T[j, k] += np.exp(alpha[t - 1, j] + trans[j, k] + node[t, k] + beta[t, k] - log_z)
    return log_z, mu, T


def shared_transition_marginals(node: Tensor, trans: Tensor, offsets: Tensor) -> tuple[Tensor, Tensor]:
    """:func:`chain_marginals` (``mu [N_tok, K]``, ``T [n, K, K]``) for one transition matrix ``trans [K, K]``
    shared by every sequence, by scaled forward-backward in probability space (several times faster).
    Probabilities below about ``1e-308`` of the largest transition flush to 0; when a scaling factor vanishes or
    overflows it falls back to the log-space recursions."""
    node = node.to(torch.float64)
    dev = node.device
    offsets = offsets.to(dev)
    lengths = offsets.diff()
    n = lengths.numel()
    Tm = int(lengths.max())
    pos = torch.arange(Tm, device=dev)
    mask = pos[:, None] < lengths[None, :]                              # [Tm, n]: time-major, rows contiguous
    tok = torch.where(mask, offsets[:-1][None, :] + pos[:, None], -1)    # packed token of (t, i), -1 past the end
    U = node[tok.clamp_min(0)]                                          # [Tm, n, K]
    P = torch.exp(U - U.amax(2, keepdim=True))                          # max 1 per position
    E = torch.exp(trans.to(dev, torch.float64) - trans.max())
    a = torch.empty_like(P)
    s = node.new_ones(Tm, n)
    s[0] = P[0].sum(1)
    a[0] = P[0] / s[0, :, None]
    for t in range(1, Tm):
        nxt = (a[t - 1] @ E) * P[t]
        live = mask[t]
        s[t] = torch.where(live, nxt.sum(1), s[t])
        a[t] = torch.where(live[:, None], nxt / s[t, :, None], a[t - 1])
    if not bool((s > 0).all() and torch.isfinite(s).all()):
        _, mu, T = chain_marginals(node, trans, offsets)
        return mu, T
    b = torch.ones_like(P)
    for t in range(Tm - 2, -1, -1):
        prev = ((P[t + 1] * b[t + 1]) @ E.T) / s[t + 1, :, None]
        b[t] = torch.where(mask[t + 1][:, None], prev, b[t])
    mu = node.new_empty(node.shape)
    mu[tok[mask]] = (a * b)[mask]
    # expected transitions: sum_t a_{t-1}(j) E(j, k) P_t(k) b_t(k) / s_t over the live positions t >= 1
    zero = torch.zeros((), dtype=P.dtype, device=dev)
    right = torch.where(mask[1:, :, None], P[1:] * b[1:] / s[1:, :, None], zero)
    T = torch.einsum("tij,tik->ijk", a[:-1], right) * E
    return mu, T
