"""A BCFW-solved head against the heads a Lightning user would pick instead, on the same backbone.

    python benchmarks/heads.py --task ocr|conll [--seeds 0,1,2] [--epochs N] [--quick]
    python benchmarks/heads.py --task ocr --head-lrs softmax=4e-3,crf=4e-3,hinge=2e-3,bcfw=1e-3,bcfw-lam=1e-3 \
        --hinge-lams 0.001,0.01,0.1 --runs-dir benchmarks/results/heads_runs --threads 1

Two tasks, each with the backbone of its example and the same initialisation (seed), data order, optimiser with a
cosine schedule and epoch budget under each head:

* ``ocr`` -- OCR-large (train folds 2-9, fold 1 held out, test fold 0), the letter CNN
  (``torch_bcfw.tasks.ocr.LetterCNN``), Adam, 12 epochs; the metric is the letter error (the task loss: mean over
  words of the fraction of wrong letters).
* ``conll`` -- CoNLL-2000 chunking (8936 training, 2012 test sentences), the BiLSTM token encoder of
  ``examples/conll_embeddings_lightning.py`` (``torch_bcfw.tasks.conll.TokenEncoder``: word, POS and character
  embeddings), AdamW, 10 epochs; the metric is the conlleval chunk F1 (%).  The last 1000 training sentences are held
  out.

The heads:

* ``softmax`` -- a linear classifier per position, cross-entropy;
* ``crf`` -- a linear-chain CRF (emission layer + transition matrix) trained by its log-likelihood, computed with
  torch-struct's ``LinearChainCRF``, Viterbi decoding;
* ``hinge`` -- the chain head in the optimiser: ``StructuredHead(trainable=True)`` and the library's
  ``StructuredHingeLoss`` with ``lam`` (the SSVM objective on each batch);
* ``bcfw`` -- the example's module (``OCRChainCNN`` / ``ConllChainTagger``) with ``BCFWCallback(lam,
  passes_per_call=10)`` (``lam`` 0.01 on OCR, 0.1 on CoNLL, the examples'): two epochs of cross-entropy warm-up,
  then the structured hinge reaches the backbone while BCFW solves the head after every epoch (``--bcfw-passes`` /
  ``--bcfw-every`` change the schedule);
* ``bcfw-lam`` -- the same with ``lam`` chosen on the held-out data at every solve
  (``BCFWCallback(lam_choice=LamChoice(--lam-grid, passes=--lam-passes, window=--lam-window))``);
* ``bcfw-step`` -- BCFW as the head's optimizer (``BCFWCallback(mode="step")``, OCR only): after every training
  step the batch's words take one BCFW block step each with the hinge's own loss-augmented decodings, so the head
  moves at every step with no learning rate; the head is still solved (``--bcfw-passes``) and certified at epoch ends.

``--bcfw-warmup`` sets the BCFW heads' epochs of cross-entropy warm-up (default 2, the examples'; 0: the structured
hinge from the first step, after an initial solve on the untrained backbone's features, as hinge + Adam);
``--bcfw-margin-scale s`` has the backbone's hinge score at ``s * w`` while the solved head predicts with ``w``
(``StructuredHingeLoss(scale=s)``: the margin decoupled from the predicting head).

Each run is a process of its own (its peak memory is its own). After every epoch the held-out and the test metric
are measured, outside the clock; the clock counts training and, for the BCFW heads, the callback's solves.  **Nothing
is chosen on the test split**: each run reports the test metric at the epoch its held-out metric chose and at the
last epoch; each head's learning rate is chosen from ``--lrs`` by the held-out metric (seed 0) unless ``--lr`` or
``--head-lrs`` fixes it, and hinge + Adam's ``lam`` from ``--hinge-lams`` likewise.  ``--runs-dir`` keeps every
run's JSON and reuses it (a benchmark cut short continues; ``--combine`` tabulates run files).
``--quick``: the first 300 training and 300 test words or sentences, 3 epochs, one seed, no tuning (under 3 minutes
per task; ``tests/test_heads_script.py``).

Writes ``benchmarks/results/heads_<task>.json`` and ``heads_<task>.png`` (test metric against wall-clock seconds, one
curve per head, the held-out-chosen epoch starred) and prints the table.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import DATA, RESULTS, print_table, write_json  # noqa: E402

HEADS = ("softmax", "crf", "hinge", "bcfw", "bcfw-lam", "bcfw-step")
#: per task: the head's SSVM regularisation (the example's), the epoch budget, the metric's name and direction
TASKS = {"ocr": {"lam": 0.01, "lam_grid": "0.08,0.04,0.02,0.01,0.005", "epochs": 12, "metric": "test letter error",
                 "higher_is_better": False},
         "conll": {"lam": 0.1, "lam_grid": "0.8,0.4,0.2,0.1,0.05", "epochs": 10, "metric": "test chunk F1 (%)",
                   "higher_is_better": True}}
#: BCFW passes per call of the callback (the examples')
PASSES = 10


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


def _module(task: str, head: str, lr: float, hinge_lam: float | None = None, warmup: int = 2):
    """The LightningModule of ``head`` on ``task`` (``hinge_lam``: the hinge head's ``lam``, default the task's;
    ``warmup``: the BCFW heads' epochs of cross-entropy warm-up)."""
    hinge_lam = TASKS[task]["lam"] if hinge_lam is None else hinge_lam
    return _ocr_module(head, lr, hinge_lam, warmup) if task == "ocr" else _conll_module(head, lr, hinge_lam, warmup)


def _ocr_module(head: str, lr: float, hinge_lam: float, warmup: int):
    """The LightningModule of ``head`` on OCR (the BCFW head: the example's ``OCRChainCNN``)."""
    import lightning.pytorch as pl
    import torch
    import torch.nn.functional as F

    from torch_bcfw.models import Chain
    from torch_bcfw.nn import StructuredHead, StructuredHingeLoss
    from torch_bcfw.tasks.ocr import N_LETTERS, LetterCNN, OCRChainCNN

    if head.startswith("bcfw"):
        return OCRChainCNN(feature_dim=64, channels=(32, 64), dropout=0.1, lr=lr, ce_epochs=warmup, ce_weight=0.0,
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
                self.hinge = StructuredHingeLoss(self.head, lam=hinge_lam)

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


def _conll_module(head: str, lr: float, hinge_lam: float, warmup: int):
    """The LightningModule of ``head`` on CoNLL: the example's ``ConllChainTagger`` (its encoder built from the
    datamodule's vocabulary in ``configure_model``), whose heads the peers replace."""
    import torch
    import torch.nn.functional as F

    from torch_bcfw.models import Chain
    from torch_bcfw.nn import StructuredHead, StructuredHingeLoss
    from torch_bcfw.tasks.conll import ConllChainTagger

    if head.startswith("bcfw"):
        return ConllChainTagger(encoder="bilstm", lr=lr, ce_epochs=warmup, ce_weight=0.0, hinge_weight=1.0)

    class Peer(ConllChainTagger):
        def __init__(self):
            super().__init__(encoder="bilstm", lr=lr)
            K, dim = self.n_labels, self.hparams.feature_dim
            if head == "crf":
                self.transitions = torch.nn.Parameter(torch.zeros(K, K))
            if head == "hinge":
                self.head = StructuredHead(Chain(dim, K), trainable=True)
                self.hinge = StructuredHingeLoss(self.head, lam=hinge_lam)

        def training_step(self, batch, _):
            feats = self.features(batch)
            if head == "softmax":
                return F.cross_entropy(self.classifier(feats), batch.labels)
            if head == "crf":
                return crf_nll_and_decode(self.classifier(feats), self.transitions, batch.offsets, batch.labels)[0]
            return self.hinge(feats, batch.labels, batch.offsets)

        def predict_tags(self, batch):
            feats = self.features(batch)
            if head == "softmax":
                return self.classifier(feats).argmax(1)
            if head == "crf":
                return crf_nll_and_decode(self.classifier(feats), self.transitions, batch.offsets)[1]
            return self.head(feats, batch.offsets)

        def configure_optimizers(self):  # the example's AdamW and schedule, over every trained parameter
            opt = torch.optim.AdamW(self.parameters(), lr=lr, weight_decay=self.hparams.weight_decay)
            sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=max(1, self.trainer.max_epochs))
            return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "epoch"}}

    return Peer()


