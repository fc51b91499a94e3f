"""Command line: ``torch-bcfw fit``, ``evaluate``, ``export``, ``convert``, ``compare`` (:mod:`torch_bcfw.compare`), ``path``
(:mod:`torch_bcfw.solvers.path`) and ``train`` (Lightning, :mod:`torch_bcfw.lightning.cli`).

A config is a YAML file::

    data: {name: ocr, path: path/to/ocr, split: large, fold: 0}
    lam: 0.01
    solver: bcfw
    options: {max_passes: 100, gap_check: 10, gap_tol: 0.01}
    output: runs/ocr

Any entry can be overridden with ``--set key.sub=value`` (parsed as YAML).  ``fit`` writes ``model.safetensors``
(without the dual state), ``checkpoint.safetensors`` (what ``--resume`` continues), ``history.csv``, ``history.json``
and ``gap.png`` (``docs/formats.md``).
"""
from __future__ import annotations

import argparse
import contextlib
import errno
import json
import os
import re
import signal
import sys
import tempfile
from pathlib import Path

import yaml

from .checks import check_known

#: the files of a run in its output folder: the model (no dual state) and the checkpoint ``--resume`` continues
MODEL_FILE, CHECKPOINT_FILE = "model.safetensors", "checkpoint.safetensors"

__all__ = ["main", "load_config"]


def _set(cfg: dict, dotted: str, value) -> None:
    keys = dotted.split(".")
    if not all(keys):
        raise ValueError(f"--set {dotted}: empty key")
    cur = cfg
    for k in keys[:-1]:
        cur = cur.setdefault(k, {})
        if not isinstance(cur, dict):
            raise ValueError(f"--set {dotted}: {k!r} is not a section")
    cur[keys[-1]] = value


class _ConfigLoader(yaml.SafeLoader):
    """YAML's safe loader with YAML 1.2's floats: ``1e-3`` and ``5E4`` are numbers (PyYAML reads them as strings)."""


_ConfigLoader.yaml_implicit_resolvers = {k: list(v) for k, v in yaml.SafeLoader.yaml_implicit_resolvers.items()}
_ConfigLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?$|^[-+]?\.(?:inf|Inf|INF)$|^\.(?:nan|NaN|NAN)$"),
    list("-+0123456789."),
)


def _parse_yaml(text: str, where: str):
    """Parse a config with a one-line error naming ``where``, the line and the column."""
    try:
        return yaml.load(text, Loader=_ConfigLoader)  # noqa: S506 - a SafeLoader subclass
    except RecursionError:
        raise ValueError(f"{where}: YAML nested too deeply to be a config") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        loc = f"{where}, line {mark.line + 1}, column {mark.column + 1}" if mark is not None else where
        problem = getattr(exc, "problem", None) or str(exc).strip().splitlines()[0]
        raise ValueError(f"{loc}: malformed YAML: {problem}") from None


def load_config(path, overrides=()) -> dict:
    """Read a YAML config and apply ``key.sub=value`` overrides (malformed YAML: ``ValueError`` with the line); the
    data paths are resolved (:func:`resolve_data_paths`)."""
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"config file {p} not found")
    cfg = _parse_yaml(p.read_text(), str(p)) or {}
    if not isinstance(cfg, dict):
        raise ValueError(f"{p}: a config must be a mapping")
    for item in overrides:
        if "=" not in item:
            raise ValueError(f"--set expects key=value, got {item!r}")
        k, v = item.split("=", 1)
        _set(cfg, k.strip(), _parse_yaml(v, f"--set {item}"))
    resolve_data_paths(cfg, p)
    return cfg


#: the entries of a config's ``data`` section that name a file or folder
DATA_PATH_KEYS = ("path", "cache_dir")


def resolve_data_paths(cfg: dict, config_file: Path) -> None:
    """Resolve the relative paths of ``cfg["data"]`` in place: kept where they exist from the working directory,
    else made absolute where they exist beside ``config_file``; a ``data.path`` found in neither place (and not to
    be downloaded) raises ``FileNotFoundError``."""
    data = cfg.get("data")
    if not isinstance(data, dict):
        return
    for key in DATA_PATH_KEYS:
        value = data.get(key)
        if not isinstance(value, str) or not value or Path(value).expanduser().is_absolute():
            continue
        here = Path(value)
        beside = config_file.parent / value
        if here.exists():
            continue
        if beside.exists():
            data[key] = str(beside.resolve())
        elif key == "path" and not data.get("download"):
            raise FileNotFoundError(
                f"data.path {value!r} not found: looked at {os.path.abspath(here)} (relative to the working directory) and "
                f"{os.path.abspath(beside)} (relative to the config {config_file}); set data.path in the config or with "
                "--set data.path=DIR")


