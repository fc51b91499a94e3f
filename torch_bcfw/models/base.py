"""The model contract: what every structure implements and all a solver sees.

Notation (Lacoste-Julien et al. 2013): examples ``(x_i, y_i)``, ``i = 1..n``; joint feature
map ``phi(x, y) in R^d``; task loss ``L_i(y) >= 0`` with ``L_i(y_i) = 0``; score
``<w, phi(x_i, y)>``.  The SSVM objective minimised by every solver is::

    P(w) = lam/2 ||w||^2 + 1/n sum_i max_y [ L_i(y) - <w, phi(x_i, y_i) - phi(x_i, y)> ]

A model implements:

* :meth:`StructuredModel.joint_feature` -- ``phi`` for a batch of labelings, ``Tensor[B, d]``;
* :meth:`StructuredModel.loss` -- ``L_i(y)`` for a batch, ``Tensor[B]``;
* :meth:`StructuredModel.oracle` -- *batched* loss-augmented decoding
  ``argmax_y L_i(y) + <w, phi(x_i, y)>`` (``loss_augmented=False``: plain decoding);
* :meth:`StructuredModel.score` -- ``<w, phi(x_i, y)>`` for a batch;
* :meth:`StructuredModel.dual_state` -- the per-block dual state the BCFW family works on (the states live in
  :mod:`torch_bcfw.duals`).  The default (:class:`~torch_bcfw.duals.dense.DenseDualState`) stores one dense
  ``w_i in R^d`` per example; a structured model can return a compact one instead (the chain
  stores per-position label marginals and transition marginals, from which ``w_i`` is implicit);
* :meth:`StructuredModel.prox_geometry` -- optional: the prox steps of the extragradient method on the
  polytope of the model's labelings (``None`` when the model has none).

A solver sees a model only through these methods and a dual state only through the methods of
:class:`~torch_bcfw.duals.base.DualState`; fused kernels are capabilities of a state, never a solver's
knowledge of a concrete model.

Labelings are batched the way the model's data stores labels (``LongTensor[B]`` for
multiclass, packed ``LongTensor[N_tok]`` for sequences).
"""
from __future__ import annotations

from abc import ABC, abstractmethod

import torch
from torch import Tensor

__all__ = ["StructuredModel"]


class StructuredModel(ABC):
    """Abstract structured model: joint features, task loss and max oracle."""

    #: dimension ``d`` of the joint feature map (and of the weight vector)
    n_features: int

    #: True when the exact oracle solves a combinatorial problem that costs far more than scoring a few stored
    #: labelings (a max-flow, an assignment, distance transforms over every position); False for the dynamic
    #: programs and enumerations the compiled kernels run in microseconds (a chain's Viterbi, a multiclass argmax).
    #: ``preset="auto"`` reads it: ``gap-pairwise-cache`` when True (Osokin et al. 2016, Sec. 5.1) -- a property of
    #: the problem, so that the choice never depends on a clock.
    expensive_oracle: bool = False

    #: which BCFW steps the model's dual state runs in compiled loops on the CPU: ``"all"`` (every sampling and
    #: refinement: a chain), ``"plain"`` (uniform FW steps only: the graph cut) or ``"none"`` (every step is
    #: interpreted torch code).  ``preset="auto"`` prefers what runs compiled.
    compiled_steps: str = "none"

    # -------------------------------------------------------------- data checks
    @abstractmethod
    def check_data(self, data, require_labels: bool = True) -> None:
        """Raise ``ValueError`` if ``data`` does not fit this model (shapes, label range, ...)."""

    def check_weights(self, w: Tensor, data=None) -> None:
        """Raise ``ValueError`` if ``w`` has the wrong shape, is not finite, or sits on another device."""
        if w.dim() != 1 or w.shape[0] != self.n_features:
            raise ValueError(f"weights must have shape [{self.n_features}], got {tuple(w.shape)}")
        if data is not None and w.device != data.device:
            raise ValueError(f"weights are on {w.device} but the data is on {data.device}")
        if not bool(torch.isfinite(w).all()):
            raise ValueError("weights contain NaN or infinite values")

    # -------------------------------------------------------------- the contract
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
        """The expectation oracle (online EG, entropic extragradient): the marginals of the Gibbs distribution
        ``p_i(y) ~ exp([L_i(y)] + <w, phi(x_i, y)>)``, where they are tractable.  Models that implement it
        document the returned parts; the others raise ``NotImplementedError``."""
        raise NotImplementedError(
            f"{type(self).__name__} has no marginal (expectation) oracle: marginals over its labelings are not "
            "tractable or not implemented; use a solver with a max oracle (bcfw, fw, ssg, mp-bcfw, cutting-plane)"
        )

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
        """Box constraints the model needs on its weights, ``(lower, upper)`` (``Tensor[d]`` each, +-inf where
        free), or ``None`` (default).  E.g. a graph-cut model needs its pairwise weights ``>= 0`` for the
        oracle to be exact.  The solvers keep ``w`` inside the box (Osokin et al. 2016, App. H)."""
        return None

    def head_ops(self):
        """The differentiable scores, decoding and loss a :class:`torch_bcfw.nn.StructuredHead` needs on this
        model (an object of :mod:`torch_bcfw.head_ops`), or ``None`` (default): no generic ``torch.nn`` head."""
        return None

    def dual_state(self, data, lam: float, n_total: int | None = None):
        """The per-block dual state for BCFW-type solvers (dense ``w_i`` by default); ``n_total``: the problem's
        number of examples when ``data`` is one shard of it (see :class:`~torch_bcfw.duals.base.DualState`)."""
        from ..duals.dense import DenseDualState

        return DenseDualState(self, data, lam, n_total)

    def builtin_oracle(self) -> bool:
        """True when :meth:`oracle` is the model's own decoder, not overridden by a subclass (the chain's Viterbi,
        the graph cut): a fused step loop of its dual state may then run its compiled copy of it instead of calling
        :meth:`oracle` from Python.  False by default."""
        return False

    def prox_geometry(self, data, lam: float, proj_tol: float, proj_iters: int):
        """The prox steps of ``solver="extragradient"`` on the polytope of this model's labelings (an object of
        :mod:`torch_bcfw.duals.prox`: entropic for chains, Euclidean for matchings), or ``None`` (default) when
        the model has none.  ``proj_tol`` / ``proj_iters``: accuracy and iteration cap of an iterative projection."""
        return None

    # -------------------------------------------------------------- conveniences
    def hinge_terms(self, w: Tensor, data) -> tuple[Tensor, Tensor]:
        """Loss-augmented answers and their hinge values.

        Returns ``(y_star, H)`` with ``H_i = L_i(y*) - <w, phi(x_i, y_i) - phi(x_i, y*)> >= 0``
        (``Tensor[n]``, float64), computed from :meth:`loss` and :meth:`score` independently of
        any dual quantity.
        """
        w64 = w.to(torch.float64)
        y_star = self.oracle(w, data, loss_augmented=True)
        H = self.loss(data, y_star) + self.score(w64, data, y_star) - self.score(w64, data, data.y)
        return y_star, H

    def config(self) -> dict:
        """JSON-serialisable constructor arguments (for saving results)."""
        return {}
