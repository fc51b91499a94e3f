"""OCR-large (n = 6251, test fold 0): BCFW at lam in {0.01, 0.001, 0.0001}.

Usage:  python benchmarks/ocr_lambda_sweep.py [--passes 100]
Each lam runs BCFW (line search, uniform sampling, weighted averaging, seed 1) for a fixed budget
of effective passes (stopping earlier once the certified gap is below --gap-tol), with an exact
gap check every 10 passes.  ``test_err`` is the mean over words of the normalised Hamming
distance (the papers' test error), ``test_letter_err`` the per-letter error.  Prints a table and writes benchmarks/results/ocr_lambda_sweep.json.
"""
from __future__ import annotations

import argparse

from common import DATA, print_table, write_json
from torch_bcfw import Chain, fit
from torch_bcfw.datasets.ocr import load_ocr_split


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--passes", type=float, default=100)
    ap.add_argument("--gap-tol", type=float, default=0.01)
    ap.add_argument("--lams", type=float, nargs="+", default=[0.01, 0.001, 0.0001])
    args = ap.parse_args()
    train, test = load_ocr_split(DATA / "ocr", "large", 0)
    rows, runs = [], {}
    for lam in args.lams:
        r = fit(Chain(128, 26), train, lam, test_data=test, max_passes=args.passes, gap_check=10, gap_tol=args.gap_tol)
        last = r.history[-1]
        letter_err = float((r.predict(test) != test.y).double().mean())
        rows.append({"lam": lam, "passes": r.passes, "stopped_by": r.stopped_by, "model": r.selected,
                     "gap": r.gap, "gap_last": last.gap_last, "gap_avg": last.gap_avg, "primal": r.primal,
                     "rel_gap": r.gap / r.primal, "train_err": last.train_loss, "test_err": last.test_loss, "test_letter_err": letter_err,
                     "solver_s": last.solver_time, "gap_check_s": last.gap_time})
        runs[str(lam)] = r.history
    print_table(rows, ["lam", "passes", "stopped_by", "model", "gap", "rel_gap", "primal", "train_err", "test_err",
                       "test_letter_err", "solver_s", "gap_check_s"])
    write_json("ocr_lambda_sweep.json", {"budget_passes": args.passes, "gap_tol": args.gap_tol, "rows": rows,
                                         "histories": runs})


if __name__ == "__main__":
    main()
