"""Binary segmentation scores: pixel accuracy and foreground IoU (over all pixels and per image), also within a
band around the true boundary (:func:`boundary_band`), where a structured decoder changes the most pixels.

Foreground is label 1.  An image with no foreground in either the prediction or the truth has IoU 1.
"""
from __future__ import annotations

import torch
from torch import Tensor
from torch.nn import functional as F

__all__ = ["boundary_band", "iou_difference", "segmentation_counts", "segmentation_metrics", "segmentation_summary"]


def segmentation_counts(pred: Tensor, truth: Tensor, region: Tensor | None = None) -> Tensor:
    """Per-image ``[tp, fp, fn, tn]`` counts of binary masks ``pred, truth: [B, H, W]``: ``LongTensor[B, 4]``;
    with ``region`` (bool ``[B, H, W]``, e.g. :func:`boundary_band`), of the pixels inside it only."""
    p, t = pred.bool().flatten(1), truth.bool().flatten(1)
    r = torch.ones_like(p) if region is None else region.bool().flatten(1)
    if r.shape != p.shape or t.shape != p.shape:
        raise ValueError(f"pred, truth and region must have one shape, got {tuple(pred.shape)}, {tuple(truth.shape)}"
                         f" and {tuple(r.shape)}")
    return torch.stack([(p & t & r).sum(1), (p & ~t & r).sum(1), (~p & t & r).sum(1), (~p & ~t & r).sum(1)], 1)


def boundary_band(truth: Tensor, radius: int) -> Tensor:
    """The pixels within ``radius`` pixels (chessboard distance) of the boundary of binary masks ``truth
    [B, H, W]``: bool ``[B, H, W]``.  A boundary pixel has a pixel of the other label among its 8 neighbours (the
    image border is no boundary); ``radius = 0``: the boundary pixels only."""
    if truth.dim() != 3 or int(radius) < 0:
        raise ValueError(f"need masks [B, H, W] and radius >= 0, got {tuple(truth.shape)} and {radius}")
    m = truth.bool().float()[:, None]
    edge = F.max_pool2d(m, 3, 1, 1) != -F.max_pool2d(-m, 3, 1, 1)
    k = 2 * int(radius) + 1
    return F.max_pool2d(edge.float(), k, 1, int(radius))[:, 0] > 0


def segmentation_summary(counts: Tensor) -> dict[str, float]:
    """Pixel accuracy, foreground IoU over all pixels, mean per-image foreground IoU of ``counts [B, 4]``."""
    tp, fp, fn, tn = counts.double().sum(0)
    per = counts.double()
    union = per[:, 0] + per[:, 1] + per[:, 2]
    per_iou = torch.where(union > 0, per[:, 0] / union.clamp_min(1), torch.ones_like(union))
    return {"acc": float((tp + tn) / counts.double().sum()), "iou": float(tp / (tp + fp + fn)),
            "miou": float(per_iou.mean())}


def segmentation_metrics(pred, truth, offsets) -> dict[str, float]:
    """Foreground IoU over all pixels, mean per-image IoU and pixel accuracy (%) of packed binary labelings
    ``pred, truth: [N_tot]`` (1 = foreground) of the images ``offsets: [n + 1]``.  An image with no foreground in
    either labeling has IoU 1."""
    p, t = torch.as_tensor(pred).reshape(-1).bool().cpu(), torch.as_tensor(truth).reshape(-1).bool().cpu()
    if p.shape != t.shape:
        raise ValueError(f"{p.numel()} predicted labels but {t.numel()} true labels")
    img = torch.repeat_interleave(torch.arange(len(offsets) - 1), torch.as_tensor(offsets).cpu().diff())
    n = len(offsets) - 1
    tp = torch.zeros(n, dtype=torch.float64).index_add_(0, img, (p & t).double())
    union = torch.zeros(n, dtype=torch.float64).index_add_(0, img, (p | t).double())
    per_image = torch.where(union > 0, tp / union.clamp_min(1), torch.ones_like(union))
    total_union = float(union.sum())
    return {"test IoU (%)": 100 * (float(tp.sum()) / total_union if total_union else 1.0),
            "test mean IoU per image (%)": 100 * float(per_image.mean()),
            "test pixel accuracy (%)": 100 * float((p == t).double().mean())}


def iou_difference(counts: Tensor, baseline: Tensor, n_boot: int = 2000, level: float = 0.95, seed: int = 0) -> dict:
    """Foreground IoU (over all pixels) of ``counts`` minus that of ``baseline`` (``[B, 4]`` of
    :func:`segmentation_counts` on the same images), with a paired image-bootstrap percentile interval:
    ``{"diff", "low", "high", "level", "n_boot"}``."""
    if counts.shape != baseline.shape or counts.dim() != 2 or counts.shape[1] != 4 or len(counts) == 0:
        raise ValueError(f"counts and baseline must both be [B, 4] with B >= 1, got {tuple(counts.shape)} and "
                         f"{tuple(baseline.shape)}")
    if not 0 < level < 1 or int(n_boot) < 1:
        raise ValueError(f"need 0 < level < 1 and n_boot >= 1, got {level} and {n_boot}")

    def iou(c: Tensor) -> Tensor:  # [..., B, 4] -> [...]
        c = c.double().sum(-2)
        return c[..., 0] / (c[..., 0] + c[..., 1] + c[..., 2]).clamp_min(1)

    gen = torch.Generator().manual_seed(int(seed))
    draws = torch.randint(0, len(counts), (int(n_boot), len(counts)), generator=gen)
    boot = iou(counts[draws]) - iou(baseline[draws])
    tail = (1 - level) / 2
    low, high = torch.quantile(boot, torch.tensor([tail, 1 - tail], dtype=boot.dtype)).tolist()
    return {"diff": float(iou(counts) - iou(baseline)), "low": low, "high": high, "level": float(level),
            "n_boot": int(n_boot)}
