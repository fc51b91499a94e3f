"""Side by side with CRFsuite on CoNLL-2000 chunking: the same attributes, both tuned on the same held-out sentences.

Usage:  python benchmarks/peers.py [--lams 3e-3,1e-2,3e-2,1e-1,3e-1,1] [--c1 0,0.1,0.2,0.5] [--c2 1e-3,1e-2,0.1]
                                   [--passes 40] [--stage 5] [--max-iterations 100] [--repeats 3] [--jobs 2]
Writes benchmarks/results/peers.json and peers.png and prints the tables.

Protocol (all in one run).

* Attributes.  The library's feature extraction (:mod:`torch_bcfw.features.chunking`, the CRFsuite / Sha-Pereira
  templates, attributes seen on ``>= --min-count`` training tokens) is exported token by token with
  :func:`torch_bcfw.datasets.conll_chain.write_crfsuite_data` (CRFsuite's data format); CRFsuite reads those files,
  so both train on exactly the same attributes.  CRFsuite also gets the constant ``bias`` attribute, its per-label
  bias (the chain has its own per-label, start and end biases and drops that attribute).
* Tuning.  The last ``--heldout`` fraction of train.txt (893 sentences) is held out; vocabularies are built on the
  rest.  The library's chain (BCFW, line search, averaging, seed 1, ``--passes`` passes, a gap check every
  ``--stage`` passes) is trained at every ``lam`` of ``--lams``; CRFsuite (L-BFGS, ``max_iterations``
  ``--max-iterations``, ``feature.possible_transitions``) at every ``(c1, c2)``.  Each picks the setting with the
  best chunk F1 on the held-out sentences (for the library: of the model ``fit()`` returns; the held-out F1 of the
  last and of the averaged iterate is recorded too).  The test split is never used to choose anything.
* Final runs.  Both retrain on all 8936 training sentences with their chosen setting and are scored on the 2012
  test sentences (conlleval chunk F1).  ``--repeats`` runs of each, interleaved (library, CRFsuite, CRFsuite,
  library, ...), each in its own process: the figures are medians.  Peak RSS is the child's maximum resident set
  size (``wait4`` rusage, equal to its ``VmHWM``); the child process does everything a user's script does (read
  the data, build the features or read the exported files, train, decode the test split).  The library's child
  also records ``VmRSS`` / ``VmHWM`` after each stage (imports, sentences, vocabulary, encoding, fit, decoding).
* Time.  Library: wall seconds inside one ``fit()`` call (dual state, compiled steps, exact gap checks; the numba
  kernels come from the on-disk cache, their load counts), and the second at which each gap check ends (a
  callback).  CRFsuite: wall seconds inside ``Trainer.train()`` (its feature generation, the L-BFGS iterations and
  the model file), and the second at which each iteration ends (its log callback).  Data loading and feature
  extraction are reported apart for both.
* Test F1 against time.  Library: the test F1 of the model ``fit()`` returns at each gap check (a run continued in
  stages through ``fit(init=...)``, the same iterates as the single call), placed at the median second of that
  check in the timed runs.  CRFsuite: the test F1 of models retrained with ``max_iterations = k`` (L-BFGS is
  deterministic, so they are the iterates of the full run), placed at the median second of iteration ``k``.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


# ----------------------------------------------------------------------------- helpers shared by the children
def proc_status() -> dict:
    """``VmRSS`` and ``VmHWM`` of this process in MB."""
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(("VmRSS", "VmHWM")):
                key, value = line.split(":")
                out[key.strip()] = int(value.split()[0]) / 1024
    return out


class Stages:
    """Records ``VmRSS`` / ``VmHWM`` and the wall clock after each named stage of a child."""

    def __init__(self):
        self.t0 = time.perf_counter()
        self.rows = []

    def __call__(self, name: str) -> None:
        s = proc_status()
        self.rows.append({"stage": name, "rss_mb": s.get("VmRSS"), "hwm_mb": s.get("VmHWM"),
                          "t": time.perf_counter() - self.t0})


def chunk_f1_module():
    """torch_bcfw/metrics/chunking.py loaded on its own (no torch import in the CRFsuite children)."""
    package = importlib.util.find_spec("torch_bcfw")  # locates the package without running its __init__
    source = Path(package.submodule_search_locations[0]) / "metrics" / "chunking.py"
    spec = importlib.util.spec_from_file_location("_peers_chunking", source)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def split_sentences(path, heldout: float):
    from torch_bcfw.datasets.conll import load_conll2000

    train = load_conll2000(path, split="train")
    cut = len(train) - int(round(heldout * len(train)))
    return train, train[:cut], train[cut:], load_conll2000(path, split="test")


# ----------------------------------------------------------------------------- library children
def lib_setup(spec: dict, stages: Stages | None = None):
    """Sentences -> vocabulary -> encoded training and evaluation data (the user's script)."""
    import torch

    torch.set_num_threads(spec["threads"])
    from torch_bcfw.datasets.conll_chain import CHUNK_TAGS, chunk_vocabulary, encode_sentences
    from torch_bcfw.models import Chain

    if stages:
        stages("imports")
    t0 = time.perf_counter()
    train_all, sub, held, test = split_sentences(spec["path"], spec["heldout"])
    train_s, eval_s = (sub, held) if spec["split"] == "tune" else (train_all, test)
    del train_all, sub, held, test
    if stages:
        stages("sentences")
    vocab = chunk_vocabulary(train_s, min_count=spec["min_count"])
    if stages:
        stages("vocabulary")
    train, ev = encode_sentences(train_s, vocab), encode_sentences(eval_s, vocab)
    if stages:
        stages("encoded")
    model = (Chain if spec.get("loss", "normalised") == "normalised" else unnormalised_chain())(len(vocab), len(CHUNK_TAGS))
    info = {"n_train": len(train), "n_eval": len(ev), "n_attributes": len(vocab), "d": model.n_features,
            "nnz": train.x.nnz, "load_s": time.perf_counter() - t0}
    return model, train, ev, eval_s, info


def unnormalised_chain():
    """``Chain`` with the Hamming loss not divided by the sentence length (wrong tokens counted), for a held-out check.

    The chain's compiled step kernels hard-code the normalised loss, so this model runs BCFW through the library's
    generic torch steps (``generic_plan_steps``: the same steps, one to two orders of magnitude slower; on the
    normalised loss both paths give the same iterates).  Only ``--tune-only`` uses it.
    """
    import torch

    from torch_bcfw.duals.chain import ChainDualState
    from torch_bcfw.models import Chain

    class GenericStepsState(ChainDualState):
        def can_run_plan(self, plan):
            return False

    class UnnormalisedChain(Chain):
        def loss_unaries(self, data, dtype=torch.float64):
            aug = torch.ones(data.n_tokens, self.n_labels, dtype=dtype, device=data.device)
            aug[torch.arange(data.n_tokens, device=data.device), data.y] = 0.0
            return aug

        def loss(self, data, y):
            return super().loss(data, y) * data.lengths.to(torch.float64)

        def expected_loss(self, data, mu):
            return super().expected_loss(data, mu) * data.lengths.to(torch.float64)

        def max_loss(self, data):
            return data.lengths.to(torch.float64)

        def dual_state(self, data, lam):
            return GenericStepsState(self, data, lam)

    return UnnormalisedChain


def lib_staged(spec: dict) -> dict:
    """Continue one run in stages of ``stage`` passes; eval F1 of the returned / last / averaged model after each."""
    from torch_bcfw import fit
    from torch_bcfw.datasets.conll_chain import evaluate_chunking

    model, train, ev, eval_s, info = lib_setup(spec)
    result, rows = None, []
    while result is None or result.passes < spec["passes"] - 1e-9:
        result = fit(model, train, spec["lam"], "bcfw", init=result, max_passes=spec["stage"],
                     gap_check=spec["stage"], seed=spec["seed"])
        rec = result.history[-1]
        f1 = {k: evaluate_chunking(model, w, ev, eval_s)["f1"]
              for k, w in (("f1", result.weights), ("f1_last", result.w), ("f1_avg", result.w_avg))}
        rows.append({"passes": result.passes, "gap": result.gap, "primal": result.primal,
                     "rel_gap": result.gap / result.primal, "selected": result.selected,
                     "gap_last": rec.gap_last, "gap_avg": rec.gap_avg, **f1,
                     "solver_time": rec.solver_time, "gap_time": rec.gap_time})
        print(f"  lam {spec['lam']:g} [{spec['split']}] pass {result.passes:4.0f}  F1 {100 * f1['f1']:.2f} "
              f"(last {100 * f1['f1_last']:.2f}, avg {100 * f1['f1_avg']:.2f})  gap/primal {rows[-1]['rel_gap']:.2e}",
              file=sys.stderr, flush=True)
    return {"lam": spec["lam"], **info, "stages": rows, "hwm_mb": proc_status()["VmHWM"]}


def lib_fit(spec: dict) -> dict:
    """One ``fit()`` call as a user runs it, timed, with the second at which each gap check ends; test F1."""
    stages = Stages()
    from torch_bcfw import fit
    from torch_bcfw.compilation import CompileTimer
    from torch_bcfw.datasets.conll_chain import chunk_f1_from_ids, evaluate_chunking, predictions_to_tags
    from torch_bcfw.solvers.callbacks import Callback

    model, train, ev, eval_s, info = lib_setup(spec, stages)

    class CheckClock(Callback):
        def __init__(self):
            self.rows = []

        def on_check(self, record):
            self.rows.append({"passes": record.passes, "t": time.perf_counter() - t0, "gap": record.gap,
                              "selected": record.selected})

    clock = CheckClock()
    with CompileTimer() as ct:
        t0 = time.perf_counter()
        result = fit(model, train, spec["lam"], "bcfw", max_passes=spec["passes"], gap_check=spec["stage"],
                     seed=spec["seed"], callbacks=[clock])
        fit_s = time.perf_counter() - t0
    stages("fit")
    t1 = time.perf_counter()
    pred = model.decode(result.weights.to(ev.device), ev)
    f1 = chunk_f1_from_ids(pred, ev.offsets, eval_s)
    decode_s = time.perf_counter() - t1
    f1_avg = evaluate_chunking(model, result.w_avg, ev, eval_s)["f1"]
    stages("decoded test")
    c = result.counters
    return {"lam": spec["lam"], **info, "fit_s": fit_s, "solver_time": c["solver_time"], "gap_time": c["gap_time"],
            "compile_s": ct.seconds, "decode_s": decode_s, "passes": result.passes, "gap": result.gap,
            "primal": result.primal, "selected": result.selected, "test_f1": f1["f1"],
            "test_precision": f1["precision"], "test_recall": f1["recall"], "test_f1_avg": f1_avg,
            "checks": clock.rows, "memory_stages": stages.rows, "hwm_mb": proc_status()["VmHWM"],
            **({"test_tags": predictions_to_tags(pred, ev.offsets)} if spec.get("tags") else {})}


def lib_floor(spec: dict) -> dict:
    """The resident set of a process that only imports torch, numba and torch_bcfw (what any run of the library
    holds before it reads data)."""
    stages = Stages()
    import torch  # noqa: F401

    stages("torch")
    import numba  # noqa: F401

    stages("numba")
    import torch_bcfw  # noqa: F401

    stages("torch_bcfw")
    return {"memory_stages": stages.rows, "hwm_mb": proc_status()["VmHWM"]}


def lib_memory_profile(spec: dict) -> dict:
    """A ``lib-fit`` run with a sampler that says what the resident set holds at its peak.

    A thread reads ``VmRSS`` every 5 ms.  A rise is charged to the code the main thread runs then (its innermost
    two frames inside torch_bcfw, or the script's); a fall is credited back to the latest charges (last in, first
    out).  The charges standing when the resident set reaches its maximum are the attribution of the peak, from the
    start of the run (imports included).  Approximate: a rise lands on whatever runs when the sample is taken and
    memory freed out of order is credited to the wrong charge; the total is exact.
    """
    import threading
    import traceback
    from collections import Counter

    main_id = threading.main_thread().ident
    done = threading.Event()
    state = {"peak": 0.0, "at_peak": {}, "base": 0.0}

    def rss():
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20

    def where() -> str:
        frames = traceback.extract_stack(sys._current_frames().get(main_id))
        ours = [f for f in frames if "torch_bcfw" in f.filename] or frames[-2:]
        return " <- ".join(f"{Path(f.filename).name}:{f.lineno} {f.name}" for f in reversed(ours[-2:]))

    def sample():
        live, last = [], rss()
        state["base"] = last
        while not done.wait(0.005):
            now = rss()
            if now > last + 0.5:
                live.append([where(), now - last])
            elif now < last - 0.5:
                x = last - now
                while x > 1e-9 and live:
                    take = min(x, live[-1][1])
                    live[-1][1] -= take
                    x -= take
                    if live[-1][1] <= 1e-9:
                        live.pop()
            else:
                continue
            last = now
            if now > state["peak"]:
                agg = Counter()
                for k, v in live:
                    agg[k] += v
                state["peak"], state["at_peak"] = now, agg

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    rec = lib_fit(spec)
    done.set()
    thread.join()
    rec["sampled_peak_mb"], rec["sampled_base_mb"] = state["peak"], state["base"]
    rec["at_peak_mb"] = [{"where": k, "mb": v} for k, v in state["at_peak"].most_common() if v >= 1.0]
    return rec


# ----------------------------------------------------------------------------- CRFsuite children (no torch)
def read_crfsuite(path):
    """Sentences of a file written by write_crfsuite_data: ``(attribute lists, tags)``, streamed."""
    xs, ys = [], []
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.rstrip("\n")
            if not line:
                if ys:
                    yield xs, ys
                xs, ys = [], []
                continue
            fields = line.split("\t")
            ys.append(fields[0])
            xs.append(fields[1:])
    if ys:
        yield xs, ys


def crf_train(spec: dict, max_iterations: int, model_path: str, stages: Stages | None = None) -> dict:
    import pycrfsuite

    class Trainer(pycrfsuite.Trainer):
        """Records the second at which each L-BFGS iteration ends (CRFsuite's log callback)."""

        def message(self, message):
            event = self.logparser.feed(message)
            if event == "iteration":
                self.ticks.append(time.perf_counter() - self.t0)

    t0 = time.perf_counter()
    trainer = Trainer(verbose=False)
    n = 0
    for xs, ys in read_crfsuite(spec["train_file"]):
        trainer.append(xs, ys)
        n += 1
    load_s = time.perf_counter() - t0
    if stages:
        stages("appended")
    trainer.set_params({"c1": spec["c1"], "c2": spec["c2"], "max_iterations": int(max_iterations),
                        "feature.possible_transitions": True})
    trainer.ticks = []
    trainer.t0 = time.perf_counter()
    trainer.train(model_path)
    train_s = time.perf_counter() - trainer.t0
    if stages:
        stages("trained")
    last = trainer.logparser.last_iteration or {}
    return {"n_train": n, "load_s": load_s, "train_s": train_s, "iterations": len(trainer.ticks),
            "ticks": trainer.ticks, "active_features": last.get("active_features"), "loss": last.get("loss")}


def crf_score(model_path: str, eval_file: str) -> dict:
    import pycrfsuite

    tagger = pycrfsuite.Tagger()
    tagger.open(model_path)
    gold, pred = [], []
    t0 = time.perf_counter()
    for xs, ys in read_crfsuite(eval_file):
        pred.append(tagger.tag(xs))
        gold.append(ys)
    decode_s = time.perf_counter() - t0
    tagger.close()
    scores = chunk_f1_module().chunk_f1(gold, pred)
    return {"f1": scores["f1"], "precision": scores["precision"], "recall": scores["recall"], "decode_s": decode_s,
            "n_eval": len(gold), "pred_tags": pred}


def crf_fit(spec: dict) -> dict:
    stages = Stages()
    import pycrfsuite  # noqa: F401  (the import is part of the child's memory)

    stages("imports")
    model_path = os.path.join(spec["workdir"], f"crf-{os.getpid()}.crfsuite")
    out = crf_train(spec, spec["max_iterations"], model_path, stages)
    sc = crf_score(model_path, spec["eval_file"])
    stages("decoded test")
    os.remove(model_path)
    return {"c1": spec["c1"], "c2": spec["c2"], **out, "test_f1": sc["f1"], "test_precision": sc["precision"],
            "test_recall": sc["recall"], "decode_s": sc["decode_s"], "memory_stages": stages.rows,
            "hwm_mb": proc_status()["VmHWM"], **({"test_tags": sc["pred_tags"]} if spec.get("tags") else {})}


def crf_tune(spec: dict) -> dict:
    model_path = os.path.join(spec["workdir"], f"crf-{os.getpid()}.crfsuite")
    out = crf_train(spec, spec["max_iterations"], model_path)
    sc = crf_score(model_path, spec["eval_file"])
    os.remove(model_path)
    out.pop("ticks")
    print(f"  CRFsuite c1 {spec['c1']:g} c2 {spec['c2']:g} [tune]  held-out F1 {100 * sc['f1']:.2f}  "
          f"train {out['train_s']:.0f} s", file=sys.stderr, flush=True)
    return {"c1": spec["c1"], "c2": spec["c2"], **out, "heldout_f1": sc["f1"], "hwm_mb": proc_status()["VmHWM"]}


def crf_curve(spec: dict) -> dict:
    rows = []
    for k in spec["iterations"]:
        model_path = os.path.join(spec["workdir"], f"crf-{os.getpid()}-{k}.crfsuite")
        out = crf_train(spec, k, model_path)
        sc = crf_score(model_path, spec["eval_file"])
        os.remove(model_path)
        rows.append({"max_iterations": k, "iterations": out["iterations"], "train_s": out["train_s"],
                     "test_f1": sc["f1"]})
        print(f"  CRFsuite max_iterations {k}: test F1 {100 * sc['f1']:.2f}", file=sys.stderr, flush=True)
    return {"c1": spec["c1"], "c2": spec["c2"], "rows": rows, "hwm_mb": proc_status()["VmHWM"]}


CHILDREN = {"lib-tune": lib_staged, "lib-curve": lib_staged, "lib-fit": lib_fit, "lib-memory": lib_memory_profile,
            "lib-floor": lib_floor,
            "crf-tune": crf_tune,
            "crf-fit": crf_fit, "crf-curve": crf_curve}


# ----------------------------------------------------------------------------- the parent
def run_child(kind: str, spec: dict, log) -> dict:
    """Run one child process; returns its JSON record plus its peak RSS, CPU seconds and wall time.

    The peak RSS is the child's own ``VmHWM`` read at its end (the high-water mark of its address space since
    ``exec``).  Not ``ru_maxrss``: Linux carries the image the child was forked from (this parent, with torch
    loaded) into it at ``exec``, so ``ru_maxrss`` is never below the parent's resident set.
    """
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        load_before = os.getloadavg()
        t0 = time.perf_counter()
        proc = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--child", kind, json.dumps(spec)],
                                stdout=out, stderr=err, text=True)
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        wall = time.perf_counter() - t0
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
    for line in stderr.splitlines():
        if line.startswith("  "):
            log(line)
    if proc.returncode != 0:
        raise RuntimeError(f"{kind} child failed ({proc.returncode}):\n{stderr[-4000:]}")
    rec = json.loads(stdout.strip().splitlines()[-1])
    rec.update(kind=kind, peak_rss_mb=rec.get("hwm_mb"), child_wall_s=wall, cpu_s=usage.ru_utime + usage.ru_stime,
               loadavg_before=load_before, loadavg_after=os.getloadavg())
    return rec


