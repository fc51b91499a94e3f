"""Helpers shared by the benchmark scripts: data location, timing, table printing, JSON output."""
from __future__ import annotations

import json
import os
import platform
import statistics
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
DATA = Path(os.environ.get("TORCH_BCFW_SHARED", ROOT.parent / "shared")) / "data"
#: where the scripts write (``TORCH_BCFW_RESULTS`` overrides it: the heavy tests write to a temporary folder)
RESULTS = Path(os.environ.get("TORCH_BCFW_RESULTS", ROOT / "benchmarks" / "results"))


def timed(fn, repeat: int = 5, warmup: int = 1) -> dict:
    """Run ``fn`` ``warmup + repeat`` times; return min / median seconds of the timed runs."""
    for _ in range(warmup):
        fn()
    ts = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return {"min": min(ts), "median": statistics.median(ts), "runs": ts}


def machine() -> dict:
    return {"python": platform.python_version(), "torch": torch.__version__, "cpu_count": os.cpu_count(),
            "torch_threads": torch.get_num_threads(), "platform": platform.platform()}


def print_table(rows: list[dict], columns: list[str]) -> None:
    widths = [max(len(c), *(len(_fmt(r.get(c))) for r in rows)) for c in columns]
    line = "  ".join(c.ljust(w) for c, w in zip(columns, widths))
    print(line)
    print("-" * len(line))
    for r in rows:
        print("  ".join(_fmt(r.get(c)).ljust(w) for c, w in zip(columns, widths)))


def _fmt(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def _plain(obj):
    """JSON form of what ``json`` does not know: history records (``CheckRecord``) as their plain dicts."""
    if hasattr(obj, "to_dict"):
        return obj.to_dict()
    raise TypeError(f"Object of type {type(obj).__name__} is not JSON serializable")


def write_json(name: str, payload: dict) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / name
    payload = {"machine": machine(), **payload}
    path.write_text(json.dumps(payload, indent=1, default=_plain))
    print(f"wrote {path}")
    return path
