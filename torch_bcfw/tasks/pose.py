"""A heatmap CNN under a BCFW-solved pictorial-structures head (the example of ``configs/pose_lsp.yaml``).

:class:`PoseTreeCNN` trains :class:`HeatmapCNN` (or a :class:`CrossFittedCNN` of several) with a soft-target
cross-entropy per visible joint; its log-softmax heatmaps are the unary features of a :class:`PoseHead` on a
:class:`~torch_bcfw.models.PoseTree`, solved by :class:`~torch_bcfw.lightning.BCFWCallback`.  Test reports
PCK@``alpha`` of the heatmaps' per-joint argmax and of the tree head (:func:`~torch_bcfw.metrics.pck.compare_pck`)
and the SSVM task loss.  Data: :class:`~torch_bcfw.tasks.lsp_data.LSPPoseDataModule`.
"""
from __future__ import annotations

import math

import lightning.pytorch as pl
import torch
from torch import Tensor, nn
from torch.nn import functional as F

from ..data.poses import PoseData
from ..datasets.lsp import grid_to_joints, joints_to_grid
from ..datasets.lsp_tensors import augment_batch
from ..inference.subcell import argmax_positions
from ..inference.tree import LSP_TREE_EDGES, edge_ends
from ..inference.tree_mixture import select_types
from ..metrics.pck import compare_pck
from ..models.pose import PoseTree
from ..nn import StructuredHead
from ..vision.heatmaps import log_heatmaps, soft_targets
from .eval_hooks import cosine_schedule

__all__ = ["CrossFittedCNN", "HeatmapCNN", "PoseHead", "PoseTreeCNN", "log_maps"]


class _Block(nn.Module):
    def __init__(self, width: int, dilation: int):
        super().__init__()
        self.conv1 = nn.Conv2d(width, width, 3, padding=dilation, dilation=dilation, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)

    def forward(self, x: Tensor) -> Tensor:
        h = F.relu(self.bn1(self.conv1(x)))
        return F.relu(x + self.bn2(self.conv2(h)))


