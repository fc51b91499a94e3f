"""The BCFW paper's solver comparison (Lacoste-Julien et al. 2013, Fig. 1 and 4): primal suboptimality and test
error against effective passes for BCFW, BCFW-wavg, SSG, SSG-wavg, online-EG (chains), batch FW, the 1-slack
cutting plane and (when available) dual extragradient, with the median and the min-max band over seeds.

    python benchmarks/seed_figures.py --figure ocr-0.01 [--passes 100] [--seeds 3] [--split large]
    python benchmarks/seed_figures.py --figure all --split small --passes 30 --seeds 2   # reduced: minutes

Figures: ``ocr-0.01``, ``ocr-0.001``, ``ocr-1/n`` (OCR, ``lam`` 0.01, 0.001 and ``1/n``), ``conll-1/n`` (CoNLL-2000
chunking, sparse features), ``matching-0.001`` (Hansards word alignment).  Primal suboptimality is
``P(w) - D*`` with ``D*`` the best dual value certified by any run of the figure (an upper bound on the true
suboptimality, exact up to the certified gap of a long reference run of BCFW, which is printed and saved); the x-axis is effective passes (training
oracle calls / n, online-EG's line-search calls included; the exact gap passes that measure the curves are not
counted).  Batch methods (FW, cutting plane) are drawn as the lower envelope of their primal values, the
stochastic ones as the median and min-max band over ``--seeds`` runs.  "-wavg" is the weighted average of the
iterates (its primal from the same runs; its test error is that of the iterate with the lower certified primal,
which is the average in these runs).  Writes ``benchmarks/results/seed_figures_<figure>.json`` and ``.png``.
"""
from __future__ import annotations

import argparse
import math
import sys
import time

import numpy as np

sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parent))
from common import DATA, RESULTS, print_table, write_json  # noqa: E402

from torch_bcfw import fit  # noqa: E402
from torch_bcfw.solvers.run import SOLVERS  # noqa: E402
from torch_bcfw.solvers.record import plain_history  # noqa: E402

FIGURES = ("ocr-0.01", "ocr-0.001", "ocr-1/n", "conll-1/n", "matching-0.001")

#: the figures of the other seed papers: name -> (module under benchmarks/, function, keyword arguments); each function
#: takes ``seeds``, ``passes``, ``budget``, ``tiny`` (and ``conll_limit``) and writes its JSON and PNG; the module's
#: ``replot_<function>`` (where there is one) redraws them from the JSON (``--replot``)
PAPER_FIGURES = {
    "shah-digits": ("seed_papers.shah2015", "run", {"problem": "digits"}),
    "shah-ocr": ("seed_papers.shah2015", "run", {"problem": "ocr-small"}),
    "shah-horses": ("seed_papers.shah2015", "run", {"problem": "horses"}),
    "osokin-fig1": ("seed_papers.osokin2016", "staleness", {}),
    "osokin-fig2": ("seed_papers.osokin2016", "cache_regimes", {}),
    "osokin-variants-conll": ("seed_papers.osokin2016", "variants", {"problem": "conll"}),
    "osokin-variants-horses": ("seed_papers.osokin2016", "variants", {"problem": "horses"}),
    "osokin-variants-lsp-small": ("seed_papers.osokin2016", "variants", {"problem": "lsp-small"}),
    "osokin-variants-ocr-large": ("seed_papers.osokin2016", "variants", {"problem": "ocr-large"}),
    "osokin-variants-ocr-large-0.1": ("seed_papers.osokin2016", "variants", {"problem": "ocr-large", "lam": 0.1}),
    "osokin-path-horses": ("seed_papers.osokin2016", "path_vs_grid", {"problem": "horses", "preset": "gap-fw"}),
    "osokin-path-horses-cache": ("seed_papers.osokin2016", "path_vs_grid",
                                 {"problem": "horses", "preset": "gap-pairwise-cache"}),
    "osokin-path-ocr-small": ("seed_papers.osokin2016", "path_vs_grid", {"problem": "ocr-small", "preset": "gap-fw"}),
    "osokin-fig7": ("seed_papers.osokin2016", "kappa_effect", {}),
    "osokin-fig7-horses": ("seed_papers.osokin2016", "kappa_effect", {"problem": "horses"}),
    "osokin-fig7b": ("seed_papers.osokin2016", "heuristic_vs_certified", {}),
    "osokin-fig7b-horses": ("seed_papers.osokin2016", "heuristic_vs_certified", {"problem": "horses"}),
}


