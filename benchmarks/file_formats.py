"""Saving and loading the model file and the checkpoint of an OCR-large or CoNLL-2000 run: time and size.

    python benchmarks/file_formats.py [--task ocr|conll] [--label after] [--repeat 7] [--suffix .safetensors]

Fits ``Chain(128, 26)`` for 5 BCFW passes on OCR-large (fold 0, lam 0.01) -- or, ``--task conll``, the sparse chain of
CoNLL-2000 (all 8936 sentences, d = 1,643,026, lam 1/n) for 3 passes --, then saves the model file
(``FitResult.save(path, state=False)``) and the checkpoint (``FitResult.save(path)``) ``--repeat`` times each and loads
each as often (``FitResult.load``, and the load followed by one read of every tensor byte: a file mapped into memory
is read when first used), one after the other; reports the median and minimum seconds and the file sizes.
The entry ``--label`` (``<task>/<label>`` for CoNLL) of ``benchmarks/results/file_formats.json`` is replaced (other entries are kept), so that two
versions of the package (``PYTHONPATH=...``) measured one after the other land in one file.
"""
from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import torch

from common import DATA, RESULTS, machine, print_table, timed
from torch_bcfw import FitResult, fit
from torch_bcfw.datasets.ocr import load_ocr_split
from torch_bcfw.models import Chain


def _touch(obj) -> None:
    """Read every byte of every tensor in ``obj`` once."""
    if isinstance(obj, dict):
        obj = list(obj.values())
    if isinstance(obj, (list, tuple)):
        for v in obj:
            _touch(v)
    elif isinstance(obj, torch.Tensor) and obj.numel():
        obj.reshape(-1).view(torch.uint8).max()


def _load_and_read(path) -> None:
    r = FitResult.load(path)
    _touch([r.w, r.w_avg, r.solver_state])


def measure(repeat: int, suffix: str, task: str = "ocr") -> list[dict]:
    if task == "ocr":
        train, _ = load_ocr_split(str(DATA / "ocr"), "large", 0)
        result = fit(Chain(128, 26), train, 0.01, max_passes=5, progress=False)
    else:
        from torch_bcfw.datasets.conll_chain import load_conll_problem

        prob = load_conll_problem(DATA / "conll2000")
        result = fit(prob.model, prob.train, 1.0 / len(prob.train), max_passes=3, progress=False)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, state in (("model", False), ("checkpoint", True)):
            path = Path(tmp) / f"{name}{suffix}"
            save = timed(lambda: result.save(path, state=state), repeat=repeat)
            load = timed(lambda: FitResult.load(path), repeat=repeat)
            read = timed(lambda: _load_and_read(path), repeat=repeat)
            back = FitResult.load(path)
            if not (torch.equal(back.w, result.w) and back.has_state == state):
                raise AssertionError(f"the {name} file does not load back as saved")
            rows.append({"file": name, "bytes": path.stat().st_size, "save_median_s": save["median"],
                         "save_min_s": save["min"], "load_median_s": load["median"], "load_min_s": load["min"],
                         "load_read_median_s": read["median"], "load_read_min_s": read["min"]})
    return rows


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--label", default="after", help="the entry of the results file (e.g. 'before', 'after')")
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--suffix", default=".safetensors", help="file name suffix of the saved files")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--task", choices=["ocr", "conll"], default="ocr")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    rows = measure(args.repeat, args.suffix, args.task)
    print_table(rows, ["file", "bytes", "save_median_s", "save_min_s", "load_median_s", "load_min_s",
                       "load_read_median_s", "load_read_min_s"])
    path = RESULTS / "file_formats.json"
    payload = json.loads(path.read_text()) if path.is_file() else {}
    payload[args.label if args.task == "ocr" else f"{args.task}/{args.label}"] = {"machine": machine(), "repeat": args.repeat, "threads": args.threads, "rows": rows}
    RESULTS.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=1))
    print(f"wrote {path}")
    return payload


if __name__ == "__main__":
    main()
