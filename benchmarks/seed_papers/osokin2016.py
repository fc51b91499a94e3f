"""Osokin et al. 2016 ("Minding the gaps"), Figures 1-8, run through
``python benchmarks/seed_figures.py --figure osokin-...``:

* ``osokin-fig1`` -- gap sampling's exploitation / staleness trade-off on OCR-small: the duality gap against
  effective passes for uniform sampling and gap sampling with an exact gap pass (refreshing the block-gap
  estimates) every 1, 5, 10, 100 passes or never ("Gap Inf"), and (Fig. 1b) the ratio of the estimates' sum to the
  true gap, and (Fig. 1c) Theorem 2's improvement factor of exact gap sampling over uniform sampling,
  ``chi(g)^3 / chi(C)`` (:func:`chi`), at the exact block gaps ``g`` of the run and the block curvatures estimated as
  the paper did, ``C_i = 4 R_i^2 / (lam n^2)`` with ``R_i`` the largest ``||psi_i(y)||`` over the labelings the
  offline passes returned so far.  The true gap is measured offline after every pass (an extra oracle pass that
  neither refreshes the estimates nor counts as effective passes);
* ``osokin-fig2`` -- the cache regimes: BCFW + gap sampling + cache on OCR-small over a grid of the cache-hit test's
  ``F`` (local) and ``nu`` (global), against gap sampling without a cache; gap against oracle passes and the
  cache-hit rate;
* ``osokin-variants-<problem>`` (Figs. 3, 5, 6) -- the 8 variants ({uniform, gap} sampling x {FW, pairwise} steps x
  {no cache, cache}, ``F = 0.25``, ``nu = 0.01``, cache size 50) on CoNLL, the horses' graph cut, LSP-small (and
  OCR-large), the current iterate, no averaging, the exact gap every ``gap_check`` passes (the paper: 10); the gap
  against effective passes (oracle calls and gap passes / n) and against seconds (solver + gap passes).  ``lam``:
  the paper's panel, translated: the value with the lowest *held-out* task loss over a grid (the paper's "good"
  value was chosen by test error), times the paper's ratio of the panel's value to its good one;
* ``osokin-path-<problem>`` (Figs. 4, 8) -- the epsilon-approximate path (``eps = 0.1``, ``kappa = 0.9``) against
  grid search (``2^15 ... 2^-15``) with and without warm start: cumulative seconds and effective passes against
  ``lam``, with BCFW + gap sampling or BCPFW + gap sampling + cache inside;
* ``osokin-fig7`` -- the effect of ``kappa`` on the path (OCR-small);
* ``osokin-fig7b`` -- the heuristic path (stale gap estimates, no exact pass per breakpoint) against the
  eps-approximate path: the true gap at every breakpoint and the cost (OCR-small).

Each writes ``benchmarks/results/osokin2016_<figure>.json`` (every history) and ``.png``.
"""
from __future__ import annotations

import math
import time

import numpy as np

from common import RESULTS, print_table, write_json
from seed_papers.problems import choose_lam, draw_band, lambda_axes, load, stem

VARIANTS = [
    ("BCFW", "uniform-fw"), ("BCFW + gap", "gap-fw"), ("BCFW + cache", "uniform-fw-cache"),
    ("BCFW + gap + cache", "gap-fw-cache"), ("BCPFW", "uniform-pairwise"), ("BCPFW + gap", "gap-pairwise"),
    ("BCPFW + cache", "uniform-pairwise-cache"), ("BCPFW + gap + cache", "gap-pairwise-cache"),
]
#: per problem: the lam grid the held-out data chooses from, the paper's ratio (panel value / good value) of the
#: panel drawn (Fig. 3: HorseSeg-medium at 10x its good value, LSP-small and CoNLL at their good values),
#: passes, seeds, gap-check interval, seconds per run
VARIANT_SETTINGS = {
    "conll": dict(lams=(0.003, 0.01, 0.03, 0.1), ratio=1.0, passes=40, seeds=5, gap_check=5, budget=300.0,
                  choose_passes=10),
    "horses": dict(lams=(1e-4, 1e-3, 1e-2, 1e-1), ratio=10.0, passes=40, seeds=5, gap_check=5, budget=120.0,
                   choose_passes=10),
    "lsp-small": dict(lams=(0.01, 0.1, 1.0, 10.0), ratio=1.0, passes=100, seeds=5, gap_check=5, budget=120.0,
                      choose_passes=30),
    "ocr-large": dict(lams=(0.001,), ratio=1.0, passes=200, seeds=5, gap_check=10, budget=300.0, choose_passes=0),
}
TARGETS = (0.1, 0.01, 0.001)
VARIANT_COLUMNS = (["variant"] + [f"eff@{t:g}" for t in TARGETS] + [f"s@{t:g}" for t in TARGETS]
                   + ["final_rel_gap", "final_eff", "hit_rate"])


