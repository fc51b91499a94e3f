"""Word alignment on the English-French Hansards (HLT-NAACL 2003 gold set): baselines and the matching SSVM.

Usage:  python benchmarks/alignment.py [--lams 1e-2 3e-3 1e-3 3e-4 1e-4] [--passes 300] [--no-eflomal]
        python benchmarks/alignment.py --solvers-only [--solver-lam 3e-3] [--solver-passes 100]
Writes benchmarks/results/alignment.json and prints one table (AER / precision / recall on the 347 test pairs,
gold 101-447, against their sure / possible links; corpus-level counts); ``--solvers`` / ``--solvers-only`` write
benchmarks/results/alignment_solvers.json and alignment_solvers.png.

Every setting is chosen on the 37 trial pairs only (lowest trial AER); the test pairs are decoded once per row.
All methods see the same text: the 2,383 unlabelled pairs plus the gold and trial texts (never their links).

* (a) Dice competitive linking (Melamed 2000) on the sentence co-occurrence Dice; threshold from the trial pairs.
* (b) the library's IBM-style models alone (:class:`torch_bcfw.features.alignment.AlignmentFeaturizer`: IBM
  Model 1 and the diagonal-prior IBM model, both directions, EM in torch): Viterbi links of one direction or
  symmetrised (intersection, grow-diag, union), or a threshold on the product of the two directions'
  posteriors; the variant and threshold are chosen on the trial pairs.
* (c) eflomal (Ostling & Tiedemann 2016; HMM + fertility, Gibbs sampling; GPLv3, optional: ``pip install
  eflomal``) on the same lower-cased text, intersection and grow-diag rows (when installed).
* (d) the matching SSVM (:class:`torch_bcfw.models.Matching`, asymmetric Hamming loss 3 / 1 over ``m + f``)
  with the text features, trained by BCFW on gold pairs 1-100; ``lam`` chosen on the trial pairs.
* (e) the same SSVM with eflomal's links as extra features (each direction, intersection, grow-diag, union,
  diagonal neighbours), as Taskar et al. (2005) used IBM Model 4's (when eflomal is installed).

``--solvers`` also compares, on problem (d) at its chosen ``lam`` (``--solvers-only``: at ``--solver-lam``, by
default the ``lam`` of (d) in alignment.json), BCFW, BCFW with gap sampling (``gap-fw``), with a cache
(``uniform-fw-cache``), MP-BCFW, batch FW and SSG, all with averaging and an exact gap check every 5 passes:
primal suboptimality (against the best dual value any of them certified, a lower bound on the optimum) and
certified gap against effective passes and seconds (``alignment_solvers.png``; SSG has no dual, hence no gap).

eflomal samples without a seed, so rows (c) and (e) move a little from run to run (about 0.5 AER point).
"""
from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from common import DATA, print_table, write_json
from torch_bcfw import fit
from torch_bcfw.datasets.hansards import load_hansards_problem
from torch_bcfw.features.alignment import (
    LINK_FEATURE_NAMES, dice_competitive_linking, link_indicator_features, run_eflomal, symmetrize,
)
from torch_bcfw.metrics.alignment import alignment_scores, alignment_scores_from_labelings
from torch_bcfw.solvers.record import plain_history


def scores(pairs, mats):
    """Corpus AER / precision / recall of per-pair 0/1 ``[m, f]`` predictions."""
    pred = [{(int(j), int(k)) for j, k in zip(*np.nonzero(y))} for y in mats]
    return alignment_scores(pred, [p.sure for p in pairs], [p.possible for p in pairs])


def choose(candidates, split):
    """``(setting, trial scores, test scores)`` of the candidate with the lowest trial AER.

    ``candidates``: ``{setting: function(pairs) -> list of [m, f] matrices}``."""
    best = None
    for setting, fn in candidates.items():
        s = scores(split.trial, fn(split.trial))
        if best is None or s.aer < best[1].aer:
            best = (setting, s, fn)
    setting, trial, fn = best
    return setting, trial, scores(split.test, fn(split.test))


