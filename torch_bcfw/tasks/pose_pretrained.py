"""Pose on LSP Extended from a pretrained backbone: heatmaps from cached features, a BCFW-solved tree head on top.

:func:`run_pose` is the pipeline of ``examples/pose_lsp.py``:

1. the frames (:class:`~torch_bcfw.tasks.lsp_data.LSPPoseDataModule`, ``size x size``, grid ``G = size / 4``) go
   once through the backbone's frozen part, mirrored and not (:func:`~torch_bcfw.tasks.pretrained.cache_features`);
2. a :class:`~torch_bcfw.tasks.pretrained.PretrainedTrunk` (the later blocks and a decoder to ``14`` heatmaps on
   the grid) is trained with a soft-target cross-entropy per visible joint on the training images except the
   last ``holdout`` ones, random flips; the epoch kept is the one with the best argmax PCK on the held-out images;
3. heatmaps (averaged with those of the mirrored image) of the held-out images train the tree head
   (:class:`~torch_bcfw.models.PoseTree`, optionally with mixture types), solved by BCFW to a certified gap;
   ``lam`` is chosen among ``lams`` by 2-fold cross-validation on the held-out images;
4. the test images are decoded by the heatmaps' per-joint argmax and by the tree.

With ``train_from=None`` the backbone is frozen entirely: the structured probe (only the decoder is trained).
"""
from __future__ import annotations

import copy
import time
from dataclasses import asdict, dataclass

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from ..cross_validation import cross_validate
from ..datasets.lsp import grid_to_joints, joints_to_grid
from ..fit import fit
from ..inference.tree import LSP_JOINTS
from ..metrics.pck import compare_pck, pck
from ..models.pose import PoseTree
from ..data.poses import PoseData
from .lsp_data import FLIP_PERMUTATION, LSPPoseDataModule
from .pose import argmax_positions, log_heatmaps, soft_targets
from .pretrained import PretrainedTrunk, stored_features

__all__ = ["PoseOptions", "flip_back", "pose_report_extras", "run_pose"]


@dataclass
class PoseOptions:
    """Options of :func:`run_pose` (the defaults are those of ``examples/pose_lsp.py``).

    Attributes:
        size: frame side in pixels (the pose grid is ``size / 4``).
        train_from: first backbone block trained (blocks before it frozen and cached; default 5: the stride-16
            and stride-32 stages trained, chosen over 11 by held-out PCK); ``None``: the frozen probe.
        width: decoder channels.
        epochs, lr, weight_decay, batch_size: AdamW with a cosine schedule.
        sigma: width in cells of the Gaussian heatmap targets.
        holdout: the last this many training images are kept from the heatmap training: they choose the epoch and
            ``lam`` and train the tree head.
        lams: candidate ``lam`` of the tree head; passes: BCFW passes per solve.
        n_types: mixture types per tree edge; deformation_scale: see :class:`LSPPoseDataModule`.
        limit, test_limit: first training / test images only (quick runs).
        seed: initialisation and shuffling; device: ``"cpu"`` or ``"cuda"``; threads: torch CPU threads.
    """

    size: int = 256
    train_from: int | None = 5
    width: int = 128
    epochs: int = 20
    lr: float = 1e-3
    weight_decay: float = 1e-4
    batch_size: int = 16
    sigma: float = 2.0
    holdout: int = 300
    lams: tuple[float, ...] = (1e-3, 1e-2, 1e-1)
    passes: float = 10
    n_types: int = 1
    deformation_scale: float = 4.0
    limit: int | None = None
    test_limit: int | None = None
    seed: int = 0
    device: str = "cpu"


def flip_back(logits: Tensor) -> Tensor:
    """Heatmaps of a mirrored frame ``[B, 14, G, G]`` -> those of the frame (mirror, swap left and right)."""
    return logits.flip(-1)[:, list(FLIP_PERMUTATION)]


def _select(feats: list[Tensor], index: Tensor) -> list[Tensor]:
    return [f[index] for f in feats]