def check_output_folder(out) -> Path:
    """Create ``out`` if needed and check that files can be written there, before any work is done."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise ValueError(f"the output {out} exists and is not a folder")
    try:
        out.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=out):
            pass
    except OSError as exc:
        raise ValueError(f"cannot write to the output folder {out}: {exc.strerror or exc}") from None
    return out


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


_FIT_SECTIONS = ("data", "lam", "solver", "options", "output")


def _fit_settings(cfg: dict) -> tuple[float, str, dict]:
    """``(lam, solver, options)`` of a fit config, every entry checked before any data is loaded."""
    from .checks import check_lam
    from .solvers.run import options_for

    check_known(cfg, _FIT_SECTIONS, "config section")
    if "lam" not in cfg:
        raise ValueError("the config needs a 'lam' entry (regularisation, > 0)")
    if not isinstance(cfg.get("data"), dict):
        raise ValueError("the config needs a 'data' section naming the dataset (e.g. data: {name: ocr, path: ...})")
    lam = check_lam(cfg["lam"])
    solver = cfg.get("solver", "bcfw")
    options = cfg.get("options") or {}
    if not isinstance(options, dict):
        raise ValueError(f"the 'options' section must be a mapping, got {options!r}")
    options_for(solver, **options)  # an unknown solver, unknown or bad options fail here, before the data is loaded
    return lam, solver, dict(options)


def _torchrun_context(device):
    """The process group of a ``torchrun`` launch with more than one process (initialised here from torchrun's
    environment: gloo for CPU data, nccl for CUDA), or ``None`` for a plain launch."""
    if int(os.environ.get("WORLD_SIZE", "1") or "1") <= 1:
        return None
    from .distributed import init_from_env

    return init_from_env(device=device)


def _resume_source(folder: Path, ctx=None) -> Path:
    """The newest complete state of the run in ``folder``: its checkpoint, or in a sharded run this rank's member of
    the newest committed set."""
    if ctx is not None:  # a sharded run's committed set first
        from .checkpoint import newest_sharded

        mine = newest_sharded([folder / CHECKPOINT_FILE], ctx)
        if mine is not None:
            return mine
    if (folder / CHECKPOINT_FILE).is_file():  # a single-process or replicated run's file (rank 0 wrote it)
        return folder / CHECKPOINT_FILE
    raise _nothing_to_resume(folder, 1 if ctx is None else ctx.world_size)


def _nothing_to_resume(folder: Path, world_size: int = 1) -> Exception:
    """The error of a ``--resume`` that finds nothing this launch can continue: what the folder holds instead (a sharded
    set and how to resume it), or that nothing was saved."""
    from .checkpoint import manifest_path, read_manifest, sharded_sets

    ckpt = folder / CHECKPOINT_FILE
    committed = read_manifest(ckpt)
    again = f"torchrun --nproc-per-node {{k}} -m torch_bcfw fit --resume {folder}"
    if committed is not None and committed[0] != world_size:
        k, work = committed
        return ValueError(f"--resume {folder}: it holds a sharded set saved by {k} processes ({manifest_path(ckpt).name}, "
                          f"after {work} block iterations); this launch has {world_size}: resume it with "
                          + again.format(k=k))
    sets = sharded_sets(ckpt)
    if sets:
        k, work = sets[0]
        return ValueError(f"--resume {folder}: it holds the files of a sharded set of {k} processes (after {work} block "
                          f"iterations) but no manifest commits it ({manifest_path(ckpt).name} is missing or names "
                          f"another set): if every rank's file is there, write the manifest "
                          f'{{"format": "torch_bcfw.shards/1", "world_size": {k}, "work": {work}}} and resume with '
                          + again.format(k=k))
    if (folder / "checkpoint.pt").is_file():
        return ValueError(f"--resume {folder}: its checkpoint.pt is a pickle file (torch.save), which torch_bcfw does "
                          f"not load: if you trust it, convert it once with `torch-bcfw convert "
                          f"{folder / 'checkpoint.pt'} {ckpt}` and resume again")
    return FileNotFoundError(f"--resume {folder}: nothing to resume there (looked for {ckpt} and a sharded set; "
                             f"{MODEL_FILE} holds no dual state); the run was stopped before its first checkpoint: "
                             "start it again")


def _resumed_options(options: dict, init, n: int) -> dict | None:
    """The options that continue ``init`` to the config's stopping rules (``None`` when it already met them)."""
    total = options.get("max_passes", 100)
    done = init.counters.get("work", 0) / n
    last = init.history[-1] if init.history else None
    gap, tol, rel_tol = last.gap if last else None, options.get("gap_tol"), options.get("rel_gap_tol")
    if done >= total - 1e-9 or init.stopped_by == "converged":
        return None
    if gap is not None and tol is not None and gap <= tol:
        return None
    if gap is not None and rel_tol is not None and last.primal and gap <= rel_tol * min(
            p for p in (last.primal, last.primal_avg) if p is not None):
        return None
    out = dict(options)
    out["max_passes"] = total - done
    if out.get("time_budget") is not None:
        spent = init.counters.get("solver_time", 0.0) + init.counters.get("gap_time", 0.0)
        if spent >= out["time_budget"]:
            return None
        out["time_budget"] = out["time_budget"] - spent
    if out.get("preset") == "auto":  # measured once, at the start: keep the resolved combination
        out.pop("preset")
        out.update(sampling=init.options.sampling, step_rule=init.options.own.step_rule, cache=init.options.own.cache)
    return out


