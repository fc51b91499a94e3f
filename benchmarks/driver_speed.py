"""Step driver, old vs new: pass times and trajectories of the BCFW family before and after a change of the step
loops (issue 25, item 1: one plan, one dispatch, shared block-step pieces).

Usage:  python benchmarks/driver_speed.py --old /tmp/oldtree [--rounds 3] [--conll-passes 3] [--skip conll,horses]
                                         [--pin CPU] [--json NAME] [--same-process]
        (make the old copy with ``git archive HEAD torch_bcfw | tar -x -C /tmp/oldtree`` before editing)
Writes benchmarks/results/driver_speed.json (or ``--json NAME``) and prints a table.

Every measurement runs in its own child process with ``PYTHONPATH`` pointing at one package (``--old`` or this
working tree; each child reports the ``torch_bcfw.__file__`` it imported), old and new alternating ``--rounds``
times; medians are compared (ratio new / old; targets: OCR and CoNLL seconds per pass <= 1.03, horses overhead
<= 1.05).  In each child numba's compilation is excluded by a
warm-up run first.  Separate processes differ by ~10% from run to run; ``--same-process`` measures both packages in
ONE process instead (the old copy imported as ``torch_bcfw_old``, its absolute imports renamed), ``--rounds``
pairs in the order old, new, new, old, ..., each package with its own data objects, so the ratio is free of the
process-to-process spread.

* OCR-large (fold 0, 6251 words, ``Chain(128, 26)``, ``lam = 0.01``): ``fit(max_passes=20, gap_check=20)``,
  solver seconds per pass (``counters['solver_time'] / passes``, the compiled plain-BCFW kernel);
* CoNLL-2000 (all 8936 sentences, d = 1,643,026): ``--conll-passes`` passes of plain BCFW, solver seconds per pass;
* horses (200 training images, graph cut, the compiled step loop of ``GraphCutDualState``): solver overhead per
  oracle time, median over 5 passes (``benchmarks/horses_oracle.py``'s ``solver_overhead``); with
  ``--same-process`` also the seconds per pass (``horses_pass``);
* mini-batch rounds on OCR-large (``batch_size`` 4, 16, 64; 4 passes), solver seconds per pass (``rounds_tau*``;
  skip with ``--skip rounds``), always in separate processes: with both packages in one process, the copy imported
  second dispatched its rounds kernels ~8x slower (numba typing the arguments of every call), whichever it was;
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
#: the ratio new / old each measure must stay under
TARGETS = {"ocr": "<= 1.03", "conll": "<= 1.03", "horses": "<= 1.05"}


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
    from safetensors.torch import save_file

    weights, histories = {}, {}
    for name, kw in IDENTITY_RUNS.items():
        r = fit(model, data, 0.01, max_passes=10, gap_check=5, **kw)
        histories[name] = [{k: v for k, v in h.to_dict().items() if not any(t in k for t in TIME_KEYS)}
                           for h in r.history]
        weights[name] = r.weights.clone()
    save_file(weights, args.out, metadata={"history": json.dumps(histories)})
    return {}


def child_rounds(args) -> dict:
    from torch_bcfw import fit

    model, data = _ocr()
    out = {}
    for tau in (4, 16, 64):
        fit(model, data, 0.01, max_passes=1, gap_check=1, batch_size=tau)  # compile / load the kernels
        r = fit(model, data, 0.01, max_passes=4, gap_check=4, batch_size=tau)
        out[f"rounds_tau{tau}"] = r.counters["solver_time"] / r.passes
    return out


CHILDREN = {"rounds": child_rounds, "ocr": child_ocr, "conll": child_conll, "horses": child_horses, "identity": child_identity}


def renamed_copy(old: str, dest: str) -> str:
    """Copy the package ``old/torch_bcfw`` to ``dest/torch_bcfw_old`` with its absolute imports renamed; returns
    ``dest``."""
    import re
    import shutil

    target = Path(dest) / "torch_bcfw_old"
    shutil.copytree(Path(old) / "torch_bcfw", target, ignore=shutil.ignore_patterns("__pycache__"))
    for path in target.rglob("*.py"):
        src = path.read_text(encoding="utf-8")
        src = re.sub(r"^(\s*)from torch_bcfw(\.| import)", r"\1from torch_bcfw_old\2", src, flags=re.M)
        src = re.sub(r"^(\s*)import torch_bcfw$", r"\1import torch_bcfw_old as torch_bcfw", src, flags=re.M)
        path.write_text(src, encoding="utf-8")
    return dest


def _horses_overhead(pkg, data, passes: int = 5) -> tuple[float, float]:
    """``horses_oracle.solver_overhead`` for the package ``pkg``: BCFW time outside the oracle per oracle time and
    the seconds per pass, medians over ``passes`` passes after a warm-up pass."""
    import importlib

    GraphCut = importlib.import_module(pkg.__name__ + ".models").GraphCut
    BCFW = importlib.import_module(pkg.__name__ + ".solvers.bcfw").BCFW
    SolverOptions = importlib.import_module(pkg.__name__ + ".solvers.options").SolverOptions
    model = GraphCut(data.n_inputs, 2, loss="balanced", processes=1)
    alg = BCFW(model, data, 1e-2, SolverOptions(max_passes=passes + 1, seed=0, batch_size=1))
    n = len(data)
    alg.advance(n)
    fractions, seconds = [], []
    for _ in range(passes):
        o0, t0 = alg.state.oracle_seconds, time.perf_counter()
        alg.advance(n)
        t = time.perf_counter() - t0
        o = alg.state.oracle_seconds - o0
        fractions.append((t - o) / o)
        seconds.append(t)
    return statistics.median(fractions), statistics.median(seconds)


def paired(args, skip: set) -> dict:
    """Both packages in this process: per measure, ``--rounds`` pairs (old, new, new, old, ...); returns the runs."""
    import importlib

    sys.path.insert(0, args.renamed)
    old = importlib.import_module("torch_bcfw_old")
    import torch_bcfw as new

    pkgs = {"old": old, "new": new}
    out = {"package": {s: p.__file__ for s, p in pkgs.items()}}

    def sub(pkg, name):
        return importlib.import_module(pkg.__name__ + "." + name)

    measures = {}
    ocr_data = None
    if "ocr" not in skip:
        ocr_data = {s: sub(p, "datasets.ocr").load_ocr_split(str(DATA / "ocr"), "large", 0)[0] for s, p in pkgs.items()}
        def ocr(pkg, data, passes=20):
            r = pkg.fit(sub(pkg, "models").Chain(128, 26), data, 0.01, max_passes=passes, gap_check=passes)
            return r.counters["solver_time"] / r.passes
        measures["ocr"] = (ocr, ocr_data, 2)
    if "conll" not in skip:
        def conll(pkg, prob, passes=args.conll_passes):
            r = pkg.fit(prob.model, prob.train, 1.0 / len(prob.train), max_passes=passes, gap_check=passes)
            return r.counters["solver_time"] / r.passes
        data = {s: sub(p, "datasets.conll_chain").load_conll_problem(str(DATA / "conll2000")) for s, p in pkgs.items()}
        measures["conll"] = (conll, data, 1)
    if "horses" not in skip:
        def horses(pkg, data, passes=5):
            return _horses_overhead(pkg, data, passes)  # (overhead, seconds per pass)
        data = {s: sub(p, "datasets.horses").horse_graph_data(DATA / "weizmann_horse", "train", (48, 64))
                for s, p in pkgs.items()}
        measures["horses"] = (horses, data, 1)
    for kind, (run, data, warm) in measures.items():
        for side in ("old", "new"):
            run(pkgs[side], data[side], warm)  # compile / load the kernels
        runs = {"old": [], "new": []}
        for r in range(args.rounds):
            for side in (("old", "new") if r % 2 == 0 else ("new", "old")):
                runs[side].append(run(pkgs[side], data[side]))
        if kind == "horses":
            out["horses_pass"] = {s: [r[1] for r in runs[s]] for s in runs}
            runs = {s: [r[0] for r in runs[s]] for s in runs}
        out[kind] = runs
    return out


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
    ap.add_argument("--skip", default="", help="comma-separated: ocr, conll, horses, rounds, identity")
    ap.add_argument("--child", choices=sorted(CHILDREN) + ["paired"])
    ap.add_argument("--out")
    ap.add_argument("--json", default="driver_speed.json", help="name of the JSON written to benchmarks/results")
    ap.add_argument("--pin", type=int, help="run every child on this CPU only, with one torch thread (steadier timings)")
    ap.add_argument("--same-process", action="store_true", help="both packages in one child process (see above)")
    ap.add_argument("--renamed", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child == "paired":
        if args.pin is not None:
            import torch

            os.sched_setaffinity(0, {args.pin})
            torch.set_num_threads(1)
        print(json.dumps(paired(args, set(filter(None, args.skip.split(","))))))
        return
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
    rows, payload = [], {"rounds": args.rounds, "trees": trees, "pin": args.pin, "measures": {},
                         "same_process": args.same_process}
    together = None
    if args.same_process:
        with tempfile.TemporaryDirectory() as tmp:
            renamed_copy(trees["old"], tmp)
            env = dict(os.environ, PYTHONPATH=os.pathsep.join([trees["new"], str(ROOT / "benchmarks")]))
            cmd = [sys.executable, __file__, "--child", "paired", "--renamed", tmp, "--rounds", str(args.rounds),
                   "--conll-passes", str(args.conll_passes), "--skip", ",".join(skip | {"identity", "rounds"})]
            if args.pin is not None:
                cmd += ["--pin", str(args.pin)]
            p = subprocess.run(cmd, env=env, capture_output=True, text=True)
            if p.returncode != 0:
                raise RuntimeError(f"paired child failed:\n{p.stderr[-3000:]}")
            together = json.loads(p.stdout.strip().splitlines()[-1])
        payload["packages"] = together["package"]
    kinds = (("ocr", "s_per_pass"), ("conll", "s_per_pass"), ("horses", "overhead"))
    if together is not None and "horses" not in skip:
        kinds += (("horses_pass", "s_per_pass"),)
    for kind, metric in kinds:
        if kind in skip:
            continue
        if together is not None:
            runs = {s: [{metric: v} for v in together[kind][s]] for s in ("old", "new")}
            med = {s: statistics.median(r[metric] for r in runs[s]) for s in runs}
            payload["measures"][kind] = {"metric": metric, "runs": runs, "median": med, "ratio": med["new"] / med["old"]}
            rows.append({"measure": f"{kind} {metric}", "old": med["old"], "new": med["new"],
                         "ratio": med["new"] / med["old"], "target": TARGETS.get(kind, "-")})
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
                     "ratio": med["new"] / med["old"], "target": TARGETS.get(kind, "-")})
    if "rounds" not in skip:  # separate processes, old and new alternating (see the module docstring)
        runs = {"old": [], "new": []}
        for _ in range(args.rounds):
            for side in ("old", "new"):
                runs[side].append(run_child("rounds", trees[side], args))
        for tau in (4, 16, 64):
            kind = f"rounds_tau{tau}"
            med = {s: statistics.median(r[kind] for r in runs[s]) for s in runs}
            payload["measures"][kind] = {"metric": "s_per_pass", "runs": {s: [r[kind] for r in runs[s]] for s in runs},
                                         "median": med, "ratio": med["new"] / med["old"]}
            rows.append({"measure": f"{kind} s_per_pass", "old": med["old"], "new": med["new"],
                         "ratio": med["new"] / med["old"], "target": "-"})
    if "identity" not in skip:
        import torch
        from safetensors import safe_open

        with tempfile.TemporaryDirectory() as tmp:
            got = {}
            for side in ("old", "new"):
                path = os.path.join(tmp, f"{side}.safetensors")
                run_child("identity", trees[side], args, ("--out", path))
                with safe_open(path, framework="pt") as f:
                    histories = json.loads(f.metadata()["history"])
                    got[side] = {name: {"weights": f.get_tensor(name), "history": histories[name]}
                                 for name in IDENTITY_RUNS}
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
