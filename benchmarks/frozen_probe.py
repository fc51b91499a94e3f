"""The frozen-backbone probe: BCFW against Adam on the same SSVM objective, features fixed.

    python benchmarks/frozen_probe.py [--lam 0.01] [--epochs 30] [--lrs 1e-4,3e-4,1e-3,3e-3,1e-2,3e-2,1e-1] [--quick]

OCR-large with fold 1 held out (train on folds 2-9, 5,557 words; held-out fold 1; test fold 0), the chain head on
fixed features (the 16x8 letter pixels: the backbone is frozen, here the identity), one objective

    P(w) = lam/2 ||w||^2 + 1/n sum_i max_y [L_i(y) - <w, psi_i(y)>].

* **Adam** minimises ``P`` over ``w`` with mini-batches of 32 words (``torch_bcfw.nn.structured_hinge`` plus
  ``lam/2 ||w||^2``, float64, a cosine learning-rate schedule over the run), for each learning rate of ``--lrs`` (the grid a user would search; the rate kept is the
  one with the lowest final ``P``, the training objective itself: no held-out or test data is involved).
* **BCFW** (``torch_bcfw.fit``, defaults) runs to ``--bcfw-passes`` with an exact gap check after every pass.

Clocks count the optimiser's work only (Adam's steps; BCFW's ``solver_time``); ``P`` is evaluated outside them.
Reported: Adam's final ``P`` (best rate), the seconds BCFW needs to reach that value and the ratio, BCFW's
certified gap at that point (Adam has no certificate), then the regularization path (eps 0.1) choosing ``lam`` by the
held-out letter error without retraining, with the test letter error of that ``lam`` (chosen on held-out data).
Writes ``benchmarks/results/frozen_probe.json`` and prints the tables.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import DATA, print_table, write_json  # noqa: E402

import torch_bcfw as tb  # noqa: E402
from torch_bcfw.datasets.ocr import load_ocr, ocr_split_with_validation  # noqa: E402
from torch_bcfw.nn import structured_hinge  # noqa: E402
from torch_bcfw.certificate import primal_value  # noqa: E402
from torch_bcfw.solvers.path import regularization_path  # noqa: E402


def adam_run(model, data, lam: float, lr: float, epochs: int, batch: int, seed: int) -> dict:
    """Adam on ``P``: ``{"lr", "curve": [{"epoch", "seconds", "primal"}]}`` (``seconds``: Adam's steps only)."""
    gen = torch.Generator().manual_seed(seed)
    w = torch.zeros(model.n_features, dtype=torch.float64, requires_grad=True)
    opt = torch.optim.Adam([w], lr=lr)
    n = len(data)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=epochs * -(-n // batch))
    curve, clock = [{"epoch": 0, "seconds": 0.0, "primal": primal_value(model, data, w.detach(), lam)[0]}], 0.0
    for epoch in range(1, epochs + 1):
        t0 = time.perf_counter()
        for idx in torch.randperm(n, generator=gen).split(batch):
            sub = data[idx]
            loss = structured_hinge(model, w, sub.x.to(torch.float64), sub.y, sub.offsets) + 0.5 * lam * (w * w).sum()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
        clock += time.perf_counter() - t0
        curve.append({"epoch": epoch, "seconds": clock, "primal": primal_value(model, data, w.detach(), lam)[0]})
    return {"lr": lr, "curve": curve}


def bcfw_run(model, data, lam: float, passes: int) -> list[dict]:
    """BCFW with an exact check every pass: ``[{"passes", "seconds", "primal", "gap"}]`` (``primal``: the returned
    iterate's, ``gap``: its certificate; ``seconds``: solver time only)."""
    res = tb.fit(model, data, lam, max_passes=passes, gap_check=1, gap_tol=0.0)
    return [{"passes": r.passes, "seconds": r.solver_time, "primal": r.model_primal, "gap": r.gap}
            for r in res.history]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lam", type=float, default=0.01)
    ap.add_argument("--epochs", type=int, default=30)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--lrs", default="1e-4,3e-4,1e-3,3e-3,1e-2,3e-2,1e-1")
    ap.add_argument("--bcfw-passes", type=int, default=50)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--quick", action="store_true", help="300 training words, 3 epochs, 2 rates (a smoke run)")
    ap.add_argument("--json", default="frozen_probe.json")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    train, val, test = ocr_split_with_validation(load_ocr(str(DATA / "ocr")), "large", fold=0, val_fold=1)
    lrs = [float(v) for v in args.lrs.split(",")]
    if args.quick:
        train, val, test = train[torch.arange(300)], val[torch.arange(100)], test[torch.arange(100)]
        args.epochs, args.bcfw_passes, lrs = 3, 5, lrs[:2]
    model = tb.Chain(n_features=128, n_labels=26)
    lam = args.lam

    adam = []
    for lr in lrs:
        run = adam_run(model, train, lam, lr, args.epochs, args.batch, args.seed)
        adam.append(run)
        last = run["curve"][-1]
        print(f"adam lr {lr:g}: P {last['primal']:.6f} after {args.epochs} epochs, {last['seconds']:.1f} s", flush=True)
    best = min(adam, key=lambda r: r["curve"][-1]["primal"])
    target, adam_s = best["curve"][-1]["primal"], best["curve"][-1]["seconds"]

    bcfw = bcfw_run(model, train, lam, args.bcfw_passes)
    reach = next((r for r in bcfw if r["primal"] <= target), None)
    table = [{"method": f"Adam (lr {best['lr']:g})", "passes": args.epochs, "seconds": adam_s, "primal": target,
              "certified gap": None},
             {"method": "BCFW to Adam's final P", "passes": None if reach is None else reach["passes"],
              "seconds": None if reach is None else reach["seconds"],
              "primal": None if reach is None else reach["primal"],
              "certified gap": None if reach is None else reach["gap"]},
             {"method": "BCFW", "passes": bcfw[-1]["passes"], "seconds": bcfw[-1]["seconds"],
              "primal": bcfw[-1]["primal"], "certified gap": bcfw[-1]["gap"]}]
    print()
    print_table(table, ["method", "passes", "seconds", "primal", "certified gap"])
    speedup = None if reach is None else adam_s / reach["seconds"]
    print(f"\nBCFW reaches Adam's final primal value {speedup and round(speedup, 1)}x sooner"
          if reach else "\nBCFW did not reach Adam's final primal value")

    t0 = time.perf_counter()
    path = regularization_path(model, train, eps=0.1, lam_min=1e-4, val_data=val, track_train_loss=False)
    path_s = time.perf_counter() - t0
    points = path.points
    chosen = path.best("val_loss")
    test_err = float(model.loss(test, model.decode(chosen.w, test)).mean())
    print(f"\nregularization path: {len(path.points)} breakpoints in {path_s:.0f} s; held-out letter error chooses "
          f"lam {chosen.lam:.4g} (held-out {chosen.val_loss:.4f}, gap <= {chosen.gap:.3g}); test letter error {test_err:.4f}")
    write_json(args.json, {
        "lam": lam, "epochs": args.epochs, "batch": args.batch, "train_words": len(train), "quick": args.quick,
        "adam": adam, "adam_best_lr": best["lr"], "adam_final_primal": target, "adam_seconds": adam_s,
        "bcfw": bcfw, "bcfw_seconds_to_adam_primal": None if reach is None else reach["seconds"],
        "bcfw_gap_at_adam_primal": None if reach is None else reach["gap"], "speedup": speedup,
        "bcfw_passes_to_adam_primal": None if reach is None else reach["passes"],
        "path": {"seconds": path_s, "breakpoints": len(path.points), "chosen_lam": chosen.lam,
                 "chosen_val_error": chosen.val_loss, "chosen_gap": chosen.gap, "test_error_at_chosen": test_err,
                 "points": [{"lam": p.lam, "gap": p.gap, "val_error": p.val_loss} for p in points]},
    })


if __name__ == "__main__":
    main()
