"""Weizmann horses from a pretrained backbone: a decoder on cached features, a BCFW-solved graph-cut head on top.

:func:`run_horses` is the pipeline of ``examples/horse_segmentation.py``:

1. every image, resized to ``input_size``, goes once through the backbone's frozen part (training images mirrored
   too) (:func:`~torch_bcfw.tasks.pretrained.cache_features`);
2. per seed, a :class:`~torch_bcfw.tasks.pretrained.PretrainedTrunk` (the later blocks and a decoder to
   ``feature_dim`` layer-normalised features per pixel at the working resolution ``size``) and a 1x1 classifier are
   trained with per-pixel binary cross-entropy on images 1-200 (random flips); the epoch kept is the one with the
   best foreground IoU of the classifier on the validation images 201-228 -- this classifier, thresholded at 1/2,
   is "the CNN alone";
3. a graph-cut head (:class:`~torch_bcfw.models.GraphCut`: unary weights on ``[f_p, 1]`` and a contrast-sensitive
   Potts term on the 4-connected grid, weights boxed ``>= 0``) is solved by BCFW on the validation images' features
   (images the decoder never trained on); ``lam`` is chosen among ``lams`` by 2-fold cross-validation on them;
4. the test images 229-328 are decoded by both; foreground IoU (over all test pixels), mean per-image IoU, pixel
   accuracy, and the graph cut's IoU gain over the CNN with a 95% image-bootstrap interval, per seed.

With ``train_from=None`` the backbone is frozen entirely: the structured probe.
"""
from __future__ import annotations

import copy
import time
from dataclasses import asdict, dataclass

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from ..cross_validation import cross_validate
from ..datasets.horses import load_weizmann_horses
from ..fit import fit
from ..data.graphs import GraphData, grid_graph_data
from ..metrics.segmentation import iou_difference, segmentation_counts, segmentation_summary
from ..models.graphcut import GraphCut
from .pretrained import PretrainedTrunk, stored_features

__all__ = ["HorsesOptions", "HorseTrunk", "run_horses"]


@dataclass
class HorsesOptions:
    """Options of :func:`run_horses` (the defaults are those of ``examples/horse_segmentation.py``).

    Attributes:
        input_size: ``(H, W)`` the images are resized to for the backbone.
        size: working resolution ``(H, W)`` of the masks, the decoder's output and the graph cut.
        train_from: first backbone block trained (earlier ones frozen and cached); ``None``: the frozen probe.
        feature_dim, width: features per pixel and decoder channels.
        epochs, lr, weight_decay, batch_size: AdamW with a one-cycle schedule.
        lams: candidate ``lam`` of the graph-cut head; passes: BCFW passes per solve; loss: its task loss.
        seeds: decoder initialisations (one full training and head solve each).
        limit, test_limit: first training / test images only (quick runs); device: ``"cpu"`` or ``"cuda"``;
        processes: graph-cut worker processes (``None``: all CPUs).
    """

    input_size: tuple[int, int] = (256, 320)
    size: tuple[int, int] = (128, 160)
    train_from: int | None = 11
    feature_dim: int = 16
    width: int = 64
    epochs: int = 15
    lr: float = 1e-3
    weight_decay: float = 1e-4
    batch_size: int = 8
    lams: tuple[float, ...] = (1e-4, 1e-3, 1e-2)
    passes: float = 20
    loss: str = "balanced"
    seeds: tuple[int, ...] = (0, 1, 2)
    limit: int | None = None
    test_limit: int | None = None
    device: str = "cpu"
    processes: int | None = None


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
def _predict(model: HorseTrunk, feats: list[Tensor], size, device, batch_size: int = 16) -> tuple[Tensor, Tensor]:
    model.eval()
    fs, ls = [], []
    for s in range(0, len(feats[0]), batch_size):
        f, logit = model([m[s : s + batch_size].to(device) for m in feats], size)
        fs.append(f.cpu())
        ls.append(logit.cpu())
    return torch.cat(fs), torch.cat(ls)


def _iou(pred: Tensor, masks: Tensor) -> float:
    return segmentation_summary(segmentation_counts(pred, masks))["iou"]


