"""SSG steps on chains: the compiled steps (:class:`torch_bcfw.duals.chain_subgradient.ChainSubgradientSteps`) against
the generic dense ones (:class:`torch_bcfw.duals.subgradient.SubgradientSteps`) on OCR-large and CoNLL (all 8936
sentences, d = 1.6M), with averaging, one thread, the same block order; the generic steps run on a prefix of it.

    python benchmarks/ssg_speed.py [--generic-steps 600]

Prints ms per step and writes ``benchmarks/results/ssg_speed.json``.
"""
from __future__ import annotations

import argparse
import os
import time

import numpy as np
import torch

from common import DATA, print_table, write_json
from torch_bcfw import Chain
from torch_bcfw.datasets.conll_chain import load_conll_problem
from torch_bcfw.datasets.ocr import load_ocr_split
from torch_bcfw.duals.chain_subgradient import ChainSubgradientSteps
from torch_bcfw.duals.subgradient import SubgradientSteps


def per_step(steps, order) -> float:
    t0 = time.perf_counter()
    steps.advance(order)
    return (time.perf_counter() - t0) / len(order)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--generic-steps", type=int, default=600, help="steps timed for the generic (slow) steps")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    train, _ = load_ocr_split(DATA / "ocr", "large", 0)
    conll = load_conll_problem(DATA / "conll2000")
    rows = []
    for name, model, data in (("ocr-large", Chain(128, 26), train), ("conll", conll.model, conll.train)):
        lam = 1.0 / len(data)
        order = np.random.default_rng(0).integers(0, len(data), size=len(data))
        compiled = ChainSubgradientSteps(model, data, lam, True)
        compiled.advance(order[:10])  # compilation (numba's cache) outside the timing
        generic = SubgradientSteps(model, data, lam, True)
        generic.advance(order[:10])
        c = per_step(compiled, order[10:])
        g = per_step(generic, order[10 : 10 + args.generic_steps])
        rows.append({"problem": name, "n": len(data), "d": model.n_features, "generic_ms": 1e3 * g,
                     "compiled_ms": 1e3 * c, "speedup": g / c, "compiled_s_per_pass": c * len(data),
                     "generic_s_per_pass": g * len(data)})
    print_table(rows, ["problem", "n", "d", "generic_ms", "compiled_ms", "speedup", "generic_s_per_pass",
                       "compiled_s_per_pass"])
    write_json("ssg_speed.json", {"benchmark": "ssg_speed", "rows": rows, "generic_steps": args.generic_steps,
                                  "load_average": os.getloadavg()})


if __name__ == "__main__":
    main()