def paired_bootstrap(gold, pred_a, pred_b, samples: int = 10000, seed: int = 0) -> dict:
    """Paired bootstrap over sentences of the chunk-F1 difference ``F1(a) - F1(b)`` (Koehn 2004; Berg-Kirkpatrick
    et al. 2012): resample the test sentences with replacement, score both systems on each resample.

    Returns the observed difference, the 95% percentile interval, and the two-sided p-value of "no difference"
    (twice the fraction of resamples on the other side of zero, capped at 1), all in F1 points (%)."""
    import numpy as np

    chunking = chunk_f1_module()
    counts = np.zeros((len(gold), 5))  # n_true, n_pred a, n_correct a, n_pred b, n_correct b per sentence
    for i, (g, a, b) in enumerate(zip(gold, pred_a, pred_b, strict=True)):
        sa, sb = chunking.chunk_f1([g], [a]), chunking.chunk_f1([g], [b])
        counts[i] = (sa["n_true"], sa["n_pred"], sa["n_correct"], sb["n_pred"], sb["n_correct"])

    def f1(c):  # c: [..., 5] summed counts
        fa = 2 * c[..., 2] / (c[..., 0] + c[..., 1])
        fb = 2 * c[..., 4] / (c[..., 0] + c[..., 3])
        return 100 * (fa - fb)

    observed = float(f1(counts.sum(0)))
    rng = np.random.default_rng(seed)
    diffs = np.empty(samples)
    for j in range(0, samples, 500):  # 500 resamples at a time: [500, n] index matrix
        idx = rng.integers(0, len(gold), size=(min(500, samples - j), len(gold)))
        diffs[j: j + idx.shape[0]] = f1(counts[idx].sum(1))
    side = (diffs <= 0).mean() if observed > 0 else (diffs >= 0).mean()
    lo, hi = np.percentile(diffs, [2.5, 97.5])
    return {"difference": observed, "ci95": [float(lo), float(hi)], "p_two_sided": float(min(1.0, 2 * side)),
            "samples": samples, "seed": seed, "sentences": len(gold)}


