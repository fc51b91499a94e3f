"""``torch-bcfw compare``: several solvers x several seeds on one problem, in the style of Fig. 3 of Osokin et al.
2016 (duality gap, log scale, against effective passes and against time; median over the seeds with the min-max
band).  A config (YAML)::

    data: {name: ocr, path: path/to/ocr, split: large, fold: 0}
    lam: 0.001                        # or 1/n
    seeds: [1, 2, 3, 4, 5]
    options: {max_passes: 100, gap_check: 10}                 # shared
    solvers:
      - {label: BCFW, preset: uniform-fw}
      - {label: batch FW, solver: fw, options: {max_passes: 50}}
      - {label: cutting plane, solver: cutting-plane, seeds: [1]}
    output: runs/ocr_variants

``y`` picks what the figure draws: ``gap`` (default: each run's certified gap) or ``suboptimality`` (each check's
primal minus the best dual certified by any run).  Effective passes count every oracle call, gap passes included.
Writes ``comparison.json`` and ``comparison.png``; medians and figures use finished runs only (see
:func:`run_comparison` for Ctrl-C).
"""
from __future__ import annotations

import json
import math
import time
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from .checks import check_known
from .solvers.record import plain_history

__all__ = ["run_comparison", "plot_comparison", "curve", "summarise", "finished_runs", "run_status", "COMPARE_KEYS"]

COMPARE_KEYS = {"data", "lam", "seeds", "options", "solvers", "output", "y"}
Y_AXES = ("gap", "suboptimality")


def effective_passes(rec: dict, n: int) -> float:
    """(training oracle calls + gap-check oracle calls) / n."""
    return (rec["oracle_calls"] + rec.get("gap_oracle_calls", 0)) / n


def run_status(run: dict) -> str:
    """``"finished"`` or ``"interrupted"`` of one seed's run (results written before runs had a ``status``:
    from their ``stopped_by``)."""
    return run.get("status") or ("interrupted" if run.get("stopped_by") == "interrupted" else "finished")


def finished_runs(solver_run: dict) -> list[dict]:
    """The finished seed runs of one solver of the results (the only ones any median or plot uses)."""
    return [s for s in solver_run["seeds"].values() if run_status(s) == "finished"]


def run_comparison(cfg: dict, model=None, train=None, log=print, callbacks=None) -> dict:
    """Run every solver of ``cfg`` with every seed; returns the JSON-serialisable results.

    ``model`` / ``train`` may be given directly (then ``cfg["data"]`` is not loaded); ``callbacks`` are passed to
    every timed run (not the warm-ups).  Ctrl-C stops the comparison: the results so far are returned with
    ``status: "interrupted"`` (the cut seed run too) and ``interrupted_at`` (``{"solver", "seed"}``,
    ``{"solver", "phase": "warm-up"}`` or ``{"phase": "between runs"}``); otherwise ``status`` is ``"finished"``.
    """
    from .datasets.registry import load_problem
    from .fit import fit

    check_known(cfg, sorted(COMPARE_KEYS), "compare config section")
    if "lam" not in cfg:
        raise ValueError("the config needs a 'lam' entry (regularisation, > 0)")
    y = cfg.get("y", "gap")
    if y not in Y_AXES:
        raise ValueError(f"compare config: y must be one of {list(Y_AXES)}, got {y!r}")
    solvers = cfg.get("solvers") or []
    if not solvers:
        raise ValueError("the config needs a non-empty 'solvers' list")
    seeds = [int(s) for s in (cfg.get("seeds") or [1])]
    if model is None:
        model, train, _ = load_problem(cfg.get("data", {}))
    lam = config_lam(cfg["lam"], len(train))
    shared = dict(cfg.get("options") or {})
    out = {"lam": lam, "n": len(train), "seeds": seeds, "data": cfg.get("data", {}), "status": "finished",
           "y": y, "runs": {}}
    warm = train[list(range(min(len(train), 32)))]
    where: dict = {"phase": "between runs"}
    try:
        for spec in solvers:
            spec = dict(spec)
            label = spec.pop("label", None) or spec.get("preset") or spec.get("solver", "bcfw")
            solver = spec.pop("solver", "bcfw")
            run_seeds = [int(x) for x in spec.pop("seeds", None) or seeds]
            opts = {**shared, **dict(spec.pop("options", None) or {})}
            opts.update(spec)  # preset and any option given at the solver's top level
            # warm-up on a few examples so that compilation and first-call costs are not timed
            where = {"solver": label, "phase": "warm-up"}
            w = fit(model, warm, lam, solver, **{**opts, "max_passes": 2, "gap_check": 1, "progress": False})
            if w.stopped_by == "interrupted":
                raise KeyboardInterrupt
            runs = {}
            for seed in run_seeds:
                where = {"solver": label, "seed": seed}
                t0 = time.perf_counter()
                r = fit(model, train, lam, solver, seed=seed, callbacks=callbacks, **opts)
                status = "interrupted" if r.stopped_by == "interrupted" else "finished"
                runs[str(seed)] = {"history": plain_history(r.history), "stopped_by": r.stopped_by, "status": status,
                                   "wall": time.perf_counter() - t0}
                out["runs"][label] = {"solver": solver, "options": r.options.to_dict(), "seeds": runs}
                if status == "interrupted":
                    log(f"{label:28s} seed {seed}: interrupted (not counted)")
                    raise KeyboardInterrupt
                where = {"phase": "between runs"}
                last = runs[str(seed)]["history"][-1]
                gap = "none (no certificate)" if last["gap"] is None else f"{last['gap']:.3e}"
                log(f"{label:28s} seed {seed}: gap {gap}  passes {effective_passes(last, len(train)):7.1f}  "
                    f"oracle {last['oracle_calls']}  hits {last.get('cache_hits', 0)}  "
                    f"time {last['solver_time'] + last['gap_time']:.1f}s")
    except KeyboardInterrupt:
        out["status"] = "interrupted"
        out["interrupted_at"] = where
    return out