def run_paper_figure(name: str, seeds=None, passes=None, budget=None, tiny=False, conll_limit=None,
                     replot=False) -> dict:
    """Run one figure of :data:`PAPER_FIGURES` (its JSON and PNG go to ``benchmarks/results/``)."""
    import importlib

    module, function, kwargs = PAPER_FIGURES[name]
    mod = importlib.import_module(module)
    if replot:
        if not hasattr(mod, f"replot_{function}"):
            raise SystemExit(f"{name} has no --replot")
        return getattr(mod, f"replot_{function}")(**kwargs, tiny=tiny)
    fn = getattr(mod, function)
    extra = {"conll_limit": conll_limit} if kwargs.get("problem") == "conll" else {}
    return fn(**kwargs, seeds=seeds, passes=passes, budget=budget, tiny=tiny, **extra)

#: (label, solver, options, stochastic, chains only, curve): curve "last" (the iterate; averaging off, so its test
#: error is the iterate's) or "avg" (the weighted average, certified at every check; its test error is that of the
#: iterate with the lower certified primal, the average in these runs)
METHODS = [
    ("BCFW", "bcfw", {"averaging": False}, True, False, "last"),
    ("BCFW-wavg", "bcfw", {"averaging": True}, True, False, "avg"),
    ("SSG", "ssg", {"averaging": False}, True, False, "last"),
    ("SSG-wavg", "ssg", {"averaging": True}, True, False, "avg"),
    ("online-EG", "online-eg", {"averaging": False}, True, True, "last"),
    ("FW", "fw", {"averaging": False}, False, False, "last"),
    ("cutting plane", "cutting-plane", {"averaging": False}, False, False, "last"),
    ("extragradient", "extragradient", {"averaging": False}, False, False, "last"),
    ("extragradient-avg", "extragradient", {"averaging": True}, False, False, "avg"),
    # the paper's App. F, Fig. 2: the predefined step sizes 2n / (k + 2n) (BCFW) and 2 / (k + 2) (FW)
    ("BCFW (fixed step)", "bcfw", {"averaging": False, "step": "fixed"}, True, False, "last"),
    ("FW (fixed step)", "fw", {"averaging": False, "step": "fixed"}, False, False, "last"),
]
#: solvers whose ``max_passes`` counts iterations that make 2 oracle calls per example (the extragradient's
#: prediction and correction): they get half the passes, so every method ends at the same effective passes
TWO_CALLS_PER_ITERATION = {"extragradient"}


def problem(figure: str, split: str, conll_limit: int | None):
    name, lam_s = figure.split("-", 1)
    if name == "ocr":
        from torch_bcfw import Chain
        from torch_bcfw.datasets.ocr import load_ocr_split

        train, test = load_ocr_split(DATA / "ocr", split, 0)
        model = Chain(128, 26)
    elif name == "conll":
        from torch_bcfw.datasets.conll_chain import load_conll_problem

        prob = load_conll_problem(DATA / "conll2000", limit=conll_limit, test_limit=conll_limit)
        model, train, test = prob.model, prob.train, prob.test
    else:
        from torch_bcfw.datasets.registry import load_problem

        model, train, test = load_problem({"name": "hansards", "path": str(DATA / "hansards_alignment")})
    lam = 1.0 / len(train) if lam_s == "1/n" else float(lam_s)
    return model, train, test, lam


def runs_of(figure, model, train, test, lam, passes, seeds, gap_check, methods=None):
    chains = figure.startswith(("ocr", "conll"))
    out = {}
    done = {}
    for label, solver, extra, stochastic, chains_only, curve in METHODS:
        if solver not in SOLVERS or (chains_only and not chains) or (methods is not None and label not in methods):
            continue
        key = (solver, tuple(sorted(extra.items())))
        if key not in done:  # one set of runs gives the last and the averaged iterate's curves
            done[key] = []
            for seed in (seeds if stochastic else [seeds[0]]):
                per_iter = 2 if solver in TWO_CALLS_PER_ITERATION else 1
                opts = dict(max_passes=passes / per_iter, gap_check=max(1, round(gap_check / per_iter)), seed=seed,
                            track_train_loss=False, check_averaged=True)
                opts.update(extra)
                t0 = time.perf_counter()
                try:
                    r = fit(model, train, lam, solver, test_data=test, **opts)
                except ValueError as exc:  # e.g. a solver that needs an oracle this model lacks
                    print(f"  {label}: skipped ({exc})")
                    done[key] = None
                    break
                print(f"  {label} seed {seed}: {time.perf_counter() - t0:.1f} s, {r.passes:.1f} passes, "
                      f"gap {r.gap if r.gap is None else f'{r.gap:.3g}'}")
                done[key].append(plain_history(r.history))
        if done[key] is None:
            continue
        out[label] = {"solver": solver, "curve": curve, "stochastic": stochastic, "histories": done[key]}
    return out


