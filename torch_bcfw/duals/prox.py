"""Prox geometries of the extragradient method: the polytope of a model's labelings, its prox steps and the
dual points they give.

A geometry maps a point ``z`` of the polytope (marginals for a chain, link marginals for a matching) to the dual pair
``(A(z), b(z))``, measures the coupling norm ``sigma`` and takes the lookahead and correction prox steps of
:class:`~torch_bcfw.solvers.extragradient.Extragradient`.  A model names its geometry by
:meth:`~torch_bcfw.models.base.StructuredModel.prox_geometry`; the solver uses ``kind``, ``sigma()``, ``start()``,
``step(W_prev, t, v_w, eta)``, ``point(...)``, ``warm_state()`` and ``load_warm_state(sd)``.

* :class:`EntropicChainGeometry` (chains): KL prox steps whose marginals come from forward-backward
  (:func:`~torch_bcfw.inference.forward_backward.shared_transition_marginals`); ``sigma`` from a closed-form bound
  (per-sequence Gram matrices, :func:`~torch_bcfw.duals.chain.sequence_grams`).
* :class:`EuclideanMatchingGeometry` (matchings): Euclidean projections onto the bipartite matching polytope
  (:func:`~torch_bcfw.inference.matching_projection.project_matching_polytope`, warm-started by the previous row
  and column multipliers); ``sigma`` exact from a ``d x d`` eigenvalue problem.
"""
from __future__ import annotations

import math

import torch
from torch import Tensor

from ..inference.forward_backward import shared_transition_marginals
from ..inference.matching_projection import PAD_VALUE, project_matching_polytope
from .chain import sequence_grams

__all__ = ["EntropicChainGeometry", "EuclideanMatchingGeometry"]


class EntropicChainGeometry:
    """Entropic prox steps on the chain's marginal polytopes (see the module docstring).

    Args:
        model: a :class:`~torch_bcfw.models.chain.Chain` (its expectation oracle: ``unary_scores``,
            ``loss_unaries``, ``features_from_marginals``, ``expected_loss``, ``unpack``).
        data: its :class:`~torch_bcfw.data.sequences.SequenceData`.
        lam: the regularisation.
    """

    kind = "entropic"

    def __init__(self, model, data, lam: float):
        self.model, self.data, self.lam, self.n = model, data, lam, len(data)
        self.loss_unaries = model.loss_unaries(data)
        self.phi_true = model.joint_feature_sum(data, data.y)
        self.centre = torch.zeros_like(self.loss_unaries)  # prox centre: the uniform distribution (theta = 0)

    def sigma(self) -> float:
        indptr, indices, values = (t.cpu() for t in self.data.x_csr())
        off = self.data.offsets.cpu()
        gram, gram_off = sequence_grams(indptr, indices, values.to(torch.float64), off, self.data.n_inputs)
        seg = torch.repeat_interleave(torch.arange(self.n), gram_off.diff())
        node = torch.zeros(self.n, dtype=torch.float64).index_add_(0, seg, gram.abs())
        L = off.diff().to(torch.float64)
        R2 = 2.0 * node + 4.0 + 2.0 * (L - 1.0) ** 2
        return math.sqrt(float(R2.sum())) / self.n

    def start(self):
        """``(A, b)`` of the prox centre."""
        W = torch.zeros(self.model.n_features, dtype=torch.float64, device=self.data.device)
        mu, T = self.marginals(W, 0.0, 0.0)
        return self._pair(mu, T.sum(0))

    def _pair(self, mu, T_sum):
        A = (self.phi_true - self.model.features_from_marginals(self.data, mu, T_sum)) / (self.lam * self.n)
        b = float(self.model.expected_loss(self.data, mu).sum()) / self.n
        return A, b

    def marginals(self, W: Tensor, loss_weight: float, scale: float):
        """Marginals of the Gibbs distributions with log-potentials ``scale (scores(W) + loss_weight loss)``."""
        U = self.model.unary_scores(W, self.data)
        node = self.centre + scale * (U + loss_weight * self.loss_unaries)
        trans = scale * self.model.unpack(W)[4]
        return shared_transition_marginals(node, trans, self.data.offsets)

    def step(self, W_prev: Tensor, t: int, v_w: Tensor, eta: float):
        """One lookahead and one correction: ``(A(v_z), A(u_z), b(u_z))``."""
        c = eta / self.n
        mu, T = self.marginals(W_prev, float(t), c)
        Av, _ = self._pair(mu, T.sum(0))
        mu, T = self.marginals(W_prev + v_w, float(t + 1), c)  # theta_v + eta/n (scores(v_w) + loss), by linearity
        Au, bu = self._pair(mu, T.sum(0))
        return Av, Au, bu

    def point(self, W_prev: Tensor, t: int, v_w: Tensor, eta: float):
        """The correction ``z^t`` itself: ``(mu [N_tok, K], T [n, K, K])``."""
        return self.marginals(W_prev + v_w, float(t + 1), eta / self.n)

    def warm_state(self) -> dict:
        return {}

    def load_warm_state(self, sd: dict) -> None:
        """Nothing to restore: the entropic steps are exact and start from nothing."""


