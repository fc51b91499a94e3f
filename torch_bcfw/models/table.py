"""A structured model given by explicit tables (tiny enumerable problems).  Data is a
:class:`~torch_bcfw.data.sequences.MulticlassData` whose ``x[:, 0]`` holds the example's row in the tables and whose
``y`` holds the ground truth (:meth:`TableModel.data`).
"""
from __future__ import annotations

import torch
from torch import Tensor

from ..data.sequences import MulticlassData
from .base import StructuredModel

__all__ = ["TableModel"]


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
