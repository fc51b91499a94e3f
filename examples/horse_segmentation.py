"""Weizmann horses: a pretrained backbone and a small decoder under a BCFW-solved graph cut at the image's resolution.

    python examples/horse_segmentation.py                 # EfficientNet-Lite0, stride-32 stage fine-tuned, 3 seeds
    python examples/horse_segmentation.py --probe         # the structured probe: backbone frozen
    python examples/horse_segmentation.py --device cuda   # the same on a GPU

Images 1-200 train the decoder (and the backbone's blocks from ``--train-from`` on), 201-228 (validation) choose
its epoch and ``lam`` and train the heads, 229-328 test.  The stages, top to bottom:

1. every image, resized to ``--input-size``, goes once through the backbone's frozen part (training images mirrored
   too; :func:`torch_bcfw.vision.stored_features`, progress printed);
2. per seed, a :class:`torch_bcfw.vision.PretrainedTrunk` (the later blocks and a decoder to ``--feature-dim``
   layer-normalised features per pixel at the working resolution ``--size``) and a 1x1 classifier are trained
   with per-pixel binary cross-entropy on images 1-200 (random flips); the epoch kept is the one with the best
   validation IoU of "the CNN alone": the classifier's logits upsampled (bilinear) to each image's own size and
   thresholded at 0;
3. two heads are ``fit`` by BCFW on the validation images at their own resolution (the size of
   ``figure_ground/horseNNN.jpg``), on the decoder's features upsampled (bilinear) to it plus a constant: the
   unary-only SSVM (:class:`torch_bcfw.models.GraphCut` with ``pairwise=False``: the features re-weighted) and the
   graph cut (8-connected grid, a Potts weight and one contrast-sensitive weight per scale of ``--contrast-scales``
   on the original pixels, weights boxed ``>= 0``, decoded exactly by min-cut); each head's ``lam`` is chosen among
   ``--lams`` by 2-fold cross-validated IoU on the validation images
   (:func:`torch_bcfw.cross_validation.choose_lam`);
4. the test images are decoded by the three methods at their own resolution; foreground IoU over all test pixels,
   mean per-image IoU, pixel accuracy, the IoU within ``--band`` pixels of the true boundary, and the IoU gains of
   the graph cut over the CNN and over the unary head with 95% image-bootstrap intervals, per seed.

Writes ``--output/report.json`` and the last seed's test masks ``--output/masks/{cnn,unary,graphcut}/horseNNN.png``
(each image's own size, foreground 255).  ``--threads`` defaults to 1: on a two-core machine shared with other
jobs an epoch took 13 s with one torch thread and 122 s with two; on an idle machine ``--threads 2`` may be faster.
"""
from __future__ import annotations

import argparse
import copy
import json
import time
from pathlib import Path

import numpy as np
import torch
from torch import Tensor, nn
from torch.nn import functional as F

