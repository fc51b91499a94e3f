"""GPU readiness in one call: the CUDA tests, OCR-large on the device with the CPU kernel as the in-run baseline,
chain MAP against torch-struct on the same device.

Usage:  python benchmarks/gpu.py [--device cuda|cpu] [--quick] [--sections tests,ocr,map,profile] [--out PATH]
Writes benchmarks/results/gpu_<device>.json (after every section, so a cut-off run keeps what it measured) and
prints one table per section.

Sections:
  * ``tests``: ``pytest -m cuda`` on the test files that hold CUDA tests (skipped there when CUDA is absent);
  * ``ocr``: OCR-large (train folds 1-9, n = 6251, ``lam = 0.01``), the same seed everywhere: plain BCFW with the
    compiled CPU kernel (the baseline), plain BCFW with the data on the device (the per-block torch loop there),
    mini-batch rounds at tau 16 / 64 / 256 / 1024 on the device and on the CPU, and the exact gap pass (one
    loss-augmented decode of every word) on both; seconds per effective pass and the certified gap reached;
  * ``profile`` (not by default): torch's profiler over 200 plain steps and 10 rounds of 1024 blocks;
  * ``strategy``: two processes (``torchrun``, gloo) with the data on the device (one GPU: both ranks share it) run
    the calibration of ``strategy="auto"`` (:func:`~torch_bcfw.planning.choose_strategy`) on OCR-large:
    its measured figures, predictions and choice, and the round size ``batch_size="auto"`` measures there;
  * ``map``: Viterbi decoding of every OCR-large word (the library's ``viterbi_packed``) against torch-struct's
    ``LinearChainCRF.max`` (one call per word length), the scores compared, on the device.
``--device cpu`` runs every section on the CPU (the device rows then measure the CPU's torch paths), which is how
the script is tested on machines without a GPU; ``--quick`` uses the first 600 words and fewer passes.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import traceback
from pathlib import Path

import torch

from common import DATA, ROOT, RESULTS, machine, print_table
from torch_bcfw import fit
from torch_bcfw.datasets.ocr import load_ocr_split
from torch_bcfw.inference.viterbi import viterbi_packed
from torch_bcfw.models import Chain
from torch_bcfw.certificate import certify

CUDA_TEST_FILES = ["test_cuda.py", "test_nn.py", "test_lightning.py", "test_marginals.py", "test_matching.py",
                   "test_pose.py", "test_tree_inference.py"]
LAM = 0.01
ROUND_SIZES = (16, 64, 256, 1024)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def describe(device: torch.device) -> dict:
    out = {"device": str(device), **machine()}
    if device.type == "cuda":
        p = torch.cuda.get_device_properties(device)
        out.update(gpu=p.name, gpu_memory_gib=round(p.total_memory / 2**30, 1), cuda=torch.version.cuda)
    return out


def run_tests(timeout: float, log: Path) -> dict:
    """``pytest -m cuda`` in a subprocess; the summary line, exit code and seconds (the whole output to ``log``)."""
    files = [str(ROOT / "tests" / f) for f in CUDA_TEST_FILES]
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-m", "cuda", "-p", "no:cacheprovider", "-rA", *files],
                          cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    log.write_text(proc.stdout + proc.stderr)
    lines = [ln for ln in proc.stdout.splitlines() if ln.strip()]
    print("\n".join(lines[-30:]))
    return {"returncode": proc.returncode, "summary": lines[-1] if lines else "", "seconds": time.perf_counter() - t0,
            "failures": [ln for ln in lines if ln.startswith(("FAILED", "ERROR"))]}


def one_fit(model, data, device: torch.device, tau: int, passes: float, what: str) -> dict:
    """One BCFW fit of ``passes`` effective passes, timed; its certified gap at the end."""
    sync(device)
    t0 = time.perf_counter()
    try:
        res = fit(model, data, LAM, batch_size=tau, max_passes=passes, gap_check=max(1, int(passes)), seed=1)
    except Exception as exc:  # a failing path is a finding: record it and measure the others
        traceback.print_exc()
        return {"what": what, "device": data.x.device.type, "tau": tau, "error": f"{type(exc).__name__}: {exc}"}
    sync(device)
    wall = time.perf_counter() - t0
    done = res.counters["work"] / len(data)
    return {"what": what, "device": data.x.device.type, "tau": res.options.batch_size, "passes": done, "wall_s": wall,
            "solver_s": res.counters["solver_time"], "s_per_pass": res.counters["solver_time"] / done,
            "gap": res.gap, "primal": res.history[-1].primal}


def gap_pass(model, data, w: torch.Tensor, device: torch.device, repeat: int) -> dict:
    """Seconds of one exact gap pass (loss-augmented decoding of every example and the primal), best of ``repeat``."""
    w = w.to(data.x.device)
    certify(model, data, w, None, LAM)  # warm-up (compilation, CUDA context)
    ts = []
    for _ in range(repeat):
        sync(device)
        t0 = time.perf_counter()
        c = certify(model, data, w, None, LAM)
        sync(device)
        ts.append(time.perf_counter() - t0)
    return {"what": "exact gap pass", "device": data.x.device.type, "s_min": min(ts), "primal": c.primal}


def ocr_section(train, device: torch.device, quick: bool, report: dict, save) -> None:
    model = Chain(128, 26)
    on_dev = train.to(device)
    rows = report["ocr"] = []
    for tau in (1, 16):  # compile the CPU kernels (one-block steps, rounds) outside the timing
        fit(model, train[list(range(64))], LAM, batch_size=tau, max_passes=1, gap_check=1)
    passes = 2 if quick else 10
    rows.append(one_fit(model, train, torch.device("cpu"), 1, passes, "plain BCFW, compiled CPU kernel (baseline)")); save()
    # the per-block torch loop off the CPU: a fraction of a pass says its cost per pass
    frac = 0.05 if device.type == "cuda" else 0.02
    rows.append(one_fit(model, on_dev, device, 1, frac, "plain BCFW, data on the device")); save()
    rows.append(one_fit(model, on_dev, device, "auto", passes, "defaults (batch_size='auto'), data on the device"))
    save()
    for tau in ROUND_SIZES:
        if tau > len(train) // 2:
            continue
        rows.append(one_fit(model, on_dev, device, tau, passes, f"rounds tau={tau}, data on the device")); save()
        if device.type == "cuda":
            rows.append(one_fit(model, train, torch.device("cpu"), tau, passes, f"rounds tau={tau}, CPU")); save()
    w = torch.randn(model.n_features, dtype=torch.float64, generator=torch.Generator().manual_seed(0)) * 0.05
    gaps = report["ocr_gap_pass"] = [gap_pass(model, train, w, torch.device("cpu"), 3)]
    if device.type == "cuda":
        gaps.append(gap_pass(model, on_dev, w, device, 3))
        gaps[-1]["primal_rel_diff"] = abs(gaps[-1]["primal"] - gaps[0]["primal"]) / abs(gaps[0]["primal"])
    save()


def torch_struct_max(unary: torch.Tensor, offsets: torch.Tensor, trans: torch.Tensor) -> torch.Tensor:
    """Best chain scores by torch-struct's ``LinearChainCRF``, one batch per sequence length (lengths >= 2)."""
    import torch_struct

    off = offsets.cpu()
    lengths = off[1:] - off[:-1]
    out = unary.new_full((lengths.numel(),), float("nan"))
    for L in torch.unique(lengths).tolist():
        if L < 2:
            continue
        idx = torch.nonzero(lengths == L)[:, 0]
        tok = (off[idx][:, None] + torch.arange(L)).to(unary.device)
        U = unary[tok]  # [B, L, K]
        # edge potentials [B, L-1, K(next), K(prev)]; the first token's score folded into the first edge
        edge = trans.T[None, None].expand(len(idx), L - 1, -1, -1).clone() + U[:, 1:, :, None]
        edge[:, 0] += U[:, 0, None, :]
        out[idx.to(unary.device)] = torch_struct.LinearChainCRF(edge).max.detach()
    return out