def train_decoder(model: HorseTrunk, feats, feats_flipped, masks: Tensor, val_feats, val_masks: Tensor,
                  opts: HorsesOptions, seed: int, log=print) -> tuple[list, int]:
    """Train ``model`` (in place); keep the epoch with the best validation IoU of the classifier."""
    gen = torch.Generator().manual_seed(seed)
    dev, size = opts.device, tuple(opts.size)
    params = [p for p in model.parameters() if p.requires_grad]
    optim = torch.optim.AdamW(params, lr=opts.lr, weight_decay=opts.weight_decay)
    n = len(masks)
    steps = opts.epochs * -(-n // opts.batch_size)
    sched = torch.optim.lr_scheduler.OneCycleLR(optim, opts.lr, total_steps=max(steps, 1), pct_start=0.1)
    history, best, best_state = [], (-1.0, 0), None
    t0 = time.perf_counter()
    for epoch in range(1, opts.epochs + 1):
        model.train()
        order = torch.randperm(n, generator=gen)
        total = 0.0
        for s in range(0, n, opts.batch_size):
            idx = order[s : s + opts.batch_size]
            flip = torch.rand(len(idx), generator=gen) < 0.5
            x = [torch.where(flip[:, None, None, None], ff[idx], f[idx]).to(dev) for f, ff in zip(feats, feats_flipped)]
            y = torch.where(flip[:, None, None], masks[idx].flip(-1), masks[idx]).to(dev)
            loss = F.binary_cross_entropy_with_logits(model(x, size)[1], y.float())
            optim.zero_grad(set_to_none=True)
            loss.backward()
            optim.step()
            sched.step()
            total += float(loss.detach()) * len(idx)
        val = _iou((_predict(model, val_feats, size, dev)[1] > 0).long(), val_masks)
        history.append({"epoch": epoch, "bce": total / n, "val_iou": val, "s": time.perf_counter() - t0})
        log(f"seed {seed} epoch {epoch}: bce {total / n:.4f}, validation IoU {val:.4f} ({time.perf_counter() - t0:.0f} s)")
        if val > best[0]:
            best, best_state = (val, epoch), copy.deepcopy(model.state_dict())
    model.load_state_dict(best_state)
    return history, best[1]


def _graph(features: Tensor, images: Tensor, masks: Tensor | None) -> GraphData:
    feats = torch.cat([features, torch.ones_like(features[:, :1])], 1).to(torch.float64)
    return grid_graph_data(feats, images.to(torch.float64), masks, contrast=True)


def _solver(opts: HorsesOptions) -> dict:
    return {"max_passes": opts.passes, "step": "line_search", "sampling": "uniform", "averaging": True, "seed": 1}


def _decode(model: GraphCut, w: Tensor, data: GraphData, shape) -> Tensor:
    return model.decode(w, data).reshape(shape)


def solve_head(model: GraphCut, data: GraphData, masks: Tensor, opts: HorsesOptions):
    """``(FitResult, lam, {lam: 2-fold cross-validated IoU})`` on ``data`` (its images' ``masks [n, H, W]``)."""
    scores = {}
    if len(opts.lams) > 1:
        folds = torch.arange(len(masks)) % 2
        for lam in opts.lams:
            pred = torch.empty_like(masks)
            for f in cross_validate(model, data, folds, lam, **_solver(opts)):
                pred[f.test_index] = _decode(model, f.result.weights, data[f.test_index], masks[f.test_index].shape)
            scores[lam] = _iou(pred, masks)
    lam = max(scores, key=lambda k: scores[k]) if scores else opts.lams[0]
    return fit(model, data, lam, **_solver(opts)), lam, scores


def run_horses(root: str, opts: HorsesOptions, backbone: nn.Module, cache_dir: str | None = None, log=print) -> dict:
    """The whole pipeline (module docstring); ``cache_dir`` keeps the cached features for reruns.  Returns a report dict; ``"masks"`` holds the last seed's test
    predictions ``{"cnn", "graphcut"}`` (long ``[100, H, W]`` at ``size``) and ``"names"`` the test image names."""
    t0 = time.perf_counter()
    size, insize = tuple(opts.size), tuple(opts.input_size)
    split = {}
    for name in ("train", "val", "test"):
        small = load_weizmann_horses(root, size=size, split=name)
        big = load_weizmann_horses(root, size=insize, split=name)
        keep = {"train": opts.limit, "test": opts.test_limit}.get(name)
        if keep is not None:
            small, big = small[:keep], big[:keep]
        split[name] = {"names": [h.name for h in small], "image": torch.stack([h.image for h in small]),
                       "mask": torch.stack([h.mask for h in small]),
                       "input": (torch.stack([h.image for h in big]) * 255).round().to(torch.uint8)}
    timings = {"load": time.perf_counter() - t0}
    t = time.perf_counter()
    feats = {name: stored_features(cache_dir, f"horses_{name}", backbone, s["input"], opts.train_from,
                                   device=opts.device) for name, s in split.items()}
    flipped = stored_features(cache_dir, "horses_train", backbone, split["train"]["input"], opts.train_from,
                              device=opts.device, flip=True)
    timings["cache_features"] = time.perf_counter() - t
    log(f"cached features of {sum(len(s['mask']) for s in split.values())} images in {timings['cache_features']:.0f} s")

    val, test = split["val"], split["test"]
    graphcut = GraphCut(opts.feature_dim + 1, 2, loss=opts.loss, processes=opts.processes)
    runs, masks = [], None
    try:
        for seed in opts.seeds:
            t = time.perf_counter()
            torch.manual_seed(seed)
            model = HorseTrunk(copy.deepcopy(backbone), opts.feature_dim, opts.train_from, opts.width).to(opts.device)
            history, best = train_decoder(model, feats["train"], flipped, split["train"]["mask"], feats["val"],
                                          val["mask"], opts, seed, log)
            t_train = time.perf_counter() - t
            t = time.perf_counter()
            f_val, _ = _predict(model, feats["val"], size, opts.device)
            result, lam, cv = solve_head(graphcut, _graph(f_val, val["image"], val["mask"]), val["mask"], opts)
            f_test, logit_test = _predict(model, feats["test"], size, opts.device)
            pred = {"cnn": (logit_test > 0).long(),
                    "graphcut": _decode(graphcut, result.weights, _graph(f_test, test["image"], None), logit_test.shape)}
            counts = {k: segmentation_counts(p, test["mask"]) for k, p in pred.items()}
            diff = iou_difference(counts["graphcut"], counts["cnn"])
            run = {"seed": seed, "best_epoch": best, "epochs": history, "lam": lam,
                   "lam_cv_iou": {str(k): v for k, v in cv.items()}, "gap": result.gap,
                   "primal": result.history[-1].primal if result.history else None,
                   "head_weights": result.weights.tolist(),
                   **{f"{k}/{m}": v for k, c in counts.items() for m, v in segmentation_summary(c).items()},
                   "graphcut_minus_cnn_iou": {"diff": diff["diff"], "ci95": [diff["low"], diff["high"]]},
                   "wall_s": {"train": t_train, "head_and_test": time.perf_counter() - t}}
            log(f"seed {seed}: test IoU CNN {run['cnn/iou']:.4f}, graph cut {run['graphcut/iou']:.4f} "
                f"(gain {100 * diff['diff']:+.2f} [{100 * diff['low']:+.2f}, {100 * diff['high']:+.2f}] points), "
                f"lam {lam:g}, certified gap {result.gap:.3g}")
            runs.append(run)
            masks = pred
    finally:
        graphcut.close()
    timings["total"] = time.perf_counter() - t0
    mean = {k: sum(r[k] for r in runs) / len(runs) for k in runs[0] if "/" in k and not isinstance(runs[0][k], dict)}
    return {"train_images": len(split["train"]["mask"]), "val_images": len(val["mask"]), "test_images": len(test["mask"]),
            "mean_over_seeds": mean, "seeds": runs,
            "options": {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(opts).items()},
            "wall_s": timings, "masks": masks, "names": test["names"]}
