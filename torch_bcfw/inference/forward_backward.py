"""Marginals of a linear chain (forward-backward in log space): the expectation oracle of online EG.

For sequence ``i`` with node potentials ``u_t(k)`` (``[L_i, K]``) and transition potentials ``A_i(j, k)``
(``[K, K]``, the same at every position of the sequence), the Gibbs distribution is
``p(y) = exp(sum_t u_t(y_t) + sum_t A_i(y_t, y_{t+1})) / Z_i``.  :func:`chain_marginals` returns, for every
sequence of a packed batch, ``log Z_i``, the node marginals ``mu [N_tok, K]`` and the transition marginals
summed over the positions of the sequence ``T [n, K, K]`` (the expected transition counts), in float64, on
the device of the potentials.  :func:`chain_marginals_one` is the same for one sequence, compiled (numba) for
the per-example steps of online EG on CPU; tests pin it to the batched version and to enumeration.
"""
from __future__ import annotations

import numpy as np
import torch
from numba import njit
from torch import Tensor

__all__ = ["chain_marginals", "chain_marginals_one"]


def chain_marginals(node: Tensor, trans: Tensor, offsets: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Batched forward-backward over packed sequences.

    Args:
        node: ``Tensor[N_tok, K]`` node log-potentials (tokens of all sequences, packed).
        trans: ``Tensor[n, K, K]`` per-sequence transition log-potentials, or ``Tensor[K, K]`` shared.
        offsets: ``LongTensor[n + 1]`` sequence boundaries (every sequence non-empty).

    Returns:
        ``(log_Z [n], mu [N_tok, K], T [n, K, K])``, float64.
    """
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
