"""Compiled BCFW step kernel for the linear chain with marginal dual state.

One call runs a whole sequence of block steps (oracle + line search + update) without
returning to Python; it implements exactly the steps of
:meth:`torch_bcfw.models.dual.DualState.block_step` for
:class:`torch_bcfw.models.chain.ChainDualState` (a test checks both give the same trajectory).

Layout (see :class:`torch_bcfw.models.chain.Chain`): emission ``We[F, K]``, per-label bias,
start and end biases ``[K]``, transitions ``trans[K, K]``.  Token features are given in CSR
form (``indptr[N_tok+1], indices[nnz], values[nnz]``) so binary pixels and sparse indicator
attributes cost only their non-zeros.

Block state: unary marginals ``mu[N_tok, K]`` and transition marginals ``T[n, K, K]`` with
``w_i = (phi_i(y_i) - phi_i(mu_i)) / (lam n)``.  For a direction ``delta = e_{y*} - mu_i``,
``||phi_i(delta)||^2 = sum_{t,t'} G_i[t,t'] <delta_t, delta_t'> + ||delta_0||^2 + ||delta_{L-1}||^2
+ ||delta_T||^2`` with ``G_i = X_i X_i^T + 1`` (the ``+1`` is the per-label bias feature).
"""
from __future__ import annotations

import numpy as np
from numba import njit

from ..inference.viterbi import viterbi_numba
from ..stepsize import average_weight, step_size


@njit(cache=True, fastmath=True)
def _unary_scores(s, L, indptr, indices, values, We, bias, start, end, U):
    K = We.shape[1]
    for t in range(L):
        tok = s + t
        for c in range(K):
            U[t, c] = 0.0
        for p in range(indptr[tok], indptr[tok + 1]):
            f = indices[p]
            v = values[p]
            for c in range(K):
                U[t, c] += v * We[f, c]
        for c in range(K):
            U[t, c] += bias[c]
    for c in range(K):
        U[0, c] += start[c]
    for c in range(K):
        U[L - 1, c] += end[c]


@njit(cache=True, fastmath=True)
def _add_direction(a, b, s, L, i, indptr, indices, values, D, dT, We, bias, start, end, trans,
                   uWe, ubias, ustart, uend, utrans):
    """``w += a * phi_i(delta)`` and, when ``b != 0``, ``u += b * phi_i(delta)`` in the same sweep.

    The direction is ``D[L, K]`` (unary marginals) and ``dT[K, K]`` (transition marginals).
    """
    K = We.shape[1]
    for t in range(L):
        tok = s + t
        for p in range(indptr[tok], indptr[tok + 1]):
            f = indices[p]
            v = a * values[p]
            for c in range(K):
                We[f, c] += v * D[t, c]
            if b != 0.0:
                vb = b * values[p]
                for c in range(K):
                    uWe[f, c] += vb * D[t, c]
        for c in range(K):
            bias[c] += a * D[t, c]
            ubias[c] += b * D[t, c]
    for c in range(K):
        start[c] += a * D[0, c]
        end[c] += a * D[L - 1, c]
        ustart[c] += b * D[0, c]
        uend[c] += b * D[L - 1, c]
    for p in range(K):
        for c in range(K):
            trans[p, c] += a * dT[p, c]
            utrans[p, c] += b * dT[p, c]


@njit(cache=True, fastmath=True)
def _direction_sqnorm(i, L, D, dT, gram, gram_off):
    """``||phi_i(delta)||^2`` from the Gram matrix ``G_i = X_i X_i^T + 1`` (see the module docstring)."""
    K = D.shape[1]
    sq = 0.0
    g0 = gram_off[i]
    for t in range(L):
        for t2 in range(L):
            dot = 0.0
            for c in range(K):
                dot += D[t, c] * D[t2, c]
            sq += gram[g0 + t * L + t2] * dot
    for c in range(K):
        sq += D[0, c] * D[0, c] + D[L - 1, c] * D[L - 1, c]
    for p in range(K):
        for c in range(K):
            sq += dT[p, c] * dT[p, c]
    return sq