def _color(label: str) -> tuple[str, str, str]:
    """The paper's Fig. 5 legend: cache blue / no cache orange, gap solid / uniform dashed, pairwise circles / FW
    squares."""
    return ("C0" if "cache" in label else "C1", "-" if "gap" in label else "--", "o" if "BCPFW" in label else "s")


def _eff(rec: dict, n: int) -> float:
    return (rec["oracle_calls"] + (rec.get("gap_oracle_calls") or 0)) / n


def _secs(rec: dict) -> float:
    return rec["solver_time"] + (rec.get("gap_time") or 0.0)


def variants(problem: str, seeds=None, passes=None, budget=None, tiny=False, conll_limit=None, lam=None) -> dict:
    """The 8 variants on ``problem`` (:data:`VARIANT_SETTINGS`); ``lam`` given: that value, nothing chosen."""
    from torch_bcfw import fit
    from torch_bcfw.solvers.record import plain_history

    s = dict(VARIANT_SETTINGS[problem])
    if tiny:
        s.update(lams=s["lams"][:2], passes=4, seeds=2, gap_check=2, budget=None, choose_passes=min(2, s["choose_passes"]))
    seeds = list(range(1, (seeds or s["seeds"]) + 1))
    passes, budget = passes or s["passes"], budget if budget is not None else s["budget"]
    t0 = time.perf_counter()
    prob = load(problem, tiny, conll_limit)
    print(f"osokin2016 variants on {problem}: n = {prob.n} ({time.perf_counter() - t0:.0f} s to load)", flush=True)
    fixed = lam is not None
    if fixed:
        good, choice, s["ratio"] = lam, [], 1.0
    elif len(s["lams"]) > 1:
        good, choice = choose_lam(prob, s["lams"], s["choose_passes"], preset="gap-fw")
    else:
        good, choice = s["lams"][0], []
    lam = good * s["ratio"]
    print(f"  held-out choice lam = {good:g}; the figure's lam = {lam:g}", flush=True)
    warm = prob.train[list(range(min(8, prob.n)))]
    common = dict(gap_check=s["gap_check"], averaging=False, check_averaged=False, track_train_loss=False,
                  cache_size=20 if problem == "lsp-small" else 50)
    for _, preset in VARIANTS:  # compile outside the timed runs
        fit(prob.model, warm, lam, preset=preset, max_passes=2, gap_check=1, averaging=False, track_train_loss=False)
    runs = {label: {"preset": preset, "seeds": {}} for label, preset in VARIANTS}
    out = {"figure": f"osokin-variants-{problem}", "problem": problem, "note": prob.note, "n": prob.n, "lam": lam,
           "held_out_lam": good, "lam_ratio": s["ratio"], "lam_choice": choice, "passes": passes, "budget": budget,
           "seeds": [], "options": common, "tiny": tiny, "runs": runs}
    name = stem(f"osokin2016_variants_{problem}" + (f"_lam{lam:g}" if fixed else ""), tiny)
    for seed in seeds:  # round-robin over the variants: the machine's load affects all alike
        for label, preset in VARIANTS:
            r = fit(prob.model, prob.train, lam, preset=preset, seed=seed, max_passes=passes, time_budget=budget,
                    **common)
            h = plain_history(r.history)
            runs[label]["seeds"][str(seed)] = h
            last = h[-1]
            print(f"  seed {seed} {label:20s}: gap {last['gap']:.3g} (rel {last['gap'] / last['primal']:.3g}) at "
                  f"{_eff(last, prob.n):.1f} eff. passes, {_secs(last):.1f} s", flush=True)
        # every finished round of seeds is saved: a long run cut short keeps what it measured
        out["seeds"].append(seed)
        out["seconds"] = time.perf_counter() - t0
        out["table"] = variants_table(out)
        write_json(name + ".json", out)
    print_table(out["table"], VARIANT_COLUMNS)
    variants_plot(out, RESULTS / (name + ".png"))
    return out