def best_dual(runs, reference=None) -> float:
    """The best certified dual value of the figure's runs and of the reference run (a lower bound on P*)."""
    hists = [h for run in runs.values() for h in run["histories"]] + ([reference] if reference else [])
    return max(d for h in hists for rec in h for d in (rec.get("dual"), rec.get("dual_avg")) if d is not None)


def curves(run, d_star, x="passes"):
    """Per seed: (x, primal suboptimality, test error) of the run's curve; ``x`` is ``"passes"`` (effective passes)
    or ``"solver_time"`` (seconds in the solver's steps, the gap checks that measure the curve excluded)."""
    out = []
    for h in run["histories"]:
        pk = "primal_avg" if run["curve"] == "avg" else "primal"
        pts = [(rec[x], rec[pk] - d_star, rec.get("test_loss")) for rec in h if rec.get(pk) is not None]
        if not run["stochastic"]:  # batch methods: the lower envelope of the primal (the best point so far)
            best, env = math.inf, []
            for p, s, t in pts:
                if s < best:
                    best, bt = s, t
                env.append((p, best, bt))
            pts = env
        out.append(pts)
    return out


def summary(label, run, d_star, marks):
    """Median over seeds of the suboptimality and the test error at the first check at or past each mark."""
    row = {"method": label}
    cs = curves(run, d_star)
    for m in marks:
        vals = [next(((s, t) for p, s, t in c if p >= m - 1e-9), (None, None)) for c in cs]
        subs = [v[0] for v in vals if v[0] is not None]
        errs = [v[1] for v in vals if v[1] is not None]
        row[f"subopt@{m:g}"] = float(np.median(subs)) if subs else None
        row[f"test@{m:g}"] = float(np.median(errs)) if errs else None
    row["seconds"] = float(np.median([h[-1]["solver_time"] for h in run["histories"]]))
    return row


