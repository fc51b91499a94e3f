"""The pose tree head solved to a certified relative gap instead of a fixed number of passes, on saved heatmaps.

    python benchmarks/pose_tree_solve.py --run runs/pose [--types 1,3] [--lams 0.01,0.1,1,10] [--rel-gap 0.01]

Redoes stages 3 and 4 of ``examples/pose_lsp.py`` on the float16 heatmaps (and type maps) of the heatmap-only
network a run saved in ``<run>/heatmaps.safetensors``, with the run's sub-cell rule and options
(``<run>/report.json``): for every ``K`` of ``--types`` and ``lam`` of ``--lams``, a 2-fold cross-validated tree PCK@0.2 on the held-out images, each fold
solved by BCFW until its certified gap is at most ``--rel-gap`` of its primal (or ``--max-passes``); the best pair
on held-out trains the final head (same stopping rule), scored on the test images against the heatmaps' argmax
(95% paired image-bootstrap interval).  Prints a table and writes ``benchmarks/results/<--name>.json``.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
from common import print_table, write_json
from pose_lsp import E, argmax_pck, grid_pck, head_problem, positions

from torch_bcfw import fit
from torch_bcfw.cross_validation import cross_validate
from torch_bcfw.datasets.lsp import grid_to_joints
from torch_bcfw.datasets.lsp_tensors import LSPPoseSplits
from torch_bcfw.inference.subcell import argmax_positions
from torch_bcfw.io.tree_file import load_tree
from torch_bcfw.metrics.pck import compare_pck


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run", required=True, help="output folder of examples/pose_lsp.py")
    ap.add_argument("--types", default="1,3")
    ap.add_argument("--lams", default="0.01,0.1,1,10")
    ap.add_argument("--rel-gap", type=float, default=0.01)
    ap.add_argument("--max-passes", type=float, default=200)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--name", default="pose_tree_solve")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    run = Path(args.run)
    report = json.loads((run / "report.json").read_text())
    opt = report["options"]
    saved = load_tree(run / "heatmaps.safetensors")
    S, G, rule = opt["size"], opt["size"] // 4, report["subcell_rule"]
    data = LSPPoseSplits(root=opt["data"], size=S, grid_size=G, limit=opt["limit"], test_limit=opt["test_limit"],
                         deformation_scale=opt["deformation_scale"], seed=opt["seed"])
    data.setup()
    train, test = data.train.fields, data.test.fields
    n, h = len(data.train), opt["holdout"]
    val_index = torch.arange(n - h, n)
    # the heatmap-only network's maps (a run whose tree epochs won saved those under their own names)
    only = "_heatmap_only" if "test_heatmap_only" in saved else ""
    heat_val, heat_test = saved["held_out" + only].float(), saved["test" + only].float()
    types_val = {int(k): v for k, v in saved["held_out_types"].items()}
    clusters = {int(k): (saved["type_offsets"][k], saved["type_scales"][k]) for k in saved["type_offsets"]}
    ks = [int(v) for v in args.types.split(",")]
    lams = [float(v) for v in args.lams.split(",")]
    solver = {"max_passes": args.max_passes, "rel_gap_tol": args.rel_gap, "step": "line_search",
              "sampling": "uniform", "averaging": True, "seed": 1}
    print(f"held-out argmax PCK@0.2 ({rule}): {argmax_pck(heat_val, train, val_index, S, rule):.4f}")

    rows, best = [], None
    for K in ks:
        model, head_data = head_problem(K, heat_val, types_val, train, val_index, G, data, clusters)
        for lam in lams:
            t = time.perf_counter()
            pred, gaps, passes = torch.empty(h, 14, 2, dtype=heat_val.dtype), [], []
            for f in cross_validate(model, head_data, torch.arange(h) % 2, lam, **solver):
                d = head_data[f.test_index]
                pred[f.test_index] = positions(model.decode_positions(f.result.weights, d), d.unary[:, :, 0], rule)
                last = f.result.history[-1]
                gaps.append(f.result.gap / last.primal)
                passes.append(last.passes)
            row = {"K": K, "lam": lam, "held_out_cv_pck": grid_pck(pred, train, val_index, S, G),
                   "fold_rel_gap_max": max(gaps),
                   "fold_passes_max": max(passes), "s": time.perf_counter() - t}
            rows.append(row)
            print_table([row], list(row))
            if best is None or row["held_out_cv_pck"] > best["held_out_cv_pck"]:
                best = row
    K, lam = best["K"], best["lam"]
    model, head_data = head_problem(K, heat_val, types_val, train, val_index, G, data, clusters)
    t = time.perf_counter()
    result = fit(model, head_data, lam, **solver)
    fit_s = time.perf_counter() - t
    test_types = {K: saved["test_types"][str(K)]} if K > 1 and str(K) in saved.get("test_types", {}) else {}
    if K > 1 and not test_types:
        raise SystemExit(f"the run saved no test type maps for K = {K} (it kept {list(saved.get('test_types', {}))})")
    _, test_data = head_problem(K, heat_test, test_types, None, None, G, data, clusters)
    tree = grid_to_joints(positions(model.decode_positions(result.weights, test_data), heat_test, rule), S, G)
    argmax = grid_to_joints(positions(argmax_positions(heat_test), heat_test, rule), S, G)
    cmp = compare_pck(tree.float(), argmax.float(), test["joints"], test["visible"], test["pck_torso"])
    final = {"K": K, "lam": lam, "gap": result.gap, "primal": result.history[-1].primal,
             "passes": result.history[-1].passes, "fit_s": fit_s, "test_argmax": cmp["pck_argmax"],
             "test_tree": cmp["pck_tree"], "tree_minus_argmax": cmp["pck_tree_minus_argmax"],
             "ci95": [cmp["pck_tree_minus_argmax_low"], cmp["pck_tree_minus_argmax_high"]]}
    print("\nchosen on held-out, test:")
    print_table([final], list(final))
    write_json(f"{args.name}.json", {"run": str(run), "subcell_rule": rule, "options": vars(args),
                                     "held_out": rows, "final": final, "edges": E})


if __name__ == "__main__":
    main()
