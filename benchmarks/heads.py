"""A BCFW-solved head against the heads a Lightning user would pick instead, on the same backbone.

    python benchmarks/heads.py --task ocr [--seeds 0,1,2] [--epochs 12] [--quick]

OCR-large (train folds 1-9, test fold 0) with the letter CNN of the example (``torch_bcfw.tasks.ocr.LetterCNN``),
the same initialisation (seed), data order, Adam with a cosine schedule and epoch budget under each head:

* ``softmax`` -- a linear classifier per letter, cross-entropy;
* ``crf`` -- a linear-chain CRF (emission layer + transition matrix) trained by its log-likelihood, computed with
  torch-struct's ``LinearChainCRF``, Viterbi decoding;
* ``hinge`` -- the chain head in the optimiser: ``StructuredHead(trainable=True)`` and the library's
  ``StructuredHingeLoss`` with ``lam`` (the SSVM objective on each batch);
* ``bcfw`` -- the example's ``OCRChainCNN`` with ``BCFWCallback(lam=0.01, passes_per_call=10)``: two epochs of
  cross-entropy warm-up, then the structured hinge reaches the backbone while BCFW solves the head after every epoch
  (``--bcfw-passes`` / ``--bcfw-every`` change the schedule).

Each run is a process of its own (its peak memory is its own). After every epoch the test letter error (the task
loss: mean over words of the fraction of wrong letters) is measured, outside the clock; the clock counts training and,
for the BCFW head, the callback's solves. The learning rate of each head is chosen from ``--lrs`` on held-out training
data (fold 1 held out of the training folds, never the test fold) unless ``--lr`` fixes it.  ``--quick``: the first
300 training and 300 test words, 3 epochs, one seed, no tuning (under 3 minutes; ``tests/test_heads_script.py``).

Writes ``benchmarks/results/heads_<task>.json`` and ``heads_<task>.png`` (test metric against wall-clock seconds, one
curve per head) and prints the table.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import DATA, RESULTS, print_table, write_json  # noqa: E402

HEADS = ("softmax", "crf", "hinge", "bcfw")
#: the head's SSVM regularisation (the example's) and the BCFW passes per epoch
LAM, PASSES = 0.01, 10


# ---------------------------------------------------------------------------------------------------- one run
def _crf_logits(emission, transitions, offsets):
    """``(log_potentials [B, T-1, K, K], lengths [B], first [B, K])`` of torch-struct's ``LinearChainCRF`` for packed
    words: ``log_potentials[b, n, z', z] = emission[b, n + 1, z'] + transitions[z, z']``, the first letter's emission
    added at ``n = 0``; words of one letter have no edge (``first`` holds their scores)."""
    import torch

    lengths = offsets[1:] - offsets[:-1]
    B, T, K = len(lengths), int(lengths.max()), emission.shape[1]
    padded = emission.new_zeros(B, T, K)
    pos = torch.arange(emission.shape[0], device=emission.device) - torch.repeat_interleave(offsets[:-1], lengths)
    padded[torch.repeat_interleave(torch.arange(B, device=emission.device), lengths), pos] = emission
    lp = padded[:, 1:, :, None] + transitions.T[None, None]  # [B, T-1, z', z]
    if T > 1:
        lp[:, 0] = lp[:, 0] + padded[:, 0, None, :]
    return lp, lengths, padded[:, 0]


def crf_nll_and_decode(emission, transitions, offsets, labels=None):
    """Mean negative log-likelihood of ``labels`` (``None``: not computed) and the Viterbi labels, packed."""
    import torch
    import torch_struct

    lp, lengths, first = _crf_logits(emission, transitions, offsets)
    multi = lengths > 1
    nll = None
    pred = torch.empty(emission.shape[0], dtype=torch.long, device=emission.device)
    starts = offsets[:-1]
    single = ~multi
    if bool(single.any()):  # one-letter words: a softmax over the letter
        idx = starts[single]
        pred[idx] = first[single].argmax(1)
        if labels is not None:
            nll = torch.nn.functional.cross_entropy(first[single], labels[idx], reduction="sum")
    if bool(multi.any()):
        dist = torch_struct.LinearChainCRF(lp[multi].contiguous(), lengths=lengths[multi])
        seq, _ = torch_struct.LinearChainCRF.struct.from_parts(dist.argmax.detach())
        for row, (b, L) in enumerate(zip(torch.nonzero(multi)[:, 0].tolist(), lengths[multi].tolist())):
            pred[starts[b]:starts[b] + L] = seq[row, :L]
        if labels is not None:
            T = int(lengths.max())
            padded = torch.zeros(len(lengths), T, dtype=torch.long, device=labels.device)
            pos = torch.arange(len(labels), device=labels.device) - torch.repeat_interleave(starts, lengths)
            padded[torch.repeat_interleave(torch.arange(len(lengths), device=labels.device), lengths), pos] = labels
            parts = torch_struct.LinearChainCRF.struct.to_parts(padded[multi], emission.shape[1],
                                                                 lengths=lengths[multi]).type_as(lp)
            part_nll = -dist.log_prob(parts).sum()
            nll = part_nll if nll is None else nll + part_nll
    return (None if nll is None else nll / len(lengths)), pred


def _module(head: str, lr: float):
    """The LightningModule of ``head`` (the BCFW head: the example's ``OCRChainCNN``)."""
    import lightning.pytorch as pl
    import torch
    import torch.nn.functional as F

    from torch_bcfw.models import Chain
    from torch_bcfw.nn import StructuredHead, StructuredHingeLoss
    from torch_bcfw.tasks.ocr import N_LETTERS, LetterCNN, OCRChainCNN

    if head == "bcfw":
        return OCRChainCNN(feature_dim=64, channels=(32, 64), dropout=0.1, lr=lr, ce_epochs=2, ce_weight=0.0,
                           hinge_weight=1.0)

    class Peer(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.backbone = LetterCNN(64, (32, 64), 0.1)
            if head in ("softmax", "crf"):
                self.emission = torch.nn.Linear(64, N_LETTERS)
                self.transitions = torch.nn.Parameter(torch.zeros(N_LETTERS, N_LETTERS))
            else:
                self.head = StructuredHead(Chain(64, N_LETTERS), trainable=True)
                self.hinge = StructuredHingeLoss(self.head, lam=LAM)

        def training_step(self, batch, _):
            images, labels, offsets = batch
            feats = self.backbone(images)
            if head == "softmax":
                return F.cross_entropy(self.emission(feats), labels)
            if head == "crf":
                return crf_nll_and_decode(self.emission(feats), self.transitions, offsets, labels)[0]
            return self.hinge(feats, labels, offsets)

        def predict_letters(self, images, offsets):
            feats = self.backbone(images)
            if head == "softmax":
                return self.emission(feats).argmax(1)
            if head == "crf":
                return crf_nll_and_decode(self.emission(feats), self.transitions, offsets)[1]
            return self.head(feats, offsets)

        def configure_optimizers(self):
            opt = torch.optim.Adam(self.parameters(), lr=lr)
            sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=max(1, self.trainer.max_epochs))
            return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "epoch"}}

    return Peer()


