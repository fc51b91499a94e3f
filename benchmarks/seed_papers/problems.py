"""Problems and plot helpers shared by the figures of Shah et al. 2015 and Osokin et al. 2016
(``shah2015``, ``osokin2016``; entry point ``benchmarks/seed_figures.py``).

Every problem has a ``tiny`` form (a handful of examples, a coarse grid) that the heavy test runs, so that every
figure's code is exercised in seconds.  Problems (``load(name, tiny)`` returns a :class:`Problem`):

* ``digits`` -- scikit-learn's 8 x 8 digits as a ``Multiclass`` (pixels scaled to [0, 1]; train: the first 1347
  images, the rest held out): the stand-in for USPS (7291 16 x 16 images) of Shah et al.;
* ``ocr-small`` / ``ocr-large`` -- OCR fold 0 (n = 626 / 6251 words), fold 1 of the other words held out;
* ``horses`` -- the Weizmann horses' graph cut at 48 x 64 (200 training images, the 28 validation images held out):
  the stand-in for HorseSeg (pixel grid with hand-made features instead of SLIC superpixels with 649-dim features,
  200 instead of 147 / 2376 / 6000 images) and the "HorseSeg" of Shah et al. (real max-flow, no simulated delay);
* ``conll`` -- CoNLL-2000 chunking (n = 8936, d = 1.6M sparse features; ``limit`` keeps the first sentences);
* ``lsp-small`` -- the first 100 LSPET training images under the 14-joint pose tree on a 32 x 32 grid; LSPET images
  101-200 held out.  The paper's unaries are a CNN's heatmaps (Chen & Yuille 2014); here two hand-made channels
  per joint and cell: the log of a Gaussian location prior fitted to the joint's training cells, and the local
  image gradient energy (standardised).  The loss is the paper's PDJ-style ``min(d^2, 1)`` per joint.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np
import torch

from common import DATA


@dataclass
class Problem:
    """A training problem: ``model``, ``train``, held-out ``val`` (chooses ``lam``; never the test split), a
    description of how it differs from the paper's, and the tiny flag."""

    name: str
    model: object
    train: object
    val: object
    note: str
    tiny: bool = False
    extra: dict = field(default_factory=dict)

    @property
    def n(self) -> int:
        return len(self.train)


def _first(data, k: int):
    return data[list(range(min(k, len(data))))]


def digits(tiny: bool = False) -> Problem:
    from sklearn.datasets import load_digits

    from torch_bcfw.data import MulticlassData
    from torch_bcfw.models import Multiclass

    d = load_digits()
    x = torch.as_tensor(d.data / 16.0, dtype=torch.float64)
    y = torch.as_tensor(d.target)
    cut = int(0.75 * len(y))
    train, val = MulticlassData(x[:cut], y[:cut]), MulticlassData(x[cut:], y[cut:])
    if tiny:
        train, val = _first(train, 60), _first(val, 30)
    return Problem("digits", Multiclass(64, 10), train, val, "scikit-learn digits (8 x 8, n = 1347) for USPS "
                   "(16 x 16, n = 7291): the same multiclass oracle (10 scores), a smaller problem", tiny)


def ocr(split: str, tiny: bool = False) -> Problem:
    from torch_bcfw.datasets.ocr import N_LETTERS, load_ocr, ocr_split_with_validation
    from torch_bcfw.models import Chain

    train, val, _ = ocr_split_with_validation(load_ocr(DATA / "ocr"), split, fold=0, val_fold=1)
    if tiny:
        train, val = _first(train, 40), _first(val, 20)
    return Problem(f"ocr-{split}", Chain(train.x.shape[1], N_LETTERS), train, val,
                   f"OCR-{split} fold 0 (the authors' folds)", tiny)


