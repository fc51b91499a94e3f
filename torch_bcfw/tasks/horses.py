"""Figure/ground segmentation of the Weizmann horses: a small FCN under BCFW-solved graph-cut heads.

The experiment of ``configs/horses.yaml``: :class:`HorseSegmenter` trains
:class:`SegmentationFCN` with per-pixel binary cross-entropy (the "CNN alone" baseline) and two
:class:`GraphCutHead` s on its features, unary-only and with a contrast-sensitive Potts term, are solved by
:class:`~torch_bcfw.lightning.BCFWCallback` s.  Validation and test log ``{stage}/{cnn,unary,potts}_{acc,iou,miou}``
(:mod:`torch_bcfw.metrics.segmentation`).
"""
from __future__ import annotations

import lightning.pytorch as pl
import torch
from torch import Tensor, nn
from torch.nn import functional as F

from ..datasets.horses import load_weizmann_horses
from ..data.graphs import GraphData, grid_graph_data
from ..metrics.segmentation import segmentation_counts, segmentation_summary
from ..models.graphcut import GraphCut
from ..nn import StructuredHead
from .eval_hooks import EvalHooks, PackedLoaders, cosine_schedule

__all__ = ["GraphCutHead", "HorseSegmenter", "HorsesDataModule", "SegmentationFCN"]


class HorsesDataModule(PackedLoaders, pl.LightningDataModule):
    """Weizmann horses (:func:`~torch_bcfw.datasets.horses.load_weizmann_horses`) for Lightning.

    Args:
        root: folder with ``rgb/``, ``gray/`` and ``figure_ground/``.
        size: working resolution ``(H, W)`` (all images resized to it; aspect ratio not kept).
        batch_size: images per training batch (shuffled every epoch).
        eval_batch_size: images per batch of the evaluation loaders and of ``bcfw_dataloader``.
        seed: seed of the shuffling.
        limit: keep only the first ``limit`` training images (quick runs).

    Split (fixed, see the loader): images 1-200 train, 201-228 validation, 229-328 test.
    """

    collate = None

    def __init__(self, root: str, size: tuple[int, int] = (48, 64), batch_size: int = 16, eval_batch_size: int = 50,
                 seed: int = 0, limit: int | None = None):
        super().__init__()
        self.root, self.size = root, tuple(int(s) for s in size)
        self.batch_size, self.eval_batch_size = int(batch_size), int(eval_batch_size)
        self.seed, self.limit = int(seed), limit
        self.splits: dict[str, torch.utils.data.TensorDataset] = {}

    def setup(self, stage: str | None = None) -> None:
        if self.splits:
            return
        for split in ("train", "val", "test"):
            horses = load_weizmann_horses(self.root, size=self.size, split=split)
            if split == "train" and self.limit is not None:
                horses = horses[: int(self.limit)]
            self.splits[split] = torch.utils.data.TensorDataset(torch.stack([h.image for h in horses]),
                                                                torch.stack([h.mask for h in horses]))
        self.train, self.val, self.test = self.splits["train"], self.splits["val"], self.splits["test"]


def _block(c_in: int, c_out: int) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(c_in, c_out, 3, padding=1, bias=False), nn.BatchNorm2d(c_out), nn.ReLU(inplace=True),
                         nn.Conv2d(c_out, c_out, 3, padding=1, bias=False), nn.BatchNorm2d(c_out), nn.ReLU(inplace=True))


class SegmentationFCN(nn.Module):
    """Small U-Net: ``[B, C, H, W]`` image -> ``[B, feature_dim, H, W]`` per-pixel features.

    Three 2x poolings (``H`` and ``W`` should be divisible by 8), widths ``(c, 2c, 4c, 4c)``, skip connections,
    bilinear upsampling, a final 1x1 convolution and a LayerNorm over the channels (no affine).  Two input
    channels hold the normalised pixel coordinates (``coords=True``), so the network can learn a location prior.
    """

    def __init__(self, in_channels: int = 3, feature_dim: int = 16, width: int = 16, coords: bool = True):
        super().__init__()
        c = int(width)
        self.coords = bool(coords)
        self.e1 = _block(in_channels + 2 * self.coords, c)
        self.e2, self.e3, self.e4 = _block(c, 2 * c), _block(2 * c, 4 * c), _block(4 * c, 4 * c)
        self.d3, self.d2, self.d1 = _block(8 * c, 2 * c), _block(4 * c, c), _block(2 * c, c)
        self.out = nn.Conv2d(c, feature_dim, 1)
        self.feature_dim = int(feature_dim)

    def forward(self, images: Tensor) -> Tensor:
        if self.coords:
            B, _, H, W = images.shape
            ys = torch.linspace(-1, 1, H, device=images.device, dtype=images.dtype)[:, None].expand(H, W)
            xs = torch.linspace(-1, 1, W, device=images.device, dtype=images.dtype)[None, :].expand(H, W)
            images = torch.cat([images, torch.stack([ys, xs]).expand(B, 2, H, W)], 1)
        e1 = self.e1(images)
        e2 = self.e2(F.max_pool2d(e1, 2))
        e3 = self.e3(F.max_pool2d(e2, 2))
        e4 = self.e4(F.max_pool2d(e3, 2))

        def up(t, like):
            return F.interpolate(t, size=like.shape[2:], mode="bilinear", align_corners=False)

        d3 = self.d3(torch.cat([up(e4, e3), e3], 1))
        d2 = self.d2(torch.cat([up(d3, e2), e2], 1))
        d1 = self.d1(torch.cat([up(d2, e1), e1], 1))
        f = self.out(d1)
        return F.layer_norm(f.permute(0, 2, 3, 1), (self.feature_dim,)).permute(0, 3, 1, 2)