def config_lam(value, n: int) -> float:
    """``lam`` of a compare config: a number > 0, or the string ``"1/n"`` (one over the ``n`` training examples)."""
    from .checks import check_lam

    if value == "1/n":
        return 1.0 / n
    try:
        return check_lam(value)
    except (TypeError, ValueError):
        raise ValueError(f"compare config: lam must be a number > 0 or \"1/n\", got {value!r}") from None


def best_dual(results: dict) -> float | None:
    """``D*``: the largest dual value (last or averaged iterate) certified by any finished run, a lower bound on the
    optimum; ``None`` when no run has a dual (e.g. SSG only)."""
    duals = [d for run in results["runs"].values() for s in finished_runs(run) for r in s["history"]
             for d in (r.get("dual"), r.get("dual_avg")) if d is not None]
    return max(duals) if duals else None


def returned_primal(rec: dict) -> float:
    """Primal value of the model a check returns: the lower of the last and the averaged iterate's."""
    return min(p for p in (rec["primal"], rec.get("primal_avg")) if p is not None)


def curve(history: list, n: int, x: str = "passes", y: str = "gap",
          d_star: float | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``(x, y)`` of one run: ``x`` effective passes (``"passes"``) or seconds (``"time"``); ``y`` a history
    column (``"gap"``) or ``"suboptimality"`` (:func:`returned_primal` minus ``d_star``)."""
    xs, ys = [], []
    for r in history:
        if y == "suboptimality":
            v = None if d_star is None else returned_primal(r) - d_star
        else:
            v = r.get(y)
        if v is None:
            continue
        xs.append(effective_passes(r, n) if x == "passes" else r["solver_time"] + r["gap_time"])
        ys.append(v)
    return np.asarray(xs, dtype=float), np.asarray(ys, dtype=float)


def _band(curves: list, npts: int = 200):
    """Median and min / max over seeds of ``log10(gap)``, on a grid over the x range all seeds cover."""
    curves = [(x, y) for x, y in curves if len(x)]
    if not curves:
        return None
    lo = max(x[0] for x, _ in curves)
    hi = min(x[-1] for x, _ in curves)
    if hi <= lo:
        hi = max(x[-1] for x, _ in curves)
    grid = np.linspace(lo, hi, npts)
    tiny = 1e-300
    ys = np.stack([np.interp(grid, x, np.log10(np.maximum(y, tiny))) for x, y in curves])
    return grid, 10 ** np.median(ys, 0), 10 ** ys.min(0), 10 ** ys.max(0)


def _style(opts: dict, j: int) -> dict:
    """Fig. 5's legend: cache blue / no cache orange, gap sampling solid / uniform dashed, pairwise circle,
    FW square, away triangle."""
    if opts.get("sampling") not in ("uniform", "perm", "gap"):
        return {"color": f"C{j % 10}", "linestyle": "-", "marker": None}
    return {
        "color": "tab:blue" if opts.get("cache") else "tab:orange",
        "linestyle": "-" if opts.get("sampling") == "gap" else "--",
        "marker": {"pairwise": "o", "away": "^"}.get(opts.get("step_rule"), "s"),
    }


def plot_comparison(results: dict, path, title: str | None = None) -> Path:
    """Gap or suboptimality (``results["y"]``) against effective passes and seconds: a median line and min-max
    band per solver."""
    from .plotting import pyplot, save_figure, style_axes

    n = results["n"]
    y = results.get("y", "gap")
    d_star = best_dual(results) if y == "suboptimality" else None
    fig, axes = pyplot().subplots(1, 2, figsize=(12, 4.6))
    for j, (label, run) in enumerate(results["runs"].items()):
        st = _style(run.get("options", {}), j)
        if run.get("solver", "bcfw") == "mp-bcfw":
            st = {"color": "tab:green", "linestyle": "-", "marker": "D"}
        elif run.get("solver", "bcfw") != "bcfw":
            st = {"color": "black", "linestyle": ":", "marker": None}
        for ax, x in zip(axes, ("passes", "time")):
            band = _band([curve(s["history"], n, x, y, d_star) for s in finished_runs(run)])
            if band is None:
                continue
            grid, med, lo, hi = band
            every = max(1, len(grid) // 8)
            ax.plot(grid, med, color=st["color"], linestyle=st["linestyle"], marker=st["marker"], markevery=every,
                    markersize=4, linewidth=1.6, label=label)
            ax.fill_between(grid, lo, hi, color=st["color"], alpha=0.15, linewidth=0)
    style_axes(axes, ("effective passes (oracle calls / n, gap passes included)", "time (s)"), legend_size=7)
    if y == "suboptimality":
        axes[0].set_ylabel("primal suboptimality (vs the best certified dual)")
    seeds = len(results.get("seeds", []))
    fig.suptitle(title or f"lam = {results['lam']:g}, n = {n}: median and min-max over {seeds} seeds")
    return save_figure(fig, path)


def first_reaching(history: list, n: int, target: float, relative: bool = True):
    """Effective passes and seconds at the first check whose gap (``/ primal`` if ``relative``) is ``<= target``;
    ``(None, None)`` if never."""
    for r in history:
        g = r.get("gap")
        if g is None:
            continue
        v = g / r["primal"] if relative else g
        if v <= target:
            return effective_passes(r, n), r["solver_time"] + r["gap_time"]
    return None, None


def summarise(results: dict) -> list[dict]:
    """One row per solver with a finished run: medians over its finished runs (``runs`` of them) of the final gap
    (``None`` without a certificate), suboptimality against :func:`best_dual`, effective passes, time, oracle
    calls and hits."""
    n = results["n"]
    d_star = best_dual(results)
    rows = []

    def median(vals):
        vals = [v for v in vals if v is not None]
        return float(np.median(vals)) if vals else None

    for label, run in results["runs"].items():
        last = [s["history"][-1] for s in finished_runs(run) if s["history"]]
        if not last:
            continue
        rows.append({
            "solver": label,
            "runs": len(last),
            "gap": median([r["gap"] for r in last]),
            "gap/primal": median([None if r["gap"] is None else r["gap"] / r["primal"] for r in last]),
            "suboptimality": None if d_star is None else median([returned_primal(r) - d_star for r in last]),
            "passes": float(np.median([effective_passes(r, n) for r in last])),
            "time": float(np.median([r["solver_time"] + r["gap_time"] for r in last])),
            "oracle_calls": int(np.median([r["oracle_calls"] for r in last])),
            "cache_hits": int(np.median([r.get("cache_hits", 0) for r in last])),
            "approx_steps": int(np.median([r.get("approx_steps") or 0 for r in last])),  # mp-bcfw
        })
    return rows


def write_results(results: dict, out: Path) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    p = out / "comparison.json"

    def clean(o):
        if isinstance(o, float) and not math.isfinite(o):
            return None
        if isinstance(o, Mapping):  # dicts and history records
            return {k: clean(v) for k, v in o.items()}
        if isinstance(o, (list, tuple)):
            return [clean(v) for v in o]
        return o

    p.write_text(json.dumps(clean(results), indent=1))
    return p
