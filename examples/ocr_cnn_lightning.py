"""A small CNN under a BCFW-solved chain SSVM head on OCR-large, with Lightning.

    python examples/ocr_cnn_lightning.py --data ../shared/data/ocr [--epochs 12] [--limit N]

The same experiment as ``torch-bcfw train --config configs/ocr_cnn.yaml`` (same seed, model, data and
callback settings), written out with the Python API:

* the backbone (:class:`torch_bcfw.tasks.ocr.LetterCNN`, plain torch) maps every 16x8 letter to 64
  features; it is trained with per-letter cross-entropy for ``ce_epochs`` epochs, then with the
  :class:`torch_bcfw.nn.StructuredHingeLoss` of the chain head (a subgradient of the SSVM objective
  reaches the backbone through autograd);
* the chain head (:class:`torch_bcfw.nn.StructuredHead` on a :class:`torch_bcfw.models.Chain`) is never
  touched by the optimiser: :class:`torch_bcfw.lightning.BCFWCallback` solves it with BCFW on the current
  features after every epoch (warm-started from its re-bound dual state) and logs the certified gap;
* at the end the test fold is decoded with Viterbi and the per-letter error is printed next to the
  linear-on-pixels chain SSVM of the core package (``torch-bcfw fit --config configs/ocr.yaml``).

Prints the test error, the final certified duality gap (exact, at the final features) and the wall time;
``--baseline`` also trains the linear-on-pixels chain (lam = 0.01, 50 passes) for the comparison.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import lightning.pytorch as pl
from lightning.pytorch.loggers import CSVLogger

from torch_bcfw.lightning import BCFWCallback
from torch_bcfw.lightning.cli import summarize
from torch_bcfw.tasks.ocr import OCRChainCNN, OCRWordsDataModule


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default="../shared/data/ocr", help="folder with letters.pickle")
    ap.add_argument("--epochs", type=int, default=12)
    ap.add_argument("--lam", type=float, default=0.01)
    ap.add_argument("--passes", type=float, default=10, help="BCFW passes per epoch")
    ap.add_argument("--limit", type=int, default=None, help="use only the first N training words")
    ap.add_argument("--output", default="runs/ocr_cnn_example")
    ap.add_argument("--baseline", action="store_true", help="also train the linear-on-pixels chain SSVM")
    args = ap.parse_args()

    pl.seed_everything(0)
    data = OCRWordsDataModule(path=args.data, split="large", fold=0, batch_size=32, eval_batch_size=512,
                              limit=args.limit, seed=0)
    model = OCRChainCNN(feature_dim=64, channels=(32, 64), dropout=0.1, lr=2e-3, ce_epochs=2, ce_weight=0.0,
                        hinge_weight=1.0)
    bcfw = BCFWCallback(lam=args.lam, head_attr="head", every_n_epochs=1, passes_per_call=args.passes,
                        initial_passes=args.passes, verbose=True,
                        solver_options={"step": "line_search", "sampling": "uniform", "averaging": True, "seed": 1})
    trainer = pl.Trainer(accelerator="cpu", devices=1, max_epochs=args.epochs, callbacks=[bcfw],
                         logger=CSVLogger(args.output, name="logs"), default_root_dir=args.output,
                         enable_progress_bar=False, enable_checkpointing=False)
    t0 = time.perf_counter()
    trainer.fit(model, datamodule=data)
    wall = time.perf_counter() - t0
    test = trainer.test(model, datamodule=data)[0]
    summary = summarize(trainer, wall, test)

    if args.baseline:
        from torch_bcfw import Chain, fit

        tb = time.perf_counter()
        lin = fit(Chain(128, 26), data.train_data, args.lam, max_passes=50, gap_check=10, test_data=data.test_data)
        summary.update({"linear/test_letter_error": lin.evaluate(data.test_data), "linear/gap": lin.gap,
                        "linear/time_s": time.perf_counter() - tb})

    out = Path(args.output)
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.json").write_text(json.dumps(summary, indent=1))
    print(f"\nCNN + BCFW chain head: test letter error {summary['test/letter_error']:.4f} "
          f"(char error {summary['test/char_error']:.4f}), certified gap {summary['ssvm/gap']:.3g} "
          f"(primal {summary['ssvm/primal']:.4g}) after {summary['ssvm/passes']:.0f} BCFW passes, "
          f"wall time {wall:.0f} s (fit) on CPU")
    if args.baseline:
        print(f"linear-on-pixels chain SSVM:   test letter error {summary['linear/test_letter_error']:.4f}, "
              f"certified gap {summary['linear/gap']:.3g}")


if __name__ == "__main__":
    main()
