"""Step driver, old vs new: pass times and trajectories of the BCFW family before and after a change of the step
loops (issue 25, item 1: one plan, one dispatch, shared block-step pieces).

Usage:  python benchmarks/driver_speed.py --old /tmp/oldtree [--rounds 3] [--conll-passes 3] [--skip conll,horses]
                                         [--pin CPU] [--json NAME]
        (make the old copy with ``git archive HEAD torch_bcfw | tar -x -C /tmp/oldtree`` before editing)
Writes benchmarks/results/driver_speed.json (or ``--json NAME``) and prints a table.

Every measurement runs in its own child process with ``PYTHONPATH`` pointing at one package (``--old`` or this
working tree; each child reports the ``torch_bcfw.__file__`` it imported), old and new alternating ``--rounds``
times; medians are compared (ratio new / old, target <= 1.05).  In each child numba's compilation is excluded by a
warm-up run first.

* OCR-large (fold 0, 6251 words, ``Chain(128, 26)``, ``lam = 0.01``): ``fit(max_passes=20, gap_check=20)``,
  solver seconds per pass (``counters['solver_time'] / passes``, the compiled plain-BCFW kernel);
* CoNLL-2000 (all 8936 sentences, d = 1,643,026): ``--conll-passes`` passes of plain BCFW, solver seconds per pass;
* horses (200 training images, graph cut, the compiled step loop of ``GraphCutDualState``): solver overhead per
  oracle time, median over 5 passes (``benchmarks/horses_oracle.py``'s ``solver_overhead``);
* bit-identity on OCR-large (10 passes, gap check every 5): final weights (``torch.equal``) and histories (every
  field but times) of presets ``uniform-fw`` (plain BCFW), ``gap-pairwise-cache`` and of ``solver='mp-bcfw'``.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import DATA, ROOT, print_table, write_json

IDENTITY_RUNS = {"uniform-fw": {"preset": "uniform-fw"}, "gap-pairwise-cache": {"preset": "gap-pairwise-cache"},
                 "mp-bcfw": {"solver": "mp-bcfw"}}
TIME_KEYS = ("time", "solver_time", "gap_time", "wall", "seconds")


def _ocr():
    from torch_bcfw.datasets.ocr import load_ocr_split
    from torch_bcfw.models import Chain

    train, _ = load_ocr_split(str(DATA / "ocr"), "large", 0)
    return Chain(128, 26), train


def child_ocr(args) -> dict:
    from torch_bcfw import fit

    model, data = _ocr()
    fit(model, data, 0.01, max_passes=2, gap_check=2)  # compile / load the kernels
    r = fit(model, data, 0.01, max_passes=20, gap_check=20)
    return {"s_per_pass": r.counters["solver_time"] / r.passes}


def child_conll(args) -> dict:
    from torch_bcfw import fit
    from torch_bcfw.datasets.conll_chain import load_conll_problem

    prob = load_conll_problem(str(DATA / "conll2000"))
    fit(prob.model, prob.train, 1.0 / len(prob.train), max_passes=1, gap_check=1)  # compile
    r = fit(prob.model, prob.train, 1.0 / len(prob.train), max_passes=args.conll_passes, gap_check=args.conll_passes)
    return {"s_per_pass": r.counters["solver_time"] / r.passes}


def child_horses(args) -> dict:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from horses_oracle import horse_graphs, solver_overhead

    data = horse_graphs((48, 64))
    ov = solver_overhead(data, 1e-2, 5)
    return {"overhead": ov["overhead_fraction"], "overhead_us_per_step": ov["overhead_us_per_step_median"]}


def child_identity(args) -> dict:
    import torch

    from torch_bcfw import fit

    model, data = _ocr()
    out = {}
    for name, kw in IDENTITY_RUNS.items():
        r = fit(model, data, 0.01, max_passes=10, gap_check=5, **kw)
        hist = [{k: v for k, v in h.items() if not any(t in k for t in TIME_KEYS)} for h in r.history]
        out[name] = {"weights": r.weights.clone(), "history": hist}
    torch.save(out, args.out)
    return {}


CHILDREN = {"ocr": child_ocr, "conll": child_conll, "horses": child_horses, "identity": child_identity}


def run_child(kind: str, tree: str, args, extra=()) -> dict:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([tree, str(ROOT / "benchmarks")]))
    cmd = [sys.executable, __file__, "--child", kind, "--conll-passes", str(args.conll_passes), *extra]
    if args.pin is not None:
        cmd += ["--pin", str(args.pin)]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError(f"child {kind} on {tree} failed:\n{p.stderr[-3000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--old", help="folder holding the previous torch_bcfw package")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--conll-passes", type=int, default=3)
    ap.add_argument("--skip", default="", help="comma-separated: ocr, conll, horses, identity")
    ap.add_argument("--child", choices=sorted(CHILDREN))
    ap.add_argument("--out")
    ap.add_argument("--json", default="driver_speed.json", help="name of the JSON written to benchmarks/results")
    ap.add_argument("--pin", type=int, help="run every child on this CPU only, with one torch thread (steadier timings)")
    args = ap.parse_args()
    if args.child:
        import torch_bcfw

        if args.pin is not None:
            import torch

            os.sched_setaffinity(0, {args.pin})
            torch.set_num_threads(1)

        res = CHILDREN[args.child](args)
        res["package"] = torch_bcfw.__file__
        print(json.dumps(res))
        return
    if not args.old:
        ap.error("--old PATH (a copy of the previous package) is required")
    trees = {"old": str(Path(args.old).resolve()), "new": str(ROOT)}
    skip = set(filter(None, args.skip.split(",")))
    rows, payload = [], {"rounds": args.rounds, "trees": trees, "pin": args.pin, "measures": {}}
    for kind, metric in (("ocr", "s_per_pass"), ("conll", "s_per_pass"), ("horses", "overhead")):
        if kind in skip:
            continue
        runs = {"old": [], "new": []}
        for _ in range(args.rounds):
            for side in ("old", "new"):
                res = run_child(kind, trees[side], args)
                assert res["package"].startswith(trees[side]), (res["package"], trees[side])
                runs[side].append(res)
        med = {s: statistics.median(r[metric] for r in runs[s]) for s in runs}
        payload["measures"][kind] = {"metric": metric, "runs": runs, "median": med, "ratio": med["new"] / med["old"]}
        rows.append({"measure": f"{kind} {metric}", "old": med["old"], "new": med["new"],
                     "ratio": med["new"] / med["old"], "target": "<= 1.05"})
    if "identity" not in skip:
        import torch

        with tempfile.TemporaryDirectory() as tmp:
            got = {}
            for side in ("old", "new"):
                path = os.path.join(tmp, f"{side}.pt")
                run_child("identity", trees[side], args, ("--out", path))
                got[side] = torch.load(path)
        ident = {}
        for name in IDENTITY_RUNS:
            a, b = got["old"][name], got["new"][name]
            ident[name] = {"weights_equal": bool(torch.equal(a["weights"], b["weights"])),
                           "history_equal": a["history"] == b["history"]}
            rows.append({"measure": f"bit-identity {name}", "old": "-", "new": "-",
                         "ratio": "equal" if all(ident[name].values()) else f"DIFFERS {ident[name]}", "target": "equal"})
        payload["identity"] = ident
    print_table(rows, ["measure", "old", "new", "ratio", "target"])
    payload["table"] = rows
    payload["date"] = time.strftime("%Y-%m-%d")
    write_json(args.json, payload)


if __name__ == "__main__":
    main()
