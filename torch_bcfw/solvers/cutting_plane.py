"""The 1-slack cutting-plane method (Joachims, Finley & Yu 2009; SVM-struct), a baseline of the BCFW paper.

Each iteration makes one batched oracle call over all ``n`` examples at the current ``w`` and adds one
*plane*: the joint labeling ``Y^j = (y_1*, ..., y_n*)`` enters the dual as the vertex ``alpha_i = e_{y_i*}`` of
every block at once, with

* ``a_j = 1/(lam n) sum_i psi_i(y_i*)``  (``Tensor[d]``, in the units of ``w``) and
* ``b_j = 1/n sum_i L_i(y_i*)``.

The restricted dual ``max_beta beta^T b - lam/2 ||sum_j beta_j a_j||^2`` over the simplex of plane weights (plane 0
the ground truth, ``a_0 = 0``, ``b_0 = 0``) is re-solved by pairwise Frank-Wolfe in the Gram matrix ``K_jk = <a_j,
a_k>``, warm-started, to an inner gap ``<= cp_inner_tol * max(1, |D|)``; ``w = sum_j beta_j a_j``, ``l = beta^T b``.
Every ``beta`` on the simplex is a feasible dual point, so the certified gap is exact whatever the inner accuracy.
No box constraints (models with ``weight_bounds`` need ``solver="bcfw"`` or ``"fw"``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import torch

from ..checks import saved_int, saved_tensor
from ..duals.fingerprint import features_fingerprint, labels_fingerprint
from .algorithm import Algorithm
from .options import OptionGroup, check_int, check_real

__all__ = ["CuttingPlane", "CuttingPlaneOptions", "solve_simplex_qp"]


def solve_simplex_qp(K, b, lam: float, beta, tol: float, max_iters: int):
    """Maximise ``beta^T b - lam/2 beta^T K beta`` over the simplex by pairwise Frank-Wolfe (exact line search) from
    ``beta`` (``float64[P]``, not modified), with ``K`` (``float64[P, P]``, PSD) and ``b`` (``float64[P]``) numpy
    arrays, until the inner gap ``max_j g_j - min_{beta_j > 0} g_j`` (``g = b - lam K beta``) is ``<= tol`` or for
    ``max_iters`` iterations.  Returns ``(beta, iterations, inner gap)``."""
    beta = np.array(beta, dtype=np.float64)
    Kb = K @ beta
    it, gap = 0, np.inf
    for it in range(1, max_iters + 1):
        g = b - lam * Kb
        s = int(np.argmax(g))
        a = int(np.argmin(np.where(beta > 0, g, np.inf)))
        gap = float(g[s] - g[a])
        if gap <= tol or s == a:
            break
        curv = lam * (K[s, s] + K[a, a] - 2.0 * K[s, a])
        step = beta[a] if curv <= 0 else min(gap / curv, beta[a])  # a drop step sets beta_a to exactly 0
        beta[s] += step
        beta[a] -= step
        Kb += step * (K[:, s] - K[:, a])
    return beta, it, gap


@dataclass
class CuttingPlaneOptions(OptionGroup):
    """The options of ``solver="cutting-plane"`` (SVM-struct's inner solve), given as ``cp_inner_tol``, ...

    Attributes:
        inner_tol: the restricted dual is solved to an inner gap ``<= inner_tol * max(1, |dual|)`` (default 1e-10);
            the certified gap is exact whatever this is.
        inner_iters: most pairwise FW steps per inner solve (default 10000).
    """

    prefix: ClassVar[str] = "cp"
    inner_tol: float = 1e-10
    inner_iters: int = 10000

    def __post_init__(self) -> None:
        self.inner_tol = float(check_real("cp_inner_tol", self.inner_tol, positive=True, finite=True))
        self.inner_iters = check_int("cp_inner_iters", self.inner_iters, 1)


class CuttingPlane(Algorithm):
    """``solver="cutting-plane"``: one full oracle pass adds one plane; the dual over the planes is re-solved.
    No averaging: the iterate is the fully corrective solution."""

    name = "cutting-plane"
    Options = CuttingPlaneOptions
    whole_passes = True

    def __init__(self, model, data, lam, options, state=None, bounds=None):
        super().__init__(model, data, lam, options)
        self.refuse_bcfw_extras(bounds)
        model.check_data(data)
        d, dev = model.n_features, data.device
        self.a = torch.zeros(1, d, dtype=torch.float64, device=dev)  # plane 0: the ground truth
        self.b = torch.zeros(1, dtype=torch.float64, device=dev)
        self.K = torch.zeros(1, 1, dtype=torch.float64, device=dev)
        self.beta = torch.ones(1, dtype=torch.float64, device=dev)
        self.w = torch.zeros(d, dtype=torch.float64, device=dev)
        self.ell = 0.0
        self.iteration = 0
        self.inner_iterations = 0
        self._phi_true = None

    def _add_plane(self) -> None:
        y = self.model.oracle(self.w, self.data, loss_augmented=True)
        if self._phi_true is None:
            self._phi_true = self.model.joint_feature_sum(self.data, self.data.y)
        a = (self._phi_true - self.model.joint_feature_sum(self.data, y)) / (self.lam * self.n)
        b = float(self.model.loss(self.data, y).sum()) / self.n
        k = self.a @ a
        self.a = torch.cat([self.a, a[None]])
        self.b = torch.cat([self.b, self.b.new_tensor([b])])
        P = self.K.shape[0]
        K = self.K.new_zeros(P + 1, P + 1)
        K[:P, :P] = self.K
        K[P, :P] = K[:P, P] = k
        K[P, P] = a @ a
        self.K = K
        self.beta = torch.cat([self.beta, self.beta.new_zeros(1)])

    def _solve(self) -> None:
        K, b = self.K.cpu().numpy(), self.b.cpu().numpy()
        beta = self.beta.cpu().numpy()
        dual = float(beta @ b) - 0.5 * self.lam * float(beta @ (K @ beta))
        cp = self.options.own
        tol = cp.inner_tol * max(1.0, abs(dual))
        beta, its, _ = solve_simplex_qp(K, b, self.lam, beta, tol, cp.inner_iters)
        self.beta = torch.from_numpy(beta).to(self.a.device)
        self.inner_iterations += its
        self.w = self.beta @ self.a
        self.ell = float(self.beta @ self.b)

    def advance(self, m: int) -> None:
        for _ in range(max(1, m // self.n)):
            self._add_plane()
            self._solve()
            self.iteration += 1
            self.oracle_calls += self.n

    def iterate(self):
        return self.w, self.ell

    def state_dict(self) -> dict:
        return {"a": self.a.cpu().clone(), "b": self.b.cpu().clone(), "K": self.K.cpu().clone(),
                "beta": self.beta.cpu().clone(), "iteration": self.iteration, "oracle_calls": self.oracle_calls,
                "inner_iterations": self.inner_iterations, "labels": labels_fingerprint(self.data),
                "features": features_fingerprint(self.data)}

    def load_state_dict(self, sd: dict) -> None:
        if sd.get("labels") != labels_fingerprint(self.data):
            raise ValueError("the cutting-plane state was saved for other examples (labels or order differ)")
        if sd.get("features") != features_fingerprint(self.data):
            raise ValueError("cannot warm-start the cutting-plane method on data whose features differ from the data "
                             "it was saved from: its planes are feature-space vectors. Start from scratch")
        dev, d = self.w.device, self.a.shape[1]
        a = saved_tensor(sd.get("a"), "cutting-plane a", (None, d))
        m = a.shape[0]
        b = saved_tensor(sd.get("b"), "cutting-plane b", (m,))
        beta = saved_tensor(sd.get("beta"), "cutting-plane beta", (m,), lo=-1e-12, hi=1 + 1e-12)
        if m == 0 or abs(float(beta.sum()) - 1.0) > 1e-8:
            raise ValueError("cutting-plane beta must lie on the simplex")
        if not torch.allclose(a[0], torch.zeros(d, dtype=torch.float64)) or float(b[0]) != 0.0:
            raise ValueError("cutting-plane plane 0 must be the ground truth (a = 0, b = 0)")
        K = saved_tensor(sd.get("K"), "cutting-plane K", (m, m))
        gram = a @ a.T
        if not torch.allclose(K, gram, rtol=1e-8, atol=1e-8 * (1 + float(gram.abs().max()))):
            raise ValueError("cutting-plane K is not the Gram matrix of the planes a")
        self.a, self.b, self.K, self.beta = a.to(dev), b.to(dev), K.to(dev), beta.to(dev)
        self.w = self.beta @ self.a
        self.ell = float(self.beta @ self.b)
        self.iteration = saved_int(sd["iteration"], "iteration", 0)
        self.oracle_calls = saved_int(sd["oracle_calls"], "oracle_calls", 0)
        self.inner_iterations = saved_int(sd["inner_iterations"], "inner_iterations", 0)
