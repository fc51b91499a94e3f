"""CoNLL-2000 chunking at paper scale: all 8936 train sentences, the full feature set (d = 1,643,026).

Usage:  python benchmarks/conll_full.py [--lams 1/n,1e-3,1e-2,3e-2] [--max-passes 200] [--stage 20]
Writes benchmarks/results/conll_full.json and prints a table.

Every ``lam`` runs in its own child process (so that its peak resident memory is its own; the
child runs under GNU ``/usr/bin/time -v`` when it is installed, whose "Maximum resident set
size" is reported next to the child's own ``getrusage`` figure).  A child loads and encodes the
data (sparse template attributes, ``min_count`` 3), trains the chain SSVM with BCFW (line
search, weighted averaging, uniform sampling, seed 1) in stages of ``--stage`` effective passes,
each ending with an exact duality-gap pass (continuing through ``fit(init=...)``), and after
each stage scores the model by conlleval chunk F1 on the 2012 test sentences: "test_f1" is the
model ``fit`` returns (of the last and the averaged iterate, the one with the lower certified
primal; "gap" is its certified duality gap), "test_f1_last" / "test_f1_avg" are both iterates.  It stops after ``--max-passes`` passes, at a certified gap
``<= --gap-tol`` or when ``--time-budget`` seconds of training are spent.

Timing: "s/pass" and "s/oracle" are BCFW training time (compiled fused kernel: loss-augmented
Viterbi + line search + update of the marginal dual state) per effective pass and per oracle
call; exact gap passes (batched oracle at a fixed w) are timed separately.  The gapBCFW paper
(Osokin et al. 2016, Table 1) reports 2e-2 s per oracle call on CoNLL.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

from common import DATA, print_table, write_json

PAPER_S_PER_ORACLE = 2e-2


def parse_lam(text: str, n: int) -> float:
    text = text.strip()
    return 1.0 / n if text == "1/n" else float(text)


def run_single(args) -> dict:
    """One lam in this process; returns the record (printed as the last stdout line)."""
    import torch

    from torch_bcfw import fit
    from torch_bcfw.datasets.conll_chain import load_conll_problem

    torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    prob = load_conll_problem(args.path, min_count=args.min_count)
    setup_s = time.perf_counter() - t0
    n = len(prob.train)
    lam = parse_lam(args.single, n)
    result, curve = None, []
    t_fit = time.perf_counter()
    while True:
        done = 0.0 if result is None else result.passes
        stage = min(args.stage, args.max_passes - done)
        if stage <= 0:
            break
        budget = None if args.time_budget is None else args.time_budget - (time.perf_counter() - t_fit)
        if budget is not None and budget <= 0:
            break
        result = fit(prob.model, prob.train, lam, "bcfw", test_data=prob.test, init=result, max_passes=stage,
                     gap_check=max(1, int(round(stage))), gap_tol=args.gap_tol, time_budget=budget, seed=args.seed)
        t1 = time.perf_counter()
        f1 = prob.f1(result.weights)
        f1_last, f1_avg = prob.f1(result.w)["f1"], prob.f1(result.w_avg)["f1"]
        rec = result.history[-1]
        curve.append({"passes": result.passes, "gap": result.gap, "gap_last": rec.gap_last, "gap_avg": rec.gap_avg,
                      "primal": result.primal, "selected": result.selected, "test_f1": f1["f1"],
                      "test_f1_last": f1_last, "test_f1_avg": f1_avg,
                      "test_hamming": rec.test_loss, "train_hamming": rec.train_loss,
                      "solver_time": rec.solver_time, "gap_time": rec.gap_time, "f1_time": time.perf_counter() - t1})
        print(f"  lam={lam:.4g} pass {result.passes:6.1f}  gap {result.gap:.3e}  primal {result.primal:.5f}  "
              f"F1 {100 * f1['f1']:.2f}  train err {rec.train_loss:.4f}  t {rec.solver_time + rec.gap_time:.0f}s",
              file=sys.stderr, flush=True)
        if result.stopped_by != "max_passes":
            break
    wall = time.perf_counter() - t_fit
    final_f1 = prob.f1(result.weights)
    train_f1 = prob.f1(result.weights, "train")
    c = result.counters
    calls = result.passes * n
    return {
        "lam": lam, "lam_spec": args.single, "n": n, "d": prob.model.n_features, "n_attributes": len(prob.vocab),
        "train_tokens": prob.train.n_tokens, "nnz": prob.train.x.nnz, "test_sentences": len(prob.test),
        "passes": result.passes, "stopped_by": result.stopped_by, "selected": result.selected,
        "gap": result.gap, "primal": result.primal, "test_f1": final_f1["f1"], "test_precision": final_f1["precision"],
        "test_recall": final_f1["recall"], "train_f1": train_f1["f1"],
        "test_f1_last": curve[-1]["test_f1_last"], "test_f1_avg": curve[-1]["test_f1_avg"],
        "rel_gap": result.gap / result.primal,
        "test_hamming": result.history[-1].test_loss,
        "solver_time_s": c["solver_time"], "gap_time_s": c["gap_time"], "gap_oracle_calls": c["gap_oracle_calls"],
        "s_per_pass": c["solver_time"] / result.passes, "s_per_oracle": c["solver_time"] / calls,
        "s_per_gap_oracle": c["gap_time"] / c["gap_oracle_calls"],
        "speedup_vs_paper": PAPER_S_PER_ORACLE / (c["solver_time"] / calls),
        "fit_wall_s": wall, "setup_s": setup_s,
        "peak_rss_mb_getrusage": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "curve": curve,
    }


def run_child(spec: str, args) -> dict:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--single", spec, "--path", str(args.path),
           "--max-passes", str(args.max_passes), "--stage", str(args.stage), "--min-count", str(args.min_count),
           "--seed", str(args.seed), "--threads", str(args.threads)]
    for flag, v in (("--gap-tol", args.gap_tol), ("--time-budget", args.time_budget)):
        if v is not None:
            cmd += [flag, str(v)]
    gnu_time = shutil.which("time") if Path("/usr/bin/time").exists() else None
    if gnu_time:
        cmd = ["/usr/bin/time", "-v"] + cmd
    print(f"lam {spec}: {' '.join(cmd)}", flush=True)
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    sys.stderr.write("\n".join(l for l in proc.stderr.splitlines() if l.startswith("  lam=")) + "\n")
    if proc.returncode != 0:
        raise RuntimeError(f"child for lam {spec} failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    rec = json.loads(proc.stdout.strip().splitlines()[-1])
    m = re.search(r"Maximum resident set size \(kbytes\): (\d+)", proc.stderr)
    rec["peak_rss_mb_gnu_time"] = int(m.group(1)) / 1024 if m else None
    rec["peak_rss_mb"] = rec["peak_rss_mb_gnu_time"] or rec["peak_rss_mb_getrusage"]
    return rec


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lams", default="1/n,1e-3,1e-2,3e-2", help="comma-separated; '1/n' = 1/8936")
    ap.add_argument("--max-passes", type=float, default=200)
    ap.add_argument("--stage", type=float, default=20, help="passes between exact gap checks and F1 evaluations")
    ap.add_argument("--gap-tol", type=float, default=None)
    ap.add_argument("--time-budget", type=float, default=480, help="training seconds per lam (checks included)")
    ap.add_argument("--min-count", type=int, default=3)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--path", type=Path, default=DATA / "conll2000")
    ap.add_argument("--single", help=argparse.SUPPRESS)
    ap.add_argument("--out", default="conll_full.json")
    args = ap.parse_args()
    if args.single:
        print(json.dumps(run_single(args)))
        return
    rows = [run_child(spec, args) for spec in args.lams.split(",")]
    cols = ["lam", "passes", "test_f1", "test_f1_last", "test_f1_avg", "gap", "rel_gap", "selected", "s_per_pass", "s_per_oracle", "speedup_vs_paper",
            "s_per_gap_oracle", "fit_wall_s", "peak_rss_mb"]
    table = [{**r, **{k: 100 * r[k] for k in ("test_f1", "test_f1_last", "test_f1_avg")}} for r in rows]
    print()
    print_table(table, cols)
    # the test column chooses nothing: the held-out sentences choose lam (benchmarks/peers.py)
    first = rows[0]
    print(f"\n{first['test_sentences']} test sentences; d = {first['d']:,} ({first['n_attributes']:,} attributes x 22 "
          "labels + 3 x 22 biases + 22^2 transitions)")
    write_json(args.out, {
        "benchmark": "conll_full", "paper_s_per_oracle": PAPER_S_PER_ORACLE,
        "settings": {"max_passes": args.max_passes, "stage": args.stage, "gap_tol": args.gap_tol,
                     "time_budget": args.time_budget, "min_count": args.min_count, "seed": args.seed,
                     "threads": args.threads, "solver": "bcfw", "step": "line_search", "sampling": "uniform",
                     "averaging": True},
        "rows": rows,
    })


if __name__ == "__main__":
    os.environ.setdefault("NUMBA_NUM_THREADS", "2")
    main()