def horses(tiny: bool = False) -> Problem:
    from torch_bcfw.datasets.horses import horse_graph_data
    from torch_bcfw.models import GraphCut

    size = (12, 16) if tiny else (48, 64)
    train = horse_graph_data(DATA / "weizmann_horse", "train", size)
    val = horse_graph_data(DATA / "weizmann_horse", "val", size)
    if tiny:
        train, val = _first(train, 8), _first(val, 4)
    model = GraphCut(train.n_inputs, train.n_edge_inputs, loss="balanced", processes=1)
    return Problem("horses", model, train, val, "Weizmann horses, 200 images at 48 x 64 pixels, 4-connected grid, "
                   "11 hand-made pixel features, learned contrast-sensitive Potts weights (HorseSeg: SLIC "
                   "superpixels, 649-dim features, 147 to 6000 images)", tiny)


def conll(tiny: bool = False, limit: int | None = None) -> Problem:
    from torch_bcfw.datasets.conll_chain import load_conll_problem

    k = 40 if tiny else limit
    prob = load_conll_problem(DATA / "conll2000", limit=k, test_limit=20 if tiny else 1)
    # held out: the last 10% of the (limited) training sentences; the test file is never used here
    n = len(prob.train)
    cut = max(1, int(0.9 * n))
    train, val = prob.train[list(range(cut))], prob.train[list(range(cut, n))]
    return Problem("conll", prob.model, train, val, "CoNLL-2000 chunking, sparse template features (d = 1.6M at "
                   "min_count 3), the first 90% of the training sentences (the last 10% held out)", tiny)


