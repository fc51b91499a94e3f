"""Seconds per effective BCFW pass and per exact gap pass on OCR-large (n = 6251), with in-run baselines.

Usage:  python benchmarks/ocr_speed.py [--repeat 10] [--pystruct-python PATH]
Writes benchmarks/results/ocr_speed.json and prints a table.

Compared in the same run on the same machine:
  * the compiled (numba) fused BCFW step kernel of ``ChainDualState`` (with / without averaging);
  * the generic torch step path (``generic_plan_steps``: one batched-oracle call per block step);
  * a plain NumPy step loop with dense ``w_i`` (benchmarks/baselines.py, pystruct-style);
  * with ``--pystruct-python PATH`` (an interpreter with pystruct 0.3.2, see benchmarks/pystruct_ocr.py):
    pystruct's ``FrankWolfeSSVM`` on the same words, in a subprocess after the kernel timings;
  * the exact gap pass (compiled Viterbi over all words in parallel threads) vs the length-bucketed
    torch recursion (the device-agnostic path used on CUDA) and one padded batch.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import tempfile
from pathlib import Path

import numpy as np
import torch

from common import DATA, print_table, timed, write_json
from baselines import NumpyChainBCFW
from torch_bcfw.datasets.ocr import load_ocr_split
from torch_bcfw.duals.plan import StepPlan, generic_plan_steps
from torch_bcfw.duals.stepsize import LINE_SEARCH
from torch_bcfw.inference.viterbi import _viterbi_same_length, viterbi_packed_torch
from torch_bcfw.models import Chain
from torch_bcfw.certificate import certify


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=10)
    ap.add_argument("--baseline-steps", type=int, default=400)
    ap.add_argument("--pystruct-python", help="a Python interpreter with pystruct 0.3.2: also time its FrankWolfeSSVM")
    args = ap.parse_args()
    train, test = load_ocr_split(DATA / "ocr", "large", 0)
    model = Chain(128, 26)
    n, lam = len(train), 0.01
    rng = np.random.default_rng(0)
    rows = []

    for averaging in (True, False):
        state = model.dual_state(train, lam)
        state.run_steps(rng.integers(0, n, 3 * n), LINE_SEARCH, averaging)  # compile + leave w = 0 behind
        t = timed(lambda: state.run_steps(rng.integers(0, n, n), LINE_SEARCH, averaging), repeat=args.repeat)
        rows.append({"what": f"BCFW pass, compiled kernel, averaging={averaging}", "s_min": t["min"], "s_median": t["median"]})
    kernel_pass = rows[0]["s_min"]

    m = args.baseline_steps
    state = model.dual_state(train, lam)
    state.run_steps(rng.integers(0, n, 3 * n), LINE_SEARCH, True)
    order = rng.integers(0, n, m)
    t = timed(lambda: generic_plan_steps(state, StepPlan.plain(order, LINE_SEARCH, True)), repeat=2)
    rows.append({"what": "BCFW pass, generic torch step path (extrapolated)", "s_min": t["min"] * n / m,
                 "s_median": t["median"] * n / m})

    xs = [train.x[train.offsets[i]:train.offsets[i + 1]].numpy() for i in range(n)]
    ys = [train.y[train.offsets[i]:train.offsets[i + 1]].numpy() for i in range(n)]
    base = NumpyChainBCFW(xs, ys, 26, lam)
    for i in rng.integers(0, n, 2 * n):
        base.step(int(i))

    def numpy_steps():
        for i in order:
            base.step(int(i))

    t = timed(numpy_steps, repeat=2)
    rows.append({"what": "BCFW pass, NumPy dense-w_i step loop (extrapolated)", "s_min": t["min"] * n / m,
                 "s_median": t["median"] * n / m})

    w, ell = state.w.clone(), state.ell
    t = timed(lambda: model.oracle(w, train), repeat=args.repeat)
    rows.append({"what": "exact gap pass: batched loss-augmented Viterbi, float64", "s_min": t["min"], "s_median": t["median"]})
    oracle_pass = t["min"]
    t = timed(lambda: certify(model, train, w, ell, lam), repeat=args.repeat)
    rows.append({"what": "exact gap pass incl. primal/dual (certify)", "s_min": t["min"], "s_median": t["median"]})
    aug = model.unary_scores(w, train) + model.loss_unaries(train)
    trans = model.unpack(w)[4]
    t = timed(lambda: viterbi_packed_torch(aug, train.offsets, trans), repeat=args.repeat)
    rows.append({"what": "baseline: bucketed torch Viterbi alone (the CUDA path)", "s_min": t["min"], "s_median": t["median"]})
    w32 = w.float()
    t = timed(lambda: model.oracle(w32, train), repeat=args.repeat)
    rows.append({"what": "exact gap pass: batched Viterbi, float32", "s_min": t["min"], "s_median": t["median"]})

    def padded_oracle():
        U = model.unary_scores(w, train) + model.loss_unaries(train)
        xp = torch.full((n, int(train.lengths.max()), 26), 0.0, dtype=U.dtype)
        mask = torch.arange(xp.shape[1])[None, :] < train.lengths[:, None]
        xp[mask] = U
        # one padded batch: pad with a label-independent score so padding never changes the argmax order
        return _viterbi_same_length(xp, model.unpack(w)[4])

    t = timed(padded_oracle, repeat=args.repeat)
    rows.append({"what": "baseline: one padded batch Viterbi (no length buckets)", "s_min": t["min"], "s_median": t["median"]})

    summary = {
        "bcfw_pass_s": kernel_pass,
        "gap_pass_s": oracle_pass,
        "speedup_vs_numpy_loop": rows[3]["s_min"] / kernel_pass,
        "speedup_vs_generic_torch": rows[2]["s_min"] / kernel_pass,
    }
    if args.pystruct_python:
        py = pystruct_pass(args.pystruct_python, train, lam)
        rows.append({"what": "pystruct 0.3.2 FrankWolfeSSVM pass (marginal; same data)", "s_min": py["pass_s"],
                     "s_median": None})
        summary["pystruct_pass_s"] = py["pass_s"]
        summary["speedup_vs_pystruct"] = py["pass_s"] / kernel_pass
    print_table(rows, ["what", "s_min", "s_median"])
    print({k: round(v, 4) for k, v in summary.items()})
    write_json("ocr_speed.json", {"n": n, "lam": lam, "rows": rows, "summary": summary})


def pystruct_pass(python: str, train, lam: float) -> dict:
    """Run benchmarks/pystruct_ocr.py under ``python`` on ``train`` (exported to a temporary ``.npz``)."""
    with tempfile.TemporaryDirectory() as tmp:
        data, out = Path(tmp) / "ocr.npz", Path(tmp) / "pystruct.json"
        np.savez(data, x=train.x.numpy(), y=train.y.numpy(), offsets=train.offsets.numpy())
        subprocess.run([python, str(Path(__file__).with_name("pystruct_ocr.py")), str(data), "--lam", str(lam),
                        "--json", str(out)], check=True)
        return json.loads(out.read_text())


if __name__ == "__main__":
    torch.manual_seed(0)
    main()
