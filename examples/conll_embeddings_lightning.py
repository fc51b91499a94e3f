"""Word, POS and character embeddings with a BiLSTM under a BCFW-solved chain SSVM head on CoNLL-2000.

    python examples/conll_embeddings_lightning.py --data ../shared/data/conll2000 [--epochs 10] [--limit N]

The same experiment as ``torch-bcfw train --config configs/conll_embeddings.yaml`` (same seed, model,
data and callback settings), written out with the Python API:

* the encoder (:class:`torch_bcfw.tasks.conll.TokenEncoder`, plain torch) embeds every token's
  word (seen >= 2 times in training, else ``<unk>``), POS tag and characters (a character CNN), runs a
  bidirectional LSTM over the sentence and maps each token to 64 layer-normalised features; it is
  trained for ``ce_epochs`` epochs with per-token cross-entropy through an auxiliary linear
  classifier, then with the :class:`torch_bcfw.nn.StructuredHingeLoss` of the chain head;
* the chain head (:class:`torch_bcfw.nn.StructuredHead` on a :class:`torch_bcfw.models.Chain` over the
  22 chunk tags) is never touched by the optimiser: :class:`torch_bcfw.lightning.BCFWCallback` solves
  it with BCFW on the current features after every epoch (warm-started from its re-bound dual state)
  and logs the certified duality gap;
* at the end the 2012 test sentences are decoded with Viterbi and the conlleval chunk F1 is printed
  next to the sparse linear chain SSVM's (``benchmarks/results/conll_full.json``; ``--baseline``
  retrains it: ``lam = 0.01``, the held-out choice, 100 BCFW passes, about 2 minutes and 1.5 GB).

``--holdout N`` validates on the last N training sentences (held out of training and of the
vocabulary) after every epoch, for choosing settings without looking at the test set.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch_bcfw  # noqa: F401  (before torch: sets OMP_WAIT_POLICY=PASSIVE, see README "Benchmarks")

# isort: split
import lightning.pytorch as pl
from lightning.pytorch.loggers import CSVLogger

from torch_bcfw.lightning import BCFWCallback
from torch_bcfw.lightning.cli import set_threads, summarize
from torch_bcfw.tasks.conll import ConllChainTagger, ConllChunkingDataModule

_SPARSE = Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "conll_full.json"
#: the sparse chain's lam chosen on the held-out sentences (``docs/results/peers.md``); never the test F1
SPARSE_LAM = 0.01


def sparse_reference() -> dict | None:
    """The held-out ``lam``'s row of the sparse full-scale benchmark (``benchmarks/conll_full.py``), if present."""
    if not _SPARSE.exists():
        return None
    res = json.loads(_SPARSE.read_text())
    row = next((r for r in res["rows"] if abs(r["lam"] - SPARSE_LAM) <= 1e-12), None)
    if row is None:
        return None
    return {"lam": row["lam"], "test_f1": row["test_f1"], "gap": row["gap"], "passes": row["passes"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default="../shared/data/conll2000", help="conll2000.zip or a folder with it")
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--lam", type=float, default=0.1)
    ap.add_argument("--passes", type=float, default=10, help="BCFW passes per epoch")
    ap.add_argument("--encoder", default="bilstm", choices=["bilstm", "cnn"])
    ap.add_argument("--hidden", type=int, default=128, help="LSTM units per direction / CNN channels / 2")
    ap.add_argument("--layers", type=int, default=1)
    ap.add_argument("--limit", type=int, default=None, help="use only the first N training sentences")
    ap.add_argument("--holdout", type=int, default=0, help="validate on the last N training sentences")
    ap.add_argument("--output", default="runs/conll_embeddings_example")
    ap.add_argument("--baseline", action="store_true", help="also retrain the sparse linear chain SSVM")
    ap.add_argument("--threads", type=int, default=1,
                    help="CPU threads of torch and numba (1: no oversubscription slowdowns on a shared machine)")
    args = ap.parse_args()

    if args.threads:
        set_threads(args.threads)

    pl.seed_everything(0)
    data = ConllChunkingDataModule(path=args.data, batch_size=32, eval_batch_size=256, limit=args.limit,
                                   holdout=args.holdout, min_word_count=2, seed=0)
    model = ConllChainTagger(encoder=args.encoder, word_dim=64, pos_dim=16, char_dim=16, char_channels=32,
                             hidden=args.hidden, layers=args.layers, feature_dim=64, dropout=0.3, lr=2e-3, ce_epochs=2,
                             ce_weight=0.0, hinge_weight=1.0)
    bcfw = BCFWCallback(lam=args.lam, head_attr="head", every_n_epochs=1, passes_per_call=args.passes,
                        initial_passes=args.passes, verbose=True,
                        solver_options={"step": "line_search", "sampling": "uniform", "averaging": True, "seed": 1})
    trainer = pl.Trainer(accelerator="cpu", devices=1, max_epochs=args.epochs, callbacks=[bcfw],
                         gradient_clip_val=5.0, logger=CSVLogger(args.output, name="logs"),
                         default_root_dir=args.output, enable_progress_bar=False, enable_checkpointing=False,
                         num_sanity_val_steps=0)
    t0 = time.perf_counter()
    trainer.fit(model, datamodule=data)
    wall = time.perf_counter() - t0
    trainer.save_checkpoint(Path(args.output) / "final.ckpt")
    test = trainer.test(model, datamodule=data)[0]
    summary = summarize(trainer, wall, test)
    summary.update({"lam": args.lam, "encoder": args.encoder, "n_train": len(data.train),
                    "n_test": len(data.test), "vocab": repr(data.vocab)})

    ref = sparse_reference()
    if args.baseline:
        from torch_bcfw import fit
        from torch_bcfw.datasets.conll_chain import load_conll_problem

        tb = time.perf_counter()
        prob = load_conll_problem(args.data, min_count=3, limit=args.limit)
        lin = fit(prob.model, prob.train, SPARSE_LAM, max_passes=100, gap_check=10, step="line_search",
                  averaging=True, seed=1)
        ref = {"lam": SPARSE_LAM, "test_f1": prob.f1(lin.weights)["f1"], "gap": lin.gap, "passes": lin.passes,
               "time_s": time.perf_counter() - tb}
    if ref is not None:
        summary.update({f"sparse/{k}": v for k, v in ref.items()})

    out = Path(args.output)
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.json").write_text(json.dumps(summary, indent=1))
    enc = {"bilstm": "BiLSTM", "cnn": "CNN"}[args.encoder]
    print(f"\nembeddings + {enc} + BCFW chain head: test chunk F1 {100 * summary['test/f1']:.2f} "
          f"(P {100 * summary['test/precision']:.2f}, R {100 * summary['test/recall']:.2f}), certified gap "
          f"{summary['ssvm/gap']:.3g} (primal {summary['ssvm/primal']:.4g}) after {summary['ssvm/passes']:.0f} "
          f"BCFW passes, {summary['epochs']} epochs, wall time {wall:.0f} s (fit) on CPU")
    if ref is not None:
        print(f"sparse linear chain SSVM (lam = {ref['lam']:g}): test chunk F1 {100 * ref['test_f1']:.2f}, "
              f"certified gap {ref['gap']:.3g}")


if __name__ == "__main__":
    main()