def _heatmap_loss(logits: Tensor, joints: Tensor, visible: Tensor, size: int, sigma: float) -> Tensor:
    G = logits.shape[-1]
    logp = log_heatmaps(logits)
    target = soft_targets(torch.nan_to_num(joints_to_grid(joints.to(logp.dtype), size, G)), G, sigma)
    ce = -(target * logp).sum(dim=(-2, -1))
    return (ce * visible).sum() / visible.sum().clamp(min=1)


@torch.no_grad()
def predict_heatmaps(trunk: PretrainedTrunk, feats: list[Tensor], feats_flipped: list[Tensor] | None, grid: int,
                     device: str, batch_size: int = 32) -> Tensor:
    """Log-softmax heatmaps ``[N, 14, G, G]`` (float32, CPU); with ``feats_flipped``, of the logits averaged with
    those of the mirrored frame."""
    trunk.eval()
    out = []
    for s in range(0, len(feats[0]), batch_size):
        x = [f[s : s + batch_size].to(device) for f in feats]
        logits = trunk(x, (grid, grid))
        if feats_flipped is not None:
            xf = [f[s : s + batch_size].to(device) for f in feats_flipped]
            logits = 0.5 * (logits + flip_back(trunk(xf, (grid, grid))))
        out.append(log_heatmaps(logits).float().cpu())
    return torch.cat(out)


def _argmax_pck(heat: Tensor, fields: dict, index: Tensor, size: int) -> float:
    pred = grid_to_joints(argmax_positions(heat), size, heat.shape[-1])
    return float(pck(pred.to(fields["joints"].dtype), fields["joints"][index], fields["visible"][index],
                     fields["pck_torso"][index]))


