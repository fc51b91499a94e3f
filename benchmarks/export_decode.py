"""Decoding speed of an exported chain head (``head.py``, torch only) against the library's ``FitResult.predict``.

    python benchmarks/export_decode.py [--repeat 40] [--threads 1]

A Chain(128, 26) head is trained on 300 OCR training words (2 BCFW passes: the decoder's speed does not depend on
the weights), exported with :func:`torch_bcfw.export.export_head`, loaded from its ``head.py`` and timed on the
OCR test splits (large: fold 0, 626 words; small: folds 1-9, 6251 words), interleaved with ``FitResult.predict``
on the same words (the minimum of ``--repeat`` runs each).  The labels are asserted equal.  Writes
``benchmarks/results/export_decode.json``.
"""
from __future__ import annotations

import argparse
import importlib.util
import tempfile
import time
from pathlib import Path

import torch

from common import DATA, print_table, write_json
from torch_bcfw import fit
from torch_bcfw.datasets.ocr import load_ocr_split
from torch_bcfw.export import export_head
from torch_bcfw.models import Chain


def _load_exported(folder: Path):
    spec = importlib.util.spec_from_file_location("exported_head", folder / "head.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.load_head(folder / "head.safetensors")


def measure(split: str, repeat: int) -> dict:
    train, test = load_ocr_split(str(DATA / "ocr"), split, 0)
    result = fit(Chain(128, 26), train[torch.arange(300)], 0.1, max_passes=2, gap_check=2)
    with tempfile.TemporaryDirectory() as tmp:
        export_head(result, tmp)
        head = _load_exported(Path(tmp))
    if not torch.equal(head(test.x, test.lengths), result.predict(test)):
        raise AssertionError("the exported head decodes differently from the library")
    calls = {"predict_s": lambda: result.predict(test), "exported_s": lambda: head(test.x, test.lengths)}
    best = dict.fromkeys(calls, float("inf"))
    for _ in range(repeat):
        for name, call in calls.items():
            t0 = time.perf_counter()
            call()
            best[name] = min(best[name], time.perf_counter() - t0)
    return {"split": split, "words": len(test), "tokens": int(test.lengths.sum()), **best,
            "ratio": best["exported_s"] / best["predict_s"]}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=40)
    ap.add_argument("--threads", type=int, default=1, help="torch and numba threads (both decoders)")
    args = ap.parse_args(argv)
    import numba

    torch.set_num_threads(args.threads)
    numba.set_num_threads(args.threads)
    rows = [measure(split, args.repeat) for split in ("large", "small")]
    print_table(rows, ["split", "words", "tokens", "predict_s", "exported_s", "ratio"])
    payload = {"repeat": args.repeat, "threads": args.threads, "rows": rows}
    write_json("export_decode.json", payload)
    return payload


if __name__ == "__main__":
    main()
