"""A BCFW-solved head against the heads a Lightning user would pick instead, on the same backbone.

    python benchmarks/heads.py --task ocr|conll [--seeds 0,1,2] [--epochs N] [--quick]

Two tasks, each with the backbone of its example and the same initialisation (seed), data order, optimiser with a
cosine schedule and epoch budget under each head:

* ``ocr`` -- OCR-large (train folds 1-9, test fold 0), the letter CNN (``torch_bcfw.tasks.ocr.LetterCNN``), Adam, 12
  epochs; the metric is the test letter error (the task loss: mean over words of the fraction of wrong letters).
  Tuning holds fold 1 out of the training folds.
* ``conll`` -- CoNLL-2000 chunking (8936 training, 2012 test sentences), the BiLSTM token encoder of
  ``examples/conll_embeddings_lightning.py`` (``torch_bcfw.tasks.conll.TokenEncoder``: word, POS and character
  embeddings), AdamW, 10 epochs; the metric is the conlleval chunk F1 (%) on the test sentences.  Tuning holds the last
  1000 training sentences out.

The heads:

* ``softmax`` -- a linear classifier per position, cross-entropy;
* ``crf`` -- a linear-chain CRF (emission layer + transition matrix) trained by its log-likelihood, computed with
  torch-struct's ``LinearChainCRF``, Viterbi decoding;
* ``hinge`` -- the chain head in the optimiser: ``StructuredHead(trainable=True)`` and the library's
  ``StructuredHingeLoss`` with ``lam`` (the SSVM objective on each batch);
* ``bcfw`` -- the example's module (``OCRChainCNN`` / ``ConllChainTagger``) with ``BCFWCallback(lam,
  passes_per_call=10)`` (``lam`` 0.01 on OCR, 0.1 on CoNLL, the examples'): two epochs of cross-entropy warm-up,
  then the structured hinge reaches the backbone while BCFW solves the head after every epoch (``--bcfw-passes`` /
  ``--bcfw-every`` change the schedule).

Each run is a process of its own (its peak memory is its own). After every epoch the test metric is measured,
outside the clock; the clock counts training and, for the BCFW head, the callback's solves.  The learning rate of
each head is chosen from ``--lrs`` on held-out training data (never the test split) unless ``--lr`` fixes it.
``--quick``: the first 300 training and 300 test words or sentences, 3 epochs, one seed, no tuning (under 3 minutes
per task; ``tests/test_heads_script.py``).

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
#: per task: the head's SSVM regularisation (the example's), the epoch budget, the metric's name and direction
TASKS = {"ocr": {"lam": 0.01, "epochs": 12, "metric": "test letter error", "higher_is_better": False},
         "conll": {"lam": 0.1, "epochs": 10, "metric": "test chunk F1 (%)", "higher_is_better": True}}
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


def _module(task: str, head: str, lr: float):
    """The LightningModule of ``head`` on ``task``."""
    return _ocr_module(head, lr) if task == "ocr" else _conll_module(head, lr)


def _ocr_module(head: str, lr: float):
    """The LightningModule of ``head`` on OCR (the BCFW head: the example's ``OCRChainCNN``)."""
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
                self.hinge = StructuredHingeLoss(self.head, lam=TASKS["ocr"]["lam"])

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


def _conll_module(head: str, lr: float):
    """The LightningModule of ``head`` on CoNLL: the example's ``ConllChainTagger`` (its encoder built from the
    datamodule's vocabulary in ``configure_model``), whose heads the peers replace."""
    import torch
    import torch.nn.functional as F

    from torch_bcfw.models import Chain
    from torch_bcfw.nn import StructuredHead, StructuredHingeLoss
    from torch_bcfw.tasks.conll import ConllChainTagger

    if head == "bcfw":
        return ConllChainTagger(encoder="bilstm", lr=lr, ce_epochs=2, ce_weight=0.0, hinge_weight=1.0)

    class Peer(ConllChainTagger):
        def __init__(self):
            super().__init__(encoder="bilstm", lr=lr)
            K, dim = self.n_labels, self.hparams.feature_dim
            if head == "crf":
                self.transitions = torch.nn.Parameter(torch.zeros(K, K))
            if head == "hinge":
                self.head = StructuredHead(Chain(dim, K), trainable=True)
                self.hinge = StructuredHingeLoss(self.head, lam=TASKS["conll"]["lam"])

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
    from torch_bcfw.lightning import BCFWCallback
    from torch_bcfw.tasks.ocr import OCRWordsDataModule, _words

    from torch_bcfw.tasks.conll import ConllChunkingDataModule

    torch.set_num_threads(max(1, os.cpu_count() or 1))
    pl.seed_everything(args.seed, verbose=False)
    if args.task == "ocr":
        data = OCRWordsDataModule(path=str(DATA / "ocr"), split="large", fold=0, batch_size=32, eval_batch_size=512,
                                  limit=args.limit, test_limit=args.limit, seed=args.seed)
        data.setup()
        if args.tune:  # held-out training data: train on folds 2-9, evaluate on fold 1 (the test fold 0 never seen)
            words = load_ocr(str(DATA / "ocr"))
            data.train_data, data.test_data = (words.subset(_first(mask, args.limit))
                                               for mask in ((words.folds != 0) & (words.folds != 1), words.folds == 1))
            data.train, data.test = _words(data.train_data), _words(data.test_data)
        metric = _letter_error
    else:  # tuning: the last 1000 training sentences (a tenth of them with --limit) held out, the test split unseen
        holdout = (max(1, args.limit // 10) if args.limit else 1000) if args.tune else 0
        data = ConllChunkingDataModule(path=str(DATA / "conll2000"), batch_size=32, eval_batch_size=256,
                                       limit=args.limit, test_limit=args.limit, holdout=holdout, seed=args.seed)
        data.setup()
        if args.tune:
            data.test = data.val
        metric = _chunk_f1
    module = _module(args.task, args.head, args.lr)
    test_loader = data.test_dataloader()
    curve = []
    clock = {"spent": 0.0, "t0": None}

    class Curve(pl.Callback):  # after BCFWCallback (registered later): the head is solved when this runs
        def on_train_epoch_start(self, trainer, pl_module):
            clock["t0"] = time.perf_counter()

        def on_train_epoch_end(self, trainer, pl_module):
            clock["spent"] += time.perf_counter() - clock["t0"]
            curve.append({"epoch": trainer.current_epoch + 1, "seconds": clock["spent"],
                          "test_metric": metric(pl_module, test_loader)})

    callbacks = []
    solve = None
    if args.head == "bcfw":
        solve = BCFWCallback(lam=TASKS[args.task]["lam"], passes_per_call=args.bcfw_passes, initial_passes=args.bcfw_passes,
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
    out = {"task": args.task, "head": args.head, "lr": args.lr, "seed": args.seed, "tune": args.tune, "curve": curve, "fit_s": wall,
           "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}
    if solve is not None:
        solve_s = sum(r.wall for r in solve.history)
        out.update(callback_s=solve_s, callback_share=solve_s / max(wall, 1e-9), final_gap=solve.last_record.gap)
    Path(args.out).write_text(json.dumps(out))


# ---------------------------------------------------------------------------------------------------- driver
def _launch(head: str, lr: float, seed: int, args, tmp: Path, tune: bool = False) -> dict:
    out = tmp / f"{head}-{lr:g}-{seed}-{int(tune)}.json"
    cmd = [sys.executable, __file__, "--worker", "--task", args.task, "--head", head, "--lr", str(lr), "--seed",
           str(seed), "--out",
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


def _best(curve: list[dict], task: str) -> dict:
    """The epoch of ``curve`` with the best test metric (the first of equals)."""
    sign = -1.0 if TASKS[task]["higher_is_better"] else 1.0
    return min(curve, key=lambda c: sign * c["test_metric"])


def _summary(runs: list[dict], task: str) -> dict:
    """Per head: the best test metric (mean over seeds, with the min-max), the seconds and epoch it was reached."""
    best = [_best(r["curve"], task) for r in runs]
    vals = [b["test_metric"] for b in best]
    out = {"head": runs[0]["head"], "lr": runs[0]["lr"], "test_metric": float(np.mean(vals)),
           "metric_min": min(vals), "metric_max": max(vals),
           "seconds_to_best": float(np.mean([b["seconds"] for b in best])),
           "epoch_of_best": float(np.mean([b["epoch"] for b in best])),
           "peak_rss_mb": float(np.mean([r["peak_rss_mb"] for r in runs]))}
    if "callback_share" in runs[0]:
        out.update(callback_share=float(np.mean([r["callback_share"] for r in runs])),
                   final_gap=float(np.mean([r["final_gap"] for r in runs])))
    return out


def _plot(runs: list[dict], task: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    for j, head in enumerate(HEADS):
        mine = [r for r in runs if r["head"] == head]
        for k, r in enumerate(mine):
            ax.plot([c["seconds"] for c in r["curve"]], [c["test_metric"] for c in r["curve"]], "-o", ms=3,
                    color=f"C{j}", alpha=0.8, label=head if k == 0 else None)
    ax.set_xlabel("wall-clock seconds (training, and the head's solves)")
    ax.set_ylabel(TASKS[task]["metric"])
    if not TASKS[task]["higher_is_better"]:
        ax.set_yscale("log")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    print(f"wrote {path}")


def goal_check(runs: list[dict], task: str) -> list[dict]:
    """The issue's goal per peer head, seed by seed: the seconds the BCFW head took to reach a metric at least as good
    as the peer's best on the same seed (``None``: never within the budget), against the seconds the peer took to
    reach its best."""
    better = (lambda a, b: a >= b) if TASKS[task]["higher_is_better"] else (lambda a, b: a <= b)
    bcfw = {r["seed"]: r for r in runs if r["head"] == "bcfw"}
    rows = []
    for peer in HEADS[:-1]:
        for r in (r for r in runs if r["head"] == peer and r["seed"] in bcfw):
            best = _best(r["curve"], task)
            hit = next((c for c in bcfw[r["seed"]]["curve"] if better(c["test_metric"], best["test_metric"])), None)
            rows.append({"peer": peer, "seed": r["seed"], "peer_best": best["test_metric"],
                         "peer_seconds": best["seconds"], "bcfw_seconds": None if hit is None else hit["seconds"],
                         "met": hit is not None and hit["seconds"] <= best["seconds"]})
    return rows


def _report(task: str, heads: list[str], runs: list[dict]) -> tuple[list[dict], list[dict]]:
    table = [_summary([r for r in runs if r["head"] == h], task) for h in heads]
    print(f"metric: {TASKS[task]['metric']}")
    print_table(table, ["head", "lr", "test_metric", "metric_min", "metric_max", "seconds_to_best", "epoch_of_best",
                        "peak_rss_mb", "callback_share", "final_gap"])
    goal = goal_check(runs, task)
    if goal:
        print_table(goal, ["peer", "seed", "peer_best", "peer_seconds", "bcfw_seconds", "met"])
    return table, goal


def _write(name: str, payload: dict, runs: list[dict], task: str, results: str | None) -> None:
    if results is None:
        write_json(f"{name}.json", payload)
    else:
        Path(results).mkdir(parents=True, exist_ok=True)
        (Path(results) / f"{name}.json").write_text(json.dumps(payload, indent=1))
    if runs:
        _plot(runs, task, Path(results or RESULTS) / f"{name}.png")


def combine(files: list[Path], task: str, name: str, results: str | None, argv, tuned: Path | None = None) -> None:
    """The table and plot of the runs stored in ``files`` (result files of this script for ``task``; curves written
    before the metric was renamed keep it as ``test_error``); with ``tuned`` (a ``--tune-only`` result), only each
    head's runs at its chosen learning rate."""
    chosen = json.loads(Path(tuned).read_text())["chosen_lr"] if tuned else None
    runs, sources = [], []
    for f in files:
        rep = json.loads(Path(f).read_text())
        if rep.get("task", "ocr") != task:
            raise SystemExit(f"{f} holds runs of task {rep.get('task', 'ocr')!r}, not {task!r}")
        sources.append({"file": str(f), "command": rep.get("command")})
        for r in rep["runs"]:
            r = {**r, "curve": [{**c, "test_metric": c.get("test_metric", c.get("test_error"))} for c in r["curve"]]}
            if chosen is None or chosen.get(r["head"]) == r["lr"]:
                runs.append(r)
    heads = [h for h in HEADS if any(r["head"] == h for r in runs)]
    table, goal = _report(task, heads, runs)
    payload = {"command": "python benchmarks/heads.py " + " ".join(argv if argv is not None else sys.argv[1:]),
               "date": time.strftime("%Y-%m-%d"), "task": task, "metric": TASKS[task]["metric"],
               "higher_is_better": TASKS[task]["higher_is_better"], "sources": sources, "table": table, "goal": goal,
               "tuned": str(tuned) if tuned else None, "chosen_lr": chosen, "runs": runs}
    _write(name, payload, runs, task, results)


def _write_tuning(task: str, tuning: list[dict], chosen: dict, grid: list[float], args, argv) -> None:
    """``--tune-only``: the held-out metric of every (head, rate) and each head's chosen rate, as JSON."""
    payload = {"command": "python benchmarks/heads.py " + " ".join(argv if argv is not None else sys.argv[1:]),
               "date": time.strftime("%Y-%m-%d"), "task": task,
               "metric": "held-out " + TASKS[task]["metric"].replace("test ", ""), "epochs": args.epochs, "limit": args.limit, "lr_grid": grid, "tuning": tuning, "chosen_lr": chosen}
    print("chosen:", chosen)
    _write(args.name or f"heads_{task}_tuning", payload, [], task, args.results)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--task", choices=tuple(TASKS), default="ocr")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--epochs", type=int, default=None, help="epoch budget (default: 12 on OCR, 10 on CoNLL)")
    ap.add_argument("--lrs", default="1e-3,2e-3,4e-3", help="learning rates tried on held-out training data")
    ap.add_argument("--lr", type=float, default=None, help="use this learning rate for every head (no tuning)")
    ap.add_argument("--limit", type=int, default=None, help="only the first N training and test words / sentences")
    ap.add_argument("--heads", default=",".join(HEADS))
    ap.add_argument("--quick", action="store_true", help="300 words, 3 epochs, one seed, lr 2e-3: under 3 minutes")
    ap.add_argument("--results", default=None, help="folder for the JSON and PNG (default benchmarks/results)")
    ap.add_argument("--bcfw-passes", type=float, default=PASSES, help="BCFW head: passes per call (the example's 10)")
    ap.add_argument("--bcfw-every", type=int, default=1, help="BCFW head: solve every N epochs (the example's 1)")
    ap.add_argument("--combine", nargs="+", type=Path, default=None, metavar="JSON",
                    help="no runs: the table and plot of the runs in these result files (e.g. seeds run apart)")
    ap.add_argument("--name", default=None, help="with --combine: the name of the JSON and PNG written")
    ap.add_argument("--tuned", type=Path, default=None, metavar="JSON",
                    help="with --combine: keep each head's runs at the learning rate this --tune-only result chose")
    ap.add_argument("--tune-only", action="store_true",
                    help="only the learning-rate grid on held-out training data: the table and the chosen rates")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--head", help=argparse.SUPPRESS)
    ap.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--tune", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    ap.add_argument("--tmp", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        return worker(args)
    if args.combine:
        return combine(args.combine, args.task, args.name or f"heads_{args.task}_combined", args.results, argv,
                       args.tuned)
    if args.quick:
        args.limit, args.epochs, args.seeds, args.lr = args.limit or 300, 3, "0", args.lr or 2e-3
    args.epochs = args.epochs or TASKS[args.task]["epochs"]
    task = args.task
    heads = args.heads.split(",")
    seeds = [int(s) for s in args.seeds.split(",")]
    grid = [float(v) for v in args.lrs.split(",")]
    tuning, runs, chosen = [], [], {}
    with tempfile.TemporaryDirectory() as tmp:
        for head in heads:
            lr = args.lr
            if lr is None:  # the grid on held-out training data, seed 0; the lowest best error wins
                tried = [_launch(head, v, 0, args, Path(tmp), tune=True) for v in grid]
                tuning += [{"head": head, "lr": t["lr"], "held_out_metric": _best(t["curve"], task)["test_metric"]}
                           for t in tried]
                sign = -1.0 if TASKS[task]["higher_is_better"] else 1.0  # the best held-out metric wins
                lr = chosen[head] = min(tried, key=lambda t: sign * _best(t["curve"], task)["test_metric"])["lr"]
            for seed in ([] if args.tune_only else seeds):
                runs.append(_launch(head, lr, seed, args, Path(tmp)))
                print(f"{head:8s} lr {lr:g} seed {seed}: best {TASKS[task]['metric']} "
                      f"{_best(runs[-1]['curve'], task)['test_metric']:.4f} ({runs[-1]['fit_s']:.0f} s)", flush=True)
    if tuning:
        print_table(tuning, ["head", "lr", "held_out_metric"])
    if args.tune_only:
        return _write_tuning(task, tuning, chosen, grid, args, argv)
    table, goal = _report(task, heads, runs)
    name = f"heads_{args.task}{'_quick' if args.quick else ''}"
    payload = {"command": "python benchmarks/heads.py " + " ".join(argv if argv is not None else sys.argv[1:]),
               "date": time.strftime("%Y-%m-%d"), "task": task, "metric": TASKS[task]["metric"],
               "higher_is_better": TASKS[task]["higher_is_better"], "lam": TASKS[task]["lam"], "epochs": args.epochs, "limit": args.limit, "seeds": seeds,
               "bcfw_passes": args.bcfw_passes, "bcfw_every": args.bcfw_every,
               "lr_grid": grid if args.lr is None else [args.lr], "tuning": tuning, "table": table, "goal": goal,
               "runs": runs}
    _write(name, payload, runs, task, args.results)


if __name__ == "__main__":
    main()