def _fit_table(result, n_train: int, out: Path, data_cfg: dict | None = None, test=None,
               compile_time: float | None = None) -> str:
    """The final table of ``fit``, with the dataset's own metrics on ``test`` (``task_metrics`` of ``data_cfg``)
    and ``compile_time`` (seconds of numba compilation, shown when > 0)."""
    from .datasets.task_metrics import task_metrics

    s = result.summary()
    last = result.history[-1] if result.history else None
    steps = last.steps / n_train if last is not None and last.steps is not None else s["passes"]
    rows = [("solver", s["solver"]), ("lam", _fmt(s["lam"])), ("n train", str(n_train)),
            ("passes (block steps / n)", _fmt(steps))]
    if last is not None and last.cache_hits:  # the cache served some steps: the oracle's own count
        rows.append(("oracle calls / n", _fmt(s["passes"])))
    rows += [("stopped by", s["stopped_by"]),
            ("model", f"{s['selected']} iterate"), ("duality gap (certified)", _fmt(s["gap"])), ("primal", _fmt(s["primal"])),
            ("train error", _fmt(s["train_loss"])), ("test error", _fmt(s["test_loss"]))]
    try:
        metrics = task_metrics((data_cfg or {}).get("name"), result.model, test, result, data_cfg)
    except Exception as exc:  # noqa: BLE001 - the model is saved already: report, do not fail the run
        print(f"torch-bcfw: warning: the task metrics could not be computed: {exc}", file=sys.stderr)
        metrics = {}
    rows += [(k, _fmt(v)) for k, v in metrics.items()]
    if result.check_was_cut:  # the saved state is past the model and its certificate
        rows.insert(4, ("state saved at passes", _fmt(result.counters.get("work", 0) / n_train)))
    rows.append(("time (s)", _fmt(s["time"])))
    if compile_time:
        rows.append(("numba compilation (s, once)", _fmt(compile_time)))
    rows.append(("output", str(out)))
    return _table(rows)


class _TerminateAsInterrupt:
    """While active, SIGTERM raises ``KeyboardInterrupt`` like Ctrl-C; ``received`` names the signal received."""

    def __enter__(self):
        self.received = None
        self._old = {}
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(ValueError):  # not the main thread: leave the handlers alone
                self._old[sig] = signal.signal(sig, self._handler)
        return self

    def _handler(self, signum, frame):
        self.received = signal.Signals(signum).name
        raise KeyboardInterrupt

    def __exit__(self, *exc):
        for sig, old in self._old.items():
            signal.signal(sig, old)
        return False


def cmd_fit(args) -> int:
    from .checkpoint import parse_interval
    from .io.output_lock import claim_output, overwrite_folder

    interval = parse_interval(args.checkpoint_every)
    if args.resume and args.overwrite:
        raise ValueError("--resume continues the run in its folder and --overwrite replaces it: give one of them")
    if args.resume:
        if args.config:
            raise ValueError("--resume DIR continues with the config saved in DIR (config.yaml); drop --config "
                             "(use --set to change an entry, e.g. --set options.max_passes=200)")
        folder = Path(args.resume)
        if not (folder / "config.yaml").is_file():
            raise FileNotFoundError(f"--resume {folder}: no config.yaml there (is it the output folder of a fit?)")
        world = int(os.environ.get("WORLD_SIZE", "1") or "1")
        if not (folder / CHECKPOINT_FILE).is_file() and (world <= 1 or not any(folder.glob("checkpoint*.safetensors"))):
            raise _nothing_to_resume(folder, world)  # before the data is loaded
        cfg = load_config(folder / "config.yaml", args.set)
        out = folder
    else:
        if not args.config:
            raise ValueError("fit needs --config FILE (or --resume DIR to continue a run)")
        cfg = load_config(args.config, args.set)
        out = Path(args.output or cfg.get("output") or "runs/fit")
    lam, solver, options = _fit_settings(cfg)
    check_output_folder(out)
    first = int(os.environ.get("RANK", "0") or "0") == 0  # a torchrun launch: its rank 0 holds the folder
    claim = (claim_output(out, overwrite=args.overwrite, resume=bool(args.resume), finished=MODEL_FILE,
                          resumable="checkpoint*.safetensors") if first else contextlib.nullcontext())
    with claim as held:
        folder = held.folder if held else overwrite_folder(out) if args.overwrite else out
        return _fit_into(args, cfg, (out, folder), interval, held, (lam, solver, options))


