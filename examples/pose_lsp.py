"""Human pose on LSP Extended: a small heatmap CNN under a BCFW-solved pictorial-structures (tree) head.

    python examples/pose_lsp.py --data ../shared/data/lspet [--epochs 8] [--limit N] [--threads 2]
    python examples/pose_lsp.py ... --save-backbone runs/pose/cnn.pt     # keep the trained CNN
    python examples/pose_lsp.py ... --backbone runs/pose/cnn.pt --lam 0.03   # re-solve the head only

The same experiment as ``torch-bcfw train --config configs/pose_lsp.yaml`` (same seed, model, data and
callback settings), written out with the Python API:

* data: LSP Extended images 1-1500 train, 1501-2000 test (the fixed split of
  :mod:`torch_bcfw.datasets.lsp`), letterboxed to 128 x 128; the pose grid is 32 x 32 (4-pixel cells);
* the backbone (:class:`torch_bcfw.tasks.pose.HeatmapCNN`, plain torch) is trained in Lightning with a
  soft-target cross-entropy per visible joint (flip + translation augmentation);
* the head (:class:`torch_bcfw.tasks.pose.PoseHead` on a :class:`torch_bcfw.models.PoseTree`:
  one weight per joint on the CNN's log-softmax heatmap, 4 deformation weights per tree edge with the
  quadratic ones boxed to ``>= 0``) is never touched by the optimiser:
  :class:`torch_bcfw.lightning.BCFWCallback` solves it with BCFW on the current training
  heatmaps (every ``--every`` epochs, warm-started from the re-bound dual state) and logs the certified gap;
* at the end the test split is decoded and PCK@0.2 (torso-normalised, frame pixels; images without an
  annotated torso are left out) is reported for (a) the per-joint argmax of the heatmaps and (b) the tree.

Writes ``runs/pose/report.json`` (``--output``).
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import lightning.pytorch as pl
import torch
from lightning.pytorch.loggers import CSVLogger

from torch_bcfw import cross_validate
from torch_bcfw.lightning import BCFWCallback
from torch_bcfw.lightning.cli import set_threads
from torch_bcfw.datasets.lsp import grid_to_joints
from torch_bcfw.metrics.pck import compare_pck
from torch_bcfw.tasks.lsp_data import LSPPoseDataModule
from torch_bcfw.tasks.pose import PoseTreeCNN, argmax_positions


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default="../shared/data/lspet", help="folder with joints.mat and images/")
    ap.add_argument("--epochs", type=int, default=60)
    ap.add_argument("--lam", type=float, default=1e-2)
    ap.add_argument("--passes", type=float, default=20, help="BCFW passes per solve")
    ap.add_argument("--every", type=int, default=30, help="solve the head every this many epochs")
    ap.add_argument("--size", type=int, default=128, help="input frame side S (the grid is S / 4)")
    ap.add_argument("--types", type=int, default=1, help="mixture types per tree edge (k-means of the offsets)")
    ap.add_argument("--holdout", type=int, default=0,
                    help="train the CNN without the last N training images and the head on those N only")
    ap.add_argument("--cross-fit", type=int, default=1,
                    help="K >= 2: K CNNs, CNN k trained without fold k; the head learns from out-of-fold heatmaps, "
                         "test images get the ensemble's (K - 1 times the CNN training time)")
    ap.add_argument("--type-features", action="store_true",
                    help="image-dependent pairwise relations (Chen & Yuille 2014; needs --types > 1): the CNN also "
                         "predicts every edge's type at both ends, the head scores those predictions")
    ap.add_argument("--deformation-scale", type=float, default=4.0,
                    help="displacement features in units of this many standard deviations (16: softer, the best "
                         "in the session-9/10 head experiments)")
    ap.add_argument("--limit", type=int, default=None, help="use only the first N training images")
    ap.add_argument("--test-limit", type=int, default=None)
    ap.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    ap.add_argument("--dilations", default="1,2,4,8",
                    help="one residual block per entry, its first 3x3 convolution dilated by it (receptive field: "
                         "1,2,4,8 sees the whole 128-pixel frame, 1,1,1,1 about 70 pixels)")
    ap.add_argument("--loss-radius", type=float, default=1.0,
                    help="the head's SSVM loss of a joint saturates this many torso sizes from the truth")
    ap.add_argument("--save-backbone", default=None, metavar="PATH",
                    help="after training, save the CNN weights here (reuse them with --backbone)")
    ap.add_argument("--backbone", default=None, metavar="PATH",
                    help="load CNN weights saved by --save-backbone (same --types/--cross-fit/--type-features/--size) "
                         "and skip CNN training: only the head is solved (--passes passes) and tested")
    ap.add_argument("--cross-validate-head", action="store_true",
                    help="with --cross-fit K: also solve K heads, head k on the out-of-fold heatmaps of the training "
                         "images outside fold k, and report tree vs argmax PCK@0.2 on the training images, each "
                         "predicted by a head and a CNN that never saw it (K more head solves)")
    ap.add_argument("--output", default="runs/pose")
    args = ap.parse_args()

    if args.epochs < 1 and not args.backbone:
        ap.error("--epochs must be >= 1 (or give a trained CNN with --backbone)")
    if args.cross_validate_head and args.cross_fit < 2:
        ap.error("--cross-validate-head needs out-of-fold heatmaps: --cross-fit K with K >= 2")
    dilations = tuple(int(d) for d in args.dilations.split(","))
    set_threads(args.threads)
    pl.seed_everything(0)
    out = Path(args.output)
    S, G = args.size, args.size // 4
    data = LSPPoseDataModule(root=args.data, size=S, grid_size=G, limit=args.limit, test_limit=args.test_limit,
                             batch_size=16, eval_batch_size=100, deformation_scale=args.deformation_scale, cache_dir=str(out / "cache"),
                             seed=0, n_types=args.types, head_holdout=args.holdout,
                             cross_fit=args.cross_fit)
    model = PoseTreeCNN(size=S, stem=24, width=32, dilations=dilations, lr=3e-3, weight_decay=1e-4, sigma=1.0,
                        max_shift=8, flip=True, alpha=0.2, seed=0, n_types=args.types,
                        cross_fit=args.cross_fit, type_features=args.type_features, loss_radius=args.loss_radius)
    bcfw = BCFWCallback(lam=args.lam, every_n_epochs=args.every, passes_per_call=args.passes, initial_passes=0,
                            verbose=True, solver_options={"step": "line_search", "sampling": "uniform",
                                                          "averaging": True, "seed": 1})
    callbacks = [bcfw]
    if args.backbone:  # a trained CNN: no training epoch, one head solve when the fit starts
        model.backbone.load_state_dict(torch.load(args.backbone, map_location="cpu", weights_only=True))
        args.epochs = 0
        callbacks.append(SolveAtFitStart(bcfw))
    trainer = pl.Trainer(accelerator="cpu", devices=1, max_epochs=args.epochs, callbacks=callbacks,
                         logger=CSVLogger(str(out), name="logs"), default_root_dir=str(out),
                         enable_progress_bar=False, enable_checkpointing=False, num_sanity_val_steps=0,
                         limit_val_batches=0)
    t0 = time.perf_counter()
    trainer.fit(model, datamodule=data)
    wall_fit = time.perf_counter() - t0
    if args.save_backbone:
        Path(args.save_backbone).parent.mkdir(parents=True, exist_ok=True)
        torch.save(model.backbone.state_dict(), args.save_backbone)
    cv = head_cross_validation(trainer, model, bcfw, data) if args.cross_validate_head else None
    trainer.test(model, datamodule=data, verbose=False)
    res = dict(model.test_results)
    rec = bcfw.last_record
    report = {
        "train_images": len(data.train), "head_train_images": len(data.bcfw_dataloader().dataset), "test_images": res.pop("test/images"),
        "test_images_with_torso": res.pop("test/images_with_torso"),
        "pck@0.2/argmax": res["test/pck_argmax"], "pck@0.2/tree": res["test/pck_tree"],
        "pck@0.2/tree_minus_argmax": {"diff": res["test/pck_tree_minus_argmax"],
                                      "ci95": [res["test/pck_tree_minus_argmax_low"],
                                               res["test/pck_tree_minus_argmax_high"]]},
        "test_task_loss/tree": res["test/task_loss_tree"],
        "ssvm": {**BCFWCallback_figures(bcfw), "lam": args.lam, "calls": bcfw.calls},
        "head_weights": model.head.w.tolist(), "mean_offsets": model.head.mu.tolist(),
        "reference_torso_px": data.reference_torso,
        "epochs": args.epochs, "grid": G, "size": S, "n_types": args.types, "head_holdout": args.holdout,
        "cross_fit": args.cross_fit, "type_features": args.type_features, "loss_radius": args.loss_radius,
        "dilations": list(dilations), "backbone": args.backbone,
        "deformation_scale": args.deformation_scale, "threads": args.threads,
        "wall_s": {"fit": wall_fit, "total": time.perf_counter() - t0, "last_solve": rec.wall if rec else None},
    }
    if cv is not None:
        report["cross_validation"] = cv
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.json").write_text(json.dumps(report, indent=1))
    diff = report["pck@0.2/tree_minus_argmax"]
    print(f"\nLSP Extended test ({report['test_images_with_torso']} images with a torso): PCK@0.2 "
          f"per-joint argmax {report['pck@0.2/argmax']:.4f}, tree SSVM {report['pck@0.2/tree']:.4f} "
          f"(difference {100 * diff['diff']:+.2f} points, 95% paired image-bootstrap interval "
          f"[{100 * diff['ci95'][0]:+.2f}, {100 * diff['ci95'][1]:+.2f}]); "
          f"certified gap {report['ssvm']['gap']:.3g} (primal {report['ssvm']['primal']:.4g}); "
          f"wall {report['wall_s']['total']:.0f} s; wrote {out / 'report.json'}")
    if cv is not None:
        d = cv["pck@0.2/tree_minus_argmax"]
        print(f"cross-validated head on the {cv['images_with_torso']} training images with a torso ({cv['folds']} "
              f"folds, out-of-fold heatmaps): PCK@0.2 argmax {cv['pck@0.2/argmax']:.4f}, tree {cv['pck@0.2/tree']:.4f} "
              f"(difference {100 * d['diff']:+.2f} [{100 * d['ci95'][0]:+.2f}, {100 * d['ci95'][1]:+.2f}])")


def head_cross_validation(trainer, model: PoseTreeCNN, bcfw: BCFWCallback, data: LSPPoseDataModule) -> dict:
    """Tree vs argmax PCK@0.2 on the training images, each decoded by a head solved (same ``lam`` and solver
    options as ``bcfw``) on the other folds' out-of-fold heatmaps: neither its CNN nor its head saw the image."""
    train = bcfw.training_data(trainer, model).to("cpu")
    fields = data.train.fields
    if len(train) != len(fields["fold"]):
        raise RuntimeError(f"the head's training images ({len(train)}) are not the training split ({len(fields['fold'])})")
    tree_model = model.head.model
    fits = cross_validate(tree_model, train, fields["fold"], bcfw.lam, **bcfw.options.to_dict())
    index = torch.cat([f.test_index for f in fits])
    tree = torch.cat([tree_model.decode_positions(f.result.weights, train[f.test_index]) for f in fits])
    size, grid = model.hparams.size, model.grid_size
    cmp = compare_pck(grid_to_joints(tree, size, grid), grid_to_joints(argmax_positions(train.unary[index, :, 0]), size, grid),
                      fields["joints"][index], fields["visible"][index], fields["pck_torso"][index])
    return {"folds": len(fits), "images": len(index), "images_with_torso": cmp["images_with_torso"],
            "pck@0.2/argmax": cmp["pck_argmax"], "pck@0.2/tree": cmp["pck_tree"],
            "pck@0.2/tree_minus_argmax": {"diff": cmp["pck_tree_minus_argmax"],
                                          "ci95": [cmp["pck_tree_minus_argmax_low"], cmp["pck_tree_minus_argmax_high"]]},
            "per_fold": [{"fold": f.fold, "train_images": len(f.train_index), "gap": f.result.gap,
                          "primal": f.result.primal} for f in fits]}


class SolveAtFitStart(pl.Callback):
    """With a loaded backbone (``max_epochs=0``, so no epoch ends): one solve of ``bcfw`` (its ``passes_per_call``)
    when the fit starts."""

    def __init__(self, bcfw: BCFWCallback):
        self.bcfw = bcfw

    def on_fit_start(self, trainer, pl_module) -> None:
        self.bcfw.solve(trainer, pl_module, self.bcfw.passes_per_call, log=False)


def BCFWCallback_figures(cb) -> dict:  # noqa: N802 - mirrors BCFWCallback.figures
    return cb.figures(cb.last_record) if cb.last_record is not None else {}


if __name__ == "__main__":
    main()