def _letter_error(module, loader) -> float:
    """Mean over words of the fraction of wrong letters (the SSVM's task loss)."""
    import torch

    module.eval()
    errs = []
    with torch.no_grad():
        for images, labels, offsets in loader:
            if hasattr(module, "predict_letters"):
                pred = module.predict_letters(images, offsets)
            else:
                pred = module.head(module.backbone(images), offsets)
            wrong = (pred != labels).double()
            lengths = offsets[1:] - offsets[:-1]
            seq = torch.repeat_interleave(torch.arange(len(lengths)), lengths)
            errs.append(torch.zeros(len(lengths), dtype=torch.float64).index_add(0, seq, wrong) / lengths)
    module.train()
    return float(torch.cat(errs).mean())


def _first(mask: np.ndarray, limit: int | None) -> np.ndarray:
    """``mask`` keeping only its first ``limit`` selected entries (all of them for ``None``)."""
    if limit is None:
        return mask
    out = np.zeros_like(mask)
    out[np.nonzero(mask)[0][:limit]] = True
    return out


def worker(args) -> None:
    """One run (``--worker``): ``args.head`` with ``args.lr`` and ``args.seed``; writes its JSON to ``args.out``."""
    import lightning.pytorch as pl
    import torch

    from torch_bcfw.datasets.ocr import load_ocr
    from torch_bcfw.lightning import BCFWCallback
    from torch_bcfw.tasks.ocr import OCRWordsDataModule, _Words

    torch.set_num_threads(max(1, os.cpu_count() or 1))
    pl.seed_everything(args.seed, verbose=False)
    data = OCRWordsDataModule(path=str(DATA / "ocr"), split="large", fold=0, batch_size=32, eval_batch_size=512,
                              limit=args.limit, test_limit=args.limit, seed=args.seed)
    data.setup()
    if args.tune:  # held-out training data: train on folds 2-9, evaluate on fold 1 (the test fold 0 never seen)
        words = load_ocr(str(DATA / "ocr"))
        data.train_data, data.test_data = (words.subset(_first(mask, args.limit))
                                           for mask in ((words.folds != 0) & (words.folds != 1), words.folds == 1))
        data.train, data.test = _Words(data.train_data), _Words(data.test_data)
    module = _module(args.head, args.lr)
    test_loader = data.test_dataloader()
    curve = []
    clock = {"spent": 0.0, "t0": None}

    class Curve(pl.Callback):  # after BCFWCallback (registered later): the head is solved when this runs
        def on_train_epoch_start(self, trainer, pl_module):
            clock["t0"] = time.perf_counter()

        def on_train_epoch_end(self, trainer, pl_module):
            clock["spent"] += time.perf_counter() - clock["t0"]
            curve.append({"epoch": trainer.current_epoch + 1, "seconds": clock["spent"],
                          "test_error": _letter_error(pl_module, test_loader)})

    callbacks = []
    solve = None
    if args.head == "bcfw":
        solve = BCFWCallback(lam=LAM, passes_per_call=args.bcfw_passes, initial_passes=args.bcfw_passes,
                             every_n_epochs=args.bcfw_every,
                             solver_options={"step": "line_search", "sampling": "uniform", "averaging": True,
                                             "seed": 1})
        callbacks.append(solve)
    callbacks.append(Curve())
    trainer = pl.Trainer(accelerator="cpu", devices=1, max_epochs=args.epochs, callbacks=callbacks, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                         num_sanity_val_steps=0, limit_val_batches=0, default_root_dir=args.tmp)
    t0 = time.perf_counter()
    trainer.fit(module, datamodule=data)
    wall = time.perf_counter() - t0
    out = {"head": args.head, "lr": args.lr, "seed": args.seed, "tune": args.tune, "curve": curve, "fit_s": wall,
           "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}
    if solve is not None:
        solve_s = sum(r.wall for r in solve.history)
        out.update(callback_s=solve_s, callback_share=solve_s / max(wall, 1e-9), final_gap=solve.last_record.gap)
    Path(args.out).write_text(json.dumps(out))


# ---------------------------------------------------------------------------------------------------- driver
def _launch(head: str, lr: float, seed: int, args, tmp: Path, tune: bool = False) -> dict:
    out = tmp / f"{head}-{lr:g}-{seed}-{int(tune)}.json"
    cmd = [sys.executable, __file__, "--worker", "--head", head, "--lr", str(lr), "--seed", str(seed), "--out",
           str(out), "--tmp", str(tmp / "runs"), "--epochs", str(args.epochs),
           "--bcfw-passes", str(args.bcfw_passes), "--bcfw-every", str(args.bcfw_every)]
    if args.limit:
        cmd += ["--limit", str(args.limit)]
    if tune:
        cmd.append("--tune")
    done = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "PYTHONWARNINGS": "ignore"})
    if done.returncode != 0:
        raise SystemExit(f"{head} (lr {lr}, seed {seed}) failed:\n{done.stderr[-3000:]}")
    return json.loads(out.read_text())