def _fit_into(args, cfg: dict, where: tuple, interval: dict, claim, settings: tuple) -> int:
    """The rest of :func:`cmd_fit`: the run that ``where = (out, folder)`` names ``out`` and writes into ``folder``
    (``out`` itself, or the sibling that replaces it at the end with ``--overwrite``); ``claim``: the
    :class:`~torch_bcfw.io.output_lock.OutputClaim` of rank 0 (``None`` on the other ranks of a launch)."""
    from .datasets.registry import load_problem
    from .fit import FitResult, fit
    from .checkpoint import Checkpoint
    from .io.serialization import atomic_write_text
    from .plotting import plot_histories
    from .compilation import precompile, print_notice
    from .solvers.record import plain_history

    lam, solver, options = settings
    out, folder = where
    if claim is not None:  # no live run writes here: temporary files are what a killed save left
        for stale in (*folder.glob(".checkpoint*.tmp"), *folder.glob(".model*.tmp")):
            stale.unlink(missing_ok=True)
    model, train, test = load_problem(cfg["data"], progress=not args.quiet)
    ctx = _torchrun_context(train.device)  # torchrun with several processes: the examples are sharded over them
    main = ctx is None or ctx.is_main
    init, kept = None, []  # kept: (file, passes) of the newest complete file of this run
    if args.resume:
        source = _resume_source(out, ctx)
        init = FitResult.load(source)
        kept.append((source, init.passes))
        if init.solver != solver or init.lam != lam:
            raise ValueError(f"--resume {out}: the saved run has solver {init.solver!r}, lam {init.lam} but the config "
                             f"has solver {solver!r}, lam {lam}")
        options = _resumed_options(options, init, len(train))
        if options is None:
            print(f"the run in {out} is finished (stopped by {init.stopped_by}); raise options.max_passes with --set "
                  "to continue it", file=sys.stderr)
            print(_fit_table(init, len(train), out, cfg["data"], test))
            return 0
    elif main:
        atomic_write_text(folder / "config.yaml", yaml.safe_dump(cfg, sort_keys=False))

    def failed_save(exc: OSError, path: Path) -> OSError:
        """The error of the save at ``path`` that raised ``exc``: a taken output folder (``OutputFolderBusy``)
        first; a full disk (or a file-size limit) in one line naming the newest complete file that stays."""
        if claim is not None:
            claim.check()
        if exc.errno not in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
            return exc
        if folder != out:
            stays = f"{out} keeps the run it held (--overwrite replaces it only when a run finishes)"
        else:
            stays = f"kept {kept[-1][0]} from pass {kept[-1][1]:g}" if kept else "nothing of this run was saved"
        return OSError(f"disk full: cannot write {path} ({os.strerror(exc.errno)}); {stays}")

    options.setdefault("progress", not args.quiet)
    ckpt = (Checkpoint(folder / CHECKPOINT_FILE, guard=None if claim is None else claim.check, **interval)
            if interval else None)
    compiled = precompile(model, train, lam, solver, test_data=test,
                          announce=None if args.quiet or not main else print_notice, **options)
    try:
        with _TerminateAsInterrupt() as signals:
            result = fit(model, train, lam, solver, test_data=test, init=init, checkpoint=ckpt, **options)
    except OSError as exc:
        if ckpt is None:
            raise
        if ckpt.saved_passes is not None:
            kept.append((out / CHECKPOINT_FILE, ckpt.saved_passes))
        raise failed_save(exc, out / CHECKPOINT_FILE) from None
    if ctx is not None and result.options.strategy == "shard":  # every rank's shard in one committed set
        from .checkpoint import save_sharded

        save_sharded(result, folder / CHECKPOINT_FILE, ctx)
    if not main:  # rank 0's files are the run's (the weights are the same on every rank)
        return 0
    failed = []  # a full disk: each file that still fits is written, the model (the smallest) first

    def write(name, what):
        if claim is not None:
            claim.check()
        try:
            what(folder / name)
            if name == MODEL_FILE:
                kept.append((out / name, result.passes))
        except OSError as exc:
            failed.append(failed_save(exc, out / name))

    write(MODEL_FILE, lambda path: result.save(path, state=False))
    if ckpt is None and (ctx is None or result.options.strategy != "shard"):  # else fit saved it last
        write(CHECKPOINT_FILE, result.save)
    write("history.csv", result.write_history_csv)
    write("history.json", result.write_history_json)
    write("gap.png", lambda path: plot_histories(
        {f"{result.solver} lam={result.lam:g}": plain_history(result.history)}, path,
        title=f"{cfg['data'].get('name', '')} {result.solver}", gap_tol=result.options.gap_tol,
        compile_time=compiled.seconds))
    print(_fit_table(result, len(train), out, cfg["data"], test, compile_time=compiled.seconds))
    if failed:  # with --overwrite the folder keeps the run it held
        more = f" (and {len(failed) - 1} more file(s))" if len(failed) > 1 else ""
        raise OSError(f"{failed[0]}{more}")
    if result.stopped_by == "interrupted":
        how = signals.received or "SIGINT"
        state = result.counters.get("work", 0) / len(train)
        if not result.history:
            held = (f"the state after {state:g} passes and no certificate (a second signal cut the first check; "
                    "the resumed run checks that state first)")
        elif result.check_was_cut:
            held = (f"the model and certificate of the check at {result.passes:g} passes and the state after "
                    f"{state:g} passes (a second signal cut its check; the resumed run checks that state first)")
        else:
            held = "the model of the last check with its certificate"
        print(f"torch-bcfw: interrupted by {how}: {out / CHECKPOINT_FILE} holds {held}; continue with: "
              f"torch-bcfw fit --resume {out}", file=sys.stderr)
        return 143 if how == "SIGTERM" else 130
    return 0


