"""A structured model given by explicit tables (tiny enumerable problems) and the toy problem of Osokin et al.
2016, App. C (:func:`app_c_toy`).  Data is a :class:`~torch_bcfw.data.sequences.MulticlassData` whose ``x[:, 0]`` holds
the example's row in the tables and whose ``y`` holds the ground truth (:meth:`TableModel.data`).
"""
from __future__ import annotations

import math

import torch
from torch import Tensor

from ..data.sequences import MulticlassData
from .base import StructuredModel

__all__ = ["TableModel", "app_c_toy"]


class TableModel(StructuredModel):
    """``phi(x_i, y) = features[i, y]`` (``Tensor[n, m, d]``), ``L_i(y) = losses[i, y]`` (``Tensor[n, m]``,
    zero at each example's ground truth).  Ties in the oracle go to the lowest label."""

    def __init__(self, features: Tensor, losses: Tensor):
        features = torch.as_tensor(features, dtype=torch.float64)
        losses = torch.as_tensor(losses, dtype=torch.float64)
        if features.dim() != 3 or losses.shape != features.shape[:2]:
            raise ValueError("features must be [n, m, d] and losses [n, m]")
        self.features, self.losses = features, losses
        self.n_features = features.shape[2]
        self.n_labels = features.shape[1]

    def data(self, y: Tensor) -> MulticlassData:
        """Data of all table rows with ground truth ``y`` (``LongTensor[n]``)."""
        n = self.features.shape[0]
        return MulticlassData(torch.arange(n, dtype=torch.float64)[:, None], torch.as_tensor(y).long())

    def config(self) -> dict:
        return {"features": self.features.tolist(), "losses": self.losses.tolist()}

    def _rows(self, data) -> Tensor:
        return data.x[:, 0].long()

    def check_data(self, data, require_labels: bool = True) -> None:
        if not isinstance(data, MulticlassData):
            raise TypeError(f"TableModel expects MulticlassData, got {type(data).__name__}")
        rows = self._rows(data)
        if int(rows.min()) < 0 or int(rows.max()) >= self.features.shape[0]:
            raise ValueError("data rows out of the table")
        self._check_labels(data.y, require_labels, self.n_labels)

    def joint_feature(self, data, y: Tensor) -> Tensor:
        y = torch.as_tensor(y).long().reshape(-1)
        return self.features[self._rows(data), y]

    def loss(self, data, y: Tensor) -> Tensor:
        y = torch.as_tensor(y).long().reshape(-1)
        return self.losses[self._rows(data), y]

    def oracle(self, w: Tensor, data, loss_augmented: bool = True) -> Tensor:
        rows = self._rows(data)
        n, m, d = self.features.shape
        s = (self.features.reshape(n * m, d) @ w.to(torch.float64)).view(n, m)[rows]
        if loss_augmented:
            s = s + self.losses[rows]
        return s.argmax(1)

    def max_loss(self, data) -> Tensor:
        return self.losses[self._rows(data)].max(1).values


def app_c_toy(n: int, K: int) -> tuple[TableModel, MulticlassData, float]:
    """The toy problem of App. C, ``(model, data, lam = 1/n)``, on which gap sampling needs ``O(n + t)`` oracle
    calls where uniform sampling needs ``O(n t)`` for ``t`` steps on the hard example.

    Labels ``{0..K}`` (0 is the truth), 0-1 loss, ``phi(x_i, 0) = 0``; example 0 is *hard*:
    ``phi(x_0, k) = -e_k / sqrt(2)``; examples ``1..n-1`` are *easy*: ``phi(x_i, k) = -e_{K+1}``
    (coordinates ``e_1..e_K`` are indices ``0..K-1``, ``e_{K+1}`` is index ``K``).  After ``t <= K`` FW
    steps on the hard example its block gap is ``1/(2 n t)``; the first step on any easy example closes
    every easy gap for good.
    """
    d = K + 1
    feats = torch.zeros(n, K + 1, d, dtype=torch.float64)
    for k in range(1, K + 1):
        feats[0, k, k - 1] = -1.0 / math.sqrt(2.0)
        feats[1:, k, K] = -1.0
    losses = torch.ones(n, K + 1, dtype=torch.float64)
    losses[:, 0] = 0.0
    model = TableModel(feats, losses)
    return model, model.data(torch.zeros(n, dtype=torch.long)), 1.0 / n
