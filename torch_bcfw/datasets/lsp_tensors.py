"""LSP Extended for the pose task as plain torch tensors: the fixed split, grid targets, edge statistics, augmentation.

:class:`LSPPoseSplits` loads the fixed split of :mod:`torch_bcfw.datasets.lsp` (train = images 1-1500,
test = 1501-2000), letterboxed to ``size x size``, and derives what the pictorial-structures head needs on the
``G x G`` grid: ``mean_offsets`` / ``offset_scales`` ``[13, 2]`` of the tree edges' child - parent displacements
(with ``n_types = K > 1`` also the k-means ``type_offsets`` / ``type_scales`` ``[13, K, 2]``), and per image the
true ``cells`` (invisible joints imputed along the tree), the ``torso`` with the documented fallback
(:func:`~torch_bcfw.datasets.lsp.torso_with_fallback`) and the ``pck_torso`` without it.  It needs no Lightning
(the ``vision`` / ``pose`` extras are enough); :class:`~torch_bcfw.tasks.lsp_data.LSPPoseDataModule` adds the
Lightning data loaders on top of it.

Each split is a :class:`PoseTensors` whose ``fields`` dict holds, for ``N`` images: ``image`` uint8
``[N, 3, S, S]``, ``joints`` float32 ``[N, 14, 2]`` (x, y) frame pixels (NaN where invisible), ``visible`` bool
``[N, 14]``, ``cells`` long ``[N, 14, 2]`` (y, x), ``torso`` float64 ``[N]`` (grid units), ``pck_torso`` float32
``[N]`` (frame pixels, NaN: left out of PCK), with mixture types ``types`` long ``[N, 13]``, and with cross-fitting
(training images only) ``fold`` long ``[N]``.  Its items, and so the batches a ``DataLoader`` collates from them
(``[B, ...]``), are the same fields with ``image`` as float32 in [0, 1].
"""
from __future__ import annotations

from pathlib import Path

import torch
from torch import Tensor

from ..inference.tree import LSP_TREE_EDGES
from ..io.tree_file import load_tree, save_tree
from ..models.pose import (
    impute_positions,
    mean_offsets,
    nearest_types,
    offset_scales,
    offset_types,
)
from .lsp import (
    joints_to_grid,
    load_lsp_extended,
    mirror_joints,
    reference_torso,
    torso_size,
    torso_with_fallback,
)

__all__ = ["LSPPoseSplits", "PoseTensors", "augment_batch"]


class PoseTensors(torch.utils.data.Dataset):
    """One split as tensors: ``fields`` maps each field name to a tensor with the images on dim 0 (see the module
    docstring for the fields and their shapes); items are dicts of one image, ``image`` as float32 ``[3, S, S]`` in
    [0, 1]."""

    def __init__(self, fields: dict):
        self.fields = fields

    def __len__(self) -> int:
        return len(self.fields["image"])

    def __getitem__(self, i: int) -> dict:
        out = {k: v[i] for k, v in self.fields.items()}
        out["image"] = out["image"].to(torch.float32) / 255.0
        return out


def augment_batch(batch: dict, max_shift: int, flip: bool = True, generator: torch.Generator | None = None) -> dict:
    """Random horizontal flip (left/right joints swapped; if ``flip``) and integer translation by up to
    ``max_shift`` pixels, per image.

    ``batch`` holds at least ``image`` float ``[B, 3, S, S]``, ``joints`` float ``[B, 14, 2]`` (x, y) frame pixels
    and ``visible`` bool ``[B, 14]``.  Only these three are changed (the fields the CNN's training loss uses), in a
    new dict with the same shapes; joints moved out of the frame become invisible (and NaN).
    """
    images, joints, visible = batch["image"].clone(), batch["joints"].clone(), batch["visible"].clone()
    B, _, S, _ = images.shape
    flipped = (torch.rand(B, generator=generator) < 0.5) & flip
    images[flipped] = images[flipped].flip(-1)
    joints[flipped], visible[flipped] = mirror_joints(joints[flipped], visible[flipped], S)
    if max_shift > 0:
        pad = torch.nn.functional.pad(images, (max_shift,) * 4)
        shifts = torch.randint(-max_shift, max_shift + 1, (B, 2), generator=generator)
        for b in range(B):
            dx, dy = int(shifts[b, 0]), int(shifts[b, 1])
            images[b] = pad[b, :, max_shift - dy : max_shift - dy + S, max_shift - dx : max_shift - dx + S]
        joints = joints + shifts[:, None, :].to(joints.dtype)
        inside = ((joints >= 0) & (joints <= S)).all(-1)
        visible = visible & inside
        joints[~visible] = float("nan")
    return {**batch, "image": images, "joints": joints, "visible": visible}