def cmd_compare(args) -> int:
    from .compare import finished_runs, plot_comparison, run_comparison, summarise, write_results

    cfg = load_config(args.config, args.set)
    log = (lambda *a: None) if args.quiet else print
    try:
        results = run_comparison(cfg, log=log)
    except KeyboardInterrupt:  # before any run (e.g. while loading the data): nothing to write
        print("torch-bcfw compare: interrupted before any run; nothing written", file=sys.stderr)
        return 130
    interrupted = results.get("status") == "interrupted"
    out = Path(args.output or cfg.get("output") or "runs/compare")
    path = write_results(results, out)
    name = cfg.get("data", {}).get("name", "")
    plot_comparison(results, out / "comparison.png",
                    title=f"{name} lam = {results['lam']:g}, n = {results['n']}: median and min-max over "
                          f"{len(results['seeds'])} seeds" + (" (interrupted: finished runs only)" if interrupted else ""))
    rows = summarise(results)  # finished runs only
    if rows:
        width = max(len(r["solver"]) for r in rows)
        def sci(v):
            return f"{'-':>10}" if v is None else f"{v:10.3e}"

        print(f"{'solver':<{width}}  {'gap':>10}  {'gap/primal':>10}  {'subopt':>10}  {'passes':>8}  {'time s':>8}  "
              f"{'oracle':>9}  {'hits':>9}" + ("  runs" if interrupted else ""))
        for r in rows:
            print(f"{r['solver']:<{width}}  {sci(r['gap'])}  {sci(r['gap/primal'])}  {sci(r['suboptimality'])}  "
                  f"{r['passes']:8.1f}  {r['time']:8.1f}  {r['oracle_calls']:9d}  {r['cache_hits']:9d}"
                  + (f"  {r['runs']:4d}" if interrupted else ""))
    print(f"wrote {path} and {out / 'comparison.png'}")
    if interrupted:
        at = results.get("interrupted_at", {})
        where = ", ".join(f"{k} {v}" for k, v in at.items())
        done = sum(len(finished_runs(run)) for run in results["runs"].values())
        print(f"torch-bcfw compare: interrupted ({where}); {done} finished run(s) kept, the cut run is marked "
              "\"interrupted\" and left out of the table and the plot", file=sys.stderr)
        return 130
    return 0


