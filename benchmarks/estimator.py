"""The scikit-learn estimator in scikit-learn's own tools: a parallel grid search, and a multiclass problem.

    python benchmarks/estimator.py

* **Grid search** -- ``GridSearchCV(SSVM(Chain(128, 26), max_passes=10), {"lam": 3 values},
  cv=KFold(3, shuffle=True, random_state=0))`` on OCR-small (fold 0, 626 words, the per-word arrays of
  ``docs/guides/ocr.md``): serial, ``n_jobs=2`` with joblib's default process backend (its first call starts the
  worker processes, the second reuses them) and ``n_jobs=2`` with the threading backend; seconds and the best
  ``lam``.
* **Multiclass** -- scikit-learn's digits (the first 75% of the images for training, the rest for testing, pixels
  scaled to [0, 1]): ``SSVM(Multiclass(64, 10), lam=1e-3)`` (20 passes) against ``LinearSVC(C=1 / (lam n))`` (the
  same objective up to the scaling, Crammer-Singer's multiclass hinge for the SSVM): fit seconds and test accuracy.

Writes ``benchmarks/results/estimator.json`` and prints both tables.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import DATA, print_table, write_json  # noqa: E402


def grid_search() -> list[dict]:
    import joblib
    from sklearn.model_selection import GridSearchCV, KFold

    from torch_bcfw import SSVM, Chain
    from torch_bcfw.datasets.ocr import load_ocr

    words = load_ocr(str(DATA / "ocr"))
    small = np.nonzero(words.folds == 0)[0]
    X = [words.images[i].astype(np.float64) for i in small]
    Y = [words.labels[i] for i in small]
    rows = []
    settings = [("serial", 1, None), ("processes (loky), first call", 2, None), ("processes (loky), warm", 2, None),
                ("threads", 2, "threading")]
    for name, jobs, backend in settings:
        est = SSVM(Chain(128, 26), max_passes=10, gap_check=10)
        search = GridSearchCV(est, {"lam": [1.0, 0.1, 0.01]}, cv=KFold(3, shuffle=True, random_state=0), n_jobs=jobs)
        t0 = time.perf_counter()
        with joblib.parallel_config(backend=backend or "loky"):
            search.fit(X, Y)
        rows.append({"setting": name, "n_jobs": jobs, "seconds": time.perf_counter() - t0,
                     "best_lam": search.best_params_["lam"], "best_score": search.best_score_})
    for r in rows:
        r["vs_serial"] = r["seconds"] / rows[0]["seconds"]
    return rows


def multiclass(lam: float = 1e-3) -> list[dict]:
    from sklearn.datasets import load_digits
    from sklearn.svm import LinearSVC

    from torch_bcfw import SSVM, Multiclass

    d = load_digits()
    n = int(0.75 * len(d.target))
    x, y = d.data / 16.0, d.target
    rows = []
    est = SSVM(Multiclass(64, 10), lam=lam, max_passes=20, gap_check=20)
    est.fit(x[:4], y[:4])  # compile and warm up outside the clock
    t0 = time.perf_counter()
    est.fit(x[:n], y[:n])
    rows.append({"model": "SSVM(Multiclass), BCFW 20 passes", "seconds": time.perf_counter() - t0,
                 "test_accuracy": est.score(x[n:], y[n:]), "certified_gap": est.gap_})
    svc = LinearSVC(C=1.0 / (lam * n), multi_class="crammer_singer", max_iter=10_000)
    t0 = time.perf_counter()
    svc.fit(x[:n], y[:n])
    rows.append({"model": "LinearSVC (crammer_singer)", "seconds": time.perf_counter() - t0,
                 "test_accuracy": svc.score(x[n:], y[n:]), "certified_gap": None})
    return rows


def main() -> None:
    grid = grid_search()
    print_table(grid, ["setting", "n_jobs", "seconds", "vs_serial", "best_lam", "best_score"])
    mc = multiclass()
    print_table(mc, ["model", "seconds", "test_accuracy", "certified_gap"])
    write_json("estimator.json", {"command": "python benchmarks/estimator.py", "date": time.strftime("%Y-%m-%d"),
                                  "grid_search": grid,
                                  "multiclass": mc, "ssvm_over_linearsvc": mc[0]["seconds"] / mc[1]["seconds"]})


if __name__ == "__main__":
    main()