@njit(cache=True)
def chain_bcfw_steps(
    order, step_code, averaging, lam, k0,
    indptr, indices, values, y, offsets, gram, gram_off,
    We, bias, start, end, trans,
    uWe, ubias, ustart, uend, utrans,
    mu, T, block_ell, ells, gaps,
):
    """Run BCFW steps on the blocks ``order[j]``; write block gaps to ``gaps[j]``.

    ``ells = [l, l_u]`` (dual linear part and its averaging accumulator) is updated in place;
    ``k0`` is the global step counter before the first step.  Returns the new counter.
    """
    n = offsets.shape[0] - 1
    K = We.shape[1]
    Lmax = 0
    for i in range(n):
        if offsets[i + 1] - offsets[i] > Lmax:
            Lmax = offsets[i + 1] - offsets[i]
    U = np.empty((Lmax, K))
    Ua = np.empty((Lmax, K))
    D = np.empty((Lmax, K))
    dT = np.empty((K, K))
    ystar = np.empty(Lmax, dtype=np.int64)
    delta = np.empty((2, K))
    bp = np.empty((Lmax, K), dtype=np.int64)
    lam_n = lam * n
    k = k0
    for j in range(order.shape[0]):
        i = order[j]
        s = offsets[i]
        L = offsets[i + 1] - s
        _unary_scores(s, L, indptr, indices, values, We, bias, start, end, U)
        inv_L = 1.0 / L
        for t in range(L):
            for c in range(K):
                Ua[t, c] = U[t, c] + inv_L
            Ua[t, y[s + t]] = U[t, y[s + t]]
        viterbi_numba(Ua[:L], trans, ystar[:L], delta, bp)
        # scores of the corner y* and of the current block state mu_i under w
        score_star = 0.0
        score_mu = 0.0
        mistakes = 0
        for t in range(L):
            score_star += U[t, ystar[t]]
            if ystar[t] != y[s + t]:
                mistakes += 1
            for c in range(K):
                score_mu += U[t, c] * mu[s + t, c]
        for t in range(1, L):
            score_star += trans[ystar[t - 1], ystar[t]]
        for p in range(K):
            for c in range(K):
                score_mu += T[i, p, c] * trans[p, c]
        ell_s = mistakes * inv_L / n
        ell_i = block_ell[i]
        num = (score_star - score_mu) / n - ell_i + ell_s
        # direction delta = e_{y*} - mu_i and its squared feature norm
        for t in range(L):
            for c in range(K):
                D[t, c] = -mu[s + t, c]
            D[t, ystar[t]] += 1.0
        for p in range(K):
            for c in range(K):
                dT[p, c] = -T[i, p, c]
        for t in range(1, L):
            dT[ystar[t - 1], ystar[t]] += 1.0
        sq = _direction_sqnorm(i, L, D, dT, gram, gram_off)
        den = sq / (lam_n * n)
        gaps[j] = num
        gamma = step_size(step_code, num, den, k, n)
        if gamma != 0.0:
            a = -gamma / lam_n
            new_ell_i = (1.0 - gamma) * ell_i + gamma * ell_s
            b = 0.0
            if averaging:
                cw = average_weight(k)
                b = a * cw
                ells[1] += cw * (new_ell_i - ell_i)
            _add_direction(a, b, s, L, i, indptr, indices, values, D, dT, We, bias, start, end, trans,
                           uWe, ubias, ustart, uend, utrans)
            for t in range(L):
                for c in range(K):
                    mu[s + t, c] += gamma * D[t, c]
            for p in range(K):
                for c in range(K):
                    T[i, p, c] += gamma * dT[p, c]
            ells[0] += new_ell_i - ell_i
            block_ell[i] = new_ell_i
        k += 1
    return k
