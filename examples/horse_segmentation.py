"""Weizmann horses: a small FCN trained in Lightning, graph-cut SSVM heads solved by BCFW on its features.

    python examples/horse_segmentation.py --data ../shared/data/weizmann_horse [--epochs 30] [--limit N]

The same experiment as ``torch-bcfw train --config configs/horses.yaml`` (same seed, model, data and callback
settings), written out with the Python API:

* the backbone (:class:`torch_bcfw.tasks.horses.SegmentationFCN`, plain torch) maps every image (resized to
  48 x 64) to 16 layer-normalised features per pixel; it is trained with per-pixel binary cross-entropy through
  a 1x1 convolution, which is also baseline (a), "the CNN alone" (thresholded at probability 1/2);
* two :class:`torch_bcfw.lightning.BCFWCallback` solve SSVM heads on the features ``[f_p, 1]``
  every few epochs (warm-started from their dual states re-bound to the new features): (b) ``head_unary``,
  no pairwise term, and (c) ``head``, plus a contrast-sensitive Potts term on the 4-connected grid whose two
  weights are kept >= 0 (box constraints), decoded exactly by min-cut (PyMaxflow; batches in a worker pool);
* the test split (images 229-328) is decoded by all three; pixel accuracy, foreground IoU (over all test
  pixels) and mean per-image IoU are printed with BCFW's certified duality gaps and written to
  ``runs/horses/report.json``.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import lightning.pytorch as pl
import torch
from lightning.pytorch.loggers import CSVLogger

from torch_bcfw.lightning import BCFWCallback
from torch_bcfw.lightning.cli import summarize
from torch_bcfw.tasks.horses import HorseSegmenter, HorsesDataModule

METHODS = {"cnn": "(a) CNN alone, thresholded", "unary": "(b) SSVM head, no pairwise",
           "potts": "(c) graph-cut SSVM (Potts)"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default="../shared/data/weizmann_horse", help="folder with rgb/ and figure_ground/")
    ap.add_argument("--size", type=int, nargs=2, default=(48, 64), metavar=("H", "W"), help="working resolution")
    ap.add_argument("--epochs", type=int, default=30)
    ap.add_argument("--lam", type=float, default=1e-3)
    ap.add_argument("--every", type=int, default=10, help="solve the heads every N epochs")
    ap.add_argument("--passes", type=float, default=20, help="BCFW passes per solve")
    ap.add_argument("--loss", default="balanced", choices=["balanced", "hamming"])
    ap.add_argument("--limit", type=int, default=None, help="use only the first N training images")
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads (1 on a shared CPU)")
    ap.add_argument("--processes", type=int, default=None, help="graph-cut worker processes (default: all CPUs)")
    ap.add_argument("--output", default="runs/horses")
    args = ap.parse_args()

    torch.set_num_threads(args.threads)
    pl.seed_everything(0)
    data = HorsesDataModule(args.data, size=tuple(args.size), batch_size=16, eval_batch_size=50, seed=0,
                            limit=args.limit)
    model = HorseSegmenter(feature_dim=16, width=16, lr=3e-3, weight_decay=1e-4, loss=args.loss, contrast=True,
                           processes=args.processes)
    opts = {"step": "line_search", "sampling": "uniform", "averaging": True, "seed": 1}
    callbacks = [
        BCFWCallback(lam=args.lam, head_attr="head", name="potts", log_prefix="ssvm", every_n_epochs=args.every,
                          passes_per_call=args.passes, initial_passes=0, verbose=True, solver_options=opts),
        BCFWCallback(lam=args.lam, head_attr="head_unary", name="unary", log_prefix="ssvm_unary",
                          every_n_epochs=args.every, passes_per_call=args.passes, initial_passes=0, verbose=True,
                          solver_options=opts),
    ]
    trainer = pl.Trainer(accelerator="cpu", devices=1, max_epochs=args.epochs, callbacks=callbacks,
                         logger=CSVLogger(args.output, name="logs"), default_root_dir=args.output,
                         enable_progress_bar=False, enable_checkpointing=False, num_sanity_val_steps=0)
    t0 = time.perf_counter()
    trainer.fit(model, datamodule=data)
    wall = time.perf_counter() - t0
    test = trainer.test(model, datamodule=data, verbose=False)[0]
    summary = summarize(trainer, wall, test)
    summary["config"] = {**vars(args), "size": list(args.size)}
    summary["acceptance/potts_iou_beats_cnn_and_unary"] = bool(
        summary["test/potts_iou"] > max(summary["test/cnn_iou"], summary["test/unary_iou"]))
    summary["head_weights"] = {"potts": model.head.w.tolist(), "unary": model.head_unary.w.tolist()}
    model.head.model.close()

    out = Path(args.output)
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.json").write_text(json.dumps(summary, indent=1))
    print(f"\ntest split ({len(data.splits['test'])} images at {args.size[0]} x {args.size[1]}):")
    print(f"  {'method':<30} {'pixel acc':>9} {'fg IoU':>7} {'mean IoU':>8}")
    for key, name in METHODS.items():
        print(f"  {name:<30} {summary[f'test/{key}_acc']:>9.4f} {summary[f'test/{key}_iou']:>7.4f} "
              f"{summary[f'test/{key}_miou']:>8.4f}")
    for prefix in ("ssvm", "ssvm_unary"):
        print(f"  {prefix}: certified duality gap {summary[f'{prefix}/gap']:.3g} (primal {summary[f'{prefix}/primal']:.4g}, "
              f"{summary[f'{prefix}/passes']:.0f} BCFW passes in all)")
    pw = model.head.w[-2:].tolist()
    print(f"  Potts weights (constant, contrast) = ({pw[0]:.3g}, {pw[1]:.3g}); wall time {wall:.0f} s (fit) on CPU")


if __name__ == "__main__":
    main()