def row(name, setting, trial, test, **extra):
    return {"method": name, "setting": setting, "trial_aer": trial.aer, "aer": test.aer,
            "precision": test.precision, "recall": test.recall, **extra}


def ssvm(model, train, trial, test, lams, passes, gap_tol):
    """Fit at every ``lam``; ``(lam, FitResult, trial scores, test scores, all trial AERs)`` of the best trial AER."""
    runs = []
    for lam in lams:
        t0 = time.perf_counter()
        r = fit(model, train, lam, max_passes=passes, gap_check=20, gap_tol=gap_tol, step="line_search",
                averaging=True, seed=1, progress=False)
        s = alignment_scores_from_labelings(trial, model.decode(r.weights, trial))
        runs.append((lam, r, s, time.perf_counter() - t0))
        print(f"  lam {lam:g}: trial AER {s.aer:.4f}, gap {r.gap:.2e} after {r.passes:g} passes", flush=True)
    lam, r, s, secs = min(runs, key=lambda t: (t[2].aer, -t[0]))
    te = alignment_scores_from_labelings(test, model.decode(r.weights, test))
    sweep = {f"{v:g}": {"trial_aer": t.aer, "gap": q.gap, "passes": q.passes, "seconds": sec}
             for v, q, t, sec in runs}
    return lam, r, s, te, sweep, secs