def cmd_path(args) -> int:
    """The eps-approximate regularization path (and optional grid searches) with model selection; JSON + PNG."""
    from .datasets.registry import load_problem_with_validation
    from .certificate import task_loss
    from .solvers.path import grid_search, plot_sweep, regularization_path

    cfg = load_config(args.config, args.set)
    check_known(cfg, ("data", "grid", "options", "output", "path"), "config section")
    pcfg = dict(cfg.get("path") or {})
    check_known(pcfg, ("eps", "kappa", "lam_min", "time_budget", "max_breakpoints"), "path option")
    gcfg = dict(cfg.get("grid") or {})
    check_known(gcfg, ("warm", "cold", "lams", "time_budget"), "grid option")
    model, train, val, test = load_problem_with_validation(cfg.get("data", {}))
    if val is None:
        print("torch-bcfw: note: no data.validation entry: lambda is selected on the training loss", file=sys.stderr)
    options = dict(cfg.get("options") or {})
    eps = float(pcfg.get("eps", 0.1))
    log = not args.quiet
    # Ctrl-C: a sweep keeps its finished points, no further sweep starts, exit code 130
    try:
        path = regularization_path(model, train, eps=eps, kappa=float(pcfg.get("kappa", 0.9)),
                                   lam_min=float(pcfg.get("lam_min", 1e-5)), val_data=val,
                                   time_budget=pcfg.get("time_budget"), max_breakpoints=pcfg.get("max_breakpoints"),
                                   progress=log, **options)
    except KeyboardInterrupt:
        print("torch-bcfw path: interrupted before the path had a finished breakpoint (or while its points were "
              "evaluated); nothing written", file=sys.stderr)
        return 130
    interrupted = "path" if path.stopped_by == "interrupted" else None
    out = Path(args.output or cfg.get("output") or "runs/path")
    out.mkdir(parents=True, exist_ok=True)
    sweeps = {"path": path}
    path.save_json(out / "path.json", with_weights=bool(args.weights))
    for kind in ("warm", "cold"):
        if gcfg.get(kind) and interrupted is None:
            try:
                sw = grid_search(model, train, gcfg.get("lams"), eps=eps, warm_start=kind == "warm", val_data=val,
                                 time_budget=gcfg.get("time_budget"), progress=log, **options)
            except KeyboardInterrupt:  # while its points were evaluated: nothing of it is kept
                interrupted = f"grid ({kind})"
                break
            sw.save_json(out / f"grid_{kind}.json")
            sweeps[f"grid ({kind})"] = sw
            if sw.stopped_by == "interrupted":
                interrupted = f"grid ({kind})"
    key = "val_loss" if val is not None else "train_loss"
    best = path.best(key)
    test_loss = task_loss(model, test, best.w.to(test.device)) if test is not None else None
    summary = {"lam_inf": path.lam_inf, "breakpoints": len(path.points), "lower_limit": path.lower_limit,
               "stopped_by": path.stopped_by, "passes": path.points[-1].passes, "time": path.points[-1].time,
               "selected_lam": best.lam, "selected_by": key, "selected_val_loss": best.val_loss,
               "selected_train_loss": best.train_loss, "selected_gap": best.gap, "test_loss": test_loss,
               "status": "interrupted" if interrupted else "finished", "interrupted_in": interrupted}
    for name, sw in sweeps.items():
        if name != "path":
            b = sw.best(key) if sw.points else None  # finished points only (a cut solve is never a point)
            summary[name] = {"passes": sw.points[-1].passes if sw.points else 0.0,
                             "time": sw.points[-1].time if sw.points else 0.0, "stopped_by": sw.stopped_by,
                             "selected_lam": b.lam if b is not None else None,
                             "test_loss": task_loss(model, test, b.w.to(test.device))
                             if test is not None and b is not None else None}
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    name = cfg.get("data", {}).get("name", "")
    plot_sweep(sweeps, out / "path.png", title=f"{name}: loss along the regularization path (eps = {eps:g})")
    rows = [("breakpoints", str(len(path.points))), ("lam_inf", _fmt(path.lam_inf)),
            ("covered down to", _fmt(path.lower_limit)), ("stopped by", path.stopped_by),
            ("effective passes", _fmt(path.points[-1].passes)), ("time (s)", _fmt(path.points[-1].time)),
            ("selected lam", _fmt(best.lam)), (key.replace("_", " "), _fmt(getattr(best, key))),
            ("certified gap there", _fmt(best.gap)), ("test error", _fmt(test_loss)), ("output", str(out))]
    print(_table(rows))
    if interrupted:
        print(f"torch-bcfw path: interrupted during the {interrupted}: only its finished points were kept and "
              "used (the cut solve is dropped); no further sweep was run", file=sys.stderr)
        return 130
    return 0


def cmd_evaluate(args) -> int:
    from .datasets.registry import load_problem
    from .fit import FitResult

    model_path = Path(args.model)
    result = FitResult.load(model_path)
    fitted_data = False  # whether the data evaluated on is the data the model was fitted on
    if args.config:
        cfg = load_config(args.config, args.set)
    elif (model_path.parent / "config.yaml").is_file():  # the output folder of `torch-bcfw fit`
        saved = model_path.parent / "config.yaml"
        cfg = load_config(saved, args.set)
        fitted = load_config(saved).get("data")
        changed = sorted(k for k in {*(fitted or {}), *(cfg.get("data") or {})}
                         if (fitted or {}).get(k) != (cfg.get("data") or {}).get(k))
        fitted_data = not changed
        if changed:  # e.g. data.split=small: the training and test parts would swap under the saved model
            raise ValueError(
                f"--set changes the data the model was fitted on ({', '.join(f'data.{k}' for k in changed)}): its "
                f"training error and certificate belong to that data. To evaluate on other data, pass --config "
                f"FILE naming it")
    else:
        raise ValueError(f"evaluate needs the data to evaluate on: pass --config FILE whose 'data' section names it "
                         f"(the config the model was fitted with); no config.yaml beside {model_path} either")
    if not isinstance(cfg.get("data"), dict):
        raise ValueError("the config needs a 'data' section naming the dataset")
    model, train, test = load_problem(cfg["data"], progress=True)
    if model.n_features != result.model.n_features:
        raise ValueError(f"the saved model has d = {result.model.n_features} but the data gives d = {model.n_features}")
    from .certificate import primal_value

    # the file's certificate is shown only where its primal value holds again on the training data
    train_primal, _ = primal_value(result.model, train, result.weights, result.lam)
    saved = result.primal
    holds = saved is not None and abs(train_primal - saved) <= 1e-7 * (1.0 + abs(saved))
    if saved is not None and not holds and (fitted_data or _same_examples(result, train)):
        raise ValueError(f"{model_path}: its weights do not give its saved primal value on the data they were fitted on "
                         f"(saved {saved:.6g}, here {train_primal:.6g}): the file's weights and certificate disagree "
                         "(was it changed after the fit?)")
    if saved is not None and not holds:
        print(f"torch-bcfw evaluate: the saved certificate is for other training data (its primal value {saved:.6g}, "
              f"here {train_primal:.6g}): no gap is reported; evaluate with the data the model was fitted on",
              file=sys.stderr)
    report = {"train_error": result.evaluate(train), "test_error": result.evaluate(test),
              "train_primal": train_primal, "certified_gap_as_saved": result.gap if holds else None,
              "lam": result.lam, "passes": result.passes}
    print(_table([(k, _fmt(v)) for k, v in report.items()]))
    if args.json:
        from .io.serialization import atomic_write_text

        atomic_write_text(args.json, json.dumps(report, indent=1))
    return 0