def replot_variants(problem: str, tiny: bool = False, lam=None, **_) -> dict:
    """Redraw a variants figure (and its table) from its JSON, e.g. one cut short after some seeds."""
    import json

    name = stem(f"osokin2016_variants_{problem}" + (f"_lam{lam:g}" if lam is not None else ""), tiny)
    out = json.loads((RESULTS / (name + ".json")).read_text())
    done = {str(s) for s in out["seeds"]}
    for run in out["runs"].values():  # the seeds of a round that did not finish are left out
        run["seeds"] = {k: v for k, v in run["seeds"].items() if k in done}
    out["table"] = variants_table(out)
    print_table(out["table"], VARIANT_COLUMNS)
    out.pop("machine", None)
    write_json(name + ".json", out)
    variants_plot(out, RESULTS / (name + ".png"))
    return out


def variants_table(out: dict) -> list[dict]:
    n, rows = out["n"], []
    for label, run in out["runs"].items():
        row = {"variant": label}
        hs = list(run["seeds"].values())
        for t in TARGETS:
            hits = [next(((_eff(r, n), _secs(r)) for r in h if r["gap"] <= t * r["primal"]), None) for h in hs]
            ok = [v for v in hits if v is not None]
            row[f"reached@{t:g}"] = f"{len(ok)}/{len(hits)}"
            row[f"eff@{t:g}"] = float(np.median([v[0] for v in ok])) if len(ok) == len(hits) else None
            row[f"s@{t:g}"] = float(np.median([v[1] for v in ok])) if len(ok) == len(hits) else None
        row["final_rel_gap"] = float(np.median([h[-1]["gap"] / h[-1]["primal"] for h in hs]))
        row["final_gap"] = float(np.median([h[-1]["gap"] for h in hs]))
        row["final_eff"] = float(np.median([_eff(h[-1], n) for h in hs]))
        row["final_seconds"] = float(np.median([_secs(h[-1]) for h in hs]))
        row["hit_rate"] = float(np.median([(h[-1].get("cache_hits") or 0) / max(1, h[-1]["steps"]) for h in hs]))
        rows.append(row)
    return rows


def variants_plot(out: dict, path) -> None:
    from torch_bcfw.plotting import pyplot, save_figure

    n = out["n"]
    fig, axes = pyplot().subplots(1, 2, figsize=(12, 4.6))
    for label, run in out["runs"].items():
        color, style, marker = _color(label)
        for ax, fx in zip(axes, (lambda r: _eff(r, n), _secs)):
            curves = [(np.array([fx(r) for r in h]), np.array([r["gap"] for r in h])) for h in run["seeds"].values()]
            draw_band(ax, curves, label, color, style + marker)
    for ax, xl in zip(axes, ("effective passes (oracle calls and gap passes / n)", "seconds (solver + gap passes)")):
        ax.set_yscale("log")
        ax.set_xlabel(xl)
        ax.set_ylabel("duality gap")
        ax.grid(True, which="both", alpha=0.3)
    axes[1].set_xscale("log")
    axes[0].legend(fontsize=7)
    fig.suptitle(f"Osokin et al. 2016, 8 variants on {out['problem']} (n = {n}), lam = {out['lam']:g}: median and "
                 f"min-max over {len(out['seeds'])} seeds")
    print(f"wrote {save_figure(fig, path)}")


# -- Figure 1: exploitation / staleness ---------------------------------------------------------------------------

STALENESS = (("Uniform", "uniform-fw", None), ("Gap 1", "gap-fw", 1), ("Gap 5", "gap-fw", 5), ("Gap 10", "gap-fw", 10),
             ("Gap 100", "gap-fw", 100), ("Gap Inf", "gap-fw", math.inf))


def chi(x) -> float:
    """Osokin et al.'s non-uniformity measure of a non-negative vector ``x [n]`` (Theorem 2):
    ``sqrt(1 + n^2 Var[p])`` with ``p = x / ||x||_1`` and ``Var[p] = ||p||_2^2 / n - 1 / n^2``; 1 for a uniform
    ``x``, ``sqrt(n)`` for one nonzero entry (``nan`` for ``x = 0``)."""
    x = np.asarray(x, dtype=np.float64)
    total = x.sum()
    if not total > 0:
        return math.nan
    p, n = x / total, len(x)
    return math.sqrt(max(1.0 + n * n * (float(p @ p) / n - 1.0 / (n * n)), 0.0))