def map_section(train, device: torch.device, report: dict, save) -> None:
    model = Chain(128, 26)
    data = train.to(device)
    w = torch.randn(model.n_features, dtype=torch.float64, generator=torch.Generator().manual_seed(1)).to(device)
    unary, trans = model.unary_scores(w, data), model.unpack(w)[4]
    rows = report["map"] = []
    for name, fn in (("viterbi_packed (torch_bcfw)", lambda: viterbi_packed(unary, data.offsets, trans)[1]),
                     ("LinearChainCRF.max (torch-struct)", lambda: torch_struct_max(unary, data.offsets, trans))):
        try:
            fn()
        except ImportError as exc:
            rows.append({"what": name, "error": str(exc)})
            continue
        ts = []
        for _ in range(5):
            sync(device)
            t0 = time.perf_counter()
            scores = fn()
            sync(device)
            ts.append(time.perf_counter() - t0)
        rows.append({"what": name, "device": device.type, "words": len(data), "s_min": min(ts), "scores": scores})
    if len(rows) == 2 and "scores" in rows[1]:
        a, b = rows[0]["scores"], rows[1]["scores"]
        ok = ~torch.isnan(b)
        rows[1]["max_abs_diff_to_viterbi"] = float((a[ok] - b[ok]).abs().max())
    for r in rows:
        r.pop("scores", None)
    save()


