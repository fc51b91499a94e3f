"""Shah, Kolmogorov & Lampert 2015 (MP-BCFW), Figures 4-6: MP-BCFW and MP-BCFW-avg against BCFW and BCFW-avg.

Run through ``python benchmarks/seed_figures.py --figure shah-digits | shah-ocr | shah-horses``.

Protocol (the paper's Sec. 4): ``lam = 1/n``, all training data, the objective's three curves per method: primal
suboptimality ``P(w) - D_best`` (``D_best``: the highest dual value any run of the figure certified), dual
suboptimality ``P_best - D(alpha)`` (``P_best``: the lowest primal value observed), and the duality gap
``P(w) - D(alpha)``, each against exact oracle calls / n ("oracle convergence", Fig. 4) and against solver seconds
("runtime convergence", Fig. 5; the exact gap checks that measure the curves are excluded, as the paper leaves out
its bound evaluations).  One BCFW run per seed gives BCFW (the iterate) and BCFW-avg (its weighted average); one
MP-BCFW run gives MP-BCFW and MP-BCFW-avg (the best mixture of its two averages).  Both visit the blocks in a fresh
permutation per pass; MP-BCFW has the paper's defaults (``N = 1000``, ``T = 10``, ``M = 1000``, ``r = 1``) and the
paper's wall-clock rule for the approximate passes (``mp_clock="wall"``).  Median and min-max band over the seeds
(the paper: 10 repeats).  Figure 6: the mean working-set size (planes per block) and the approximate passes per
outer iteration of MP-BCFW against time.

Writes ``benchmarks/results/shah2015_<problem>.json`` (every history), ``.png`` (Figs. 4 and 5: two rows) and
``_planes.png`` (Fig. 6).
"""
from __future__ import annotations

import time

import numpy as np

from common import RESULTS, print_table, write_json
from seed_papers.problems import draw_band, load, stem

METHODS = (("BCFW", "bcfw", "last"), ("BCFW-avg", "bcfw", "avg"), ("MP-BCFW", "mp-bcfw", "last"),
           ("MP-BCFW-avg", "mp-bcfw", "avg"))
DEFAULTS = {"digits": dict(passes=60, seeds=10, budget=120.0), "ocr-small": dict(passes=60, seeds=10, budget=120.0),
            "horses": dict(passes=40, seeds=10, budget=120.0)}


def _options(solver: str, passes: float, budget: float | None) -> dict:
    opts = dict(sampling="perm", averaging=True, check_averaged=True, gap_check=1, max_passes=passes,
                time_budget=budget, track_train_loss=False)
    if solver == "mp-bcfw":
        opts["mp_clock"] = "wall"  # the paper's rule: gain per second of the approximate passes
    return opts


def run(problem: str, seeds: int | None = None, passes: float | None = None, budget: float | None = None,
        tiny: bool = False) -> dict:
    from torch_bcfw import fit
    from torch_bcfw.solvers.record import plain_history

    d = dict(DEFAULTS.get(problem, DEFAULTS["digits"]))
    if tiny:
        d = dict(passes=3, seeds=2, budget=None)
    seeds = list(range(1, (seeds or d["seeds"]) + 1))
    passes, budget = passes or d["passes"], budget if budget is not None else d["budget"]
    prob = load(problem, tiny)
    lam = 1.0 / prob.n
    print(f"shah2015 {problem}: n = {prob.n}, lam = 1/n = {lam:.3g}, {passes:g} exact passes or {budget} s, "
          f"seeds {seeds}", flush=True)
    warm = prob.train[list(range(min(8, prob.n)))]
    for solver in ("bcfw", "mp-bcfw"):  # compile the kernels outside the timed runs
        fit(prob.model, warm, lam, solver, **{**_options(solver, 2, None)})
    t_all = time.perf_counter()
    runs = {"bcfw": {}, "mp-bcfw": {}}
    for seed in seeds:  # round-robin so that the machine's load affects both alike
        for solver in runs:
            r = fit(prob.model, prob.train, lam, solver, seed=seed, **_options(solver, passes, budget))
            h = plain_history(r.history)
            runs[solver][str(seed)] = h
            last = h[-1]
            print(f"  seed {seed} {solver:8s}: gap {last['gap']:.3g} after {last['oracle_calls'] / prob.n:.0f} exact "
                  f"passes, {last['solver_time']:.1f} s; approximate passes {last.get('approx_passes')}", flush=True)
    out = {"figure": f"shah-{problem}", "problem": problem, "note": prob.note, "n": prob.n, "lam": lam,
           "passes": passes, "budget": budget, "seeds": seeds, "tiny": tiny,
           "seconds": time.perf_counter() - t_all, "runs": runs}
    out.update(bounds(runs))
    out["table"] = table(out)
    print_table(out["table"], columns(out))
    name = stem(f"shah2015_{problem}", tiny)
    write_json(name + ".json", out)
    plot(out, RESULTS / (name + ".png"))
    plot_planes(out, RESULTS / (name + "_planes.png"))
    return out


def bounds(runs: dict) -> dict:
    """The best (lowest) primal and best (highest) dual value observed in any run of the figure."""
    recs = [rec for per_seed in runs.values() for h in per_seed.values() for rec in h]
    return {"best_primal": min(v for r in recs for v in (r.get("primal"), r.get("primal_avg")) if v is not None),
            "best_dual": max(v for r in recs for v in (r.get("dual"), r.get("dual_avg")) if v is not None)}