def staleness(problem: str = "ocr-small", lam: float = 0.01, seeds=None, passes=None, tiny=False, **_) -> dict:
    """Fig. 1 (a, b, c): each method driven pass by pass; after each pass the exact block gaps at the current ``w``
    (an offline pass: not fed to the solver, not counted) give the true gap, the estimates' ratio to it and
    Theorem 2's factor ``chi(g)^3 / chi(C)``."""
    import torch

    from torch_bcfw.solvers.bcfw import BCFW
    from torch_bcfw.solvers.run import options_for

    seeds = list(range(1, (seeds or (2 if tiny else 5)) + 1))
    passes = int(passes or (4 if tiny else 150))
    prob = load(problem, tiny)
    n = prob.n
    t0 = time.perf_counter()
    runs = {}
    truth_phi = prob.model.joint_feature(prob.train, prob.train.y)  # [n, d]: phi(x_i, y_i), the same for every run
    for label, preset, every in STALENESS:
        runs[label] = {}
        for seed in seeds:
            alg = BCFW(prob.model, prob.train, lam, options_for("bcfw", preset=preset, averaging=False, seed=seed, batch_size=1))
            refreshes, recs = 0, []
            radius = torch.zeros(n, dtype=torch.float64)  # R_i: the largest ||psi_i(y)|| seen so far
            for p in range(1, passes + 1):
                alg.advance(n)
                due = every is not None and (alg.check_requested or (math.isfinite(every) and p % every == 0))
                if due:  # the exact gap pass of the method: refreshes the estimates, counts n oracle calls
                    alg.state.refresh()
                    alg.certificate()
                    alg.check_requested = False
                    refreshes += 1
                with torch.no_grad():
                    g, _, y_star = alg.state.block_gaps()
                    psi = truth_phi - prob.model.joint_feature(prob.train, y_star)
                    radius = torch.maximum(radius, psi.norm(dim=1))
                true_gap = float(g.sum())
                # Fig. 1c: C_i = 4 R_i^2 / (lam n^2); chi is scale-free, so chi(C) = chi(R^2)
                factor = chi(g.clamp(min=0).numpy()) ** 3 / chi((radius ** 2).numpy())
                est = alg.estimated_gap()
                recs.append({"pass": p, "effective_passes": (alg.oracle_calls + refreshes * n) / n, "gap": true_gap,
                             "estimate_ratio": None if est is None or not math.isfinite(est) else est / true_gap,
                             "refreshes": refreshes, "chi_factor": None if math.isnan(factor) else factor})
            runs[label][str(seed)] = recs
        last = [h[-1] for h in runs[label].values()]
        print(f"  {label:8s}: gap {np.median([r['gap'] for r in last]):.3g} after "
              f"{np.median([r['effective_passes'] for r in last]):.0f} effective passes", flush=True)
    out = {"figure": "osokin-fig1", "problem": problem, "note": prob.note, "n": n, "lam": lam, "passes": passes,
           "seeds": seeds, "tiny": tiny, "seconds": time.perf_counter() - t0, "runs": runs}
    marks = [m for m in (10, 25, 50, 100, 150) if m <= passes] or [passes]
    out["table"] = [{"method": label, **{f"gap@{m}": float(np.median([next((r["gap"] for r in h if
                                                                                r["effective_passes"] >= m), h[-1]["gap"])
                                                                          for h in per.values()])) for m in marks},
                     "estimate_ratio_last": _median_or_none([h[-1]["estimate_ratio"] for h in per.values()]),
                     "chi_factor_last": _median_or_none([h[-1].get("chi_factor") for h in per.values()]),
                     "chi_factor_max": _median_or_none([max((r.get("chi_factor") or 0.0) for r in h)
                                                        for h in per.values()])}
                    for label, per in runs.items()]
    print_table(out["table"], ["method"] + [f"gap@{m}" for m in marks]
                + ["estimate_ratio_last", "chi_factor_last", "chi_factor_max"])
    name = stem("osokin2016_fig1", tiny)
    write_json(name + ".json", out)
    _plot_staleness(out, RESULTS / (name + ".png"))
    return out


def _median_or_none(vals):
    vals = [v for v in vals if v is not None]
    return float(np.median(vals)) if vals else None


