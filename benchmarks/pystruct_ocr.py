"""Seconds per BCFW pass of pystruct 0.3.2's ``FrankWolfeSSVM`` on a chain problem (the issue's baseline).

Runs in a *separate* interpreter that has pystruct (it needs NumPy < 1.24 and cannot share an environment
with this project); ``benchmarks/ocr_speed.py --pystruct-python PATH`` exports OCR-large to a ``.npz`` and calls
this script on it, so both solvers are timed on the same data, machine and session.

Usage:  PYSTRUCT_PYTHON benchmarks/pystruct_ocr.py DATA.npz [--passes 1 4] [--repeat 2] [--lam 0.01] [--json OUT]

``DATA.npz`` holds ``x: float[N_tok, F]``, ``y: int[N_tok]`` and ``offsets: int[n + 1]`` (word ``i`` is tokens
``offsets[i]:offsets[i + 1]``).  The learner is ``FrankWolfeSSVM(ChainCRF(), C = 1 / (lam n), batch_mode=False,
line_search=True, do_averaging=True)`` (block-coordinate Frank-Wolfe with line search and weighted averaging,
as our default) with the duality-gap check disabled.  ``fit`` with ``max_iter = p`` runs ``p`` passes after a
set-up (joint features of the true labelings etc.); the time per pass is the marginal one,
``(t(p2) - t(p1)) / (p2 - p1)`` from the fastest of ``--repeat`` fits at each of the two pass counts.

A pystruct 0.3.2 environment for Python 3.11 (the release's generated C does not compile there): a venv with
``setuptools<58`` (the package uses ``use_2to3``), ``numpy==1.23.5`` (it uses ``np.float``), ``scikit-learn<1.3``,
``cvxopt``, ``cython<3``; a module ``sklearn/externals/joblib.py`` containing ``from joblib import *``; then, in a
checkout of the v0.3.2 sources, regenerate ``src/utils.c`` and ``pystruct/inference/_viterbi.c`` with
``cython -2`` from their ``.pyx`` and ``pip install --no-build-isolation --no-deps .``.
"""
from __future__ import annotations

import argparse
import json
import time

import numpy as np
from pystruct.learners import FrankWolfeSSVM
from pystruct.models import ChainCRF


def fit_seconds(X: list, Y: list, lam: float, passes: int) -> float:
    """Wall seconds of one ``FrankWolfeSSVM.fit`` with ``max_iter = passes``."""
    svm = FrankWolfeSSVM(model=ChainCRF(), C=1.0 / (lam * len(X)), max_iter=passes, batch_mode=False,
                         line_search=True, check_dual_every=10 ** 9, do_averaging=True, random_state=0, verbose=0)
    t0 = time.perf_counter()
    svm.fit(X, Y)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("data", help=".npz with x, y, offsets")
    ap.add_argument("--passes", type=int, nargs=2, default=[1, 4], help="the two pass counts p1 < p2")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--lam", type=float, default=0.01)
    ap.add_argument("--json", help="write the figures here")
    args = ap.parse_args()
    p1, p2 = args.passes
    if not 0 < p1 < p2:
        raise SystemExit(f"--passes needs 0 < p1 < p2, got {p1} {p2}")
    d = dict(np.load(args.data))
    off = d["offsets"]
    X = [d["x"][off[i]:off[i + 1]].astype(np.float64) for i in range(len(off) - 1)]
    Y = [d["y"][off[i]:off[i + 1]].astype(np.int64) for i in range(len(off) - 1)]
    t1 = min(fit_seconds(X, Y, args.lam, p1) for _ in range(args.repeat))
    t2 = min(fit_seconds(X, Y, args.lam, p2) for _ in range(args.repeat))
    out = {"n": len(X), "lam": args.lam, "passes": [p1, p2], "fit_s": [t1, t2],
           "pass_s": (t2 - t1) / (p2 - p1), "setup_s": t1 - p1 * (t2 - t1) / (p2 - p1),
           "numpy": np.__version__}
    print(f"pystruct FrankWolfeSSVM on n = {len(X)}: {out['pass_s']:.3f} s per pass (set-up {out['setup_s']:.2f} s)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