def train_heatmaps(trunk: PretrainedTrunk, feats: list[Tensor], feats_flipped: list[Tensor], fields: dict,
                   train_index: Tensor, val_index: Tensor, opts: PoseOptions, log=print) -> tuple[list, int]:
    """Train ``trunk`` (in place) on ``train_index``; keep the epoch with the best argmax PCK@0.2 on ``val_index``.
    Returns ``(history [{epoch, loss, val_pck, s}], best epoch)``."""
    S, G, dev = opts.size, opts.size // 4, opts.device
    gen = torch.Generator().manual_seed(opts.seed)
    params = [p for p in trunk.parameters() if p.requires_grad]
    optim = torch.optim.AdamW(params, lr=opts.lr, weight_decay=opts.weight_decay)
    steps = opts.epochs * -(-len(train_index) // opts.batch_size)
    sched = torch.optim.lr_scheduler.OneCycleLR(optim, opts.lr, total_steps=max(steps, 1), pct_start=0.1)
    perm = torch.tensor(FLIP_PERMUTATION)
    history, best, best_state = [], (-1.0, 0), None
    val_feats = _select(feats, val_index)
    t0 = time.perf_counter()
    for epoch in range(1, opts.epochs + 1):
        trunk.train()
        order = train_index[torch.randperm(len(train_index), generator=gen)]
        total, count = 0.0, 0
        for s in range(0, len(order), opts.batch_size):
            idx = order[s : s + opts.batch_size]
            flip = torch.rand(len(idx), generator=gen) < 0.5
            x = [torch.where(flip[:, None, None, None], ff[idx], f[idx]).to(dev) for f, ff in zip(feats, feats_flipped)]
            joints, vis = fields["joints"][idx].clone(), fields["visible"][idx].clone()
            joints[flip] = joints[flip][:, perm]
            joints[flip, :, 0] = S - joints[flip, :, 0]
            vis[flip] = vis[flip][:, perm]
            loss = _heatmap_loss(trunk(x, (G, G)), joints.to(dev), vis.to(dev), S, opts.sigma)
            optim.zero_grad(set_to_none=True)
            loss.backward()
            optim.step()
            sched.step()
            total, count = total + float(loss.detach()) * len(idx), count + len(idx)
        val = _argmax_pck(predict_heatmaps(trunk, val_feats, None, G, dev), fields, val_index, S) \
            if len(val_index) else float("nan")
        history.append({"epoch": epoch, "loss": total / max(count, 1), "val_pck": val,
                        "s": time.perf_counter() - t0})
        log(f"epoch {epoch}: heatmap loss {total / max(count, 1):.4f}, held-out argmax PCK@0.2 {val:.4f} "
            f"({time.perf_counter() - t0:.0f} s)")
        if not val <= best[0]:  # NaN (no held-out image): the last epoch
            best, best_state = (val, epoch), copy.deepcopy(trunk.state_dict())
    if best_state is not None:
        trunk.load_state_dict(best_state)
    return history, best[1]


def _pose_data(heat: Tensor, fields: dict, index: Tensor, with_types: bool) -> PoseData:
    return PoseData(heat.unsqueeze(2), fields["cells"][index], fields["visible"][index], fields["torso"][index],
                    types=fields["types"][index] if with_types else None)


def _solver(opts: PoseOptions) -> dict:
    return {"max_passes": opts.passes, "step": "line_search", "sampling": "uniform", "averaging": True, "seed": 1}


def choose_lam(model: PoseTree, data: PoseData, fields: dict, index: Tensor, opts: PoseOptions) -> tuple[float, dict]:
    """The ``lam`` of ``opts.lams`` whose 2-fold cross-validated tree PCK@0.2 on ``data`` (held-out images
    ``index``) is highest: ``(lam, {lam: pck})``."""
    folds = torch.arange(len(data)) % 2
    scores = {}
    for lam in opts.lams:
        fits = cross_validate(model, data, folds, lam, **_solver(opts))
        pred = torch.empty(len(data), model.n_joints, 2, dtype=torch.long)
        for f in fits:
            pred[f.test_index] = model.decode_positions(f.result.weights, data[f.test_index])
        joints = grid_to_joints(pred, opts.size, model.grid_size).to(fields["joints"].dtype)
        scores[lam] = float(pck(joints, fields["joints"][index], fields["visible"][index], fields["pck_torso"][index]))
    return max(scores, key=lambda k: scores[k]), scores


def pose_report_extras(tree: Tensor, argmax: Tensor, fields: dict, alpha: float = 0.2) -> dict:
    """Where the tree differs from the argmax, in frame pixels ``[N, 14, 2]``: PCK per joint of both, and
    left/right swaps (a visible joint missed but within ``alpha`` torso sizes of its mirror joint's truth)."""
    joints, vis, torso = fields["joints"], fields["visible"], fields["pck_torso"]
    counted = vis & (torch.isfinite(torso) & (torso > 0))[:, None]
    perm = list(FLIP_PERMUTATION)
    out = {"per_joint": {}, "left_right_swaps": {}}
    for name, p in (("tree", tree), ("argmax", argmax)):
        p = p.to(joints.dtype)
        dist = (p - joints).norm(dim=-1)
        hit = (dist <= alpha * torso[:, None]) & counted
        mirror = (p - joints[:, perm]).norm(dim=-1) <= alpha * torso[:, None]
        swap = mirror & ~hit & counted & vis[:, perm] & (torch.tensor(perm) != torch.arange(14))
        out["left_right_swaps"][name] = int(swap.sum())
        for j, jn in enumerate(LSP_JOINTS):
            out["per_joint"].setdefault(jn, {})[name] = float(hit[:, j].sum() / counted[:, j].sum().clamp(min=1))
    return out


def run_pose(root: str, opts: PoseOptions, backbone: nn.Module, cache_dir: str | None = None, log=print) -> dict:
    """The whole pipeline (module docstring); ``cache_dir`` keeps the preprocessed frames and the cached features
    for reruns.  ``backbone``: an :class:`~torch_bcfw.backbones.EfficientNetLite0`
    (split at ``opts.train_from``) or any module returning feature maps (with ``train_from=None``).

    Returns a report dict (PCK of argmax and tree with the paired bootstrap interval of their difference, the
    certified gap, timings) with ``"predictions"``: frame-pixel joints ``{"tree", "argmax"}`` ``[N, 14, 2]``, and
    ``"heatmaps"``: the log-softmax heatmaps the tree head was trained on and decodes, ``{"held_out": [holdout, 14,
    G, G], "test": [N, 14, G, G]}`` (float16), for studying the head without retraining the network.
    """
    t0 = time.perf_counter()
    S, G = opts.size, opts.size // 4
    data = LSPPoseDataModule(root=root, size=S, grid_size=G, limit=opts.limit, test_limit=opts.test_limit,
                             deformation_scale=opts.deformation_scale, cache_dir=cache_dir, seed=opts.seed,
                             n_types=opts.n_types)
    data.setup()
    train, test = data.train.fields, data.test.fields
    n = len(data.train)
    if not 0 < opts.holdout < n:
        raise ValueError(f"holdout must be in [1, {n - 1}] (training images: {n}), got {opts.holdout}")
    train_index, val_index = torch.arange(n - opts.holdout), torch.arange(n - opts.holdout, n)
    timings = {"load": time.perf_counter() - t0}

    t = time.perf_counter()
    torch.manual_seed(opts.seed)
    feats = {(split, flip): stored_features(cache_dir, f"lsp_{split}", backbone, f["image"], opts.train_from,
                                            device=opts.device, flip=flip)
             for split, f in (("train", train), ("test", test)) for flip in (False, True)}
    timings["cache_features"] = time.perf_counter() - t
    log(f"cached features of {n} + {len(data.test)} frames (and their mirrors) in {timings['cache_features']:.0f} s")

    t = time.perf_counter()
    trunk = PretrainedTrunk(backbone, 14, opts.train_from, opts.width).to(opts.device)
    history, best_epoch = train_heatmaps(trunk, feats["train", False], feats["train", True], train, train_index,
                                         val_index, opts, log)
    timings["train_heatmaps"] = time.perf_counter() - t

    t = time.perf_counter()
    heat_val = predict_heatmaps(trunk, _select(feats["train", False], val_index),
                                _select(feats["train", True], val_index), G, opts.device)
    heat_test = predict_heatmaps(trunk, feats["test", False], feats["test", True], G, opts.device)
    with_types = opts.n_types > 1
    model = PoseTree(G, data.head_offsets, scales=data.head_scales)
    head_data = _pose_data(heat_val, train, val_index, with_types)
    lam, cv = choose_lam(model, head_data, train, val_index, opts) if len(opts.lams) > 1 else (opts.lams[0], {})
    log(f"tree head lam {lam:g} (2-fold cross-validated tree PCK@0.2 on the held-out images: {cv})")
    result = fit(model, head_data, lam, **_solver(opts))
    tree_cells = model.decode_positions(result.weights, PoseData(heat_test.unsqueeze(2)))
    timings["tree_head"] = time.perf_counter() - t

    tree = grid_to_joints(tree_cells, S, G).to(torch.float32)
    argmax = grid_to_joints(argmax_positions(heat_test), S, G).to(torch.float32)
    cmp = compare_pck(tree, argmax, test["joints"], test["visible"], test["pck_torso"])
    timings["total"] = time.perf_counter() - t0
    return {
        "train_images": len(train_index), "held_out_images": len(val_index), "test_images": len(data.test),
        "test_images_with_torso": cmp["images_with_torso"],
        "pck@0.2/argmax": cmp["pck_argmax"], "pck@0.2/tree": cmp["pck_tree"],
        "pck@0.2/tree_minus_argmax": {"diff": cmp["pck_tree_minus_argmax"],
                                      "ci95": [cmp["pck_tree_minus_argmax_low"], cmp["pck_tree_minus_argmax_high"]]},
        **pose_report_extras(tree, argmax, test),
        "held_out_argmax_pck@0.2": _argmax_pck(heat_val, train, val_index, S),
        "epochs": history, "best_epoch": best_epoch,
        "ssvm": {"lam": lam, "lam_cv_pck": {str(k): v for k, v in cv.items()}, "gap": result.gap,
                 "primal": result.history[-1].primal if result.history else None, "passes": opts.passes},
        "options": {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(opts).items()},
        "wall_s": timings,
        "predictions": {"tree": tree, "argmax": argmax},
        "heatmaps": {"held_out": heat_val.to(torch.float16), "test": heat_test.to(torch.float16)},
    }
