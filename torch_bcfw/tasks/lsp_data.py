"""LSP Extended for the pose task under Lightning: the fixed-order and shuffled loaders of the splits.

:class:`LSPPoseDataModule` is :class:`~torch_bcfw.datasets.lsp_tensors.LSPPoseSplits` (the fixed split as tensors,
the grid targets and the edge statistics of the pictorial-structures head; see that module for the fields and their
shapes) as a ``LightningDataModule``: it adds the data loaders only.  Batches are the fields with a batch dim
``[B, ...]`` and ``image`` float32 ``[B, 3, S, S]`` in [0, 1].
"""
from __future__ import annotations

import lightning.pytorch as pl
import torch

from ..datasets.lsp_tensors import LSPPoseSplits

__all__ = ["LSPPoseDataModule"]


class LSPPoseDataModule(LSPPoseSplits, pl.LightningDataModule):
    """LSP Extended (fixed split) for a heatmap CNN under a pictorial-structures head, as a ``LightningDataModule``.

    Takes the arguments of :class:`~torch_bcfw.datasets.lsp_tensors.LSPPoseSplits` (which loads, checks and derives
    everything in :meth:`setup`); ``batch_size`` is the shuffled training batch of :meth:`train_dataloader` (the
    LightningModule augments it), ``eval_batch_size`` that of the test, validation and ``bcfw_dataloader`` loaders.
    """

    def train_dataloader(self):
        """The CNN's training images (all but the ``head_holdout`` last ones), shuffled."""
        return torch.utils.data.DataLoader(self._split(head=False), batch_size=self.batch_size, shuffle=True,
                                           generator=torch.Generator().manual_seed(self.seed))

    def bcfw_dataloader(self):
        """The head's training images (all, or the ``head_holdout`` last ones) in a fixed order, no augmentation
        (for the BCFW callback)."""
        return torch.utils.data.DataLoader(self._split(head=True), batch_size=self.eval_batch_size, shuffle=False)

    def test_dataloader(self):
        return torch.utils.data.DataLoader(self.test, batch_size=self.eval_batch_size, shuffle=False)

    def val_dataloader(self):
        """The ``holdout`` validation images in a fixed order (none without ``holdout``)."""
        return [] if self.val is None else torch.utils.data.DataLoader(self.val, batch_size=self.eval_batch_size)

    def bcfw_val_dataloader(self):
        """The validation images, the held-out data of :class:`~torch_bcfw.lightning.lam_choice.LamChoice`."""
        if self.val is None:
            raise ValueError("LSPPoseDataModule has no validation split for bcfw_val_dataloader: give it holdout=N")
        return self.val_dataloader()