class GraphCutHead(StructuredHead):
    """:class:`~torch_bcfw.nn.StructuredHead` on a :class:`~torch_bcfw.models.GraphCut` model.

    ``w`` is a float64 buffer written by BCFW (:class:`~torch_bcfw.lightning.BCFWCallback`); ``forward(data)`` decodes a
    :class:`~torch_bcfw.data.graphs.GraphData` by min-cut and returns the packed labels ``LongTensor[N_tot]``.
    """

    def __init__(self, model: GraphCut, dtype: torch.dtype = torch.float64):
        nn.Module.__init__(self)
        if not isinstance(model, GraphCut):
            raise TypeError(f"GraphCutHead needs a GraphCut model, got {type(model).__name__}")
        self.ops = model  # StructuredHead reads ops.n_inputs
        self.model = model
        self.trainable = False
        self.w_dtype = dtype
        self.register_buffer("w", torch.zeros(model.n_features, dtype=dtype))

    def forward(self, data: GraphData) -> Tensor:  # type: ignore[override]
        self.model.check_data(data, require_labels=False)
        with torch.no_grad():
            return self.model.decode(self.w.detach().to("cpu", torch.float64), data.to("cpu")).to(data.device)

    def score(self, data: GraphData, y: Tensor) -> Tensor:  # type: ignore[override]
        """``<w, phi(x_i, y_i)>`` per graph (float64, no gradient through the min-cut features)."""
        return self.model.score(self.w.to(data.device, torch.float64), data, y)


class HorseSegmenter(EvalHooks, pl.LightningModule):
    """FCN backbone + CNN baseline classifier + unary-only and Potts graph-cut heads (solved by callbacks).

    Args:
        feature_dim: backbone features per pixel ``F``; the heads see ``[f_p, 1]`` (``F + 1`` node features).
        width: base width of the FCN.
        lr: AdamW learning rate (cosine-annealed over ``max_epochs``).
        weight_decay: AdamW weight decay.
        loss: task loss of both SSVM heads: ``"balanced"`` or ``"hamming"``.
        contrast: Potts edge features ``[1, exp(-beta ||I_p - I_q||^2)]`` (else ``[1]``).
        processes: worker processes of the graph-cut pool (``None``: all CPUs).
        flip: random horizontal flips of the training batches.
    """

    METHODS = ("cnn", "unary", "potts")

    def __init__(self, feature_dim: int = 16, width: int = 16, lr: float = 3e-3, weight_decay: float = 1e-4,
                 loss: str = "balanced", contrast: bool = True, processes: int | None = None, flip: bool = True):
        super().__init__()
        self.save_hyperparameters()
        self.backbone = SegmentationFCN(3, feature_dim, width)
        self.classifier = nn.Conv2d(feature_dim, 1, 1)
        E = 2 if contrast else 1
        self.head = GraphCutHead(GraphCut(feature_dim + 1, E, loss=loss, processes=processes))
        self.head_unary = GraphCutHead(GraphCut(feature_dim + 1, E, loss=loss, pairwise=False))
        self._counts: dict[str, list[Tensor]] = {m: [] for m in self.METHODS}

    def graph_data(self, feats: Tensor, images: Tensor, masks: Tensor | None) -> GraphData:
        """Pixel-grid graphs with node features ``[f_p, 1]`` (float64) and contrast edge features.  The features are
        detached: the graph-cut heads are solved and decode on fixed features (``GraphData`` refuses features that
        require grad)."""
        feats = torch.cat([feats, torch.ones_like(feats[:, :1])], 1).detach().to(torch.float64)
        return grid_graph_data(feats, images, masks, contrast=self.hparams.contrast)

    def bcfw_features(self, batch) -> GraphData:
        images, masks = batch
        return self.graph_data(self.backbone(images), images, masks)

    def training_step(self, batch, batch_idx):
        images, masks = batch
        if self.hparams.flip:
            flip = torch.rand(images.shape[0], device=images.device) < 0.5
            images = torch.where(flip[:, None, None, None], images.flip(-1), images)
            masks = torch.where(flip[:, None, None], masks.flip(-1), masks)
        logits = self.classifier(self.backbone(images))[:, 0]
        loss = F.binary_cross_entropy_with_logits(logits, masks.to(logits.dtype))
        self.log("train/bce", loss, on_step=False, on_epoch=True, batch_size=images.shape[0])
        return loss

    def configure_optimizers(self):
        params = list(self.backbone.parameters()) + list(self.classifier.parameters())
        return cosine_schedule(self, torch.optim.AdamW(params, lr=self.hparams.lr,
                                                       weight_decay=self.hparams.weight_decay))

    def predict_masks(self, images: Tensor) -> dict[str, Tensor]:
        """``{"cnn", "unary", "potts"}`` -> predicted masks ``LongTensor[B, H, W]``."""
        feats = self.backbone(images)
        out = {"cnn": (self.classifier(feats)[:, 0] > 0).long()}
        data = self.graph_data(feats, images, None)
        shape = images.shape[:1] + images.shape[2:]
        out["unary"] = self.head_unary(data).reshape(shape)
        out["potts"] = self.head(data).reshape(shape)
        return out

    def _eval_step(self, batch) -> None:
        images, masks = batch
        for name, pred in self.predict_masks(images).items():
            self._counts[name].append(segmentation_counts(pred, masks).cpu())

    def _eval_end(self, stage: str) -> dict[str, float]:
        out = {}
        for name in self.METHODS:
            if self._counts[name]:
                for k, v in segmentation_summary(torch.cat(self._counts[name])).items():
                    out[f"{stage}/{name}_{k}"] = v
            self._counts[name] = []
        for k, v in out.items():
            self.log(k, v)
        return out