def _plot_staleness(out, path) -> None:
    from torch_bcfw.plotting import pyplot, save_figure

    fig, axes = pyplot().subplots(1, 3, figsize=(17, 4.4))
    for j, (label, per) in enumerate(out["runs"].items()):
        hs = list(per.values())
        if label in ("Uniform", "Gap 10") and all("chi_factor" in r for h in hs for r in h):
            draw_band(axes[2], [(np.array([r["pass"] for r in h]),
                                 np.array([np.nan if r["chi_factor"] is None else r["chi_factor"] for r in h]))
                                for h in hs], label, f"C{j}")
        draw_band(axes[0], [(np.array([r["effective_passes"] for r in h]), np.array([r["gap"] for r in h]))
                            for h in hs], label, f"C{j}")
        if label != "Uniform":
            draw_band(axes[1], [(np.array([r["pass"] for r in h]),
                                 np.array([np.nan if r["estimate_ratio"] is None else r["estimate_ratio"] for r in h]))
                                for h in hs], label, f"C{j}")
    axes[0].set_xlabel("effective passes (oracle calls and gap passes / n)")
    axes[0].set_ylabel("duality gap (measured offline)")
    axes[1].set_xlabel("passes")
    axes[1].set_ylabel("sum of gap estimates / true gap")
    axes[2].set_xlabel("passes")
    axes[2].set_ylabel("chi(g)^3 / chi(C): Theorem 2's factor")
    for ax in axes:
        ax.set_yscale("log")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"Osokin et al. Fig. 1 on {out['problem']} (n = {out['n']}, lam = {out['lam']:g}): median and "
                 f"min-max over {len(out['seeds'])} seeds")
    print(f"wrote {save_figure(fig, path)}")


# -- Figure 2: the cache regimes ----------------------------------------------------------------------------------

CACHE_GRID = ((0.025, 0.001), (0.025, 0.01), (0.025, 1.0), (0.25, 0.001), (0.25, 0.01), (0.25, 1.0),
              (2.5, 0.001), (2.5, 0.01), (2.5, 1.0))


def cache_regimes(problem: str = "ocr-small", lam: float = 0.01, seeds=None, passes=None, tiny=False, **_) -> dict:
    from torch_bcfw import fit
    from torch_bcfw.solvers.record import plain_history

    seeds = list(range(1, (seeds or (2 if tiny else 5)) + 1))
    passes = passes or (4 if tiny else 100)
    prob = load(problem, tiny)
    n = prob.n
    t0 = time.perf_counter()
    common = dict(gap_check=2 if tiny else 10, averaging=False, check_averaged=False, track_train_loss=False,
                  max_passes=passes, cache_size=50)
    configs = [("no cache", "gap-fw", {})] + [(f"F={F:g}, nu={nu:g}", "gap-fw-cache", {"cache_F": F, "cache_nu": nu})
                                              for F, nu in CACHE_GRID]
    runs = {}
    for label, preset, extra in configs:
        runs[label] = {"preset": preset, "options": extra, "seeds": {}}
        for seed in seeds:
            r = fit(prob.model, prob.train, lam, preset=preset, seed=seed, **common, **extra)
            runs[label]["seeds"][str(seed)] = plain_history(r.history)
        last = [h[-1] for h in runs[label]["seeds"].values()]
        print(f"  {label:22s}: gap {np.median([r['gap'] for r in last]):.3g}, oracle passes "
              f"{np.median([r['oracle_calls'] / n for r in last]):.1f}, hit rate "
              f"{np.median([(r['cache_hits'] or 0) / r['steps'] for r in last]):.2f}", flush=True)
    out = {"figure": "osokin-fig2", "problem": problem, "note": prob.note, "n": n, "lam": lam, "passes": passes,
           "seeds": seeds, "tiny": tiny, "seconds": time.perf_counter() - t0, "runs": runs}
    out["table"] = [{"config": label, "final_gap": float(np.median([h[-1]["gap"] for h in run["seeds"].values()])),
                     "oracle_passes": float(np.median([h[-1]["oracle_calls"] / n for h in run["seeds"].values()])),
                     "effective_passes": float(np.median([_eff(h[-1], n) for h in run["seeds"].values()])),
                     "hit_rate": float(np.median([(h[-1]["cache_hits"] or 0) / h[-1]["steps"]
                                                  for h in run["seeds"].values()]))}
                    for label, run in runs.items()]
    print_table(out["table"], ["config", "final_gap", "oracle_passes", "effective_passes", "hit_rate"])
    name = stem("osokin2016_fig2", tiny)
    write_json(name + ".json", out)
    _plot_cache(out, RESULTS / (name + ".png"))
    return out