class HeatmapCNN(nn.Module):
    """``[B, 3, S, S]`` images in [0, 1] -> joint heatmap logits ``[B, J, S/4, S/4]``.

    Args:
        n_joints: ``J``, the output maps (14 joint heatmaps, plus ``2 E K`` edge-type maps for a head with type
            features: :func:`log_maps`); stem: channels of the stride-2 stem; width: channels of the residual blocks;
        dilations: one residual block (two 3x3 convolutions) per entry, the first one dilated;
        grid_size: ``S/4``; when given, a learned per-joint prior map ``[J, G, G]`` is added to the logits
            (the people of LSP are centred, so joint positions have a strong prior).
        channels_last: keep the convolution weights and activations in the channels-last memory format (faster
            on CPU).
    """

    def __init__(self, n_joints: int = 14, stem: int = 24, width: int = 48, dilations=(1, 2, 4, 8),
                 grid_size: int | None = None, channels_last: bool = True):
        super().__init__()
        self.channels_last = bool(channels_last)
        self.prior = None if grid_size is None else nn.Parameter(torch.zeros(n_joints, grid_size, grid_size))
        self.stem = nn.Sequential(
            nn.Conv2d(3, stem, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(stem), nn.ReLU(inplace=True),
            nn.Conv2d(stem, width, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(width), nn.ReLU(inplace=True),
        )
        self.blocks = nn.Sequential(*[_Block(width, int(d)) for d in dilations])
        self.out = nn.Conv2d(width, n_joints, 1)
        if self.channels_last:
            self.to(memory_format=torch.channels_last)

    def forward(self, images: Tensor) -> Tensor:
        if self.channels_last:
            images = images.contiguous(memory_format=torch.channels_last)
        logits = self.out(self.blocks(self.stem(images - 0.5)))
        return logits if self.prior is None else logits + self.prior


def log_maps(logits: Tensor, n_joints: int = 14, n_edges: int = 0, n_types: int = 1) -> tuple[Tensor, Tensor | None]:
    """Split CNN outputs ``[B, J + 2 E K, G, G]`` into log-probability maps.

    Returns:
        ``(logp [B, J, G, G], logq [B, E, K, 2, G, G] | None)``: ``logp`` the joint heatmaps (log-softmax over the
        cells); ``logq[:, e, :, s]`` the log-probabilities of the ``K`` types of edge ``e`` at every cell, seen from
        its child (``s = 0``) and parent (``s = 1``) end (log-softmax over the types; channel ``J + (2 e + s) K + k``);
        ``None`` when ``n_edges == 0``.
    """
    B, C, G, _ = logits.shape
    if C != n_joints + 2 * n_edges * n_types:
        raise ValueError(f"expected {n_joints} + 2 * {n_edges} * {n_types} channels, got {C}")
    logp = log_heatmaps(logits[:, :n_joints])
    if n_edges == 0:
        return logp, None
    logq = F.log_softmax(logits[:, n_joints:].reshape(B, n_edges, 2, n_types, G, G), dim=3)
    return logp, logq.transpose(2, 3)


def _ensemble(maps: list[Tensor]) -> Tensor:
    """``log mean_k exp(maps[k])``: the mixture of the members' (normalised) distributions."""
    return torch.logsumexp(torch.stack(maps), dim=0) - math.log(len(maps))


class CrossFittedCNN(nn.Module):
    """``K`` :class:`HeatmapCNN` s for cross-fitting: CNN ``k`` (``nets[k]``) is trained without the images of fold
    ``k``, so every training image gets heatmaps from a CNN that never saw it, as at test time.

    ``forward(images, folds)`` with ``folds`` ``LongTensor[B]`` (values in ``[0, K)``): log-probability heatmaps
    ``[B, J, G, G]``, image ``b`` mapped by CNN ``folds[b]``; ``folds=None``: the ensemble
    ``log mean_k softmax(CNN_k(images))``.  Arguments after ``n_folds`` are those of :class:`HeatmapCNN`; with
    ``type_maps = (E, K)`` every CNN also predicts edge-type maps (:func:`log_maps`), which :meth:`maps` returns too.
    """

    def __init__(self, n_folds: int, n_joints: int = 14, stem: int = 24, width: int = 48, dilations=(1, 2, 4, 8),
                 grid_size: int | None = None, channels_last: bool = True, type_maps: tuple[int, int] | None = None):
        super().__init__()
        if int(n_folds) < 2:
            raise ValueError(f"cross-fitting needs n_folds >= 2, got {n_folds}")
        self.n_folds = int(n_folds)
        self.n_joints = int(n_joints)
        self.type_maps = (0, 1) if type_maps is None else (int(type_maps[0]), int(type_maps[1]))
        channels = self.n_joints + 2 * self.type_maps[0] * self.type_maps[1]
        self.nets = nn.ModuleList(HeatmapCNN(channels, stem, width, dilations, grid_size, channels_last)
                                  for _ in range(self.n_folds))

    def forward(self, images: Tensor, folds: Tensor | None = None) -> Tensor:
        return self.maps(images, folds)[0]

    def maps(self, images: Tensor, folds: Tensor | None = None) -> tuple[Tensor, Tensor | None]:
        """``(logp [B, J, G, G], logq [B, E, K, 2, G, G] | None)``: out-of-fold (``folds``) or the ensemble."""
        if folds is None:
            outs = [log_maps(net(images), self.n_joints, *self.type_maps) for net in self.nets]
            logq = None if outs[0][1] is None else _ensemble([o[1] for o in outs])
            return _ensemble([o[0] for o in outs]), logq
        folds = torch.as_tensor(folds, device=images.device)
        if folds.shape != images.shape[:1] or (len(folds) and (int(folds.min()) < 0 or int(folds.max()) >= self.n_folds)):
            raise ValueError(f"folds must be [B] = [{images.shape[0]}] with values in [0, {self.n_folds}), "
                             f"got shape {tuple(folds.shape)}")
        out = None
        for k in range(self.n_folds):
            sel = (folds == k).nonzero().squeeze(1)
            if len(sel):
                parts = log_maps(self.nets[k](images[sel]), self.n_joints, *self.type_maps)
                if out is None:
                    out = [None if p is None else p.new_empty((images.shape[0],) + p.shape[1:]) for p in parts]
                for o, p in zip(out, parts):
                    if o is not None:
                        o[sel] = p
        return tuple(out) if out is not None else self.maps(images)  # an empty batch


class PoseHead(StructuredHead):
    """:class:`~torch_bcfw.nn.StructuredHead` of a :class:`PoseTree` (``w`` a float64 buffer written by BCFW).

    The model's offsets ``mu`` and displacement scales ``scales`` (``[E, 2]``, or ``[E, K, 2]`` with mixture types)
    are buffers too, so a checkpoint restores them; :meth:`set_offsets` changes them.  ``forward(unary)`` takes
    ``[B, J, K, G, G]`` (or ``[B, J, G, G]``) unary features and returns the MAP cells ``LongTensor[B, J, 2]`` (y, x).
    """

    def __init__(self, model: PoseTree, dtype: torch.dtype = torch.float64):
        nn.Module.__init__(self)
        if not isinstance(model, PoseTree):
            raise TypeError(f"PoseHead needs a PoseTree, got {type(model).__name__}")
        self.model = model
        self.trainable = False
        self.w_dtype = dtype
        self.register_buffer("w", torch.zeros(model.n_features, dtype=dtype))
        self.register_buffer("mu", model.mu.clone())
        self.register_buffer("scales", model.scales.clone())

    @property
    def n_inputs(self) -> int:
        return self.model.n_unary * self.model.grid_size ** 2

    def set_offsets(self, mu: Tensor, scales: Tensor | None = None) -> None:
        """Set the offsets and (optionally) the displacement scales, both shaped like the model's ``mu``."""
        mu = torch.as_tensor(mu, dtype=torch.float64).cpu()
        if mu.shape != self.model.mu.shape or not bool(torch.isfinite(mu).all()):
            raise ValueError(f"mu must be finite with shape {tuple(self.model.mu.shape)}, got {tuple(mu.shape)}")
        if scales is not None:
            scales = torch.as_tensor(scales, dtype=torch.float64).cpu()
            if scales.shape != mu.shape or not bool((torch.isfinite(scales) & (scales > 0)).all()):
                raise ValueError(f"scales must be finite, > 0, with shape {tuple(mu.shape)}")
            self.model.scales = scales.clone()
            with torch.no_grad():
                self.scales.copy_(scales.to(self.scales.device, self.scales.dtype))
        self.model.mu = mu.clone()
        with torch.no_grad():
            self.mu.copy_(mu.to(self.mu.device, self.mu.dtype))

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)
        for name in ("mu", "scales"):
            if prefix + name in state_dict:
                setattr(self.model, name, state_dict[prefix + name].detach().to("cpu", torch.float64).clone())

    def forward(self, unary: Tensor, type_unary: Tensor | None = None) -> Tensor:
        """MAP cells of ``unary`` ``[B, J, K, G, G]`` (and ``type_unary`` ``[B, E, K, 2, G, G]`` for a head with type
        features)."""
        data = PoseData(unary.detach(), type_unary=None if type_unary is None else type_unary.detach())
        self.model.check_data(data, require_labels=False)
        return self.model.decode_positions(self.w.detach().to(unary.device), data)

    def score(self, unary: Tensor, positions: Tensor) -> Tensor:
        """``<w, phi(x_i, l_i)>`` per image (float64 ``[B]``) for cells ``positions`` ``[B, J, 2]``."""
        data = PoseData(unary.detach(), positions)
        return self.model.score(self.w.to(unary.device), data, self.model.pack_labels(positions))


class PoseTreeCNN(pl.LightningModule):
    """Heatmap CNN + pictorial-structures head on LSP (see the module docstring).

    Args:
        size: input frame side ``S``; the grid is ``G = S / 4``.
        stem, width, dilations: :class:`HeatmapCNN` sizes.
        lr, weight_decay: AdamW, cosine schedule over ``max_epochs``.
        sigma: width (cells) of the soft heatmap targets.
        max_shift, flip: augmentation (pixels of random translation; random horizontal flips).
        alpha: PCK threshold as a fraction of the torso size.
        min_quadratic: lower bound of the head's quadratic deformation weights.
        n_types: mixture types per tree edge of the head (the datamodule's ``n_types`` must match; 1: one
            quadratic deformation per edge).
        cross_fit: ``K >= 2``: the backbone is a :class:`CrossFittedCNN` of ``K`` CNNs (the datamodule's
            ``cross_fit`` must match); the head is solved on out-of-fold heatmaps and test images get the
            ensemble's.  1 (default): one CNN.
        type_features: image-dependent pairwise relations (Chen & Yuille 2014; needs ``n_types > 1``): the CNN
            also predicts, at every cell, the type of each tree edge seen from either end (:func:`log_maps`;
            trained with a cross-entropy against the true type at the joint's soft target, weight
            ``type_weight``), and the head scores them (``PoseTree(type_features=True)``).
        loss_radius: the head's SSVM loss saturates ``loss_radius`` torso sizes from the truth (``PoseTree``;
            default 1, the paper's loss).
    """

    def __init__(self, size: int = 128, stem: int = 24, width: int = 48, dilations=(1, 2, 4, 8), lr: float = 2e-3,
                 weight_decay: float = 1e-4, sigma: float = 1.0, max_shift: int = 8, flip: bool = True,
                 alpha: float = 0.2, min_quadratic: float = 0.0, seed: int = 0, n_types: int = 1, cross_fit: int = 1,
                 type_features: bool = False, type_weight: float = 1.0, loss_radius: float = 1.0):
        super().__init__()
        if size % 4:
            raise ValueError(f"size must be a multiple of 4, got {size}")
        if int(cross_fit) < 1:
            raise ValueError(f"cross_fit must be >= 1, got {cross_fit}")
        if type_features and int(n_types) < 2:
            raise ValueError("type_features needs mixture types (n_types >= 2)")
        self.save_hyperparameters()
        self.grid_size = size // 4
        self.cross_fit = int(cross_fit)
        E = len(LSP_TREE_EDGES)
        self.type_maps = (E, int(n_types)) if type_features else (0, 1)
        channels = 14 + 2 * self.type_maps[0] * self.type_maps[1]
        self.backbone = (HeatmapCNN(channels, stem, width, tuple(dilations), grid_size=self.grid_size)
                         if self.cross_fit == 1 else
                         CrossFittedCNN(self.cross_fit, 14, stem, width, tuple(dilations), grid_size=self.grid_size,
                                        type_maps=self.type_maps if type_features else None))
        mu = torch.zeros(E, 2, dtype=torch.float64) if n_types == 1 else torch.zeros(E, int(n_types), 2, dtype=torch.float64)
        self.head = PoseHead(PoseTree(self.grid_size, mu, min_quadratic=min_quadratic, type_features=type_features,
                                         loss_radius=loss_radius))
        self._gen = torch.Generator().manual_seed(int(seed))
        self._eval = []
        self.test_results = None

    def setup(self, stage: str) -> None:
        dm = getattr(self.trainer, "datamodule", None) if self._trainer is not None else None
        if dm is not None and getattr(dm, "mean_offsets", None) is None and hasattr(dm, "setup"):
            dm.setup(stage)
        if dm is not None and getattr(dm, "mean_offsets", None) is not None:
            if getattr(dm, "grid_size", self.grid_size) != self.grid_size:
                raise ValueError(f"the datamodule's grid ({dm.grid_size}) differs from the model's ({self.grid_size})")
            if getattr(dm, "n_types", 1) != self.head.model.n_types:
                raise ValueError(f"the datamodule has {getattr(dm, 'n_types', 1)} types per edge but the head "
                                 f"{self.head.model.n_types}")
            if getattr(dm, "cross_fit", 1) != self.cross_fit:
                raise ValueError(f"the datamodule has cross_fit={getattr(dm, 'cross_fit', 1)} folds but the model "
                                 f"{self.cross_fit}")
            if stage == "fit":
                self.head.set_offsets(getattr(dm, "head_offsets", dm.mean_offsets),
                                      getattr(dm, "head_scales", getattr(dm, "offset_scales", None)))

    def forward(self, images: Tensor, folds: Tensor | None = None) -> Tensor:
        """Log-probability heatmaps ``[B, 14, G, G]``; with cross-fitting, ``folds`` ``[B]`` picks the out-of-fold
        CNN of every image and ``None`` gives the ensemble (:class:`CrossFittedCNN`)."""
        return self.maps(images, folds)[0]

    def maps(self, images: Tensor, folds: Tensor | None = None) -> tuple[Tensor, Tensor | None]:
        """``(heatmaps [B, 14, G, G], edge-type maps [B, E, K, 2, G, G] or None)``, log-probabilities
        (:func:`log_maps`; out-of-fold / ensemble as :meth:`forward`)."""
        if self.cross_fit == 1:
            return log_maps(self.backbone(images), 14, *self.type_maps)
        return self.backbone.maps(images, folds)

    def _cnn_loss(self, logits: Tensor, joints: Tensor, visible: Tensor) -> Tensor:
        """Training loss of one CNN's ``logits``: the mean soft-target cross-entropy over the visible joints of the
        heatmaps, plus (with type features) ``type_weight`` times that of the true edge types at both ends."""
        logp, logq = log_maps(logits, 14, *self.type_maps)
        grid = joints_to_grid(joints.to(logp.dtype), self.hparams.size, self.grid_size)
        target = soft_targets(torch.nan_to_num(grid), self.grid_size, self.hparams.sigma)
        ce = -(target * logp).sum(dim=(-2, -1))  # [B, J]
        loss = (ce * visible).sum() / visible.sum().clamp(min=1)
        if logq is None:
            return loss
        model = self.head.model
        types = model.nearest_types(torch.nan_to_num(grid)).to(logq.device)  # [B, E] (continuous displacements)
        parents, children = edge_ends(model.edges, logq.device)
        both = (visible[:, children] & visible[:, parents]).to(logq.dtype)  # the type is known: [B, E]
        chosen = select_types(logq, types)  # [B, E, 2, G, G]
        ends = torch.stack((target[:, children], target[:, parents]), dim=2)  # [B, E, 2, G, G]
        ce_t = -(ends * chosen).sum(dim=(-2, -1))  # [B, E, 2]
        return loss + self.hparams.type_weight * (ce_t * both[..., None]).sum() / (2 * both.sum()).clamp(min=1)

    def training_step(self, batch, batch_idx):
        batch = augment_batch(batch, self.hparams.max_shift, self.hparams.flip, self._gen)
        images, joints, vis = batch["image"], batch["joints"], batch["visible"]
        if self.cross_fit == 1:
            loss = self._cnn_loss(self.backbone(images), joints, vis)
            mean_ce = loss
        else:  # CNN k learns from the images outside fold k only; the K losses touch disjoint parameters
            folds = self._folds(batch)
            losses = []
            for k in range(self.cross_fit):
                sel = (folds != k).nonzero().squeeze(1)
                if len(sel):
                    losses.append(self._cnn_loss(self.backbone.nets[k](images[sel]), joints[sel], vis[sel]))
            loss = torch.stack(losses).sum()
            mean_ce = loss.detach() / len(losses)
        self.log("train/ce", mean_ce, on_step=False, on_epoch=True, batch_size=len(vis))
        return loss

    def _folds(self, batch) -> Tensor:
        if "fold" not in batch:
            raise ValueError(f"the model is cross-fitted ({self.cross_fit} folds): batches need the 'fold' of every "
                             f"image (LSPPoseDataModule(cross_fit={self.cross_fit}))")
        return batch["fold"]

    def configure_optimizers(self):
        return cosine_schedule(self, torch.optim.AdamW(self.backbone.parameters(), lr=self.hparams.lr,
                                                       weight_decay=self.hparams.weight_decay))

    def bcfw_features(self, batch) -> PoseData:
        """The head's input for one batch: log-softmax heatmaps as ``K = 1`` unary features (float32; out-of-fold
        with cross-fitting), and the true edge types when the head has mixture types."""
        folds = self._folds(batch) if self.cross_fit > 1 else None
        logp, logq = self.maps(batch["image"], folds)
        return PoseData(logp.float().unsqueeze(2), batch["cells"], batch["visible"], batch["torso"].double(),
                        types=batch.get("types") if self.head.model.n_types > 1 else None,
                        type_unary=None if logq is None else logq.float())

    def test_step(self, batch, batch_idx):
        logp, logq = self.maps(batch["image"])
        tree = self.head(logp.unsqueeze(2), logq)
        argmax = argmax_positions(logp)
        data = PoseData(logp.float().unsqueeze(2), batch["cells"], batch["visible"], batch["torso"].double())
        flat = self.head.model.pack_labels(tree)  # the loss counts the cells only
        self._eval.append({"tree": tree.cpu(), "argmax": argmax.cpu(), "joints": batch["joints"].cpu(),
                           "visible": batch["visible"].cpu(), "pck_torso": batch["pck_torso"].cpu(),
                           "task_loss": self.head.model.loss(data, flat).cpu()})

    def on_test_epoch_end(self):
        if not self._eval:
            return
        r = {k: torch.cat([e[k] for e in self._eval]) for k in self._eval[0]}
        self._eval = []
        size, grid = self.hparams.size, self.grid_size
        cmp = compare_pck(grid_to_joints(r["tree"], size, grid), grid_to_joints(r["argmax"], size, grid), r["joints"],
                          r["visible"], r["pck_torso"], self.hparams.alpha)
        out = {f"test/{k}": v for k, v in cmp.items()}
        out["test/task_loss_tree"] = float(r["task_loss"].mean())
        out["test/images"] = len(r["visible"])
        self.test_results = out
        for k, v in out.items():
            self.log(k, float(v))