def lsp_small(tiny: bool = False) -> Problem:
    from torch_bcfw.datasets.lsp import joints_to_grid, load_lsp_extended, reference_torso, torso_with_fallback
    from torch_bcfw.models.pose import PoseTree, impute_positions, mean_offsets, offset_scales
    from torch_bcfw.data import PoseData

    n_train, size, G = (6, 32, 8) if tiny else (100, 128, 32)
    samples = load_lsp_extended(DATA / "lspet", "train", size=size, limit=2 * n_train)
    joints = torch.stack([s.joints for s in samples]).double()
    visible = torch.stack([s.visible for s in samples])
    scale = torch.tensor([s.scale for s in samples], dtype=torch.float64)
    grid = joints_to_grid(joints, size, G)
    tr = slice(0, n_train)
    mu = mean_offsets(grid[tr], visible[tr])
    cells = impute_positions(grid, visible, G, mu)
    torso = torso_with_fallback(joints, visible, scale, reference_torso(joints[tr], visible[tr], scale[tr])) * (G / size)
    # channel 0: log of a Gaussian location prior per joint, fitted to the training cells only
    c = cells[tr].double()
    m, s = c.mean(0), c.std(0).clamp_min(1.0)  # [14, 2]
    yy, xx = torch.meshgrid(torch.arange(G, dtype=torch.float64), torch.arange(G, dtype=torch.float64), indexing="ij")
    prior = -0.5 * (((yy - m[:, 0, None, None]) / s[:, 0, None, None]) ** 2
                    + ((xx - m[:, 1, None, None]) / s[:, 1, None, None]) ** 2)  # [14, G, G]
    # channel 1: image gradient energy pooled to the grid, standardised per image
    img = torch.stack([s_.image for s_ in samples]).double().mean(1)  # [N, S, S]
    gy, gx = img.diff(dim=1, append=img[:, -1:]), img.diff(dim=2, append=img[:, :, -1:])
    energy = torch.nn.functional.avg_pool2d((gy ** 2 + gx ** 2).sqrt()[:, None], size // G)[:, 0]  # [N, G, G]
    energy = (energy - energy.mean((1, 2), keepdim=True)) / energy.std((1, 2), keepdim=True).clamp_min(1e-9)
    N = len(samples)
    unary = torch.stack([prior.expand(N, 14, G, G), energy[:, None].expand(N, 14, G, G)], dim=2).contiguous()

    def part(sl):
        return PoseData(unary[sl], cells[sl], visible[sl], torso[sl])

    model = PoseTree(G, mu, n_unary=2, scales=offset_scales(grid[tr], visible[tr]))
    return Problem("lsp-small", model, part(tr), part(slice(n_train, 2 * n_train)),
                   f"LSPET images 1-{n_train} at {size} px on a {G} x {G} grid, 2 hand-made unary channels (location "
                   "prior, gradient energy) instead of a CNN's heatmaps; the paper's LSP-small: 100 images, CNN "
                   "unaries, oracle about 2 s", tiny)


@lru_cache(maxsize=None)
def load(name: str, tiny: bool = False, conll_limit: int | None = None) -> Problem:
    """The problem ``name`` (one object per process and arguments: figures run in one process share it)."""
    if name == "digits":
        return digits(tiny)
    if name in ("ocr-small", "ocr-large"):
        return ocr(name.split("-")[1], tiny)
    if name == "horses":
        return horses(tiny)
    if name == "conll":
        return conll(tiny, conll_limit)
    if name == "lsp-small":
        return lsp_small(tiny)
    raise ValueError(f"unknown problem {name!r}")


def choose_lam(prob: Problem, lams, passes: float, **options) -> tuple[float, list[dict]]:
    """The ``lam`` of ``lams`` with the lowest task loss on the held-out ``prob.val`` after ``passes`` passes of
    BCFW (gap sampling, the returned model), with the table of every candidate."""
    from torch_bcfw import fit
    from torch_bcfw.certificate import task_loss

    rows = []
    for lam in lams:
        r = fit(prob.model, prob.train, lam, "bcfw", max_passes=passes, gap_check=max(1, int(passes)),
                track_train_loss=False, **options)
        rows.append({"lam": float(lam), "val_loss": task_loss(prob.model, prob.val, r.weights), "gap": r.gap})
        print(f"  lam {lam:g}: held-out loss {rows[-1]['val_loss']:.4f}, gap {r.gap:.3g}", flush=True)
    best = min(rows, key=lambda r: r["val_loss"])
    return best["lam"], rows


def band(curves, log_x: bool = False):
    """``(grid, median, min, max)`` of per-seed curves ``[(x, y)]`` interpolated onto the union of their x values
    (inside each curve's range; NaN outside), or ``None`` when there are no points."""
    xs = sorted({float(v) for x, _ in curves for v in x})
    if not xs:
        return None
    grid = np.asarray(xs)
    ys = []
    for x, y in curves:
        x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
        ok = np.isfinite(y)
        if ok.sum() == 0:
            ys.append(np.full(len(grid), np.nan))
            continue
        ys.append(np.interp(grid, x[ok], y[ok], left=np.nan, right=np.nan))
    ys = np.asarray(ys)
    keep = ~np.isnan(ys).all(0)
    if not keep.any():
        return None
    ys, grid = ys[:, keep], grid[keep]
    return grid, np.nanmedian(ys, 0), np.nanmin(ys, 0), np.nanmax(ys, 0)


def draw_band(ax, curves, label, color, style="-", floor=1e-12) -> None:
    b = band(curves)
    if b is None:
        return
    grid, med, lo, hi = b
    ax.plot(grid, np.clip(med, floor, None), style, color=color, linewidth=1.5, label=label)
    if len(curves) > 1:
        ax.fill_between(grid, np.clip(lo, floor, None), np.clip(hi, floor, None), color=color, alpha=0.15, linewidth=0)


def stem(name: str, tiny: bool) -> str:
    return name.replace("/", "_over_") + ("_tiny" if tiny else "")


def lambda_axes(axes, ylabels, log_y) -> None:
    """Style the panels of a sweep over ``lam`` (solved from the largest): log ``lam`` decreasing to the right."""
    for ax, yl, ly in zip(axes, ylabels, log_y):
        ax.set_xscale("log")
        if ly:
            ax.set_yscale("log")
        ax.invert_xaxis()
        ax.set_xlabel("lambda (solved from left to right)")
        ax.set_ylabel(yl)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