def _plot_cache(out, path) -> None:
    from torch_bcfw.plotting import pyplot, save_figure

    n = out["n"]
    fig, axes = pyplot().subplots(1, 2, figsize=(12, 4.4))
    for j, (label, run) in enumerate(out["runs"].items()):
        hs = list(run["seeds"].values())
        style = "k-" if label == "no cache" else ["-", "--", ":"][j % 3]
        color = "k" if label == "no cache" else f"C{(j - 1) // 3}"
        draw_band(axes[0], [(np.array([_eff(r, n) for r in h]), np.array([r["gap"] for r in h])) for h in hs],
                  label, color, style.lstrip("k") or "-")
        draw_band(axes[1], [(np.array([r["steps"] / n for r in h]), np.array([r["gap"] for r in h])) for h in hs],
                  label, color, style.lstrip("k") or "-")
    axes[0].set_xlabel("effective passes (oracle calls and gap passes / n)")
    axes[1].set_xlabel("block iterations / n (cache hits included)")
    for ax in axes:
        ax.set_yscale("log")
        ax.set_ylabel("duality gap")
        ax.grid(True, which="both", alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.suptitle(f"Osokin et al. Fig. 2: cache regimes (F, nu) on {out['problem']} (n = {n}, lam = {out['lam']:g}), "
                 f"gap sampling, median and min-max over {len(out['seeds'])} seeds")
    print(f"wrote {save_figure(fig, path)}")


# -- Figures 4, 7, 8: the regularization path ---------------------------------------------------------------------

def path_vs_grid(problem: str, preset: str = "gap-fw", budget=None, tiny=False, **_) -> dict:
    """Figs. 4 / 8: the eps-approximate path against warm and cold grid search (``eps = 0.1``, ``kappa = 0.9``)."""
    from torch_bcfw.solvers.path import default_grid, grid_search, regularization_path

    budget = budget if budget is not None else (5.0 if tiny else 600.0)
    prob = load(problem, tiny)
    grid = default_grid()
    if tiny:
        grid = grid[::6]
    common = dict(preset=preset, val_data=prob.val, time_budget=budget, track_train_loss=False)
    sweeps = {}
    t0 = time.perf_counter()
    sweeps["path"] = regularization_path(prob.model, prob.train, eps=0.1, kappa=0.9, lam_min=grid[-1], **common)
    for warm in (True, False):
        sweeps["grid (warm)" if warm else "grid (cold)"] = grid_search(prob.model, prob.train, grid, eps=0.1,
                                                                        warm_start=warm, **common)
    rows = []
    for name, sw in sweeps.items():
        last, best = sw.points[-1], sw.best("val_loss")
        rows.append({"method": name, "points": len(sw.points), "stopped_by": sw.stopped_by,
                     "down_to": sw.lower_limit if name == "path" else last.lam, "passes": last.passes,
                     "time_s": last.time, "held_out_lam": best.lam, "held_out_loss": best.val_loss})
    print_table(rows, ["method", "points", "stopped_by", "down_to", "passes", "time_s", "held_out_lam",
                       "held_out_loss"])
    out = {"figure": f"osokin-path-{problem}", "problem": problem, "note": prob.note, "n": prob.n, "preset": preset,
           "eps": 0.1, "kappa": 0.9, "budget_per_method_s": budget, "tiny": tiny,
           "seconds": time.perf_counter() - t0, "rows": rows}
    return _save_sweeps(out, sweeps, stem(f"osokin2016_path_{problem}_{preset}", tiny),
                        f"Osokin et al. Figs. 4 / 8 on {problem} (n = {prob.n}), eps = 0.1, {preset}, "
                        f"{budget:g} s per method")


def kappa_effect(problem: str = "ocr-small", preset: str = "gap-fw", budget=None, tiny=False, **_) -> dict:
    """Fig. 7 (a): the path's cost for several ``kappa``."""
    from torch_bcfw.solvers.path import default_grid, regularization_path

    budget = budget if budget is not None else (5.0 if tiny else 300.0)
    prob = load(problem, tiny)
    lam_min = default_grid()[-1 if not tiny else 12]
    t0 = time.perf_counter()
    sweeps, rows = {}, []
    for kappa in ((0.5, 0.9) if tiny else (0.3, 0.5, 0.7, 0.9, 0.97)):
        sw = regularization_path(prob.model, prob.train, eps=0.1, kappa=kappa, lam_min=lam_min, preset=preset,
                                 time_budget=budget, track_train_loss=False)
        sweeps[f"kappa = {kappa:g}"] = sw
        last = sw.points[-1]
        rows.append({"kappa": kappa, "breakpoints": len(sw.points), "stopped_by": sw.stopped_by,
                     "down_to": sw.lower_limit, "passes": last.passes, "time_s": last.time})
    print_table(rows, ["kappa", "breakpoints", "stopped_by", "down_to", "passes", "time_s"])
    out = {"figure": "osokin-fig7", "problem": problem, "note": prob.note, "n": prob.n, "preset": preset, "eps": 0.1,
           "lam_min": lam_min, "budget_per_kappa_s": budget, "tiny": tiny, "seconds": time.perf_counter() - t0,
           "rows": rows}
    return _save_sweeps(out, sweeps, stem(f"osokin2016_fig7_{problem}", tiny),
                        f"Osokin et al. Fig. 7a on {problem} (n = {prob.n}): the path for several kappa, eps = 0.1, "
                        f"{preset}")


def heuristic_path(model, data, eps: float = 0.1, kappa: float = 0.7, lam_min: float = 1e-5, budget: float = 300.0,
                   preset: str = "gap-fw", seed: int = 1, max_passes: float = 1000) -> dict:
    """Osokin et al.'s heuristic path (App. K, Fig. 7b): Alg. 7 whose inner solver stops when the *stale* block-gap
    estimates of gap sampling sum to ``<= kappa eps``, with no exact gap pass at the breakpoints (so no certificate:
    this lives in the benchmarks, not in the library).  The next breakpoint uses those estimates, ``tau = eps -
    sum g^_i`` and the per-block ``delta_i`` clipped at 0 ("conservative", as the authors' code).  After every
    breakpoint the true gap is measured offline (not counted in passes or seconds).  Returns ``{"points": [{lam,
    estimated_gap, true_gap, passes, time}], "stopped_by"}``."""
    import torch

    from torch_bcfw.solvers.bcfw import BCFW
    from torch_bcfw.solvers.path import breakpoint_ratio, path_options, path_start

    n = len(data)
    opts = path_options(kappa * eps, preset=preset, seed=seed)
    start = path_start(model, data, eps, kappa, opts)
    state, alg, lam = start.state, start.algorithm, start.lam
    oracle, seconds = start.oracle_calls, start.seconds
    est = alg.exact_block_gaps[0].clamp_min(0.0).cpu()  # the start's exact pass: exact block gaps
    points = [{"lam": lam, "estimated_gap": float(est.sum()), "true_gap": start.certificate.gap,
               "passes": oracle / n, "time": seconds}]
    stopped = ""
    chunk = max(1, n // 10)
    while not stopped:
        deltas = state.block_deltas().clamp_min(0.0).cpu()
        rho = breakpoint_ratio(float(est.sum()), float(deltas.sum()), eps)
        if rho is None:
            stopped = "complete"
            break
        if lam <= lam_min:
            stopped = "lam_min"
        elif seconds >= budget:
            stopped = "time_budget"
        if stopped:
            break
        lam_next = max(rho * lam, lam_min)
        rho = lam_next / lam
        guess = (est + (1.0 - rho) * deltas).numpy()
        state.rescale_lam(lam_next)
        lam = lam_next
        alg = BCFW(model, data, lam, opts, state=state)
        alg.set_exact_block_gaps(guess)
        calls0, t0 = alg.oracle_calls, time.perf_counter()
        while alg.estimated_gap() > kappa * eps and alg.oracle_calls - calls0 < max_passes * n:
            alg.advance(chunk)
            if alg.converged:
                break
        seconds += time.perf_counter() - t0
        oracle += alg.oracle_calls - calls0
        est = torch.as_tensor(alg.estimates.est, dtype=torch.float64).clamp_min(0.0).cpu()
        with torch.no_grad():
            true_gap = float(state.block_gaps()[0].sum())
        points.append({"lam": lam, "estimated_gap": float(est.sum()), "true_gap": true_gap, "passes": oracle / n,
                       "time": seconds})
    return {"points": points, "stopped_by": stopped, "eps": eps, "kappa": kappa, "preset": preset}


def heuristic_vs_certified(problem: str = "ocr-small", budget=None, tiny=False, **_) -> dict:
    """Fig. 7 (b): the heuristic path (``kappa`` 0.7 and 0.9) against the eps-approximate path (``kappa`` 0.9):
    the true gap at every breakpoint and the cumulative seconds and passes, ``eps = 0.1``, BCFW + gap sampling."""
    from torch_bcfw.solvers.path import default_grid, regularization_path

    budget = budget if budget is not None else (5.0 if tiny else 300.0)
    prob = load(problem, tiny)
    lam_min = default_grid()[-1 if not tiny else 12]
    t0 = time.perf_counter()
    runs, rows = {}, []
    cert = regularization_path(prob.model, prob.train, eps=0.1, kappa=0.9, lam_min=lam_min, preset="gap-fw",
                               time_budget=budget, track_train_loss=False)
    runs["eps-approximate path (kappa 0.9)"] = {"points": [{"lam": p.lam, "true_gap": p.gap, "passes": p.passes,
                                                            "time": p.time} for p in cert.points],
                                                "stopped_by": cert.stopped_by}
    for kappa in ((0.7,) if tiny else (0.7, 0.9)):
        runs[f"heuristic path (kappa {kappa:g})"] = heuristic_path(prob.model, prob.train, eps=0.1, kappa=kappa,
                                                                   lam_min=lam_min, budget=budget)
    for label, r in runs.items():
        pts = r["points"]
        gaps = [p["true_gap"] for p in pts]
        rows.append({"method": label, "breakpoints": len(pts), "stopped_by": r["stopped_by"],
                     "down_to": pts[-1]["lam"], "passes": pts[-1]["passes"], "time_s": pts[-1]["time"],
                     "max_true_gap": max(gaps), "above_eps": sum(g > 0.1 for g in gaps)})
    print_table(rows, ["method", "breakpoints", "stopped_by", "down_to", "passes", "time_s", "max_true_gap",
                       "above_eps"])
    out = {"figure": "osokin-fig7b", "problem": problem, "note": prob.note, "n": prob.n, "eps": 0.1,
           "lam_min": lam_min, "budget_per_method_s": budget, "tiny": tiny, "seconds": time.perf_counter() - t0,
           "rows": rows, "runs": runs}
    name = stem(f"osokin2016_fig7b_{problem}", tiny)
    write_json(name + ".json", out)
    _plot_heuristic(out, RESULTS / (name + ".png"))
    return out


def _plot_heuristic(out: dict, path) -> None:
    from torch_bcfw.plotting import pyplot, save_figure

    fig, axes = pyplot().subplots(1, 2, figsize=(12, 4.4))
    for j, (label, r) in enumerate(out["runs"].items()):
        lams = [p["lam"] for p in r["points"]]
        axes[0].plot(lams, [max(p["true_gap"], 1e-12) for p in r["points"]], "o-", markersize=2, color=f"C{j}",
                     label=label)
        axes[1].plot(lams, [p["time"] for p in r["points"]], "-", color=f"C{j}", label=label)
    axes[0].axhline(out["eps"], color="k", linestyle="--", linewidth=1, label="eps")
    lambda_axes(axes, ("true duality gap at the breakpoint (offline)", "cumulative seconds"), (True, True))
    fig.suptitle(f"Osokin et al. Fig. 7b on {out['problem']} (n = {out['n']}): heuristic against eps-approximate "
                 f"path, eps = {out['eps']:g}, BCFW + gap sampling")
    print(f"wrote {save_figure(fig, path)}")


def _save_sweeps(out: dict, sweeps: dict, name: str, title: str) -> dict:
    """Write the figure's JSON (with every sweep) and its PNG: cumulative seconds and passes against ``lam``."""
    from torch_bcfw.plotting import pyplot, save_figure

    out["sweeps"] = {k: v.to_dict() for k, v in sweeps.items()}
    write_json(name + ".json", out)
    fig, axes = pyplot().subplots(1, 2, figsize=(12, 4.4))
    for j, (label, sw) in enumerate(sweeps.items()):
        style = "-" if label.startswith(("path", "kappa")) else "o-"
        lams = [p.lam for p in sw.points]
        axes[0].plot(lams, [p.time for p in sw.points], style, markersize=3, color=f"C{j}", label=label)
        axes[1].plot(lams, [p.passes for p in sw.points], style, markersize=3, color=f"C{j}", label=label)
    lambda_axes(axes, ("cumulative seconds", "cumulative effective passes"), (True, True))
    fig.suptitle(title)
    print(f"wrote {save_figure(fig, RESULTS / (name + '.png'))}")
    return out