from torch_bcfw import fit
from torch_bcfw.cross_validation import choose_lam
from torch_bcfw.data.graphs import GraphData, grid_graph_data
from torch_bcfw.datasets.horses import load_weizmann_horses
from torch_bcfw.io.serialization import atomic_write_text
from torch_bcfw.metrics.segmentation import boundary_band, iou_difference, segmentation_counts, segmentation_summary
from torch_bcfw.models.graphcut import GraphCut
from torch_bcfw.vision import PretrainedTrunk, efficientnet_lite0, stored_features


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default="../shared/data/weizmann_horse", help="folder with rgb/ and figure_ground/")
    ap.add_argument("--input-size", type=int, nargs=2, default=(384, 480), metavar=("H", "W"),
                    help="backbone input (chosen on the validation images; 256 320 runs 2.5x faster, "
                         "graph-cut IoU 0.904 against 0.912)")
    ap.add_argument("--size", type=int, nargs=2, default=(128, 160), metavar=("H", "W"),
                    help="the decoder's working resolution (the heads work at each image's own)")
    ap.add_argument("--train-from", type=int, default=11,
                    help="first EfficientNet-Lite0 block trained (0-15; earlier ones frozen and cached)")
    ap.add_argument("--probe", action="store_true", help="the backbone frozen entirely (only the decoder trained)")
    ap.add_argument("--feature-dim", type=int, default=16, help="features per pixel")
    ap.add_argument("--width", type=int, default=64, help="decoder channels")
    ap.add_argument("--epochs", type=int, default=15)
    ap.add_argument("--lr", type=float, default=1e-3, help="AdamW, one-cycle schedule")
    ap.add_argument("--weight-decay", type=float, default=1e-4)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--lams", default="0.00001,0.0001,0.001", help="candidate lam of the heads")
    ap.add_argument("--passes", type=float, default=20, help="BCFW passes per head solve")
    ap.add_argument("--loss", default="balanced", choices=["balanced", "hamming"], help="the heads' task loss")
    ap.add_argument("--contrast-scales", default="1",
                    help="multiples of each image's contrast scale beta, one learned edge feature each (e.g. 0.5,1,2)")
    ap.add_argument("--band", type=int, default=5, help="boundary band (pixels) of the band IoU")
    ap.add_argument("--seeds", default="0,1,2", help="decoder seeds (one run each)")
    ap.add_argument("--limit", type=int, default=None, help="first N training images only")
    ap.add_argument("--val-limit", type=int, default=None, help="first N validation images only")
    ap.add_argument("--test-limit", type=int, default=None, help="first N test images only")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--threads", type=int, default=1,
                    help="torch CPU threads (measured on a shared two-core machine: 13 s an epoch with 1, 122 s with 2; "
                         "2 may be faster on an idle machine)")
    ap.add_argument("--processes", type=int, default=None, help="graph-cut worker processes (default: --threads)")
    ap.add_argument("--output", default="runs/horses")
    args = ap.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda: no CUDA device")
    args.train_from = None if args.probe else args.train_from
    args.size, args.input_size = tuple(args.size), tuple(args.input_size)
    args.lams = tuple(float(v) for v in args.lams.split(","))
    args.contrast_scales = tuple(float(v) for v in args.contrast_scales.split(","))
    args.seeds = tuple(int(s) for s in args.seeds.split(","))
    args.processes = args.processes or args.threads
    return args


def load_split(args, name: str) -> dict:
    """One split: image ``names``, ``input`` uint8 ``[N, 3, *input_size]`` for the backbone, working-size ``mask``
    ``[N, *size]``; ``native_image`` / ``native_mask``: per image ``[3, H_i, W_i]`` / ``[H_i, W_i]`` at the mask's
    own size (the rgb image resized to it)."""
    keep = {"train": args.limit, "val": args.val_limit, "test": args.test_limit}[name]
    big = load_weizmann_horses(args.data, size=args.input_size, split=name)[:keep]
    small = load_weizmann_horses(args.data, size=args.size, split=name)[:keep]
    out = {"names": [h.name for h in big], "mask": torch.stack([h.mask for h in small]),
           "input": (torch.stack([h.image for h in big]) * 255).round().to(torch.uint8)}
    if name != "train":
        native = load_weizmann_horses(args.data, split=name)[:keep]
        out["native_image"], out["native_mask"] = [h.image for h in native], [h.mask for h in native]
    return out


# ---------------------------------------------------------------- stage 2: the decoder and "the CNN alone"

class HorseTrunk(nn.Module):
    """Cached maps -> ``(features [B, F, H, W] layer-normalised over channels, logits [B, H, W])``."""

    def __init__(self, backbone: nn.Module, feature_dim: int, train_from: int | None, width: int):
        super().__init__()
        self.trunk = PretrainedTrunk(backbone, feature_dim, train_from, width)
        self.classifier = nn.Conv2d(feature_dim, 1, 1)
        self.feature_dim = feature_dim

    def forward(self, cached: list[Tensor], size: tuple[int, int]) -> tuple[Tensor, Tensor]:
        f = self.trunk(cached, size)
        f = F.layer_norm(f.permute(0, 2, 3, 1), (self.feature_dim,)).permute(0, 3, 1, 2)
        return f, self.classifier(f)[:, 0]


@torch.no_grad()
def predict(model: HorseTrunk, feats: list[Tensor], size, device, batch_size: int = 16) -> tuple[Tensor, Tensor]:
    """``(features [N, F, H, W], logits [N, H, W])`` of the cached maps ``feats`` at ``size``, on the CPU."""
    model.eval()
    fs, ls = [], []
    for s in range(0, len(feats[0]), batch_size):
        f, logit = model([m[s : s + batch_size].to(device) for m in feats], size)
        fs.append(f.cpu())
        ls.append(logit.cpu())
    return torch.cat(fs), torch.cat(ls)