def _summary(runs: list[dict]) -> dict:
    """Per head: the best test error (mean over seeds, with the min-max), the seconds and epoch it was reached."""
    best = [min(r["curve"], key=lambda c: c["test_error"]) for r in runs]
    errs = [b["test_error"] for b in best]
    out = {"head": runs[0]["head"], "lr": runs[0]["lr"], "test_error": float(np.mean(errs)),
           "error_min": min(errs), "error_max": max(errs), "seconds_to_best": float(np.mean([b["seconds"] for b in best])),
           "epoch_of_best": float(np.mean([b["epoch"] for b in best])),
           "peak_rss_mb": float(np.mean([r["peak_rss_mb"] for r in runs]))}
    if "callback_share" in runs[0]:
        out.update(callback_share=float(np.mean([r["callback_share"] for r in runs])),
                   final_gap=float(np.mean([r["final_gap"] for r in runs])))
    return out


def _plot(runs: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    for j, head in enumerate(HEADS):
        mine = [r for r in runs if r["head"] == head]
        for k, r in enumerate(mine):
            ax.plot([c["seconds"] for c in r["curve"]], [c["test_error"] for c in r["curve"]], "-o", ms=3,
                    color=f"C{j}", alpha=0.8, label=head if k == 0 else None)
    ax.set_xlabel("wall-clock seconds (training, and the head's solves)")
    ax.set_ylabel("test letter error")
    ax.set_yscale("log")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    print(f"wrote {path}")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--task", choices=("ocr",), default="ocr")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--epochs", type=int, default=12)
    ap.add_argument("--lrs", default="1e-3,2e-3,4e-3", help="learning rates tried on held-out training data")
    ap.add_argument("--lr", type=float, default=None, help="use this learning rate for every head (no tuning)")
    ap.add_argument("--limit", type=int, default=None, help="only the first N training and test words")
    ap.add_argument("--heads", default=",".join(HEADS))
    ap.add_argument("--quick", action="store_true", help="300 words, 3 epochs, one seed, lr 2e-3: under 3 minutes")
    ap.add_argument("--results", default=None, help="folder for the JSON and PNG (default benchmarks/results)")
    ap.add_argument("--bcfw-passes", type=float, default=PASSES, help="BCFW head: passes per call (the example's 10)")
    ap.add_argument("--bcfw-every", type=int, default=1, help="BCFW head: solve every N epochs (the example's 1)")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--head", help=argparse.SUPPRESS)
    ap.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--tune", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    ap.add_argument("--tmp", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        return worker(args)
    if args.quick:
        args.limit, args.epochs, args.seeds, args.lr = args.limit or 300, 3, "0", args.lr or 2e-3
    heads = args.heads.split(",")
    seeds = [int(s) for s in args.seeds.split(",")]
    grid = [float(v) for v in args.lrs.split(",")]
    tuning, runs = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for head in heads:
            lr = args.lr
            if lr is None:  # the grid on held-out training data, seed 0; the lowest best error wins
                tried = [_launch(head, v, 0, args, Path(tmp), tune=True) for v in grid]
                tuning += [{"head": head, "lr": t["lr"], "held_out_error": min(c["test_error"] for c in t["curve"])}
                           for t in tried]
                lr = min(tried, key=lambda t: min(c["test_error"] for c in t["curve"]))["lr"]
            for seed in seeds:
                runs.append(_launch(head, lr, seed, args, Path(tmp)))
                print(f"{head:8s} lr {lr:g} seed {seed}: best test error "
                      f"{min(c['test_error'] for c in runs[-1]['curve']):.4f} ({runs[-1]['fit_s']:.0f} s)", flush=True)
    table = [_summary([r for r in runs if r["head"] == h]) for h in heads]
    print_table(table, ["head", "lr", "test_error", "error_min", "error_max", "seconds_to_best", "epoch_of_best",
                        "peak_rss_mb", "callback_share", "final_gap"])
    if tuning:
        print_table(tuning, ["head", "lr", "held_out_error"])
    name = f"heads_{args.task}{'_quick' if args.quick else ''}"
    payload = {"command": "python benchmarks/heads.py " + " ".join(argv if argv is not None else sys.argv[1:]),
               "date": time.strftime("%Y-%m-%d"), "epochs": args.epochs, "limit": args.limit, "seeds": seeds,
               "bcfw_passes": args.bcfw_passes, "bcfw_every": args.bcfw_every,
               "lr_grid": grid if args.lr is None else [args.lr], "tuning": tuning, "table": table, "runs": runs}
    if args.results is None:
        write_json(f"{name}.json", payload)
    else:
        Path(args.results).mkdir(parents=True, exist_ok=True)
        (Path(args.results) / f"{name}.json").write_text(json.dumps(payload, indent=1))
    _plot(runs, Path(args.results or RESULTS) / f"{name}.png")


if __name__ == "__main__":
    main()