def _chunk_f1(module, loader) -> float:
    """The conlleval chunk F1 (%) of ``module.predict_tags`` on ``loader``'s sentences."""
    import torch

    from torch_bcfw.datasets.conll_chain import chunk_f1_from_ids

    module.eval()
    preds, offsets, tags = [], [0], []
    with torch.no_grad():
        for batch in loader:
            preds.append(module.predict_tags(batch))
            offsets.extend((batch.offsets[1:] + offsets[-1]).tolist())
            tags.extend(batch.tags)
    module.train()
    return 100.0 * float(chunk_f1_from_ids(torch.cat(preds), torch.tensor(offsets), tags)["f1"])


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
    from torch_bcfw.lightning import BCFWCallback, LamChoice
    from torch_bcfw.tasks.ocr import OCRWordsDataModule, _words

    from torch_bcfw.tasks.conll import ConllChunkingDataModule

    torch.set_num_threads(args.threads)
    pl.seed_everything(args.seed, verbose=False)
    if args.task == "ocr":  # train on folds 2-9, hold fold 1 out, test on fold 0
        data = OCRWordsDataModule(path=str(DATA / "ocr"), split="large", fold=0, batch_size=32, eval_batch_size=512,
                                  limit=args.limit, test_limit=args.limit, seed=args.seed)
        data.setup()
        words = load_ocr(str(DATA / "ocr"))
        data.train_data, val_data = (words.subset(_first(mask, args.limit))
                                     for mask in ((words.folds != 0) & (words.folds != 1), words.folds == 1))
        data.train, data.val = _words(data.train_data), _words(val_data)
        if args.head == "bcfw-step":  # the words' positions ride with the batches (BCFWCallback(mode="step"))
            data.train, data.example_ids = [(x, y, i) for i, (x, y) in enumerate(data.train)], True
        metric = _letter_error
    else:  # the last 1000 training sentences (a tenth of them with --limit) held out
        if args.head == "bcfw-step":
            raise SystemExit("bcfw-step: the CoNLL datamodule's batches carry no example ids")
        holdout = max(1, args.limit // 10) if args.limit else 1000
        data = ConllChunkingDataModule(path=str(DATA / "conll2000"), batch_size=32, eval_batch_size=256,
                                       limit=args.limit, test_limit=args.limit, holdout=holdout, seed=args.seed)
        data.setup()
        metric = _chunk_f1
    module = _module(args.task, args.head, args.lr, args.hinge_lam, args.bcfw_warmup)
    if args.head.startswith("bcfw") and args.bcfw_margin_scale != 1.0:
        from torch_bcfw.nn import StructuredHingeLoss

        module.hinge = StructuredHingeLoss(module.head, scale=args.bcfw_margin_scale)
    test_loader, val_loader = data.test_dataloader(), data.val_dataloader()
    curve = []
    clock = {"spent": 0.0, "t0": None}

    class Curve(pl.Callback):  # after BCFWCallback (registered later): the head is solved when this runs
        def on_train_epoch_start(self, trainer, pl_module):
            clock["t0"] = time.perf_counter()

        def on_train_epoch_end(self, trainer, pl_module):
            clock["spent"] += time.perf_counter() - clock["t0"]
            point = {"epoch": trainer.current_epoch + 1, "seconds": clock["spent"],
                     "val_metric": metric(pl_module, val_loader), "test_metric": metric(pl_module, test_loader)}
            if solve is not None:
                point.update(lam=solve.lam, gap=solve.last_record.gap)
            curve.append(point)

    callbacks = []
    solve = None
    if args.head.startswith("bcfw"):
        lam = {"lam": args.bcfw_lam or TASKS[args.task]["lam"]} if args.head != "bcfw-lam" else {
            "lam_choice": LamChoice([float(v) for v in args.lam_grid.split(",")], passes=args.lam_passes,
                                    window=args.lam_window)}
        solve = BCFWCallback(**lam, passes_per_call=args.bcfw_passes, initial_passes=args.bcfw_passes,
                             every_n_epochs=args.bcfw_every, mode="step" if args.head == "bcfw-step" else "epoch",
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
    out = {"task": args.task, "head": args.head, "lr": args.lr, "seed": args.seed, "threads": args.threads,
           "load": os.getloadavg(), "curve": curve, "fit_s": wall,
           "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}
    if solve is not None:
        solve_s = sum(r.wall for r in solve.history)
        out.update(callback_s=solve_s, callback_share=solve_s / max(wall, 1e-9), final_gap=solve.last_record.gap)
        if solve.lam_choice is not None:
            out.update(lam_grid=solve.lam_choice.lams, lam_choices=solve.lam_choice.history)
    if args.head == "hinge":
        out["hinge_lam"] = module.hinge.lam
    if args.head.startswith("bcfw"):
        out.update(bcfw_warmup=args.bcfw_warmup, margin_scale=args.bcfw_margin_scale)
    Path(args.out).write_text(json.dumps(out))


# ---------------------------------------------------------------------------------------------------- driver
def _run_name(task: str, head: str, lr: float, seed: int, args, hinge_lam: float | None) -> str:
    """The file name of one run: every setting that changes it."""
    name = f"{task}-{head}-lr{lr:g}-s{seed}-e{args.epochs}-t{args.threads}" + (f"-n{args.limit}" if args.limit else "")
    if head == "hinge":
        name += f"-lam{hinge_lam if hinge_lam is not None else TASKS[task]['lam']:g}"
    if head.startswith("bcfw"):
        name += f"-p{args.bcfw_passes:g}-every{args.bcfw_every}" + (f"-warm{args.bcfw_warmup}" if args.bcfw_warmup != 2
                                                                    else "")
        name += f"-ms{args.bcfw_margin_scale:g}" if args.bcfw_margin_scale != 1.0 else ""
    if head in ("bcfw", "bcfw-step") and args.bcfw_lam:
        name += f"-lam{args.bcfw_lam:g}"
    if head == "bcfw-lam":
        name += f"-grid{args.lam_grid}-lp{'head' if args.lam_passes is None else format(args.lam_passes, 'g')}"
        name += f"-w{args.lam_window}" if args.lam_window is not None else ""
    return name + ".json"


def _launch(head: str, lr: float, seed: int, args, runs_dir: Path, hinge_lam: float | None = None) -> dict:
    """One run in a process of its own; its JSON is kept in ``runs_dir`` and reused when already there (a benchmark
    cut short continues where it stopped)."""
    out = runs_dir / _run_name(args.task, head, lr, seed, args, hinge_lam)
    if out.exists():
        return json.loads(out.read_text())
    runs_dir.mkdir(parents=True, exist_ok=True)
    part = out.with_suffix(".part")
    cmd = [sys.executable, __file__, "--worker", "--task", args.task, "--head", head, "--lr", str(lr), "--seed",
           str(seed), "--out", str(part), "--tmp", tempfile.gettempdir(), "--epochs", str(args.epochs),
           "--bcfw-passes", str(args.bcfw_passes), "--bcfw-every", str(args.bcfw_every),
           "--lam-grid", args.lam_grid, "--threads", str(args.threads), "--bcfw-warmup", str(args.bcfw_warmup),
           "--bcfw-margin-scale", str(args.bcfw_margin_scale)]
    if args.bcfw_lam:
        cmd += ["--bcfw-lam", str(args.bcfw_lam)]
    if args.lam_passes is not None:
        cmd += ["--lam-passes", str(args.lam_passes)]
    if args.lam_window is not None:
        cmd += ["--lam-window", str(args.lam_window)]
    if hinge_lam is not None:
        cmd += ["--hinge-lam", str(hinge_lam)]
    if args.limit:
        cmd += ["--limit", str(args.limit)]
    done = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "PYTHONWARNINGS": "ignore"})
    if done.returncode != 0:
        raise SystemExit(f"{head} (lr {lr}, seed {seed}) failed:\n{done.stderr[-3000:]}")
    part.replace(out)
    return json.loads(out.read_text())


def held_out_epoch(curve: list[dict], task: str) -> dict:
    """The epoch of ``curve`` with the best held-out metric (the first of equals); never the test metric."""
    sign = -1.0 if TASKS[task]["higher_is_better"] else 1.0
    return min(curve, key=lambda c: sign * c["val_metric"])


def _held_out_score(run: dict, task: str) -> float:
    """The held-out metric at the held-out-chosen epoch, lower is better (tuning)."""
    sign = -1.0 if TASKS[task]["higher_is_better"] else 1.0
    return sign * held_out_epoch(run["curve"], task)["val_metric"]


def _stats(vals: list[float]) -> dict:
    return {"mean": float(np.mean(vals)), "min": float(min(vals)), "max": float(max(vals))}


def _summary(runs: list[dict], task: str) -> dict:
    """Per head (mean over seeds, with min-max): the test metric at the epoch the held-out metric chose and at the
    last epoch, the seconds to them, the epoch chosen."""
    chosen = [held_out_epoch(r["curve"], task) for r in runs]
    last = [r["curve"][-1] for r in runs]
    held, fin = _stats([c["test_metric"] for c in chosen]), _stats([c["test_metric"] for c in last])
    out = {"head": runs[0]["head"], "lr": runs[0]["lr"], "seeds": [r["seed"] for r in runs],
           "test_at_held_out_epoch": held["mean"], "held_out_min": held["min"], "held_out_max": held["max"],
           "held_out_epoch": float(np.mean([c["epoch"] for c in chosen])),
           "seconds_to_held_out_epoch": float(np.mean([c["seconds"] for c in chosen])),
           "test_at_last_epoch": fin["mean"], "last_min": fin["min"], "last_max": fin["max"],
           "seconds": float(np.mean([c["seconds"] for c in last])),
           "val_at_held_out_epoch": float(np.mean([c["val_metric"] for c in chosen])),
           "peak_rss_mb": float(np.mean([r["peak_rss_mb"] for r in runs]))}
    if "hinge_lam" in runs[0]:
        out["lam"] = runs[0]["hinge_lam"]
    if "callback_share" in runs[0]:
        out.update(callback_share=float(np.mean([r["callback_share"] for r in runs])),
                   final_gap=float(np.mean([r["final_gap"] for r in runs])))
    if "lam" in runs[0]["curve"][-1]:
        out["lam"] = sorted({c["lam"] for r in runs for c in r["curve"]})
    return out


def _plot(runs: list[dict], task: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    heads = [h for h in HEADS if any(r["head"] == h for r in runs)]
    for j, head in enumerate(heads):
        mine = [r for r in runs if r["head"] == head]
        for k, r in enumerate(mine):
            ax.plot([c["seconds"] for c in r["curve"]], [c["test_metric"] for c in r["curve"]], "-o", ms=3,
                    color=f"C{j}", alpha=0.8, label=head if k == 0 else None)
            c = held_out_epoch(r["curve"], task)
            ax.plot([c["seconds"]], [c["test_metric"]], "*", ms=10, color=f"C{j}")
    ax.set_xlabel("wall-clock seconds (training, and the head's solves); *: the epoch held-out data chose")
    ax.set_ylabel(TASKS[task]["metric"])
    if not TASKS[task]["higher_is_better"]:
        ax.set_yscale("log")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    print(f"wrote {path}")


def per_seed(runs: list[dict], task: str, mine: str = "bcfw-lam") -> list[dict]:
    """Seed by seed, ``mine`` against every other head: the test metric of both at the held-out-chosen epoch and at
    the last epoch, and the seconds of both fits."""
    ref = {r["seed"]: r for r in runs if r["head"] == mine}
    rows = []
    for r in runs:
        if r["head"] == mine or r["seed"] not in ref:
            continue
        m = ref[r["seed"]]
        rows.append({"peer": r["head"], "seed": r["seed"],
                     "peer_held_out": held_out_epoch(r["curve"], task)["test_metric"],
                     "mine_held_out": held_out_epoch(m["curve"], task)["test_metric"],
                     "peer_last": r["curve"][-1]["test_metric"], "mine_last": m["curve"][-1]["test_metric"],
                     "peer_seconds": r["curve"][-1]["seconds"], "mine_seconds": m["curve"][-1]["seconds"]})
    return rows


COLUMNS = ["head", "lr", "lam", "test_at_held_out_epoch", "held_out_min", "held_out_max", "held_out_epoch",
           "test_at_last_epoch", "last_min", "last_max", "seconds", "callback_share", "final_gap"]


def _label(run: dict) -> str:
    """The head of a run, with hinge + Adam's ``lam`` (runs at several values are different heads); a run read from
    its own run file (``--combine``) is labelled by the file's name, which names every setting, less the seed (the
    seeds of one setting are one row)."""
    if "source" in run:
        return re.sub(r"-s\d+-", "-", run["source"])
    return f"hinge lam {run['hinge_lam']:g}" if run["head"] == "hinge" and "hinge_lam" in run else run["head"]


def _report(task: str, runs: list[dict]) -> tuple[list[dict], list[dict]]:
    order = {_label(r): (HEADS.index(r["head"]), _label(r)) for r in runs}
    labels = sorted(order, key=order.get)
    table = [{**_summary([r for r in runs if _label(r) == lb], task), "head": lb} for lb in labels]
    print(f"metric: {TASKS[task]['metric']}; epochs chosen on held-out data, never on the test split")
    print_table(table, COLUMNS)
    seeds = per_seed(runs, task)
    if seeds:
        print_table(seeds, ["peer", "seed", "peer_held_out", "mine_held_out", "peer_last", "mine_last",
                            "peer_seconds", "mine_seconds"])
    return table, seeds


def _write(name: str, payload: dict, runs: list[dict], task: str, results: str | None) -> None:
    if results is None:
        write_json(f"{name}.json", payload)
    else:
        Path(results).mkdir(parents=True, exist_ok=True)
        (Path(results) / f"{name}.json").write_text(json.dumps(payload, indent=1))
    if runs:
        _plot(runs, task, Path(results or RESULTS) / f"{name}.png")


def _load_runs(files: list[Path], task: str) -> list[dict]:
    """The runs in ``files``: run files (one ``curve`` each) or result files (``runs``); only runs with a held-out
    curve (``val_metric``)."""
    runs = []
    for f in files:
        rep = json.loads(Path(f).read_text())
        for r in (rep["runs"] if "runs" in rep else [{**rep, "source": Path(f).stem}]):
            if r.get("task", "ocr") != task:
                raise SystemExit(f"{f} holds runs of task {r.get('task', 'ocr')!r}, not {task!r}")
            if "val_metric" not in r["curve"][0]:
                raise SystemExit(f"{f}: a run without a held-out curve (val_metric): its epochs cannot be chosen")
            runs.append(r)
    return runs


def combine(files: list[Path], task: str, name: str, results: str | None, argv) -> None:
    """The table and plot of the runs stored in ``files`` (run files in a runs folder, or result files of this
    script for ``task``)."""
    runs = _load_runs(files, task)
    table, seeds = _report(task, runs)
    payload = {"command": "python benchmarks/heads.py " + " ".join(argv if argv is not None else sys.argv[1:]),
               "date": time.strftime("%Y-%m-%d"), "load": os.getloadavg(), "task": task,
               "metric": TASKS[task]["metric"], "higher_is_better": TASKS[task]["higher_is_better"],
               "sources": [str(f) for f in files], "table": table, "per_seed": seeds, "runs": runs}
    _write(name, payload, runs, task, results)


def _tune(candidates: list, launch, task: str, key: str, tuning: list) -> object:
    """The candidate whose seed-0 run has the best held-out metric at its held-out-chosen epoch."""
    tried = [(v, launch(v)) for v in candidates]
    tuning += [{key: v, "held_out_metric": held_out_epoch(r["curve"], task)["val_metric"],
                "held_out_epoch": held_out_epoch(r["curve"], task)["epoch"], "head": r["head"]} for v, r in tried]
    return min(tried, key=lambda t: _held_out_score(t[1], task))[0]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--task", choices=tuple(TASKS), default="ocr")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--epochs", type=int, default=None, help="epoch budget (default: 12 on OCR, 10 on CoNLL)")
    ap.add_argument("--lrs", default="1e-3,2e-3,4e-3", help="learning rates tried on held-out training data")
    ap.add_argument("--lr", type=float, default=None, help="use this learning rate for every head (no tuning)")
    ap.add_argument("--head-lrs", default=None,
                    help="each head's learning rate, e.g. softmax=4e-3,crf=4e-3,hinge=2e-3,bcfw=1e-3,bcfw-lam=1e-3")
    ap.add_argument("--hinge-lams", default=None,
                    help="hinge + Adam's lam chosen from these on held-out data (seed 0); default: the task's lam")
    ap.add_argument("--limit", type=int, default=None, help="only the first N training and test words / sentences")
    ap.add_argument("--heads", default=",".join(h for h in HEADS if h != "bcfw-step"),
                    help=f"heads to run, from {','.join(HEADS)} (default: all but bcfw-step, which runs on OCR only)")
    ap.add_argument("--quick", action="store_true", help="300 words, 3 epochs, one seed, lr 2e-3: under 3 minutes")
    ap.add_argument("--results", default=None, help="folder for the JSON and PNG (default benchmarks/results)")
    ap.add_argument("--runs-dir", type=Path, default=None,
                    help="folder keeping every run's JSON (reused when there; default: a temporary one)")
    ap.add_argument("--name", default=None, help="the name of the JSON and PNG written")
    ap.add_argument("--bcfw-passes", type=float, default=PASSES, help="BCFW head: passes per call (the example's 10)")
    ap.add_argument("--bcfw-every", type=int, default=1, help="BCFW head: solve every N epochs (the example's 1)")
    ap.add_argument("--bcfw-lam", type=float, default=None, help="BCFW head: its fixed lam (default: the example's)")
    ap.add_argument("--bcfw-warmup", type=int, default=2,
                    help="BCFW heads: epochs of cross-entropy warm-up (the examples' 2; 0: none, as the other heads)")
    ap.add_argument("--bcfw-margin-scale", type=float, default=1.0,
                    help="BCFW heads: the backbone's hinge scores at this multiple of the solved head's w")
    ap.add_argument("--lam-grid", default=None, help="bcfw-lam: the candidate lam values (default: the task's grid)")
    ap.add_argument("--lam-passes", type=float, default=None,
                    help="bcfw-lam: BCFW passes per candidate per call (default: --bcfw-passes, as far as the head)")
    ap.add_argument("--lam-window", type=int, default=None,
                    help="bcfw-lam: solve the current choice and this many neighbours on each side (default: all)")
    ap.add_argument("--threads", type=int, default=max(1, os.cpu_count() or 1),
                    help="torch threads of every run (default: the machine's cores)")
    ap.add_argument("--combine", nargs="+", type=Path, default=None, metavar="JSON",
                    help="no runs: the table and plot of the runs in these files (run files or result files)")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--head", help=argparse.SUPPRESS)
    ap.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--hinge-lam", type=float, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    ap.add_argument("--tmp", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    args.lam_grid = args.lam_grid or TASKS[args.task]["lam_grid"]
    if args.worker:
        return worker(args)
    if args.combine:
        return combine(args.combine, args.task, args.name or f"heads_{args.task}_combined", args.results, argv)
    if args.quick:
        args.limit, args.epochs, args.seeds, args.lr = args.limit or 300, 3, "0", args.lr or 2e-3
    args.epochs = args.epochs or TASKS[args.task]["epochs"]
    task = args.task
    heads = args.heads.split(",")
    unknown = sorted(set(heads) - set(HEADS))
    if unknown:
        raise SystemExit(f"unknown heads {unknown}; choose from {list(HEADS)}")
    if task == "conll" and "bcfw-step" in heads:
        raise SystemExit("bcfw-step runs on --task ocr only (the CoNLL datamodule's batches carry no example ids)")
    seeds = [int(s) for s in args.seeds.split(",")]
    grid = [float(v) for v in args.lrs.split(",")]
    fixed = {k: float(v) for k, v in (kv.split("=") for kv in args.head_lrs.split(","))} if args.head_lrs else {}
    tuning, runs, lrs = [], [], {}
    with tempfile.TemporaryDirectory() as tmp:
        runs_dir = args.runs_dir or Path(tmp)
        for head in heads:  # each head's rate: given, or chosen on held-out data (seed 0)
            lrs[head] = args.lr or fixed.get(head) or _tune(
                grid, lambda v, h=head: _launch(h, v, 0, args, runs_dir), task, "lr", tuning)
        hinge_lam = None
        if "hinge" in heads and args.hinge_lams:
            hinge_lam = _tune([float(v) for v in args.hinge_lams.split(",")],
                              lambda v: _launch("hinge", lrs["hinge"], 0, args, runs_dir, v), task, "hinge_lam", tuning)
        for seed in seeds:
            for head in heads:
                runs.append(_launch(head, lrs[head], seed, args, runs_dir, hinge_lam if head == "hinge" else None))
                c = held_out_epoch(runs[-1]["curve"], task)
                print(f"{head:8s} lr {lrs[head]:g} seed {seed}: {TASKS[task]['metric']} {c['test_metric']:.4f} at the "
                      f"held-out epoch {c['epoch']}, {runs[-1]['curve'][-1]['test_metric']:.4f} at the last "
                      f"({runs[-1]['curve'][-1]['seconds']:.0f} s; load {os.getloadavg()[0]:.2f})", flush=True)
    if tuning:
        print_table(tuning, ["head", "lr", "hinge_lam", "held_out_metric", "held_out_epoch"])
    table, per = _report(task, runs)
    name = args.name or f"heads_{args.task}{'_quick' if args.quick else ''}"
    payload = {"command": "python benchmarks/heads.py " + " ".join(argv if argv is not None else sys.argv[1:]),
               "date": time.strftime("%Y-%m-%d"), "load": os.getloadavg(), "task": task,
               "metric": TASKS[task]["metric"], "higher_is_better": TASKS[task]["higher_is_better"],
               "lam": args.bcfw_lam or TASKS[task]["lam"], "lam_grid": args.lam_grid, "lam_passes": args.lam_passes,
               "lam_window": args.lam_window,
               "epochs": args.epochs, "limit": args.limit, "seeds": seeds, "lrs": lrs, "hinge_lam": hinge_lam,
               "threads": args.threads,
               "bcfw_passes": args.bcfw_passes, "bcfw_every": args.bcfw_every, "tuning": tuning, "table": table,
               "per_seed": per, "runs": runs}
    _write(name, payload, runs, task, args.results)


if __name__ == "__main__":
    main()