class LSPPoseSplits:
    """LSP Extended (fixed split) for a heatmap CNN under a pictorial-structures head, as plain torch tensors.

    After :meth:`setup`: ``train`` / ``test`` (and with ``holdout`` ``val``, else ``None``) are
    :class:`PoseTensors`; ``mean_offsets`` / ``offset_scales`` float64 ``[13, 2]`` (grid cells) are the mean and the
    scaled standard deviation of the training displacements along :data:`~torch_bcfw.inference.tree.LSP_TREE_EDGES`;
    with ``n_types > 1`` ``type_offsets`` / ``type_scales`` ``[13, K, 2]`` are those of the k-means types (else
    ``None``); ``reference_torso`` (float, frame pixels) is the torso fallback's reference.

    Args:
        root: the LSP Extended folder, with ``joints.mat`` and ``images/``.
        size: side ``S`` of the letterboxed frame (pixels).
        grid_size: ``G`` of the pose grid (``S`` must be a multiple of ``G``).
        limit, test_limit: first images of the train / test split only (quick runs).
        batch_size: training batch of :class:`~torch_bcfw.tasks.lsp_data.LSPPoseDataModule` (shuffled; the
            LightningModule augments it); eval_batch_size: its test and ``bcfw_dataloader`` batch.  Unused here.
        deformation_scale: the head's displacement scales are this many standard deviations of the training
            displacements (:func:`~torch_bcfw.models.pose.offset_scales`); larger values condition the SSVM better.
        n_types: mixture types per tree edge (k-means of the training displacements; 1: one quadratic per edge).
        head_holdout: the last this many training images are held out of the CNN's training (``train_dataloader``)
            and are the head's training set (``bcfw_dataloader``), so that the head sees heatmaps of images the CNN
            has not seen, as at test time.  0 (default): both use every training image.
        cross_fit: ``K >= 2``: every training image gets a ``fold`` (image ``i`` of the split in fold ``i % K``) for
            a cross-fitted :class:`~torch_bcfw.tasks.pose.PoseTreeCNN` with the same ``cross_fit``; excludes
            ``head_holdout``.  1 (default): no folds.
        holdout: the last this many training images are the validation split (``val_dataloader``,
            ``bcfw_val_dataloader``: held-out data for :class:`~torch_bcfw.lightning.lam_choice.LamChoice` and epoch
            selection), out of the CNN's and the head's training and of the offsets' statistics.  0 (default): none.
        cache_dir: where to keep the preprocessed tensors (``lsp_{split}_{S}_{limit}.safetensors``); ``None``: no
            cache.
        seed: seed of the shuffling, the augmentation and the k-means initialisation.
    """

    def __init__(self, root: str, size: int = 128, grid_size: int = 32, limit: int | None = None,
                 test_limit: int | None = None, batch_size: int = 32, eval_batch_size: int = 100,
                 deformation_scale: float = 4.0, cache_dir: str | None = None, seed: int = 0, n_types: int = 1,
                 head_holdout: int = 0, cross_fit: int = 1, holdout: int = 0):
        super().__init__()  # cooperative: LSPPoseDataModule's LightningDataModule.__init__ runs here
        if size % grid_size:
            raise ValueError(f"size ({size}) must be a multiple of grid_size ({grid_size})")
        self.root, self.size, self.grid_size = root, int(size), int(grid_size)
        self.limit, self.test_limit = limit, test_limit
        self.batch_size, self.eval_batch_size = int(batch_size), int(eval_batch_size)
        if not deformation_scale > 0:
            raise ValueError(f"deformation_scale must be > 0, got {deformation_scale}")
        self.deformation_scale = float(deformation_scale)
        for name, v, least in (("n_types", n_types, 1), ("head_holdout", head_holdout, 0), ("cross_fit", cross_fit, 1),
                               ("holdout", holdout, 0)):
            if int(v) < least:
                raise ValueError(f"{name} must be >= {least}, got {v}")
        if int(cross_fit) > 1 and int(head_holdout):
            raise ValueError("cross_fit and head_holdout exclude each other (both decide which images the head "
                             "learns from): give one of them")
        self.n_types, self.head_holdout, self.cross_fit = int(n_types), int(head_holdout), int(cross_fit)
        self.cache_dir, self.seed, self.holdout = cache_dir, int(seed), int(holdout)
        self.train = self.val = self.test = None
        self.mean_offsets = self.offset_scales = self.type_offsets = self.type_scales = None

    def _raw(self, split: str, limit: int | None) -> dict:
        """The letterboxed images of ``split`` (its first ``limit``), from the cache when there: ``image`` uint8
        ``[N, 3, S, S]``, ``joints`` float32 ``[N, 14, 2]``, ``visible`` bool ``[N, 14]``, ``scale`` float32 ``[N]``
        (frame pixels per original pixel)."""
        path = None
        if self.cache_dir is not None:
            path = Path(self.cache_dir) / f"lsp_{split}_{self.size}_{limit}.safetensors"
            if path.is_file():
                return load_tree(path, what="LSP cache file")
        samples = load_lsp_extended(self.root, split, size=self.size, limit=limit)
        raw = {"image": torch.stack([(s.image * 255).round().to(torch.uint8) for s in samples]),
               "joints": torch.stack([s.joints for s in samples]),
               "visible": torch.stack([s.visible for s in samples]),
               "scale": torch.tensor([s.scale for s in samples], dtype=torch.float32)}
        if path is not None:
            save_tree(raw, path)
        return raw

    def _fields(self, raw: dict, reference: float) -> dict:
        """The fields of a :class:`PoseTensors` (module docstring) from :meth:`_raw`'s ``[N, ...]`` tensors, with the
        edge statistics of :meth:`setup` and the torso fallback's ``reference`` (frame pixels)."""
        G, S = self.grid_size, self.size
        grid = joints_to_grid(raw["joints"].to(torch.float64), S, G)
        cells = impute_positions(grid, raw["visible"], G, self.mean_offsets)
        fields = {"image": raw["image"], "joints": raw["joints"], "visible": raw["visible"], "cells": cells,
                  "torso": torso_with_fallback(raw["joints"].double(), raw["visible"], raw["scale"].double(),
                                               reference) * (G / S),
                  "pck_torso": torso_size(raw["joints"], raw["visible"])}
        if self.type_offsets is not None:
            fields["types"] = nearest_types(cells, self.type_offsets, LSP_TREE_EDGES)
        return fields

    @property
    def head_offsets(self) -> Tensor | None:
        """The offsets of the head's :class:`~torch_bcfw.models.pose.PoseTree`: ``[13, K, 2]`` with mixture types,
        else ``[13, 2]`` (``None`` before :meth:`setup`)."""
        return self.type_offsets if self.n_types > 1 else self.mean_offsets

    @property
    def head_scales(self) -> Tensor | None:
        """The displacement scales of the head, shaped like :attr:`head_offsets`."""
        return self.type_scales if self.n_types > 1 else self.offset_scales

    def setup(self, stage: str | None = None) -> None:
        """Load (or read from ``cache_dir``) the splits and derive the edge statistics and the fields; a second
        call does nothing.  ``stage`` is ignored (Lightning's hook signature)."""
        if self.train is not None:
            return
        train, test = self._raw("train", self.limit), self._raw("test", self.test_limit)
        n_train = len(train["image"]) - self.holdout
        if n_train < 1:
            raise ValueError(f"holdout ({self.holdout}) leaves no training image (of {len(train['image'])})")
        val = {k: v[n_train:] for k, v in train.items()}
        train = {k: v[:n_train] for k, v in train.items()}
        grid = joints_to_grid(train["joints"].to(torch.float64), self.size, self.grid_size)
        self.mean_offsets = mean_offsets(grid, train["visible"], LSP_TREE_EDGES)
        self.offset_scales = offset_scales(grid, train["visible"], LSP_TREE_EDGES) * self.deformation_scale
        if self.n_types > 1:
            self.type_offsets, types = offset_types(grid, train["visible"], self.n_types, LSP_TREE_EDGES, seed=self.seed)
            self.type_scales = offset_scales(grid, train["visible"], LSP_TREE_EDGES, types=types,
                                             n_types=self.n_types) * self.deformation_scale
        self.reference_torso = reference_torso(train["joints"], train["visible"], train["scale"])
        self.train = PoseTensors(self._fields(train, self.reference_torso))
        if self.cross_fit > 1:
            if len(self.train) < self.cross_fit:
                raise ValueError(f"cross_fit={self.cross_fit} folds need at least as many training images, got "
                                 f"{len(self.train)}")
            self.train.fields["fold"] = torch.arange(len(self.train)) % self.cross_fit
        self.test = PoseTensors(self._fields(test, self.reference_torso))
        self.val = PoseTensors(self._fields(val, self.reference_torso)) if self.holdout else None
        if self.head_holdout >= len(self.train):
            raise ValueError(f"head_holdout ({self.head_holdout}) leaves no image to train the CNN "
                             f"({len(self.train)} training images)")

    def _split(self, head: bool) -> torch.utils.data.Dataset:
        """The head's (``head=True``: all, or the ``head_holdout`` last) or the CNN's (all but those) training
        images."""
        n = len(self.train)
        if self.head_holdout == 0:
            return self.train
        idx = range(n - self.head_holdout, n) if head else range(n - self.head_holdout)
        return torch.utils.data.Subset(self.train, list(idx))
