"""``preset="auto"`` against every preset: seconds to a target certified gap on four problems.

    python benchmarks/presets.py [--problems ocr,conll,horses,digits] [--budget 90]

For each problem, ``fit`` with each of the eight combinations of Osokin et al. 2016 (``uniform`` / ``gap`` sampling x
``fw`` / ``pairwise`` steps x with or without the cache) and with ``preset="auto"`` (which picks one of them from the
model's ``expensive_oracle``), one process, one torch thread, until the certified gap is at most the target fraction
of the primal (``rel_gap_tol``) or ``--budget`` seconds pass.  Time to the target = solver + gap-check seconds of
the run (the numba kernels are compiled before, by a one-pass run of the same preset).  Problems:

* ``ocr`` -- OCR-large (n = 6251 words), ``lam = 0.01``, 1%;
* ``conll`` -- CoNLL-2000 chunking (n = 8936 sentences, d = 1.6M), ``lam = 0.03``, 1%;
* ``horses`` -- the horses graph cut (200 images, 48 x 64), ``lam = 1e-3``, 5%;
* ``digits`` -- scikit-learn's digits, the first 1347 images (a 75% split) as a ``Multiclass`` on the 64 pixels
  scaled to [0, 1], ``lam = 0.01``, 5%.

Writes ``benchmarks/results/presets.json`` (the rows of problems not run keep their earlier figures) and prints, per problem, the seconds of every preset and the ratio of
``auto``'s time to the best one's.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import RESULTS, print_table, write_json  # noqa: E402

#: the combinations compared (the paper's eight) and the library's automatic choice
PRESETS = [f"{s}-{r}{c}" for s in ("uniform", "gap") for r in ("fw", "pairwise") for c in ("", "-cache")] + ["auto"]
#: per problem: lam, target certified gap / primal, gap-check interval (passes)
SETTINGS = {"ocr": (0.01, 0.01, 2), "conll": (0.03, 0.01, 2), "horses": (1e-3, 0.05, 1), "digits": (0.01, 0.05, 2)}


def load(name: str):
    """``(model, train data)`` of a problem."""
    if name == "digits":
        from sklearn.datasets import load_digits

        from torch_bcfw.data import MulticlassData
        from torch_bcfw.models import Multiclass

        d = load_digits()
        n = int(0.75 * len(d.target))
        x = torch.as_tensor(d.data[:n] / 16.0, dtype=torch.float64)
        return Multiclass(64, 10), MulticlassData(x, torch.as_tensor(d.target[:n]))
    import scale

    model, data, _ = scale.load(name)
    return model, data


def run(model, data, name: str, preset: str, budget: float) -> dict:
    from torch_bcfw import fit
    from torch_bcfw.solvers.bcfw_options import variant_name

    lam, target, check = SETTINGS[name]
    fit(model, data[list(range(min(len(data), 64)))], lam, preset=preset, max_passes=1, gap_check=1)  # compile
    t0 = time.perf_counter()
    res = fit(model, data, lam, preset=preset, max_passes=10_000, gap_check=check, rel_gap_tol=target,
              time_budget=budget)
    wall = time.perf_counter() - t0
    last = res.history[-1]
    reached = res.stopped_by == "rel_gap_tol"
    return {"problem": name, "preset": preset, "chosen": variant_name(res.options), "reached": reached,
            "seconds": last.solver_time + last.gap_time if reached else None, "wall_s": wall,
            "passes": last.steps / len(data), "oracle_passes": last.passes, "rel_gap": res.gap / res.primal,
            "stopped_by": res.stopped_by}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--problems", default="ocr,conll,horses,digits")
    ap.add_argument("--budget", type=float, default=90.0, help="seconds per run before it counts as not reached")
    args = ap.parse_args()
    torch.set_num_threads(1)
    rows, summary = [], []
    for name in args.problems.split(","):
        model, data = load(name)
        mine = [run(model, data, name, p, args.budget) for p in PRESETS]
        for r in mine:
            print(f"{name:7s} {r['preset']:20s} {r['seconds'] or math.inf:8.2f} s  passes {r['passes']:.0f}",
                  flush=True)
        rows += mine
        secs = lambda r: math.inf if r["seconds"] is None else r["seconds"]  # noqa: E731
        best = min((r for r in mine if r["preset"] != "auto"), key=secs)
        auto = next(r for r in mine if r["preset"] == "auto")
        summary.append({"problem": name, "auto chose": auto["chosen"], "auto s": auto["seconds"],
                        "best preset": best["preset"], "best s": best["seconds"],
                        "auto / best": secs(auto) / secs(best) if math.isfinite(secs(best)) else None,
                        "plain BCFW s": next(r["seconds"] for r in mine if r["preset"] == "uniform-fw")})
    print_table(rows, ["problem", "preset", "chosen", "seconds", "passes", "oracle_passes", "rel_gap", "stopped_by"])
    print()
    print_table(summary, list(summary[0]))
    path = RESULTS / "presets.json"  # the problems not run now keep their rows
    old = json.loads(path.read_text()) if path.exists() else {}
    done = set(args.problems.split(","))
    rows = [r for r in old.get("rows", []) if r["problem"] not in done] + rows
    summary = [r for r in old.get("summary", []) if r["problem"] not in done] + summary
    commands = old.get("commands", []) + ["python benchmarks/presets.py " + " ".join(sys.argv[1:])]
    write_json("presets.json", {"commands": commands, "date": time.strftime("%Y-%m-%d"), "settings": SETTINGS,
                                "budget_s": args.budget, "rows": rows, "summary": summary})


if __name__ == "__main__":
    main()