def series(out: dict, label: str, solver: str, which: str, x: str):
    """Per seed: ``(x, primal subopt, dual subopt, gap)`` arrays of one method."""
    n, pb, db = out["n"], out["best_primal"], out["best_dual"]
    pk, dk = ("primal", "dual") if which == "last" else ("primal_avg", "dual_avg")
    res = []
    for h in out["runs"][solver].values():
        xs = np.array([r["oracle_calls"] / n if x == "oracle" else r["solver_time"] for r in h])
        p = np.array([r[pk] for r in h], dtype=float)
        dd = np.array([r[dk] for r in h], dtype=float)
        res.append((xs, p - db, pb - dd, p - dd))
    return res


def _reach(xs, vals, target):
    hit = np.nonzero(vals <= target)[0]
    return float(xs[hit[0]]) if hit.size else None


def table(out: dict) -> list[dict]:
    """Per method (medians over the seeds): primal suboptimality after a quarter, half and all of the exact passes,
    the final gap and seconds, and the exact passes and seconds it needs to reach BCFW's final primal
    suboptimality (``to_bcfw_final``; ``reached`` counts the seeds that do)."""
    rows = []
    ref = float(np.median([s[1][-1] for s in series(out, "BCFW", "bcfw", "last", "oracle")]))
    for label, solver, which in METHODS:
        so = series(out, label, solver, which, "oracle")
        st = series(out, label, solver, which, "time")
        row = {"method": label}
        for frac in (0.25, 0.5, 1.0):
            mark = max(1.0, frac * out["passes"])
            row[f"subopt@{mark:g}"] = float(np.median([s[1][min(np.searchsorted(s[0], mark - 1e-9), len(s[0]) - 1)]
                                                       for s in so]))
        ps = [_reach(s[0], s[1], ref) for s in so]
        ts = [_reach(s[0], s[1], ref) for s in st]
        ok = [(p, t) for p, t in zip(ps, ts) if p is not None]
        row["reached"] = f"{len(ok)}/{len(ps)}"
        row["passes_to_bcfw_final"] = float(np.median([p for p, _ in ok])) if len(ok) == len(ps) else None
        row["s_to_bcfw_final"] = float(np.median([t for _, t in ok])) if len(ok) == len(ps) else None
        row["final_gap"] = float(np.median([s[3][-1] for s in so]))
        row["final_exact_passes"] = float(np.median([s[0][-1] for s in so]))
        row["final_seconds"] = float(np.median([s[0][-1] for s in st]))
        rows.append(row)
    return rows


def columns(out: dict) -> list[str]:
    marks = [f"subopt@{max(1.0, f * out['passes']):g}" for f in (0.25, 0.5, 1.0)]
    return ["method"] + marks + ["passes_to_bcfw_final", "s_to_bcfw_final", "reached", "final_gap", "final_seconds"]


def replot_run(problem: str, tiny: bool = False, **_) -> dict:
    """Recompute the table and redraw the PNGs of a figure from its JSON."""
    import json

    name = stem(f"shah2015_{problem}", tiny)
    out = json.loads((RESULTS / (name + ".json")).read_text())
    out["table"] = table(out)
    print_table(out["table"], columns(out))
    out.pop("machine", None)
    write_json(name + ".json", out)
    plot(out, RESULTS / (name + ".png"))
    plot_planes(out, RESULTS / (name + "_planes.png"))
    return out


def plot(out: dict, path) -> None:
    from torch_bcfw.plotting import pyplot, save_figure

    fig, axes = pyplot().subplots(2, 3, figsize=(15, 8))
    for j, (label, solver, which) in enumerate(METHODS):
        style = "--" if which == "avg" else "-"
        for row, x in enumerate(("oracle", "time")):
            s = series(out, label, solver, which, x)
            for col in range(3):
                draw_band(axes[row, col], [(c[0], c[col + 1]) for c in s], label, f"C{j // 2}", style)
    titles = ("primal suboptimality", "dual suboptimality", "duality gap")
    for col, t in enumerate(titles):
        for row, xl in enumerate(("exact oracle calls / n", "solver seconds (gap checks excluded)")):
            ax = axes[row, col]
            ax.set_yscale("log")
            if row == 1:
                ax.set_xscale("log")
            ax.set_xlabel(xl)
            ax.set_title(t if row == 0 else f"{t} against time")
            ax.grid(True, which="both", alpha=0.3)
    axes[0, 0].legend(fontsize=8)
    fig.suptitle(f"Shah et al. 2015 on {out['problem']} (n = {out['n']}, lam = 1/n): median and min-max over "
                 f"{len(out['seeds'])} seeds")
    print(f"wrote {save_figure(fig, path)}")


def plot_planes(out: dict, path) -> None:
    """Fig. 6: MP-BCFW's mean planes per block and approximate passes per outer iteration against time."""
    from torch_bcfw.plotting import pyplot, save_figure

    fig, axes = pyplot().subplots(1, 2, figsize=(11, 4))
    planes, approx = [], []
    for h in out["runs"]["mp-bcfw"].values():
        t = np.array([r["solver_time"] for r in h])
        planes.append((t, np.array([r.get("planes_mean") or np.nan for r in h], dtype=float)))
        ap = np.array([r.get("approx_passes") or 0 for r in h], dtype=float)
        approx.append((t, np.diff(ap, prepend=0.0)))
    draw_band(axes[0], planes, "planes per block", "C1")
    draw_band(axes[1], approx, "approximate passes per exact pass", "C1")
    for ax, yl in zip(axes, ("mean working-set size (planes)", "approximate passes per outer iteration")):
        ax.set_xlabel("solver seconds")
        ax.set_xscale("log")
        ax.set_ylabel(yl)
        ax.grid(True, alpha=0.3)
    fig.suptitle(f"MP-BCFW dynamics on {out['problem']} (n = {out['n']}): median and min-max over "
                 f"{len(out['seeds'])} seeds")
    print(f"wrote {save_figure(fig, path)}")
