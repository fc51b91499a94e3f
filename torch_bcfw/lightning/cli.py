"""``torch-bcfw train --config configs/ocr_cnn.yaml``: a whole Lightning experiment from one YAML file.

The file is a :class:`~lightning.pytorch.cli.LightningCLI` config without subcommand (``seed_everything``,
``trainer``, ``model``, ``data``), plus ``test`` (run ``trainer.test`` after fitting, default true), ``report`` (a
JSON file for the final figures), ``ckpt_path`` (resume from a checkpoint, the BCFW dual state included) and
``threads`` (CPU threads of torch and numba).  Any entry can be overridden on the command line, e.g.
``--trainer.max_epochs=3``; ``torch-bcfw train --help`` lists them all.
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import lightning.pytorch as pl
import torch
from lightning.fabric.utilities.exceptions import MisconfigurationException
from lightning.pytorch.cli import LightningCLI

from .callback import BCFWCallback

__all__ = ["TrainCLI", "set_threads", "summarize", "train_main"]


class TrainCLI(LightningCLI):
    def parse_arguments(self, parser, args) -> None:
        super().parse_arguments(parser, args)
        # before the seed is set and the trainer built: a GPU request on a machine without one, in one line
        accelerator = self.config.get("trainer", {}).get("accelerator")
        if isinstance(accelerator, str) and accelerator in ("gpu", "cuda") and not torch.cuda.is_available():
            raise ValueError(f"--trainer.accelerator={accelerator} but CUDA is not available on this machine; use "
                             "--trainer.accelerator=cpu (or auto)")

    def add_arguments_to_parser(self, parser) -> None:
        parser.add_argument("--test", type=bool, default=True, help="run trainer.test after fitting")
        parser.add_argument("--report", type=str | None, default=None, help="write the final figures to this JSON file")
        parser.add_argument("--ckpt_path", type=str | None, default=None,
                            help="resume from this Lightning checkpoint (weights, optimiser, BCFW dual state)")
        parser.add_argument("--threads", type=int | None, default=None,
                            help="CPU threads of torch and numba while fitting (None: their defaults; 1 avoids the "
                                 "oversubscription slowdowns of a CPU shared with other jobs)")


def set_threads(torch_threads: int, numba_threads: int | None = None) -> tuple[int, int]:
    """Set the CPU threads of torch and of the compiled (numba) decoders; return the previous ``(torch, numba)``.
    ``numba_threads`` defaults to ``torch_threads`` (capped at numba's maximum)."""
    import numba

    before = (torch.get_num_threads(), numba.get_num_threads())
    torch.set_num_threads(int(torch_threads))
    n = int(torch_threads if numba_threads is None else numba_threads)
    numba.set_num_threads(max(1, min(n, numba.config.NUMBA_NUM_THREADS)))
    return before


def summarize(trainer, wall: float, test_metrics: dict | None = None) -> dict:
    """Final figures of a run: the certificate of every BCFWCallback, test metrics and wall time."""
    out = {"epochs": trainer.current_epoch, "wall_time_s": wall}
    for cb in trainer.callbacks:
        if isinstance(cb, BCFWCallback) and cb.last_record is not None:
            figs = cb.figures(cb.last_record)
            out.update({f"{cb.log_prefix}/{k}": v for k, v in figs.items()})
            out[f"{cb.log_prefix}/calls"] = cb.calls
    for k, v in (test_metrics or {}).items():
        out[k] = float(v)
    return out


def train_main(args=None) -> int:
    """Entry point of ``torch-bcfw train`` (``args``: the arguments after ``train``)."""
    argv0 = sys.argv
    if args is not None:  # LightningCLI warns when both args and sys.argv carry arguments
        sys.argv = [f"{Path(argv0[0]).name} train"]
    try:
        cli = TrainCLI(
            model_class=pl.LightningModule, datamodule_class=pl.LightningDataModule, subclass_mode_model=True,
            subclass_mode_data=True, run=False, args=args, seed_everything_default=0,
            save_config_kwargs={"overwrite": True},
        )
    except MisconfigurationException as exc:  # e.g. --trainer.accelerator=gpu on a machine without one
        raise ValueError(f"the trainer cannot be built on this machine: {exc}") from None
    finally:
        sys.argv = argv0
    threads = cli.config.get("threads")
    if threads is not None and int(threads) < 1:
        raise ValueError(f"threads must be >= 1, got {threads}")
    restore = set_threads(threads) if threads is not None else None
    try:
        t0 = time.perf_counter()
        cli.trainer.fit(cli.model, datamodule=cli.datamodule, ckpt_path=cli.config.get("ckpt_path"))
        wall = time.perf_counter() - t0
        test_metrics = None
        if cli.config.get("test", True):
            res = cli.trainer.test(cli.model, datamodule=cli.datamodule)
            test_metrics = res[0] if res else None
    finally:
        if restore is not None:
            set_threads(*restore)
    summary = summarize(cli.trainer, wall, test_metrics)
    width = max(len(k) for k in summary)
    print("\n".join(f"{k:<{width}}  {v:.6g}" if isinstance(v, float) else f"{k:<{width}}  {v}" for k, v in summary.items()))
    report = cli.config.get("report")
    if report:
        Path(report).parent.mkdir(parents=True, exist_ok=True)
        Path(report).write_text(json.dumps(summary, indent=1))
    return 0
