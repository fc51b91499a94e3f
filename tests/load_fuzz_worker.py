"""Worker of tests/test_load_fuzz.py: the problems and their saved runs, and the load-and-resume of mutated files
(in its own process, so that a crash fails the test instead of killing pytest).

    python tests/load_fuzz_worker.py RESULTS.json FILE...

For every file (a mutated ``FitResult`` of one of :data:`KINDS`, named ``<kind>__<anything>.pt``): load it, resume
the run for two passes and check its certificate against enumeration.  Writes ``{file: outcome}`` to RESULTS.json,
the outcome being ``"error: ..."`` (a clear ``ValueError`` / ``TypeError``), ``"ok"`` (the certificate holds) or
``"LIE: ..."`` / ``"UNCLEAR ...: ..."`` (failures); the file being processed is printed first, so a crash names it.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import torch  # noqa: E402

from conftest import brute_force_primal, random_chain_problem, random_multiclass_problem  # noqa: E402
from torch_bcfw import FitResult, Multiclass, fit, register_model  # noqa: E402
from torch_bcfw.duals import ActiveSetDualState  # noqa: E402

LAM = 0.2


class ActiveSetMulticlass(Multiclass):
    """A multiclass model whose dual state lists its labelings (an :class:`ActiveSetDualState`)."""

    def dual_state(self, data, lam, n_total=None):
        return ActiveSetDualState(self, data, lam, n_total)


register_model(ActiveSetMulticlass)


def _graph():
    from test_warm_start import _graph_problem

    return _graph_problem()


def _active_set():
    base, data = random_multiclass_problem(n=6, F=3, K=3, seed=2)
    return ActiveSetMulticlass(base.n_inputs, base.n_classes), data


#: state kind -> (problem, options of its run)
KINDS = {
    "chain": (lambda: random_chain_problem(n=5, F=3, K=2, max_len=3, seed=3), {}),
    "chain-cache": (lambda: random_chain_problem(n=5, F=3, K=2, max_len=3, seed=3), {"preset": "gap-pairwise-cache"}),
    "chain-minibatch": (lambda: random_chain_problem(n=5, F=3, K=2, max_len=3, seed=3), {"batch_size": 2}),
    "chain-mp": (lambda: random_chain_problem(n=5, F=3, K=2, max_len=3, seed=3), {"solver": "mp-bcfw"}),
    "multiclass": (lambda: random_multiclass_problem(n=6, F=3, K=3, seed=2), {}),
    "active-set": (_active_set, {"preset": "gap-fw"}),
    "graphcut": (_graph, {}),
}


def run_options(kind: str) -> tuple[str, dict]:
    opts = dict(KINDS[kind][1])
    return opts.pop("solver", "bcfw"), opts


def saved_run(kind: str) -> dict:
    """The saved dict of a short run of ``kind`` (the file every mutation starts from)."""
    model, data = KINDS[kind][0]()
    solver, opts = run_options(kind)
    return fit(model, data, LAM, solver, max_passes=3, gap_check=1, progress=False, **opts).to_dict()


def reference_primal(kind: str) -> float:
    """An upper bound on the optimum ``P*``: the best primal value of a long run (no dual may exceed it)."""
    model, data = KINDS[kind][0]()
    r = fit(model, data, LAM, "fw", max_passes=300, gap_check=50, progress=False)
    return float(r.primal)


def check(path: Path, p_ref: float) -> str:
    kind = path.name.split("__")[0]
    model, data = KINDS[kind][0]()
    solver, opts = run_options(kind)
    try:
        loaded = FitResult.load(path)
        out = fit(model, data, LAM, solver, init=loaded, max_passes=2, gap_check=1, progress=False, **opts)
    except (ValueError, TypeError) as exc:
        return f"error: {exc}"
    except Exception as exc:  # noqa: BLE001 - an unclear failure is a finding
        return f"UNCLEAR {type(exc).__name__}: {exc}"
    rec = out.history[-1]
    primal = brute_force_primal(model, data, out.weights, LAM)
    if abs(primal - out.primal) > 1e-9 * (1 + abs(primal)):
        return f"LIE: primal {out.primal!r}, enumerated {primal!r}"
    for name in ("dual", "dual_avg"):
        d = getattr(rec, name)
        if d is not None and d > p_ref + 1e-9:
            return f"LIE: {name} {d!r} exceeds an optimum's upper bound {p_ref!r}"
    if out.gap is not None and out.gap < -1e-12:
        return f"LIE: negative certified gap {out.gap!r}"
    return "ok"


def main() -> None:
    out_path, files = Path(sys.argv[1]), [Path(f) for f in sys.argv[2:]]
    refs = {kind: reference_primal(kind) for kind in sorted({f.name.split("__")[0] for f in files})}
    results = {}
    for f in files:
        print(f.name, flush=True)
        results[f.name] = check(f, refs[f.name.split("__")[0]])
    out_path.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