def solver_comparison(model, data, lam, passes, out_png):
    """BCFW variants, FW and SSG on one problem: histories and a figure."""
    configs = {
        "BCFW": ("bcfw", {}),
        "BCFW + gap sampling": ("bcfw", {"preset": "gap-fw"}),
        "BCFW + cache": ("bcfw", {"preset": "uniform-fw-cache"}),
        "MP-BCFW": ("mp-bcfw", {}),
        "FW": ("fw", {}),
        "SSG": ("ssg", {}),
    }
    hist = {}
    for name, (solver, opts) in configs.items():
        r = fit(model, data, lam, solver, max_passes=passes, gap_check=5, seed=1,
                progress=False, **opts)
        hist[name] = plain_history(r.history)
        gap = "-" if r.gap is None else f"{r.gap:.3e}"
        print(f"  {name}: certified gap {gap} after {r.passes:g} passes", flush=True)
    duals = [v for hs in hist.values() for h in hs for v in (h.get("dual"), h.get("dual_avg")) if v is not None]
    lower = max(duals)
    table = []
    for name, hs in hist.items():
        for h in hs:
            p = min(v for v in (h.get("primal"), h.get("primal_avg")) if v is not None)
            h["primal_subopt_bound"] = p - lower
        last = hs[-1]
        table.append({"solver": name, "passes": last["passes"], "seconds": last.get("solver_time"),
                      "gap": last.get("gap"), "primal_subopt": last["primal_subopt_bound"]})
    try:
        from torch_bcfw.plotting import pyplot, save_figure

        plt = pyplot()
        fig, axes = plt.subplots(1, 3, figsize=(15, 4))
        for name, hs in hist.items():
            x = [h["passes"] for h in hs]
            t = [h.get("solver_time", 0.0) for h in hs]
            axes[0].semilogy(x, [max(h["primal_subopt_bound"], 1e-12) for h in hs], label=name)
            if hs[-1].get("gap") is not None:
                axes[1].semilogy(x, [h["gap"] for h in hs], label=name)
                axes[2].semilogy(t, [h["gap"] for h in hs], label=name)
        for ax, xl, yl in zip(axes, ("effective passes", "effective passes", "seconds"),
                              ("primal - best dual", "certified gap", "certified gap")):
            ax.set_xlabel(xl)
            ax.set_ylabel(yl)
            ax.legend(fontsize=7)
        fig.suptitle(f"Hansards matching (n = {len(data)}, lam = {lam:g})")
        save_figure(fig, out_png)
    except Exception as exc:  # noqa: BLE001 - the figure is optional
        print(f"  (no figure: {exc})")
    return {"lam": lam, "lower_bound": lower, "histories": hist, "table": table}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default=str(DATA / "hansards_alignment"))
    ap.add_argument("--lams", type=float, nargs="+", default=[1e-2, 3e-3, 1e-3, 3e-4, 1e-4])
    ap.add_argument("--passes", type=float, default=300)
    ap.add_argument("--gap-tol", type=float, default=1e-4)
    ap.add_argument("--no-eflomal", action="store_true", help="skip (c) and (e) even when eflomal is installed")
    ap.add_argument("--solvers", action="store_true", help="also compare the solvers on problem (d)")
    ap.add_argument("--solvers-only", action="store_true", help="only the solver comparison (at --solver-lam)")
    ap.add_argument("--solver-lam", type=float, default=None, help="default: the lam of (d) in alignment.json")
    ap.add_argument("--solver-passes", type=float, default=100)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    t0 = time.perf_counter()
    prob = load_hansards_problem(args.data)
    fz, split = prob.featurizer, prob.split
    feat_time = time.perf_counter() - t0
    print(f"features: {fz.n_features} per link ({feat_time:.1f}s)", flush=True)
    if args.solvers_only:
        lam = args.solver_lam
        if lam is None:
            import json

            from common import RESULTS

            done = json.loads((RESULTS / "alignment.json").read_text())
            lam = float(next(r for r in done["rows"] if r["method"].startswith("(d)"))["setting"].split()[-1])
        run_solvers(prob, lam, args.solver_passes)
        return
    rows = []

    # (a) Dice competitive linking
    cands = {f"threshold {t:g}": (lambda pairs, t=t: [dice_competitive_linking(fz.dice(p), t) for p in pairs])
             for t in (0.0, 0.05, 0.1, 0.15, 0.2, 0.3, 0.4)}
    rows.append(row("(a) Dice competitive linking", *choose(cands, split)))

    # (b) the library's IBM models alone
    def ibm_links(tag, how):
        def fn(pairs):
            out = []
            for p in pairs:
                s = fz.ibm_posteriors(p, tag)
                if how == "fwd":
                    out.append(s["vit_fe"])
                elif how == "rev":
                    out.append(s["vit_ef"])
                elif how.startswith("posterior"):
                    out.append((s["post_fe"] * s["post_ef"] > float(how.split()[-1])).astype(np.int64))
                else:
                    out.append(symmetrize(s["vit_fe"], s["vit_ef"], how))
            return out
        return fn

    cands = {f"{tag} {how}": ibm_links(tag, how) for tag in fz._ibm_tags()
             for how in ("fwd", "rev", "intersection", "grow-diag", "union",
                         *(f"posterior product > {t * t:g}" for t in (0.1, 0.2, 0.3, 0.4, 0.5)))}
    rows.append(row("(b) library IBM model alone", *choose(cands, split)))

    eflomal_links = None
    if not args.no_eflomal:
        try:
            import eflomal  # noqa: F401

            texts = prob.corpus.texts()
            t1 = time.perf_counter()
            fwd, rev = run_eflomal(texts)
            eflomal_time = time.perf_counter() - t1
            n_u = len(prob.corpus.unlabelled)
            index = {"gold": n_u, "trial": n_u + len(prob.corpus.gold)}
            eflomal_links = {"gold": (fwd[index["gold"]: index["trial"]], rev[index["gold"]: index["trial"]]),
                             "trial": (fwd[index["trial"]:], rev[index["trial"]:])}
            print(f"eflomal: {eflomal_time:.1f}s", flush=True)
        except ImportError:
            print("eflomal is not installed: rows (c) and (e) skipped (pip install eflomal)")

    def eflomal_for(part, pairs):
        f, r = eflomal_links[part]
        if part == "gold":
            off = 0 if pairs is split.train else len(split.train)
            f, r = f[off: off + len(pairs)], r[off: off + len(pairs)]
        return f, r

    if eflomal_links is not None:
        for how in ("intersection", "grow-diag"):
            def fn(pairs, how=how):
                part = "trial" if pairs is split.trial else "gold"
                f, r = eflomal_for(part, pairs)
                return [symmetrize(a, b, how) for a, b in zip(f, r)]
            trial_s, test_s = scores(split.trial, fn(split.trial)), scores(split.test, fn(split.test))
            rows.append(row(f"(c) eflomal {how}", how, trial_s, test_s, seconds=eflomal_time))

    # (d) the SSVM with the text features
    print("(d) SSVM, text features", flush=True)
    lam, r, tr_s, te_s, sweep, secs = ssvm(prob.model, prob.train, prob.trial, prob.test, args.lams, args.passes,
                                          args.gap_tol)
    rows.append(row("(d) SSVM, text features", f"lam {lam:g}", tr_s, te_s, gap=r.gap, passes=r.passes,
                    seconds=secs, features=fz.n_features))
    lam_d, sweep_d = lam, sweep

    # (e) the SSVM with eflomal's links as extra features
    sweep_e = None
    if eflomal_links is not None:
        from torch_bcfw.models import Matching

        def with_links(data, part, pairs, cols):
            f, r_ = eflomal_for(part, pairs)
            extra = torch.cat([link_indicator_features(a, b).reshape(-1, len(LINK_FEATURE_NAMES))
                               for a, b in zip(f, r_)])
            return data.with_features(torch.cat([data.x[:, cols], extra], 1))

        # the text features to keep beside eflomal's links, chosen on the trial pairs with lam
        feature_sets = {"all text features": list(range(fz.n_features)),
                        "text features without the HMM": [i for i, n in enumerate(fz.names)
                                                          if not n.startswith("hmm_")]}
        best_e, sweep_e = None, {}
        for set_name, cols in feature_sets.items():
            train_e = with_links(prob.train, "gold", split.train, cols)
            trial_e = with_links(prob.trial, "trial", split.trial, cols)
            test_e = with_links(prob.test, "gold", split.test, cols)
            model_e = Matching(train_e.n_inputs, prob.model.miss_cost, prob.model.extra_cost, prob.model.normalize)
            print(f"(e) SSVM, eflomal links + {set_name}", flush=True)
            out = ssvm(model_e, train_e, trial_e, test_e, args.lams, args.passes, args.gap_tol)
            sweep_e[set_name] = out[4]
            if best_e is None or out[2].aer < best_e[1][2].aer:
                best_e = (set_name, out, train_e.n_inputs)
        set_name, (lam, r, tr_s, te_s, _, secs), n_e = best_e
        rows.append(row("(e) SSVM, text + eflomal links", f"lam {lam:g}, {set_name}", tr_s, te_s, gap=r.gap,
                        passes=r.passes, seconds=secs, features=n_e))

    print()
    print_table(rows, ["method", "setting", "trial_aer", "aer", "precision", "recall", "gap", "passes"])
    payload = {"protocol": "train gold 1-100, settings on the 37 trial pairs, test gold 101-447 (347 pairs)",
               "feature_names": fz.names, "feature_seconds": feat_time, "rows": rows,
               "ssvm_lam_sweep": {"d": sweep_d, "e": sweep_e},
               "eflomal": eflomal_links is not None}
    write_json("alignment.json", payload)
    if args.solvers:
        run_solvers(prob, args.solver_lam or lam_d, args.solver_passes)


def run_solvers(prob, lam, passes) -> None:
    from common import RESULTS

    print(f"solver comparison on (d) at lam {lam:g}", flush=True)
    comp = solver_comparison(prob.model, prob.train, lam, passes, RESULTS / "alignment_solvers.png")
    print_table(comp["table"], ["solver", "passes", "seconds", "gap", "primal_subopt"])
    write_json("alignment_solvers.json", comp)


if __name__ == "__main__":
    main()