def _same_examples(result, train) -> bool:
    """Whether ``result``'s saved dual state (a full save) names ``train``'s examples and features."""
    from .duals.fingerprint import features_fingerprint, labels_fingerprint

    state = result.solver_state.get("state") if isinstance(result.solver_state, dict) else None
    return (isinstance(state, dict) and state.get("labels") == labels_fingerprint(train)
            and state.get("features") == features_fingerprint(train))


def cmd_export(args) -> int:
    from .export import export_head, lightning_heads
    from .fit import FitResult

    if str(args.model).endswith(".ckpt"):  # a Lightning checkpoint: the head a BCFWCallback solved
        heads = lightning_heads(args.model)
        name = args.head or (next(iter(heads)) if len(heads) == 1 else None)
        if name not in heads:
            raise ValueError(f"{args.model} holds the heads {sorted(heads)}: choose one with --head"
                             + (f" (not {args.head!r})" if args.head else ""))
        from .nn import StructuredHead

        head = StructuredHead(*heads[name][:1])
        head.set_weights(heads[name][1])
        path = export_head(head, args.output)
        print(f"wrote {path} and {path.parent / 'head.py'} (head {name!r} of the Lightning checkpoint); load it with "
              f"torch alone: from head import load_head; load_head({str(path)!r})")
        return 0
    result = FitResult.load(args.model)
    path = export_head(result, args.output)
    print(f"wrote {path} and {path.parent / 'head.py'} (the {result.selected} iterate, certified gap "
          f"{_fmt(result.gap)}); load it without torch_bcfw: from head import load_head; load_head({str(path)!r})")
    return 0


def cmd_convert(args) -> int:
    """``OLD`` (a pickle of ``torch.save``: a saved FitResult or an exported head), read once through the checks of
    :func:`~torch_bcfw.io.pickle_stream.load_pickle_file` and validated as it is when loaded, written to ``NEW``."""
    from .export import write_head
    from .fit import FORMAT, FitResult
    from .io.pickle_stream import load_pickle_file
    from .io.standalone_head import FORMAT as HEAD_FORMAT, check_head

    if str(args.old).endswith(".ckpt"):
        raise ValueError(f"{args.old}: a Lightning checkpoint stays in Lightning's format; export its head with "
                         f"torch-bcfw export --model {args.old} --output DIR")
    old = load_pickle_file(args.old, what="file to convert")
    fmt = old.get("format") if isinstance(old, dict) else None
    if fmt == FORMAT:
        result = FitResult.from_dict(old, source=str(args.old))
        result.save(args.new)
        what = "checkpoint" if result.has_state else "model file"
    elif fmt == "torch_bcfw.head/1":
        metadata = {"format": HEAD_FORMAT, "kind": old.get("kind")}
        kind, tensors = check_head(metadata, old.get("tensors"), args.old)
        write_head(kind, tensors, Path(args.new))
        what = f"exported {kind} head, with head.py beside it"
    else:
        raise ValueError(f"{args.old}: neither a saved FitResult nor an exported head (format {str(fmt)[:60]!r})")
    print(f"wrote {args.new} ({what}) from {args.old}")
    return 0


def _run_args(parser: argparse.ArgumentParser, config_help: str | None = None, quiet: str | None = None) -> None:
    """The ``--config``, ``--set`` and ``--output`` arguments of a command that runs a config (and ``--quiet``)."""
    parser.add_argument("--config", required=config_help is None, help=config_help)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a config entry")
    parser.add_argument("--output", help="output folder (default: the config's 'output')")
    if quiet is not None:
        parser.add_argument("--quiet", action="store_true", help=quiet)


