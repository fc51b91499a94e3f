"""Regularization path vs warm- and cold-started grid search on OCR (Osokin et al. 2016, Sec. 5.2 / Fig. 8).

OCR-small by default: train on fold 0 (n = 626), validation fold 1 (lambda selection), test folds 2-9.  Every
method covers lambda from the top down to 2^-15 (the bottom of the paper's grid 2^15 ... 2^-15) with a gap
<= eps = 0.1 (the path: at *every* lambda of the range; the grids: at their 31 values).  Reported per method:
cumulative effective passes (oracle calls / n, batch gap passes included) and seconds to cover the range, the
lambda chosen on the validation fold and its test error (mean normalised Hamming loss per word).

    python benchmarks/ocr_path.py                      # OCR-small, BCFW + gap sampling
    python benchmarks/ocr_path.py --preset gap-pairwise-cache
    python benchmarks/ocr_path.py --split large --budget 3600

Writes ``benchmarks/results/ocr_path[_<preset>][_large].json`` and a PNG of cumulative passes / time against
lambda (the paper's Fig. 4 / 8 layout) plus the validation and test loss along the path.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import DATA, RESULTS, print_table, write_json  # noqa: E402
from seed_papers.problems import lambda_axes  # noqa: E402

from torch_bcfw.datasets.ocr import N_LETTERS, load_ocr, ocr_split_with_validation  # noqa: E402
from torch_bcfw.models import Chain  # noqa: E402
from torch_bcfw.plotting import pyplot, save_figure  # noqa: E402
from torch_bcfw.certificate import task_loss  # noqa: E402
from torch_bcfw.solvers.path import default_grid, grid_search, regularization_path  # noqa: E402


def plot(sweeps: dict, path: Path, title: str) -> None:
    fig, axes = pyplot().subplots(1, 3, figsize=(15, 4.2))
    for j, (name, sw) in enumerate(sweeps.items()):
        lams = [p.lam for p in sw.points]
        style = "-" if name == "path" else "o-"
        axes[0].plot(lams, [p.time for p in sw.points], style, markersize=3, color=f"C{j}", label=name)
        axes[1].plot(lams, [p.passes for p in sw.points], style, markersize=3, color=f"C{j}", label=name)
        axes[2].plot(lams, [p.val_loss for p in sw.points], style, markersize=3, color=f"C{j}", label=f"{name} val")
    lambda_axes(axes, ("cumulative time (s)", "cumulative effective passes", "validation loss"), (True, True, False))
    fig.suptitle(title)
    print(f"wrote {save_figure(fig, path)}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--split", default="small", choices=("small", "large"))
    ap.add_argument("--eps", type=float, default=0.1)
    ap.add_argument("--kappa", type=float, default=0.9)
    ap.add_argument("--preset", default="gap-fw")
    ap.add_argument("--budget", type=float, default=1800.0, help="seconds per method (default 1800)")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    words = load_ocr(DATA / "ocr")
    train, val, test = ocr_split_with_validation(words, args.split, fold=0, val_fold=1)
    model = Chain(train.x.shape[1], N_LETTERS)
    grid = default_grid()
    lam_min = grid[-1]
    print(f"OCR-{args.split}: n = {len(train)} train, {len(val)} validation, {len(test)} test; eps = {args.eps}, "
          f"preset {args.preset}, lambda down to {lam_min:g}")
    common = dict(preset=args.preset, val_data=val, time_budget=args.budget)
    sweeps = {}
    t0 = time.perf_counter()
    sweeps["path"] = regularization_path(model, train, eps=args.eps, kappa=args.kappa, lam_min=lam_min, **common)
    print(f"path: {len(sweeps['path'].points)} breakpoints, {time.perf_counter() - t0:.1f} s")
    for warm in (True, False):
        t0 = time.perf_counter()
        name = "grid (warm)" if warm else "grid (cold)"
        sweeps[name] = grid_search(model, train, grid, eps=args.eps, warm_start=warm, **common)
        print(f"{name}: {time.perf_counter() - t0:.1f} s")
    rows = []
    for name, sw in sweeps.items():
        last = sw.points[-1]
        best = sw.best("val_loss")
        reached = sw.lower_limit if name == "path" else last.lam
        rows.append({
            "method": name, "points": len(sw.points), "stopped_by": sw.stopped_by, "down_to": reached,
            "passes": last.passes, "time_s": last.time, "selected_lam": best.lam, "val_err": best.val_loss,
            "test_err": task_loss(model, test, best.w), "gap_there": best.gap,
        })
    print()
    print_table(rows, ["method", "points", "stopped_by", "down_to", "passes", "time_s", "selected_lam", "val_err",
                       "test_err", "gap_there"])
    suffix = ("" if args.preset == "gap-fw" else f"_{args.preset}") + ("" if args.split == "small" else "_large")
    RESULTS.mkdir(parents=True, exist_ok=True)
    plot(sweeps, RESULTS / f"ocr_path{suffix}.png",
         f"OCR-{args.split} (n = {len(train)}), eps = {args.eps}, {args.preset}")
    write_json(f"ocr_path{suffix}.json", {
        "command": "python benchmarks/ocr_path.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "split": args.split, "n": len(train), "eps": args.eps, "kappa": args.kappa, "preset": args.preset,
        "budget_s": args.budget, "rows": rows, "sweeps": {k: v.to_dict() for k, v in sweeps.items()},
    })
    return 0


if __name__ == "__main__":
    sys.exit(main())