class EuclideanMatchingGeometry:
    """Euclidean projections onto the matching polytope (see the module docstring).

    Args:
        model: a :class:`~torch_bcfw.models.matching.Matching` (``normalizers``, ``loss_link_costs``, ``miss_cost``).
        data: its :class:`~torch_bcfw.data.matching.MatchingData`.
        lam: the regularisation.
        tol, iters: certified distance to the exact projection and iteration cap of
            :func:`~torch_bcfw.inference.matching_projection.project_matching_polytope`.
    """

    kind = "euclidean"

    def __init__(self, model, data, lam: float, tol: float, iters: int):
        self.model, self.data, self.lam, self.n = model, data, lam, len(data)
        self.tol, self.iters = tol, iters
        dev = data.device
        Z = model.normalizers(data)
        pid = data.pair_ids()
        self.Xn = data.x.to(torch.float64) / Z[pid][:, None]  # phi_i(z) = Xn_i^T z_i
        self.c = model.loss_link_costs(data) / Z[pid]       # L_i(z) = const_i + c_i^T z_i
        self.const = float((model.miss_cost * data.y.to(torch.float64) / Z[pid]).sum())
        self.y = data.y.to(torch.float64)
        j, k = data.link_positions()
        self.index = (pid, j, k)
        self.shape = (self.n, int(data.sizes[:, 0].max()), int(data.sizes[:, 1].max()))
        self.base = torch.full(self.shape, PAD_VALUE, dtype=torch.float64, device=dev)
        B, M, F = self.shape
        zeros = lambda k: torch.zeros(B, k, dtype=torch.float64, device=dev)  # noqa: E731
        self.p = {"v": zeros(M), "u": zeros(M)}  # warm starts: row / column multipliers of the two projections
        self.q = {"v": zeros(F), "u": zeros(F)}
        self.warm = False
        self.last_dist = 0.0

    def sigma(self) -> float:
        G = self.Xn.T @ self.Xn
        return math.sqrt(max(float(torch.linalg.eigvalsh(G.cpu())[-1]), 0.0)) / self.n

    def start(self):
        return torch.zeros(self.model.n_features, dtype=torch.float64, device=self.data.device), 0.0

    def _pair(self, z):
        A = self.Xn.T @ (self.y - z) / (self.lam * self.n)
        b = (self.const + float(self.c @ z)) / self.n
        return A, b

    def project(self, a_links: Tensor, which: str, warm: bool) -> Tensor:
        a = self.base.clone()
        a[self.index] = a_links
        res = project_matching_polytope(a, self.p[which] if warm else None, self.q[which] if warm else None,
                                        tol=self.tol, max_iters=self.iters)
        self.p[which], self.q[which] = res.p, res.q
        self.last_dist = max(self.last_dist, float(res.dist.max()))
        return res.z[self.index]

    def _lookahead(self, W_prev, t, eta, warm):
        return self.project(self.y + eta / self.n * (t * self.c + self.Xn @ W_prev), "v", warm)

    def step(self, W_prev: Tensor, t: int, v_w: Tensor, eta: float):
        self.last_dist = 0.0
        vz = self._lookahead(W_prev, t, eta, self.warm)
        Av, _ = self._pair(vz)
        uz = self.project(vz + eta / self.n * (self.c + self.Xn @ v_w), "u", self.warm)
        self.warm = True
        Au, bu = self._pair(uz)
        return Av, Au, bu

    def point(self, W_prev: Tensor, t: int, v_w: Tensor, eta: float):
        """The correction ``z^t`` itself (``[N_links]``), recomputed from scratch (no warm start)."""
        saved = ({k: v.clone() for k, v in self.p.items()}, {k: v.clone() for k, v in self.q.items()})
        vz = self._lookahead(W_prev, t, eta, False)
        uz = self.project(vz + eta / self.n * (self.c + self.Xn @ v_w), "u", False)
        self.p, self.q = saved
        return uz

    def warm_state(self) -> dict:
        return {"p_v": self.p["v"].cpu().clone(), "p_u": self.p["u"].cpu().clone(), "q_v": self.q["v"].cpu().clone(),
                "q_u": self.q["u"].cpu().clone(), "warm": self.warm}

    def load_warm_state(self, sd: dict) -> None:
        dev = self.data.device
        for key in ("p_v", "p_u", "q_v", "q_u"):
            if sd[key].shape != getattr(self, key[0])[key[2]].shape:
                raise ValueError("the extragradient state does not match this data (sentence sizes)")
        self.p = {"v": sd["p_v"].to(dev, torch.float64).clone(), "u": sd["p_u"].to(dev, torch.float64).clone()}
        self.q = {"v": sd["q_v"].to(dev, torch.float64).clone(), "u": sd["q_u"].to(dev, torch.float64).clone()}
        self.warm = bool(sd["warm"])
