"""Multiclass SVM of Crammer and Singer as an SSVM.

``phi(x, y) = e_y (x) [x, 1]``: the feature vector copied into the block of class ``y``
(with an optional constant feature for a per-class bias).  ``w`` is laid out class-major,
``w.view(n_labels, F')``.  Loss: 0-1 (the normalised Hamming loss of a length-1 sequence).
"""
from __future__ import annotations

import torch
from torch import Tensor

from ..checks import check_bool, check_int
from ..data.sequences import MulticlassData
from ..head_ops import MulticlassHeadOps
from .base import StructuredModel

__all__ = ["Multiclass"]


class Multiclass(StructuredModel):
    """Crammer-Singer multiclass model.

    Args:
        n_features: input dimension ``F``; ``None``: learned from the data (see :meth:`sized`).
        n_labels: number of classes ``K`` (>= 2); ``None``: learned from the data.
        bias: append a constant feature so every class has a bias weight.

    ``d = K * (F + bias)``.  ``Multiclass()`` without sizes is a model to be sized:
    :class:`~torch_bcfw.SSVM` sizes it at ``fit`` from ``X`` and the distinct labels (scikit-learn's convention);
    :func:`~torch_bcfw.fit` and the heads need a sized model.
    """

    #: the dual state runs plain BCFW steps in one compiled loop (the argmax inline), the refinements interpreted
    compiled_steps = "plain"

    def __init__(self, n_features: int | None = None, n_labels: int | None = None, bias: bool = True):
        self.n_inputs = None if n_features is None else check_int(n_features, "n_features", minimum=1)
        self.n_labels = None if n_labels is None else check_int(n_labels, "n_labels", minimum=2)
        self.bias = check_bool(bias, "bias")
        self.n_features = None if not self.is_sized else self.n_labels * (self.n_inputs + int(self.bias))

    @property
    def is_sized(self) -> bool:
        """Whether both sizes ``F`` and ``K`` are known (``d`` is defined)."""
        return self.n_inputs is not None and self.n_labels is not None

    def sized(self, n_features: int, n_labels: int) -> "Multiclass":
        """This model with the sizes of the data: ``self`` when it has them, else a new :class:`Multiclass` with
        ``F = n_features``, ``K = n_labels`` (a size given at construction must match)."""
        for name, mine, given in (("n_features", self.n_inputs, n_features), ("n_labels", self.n_labels, n_labels)):
            if mine is not None and mine != given:
                raise ValueError(f"the data has {name} = {given} but the model was built with {name} = {mine}")
        return self if self.is_sized else type(self)(n_features, n_labels, self.bias)

    def _check_sized(self) -> None:
        if not self.is_sized:
            raise ValueError(f"Multiclass(n_features={self.n_inputs}, n_labels={self.n_labels}) has no sizes yet: "
                             "give n_features and n_labels, or fit it through SSVM, which learns them from the data")

    def config(self) -> dict:
        return {"n_features": self.n_inputs, "n_labels": self.n_labels, "bias": self.bias}

    def builtin_oracle(self) -> bool:
        """True unless a subclass overrides :meth:`oracle` (it then gets the generic steps)."""
        return type(self).oracle is Multiclass.oracle

    def dual_state(self, data, lam: float, n_total: int | None = None):
        """Dense ``w_i`` with compiled plain steps (:class:`~torch_bcfw.duals.multiclass.MulticlassDualState`)."""
        from ..duals.multiclass import MulticlassDualState

        return MulticlassDualState(self, data, lam, n_total)

    def head_ops(self) -> MulticlassHeadOps:
        self._check_sized()
        return MulticlassHeadOps(self)

    def check_data(self, data, require_labels: bool = True) -> None:
        self._check_sized()
        if not isinstance(data, MulticlassData):
            raise TypeError(f"Multiclass expects MulticlassData, got {type(data).__name__}")
        if data.x.shape[1] != self.n_inputs:
            raise ValueError(f"features have dimension {data.x.shape[1]} but the model expects {self.n_inputs}")
        self._check_labels(data.y, require_labels, self.n_labels)

    def _inputs(self, data: MulticlassData, dtype=torch.float64) -> Tensor:
        x = data.x.to(dtype)
        if self.bias:
            x = torch.cat([x, x.new_ones(x.shape[0], 1)], 1)
        return x

    def joint_feature(self, data: MulticlassData, y: Tensor) -> Tensor:
        y = self._flat_labels(data, y, len(data))
        x = self._inputs(data)
        out = x.new_zeros(len(data), self.n_labels, x.shape[1])
        out[torch.arange(len(data), device=x.device), y] = x
        return out.reshape(len(data), -1)

    def joint_feature_sum(self, data: MulticlassData, y: Tensor) -> Tensor:
        y = self._flat_labels(data, y, len(data))
        x = self._inputs(data)
        out = x.new_zeros(self.n_labels, x.shape[1])
        out.index_add_(0, y, x)
        return out.reshape(-1)

    def loss(self, data: MulticlassData, y: Tensor) -> Tensor:
        y = self._flat_labels(data, y, len(data))
        return (y != data.y).to(torch.float64)

    def scores(self, w: Tensor, data: MulticlassData) -> Tensor:
        """Class scores ``Tensor[n, K]``."""
        self.check_weights(w, data)
        x = self._inputs(data, w.dtype)
        return x @ w.view(self.n_labels, -1).T

    def oracle(self, w: Tensor, data: MulticlassData, loss_augmented: bool = True) -> Tensor:
        s = self.scores(w, data)
        if loss_augmented:
            s = s + 1.0
            s[torch.arange(len(data), device=s.device), data.y] -= 1.0
        return s.argmax(1)

    def score(self, w: Tensor, data: MulticlassData, y: Tensor) -> Tensor:
        y = self._flat_labels(data, y, len(data))
        s = self.scores(w.to(torch.float64), data)
        return s.gather(1, y[:, None])[:, 0]
