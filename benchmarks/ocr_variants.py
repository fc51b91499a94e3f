"""The 8 BCFW variants of Osokin et al. 2016 on OCR-large (n = 6251): passes and seconds to a relative gap,
and the per-pass overhead of each variant relative to plain BCFW.

Usage:  python benchmarks/ocr_variants.py [--seeds 5] [--cap 500] [--resume]
Writes benchmarks/results/ocr_variants.json (all histories), ocr_variants_lam{lam}.png (Fig. 3 style:
median and min-max over the seeds) and prints the tables.

Protocol (as in the paper: current iterate, no averaging, exact gap every 10 passes):

* ``lam = 0.01``: every run makes 200 passes; reported are the effective passes and seconds to the first
  exact check with ``gap / primal <= 1%`` and the gap after 200 passes (pairwise steps should reach smaller
  gaps at the larger ``lam``);
* ``lam = 0.001``: runs stop at ``gap / primal <= 5%`` or after 500 passes (the cap).

A pass is ``n`` block iterations (cache hits included).  *Effective passes* = (oracle calls of the block
iterations + the ``n`` oracle calls of each exact gap pass) / ``n``, the paper's unit; *oracle passes*
leave the gap passes out.  Seconds = solver time + gap-check time.

Overhead: each variant runs 20 passes at ``lam = 0.01`` to reach a typical state, then ``--repeat`` timed
passes of ``n`` iterations (no gap checks); the variants are measured round-robin in one process so that the
shared machine's load affects all alike.  Ratios are to plain BCFW (the chain's compiled step loop ``chain_refined_plan_steps``).
"""
from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch (see torch_bcfw/__init__.py)

import argparse
import json
import time

import numpy as np

from common import DATA, RESULTS, print_table, write_json
from torch_bcfw import fit
from torch_bcfw.compare import effective_passes, first_reaching, plot_comparison
from torch_bcfw.datasets.ocr import load_ocr_split
from torch_bcfw.models import Chain
from torch_bcfw.solvers.bcfw import BCFW
from torch_bcfw.solvers.run import options_for
from torch_bcfw.solvers.record import plain_history

VARIANTS = [
    ("BCFW", "uniform-fw"), ("BCFW + gap", "gap-fw"), ("BCFW + cache", "uniform-fw-cache"),
    ("BCFW + gap + cache", "gap-fw-cache"), ("BCPFW", "uniform-pairwise"), ("BCPFW + gap", "gap-pairwise"),
    ("BCPFW + cache", "uniform-pairwise-cache"), ("BCPFW + gap + cache", "gap-pairwise-cache"),
]
SETTINGS = [  # lam, relative target, passes, stop at the target
    (0.01, 0.01, 200, False),
    (0.001, 0.05, 500, True),
]
COMMON = dict(gap_check=10, averaging=False, check_averaged=False, track_train_loss=False)


def run_all(model, train, seeds, cap, results, save):
    n = len(train)
    warm = train[list(range(64))]
    for _, preset in VARIANTS:  # compile and warm up outside the timed runs
        fit(model, warm, 0.01, preset=preset, max_passes=2, gap_check=1, averaging=False)
    for lam, target, passes, stop in SETTINGS:
        key = f"lam={lam:g}"
        block = results.setdefault(key, {"lam": lam, "n": n, "target": target, "seeds": seeds, "runs": {}})
        for label, preset in VARIANTS:
            run = block["runs"].setdefault(label, {"preset": preset, "seeds": {}})
            for seed in seeds:
                if str(seed) in run["seeds"]:
                    continue
                t0 = time.perf_counter()
                r = fit(model, train, lam, preset=preset, seed=seed, max_passes=min(passes, cap),
                        rel_gap_tol=target if stop else None, **COMMON)
                run["options"] = r.options.to_dict()
                run["seeds"][str(seed)] = {"history": plain_history(r.history), "stopped_by": r.stopped_by,
                                           "wall": time.perf_counter() - t0}
                last = run["seeds"][str(seed)]["history"][-1]
                p, s = first_reaching(run["seeds"][str(seed)]["history"], n, target)
                print(f"{key} {label:22s} seed {seed}: reach {p} passes {s} s | final gap {last['gap']:.3e} "
                      f"rel {last['gap'] / last['primal']:.3e} eff passes {effective_passes(last, n):.1f} "
                      f"oracle {last['oracle_calls']} hits {last['cache_hits']}", flush=True)
                save()