def build_parser() -> argparse.ArgumentParser:
    from . import __version__

    p = argparse.ArgumentParser(prog="torch-bcfw", description="Structured SVMs trained by Block-Coordinate Frank-Wolfe.")
    p.add_argument("--version", action="version", version=f"torch-bcfw {__version__}")
    sub = p.add_subparsers(dest="command", required=True)
    f = sub.add_parser("fit", help="train a model from a YAML config")
    _run_args(f, "the YAML config (required unless --resume)", "no progress bar")
    f.add_argument("--checkpoint-every", default="60s", metavar="INTERVAL",
                   help=f"save the run to OUTPUT/{CHECKPOINT_FILE} this often: '60s' (default), '5m', '10p' (passes) "
                        "or 'off'")
    f.add_argument("--resume", metavar="DIR", help="continue the run saved in the output folder DIR (after Ctrl-C, "
                                                   "SIGTERM, kill or a finished max_passes raised with --set)")
    f.add_argument("--overwrite", action="store_true",
                   help=f"replace the run in the output folder when this one finishes (without it, a {MODEL_FILE} or "
                        f"{CHECKPOINT_FILE} there is refused)")
    f.set_defaults(func=cmd_fit)
    e = sub.add_parser("evaluate", help="evaluate a saved model on a config's data")
    e.add_argument("--model", required=True, help=f"{MODEL_FILE} written by 'fit'")
    e.add_argument("--config", help="config whose 'data' section names the data (default: config.yaml beside --model)")
    e.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    e.add_argument("--json", help="also write the figures to this JSON file")
    e.set_defaults(func=cmd_evaluate)
    x = sub.add_parser("export", help="write a trained head as plain torch modules (head.safetensors + head.py) that "
                                      "load without torch_bcfw")
    x.add_argument("--model", required=True, help=f"{MODEL_FILE} written by 'fit', or a Lightning .ckpt written with "
                                                  "a BCFWCallback")
    x.add_argument("--head", help="which head of a Lightning checkpoint (its attribute name; default: the only one)")
    x.add_argument("--output", required=True, help="folder for head.safetensors and head.py")
    x.set_defaults(func=cmd_export)
    v = sub.add_parser("convert", help="rewrite a file saved with torch.save (pickle) by an earlier version as "
                                       "safetensors; for files you trust")
    v.add_argument("old", help="a saved FitResult (model.pt, checkpoint.pt) or an exported head.pt")
    v.add_argument("new", help="the safetensors file to write (model.safetensors, checkpoint.safetensors, "
                               "head.safetensors: head.py is written beside it)")
    v.set_defaults(func=cmd_convert)
    c = sub.add_parser("compare", help="run several solvers x seeds on one problem; JSON of the histories and "
                                       "gap plots (median and min-max band over seeds)")
    _run_args(c, quiet="no per-run log lines")
    c.set_defaults(func=cmd_compare)
    pa = sub.add_parser("path", help="eps-approximate regularization path (Osokin et al. 2016) with model selection on "
                                     "a validation set; optional warm / cold grid searches; JSON and a PNG")
    _run_args(pa, quiet="no per-breakpoint log lines")
    pa.add_argument("--weights", action="store_true", help="also store every breakpoint's weights in path.json")
    pa.set_defaults(func=cmd_path)
    # the arguments of `train` are LightningCLI's: main() hands them over before argparse sees them
    sub.add_parser("train", add_help=False,
                   help="train a backbone + structured head with Lightning from a LightningCLI YAML config "
                        "(torch-bcfw train --help lists the options)")
    return p


def cmd_train(argv) -> int:
    try:
        from .lightning.cli import train_main

        return train_main(list(argv))
    except (ImportError, ValueError, FileNotFoundError, TypeError) as exc:
        print(f"torch-bcfw: error: {exc}", file=sys.stderr)
        return 2


def _interrupted() -> int:
    print("torch-bcfw: interrupted (Ctrl-C); the files already written are kept", file=sys.stderr)
    return 130


def main(argv=None) -> int:
    from .runtime.launch import loaded

    loaded()  # from here on Ctrl-C raises KeyboardInterrupt, handled below (or by the fit, which stops itself)
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "train":
        return cmd_train(argv[1:])
    try:
        args = build_parser().parse_args(argv)
        from .distributed.errors import DistributedError
    except KeyboardInterrupt:
        return _interrupted()
    try:
        return args.func(args)
    except KeyboardInterrupt:  # outside a fit (which stops itself): data loading, warm-up compile, plots
        return _interrupted()
    except (ValueError, FileNotFoundError, TypeError, OSError) as exc:
        print(f"torch-bcfw: error: {exc}", file=sys.stderr)
        return 2
    except DistributedError as exc:  # a peer died or the ranks disagree: the message says which, once per rank
        print(f"torch-bcfw: error: {exc}", file=sys.stderr)
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            # tearing the broken group down at exit can abort the process (SIGABRT from gloo's threads)
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(1)
        return 1


if __name__ == "__main__":
    sys.exit(main())