def upsample(maps: Tensor, i: int, shape) -> Tensor:
    """Map ``i`` of ``maps [N, (C,) h, w]`` resized bilinearly to ``shape (H_i, W_i)``: ``[(C,) H_i, W_i]``."""
    m = maps[i][None] if maps.dim() == 4 else maps[i][None, None]
    out = F.interpolate(m.float(), size=tuple(shape), mode="bilinear", align_corners=False)[0]
    return out if maps.dim() == 4 else out[0]


def cnn_masks(logits: Tensor, truths: list[Tensor]) -> list[Tensor]:
    """The CNN alone at each image's own size: its logits upsampled, thresholded at 0."""
    return [(upsample(logits, i, t.shape) > 0).long() for i, t in enumerate(truths)]


def iou(preds: list[Tensor], truths: list[Tensor]) -> float:
    return segmentation_summary(torch.cat([segmentation_counts(p[None], t[None]) for p, t in zip(preds, truths)]))["iou"]


def train_decoder(model: HorseTrunk, feats, feats_flipped, masks: Tensor, val_feats, val_masks: list[Tensor], args,
                  seed: int, log=print) -> tuple[list, int]:
    """Train ``model`` (in place); keep the epoch with the best validation IoU of the CNN alone."""
    gen = torch.Generator().manual_seed(seed)
    dev, size = args.device, args.size
    optim = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=args.lr,
                              weight_decay=args.weight_decay)
    n = len(masks)
    steps = args.epochs * -(-n // args.batch_size)
    sched = torch.optim.lr_scheduler.OneCycleLR(optim, args.lr, total_steps=max(steps, 1), pct_start=0.1)
    history, best, best_state = [], (-1.0, 0), None
    t0 = time.perf_counter()
    for epoch in range(1, args.epochs + 1):
        model.train()
        order = torch.randperm(n, generator=gen)
        total = 0.0
        for s in range(0, n, args.batch_size):
            idx = order[s : s + args.batch_size]
            flip = torch.rand(len(idx), generator=gen) < 0.5
            x = [torch.where(flip[:, None, None, None], ff[idx], f[idx]).to(dev) for f, ff in zip(feats, feats_flipped)]
            y = torch.where(flip[:, None, None], masks[idx].flip(-1), masks[idx]).to(dev)
            loss = F.binary_cross_entropy_with_logits(model(x, size)[1], y.float())
            optim.zero_grad(set_to_none=True)
            loss.backward()
            optim.step()
            sched.step()
            total += float(loss.detach()) * len(idx)
        val = iou(cnn_masks(predict(model, val_feats, size, dev)[1], val_masks), val_masks)
        history.append({"epoch": epoch, "bce": total / n, "val_iou": val, "s": time.perf_counter() - t0})
        log(f"seed {seed} epoch {epoch}: bce {total / n:.4f}, validation IoU {val:.4f} ({time.perf_counter() - t0:.0f} s)")
        if val > best[0]:
            best, best_state = (val, epoch), copy.deepcopy(model.state_dict())
    model.load_state_dict(best_state)
    return history, best[1]


# ---------------------------------------------------------------- stage 3: the heads at each image's own size

def native_graphs(features: Tensor, images: list[Tensor], masks: list[Tensor] | None, args) -> GraphData:
    """One graph per image at its own size: the features ``[N, F, h, w]`` upsampled to it plus a constant 1, on
    the 8-connected grid with a Potts and one contrast feature per scale, computed on the image's pixels."""
    feats = [torch.cat([upsample(features, i, im.shape[1:]), torch.ones(1, *im.shape[1:])]).double()
             for i, im in enumerate(images)]
    return grid_graph_data(feats, [im.double() for im in images], masks, connectivity=8,
                           contrast_scales=args.contrast_scales)


def image_counts(labels: Tensor, data: GraphData) -> Tensor:
    """``[tp, fp, fn, tn]`` per image ``[n, 4]`` of packed labels ``[N_tot]`` against ``data.y``."""
    return torch.cat([segmentation_counts(p[None], t[None]) for p, t in
                      zip(data.split_labels(labels), data.split_labels(data.y))])


def solve_head(model: GraphCut, data: GraphData, args):
    """``(FitResult, lam, {lam: 2-fold cross-validated IoU})`` of ``model`` on the labelled graphs ``data``."""
    solver = {"max_passes": args.passes, "step": "line_search", "sampling": "uniform", "averaging": True, "seed": 1}
    lam, scores = args.lams[0], {}
    if len(args.lams) > 1:
        lam, scores = choose_lam(model, data, args.lams, lambda w, d: image_counts(model.decode(w, d), d),
                                 lambda counts: segmentation_summary(counts)["iou"], **solver)
    return fit(model, data, lam, **solver), lam, scores


# ---------------------------------------------------------------- stage 4: the test images at their own size

def decode_test(heads: dict, features: Tensor, logits: Tensor, test: dict, args, chunk: int = 20) -> dict:
    """Masks ``{method: [H_i, W_i] per image}`` of the CNN alone and of every head ``{name: (model, weights)}``,
    decoded ``chunk`` images at a time (the graphs at full size are large)."""
    masks = {"cnn": cnn_masks(logits, test["native_mask"]), **{name: [] for name in heads}}
    for s in range(0, len(logits), chunk):
        images = test["native_image"][s : s + chunk]
        data = native_graphs(features[s : s + chunk], images, None, args)
        for name, (model, w) in heads.items():
            masks[name] += [y.reshape(im.shape[1:]) for y, im in zip(data.split_labels(model.decode(w, data)), images)]
    return masks


def score_test(masks: dict, truths: list[Tensor], band: int) -> dict:
    """Per method: acc, iou, miou over the test images, and ``band_iou`` within ``band`` pixels of the true
    boundary; the IoU gains of the graph cut (all pixels and band) with their 95% bootstrap intervals."""
    bands = [boundary_band(t[None], band) for t in truths]
    counts = {k: torch.cat([segmentation_counts(p[None], t[None]) for p, t in zip(m, truths)]) for k, m in masks.items()}
    in_band = {k: torch.cat([segmentation_counts(p[None], t[None], b) for p, t, b in zip(m, truths, bands)])
               for k, m in masks.items()}
    out = {f"{k}/{m}": v for k, c in counts.items() for m, v in segmentation_summary(c).items()}
    out.update({f"{k}/band_iou": segmentation_summary(c)["iou"] for k, c in in_band.items()})
    for name, (a, b, table) in {"graphcut_minus_cnn_iou": ("graphcut", "cnn", counts),
                                "graphcut_minus_unary_iou": ("graphcut", "unary", counts),
                                "unary_minus_cnn_iou": ("unary", "cnn", counts),
                                "graphcut_minus_cnn_band_iou": ("graphcut", "cnn", in_band)}.items():
        d = iou_difference(table[a], table[b])
        out[name] = {"diff": d["diff"], "ci95": [d["low"], d["high"]]}
    return out


def write_masks(masks: dict, names: list[str], out: Path) -> None:
    """Every mask as ``out/<method>/<name>.png`` (foreground 255)."""
    from PIL import Image

    for method, ms in masks.items():
        (out / method).mkdir(parents=True, exist_ok=True)
        for name, m in zip(names, ms):
            Image.fromarray(m.numpy().astype(np.uint8) * 255).save(out / method / f"{name}.png")


def main(argv=None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    out = Path(args.output)
    cache_dir = str(out / "cache")
    t0 = time.perf_counter()

    # stage 1: the backbone, the images and their cached features
    backbone = efficientnet_lite0()
    split = {name: load_split(args, name) for name in ("train", "val", "test")}
    train, val, test = split["train"], split["val"], split["test"]
    timings = {"load": time.perf_counter() - t0}
    t = time.perf_counter()
    feats = {name: stored_features(cache_dir, f"horses_{name}", backbone, s["input"], args.train_from,
                                   device=args.device, log=lambda m, n=name: print(f"{n}: {m}"))
             for name, s in split.items()}
    flipped = stored_features(cache_dir, "horses_train", backbone, train["input"], args.train_from,
                              device=args.device, flip=True, log=lambda m: print(f"train, mirrored: {m}"))
    timings["cache_features"] = time.perf_counter() - t
    print(f"cached features of {sum(len(s['mask']) for s in split.values())} images in {timings['cache_features']:.0f} s")

    unary = GraphCut(args.feature_dim + 1, pairwise=False, loss=args.loss, processes=args.processes)
    graphcut = GraphCut(args.feature_dim + 1, 1 + len(args.contrast_scales), loss=args.loss, processes=args.processes)
    runs = []
    try:
        for seed in args.seeds:
            # stage 2: the decoder
            t = time.perf_counter()
            torch.manual_seed(seed)
            model = HorseTrunk(copy.deepcopy(backbone), args.feature_dim, args.train_from, args.width).to(args.device)
            history, best = train_decoder(model, feats["train"], flipped, train["mask"], feats["val"],
                                          val["native_mask"], args, seed)
            t_train = time.perf_counter() - t
            # stage 3: the heads on the validation images
            t = time.perf_counter()
            f_val, _ = predict(model, feats["val"], args.size, args.device)
            val_data = native_graphs(f_val, val["native_image"], val["native_mask"], args)
            heads, run = {}, {"seed": seed, "best_epoch": best, "epochs": history}
            for name, head in (("unary", unary), ("graphcut", graphcut)):
                result, lam, cv = solve_head(head, val_data, args)
                heads[name] = (head, result.weights)
                solved = {"lam": lam, "lam_cv_iou": {str(k): v for k, v in cv.items()}, "gap": result.gap,
                          "primal": result.history[-1].primal if result.history else None,
                          "head_weights": result.weights.tolist()}
                if name == "graphcut":  # a seed's graph-cut solve at its top level, the unary head's under "unary"
                    run.update(solved)
                else:
                    run["unary"] = solved
                print(f"seed {seed}: {name} head lam {lam:g} (cross-validated IoU {cv}), certified gap {result.gap:.3g}")
            del val_data
            t_head = time.perf_counter() - t
            # stage 4: the test images
            t = time.perf_counter()
            f_test, logit_test = predict(model, feats["test"], args.size, args.device)
            masks = decode_test(heads, f_test, logit_test, test, args)
            run.update(score_test(masks, test["native_mask"], args.band))
            run["wall_s"] = {"train": t_train, "heads": t_head, "test": time.perf_counter() - t}
            g = run["graphcut_minus_cnn_iou"]
            print(f"seed {seed}: test IoU CNN {run['cnn/iou']:.4f}, unary head {run['unary/iou']:.4f}, graph cut "
                  f"{run['graphcut/iou']:.4f} (gain over the CNN {100 * g['diff']:+.2f} [{100 * g['ci95'][0]:+.2f}, "
                  f"{100 * g['ci95'][1]:+.2f}] points)")
            runs.append(run)
    finally:
        unary.close()
        graphcut.close()
    write_masks(masks, test["names"], out / "masks")
    timings["total"] = time.perf_counter() - t0
    mean = {k: sum(r[k] for r in runs) / len(runs) for k in runs[0] if "/" in k}
    report = {"train_images": len(train["mask"]), "val_images": len(val["mask"]), "test_images": len(test["mask"]),
              "resolution": "each image's own (the size of figure_ground/horseNNN.jpg)",
              "mean_over_seeds": mean, "seeds": runs,
              "options": {k: (list(v) if isinstance(v, tuple) else v) for k, v in vars(args).items()},
              "wall_s": timings, "device": args.device, "threads": args.threads,
              "backbone": "efficientnet-lite0 (ImageNet)"}
    report["wall_s"]["script"] = time.perf_counter() - t0
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "report.json", json.dumps(report, indent=1))
    print(f"\ntest images 229-328 at their own resolution (IoU; band: within {args.band} px of the true boundary):")
    print(f"  {'seed':>4} {'CNN':>7} {'unary':>7} {'graph cut':>9} {'band CNN / cut':>15} "
          f"{'graph cut - CNN (points, 95% interval)':>40}")
    for r in runs:
        g = r["graphcut_minus_cnn_iou"]
        print(f"  {r['seed']:>4} {r['cnn/iou']:>7.4f} {r['unary/iou']:>7.4f} {r['graphcut/iou']:>9.4f} "
              f"{r['cnn/band_iou']:>7.4f} {r['graphcut/band_iou']:.4f} {100 * g['diff']:>+16.2f} "
              f"[{100 * g['ci95'][0]:+.2f}, {100 * g['ci95'][1]:+.2f}]")
    print(f"  mean {mean['cnn/iou']:>7.4f} {mean['unary/iou']:>7.4f} {mean['graphcut/iou']:>9.4f}; "
          f"{report['wall_s']['script']:.0f} s; wrote {out / 'report.json'}")


if __name__ == "__main__":
    main()