def table(results, cap):
    rows = []
    for key, block in results.items():
        if not key.startswith("lam="):
            continue
        n, target = block["n"], block["target"]
        for label, run in block["runs"].items():
            reach = [first_reaching(s["history"], n, target) for s in run["seeds"].values()]
            hit = [(p, t) for p, t in reach if p is not None]
            last = [s["history"][-1] for s in run["seeds"].values()]
            oracle_at = []
            for s in run["seeds"].values():
                for rec in s["history"]:
                    if rec["gap"] / rec["primal"] <= target:
                        oracle_at.append(rec["oracle_calls"] / n)
                        break
            rows.append({
                "lam": block["lam"], "target": f"{target:.0%}", "solver": label,
                "reached": f"{len(hit)}/{len(reach)}",
                "eff_passes_med": float(np.median([p for p, _ in hit])) if hit else None,
                "eff_passes_min": float(min(p for p, _ in hit)) if hit else None,
                "eff_passes_max": float(max(p for p, _ in hit)) if hit else None,
                "oracle_passes_med": float(np.median(oracle_at)) if oracle_at else None,
                "seconds_med": float(np.median([t for _, t in hit])) if hit else None,
                "final_gap_med": float(np.median([r["gap"] for r in last])),
                "final_rel_gap_med": float(np.median([r["gap"] / r["primal"] for r in last])),
                "final_eff_passes_med": float(np.median([effective_passes(r, n) for r in last])),
                "cache_hit_rate": float(np.median([r["cache_hits"] / max(1, r["steps"]) for r in last])),
            })
    return rows


def overheads(model, train, repeat, results):
    n = len(train)
    algs = {}
    for label, preset in VARIANTS:
        alg = BCFW(model, train, 0.01, options_for("bcfw", preset=preset, averaging=False, batch_size=1))
        for _ in range(20):
            alg.advance(n)
            if alg.check_requested or alg.steps % (10 * n) == 0:
                alg.state.refresh()
                alg.certificate()
                alg.check_requested = False
        algs[label] = alg
    times = {label: [] for label in algs}
    calls = {label: [] for label in algs}
    tokens = {label: [] for label in algs}
    lengths = train.lengths.numpy()
    for _ in range(repeat):
        for label, alg in algs.items():
            c0 = alg.oracle_calls
            t0 = time.perf_counter()
            alg.advance(n)
            times[label].append(time.perf_counter() - t0)
            calls[label].append(alg.oracle_calls - c0)
            tokens[label].append(int(lengths[alg.last_blocks].sum()))
    gap_pass = []
    for alg in algs.values():
        t0 = time.perf_counter()
        alg.certificate()
        gap_pass.append(time.perf_counter() - t0)
    base = float(np.median(times["BCFW"]))
    base_tok = base / float(np.median(tokens["BCFW"]))
    rows = []
    for label in algs:
        t = float(np.median(times[label]))
        ws = algs[label].state.working_set
        tok = float(np.median(tokens[label]))
        # gap sampling favours long words (larger gaps): per token the comparison is like for like
        rows.append({"solver": label, "s_per_pass": t, "ratio_to_bcfw": t / base,
                     "tokens_per_pass": tok, "ratio_per_token": (t / tok) / base_tok,
                     "s_per_n_oracle_calls": t * n / max(1.0, float(np.median(calls[label]))),
                     "oracle_calls_per_pass": float(np.median(calls[label])) / n,
                     "mean_working_set": None if ws is None else float(ws.size.mean())})
    results["overhead"] = {"rows": rows, "exact_gap_pass_s": float(np.median(gap_pass)), "repeat": repeat}
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--cap", type=int, default=500)
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--resume", action="store_true", help="keep the runs already in the JSON file")
    ap.add_argument("--skip-overhead", action="store_true")
    ap.add_argument("--out", default="ocr_variants.json")
    ap.add_argument("--quick", action="store_true", help="20 passes per run (a smoke test of the script)")
    args = ap.parse_args()
    if args.quick:
        SETTINGS[:] = [(lam, t, 20, stop) for lam, t, _, stop in SETTINGS]
    train, _ = load_ocr_split(DATA / "ocr", "large", 0)
    model = Chain(128, 26)
    path = RESULTS / args.out
    results = {}
    if args.resume and path.exists():
        results = {k: v for k, v in json.loads(path.read_text()).items() if k.startswith("lam=") or k == "overhead"}
    seeds = list(range(1, args.seeds + 1))

    def save():
        write_json(args.out, {**results, "table": table(results, args.cap)})

    if not args.skip_overhead and "overhead" not in results:
        rows = overheads(model, train, args.repeat, results)
        print_table(rows, ["solver", "s_per_pass", "ratio_to_bcfw", "tokens_per_pass", "ratio_per_token",
                           "s_per_n_oracle_calls", "oracle_calls_per_pass", "mean_working_set"])
        save()
    run_all(model, train, seeds, args.cap, results, save)
    rows = table(results, args.cap)
    print_table(rows, ["lam", "target", "solver", "reached", "eff_passes_med", "eff_passes_min", "eff_passes_max",
                       "oracle_passes_med", "seconds_med", "final_gap_med", "final_rel_gap_med", "cache_hit_rate"])
    for key, block in results.items():
        if key.startswith("lam="):
            res = {"lam": block["lam"], "n": block["n"], "seeds": block["seeds"],
                   "runs": {lab: {"solver": "bcfw", "options": run.get("options", {}), "seeds": run["seeds"]}
                            for lab, run in block["runs"].items()}}
            plot_comparison(res, RESULTS / f"{args.out.removesuffix('.json')}_lam{block['lam']:g}.png",
                            title=f"OCR-large, lam = {block['lam']:g}: median and min-max over {len(block['seeds'])} seeds")
    save()


if __name__ == "__main__":
    main()
