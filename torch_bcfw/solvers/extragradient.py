"""The dual extragradient method (Taskar, Lacoste-Julien & Jordan 2006: Nesterov's dual extrapolation) on the
regularised SSVM objective of every solver of this library.

**Saddle-point form.**  With ``z = (z_1, ..., z_n)``, ``z_i`` in the polytope ``Z_i`` of example ``i``'s labelings in
the parts representation (a chain: token marginals ``mu_i [L_i, K]`` and expected transition counts ``T_i [K, K]``;
a matching: link marginals ``z_i in [0, 1]^{m_i x f_i}``, each word in one link at most), the joint feature
``phi_i(z_i) = F_i z_i`` and the loss ``L_i(z_i) = c_i^T z_i + d_i`` are linear, and::

    min_w lam/2 ||w||^2 + 1/n sum_i max_y [L_i(y) - <w, psi_i(y)>]
      = min_w max_{z in Z}  Lag(w, z) = lam/2 ||w||^2 + sum_i [ b_i(z_i) - <w, a_i(z_i)> ],
    a_i(z_i) = (phi_i(y_i) - F_i z_i) / n,    b_i(z_i) = L_i(z_i) / n.

The regulariser stays in the problem (the study of Boileau et al. 2019 dropped it): ``w`` is unconstrained and the
monotone operator ``G(w, z) = (d Lag / dw, -d Lag / dz)`` is::

    G_w   = lam w - sum_i a_i(z_i) = lam (w - A(z)),     A(z) = 1/(lam n) sum_i (phi_i(y_i) - F_i z_i),
    G_z_i = -(c_i + F_i^T w) / n                          (minus the loss-augmented part scores at w, over n).

``A(z)`` is the library's ``w = A alpha``: for any feasible ``z``, ``(A(z), l = sum_i b_i(z_i))`` is a dual point
with value ``l - lam/2 ||A(z)||^2``.

**Lipschitz constant and step.**  ``G`` is affine with linear part ``[[lam I, B], [-B^T, 0]]`` (``B`` the coupling
of ``w`` and ``z`` divided by ``n``), whose norm is exactly ``L = (lam + sqrt(lam^2 + 4 sigma^2)) / 2`` with
``sigma = ||B||`` in the norms of the geometry (``max(lam, sigma) <= L <= lam + sigma``).  The step is
``eta = xg_step_scale / L`` (default ``xg_step_scale = 1``: ``eta = 1/L``, the step of the theory; the ergodic
duality gap of the averaged iterate falls as ``O(L D / t)``).

* **Chains: entropic (Bregman / KL) geometry.**  ``z_i`` are the marginals of a distribution ``alpha_i`` over the
  labelings and the distance-generating function is ``1/2 ||w||^2 + sum_i sum_y alpha_i(y) log alpha_i(y)``,
  1-strongly convex in ``||u||^2 = ||w||_2^2 + sum_i ||alpha_i||_1^2``.  ``sigma^2 = sum_i R_i^2 / n^2`` with
  ``R_i >= max_y ||phi_i(y) - phi_i(y_i)||_2``, bounded in closed form by
  ``R_i^2 <= 2 sum_{t,s} |<x_t, x_s> + 1| + 4 + 2 (L_i - 1)^2`` (emission and label bias, start and end,
  transitions; exact in the first term for non-negative features such as OCR's pixels).  A prox step from a
  Gibbs distribution with log-potentials ``theta`` along part scores ``s`` is the Gibbs distribution of
  ``theta + eta s``: its marginals come from the expectation oracle (forward-backward batched over the examples,
  CPU or CUDA: :func:`~torch_bcfw.inference.forward_backward.shared_transition_marginals`, or
  :func:`~torch_bcfw.inference.forward_backward.chain_marginals` when the potentials overflow probability space).
  The prox centre is the uniform distribution (``theta = 0``).
* **Matchings: Euclidean geometry.**  ``h = 1/2 ||w||^2 + 1/2 sum_i ||z_i||^2``; ``sigma^2 = lambda_max(sum_i
  F_i F_i^T) / n^2``, computed exactly (a ``d x d`` eigenvalue problem).  A prox step is the Euclidean projection
  onto the matching polytope, solved by :func:`~torch_bcfw.inference.matching_projection.project_matching_polytope`
  for all pairs at once to a certified distance ``<= xg_proj_tol`` from the exact projection (projected Newton on
  its dual, interior-point start when needed; the returned point is exactly feasible whatever the accuracy).  The
  prox centre is the ground truth ``z_i = y_i`` (``w = A(z) = 0``).

**The iteration** (dual extrapolation; ``s`` the running sum of ``-G`` over the iterates, ``u_hat`` the centre)::

    v   = T(u_hat, s)              # lookahead: one projection per example
    u^t = T(v, -G(v))               # correction: one projection per example
    s  <- s - G(u^t)

with ``T(u, g) = argmax_{u'} <g, u'> - 1/eta D_h(u', u)`` the prox step, and the averaged iterate
``u_bar = 1/t sum_k u^k`` (uniform weights, as the theory's).

**The memory-efficient form** (Taskar et al. 2006, Sec. 4): nothing per example is stored.  By linearity
``s_z = sum_k -G_z(u^k) = (t c + F^T W) / n`` with ``W = sum_k w^k``, so the lookahead ``v_z`` is regenerated from
``W`` and ``t`` (for chains its log-potentials are ``eta / n`` times the loss-augmented part scores at ``W`` with
the loss counted ``t`` times; for matchings the point projected is ``y + eta / n (t c + F^T W)``), and the
correction ``u_z`` from ``v_z`` and ``v_w``.  The state is ``O(d)``: ``W``, ``sum_k A(z^k)``, ``sum_k b(z^k)``,
``t``, the current dual pair ``(A(z^t), b(z^t))`` and what regenerates ``z^t`` (the ``W`` of the previous iteration
and ``v_w``), plus, for matchings, the projections' row and column multipliers of the last iteration as warm starts
(``O(sum_i (m_i + f_i))``, not the ``O(sum_i m_i f_i)`` of the link marginals).

**Certificate.**  :meth:`iterate` is ``(A(z^t), b(z^t))`` of the current (projected, hence feasible) ``z^t`` and
:meth:`averaged` is ``(A(z_bar), b(z_bar))`` of the average (``A`` and ``b`` are affine, so their running sums give
them): both are exact dual points, and the loop's certificate (primal by an oracle pass at ``w``, dual
``l - lam/2 ||w||^2``) is an exact duality gap on the same axes as BCFW's.  (The extragradient's own ``w`` variable is
not certified: it is no ``A(z)``.)

**Accounting.**  One iteration makes two projections of every example, counted as ``2 n`` oracle calls (the
history's ``passes`` are oracle calls / n); ``max_passes`` and ``gap_check`` count iterations (``n`` units each), as
online EG's count its block updates.  Needs a model with a prox geometry
(:meth:`~torch_bcfw.models.base.StructuredModel.prox_geometry`, implemented in :mod:`torch_bcfw.duals.prox`: chains,
matchings); refuses box constraints and the BCFW refinements.  A saved state refuses to load on other examples or
features.

**In practice** (2-core CPU, one thread, against BCFW on the same machine): an effective pass costs about 12 ms on
OCR-small (BCFW 4), 27 ms on the Hansards alignment problem (BCFW 40) and 1.5 s on CoNLL-2000 (BCFW 0.26); the chain's
prox steps share one transition matrix across the examples, so their forward-backward runs in probability space
(:func:`~torch_bcfw.inference.forward_backward.shared_transition_marginals`, falling back to the log-space
recursions when the potentials overflow).  On the alignment problem (``lam = 0.003``) the last iterate's primal
suboptimality is about 2e-3 after 1000 effective passes (BCFW certifies 7e-4 after 50).  On chains with small
``lam`` the step ``1/L`` is very conservative (``L`` bounds the coupling over every pair of labelings, and a prox
step moves the marginals by ``eta / n`` times the scores) and the uniform prox centre is a poor dual point
(``A(z)`` is large): the primal stays far above the optimum for hundreds of passes; a larger ``xg_step_scale``
(10-100) helps only partly.  On tiny problems the last iterate converges linearly and the averaged one as ``O(1/t)``.
"""
from __future__ import annotations

