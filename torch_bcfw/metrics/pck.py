"""PCK (percentage of correct keypoints) for human pose, with a paired image-bootstrap interval of differences.

A visible joint is correct when its prediction lies within ``alpha`` torso sizes of the truth
(:func:`~torch_bcfw.datasets.lsp.torso_size`; images without a finite positive torso size are left out).
"""
from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["compare_pck", "pck", "pck_difference"]


def pck(pred: Tensor, true: Tensor, visible: Tensor, torso: Tensor, alpha: float = 0.2) -> Tensor:
    """Percentage of correct keypoints with torso normalisation (PCK@alpha), as a 0-d fraction (NaN if no joint is
    counted): a visible joint is correct if ``||pred - true|| <= alpha * torso``.

    Args:
        pred, true: [N, 14, 2] in the same units and coordinate order; visible: bool [N, 14];
        torso: [N] in the same units; alpha: threshold as a fraction of the torso size.
    """
    if pred.shape != true.shape or visible.shape != true.shape[:-1] or torso.shape != true.shape[:1]:
        raise ValueError(f"shape mismatch: pred {tuple(pred.shape)}, true {tuple(true.shape)}, "
                         f"visible {tuple(visible.shape)}, torso {tuple(torso.shape)}")
    counted = _pck_counted(visible, torso)
    return (_pck_correct(pred, true, torso, alpha) & counted).sum() / counted.sum()


def _pck_counted(visible: Tensor, torso: Tensor) -> Tensor:
    """bool ``[N, 14]``: the joints PCK counts (visible, in an image with a finite positive torso size)."""
    return visible & (torch.isfinite(torso) & (torso > 0))[:, None]


def _pck_correct(pred: Tensor, true: Tensor, torso: Tensor, alpha: float) -> Tensor:
    """bool ``[N, 14]``: the joints predicted within ``alpha * torso``."""
    return (pred - true).norm(dim=-1) <= alpha * torso[:, None]


def pck_difference(pred: Tensor, baseline: Tensor, true: Tensor, visible: Tensor, torso: Tensor,
                   alpha: float = 0.2, n_boot: int = 2000, level: float = 0.95, seed: int = 0) -> dict:
    """PCK@alpha of ``pred`` minus that of ``baseline`` on the same images, with a paired bootstrap interval.

    The interval resamples images (their joints are not independent): ``n_boot`` draws of ``N`` images with
    replacement, the PCK difference of each draw, percentile interval at ``level``.

    Args:
        pred, baseline, true: ``[N, 14, 2]`` in the same units; visible: bool ``[N, 14]``; torso: ``[N]``
            (as in :func:`pck`: images without a finite positive torso are left out).

    Returns:
        ``{"diff", "low", "high"}`` (fractions), ``{"gained", "lost"}`` (joints right only in ``pred`` / only
        in ``baseline``), ``"joints"`` (counted), ``"level"``, ``"n_boot"``.
    """
    if pred.shape != baseline.shape:
        raise ValueError(f"pred {tuple(pred.shape)} and baseline {tuple(baseline.shape)} differ in shape")
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level}")
    if int(n_boot) < 1:
        raise ValueError(f"n_boot must be >= 1, got {n_boot}")
    counted = _pck_counted(visible, torso)
    hit_a = _pck_correct(pred, true, torso, alpha)
    hit_b = _pck_correct(baseline, true, torso, alpha)
    n_counted = counted.sum(1).double()  # [N]
    delta = ((hit_a & counted).sum(1) - (hit_b & counted).sum(1)).double()  # [N]
    total = float(n_counted.sum())
    if total == 0:
        raise ValueError("no joint is counted (no visible joint in an image with a torso size)")
    gen = torch.Generator().manual_seed(int(seed))
    boot = []
    for start in range(0, int(n_boot), 256):  # [256, N] index draws at a time
        draws = torch.randint(0, len(delta), (min(256, int(n_boot) - start), len(delta)), generator=gen)
        boot.append(delta[draws].sum(1) / n_counted[draws].sum(1).clamp(min=1))
    boot = torch.cat(boot)
    tail = (1 - level) / 2
    low, high = torch.quantile(boot, torch.tensor([tail, 1 - tail], dtype=boot.dtype)).tolist()
    return {"diff": float(delta.sum()) / total, "low": low, "high": high,
            "gained": int((hit_a & ~hit_b & counted).sum()), "lost": int((hit_b & ~hit_a & counted).sum()),
            "joints": int(total), "level": float(level), "n_boot": int(n_boot)}


def compare_pck(tree: Tensor, argmax: Tensor, joints: Tensor, visible: Tensor, pck_torso: Tensor,
                alpha: float = 0.2) -> dict:
    """PCK@alpha of the tree's and the argmax's joints against the true joints (all in frame pixels ``[N, J, 2]``;
    ``visible [N, J]``, ``pck_torso [N]``): ``pck_tree``, ``pck_argmax``, ``pck_tree_minus_argmax`` with its paired
    image-bootstrap interval (``_low``, ``_high``) and ``images_with_torso``."""
    pred = {"argmax": argmax.to(joints.dtype), "tree": tree.to(joints.dtype)}
    out = {f"pck_{name}": float(pck(p, joints, visible, pck_torso, alpha)) for name, p in pred.items()}
    diff = pck_difference(pred["tree"], pred["argmax"], joints, visible, pck_torso, alpha)
    out["pck_tree_minus_argmax"] = diff["diff"]
    out["pck_tree_minus_argmax_low"], out["pck_tree_minus_argmax_high"] = diff["low"], diff["high"]
    out["images_with_torso"] = int(torch.isfinite(pck_torso).sum())
    return out
