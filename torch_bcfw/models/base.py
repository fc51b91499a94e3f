"""The model contract: what every structure implements and all a solver sees.

Notation (Lacoste-Julien et al. 2013): examples ``(x_i, y_i)``, joint feature map ``phi(x, y) in R^d``, task loss
``L_i(y) >= 0`` with ``L_i(y_i) = 0``.  Every solver minimises::

    P(w) = lam/2 ||w||^2 + 1/n sum_i max_y [ L_i(y) - <w, phi(x_i, y_i) - phi(x_i, y)> ]

A solver sees a model only through the methods of :class:`StructuredModel` and a dual state only through
:class:`~torch_bcfw.duals.base.DualState`.  Labelings are batched the way the model's data stores labels
(``LongTensor[B]`` for multiclass, packed ``LongTensor[N_tok]`` for sequences).
"""
from __future__ import annotations

from abc import ABC, abstractmethod

import torch
from torch import Tensor

from ..duals.dense import dense_dual_state
from ..duals.subgradient import SubgradientSteps

__all__ = ["StructuredModel"]


class StructuredModel(ABC):
    """Abstract structured model: joint features, task loss and max oracle."""

    #: dimension ``d`` of the joint feature map (and of the weight vector)
    n_features: int

    #: True when the exact oracle costs far more than scoring a few stored labelings (a max-flow, an assignment):
    #: ``preset="auto"`` then picks ``gap-pairwise-cache`` (Osokin et al. 2016, Sec. 5.1).
    expensive_oracle: bool = False

    #: which BCFW steps the dual state runs compiled on the CPU: ``"all"``, ``"plain"`` (uniform FW steps only) or
    #: ``"none"``; ``preset="auto"`` prefers what runs compiled.
    compiled_steps: str = "none"

    @abstractmethod
    def check_data(self, data, require_labels: bool = True) -> None:
        """Raise ``ValueError`` if ``data`` does not fit this model (shapes, label range, ...)."""

    @staticmethod
    def _check_labels(y: Tensor | None, require: bool, n_labels: int | None = None) -> None:
        """``ValueError`` when labels ``y`` are required but missing, or (with ``n_labels``) outside
        ``[0, n_labels)``."""
        if y is None:
            if require:
                raise ValueError("training data needs labels (y is None)")
            return
        if n_labels is not None and y.numel():
            lo, hi = int(y.min()), int(y.max())
            if lo < 0 or hi >= n_labels:
                raise ValueError(f"labels must lie in [0, {n_labels - 1}], got range [{lo}, {hi}]")

    @staticmethod
    def _flat_labels(data, y: Tensor, count: int, what: str = "labels") -> Tensor:
        """``y`` as a flat ``LongTensor`` on ``data``'s device, checked to hold ``count`` labels."""
        y = torch.as_tensor(y, device=data.device).long().reshape(-1)
        if y.shape[0] != count:
            raise ValueError(f"expected {count} {what}, got {y.shape[0]}")
        return y

    def check_weights(self, w: Tensor, data=None) -> None:
        """Raise ``ValueError`` if ``w`` has the wrong shape, is not finite, or sits on another device."""
        if w.dim() != 1 or w.shape[0] != self.n_features:
            raise ValueError(f"weights must have shape [{self.n_features}], got {tuple(w.shape)}")
        if data is not None and w.device != data.device:
            raise ValueError(f"weights are on {w.device} but the data is on {data.device}")
        if not bool(torch.isfinite(w).all()):
            raise ValueError("weights contain NaN or infinite values")

    @abstractmethod
    def joint_feature(self, data, y: Tensor) -> Tensor:
        """``phi(x_i, y_i')`` for every example of ``data`` and labeling ``y``: ``Tensor[n, d]`` (float64)."""

    def joint_feature_sum(self, data, y: Tensor) -> Tensor:
        """``sum_i phi(x_i, y_i')``: ``Tensor[d]``.  Models override this to avoid the ``[n, d]`` table."""
        return self.joint_feature(data, y).sum(0)

    @abstractmethod
    def loss(self, data, y: Tensor) -> Tensor:
        """Task loss ``L_i(y_i')`` against ``data``'s labels: ``Tensor[n]`` (float64), zero at the truth."""

    @abstractmethod
    def oracle(self, w: Tensor, data, loss_augmented: bool = True) -> Tensor:
        """Batched (loss-augmented) decoding of all examples of ``data`` at weights ``w: [d]``."""

    def marginals(self, w: Tensor, data, loss_augmented: bool = False):
        """The expectation oracle: marginals of ``p_i(y) ~ exp([L_i(y)] + <w, phi(x_i, y)>)`` where tractable
        (``NotImplementedError`` otherwise)."""
        raise NotImplementedError(f"{type(self).__name__} has no marginal (expectation) oracle: marginals over its "
                                  "labelings are not tractable or not implemented; use a solver with a max oracle "
                                  "(bcfw, fw, ssg, mp-bcfw, cutting-plane)")

    def decode(self, w: Tensor, data) -> Tensor:
        """Prediction ``argmax_y <w, phi(x, y)>`` for every example."""
        return self.oracle(w, data, loss_augmented=False)

    def score(self, w: Tensor, data, y: Tensor) -> Tensor:
        """``<w, phi(x_i, y_i')>`` for every example: ``Tensor[n]`` (float64)."""
        return self.joint_feature(data, y) @ w.to(torch.float64)

    def max_loss(self, data) -> Tensor:
        """``max_y L_i(y)`` per example (``Tensor[n]``); 1 for normalised losses."""
        return torch.ones(len(data), dtype=torch.float64, device=data.device)

    def weight_bounds(self):
        """Box constraints on the weights for an exact oracle, ``(lower, upper)`` (``Tensor[d]`` each, +-inf where
        free), or ``None`` (default).  The solvers keep ``w`` inside the box (Osokin et al. 2016, App. H)."""
        return None

    def head_ops(self):
        """The :mod:`torch_bcfw.head_ops` object a :class:`torch_bcfw.nn.StructuredHead` needs, or ``None``."""
        return None

    #: ``dual_state(data, lam, n_total=None)``: the per-block dual state for BCFW-type solvers (dense ``w_i`` by
    #: default, :func:`~torch_bcfw.duals.dense.dense_dual_state`); ``n_total``: the problem's number of examples when
    #: ``data`` is one shard of it (see :class:`~torch_bcfw.duals.base.DualState`).  A model with its own state
    #: overrides it.
    dual_state = dense_dual_state

    def subgradient_steps(self, data, lam: float, averaging: bool):
        """The state ``solver="ssg"`` steps on: :class:`~torch_bcfw.duals.subgradient.SubgradientSteps` (through
        :meth:`oracle` and :meth:`joint_feature`, any device) by default; a model with compiled steps overrides it."""
        return SubgradientSteps(self, data, lam, averaging)

    def builtin_oracle(self) -> bool:
        """True when :meth:`oracle` is the model's own decoder (not overridden), so a fused step loop of its dual
        state may run a compiled copy of it.  False by default."""
        return False

    def prox_geometry(self, data, lam: float, proj_tol: float, proj_iters: int):
        """The prox steps of ``solver="extragradient"`` on the polytope of this model's labelings (an object of
        :mod:`torch_bcfw.duals.prox`: entropic for chains, Euclidean for matchings), or ``None`` (default) when
        the model has none.  ``proj_tol`` / ``proj_iters``: accuracy and iteration cap of an iterative projection."""
        return None

    def hinge_terms(self, w: Tensor, data) -> tuple[Tensor, Tensor]:
        """Loss-augmented answers and their hinge values ``(y_star, H)``, ``H_i = L_i(y*) - <w, phi(x_i, y_i) -
        phi(x_i, y*)> >= 0`` (``Tensor[n]``, float64), from :meth:`loss` and :meth:`score` alone."""
        w64 = w.to(torch.float64)
        y_star = self.oracle(w, data, loss_augmented=True)
        H = self.loss(data, y_star) + self.score(w64, data, y_star) - self.score(w64, data, data.y)
        return y_star, H

    def config(self) -> dict:
        """JSON-serialisable constructor arguments (for saving results)."""
        return {}