import math

import torch

from ..duals.fingerprint import features_fingerprint, labels_fingerprint
from .algorithm import Algorithm

__all__ = ["Extragradient", "lipschitz_constant"]


def lipschitz_constant(lam: float, sigma: float, gamma: float = 1.0, rho: float = 1.0) -> float:
    """The norm of ``[[lam I, B], [-B^T, 0]]`` (``||B|| = sigma``) from the norm ``sqrt(gamma ||w||^2 + rho ||z||^2)``
    to its dual: ``(lam / gamma + sqrt(lam^2 / gamma^2 + 4 sigma^2 / (gamma rho))) / 2``."""
    a = lam / gamma
    return 0.5 * (a + math.sqrt(a * a + 4.0 * sigma * sigma / (gamma * rho)))


def _geometry(model, data, lam, options):
    geo = model.prox_geometry(data, lam, options.xg_proj_tol, options.xg_proj_iters)
    if geo is None:
        raise ValueError(
            f"extragradient needs prox steps on the labelings' polytope: an expectation (marginal) oracle for entropic "
            f"projections (chains) or the Euclidean projection onto the matching polytope (matchings); "
            f"{type(model).__name__} has neither (StructuredModel.prox_geometry returns None)"
        )
    return geo


class Extragradient(Algorithm):
    """``solver="extragradient"`` (see the module docstring).

    Attributes:
        eta: the step size; ``lipschitz``: the Lipschitz constant ``L`` of the operator; ``sigma``: the norm of
        its coupling block; ``t``: iterations done; ``geometry``: ``"entropic"`` or ``"euclidean"``.
    """

    name = "extragradient"

    def __init__(self, model, data, lam, options, state=None, bounds=None):
        super().__init__(model, data, lam, options)
        self.refuse_bcfw_extras(bounds)
        model.check_data(data)
        self.geo = _geometry(model, data, lam, options)
        self.geometry = self.geo.kind
        self.sigma = self.geo.sigma()
        self.gamma = self.rho = 1.0  # weights of the w and z parts of the distance-generating function
        self.lipschitz = lipschitz_constant(lam, self.sigma, self.gamma, self.rho)
        self.eta = options.xg_step_scale / self.lipschitz
        d, dev = model.n_features, data.device
        zeros = lambda: torch.zeros(d, dtype=torch.float64, device=dev)  # noqa: E731
        self.t = 0
        self.W = zeros()        # sum_k w^k
        self.AZ = zeros()       # sum_k A(z^k)
        self.B = 0.0            # sum_k b(z^k)
        self.w_cur, self.l_cur = self.geo.start()
        self.W_prev, self.v_w = zeros(), zeros()

    @property
    def work(self) -> int:
        return self.t * self.n

    def _iteration(self) -> None:
        eta, lam = self.eta, self.lam
        eta_w = eta / self.gamma
        v_w = -eta_w * lam * (self.W - self.AZ)                     # T(u_hat_w, s_w), u_hat_w = 0
        Av, Au, bu = self.geo.step(self.W, self.t, v_w, eta / self.rho)  # v_z, u_z (2 projections per example)
        u_w = v_w - eta_w * lam * (v_w - Av)                         # T(v_w, -G_w(v))
        self.W_prev, self.v_w = self.W, v_w
        self.W = self.W + u_w
        self.AZ = self.AZ + Au
        self.B += bu
        self.w_cur, self.l_cur = Au, bu
        self.t += 1
        self.oracle_calls += 2 * self.n

    def advance(self, m: int) -> None:
        for _ in range(max(1, m // self.n)):
            self._iteration()

    def iterate(self):
        return self.w_cur, self.l_cur

    def averaged(self):
        if not self.options.averaging or self.t == 0:
            return None
        return self.AZ / self.t, self.B / self.t

    def current_point(self):
        """The current dual point ``z^t`` regenerated from the state (chains: ``(mu, T)``; matchings: link marginals
        ``[N_links]``; ``None`` before the first iteration).  For checks: it is not stored."""
        if self.t == 0:
            return None
        return self.geo.point(self.W_prev, self.t - 1, self.v_w, self.eta / self.rho)

    def state_dict(self) -> dict:
        cpu = lambda t: t.detach().cpu().clone()  # noqa: E731
        return {"t": self.t, "oracle_calls": self.oracle_calls, "W": cpu(self.W), "AZ": cpu(self.AZ), "B": self.B,
                "w_cur": cpu(self.w_cur), "l_cur": float(self.l_cur), "W_prev": cpu(self.W_prev), "v_w": cpu(self.v_w),
                "eta": self.eta, "geometry": self.geometry, "warm": self.geo.warm_state(),
                "labels": labels_fingerprint(self.data), "features": features_fingerprint(self.data)}

    def load_state_dict(self, sd: dict) -> None:
        if sd.get("labels") != labels_fingerprint(self.data):
            raise ValueError("the extragradient state was saved for other examples (labels or order differ)")
        if sd.get("features") != features_fingerprint(self.data):
            raise ValueError("cannot warm-start the extragradient method on data whose features differ from the data "
                             "it was saved from: its sums are feature-space vectors. Start from scratch")
        if sd.get("geometry") != self.geometry:
            raise ValueError(f"the extragradient state is for the {sd.get('geometry')} geometry, this problem uses "
                             f"the {self.geometry} one")
        if not math.isclose(float(sd["eta"]), self.eta, rel_tol=1e-12):
            raise ValueError(f"the extragradient state was run with step {sd['eta']!r} but these options give "
                             f"{self.eta!r} (pass the same xg_step_scale)")
        if sd["W"].shape != self.W.shape:
            raise ValueError(f"the extragradient state has d = {sd['W'].shape[0]} but this problem has d = "
                             f"{self.W.shape[0]}")
        dev = self.W.device
        for key in ("W", "AZ", "w_cur", "W_prev", "v_w"):
            setattr(self, key, sd[key].to(dev, torch.float64).clone())
        self.B, self.l_cur = float(sd["B"]), float(sd["l_cur"])
        self.t, self.oracle_calls = int(sd["t"]), int(sd["oracle_calls"])
        self.eta = float(sd["eta"])
        if self.geometry == "euclidean":
            self.geo.load_warm_state(sd["warm"])
