"""Command line: ``torch-bcfw fit --config configs/ocr.yaml``, ``torch-bcfw evaluate``,
``torch-bcfw compare --config configs/ocr_variants.yaml`` (several solvers x seeds, see
:mod:`torch_bcfw.compare`), ``torch-bcfw path --config configs/ocr_path.yaml`` (the regularization path with
model selection, see :mod:`torch_bcfw.solvers.path`) and ``torch-bcfw train --config configs/ocr_cnn.yaml`` (a Lightning
experiment, see :mod:`torch_bcfw.lightning.cli`; needs the ``lightning`` extra).

A config is a YAML file::

    data: {name: ocr, path: path/to/ocr, split: large, fold: 0}
    lam: 0.01
    solver: bcfw
    options: {max_passes: 100, gap_check: 10, gap_tol: 0.01}
    output: runs/ocr

Any entry can be overridden with ``--set key.sub=value`` (the value is parsed as YAML).
``fit`` shows a progress bar, prints a final table and writes ``model.pt``, ``history.csv``,
``history.json`` and ``gap.png`` to the output folder.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import yaml

__all__ = ["main", "load_config"]


def _set(cfg: dict, dotted: str, value) -> None:
    keys = dotted.split(".")
    cur = cfg
    for k in keys[:-1]:
        cur = cur.setdefault(k, {})
        if not isinstance(cur, dict):
            raise ValueError(f"--set {dotted}: {k!r} is not a section")
    cur[keys[-1]] = value


def load_config(path, overrides=()) -> dict:
    """Read a YAML config and apply ``key.sub=value`` overrides."""
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"config file {p} not found")
    cfg = yaml.safe_load(p.read_text()) or {}
    if not isinstance(cfg, dict):
        raise ValueError(f"{p}: a config must be a mapping")
    for item in overrides:
        if "=" not in item:
            raise ValueError(f"--set expects key=value, got {item!r}")
        k, v = item.split("=", 1)
        _set(cfg, k.strip(), yaml.safe_load(v))
    return cfg


def _table(rows: list[tuple[str, str]]) -> str:
    width = max(len(k) for k, _ in rows)
    line = "+" + "-" * (width + 2) + "+" + "-" * 26 + "+"
    out = [line] + [f"| {k:<{width}} | {v:>24} |" for k, v in rows] + [line]
    return "\n".join(out)


def _fmt(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.6g}"
    return str(v)


def cmd_fit(args) -> int:
    from .datasets.registry import load_problem
    from .fit import fit
    from .plotting import plot_histories

    cfg = load_config(args.config, args.set)
    known = {"data", "lam", "solver", "options", "output"}
    unknown = sorted(set(cfg) - known)
    if unknown:
        raise ValueError(f"unknown config section(s) {unknown}; expected {sorted(known)}")
    if "lam" not in cfg:
        raise ValueError("the config needs a 'lam' entry (regularisation, > 0)")
    model, train, test = load_problem(cfg.get("data", {}))
    options = dict(cfg.get("options") or {})
    options.setdefault("progress", not args.quiet)
    result = fit(model, train, float(cfg["lam"]), cfg.get("solver", "bcfw"), test_data=test, **options)
    out = Path(args.output or cfg.get("output") or "runs/fit")
    out.mkdir(parents=True, exist_ok=True)
    result.save(out / "model.pt")
    result.write_history_csv(out / "history.csv")
    result.write_history_json(out / "history.json")
    plot_histories({f"{result.solver} lam={result.lam:g}": result.history}, out / "gap.png",
                   title=f"{cfg.get('data', {}).get('name', '')} {result.solver}")
    s = result.summary()
    rows = [("solver", s["solver"]), ("lam", _fmt(s["lam"])), ("n train", str(len(train))),
            ("effective passes", _fmt(s["passes"])), ("stopped by", s["stopped_by"]),
            ("model", f"{s['selected']} iterate"), ("duality gap (certified)", _fmt(s["gap"])), ("primal", _fmt(s["primal"])),
            ("train error", _fmt(s["train_loss"])), ("test error", _fmt(s["test_loss"])),
            ("time (s)", _fmt(s["time"])), ("output", str(out))]
    print(_table(rows))
    return 0


def cmd_compare(args) -> int:
    from .compare import plot_comparison, run_comparison, summarise, write_results

    cfg = load_config(args.config, args.set)
    log = (lambda *a: None) if args.quiet else print
    results = run_comparison(cfg, log=log)
    out = Path(args.output or cfg.get("output") or "runs/compare")
    path = write_results(results, out)
    name = cfg.get("data", {}).get("name", "")
    plot_comparison(results, out / "comparison.png",
                    title=f"{name} lam = {results['lam']:g}, n = {results['n']}: median and min-max over "
                          f"{len(results['seeds'])} seeds")
    rows = summarise(results)
    width = max(len(r["solver"]) for r in rows)
    print(f"{'solver':<{width}}  {'gap':>10}  {'gap/primal':>10}  {'passes':>8}  {'time s':>8}  {'oracle':>9}  {'hits':>9}")
    for r in rows:
        print(f"{r['solver']:<{width}}  {r['gap']:10.3e}  {r['gap/primal']:10.3e}  {r['passes']:8.1f}  {r['time']:8.1f}  "
              f"{r['oracle_calls']:9d}  {r['cache_hits']:9d}")
    print(f"wrote {path} and {out / 'comparison.png'}")
    return 0


def cmd_path(args) -> int:
    """The eps-approximate regularization path (and optionally the grid searches) of a config's data; model
    selection on the validation set; JSON + PNG."""
    from .datasets.registry import load_problem_with_validation
    from .solvers.certificate import task_loss
    from .solvers.path import grid_search, plot_sweep, regularization_path

    cfg = load_config(args.config, args.set)
    known = {"data", "path", "grid", "options", "output"}
    unknown = sorted(set(cfg) - known)
    if unknown:
        raise ValueError(f"unknown config section(s) {unknown}; expected {sorted(known)}")
    pcfg = dict(cfg.get("path") or {})
    bad = sorted(set(pcfg) - {"eps", "kappa", "lam_min", "time_budget", "max_breakpoints"})
    if bad:
        raise ValueError(f"unknown path option(s) {bad}; expected eps, kappa, lam_min, time_budget, max_breakpoints")
    gcfg = dict(cfg.get("grid") or {})
    bad = sorted(set(gcfg) - {"warm", "cold", "lams", "time_budget"})
    if bad:
        raise ValueError(f"unknown grid option(s) {bad}; expected warm, cold, lams, time_budget")
    model, train, val, test = load_problem_with_validation(cfg.get("data", {}))
    if val is None:
        print("torch-bcfw: note: no data.validation entry: lambda is selected on the training loss", file=sys.stderr)
    options = dict(cfg.get("options") or {})
    eps = float(pcfg.get("eps", 0.1))
    log = not args.quiet
    path = regularization_path(model, train, eps=eps, kappa=float(pcfg.get("kappa", 0.9)),
                               lam_min=float(pcfg.get("lam_min", 1e-5)), val_data=val,
                               time_budget=pcfg.get("time_budget"), max_breakpoints=pcfg.get("max_breakpoints"),
                               progress=log, **options)
    out = Path(args.output or cfg.get("output") or "runs/path")
    out.mkdir(parents=True, exist_ok=True)
    sweeps = {"path": path}
    path.save_json(out / "path.json", with_weights=bool(args.weights))
    for kind in ("warm", "cold"):
        if gcfg.get(kind):
            sw = grid_search(model, train, gcfg.get("lams"), eps=eps, warm_start=kind == "warm", val_data=val,
                             time_budget=gcfg.get("time_budget"), progress=log, **options)
            sw.save_json(out / f"grid_{kind}.json")
            sweeps[f"grid ({kind})"] = sw
    key = "val_loss" if val is not None else "train_loss"
    best = path.best(key)
    test_loss = task_loss(model, test, best.w.to(test.device)) if test is not None else None
    summary = {"lam_inf": path.lam_inf, "breakpoints": len(path.points), "lower_limit": path.lower_limit,
               "stopped_by": path.stopped_by, "passes": path.points[-1].passes, "time": path.points[-1].time,
               "selected_lam": best.lam, "selected_by": key, "selected_val_loss": best.val_loss,
               "selected_train_loss": best.train_loss, "selected_gap": best.gap, "test_loss": test_loss}
    for name, sw in sweeps.items():
        if name != "path":
            b = sw.best(key)
            summary[name] = {"passes": sw.points[-1].passes if sw.points else 0.0,
                             "time": sw.points[-1].time if sw.points else 0.0, "selected_lam": b.lam,
                             "test_loss": task_loss(model, test, b.w.to(test.device)) if test is not None else None}
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    name = cfg.get("data", {}).get("name", "")
    plot_sweep(sweeps, out / "path.png", title=f"{name}: loss along the regularization path (eps = {eps:g})")
    rows = [("breakpoints", str(len(path.points))), ("lam_inf", _fmt(path.lam_inf)),
            ("covered down to", _fmt(path.lower_limit)), ("stopped by", path.stopped_by),
            ("effective passes", _fmt(path.points[-1].passes)), ("time (s)", _fmt(path.points[-1].time)),
            ("selected lam", _fmt(best.lam)), (key.replace("_", " "), _fmt(getattr(best, key))),
            ("certified gap there", _fmt(best.gap)), ("test error", _fmt(test_loss)), ("output", str(out))]
    print(_table(rows))
    return 0


def cmd_evaluate(args) -> int:
    from .datasets.registry import load_problem
    from .fit import FitResult

    result = FitResult.load(args.model)
    cfg = load_config(args.config, args.set) if args.config else {"data": {}}
    model, train, test = load_problem(cfg.get("data", {}))
    if model.n_features != result.model.n_features:
        raise ValueError(f"the saved model has d = {result.model.n_features} but the data gives d = {model.n_features}")
    report = {"train_error": result.evaluate(train), "test_error": result.evaluate(test),
              "certified_gap": result.gap, "lam": result.lam, "passes": result.passes}
    print(_table([(k, _fmt(v)) for k, v in report.items()]))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="torch-bcfw", description="Structured SVMs trained by Block-Coordinate Frank-Wolfe.")
    sub = p.add_subparsers(dest="command", required=True)
    f = sub.add_parser("fit", help="train a model from a YAML config")
    f.add_argument("--config", required=True)
    f.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a config entry")
    f.add_argument("--output", help="output folder (default: the config's 'output')")
    f.add_argument("--quiet", action="store_true", help="no progress bar")
    f.set_defaults(func=cmd_fit)
    e = sub.add_parser("evaluate", help="evaluate a saved model on a config's data")
    e.add_argument("--model", required=True, help="model.pt written by 'fit'")
    e.add_argument("--config", help="config whose 'data' section names the data")
    e.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    e.add_argument("--json", help="also write the figures to this JSON file")
    e.set_defaults(func=cmd_evaluate)
    c = sub.add_parser("compare", help="run several solvers x seeds on one problem; JSON of the histories and "
                                       "gap plots (median and min-max band over seeds)")
    c.add_argument("--config", required=True)
    c.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a config entry")
    c.add_argument("--output", help="output folder (default: the config's 'output')")
    c.add_argument("--quiet", action="store_true", help="no per-run log lines")
    c.set_defaults(func=cmd_compare)
    pa = sub.add_parser("path", help="eps-approximate regularization path (Osokin et al. 2016) with model selection on "
                                     "a validation set; optional warm / cold grid searches; JSON and a PNG")
    pa.add_argument("--config", required=True)
    pa.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a config entry")
    pa.add_argument("--output", help="output folder (default: the config's 'output')")
    pa.add_argument("--weights", action="store_true", help="also store every breakpoint's weights in path.json")
    pa.add_argument("--quiet", action="store_true", help="no per-breakpoint log lines")
    pa.set_defaults(func=cmd_path)
    # the arguments of `train` are LightningCLI's: main() hands them over before argparse sees them
    sub.add_parser("train", add_help=False,
                   help="train a backbone + structured head with Lightning from a LightningCLI YAML config "
                        "(torch-bcfw train --help lists the options)")
    return p


def cmd_train(argv) -> int:
    try:
        from .lightning.cli import train_main
    except ImportError as exc:
        print(f"torch-bcfw: error: {exc}", file=sys.stderr)
        return 2
    try:
        return train_main(list(argv))
    except (ValueError, FileNotFoundError, TypeError) as exc:
        print(f"torch-bcfw: error: {exc}", file=sys.stderr)
        return 2


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "train":
        return cmd_train(argv[1:])
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (ValueError, FileNotFoundError, TypeError) as exc:
        print(f"torch-bcfw: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
