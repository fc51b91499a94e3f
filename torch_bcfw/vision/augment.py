"""Random similarity warps (scale, rotation, translation) of frames and their keypoints, for augmentation through a
backbone (the frozen blocks then run at every step instead of once: :func:`~torch_bcfw.vision.trunk.frozen_part`).
"""
from __future__ import annotations

import math

import torch
from torch import Tensor
from torch.nn import functional as F

__all__ = ["random_similarity"]


def random_similarity(images: Tensor, keypoints: Tensor, visible: Tensor, generator: torch.Generator | None = None,
                      scale: tuple[float, float] = (0.75, 1.25), rotation: float = 30.0,
                      shift: float = 0.1) -> tuple[Tensor, Tensor, Tensor]:
    """Warp every frame by its own random similarity about the frame's centre and move its keypoints with it.

    Args:
        images: float frames ``[B, C, S, S]`` (square).
        keypoints: ``(x, y)`` frame coordinates ``[B, J, 2]`` (continuous pixels: ``0`` and ``S`` are the frame's
            edges; NaN where unknown).
        visible: bool ``[B, J]``.
        generator: the random source.
        scale: range of the zoom factor (``> 1`` enlarges the content).
        rotation: maximal rotation in degrees (uniform in ``[-rotation, rotation]``).
        shift: maximal translation as a fraction of the frame side, per axis.

    Returns:
        ``(images [B, C, S, S], keypoints [B, J, 2], visible [B, J])``: bilinear resampling with zeros outside the
        source frame; a keypoint that leaves the frame becomes invisible (its coordinates are kept).
    """
    if images.dim() != 4 or images.shape[-1] != images.shape[-2] or not images.is_floating_point():
        raise ValueError(f"images must be float [B, C, S, S], got {tuple(images.shape)} {images.dtype}")
    B, S = images.shape[0], images.shape[-1]
    if keypoints.shape[:1] != (B,) or keypoints.dim() != 3 or keypoints.shape[-1] != 2:
        raise ValueError(f"keypoints must be [B, J, 2] with B = {B}, got {tuple(keypoints.shape)}")
    if visible.shape != keypoints.shape[:2] or visible.dtype != torch.bool:
        raise ValueError(f"visible must be bool {tuple(keypoints.shape[:2])}, got {tuple(visible.shape)} "
                         f"{visible.dtype}")
    if not (0 < scale[0] <= scale[1] and 0 <= rotation <= 180 and 0 <= shift < 1):
        raise ValueError(f"need 0 < scale[0] <= scale[1], 0 <= rotation <= 180, 0 <= shift < 1, got {scale}, "
                         f"{rotation}, {shift}")
    z = torch.empty(B, dtype=torch.float64).uniform_(scale[0], scale[1], generator=generator)
    a = torch.empty(B, dtype=torch.float64).uniform_(-rotation, rotation, generator=generator) * (math.pi / 180)
    t = torch.empty(B, 2, dtype=torch.float64).uniform_(-2 * shift, 2 * shift, generator=generator)
    # forward map of normalised coordinates (u = 2 x / S - 1): p_out = z R p_in + t; grid_sample needs the inverse
    rot = torch.stack((torch.stack((a.cos(), -a.sin()), -1), torch.stack((a.sin(), a.cos()), -1)), -2)  # [B, 2, 2]
    fwd = z[:, None, None] * rot
    inv = torch.linalg.inv(fwd)
    theta = torch.cat((inv, -(inv @ t[:, :, None])), dim=2).to(images.dtype)  # p_in = inv (p_out - t)
    grid = F.affine_grid(theta, list(images.shape), align_corners=False)
    warped = F.grid_sample(images, grid, mode="bilinear", padding_mode="zeros", align_corners=False)
    u = keypoints.to(torch.float64) * (2.0 / S) - 1.0
    moved = ((fwd[:, None] @ u[..., None])[..., 0] + t[:, None]).add(1.0).mul(S / 2.0)
    inside = ((moved >= 0) & (moved <= S)).all(-1)
    return warped, moved.to(keypoints.dtype), visible & inside