def plot(figure, runs, d_star, path, title, x="passes"):
    from torch_bcfw.plotting import pyplot, save_figure

    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for j, (label, run) in enumerate(runs.items()):
        cs = curves(run, d_star, x)
        grid = sorted({p for c in cs for p, _, _ in c})
        for ax, k in ((axes[0], 1), (axes[1], 2)):
            ys = []
            for c in cs:  # each seed interpolated onto the union of the checks' passes (online-EG's vary by seed)
                p = np.array([q[0] for q in c], dtype=float)
                v = np.array([np.nan if q[k] is None else q[k] for q in c], dtype=float)
                ys.append(np.interp(grid, p, v, left=np.nan, right=np.nan) if p.size else np.full(len(grid), np.nan))
            ys = np.array(ys, dtype=float)
            if k == 1:
                ys = np.clip(ys, 1e-12, None)
            style = "--" if "wavg" in label else (":" if "fixed" in label else "-")
            keep = ~np.isnan(ys).all(0)
            grid_k, ys = np.asarray(grid)[keep], ys[:, keep]
            ax.plot(grid_k, np.nanmedian(ys, 0), style, color=f"C{j}", marker=".", label=label)
            if ys.shape[0] > 1:
                ax.fill_between(grid_k, np.nanmin(ys, 0), np.nanmax(ys, 0), color=f"C{j}", alpha=0.15)
    axes[0].set_yscale("log")
    axes[0].set_ylabel("primal suboptimality (vs best certified dual)")
    axes[1].set_ylabel("test loss (the task loss: weighted link errors / words)" if figure.startswith("matching")
                       else "test error (the task loss)")
    for ax in axes:
        ax.set_xlabel("effective passes" if x == "passes" else "seconds (solver steps; gap checks excluded)")
        if x != "passes":
            ax.set_xscale("log")
        ax.grid(True, which="both", alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle(title)
    return save_figure(fig, path)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--figure", choices=FIGURES + tuple(PAPER_FIGURES) + ("all",), default="ocr-0.01",
                    help="all: the figures of Lacoste-Julien et al. (the other papers' figures run one at a time)")
    ap.add_argument("--split", choices=("large", "small"), default="large", help="OCR split (small: n = 626)")
    ap.add_argument("--passes", type=float, default=None, help="default: 100 (each other paper's figure: its own)")
    ap.add_argument("--seeds", type=int, default=None, help="default: 3 (each other paper's figure: its own)")
    ap.add_argument("--budget", type=float, default=None, help="seconds per run (the other papers' figures)")
    ap.add_argument("--tiny", action="store_true",
                    help="a few examples and passes: runs the figure's code in seconds (the heavy test); writes *_tiny.*")
    ap.add_argument("--gap-check", type=int, default=5)
    ap.add_argument("--conll-limit", type=int, default=None, help="first sentences of CoNLL train and test only")
    ap.add_argument("--reference-passes", type=float, default=1000, help="passes of the reference run (D*)")
    ap.add_argument("--reference-gap", type=float, default=1e-6, help="the reference run stops at this certified gap")
    ap.add_argument("--methods", default=None,
                    help="comma-separated labels of the methods to run (default: all): " + ", ".join(m[0] for m in METHODS))
    ap.add_argument("--replot", action="store_true", help="redraw the figure's PNGs from its JSON")
    ap.add_argument("--tag", default="", help="appended to the output names (a subset of methods run apart)")
    args = ap.parse_args(argv)
    methods = None if args.methods is None else [m.strip() for m in args.methods.split(",") if m.strip()]
    unknown = sorted(set(methods or ()) - {m[0] for m in METHODS})
    if unknown:
        ap.error(f"unknown methods {unknown}; choose from {[m[0] for m in METHODS]}")
    if args.figure in PAPER_FIGURES:
        run_paper_figure(args.figure, args.seeds, args.passes, args.budget, args.tiny, args.conll_limit, args.replot)
        return
    if args.tiny:
        args.passes, args.seeds, args.reference_passes, args.gap_check, args.conll_limit = 2, 1, 5, 1, 30
    args.passes = 100 if args.passes is None else args.passes
    figures = FIGURES if args.figure == "all" else (args.figure,)
    seeds = list(range(1, (args.seeds or 3) + 1))
    for figure in figures:
        if args.replot:
            replot(stem_of(figure, args.split) + (f"_{args.tag}" if args.tag else ""))
            continue
        model, train, test, lam = problem(figure, args.split, args.conll_limit)
        if args.tiny:
            train, test = train[list(range(30))], test[list(range(30))]
            lam = 1.0 / len(train) if figure.endswith("1/n") else lam
        print(f"{figure}: n = {len(train)}, lam = {lam:g}, {args.passes:g} passes, seeds {seeds}")
        t0 = time.perf_counter()
        # the reference: a long run of the BCFW variant with the fastest convergence here, for D* (as the paper's
        # "long BCFW run"); suboptimalities are P(w) - D*, exact up to the certified gap of this run
        ref = fit(model, train, lam, "bcfw", preset="gap-pairwise", max_passes=args.reference_passes, gap_check=10,
                  gap_tol=args.reference_gap, track_train_loss=False)
        print(f"  reference: {ref.passes:.0f} passes of BCFW (gap-pairwise), certified gap {ref.gap:.3g}")
        runs = runs_of(figure, model, train, test, lam, args.passes, seeds, args.gap_check, methods)
        d_star = best_dual(runs, plain_history(ref.history))
        best_gap = min(rec.gap for rec in ref.history if rec.gap is not None)
        gc = args.gap_check
        marks = sorted({m for m in (gc, 2 * gc, 4 * gc, 10 * gc, 20 * gc, args.passes) if m <= args.passes})
        rows = [summary(label, run, d_star, marks) for label, run in runs.items()]
        print_table(rows, ["method"] + [f"subopt@{m:g}" for m in marks] + [f"test@{marks[-1]:g}", "seconds"])
        stem = stem_of(figure, args.split) + (f"_{args.tag}" if args.tag else "") + ("_tiny" if args.tiny else "")
        write_json(stem + ".json", {
            "figure": figure, "n": len(train), "lam": lam, "passes": args.passes, "seeds": seeds,
            "split": args.split if figure.startswith("ocr") else None, "best_dual": d_star,
            "reference_certified_gap": best_gap, "reference_passes": ref.passes, "seconds": time.perf_counter() - t0, "table": rows,
            "runs": {k: {kk: vv for kk, vv in v.items()} for k, v in runs.items()},
            "command": "python benchmarks/seed_figures.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        })
        plots(figure, runs, d_star, stem, len(train), len(seeds))


def stem_of(figure: str, split: str) -> str:
    return "seed_figures_" + figure.replace("/", "_over_") + (f"_{split}" if figure.startswith("ocr") else "")


def plots(figure, runs, d_star, stem, n, n_seeds) -> None:
    """The figure against effective passes and against seconds."""
    plot(figure, runs, d_star, RESULTS / (stem + ".png"), f"{figure} (n = {n}): median and min-max over {n_seeds} seeds")
    plot(figure, runs, d_star, RESULTS / (stem + "_seconds.png"),
         f"{figure} (n = {n}) against time: median and min-max over {n_seeds} seeds", x="solver_time")


def replot(stem: str) -> None:
    import json

    d = json.loads((RESULTS / (stem + ".json")).read_text())
    plots(d["figure"], d["runs"], d["best_dual"], stem, d["n"], len(d["seeds"]))
    print(f"redrew {stem}.png and {stem}_seconds.png")


if __name__ == "__main__":
    main()
