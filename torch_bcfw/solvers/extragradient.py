"""The dual extragradient method (Taskar, Lacoste-Julien & Jordan 2006: Nesterov's dual extrapolation).

**Saddle-point form.**  With ``z_i`` in the polytope ``Z_i`` of example ``i``'s labelings in the parts
representation (a chain: token marginals and expected transition counts; a matching: link marginals), ``phi_i(z_i) =
F_i z_i`` and ``L_i(z_i) = c_i^T z_i + d_i`` are linear and the objective is ``min_w max_z Lag(w, z) = lam/2 ||w||^2 +
sum_i [b_i(z_i) - <w, a_i(z_i)>]``, ``a_i = (phi_i(y_i) - F_i z_i) / n``, ``b_i = L_i / n`` (the regulariser stays in
the problem).  The monotone operator is ``G_w = lam (w - A(z))`` with ``A(z) = 1/(lam n) sum_i (phi_i(y_i) - F_i
z_i)`` (the library's ``w = A alpha``) and ``G_z_i = -(c_i + F_i^T w) / n``.  ``G`` is affine with Lipschitz
constant ``L = (lam + sqrt(lam^2 + 4 sigma^2)) / 2`` (``sigma`` the norm of the coupling in the geometry's norms);
the step is ``eta = xg_step_scale / L``.

* **Chains: entropic geometry**: ``sigma^2 = sum_i R_i^2 / n^2`` with a closed-form bound ``R_i >= max_y ||phi_i(y)
  - phi_i(y_i)||``; a prox step is a Gibbs distribution (batched forward-backward); the prox centre is uniform.
* **Matchings: Euclidean geometry**: ``sigma^2 = lambda_max(sum_i F_i F_i^T) / n^2``; a prox step is the projection
  onto the matching polytope (within a certified ``xg_proj_tol``, exactly feasible); the centre is the ground truth.

**The iteration** (``s`` the running sum of ``-G``, ``u_hat`` the centre, ``T(u, g) = argmax_u' <g, u'> - 1/eta
D_h(u', u)``): ``v = T(u_hat, s)``, ``u^t = T(v, -G(v))``, ``s <- s - G(u^t)``; the averaged iterate is uniform.  In
the memory-efficient form of Taskar et al. (Sec. 4), ``s_z = (t c + F^T W) / n`` with ``W = sum_k w^k``: every ``z``
is regenerated from ``W`` and ``t``, so the state is ``O(d)``.

:meth:`iterate` and :meth:`averaged` are ``(A(z), b(z))`` of feasible ``z``: exact dual points.  An iteration counts
as ``2 n`` oracle calls (two projections per example).  Needs a model with a
:meth:`~torch_bcfw.models.base.StructuredModel.prox_geometry` (chains, matchings); no box constraints.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import torch

from ..checks import saved_float, saved_int, saved_tensor
from ..duals.fingerprint import features_fingerprint, labels_fingerprint
from .algorithm import Algorithm
from .options import OptionGroup, check_int, check_real

__all__ = ["Extragradient", "ExtragradientOptions", "lipschitz_constant"]


def lipschitz_constant(lam: float, sigma: float, gamma: float = 1.0, rho: float = 1.0) -> float:
    """The norm of ``[[lam I, B], [-B^T, 0]]`` (``||B|| = sigma``) from the norm ``sqrt(gamma ||w||^2 + rho ||z||^2)``
    to its dual: ``(lam / gamma + sqrt(lam^2 / gamma^2 + 4 sigma^2 / (gamma rho))) / 2``."""
    a = lam / gamma
    return 0.5 * (a + math.sqrt(a * a + 4.0 * sigma * sigma / (gamma * rho)))


@dataclass
class ExtragradientOptions(OptionGroup):
    """The options of ``solver="extragradient"`` (Taskar et al. 2006), given as ``xg_step_scale``, ...

    Attributes:
        step_scale: the step is ``step_scale / L``, ``L`` the Lipschitz constant of the saddle-point operator
            (default 1; above 1 convergence is not guaranteed, the certificate stays exact).
        proj_tol: on matchings: certified distance of every projection onto the matching polytope from the exact one
            (default 1e-9; the point is feasible whatever this is).
        proj_iters: on matchings: most Newton steps per projection (default 50).
    """

    prefix: ClassVar[str] = "xg"
    step_scale: float = 1.0
    proj_tol: float = 1e-9
    proj_iters: int = 50

    def __post_init__(self) -> None:
        self.step_scale = float(check_real("xg_step_scale", self.step_scale, positive=True, finite=True))
        self.proj_tol = float(check_real("xg_proj_tol", self.proj_tol, positive=True, finite=True))
        self.proj_iters = check_int("xg_proj_iters", self.proj_iters, 1)


def _geometry(model, data, lam, xg: ExtragradientOptions):
    geo = model.prox_geometry(data, lam, xg.proj_tol, xg.proj_iters)
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
    whole_passes = True
    Options = ExtragradientOptions

    def __init__(self, model, data, lam, options, state=None, bounds=None):
        super().__init__(model, data, lam, options)
        self.refuse_bcfw_extras(bounds)
        model.check_data(data)
        xg = self.options.own
        self.geo = _geometry(model, data, lam, xg)
        self.geometry = self.geo.kind
        self.sigma = self.geo.sigma()
        self.gamma = self.rho = 1.0  # weights of the w and z parts of the distance-generating function
        self.lipschitz = lipschitz_constant(lam, self.sigma, self.gamma, self.rho)
        self.eta = xg.step_scale / self.lipschitz
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
        dev = self.W.device
        for key in ("W", "AZ", "w_cur", "W_prev", "v_w"):
            setattr(self, key, saved_tensor(sd.get(key), f"extragradient {key}", tuple(self.W.shape)).to(dev))
        self.B, self.l_cur = saved_float(sd["B"], "extragradient B"), saved_float(sd["l_cur"], "extragradient l_cur")
        self.t = saved_int(sd["t"], "extragradient t", 0)
        self.oracle_calls = saved_int(sd["oracle_calls"], "oracle_calls", 0)
        self.eta = float(sd["eta"])
        if self.geometry == "euclidean":
            self.geo.load_warm_state(sd["warm"])