def median(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def first_reach(curve: list[dict], target: float):
    """The first (seconds, F1) of a curve whose F1 is >= target, or None."""
    return next(((r["t"], r["test_f1"]) for r in curve if r["test_f1"] >= target - 1e-12), None)


def plot_labels(lam: float, c1: float, c2: float, stage: int) -> dict:
    return {"lib": f"torch_bcfw chain, BCFW lam {lam:g}: the model fit() returns at each gap check "
                   f"(every {stage} passes through fit())",
            "crf": f"CRFsuite L-BFGS c1 {c1:g} c2 {c2:g}: retrained with max_iterations = k"}


def plot(path: Path, lib_curve, crf_curve, lib_final, crf_final, labels) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 4.6))
    ax.plot([r["t"] for r in lib_curve], [100 * r["test_f1"] for r in lib_curve], "o-", color="C0",
            label=labels["lib"])
    ax.plot([r["t"] for r in crf_curve], [100 * r["test_f1"] for r in crf_curve], "s-", color="C1",
            label=labels["crf"])
    ax.axhline(100 * crf_final, color="C1", lw=0.8, ls=":", label=f"CRFsuite's final test F1 ({100 * crf_final:.2f})")
    ax.set_xlabel("seconds inside fit() (library) / Trainer.train() (CRFsuite); data loading excluded; "
                  "median of the timed runs", fontsize=8)
    ax.set_ylabel("test chunk F1 (%), conlleval, 2012 sentences")
    lo = min(100 * r["test_f1"] for r in lib_curve + crf_curve)
    ax.set_ylim(max(lo - 0.2, min(100 * lib_final, 100 * crf_final) - 1.5), max(100 * lib_final, 100 * crf_final) + 0.4)
    ax.set_title("CoNLL-2000 chunking, the same attributes: test F1 against training seconds", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def print_tuning(lib_tune, crf_tune, print_table) -> None:
    print("\ntuning on the held-out sentences (chunk F1 %, last stage / iteration):")
    print_table([{"library lam": r["lam"], "F1 returned": 100 * r["stages"][-1]["f1"],
                  "F1 last": 100 * r["stages"][-1]["f1_last"], "F1 averaged": 100 * r["stages"][-1]["f1_avg"],
                  "best F1 over checks": 100 * max(s["f1"] for s in r["stages"]),
                  "gap/primal": r["stages"][-1]["rel_gap"]} for r in lib_tune],
                ["library lam", "F1 returned", "F1 last", "F1 averaged", "best F1 over checks", "gap/primal"])
    if crf_tune:
        print()
        print_table([{"CRFsuite c1": r["c1"], "c2": r["c2"], "F1": 100 * r["heldout_f1"], "train s": r["train_s"]}
                     for r in crf_tune], ["CRFsuite c1", "c2", "F1", "train s"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lams", default="3e-3,1e-2,3e-2,1e-1,3e-1,1")
    ap.add_argument("--c1", default="0,0.1,0.2,0.5")
    ap.add_argument("--c2", default="1e-3,1e-2,0.1")
    ap.add_argument("--passes", type=float, default=40, help="BCFW passes of every library run")
    ap.add_argument("--stage", type=int, default=5, help="passes between exact gap checks (and F1 points)")
    ap.add_argument("--max-iterations", type=int, default=100, help="CRFsuite L-BFGS iterations")
    ap.add_argument("--curve-iterations", default="5,10,20,30,50,75",
                    help="CRFsuite retrains for the F1-against-time curve (plus the full run)")
    ap.add_argument("--repeats", type=int, default=3, help="timed runs of each, interleaved")
    ap.add_argument("--jobs", type=int, default=2, help="tuning / curve children run at once (timed runs: one)")
    ap.add_argument("--heldout", type=float, default=0.1, help="the last fraction of train.txt held out for tuning")
    ap.add_argument("--min-count", type=int, default=3)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--threads", type=int, default=2, help="torch threads of the timed library runs")
    ap.add_argument("--path", type=Path, default=None, help="CoNLL-2000 (default ../shared/data/conll2000)")
    ap.add_argument("--out", default="peers")
    ap.add_argument("--tune-only", action="store_true",
                    help="stop after the tuning on the held-out sentences (e.g. another --min-count; writes <out>.json)")
    ap.add_argument("--replot", action="store_true", help="redraw <out>.png from <out>.json")
    ap.add_argument("--loss", choices=("normalised", "unnormalised"), default="normalised",
                    help="the library's Hamming loss: divided by the sentence length (the Chain's) or not (with "
                         "--tune-only: a held-out check through the generic steps, much slower)")
    ap.add_argument("--significance", action="store_true",
                    help="one final run of each at the settings chosen in <out>.json, a paired bootstrap of the test "
                         "F1 difference over sentences, and the resident set of the library's imports alone "
                         "(writes <out>_significance.json)")
    ap.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        kind, spec = args.child
        print(json.dumps(CHILDREN[kind](json.loads(spec))))
        return

    sys.path.insert(0, str(HERE))
    from common import DATA, RESULTS, print_table, write_json

    if args.replot:
        d = json.loads((RESULTS / f"{args.out}.json").read_text())
        plot(RESULTS / f"{args.out}.png", d["curves"]["library"], d["curves"]["crfsuite"], d["final"]["library"]["test_f1"],
             d["final"]["crfsuite"]["test_f1"],
             plot_labels(d["chosen"]["lam"], d["chosen"]["c1"], d["chosen"]["c2"], d["settings"]["stage"]))
        print(f"wrote {RESULTS / (args.out + '.png')}")
        return

    t_start = time.perf_counter()
    path = str(args.path or DATA / "conll2000")
    if args.loss != "normalised" and not args.tune_only:
        ap.error("--loss unnormalised is a held-out check: give --tune-only")
    if not args.tune_only and not (args.c1 and args.c2):
        ap.error("the full comparison needs a CRFsuite grid (--c1, --c2)")
    log = lambda msg: print(msg, flush=True)  # noqa: E731
    work = tempfile.mkdtemp(prefix="peers-")
    try:
        if args.significance:
            significance(args, path, work, log, print_table, write_json, RESULTS)
        else:
            run(args, path, work, t_start, log, print_table, write_json, RESULTS)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def significance(args, path, work, log, print_table, write_json, RESULTS) -> None:
    """The final models of both at the settings the full run chose on the held-out sentences (read from
    ``<out>.json``): is the test F1 difference larger than the test set's sampling noise?  And how much of the
    library's peak is the import floor?"""
    from torch_bcfw.datasets.conll_chain import chunk_vocabulary, write_crfsuite_data

    chosen = json.loads((RESULTS / f"{args.out}.json").read_text())["chosen"]
    train_all, _, _, test = split_sentences(path, args.heldout)
    vocab = chunk_vocabulary(train_all, min_count=args.min_count)
    files = {part: os.path.join(work, f"final-{part}.txt") for part in ("train", "eval")}
    write_crfsuite_data(files["train"], train_all, vocab)
    write_crfsuite_data(files["eval"], test, vocab)
    base = {"path": path, "heldout": args.heldout, "min_count": args.min_count, "seed": args.seed, "workdir": work,
            "max_iterations": args.max_iterations, "tags": True}
    lib = run_child("lib-fit", {**base, "lam": chosen["lam"], "split": "final", "passes": args.passes,
                                "stage": args.stage, "threads": args.threads, "loss": "normalised"}, log)
    crf = run_child("crf-fit", {**base, "c1": chosen["c1"], "c2": chosen["c2"], "train_file": files["train"],
                                "eval_file": files["eval"]}, log)
    floor = run_child("lib-floor", {}, log)
    gold = [list(s.chunks) for s in test]
    boot = paired_bootstrap(gold, lib["test_tags"], crf["test_tags"])
    rows = [{"": "library (BCFW)", "setting": f"lam {chosen['lam']:g}", "test F1": 100 * lib["test_f1"],
             "peak RSS MB": lib["peak_rss_mb"]},
            {"": "CRFsuite (L-BFGS)", "setting": f"c1 {chosen['c1']:g}, c2 {chosen['c2']:g}",
             "test F1": 100 * crf["test_f1"], "peak RSS MB": crf["peak_rss_mb"]},
            {"": "library imports only", "setting": "torch, numba, torch_bcfw", "test F1": None,
             "peak RSS MB": floor["peak_rss_mb"]}]
    print_table(rows, ["", "setting", "test F1", "peak RSS MB"])
    print(f"\nlibrary - CRFsuite test F1: {boot['difference']:+.2f} points, 95% interval "
          f"[{boot['ci95'][0]:+.2f}, {boot['ci95'][1]:+.2f}], p = {boot['p_two_sided']:.3f} "
          f"(paired bootstrap over {boot['sentences']} sentences, {boot['samples']} resamples)")
    drop = ("test_tags", "checks")
    write_json(f"{args.out}_significance.json", {
        "benchmark": "peers-significance", "chosen": chosen,
        "settings": {k: v for k, v in vars(args).items() if k not in ("child", "path")} | {"path": path},
        "library": {k: v for k, v in lib.items() if k not in drop},
        "crfsuite": {k: v for k, v in crf.items() if k not in drop},
        "import_floor": floor, "paired_bootstrap": boot,
    })


def run(args, path, work, t_start, log, print_table, write_json, RESULTS) -> None:
    from torch_bcfw.datasets.conll_chain import chunk_vocabulary, write_crfsuite_data

    lams = [float(v) for v in args.lams.split(",")]
    grid = [(float(a), float(b)) for a in args.c1.split(",") if a for b in args.c2.split(",") if b]
    loads = [os.getloadavg()]

    # 1. the library's attributes, exported for CRFsuite (tuning split and full split)
    train_all, sub, held, test = split_sentences(path, args.heldout)
    files = {}
    t0 = time.perf_counter()
    for name, fit_s, parts in (("tune", sub, (("train", sub), ("eval", held))),
                               ("final", train_all, (("train", train_all), ("eval", test)))):
        vocab = chunk_vocabulary(fit_s, min_count=args.min_count)
        for part, sentences in parts:
            files[name, part] = os.path.join(work, f"{name}-{part}.txt")
            write_crfsuite_data(files[name, part], sentences, vocab)
    export_s = time.perf_counter() - t0
    log(f"exported the attributes for CRFsuite to {work} ({export_s:.0f} s); "
        f"{len(sub)} tuning + {len(held)} held-out sentences, {len(train_all)} train, {len(test)} test")
    base = {"path": path, "heldout": args.heldout, "min_count": args.min_count, "seed": args.seed,
            "workdir": work, "max_iterations": args.max_iterations}
    lib_spec = lambda lam, split, threads: {**base, "lam": lam, "split": split, "passes": args.passes,  # noqa: E731
                                            "stage": args.stage, "threads": threads, "loss": args.loss}
    crf_spec = lambda c1, c2, split: {**base, "c1": c1, "c2": c2, "train_file": files[split, "train"],  # noqa: E731
                                      "eval_file": files[split, "eval"]}

    # 2. tuning on the held-out sentences (children in parallel: their times are not reported as speed)
    tune_threads = 1 if args.jobs > 1 else args.threads
    tasks = [("lib-tune", lib_spec(lam, "tune", tune_threads)) for lam in lams]
    tasks += [("crf-tune", crf_spec(c1, c2, "tune")) for c1, c2 in grid]
    with ThreadPoolExecutor(args.jobs) as pool:
        tuned = list(pool.map(lambda kt: run_child(kt[0], kt[1], log), tasks))
    loads.append(os.getloadavg())
    lib_tune = [r for r in tuned if r["kind"] == "lib-tune"]
    crf_tune = [r for r in tuned if r["kind"] == "crf-tune"]
    best_lib = max(lib_tune, key=lambda r: r["stages"][-1]["f1"])
    best_crf = max(crf_tune, key=lambda r: r["heldout_f1"]) if crf_tune else {"c1": None, "c2": None, "heldout_f1": None}
    lam, c1, c2 = best_lib["lam"], best_crf["c1"], best_crf["c2"]
    log(f"chosen on the held-out sentences: library lam {lam:g} (F1 {100 * best_lib['stages'][-1]['f1']:.2f})"
        + (f", CRFsuite c1 {c1:g} c2 {c2:g} (F1 {100 * best_crf['heldout_f1']:.2f})" if crf_tune else ""))
    if args.tune_only:
        print_tuning(lib_tune, crf_tune, print_table)
        print(f"load average during the run (1/5/15 min): {loads}")
        write_json(f"{args.out}.json", {
            "benchmark": "peers", "tune_only": True,
            "settings": {k: v for k, v in vars(args).items() if k not in ("child", "path")} | {"path": path},
            "library_source": str(Path(sys.modules["torch_bcfw"].__file__).parent),
            "sizes": {"tune_sentences": len(sub), "heldout_sentences": len(held)},
            "export_s": export_s, "loadavg": loads, "total_s": time.perf_counter() - t_start,
            "chosen": {"lam": lam, "c1": c1, "c2": c2}, "tuning": {"library": lib_tune, "crfsuite": crf_tune},
        })
        return

    # 3. timed final runs, interleaved, one at a time
    lib_runs, crf_runs = [], []
    for r in range(args.repeats):
        order = [("lib", "crf"), ("crf", "lib")][r % 2]
        for who in order:
            if who == "lib":
                rec = run_child("lib-fit", lib_spec(lam, "final", args.threads), log)
                lib_runs.append(rec)
                log(f"  library run {r + 1}: fit {rec['fit_s']:.1f} s, test F1 {100 * rec['test_f1']:.2f}, "
                    f"peak RSS {rec['peak_rss_mb']:.0f} MB")
            else:
                rec = run_child("crf-fit", crf_spec(c1, c2, "final"), log)
                crf_runs.append(rec)
                log(f"  CRFsuite run {r + 1}: train {rec['train_s']:.1f} s, test F1 {100 * rec['test_f1']:.2f}, "
                    f"peak RSS {rec['peak_rss_mb']:.0f} MB")
    loads.append(os.getloadavg())

    # 4. F1 along the way: the library's staged run, CRFsuite's retrains (in parallel; only their F1 is used)
    ks = [int(k) for k in args.curve_iterations.split(",") if int(k) < args.max_iterations]
    with ThreadPoolExecutor(args.jobs) as pool:
        f_lib = pool.submit(run_child, "lib-curve", lib_spec(lam, "final", tune_threads), log)
        f_crf = pool.submit(run_child, "crf-curve", {**crf_spec(c1, c2, "final"), "iterations": ks}, log)
        lib_stage_run, crf_retrains = f_lib.result(), f_crf.result()
    loads.append(os.getloadavg())
    # 5. what fills the library's peak (a sampled run; not timed)
    memory = run_child("lib-memory", lib_spec(lam, "final", args.threads), log)
    log(f"  library memory profile: peak {memory['peak_rss_mb']:.0f} MB; largest parts at the peak: "
        + "; ".join(f"{c['mb']:.0f} MB {c['where']}" for c in memory["at_peak_mb"][:5]))

    # ---------------------------------------------------------------- summary
    n_checks = min(len(r["checks"]) for r in lib_runs)
    lib_curve = []
    for j in range(n_checks):
        passes = lib_runs[0]["checks"][j]["passes"]
        st = next(s for s in lib_stage_run["stages"] if abs(s["passes"] - passes) < 1e-9)
        lib_curve.append({"passes": passes, "t": median(r["checks"][j]["t"] for r in lib_runs),
                          "test_f1": st["f1"], "test_f1_last": st["f1_last"], "test_f1_avg": st["f1_avg"],
                          "gap": st["gap"], "rel_gap": st["rel_gap"], "selected": st["selected"]})
    crf_curve = [{"iterations": row["max_iterations"], "t": median(r["ticks"][row["iterations"] - 1] for r in crf_runs),
                  "test_f1": row["test_f1"]} for row in crf_retrains["rows"]]
    crf_curve.append({"iterations": crf_runs[0]["iterations"], "t": median(r["train_s"] for r in crf_runs),
                      "test_f1": crf_runs[0]["test_f1"]})
    lib_f1, crf_f1 = lib_runs[0]["test_f1"], crf_runs[0]["test_f1"]
    same_f1 = all(r["test_f1"] == lib_f1 for r in lib_runs) and all(r["test_f1"] == crf_f1 for r in crf_runs)
    staged_equal = abs(lib_curve[-1]["test_f1"] - lib_f1) < 1e-12 if lib_curve else False
    lib_med = {k: median(r[k] for r in lib_runs) for k in ("fit_s", "solver_time", "gap_time", "load_s",
                                                           "decode_s", "peak_rss_mb", "hwm_mb", "compile_s")}
    crf_med = {k: median(r[k] for r in crf_runs) for k in ("train_s", "load_s", "decode_s", "peak_rss_mb", "hwm_mb")}
    reach = first_reach(lib_curve, crf_f1)
    acceptance = {
        "f1_at_least_crfsuite": lib_f1 >= crf_f1,
        "time_to_crfsuite_f1_s": None if reach is None else reach[0],
        "time_below_crfsuite_train": reach is not None and reach[0] < crf_med["train_s"],
        "peak_rss_at_most_crfsuite": lib_med["peak_rss_mb"] <= crf_med["peak_rss_mb"],
    }
    levels = sorted({0.92, 0.925, 0.93, 0.9325, 0.935, lib_f1, crf_f1})
    time_to = [{"f1": lv, "library_s": (first_reach(lib_curve, lv) or (None,))[0],
                "crfsuite_s": (first_reach(crf_curve, lv) or (None,))[0]} for lv in levels]

    print_tuning(lib_tune, crf_tune, print_table)
    print("\nfinal runs on all training sentences (medians of the timed runs):")
    table = [
        {"": "library (BCFW)", "setting": f"lam {lam:g}, {args.passes:g} passes", "test F1": 100 * lib_f1,
         "train s": lib_med["fit_s"], "load+features s": lib_med["load_s"], "peak RSS MB": lib_med["peak_rss_mb"]},
        {"": "CRFsuite (L-BFGS)", "setting": f"c1 {c1:g}, c2 {c2:g}, {args.max_iterations} it.",
         "test F1": 100 * crf_f1, "train s": crf_med["train_s"], "load+features s": crf_med["load_s"],
         "peak RSS MB": crf_med["peak_rss_mb"]},
    ]
    print_table(table, ["", "setting", "test F1", "train s", "load+features s", "peak RSS MB"])
    print("\ntime to each test F1 level (s):")
    print_table([{"F1": 100 * r["f1"], "library": r["library_s"], "CRFsuite": r["crfsuite_s"]} for r in time_to],
                ["F1", "library", "CRFsuite"])
    print(f"\nacceptance: {acceptance}")
    print(f"load average during the run (1/5/15 min): {loads}")

    labels = plot_labels(lam, c1, c2, args.stage)
    png = RESULTS / f"{args.out}.png"
    RESULTS.mkdir(parents=True, exist_ok=True)
    plot(png, lib_curve, crf_curve, lib_f1, crf_f1, labels)
    print(f"wrote {png}")
    write_json(f"{args.out}.json", {
        "benchmark": "peers",
        "settings": {k: v for k, v in vars(args).items() if k not in ("child", "path")} | {"path": path},
        "library_source": str(Path(sys.modules["torch_bcfw"].__file__).parent),
        "sizes": {"tune_sentences": len(sub), "heldout_sentences": len(held), "train_sentences": len(train_all),
                  "test_sentences": len(test), "n_attributes_final": lib_runs[0]["n_attributes"],
                  "d_final": lib_runs[0]["d"], "nnz_final": lib_runs[0]["nnz"]},
        "export_s": export_s, "loadavg": loads, "total_s": time.perf_counter() - t_start,
        "chosen": {"lam": lam, "c1": c1, "c2": c2},
        "tuning": {"library": lib_tune, "crfsuite": crf_tune},
        "final": {"library": lib_med | {"test_f1": lib_f1, "test_f1_avg": lib_runs[0]["test_f1_avg"],
                                        "gap": lib_runs[0]["gap"], "primal": lib_runs[0]["primal"],
                                        "selected": lib_runs[0]["selected"], "passes": lib_runs[0]["passes"]},
                  "crfsuite": crf_med | {"test_f1": crf_f1, "iterations": crf_runs[0]["iterations"],
                                         "active_features": crf_runs[0]["active_features"]},
                  "same_f1_every_repeat": same_f1, "staged_run_ends_at_the_same_f1": staged_equal},
        "runs": {"library": lib_runs, "crfsuite": crf_runs},
        "curves": {"library": lib_curve, "crfsuite": crf_curve, "library_staged_run": lib_stage_run,
                   "crfsuite_retrains": crf_retrains},
        "memory_profile": {k: memory[k] for k in ("memory_stages", "peak_rss_mb", "sampled_peak_mb", "sampled_base_mb",
                                                  "at_peak_mb")},
        "time_to_f1": time_to, "acceptance": acceptance,
    })


if __name__ == "__main__":
    os.environ.setdefault("NUMBA_NUM_THREADS", "2")
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    main()