def profile_section(train, device: torch.device, report: dict, save) -> None:
    """Where the device's time goes: torch's profiler over 200 plain steps and 10 rounds of 1024 blocks."""
    from torch.profiler import ProfilerActivity, profile

    model = Chain(128, 26)
    on_dev = train.to(device)
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    report["profile"] = {}
    big = min(1024, len(train) // 2)
    for name, tau, passes in (("plain", 1, 200 / len(train)), (f"rounds_{big}", big, 10 * big / len(train))):
        fit(model, on_dev, LAM, batch_size=tau, max_passes=passes, gap_check=1)  # warm-up
        with profile(activities=acts) as prof:
            fit(model, on_dev, LAM, batch_size=tau, max_passes=passes, gap_check=1)
        ev = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)[:25]
        rows = [{"op": e.key, "calls": e.count, "self_cpu_ms": e.self_cpu_time_total / 1e3,
                 "device_ms": getattr(e, "self_device_time_total", 0.0) / 1e3} for e in ev]
        report["profile"][name] = rows
        print(f"profile: {name}")
        print_table(rows, ["op", "calls", "self_cpu_ms", "device_ms"])
        save()


def strategy_child(args) -> None:
    """One rank of the ``strategy`` section (under torchrun): the calibration on OCR-large with the data on the
    device; rank 0 writes it to ``args.out``."""
    import dataclasses

    from torch_bcfw.distributed import init_from_env
    from torch_bcfw.planning import choose_strategy, measured_round_size
    from torch_bcfw.solvers.run import options_for

    torch.set_num_threads(1)
    device = torch.device(args.device)
    ctx = init_from_env(backend="gloo", timeout_s=300)
    train, _ = load_ocr_split(str(DATA / "ocr"), "large", 0)
    if args.quick:
        train = train[list(range(600))]
    data, model, opts = train.to(device), Chain(128, 26), options_for("bcfw", progress=False)
    t0 = time.perf_counter()
    cal = choose_strategy(model, data, LAM, opts, ctx)
    seconds = time.perf_counter() - t0
    if ctx.rank == 0:
        out = {"device": str(device), "processes": ctx.world_size, "n": len(data), "calibration_s": seconds,
               **dataclasses.asdict(cal)}
        if device.type != "cpu":
            out["round_size_auto"] = measured_round_size(model, data, LAM, dataclasses.replace(opts, batch_size=1))
        Path(args.out).write_text(json.dumps(out))
    torch.distributed.destroy_process_group()


def strategy_section(device: torch.device, quick: bool, report: dict, save) -> None:
    import socket
    import tempfile

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "strategy.json"
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
               "--master-port", str(port), str(Path(__file__).resolve()), "--strategy-child", "--device", str(device),
               "--out", str(out)] + (["--quick"] if quick else [])
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join([str(ROOT),
                                                                                    os.environ.get("PYTHONPATH", "")])}
        run = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
        if run.returncode != 0 or not out.exists():
            report["strategy"] = {"error": (run.stdout + run.stderr)[-3000:]}
        else:
            report["strategy"] = json.loads(out.read_text())
    save()


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--quick", action="store_true", help="the first 600 OCR words, 2 passes per run")
    ap.add_argument("--sections", default="tests,ocr,map,strategy",
                    help="comma-separated: tests, ocr, map, profile, strategy")
    ap.add_argument("--strategy-child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--test-timeout", type=float, default=300.0)
    ap.add_argument("--out", type=Path, help="JSON path (default benchmarks/results/gpu_<device>.json)")
    args = ap.parse_args(argv)
    if args.strategy_child:
        return strategy_child(args)
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("CUDA is not available on this machine: run with --device cpu")
    device = torch.device(args.device)
    out = args.out or RESULTS / f"gpu_{args.device}.json"
    report = {"command": "python benchmarks/gpu.py " + " ".join(argv if argv is not None else sys.argv[1:]),
              "date": time.strftime("%Y-%m-%d"), "machine": describe(device), "quick": args.quick}

    def save():
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(report, indent=1))

    save()
    sections = set(args.sections.split(","))
    if not sections <= {"tests", "ocr", "map", "profile", "strategy"}:
        raise SystemExit(f"unknown section in --sections {args.sections!r}")
    if "tests" in sections:
        report["tests"] = run_tests(args.test_timeout, out.with_suffix(".tests.txt"))
        save()
    train, _ = load_ocr_split(str(DATA / "ocr"), "large", 0)
    if args.quick:
        train = train[list(range(600))]
    if "ocr" in sections:
        ocr_section(train, device, args.quick, report, save)
        print_table(report["ocr"], ["what", "device", "tau", "passes", "s_per_pass", "gap", "wall_s"])
        print_table(report["ocr_gap_pass"], ["what", "device", "s_min", "primal"])
    if "map" in sections:
        map_section(train, device, report, save)
        print_table(report["map"], ["what", "device", "words", "s_min", "max_abs_diff_to_viterbi"])
    if "profile" in sections:
        profile_section(train, device, report, save)
    if "strategy" in sections:
        strategy_section(device, args.quick, report, save)
        print_table([report["strategy"]], ["device", "strategy", "step_seconds", "oracle_seconds", "apply_seconds",
                                           "allreduce_seconds", "gather_seconds", "replicate_pass_seconds",
                                           "shard_pass_seconds", "split_pass_seconds", "calibration_s"])
    print(f"wrote {out}")
    return report


if __name__ == "__main__":
    main()
