"""Worker of tests/test_load_fuzz.py: the problems and their saved runs, and the load-and-resume of mutated files
(in its own process, so that a crash fails the test instead of killing pytest).

    python tests/load_fuzz_worker.py RESULTS.json FILE...

For every file (a mutated ``FitResult`` of one of :data:`KINDS`, named ``<kind>__<anything>.safetensors``): load it, resume
the run for two passes and check its certificate against enumeration: the primal value is the enumerated one and the
dual value the certificate uses is at most the optimum (a tight solve's primal value), so that the certified gap is at
least the true suboptimality.  Writes ``{file: outcome}`` to RESULTS.json,
the outcome being ``"error: ..."`` (a clear ``ValueError`` / ``TypeError``), ``"ok"`` (the certificate holds) or
``"LIE: ..."`` / ``"UNCLEAR ...: ..."`` (failures); the file being processed is printed first, so a crash names it.
"""
from __future__ import annotations

import json
import random
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import torch  # noqa: E402

from conftest import brute_force_primal, random_chain_problem, random_multiclass_problem  # noqa: E402
from torch_bcfw import FitResult, Multiclass, fit, register_model  # noqa: E402
from torch_bcfw.duals import ActiveSetDualState, DenseDualState  # noqa: E402

LAM = 0.2


class ActiveSetMulticlass(Multiclass):
    """A multiclass model whose dual state lists its labelings (an :class:`ActiveSetDualState`)."""

    def dual_state(self, data, lam, n_total=None):
        return ActiveSetDualState(self, data, lam, n_total)


class DenseMulticlass(Multiclass):
    """A multiclass model on the generic dense state (its ``w_i`` do not determine its ``l_i``)."""

    def dual_state(self, data, lam, n_total=None):
        return DenseDualState(self, data, lam, n_total)


register_model(ActiveSetMulticlass)
register_model(DenseMulticlass)


def _chain():
    return random_chain_problem(n=5, F=3, K=2, max_len=3, seed=3)


def _multiclass():
    return random_multiclass_problem(n=6, F=3, K=3, seed=2)


def _dense():
    base, data = random_multiclass_problem(n=6, F=3, K=3, seed=2)
    return DenseMulticlass(base.n_inputs, base.n_labels), data


def _graph():
    from test_warm_start import _graph_problem

    return _graph_problem()


def _active_set():
    base, data = random_multiclass_problem(n=6, F=3, K=3, seed=2)
    return ActiveSetMulticlass(base.n_inputs, base.n_labels), data


#: state kind -> (problem, options of its run)
KINDS = {
    "chain": (_chain, {}),
    "chain-cache": (_chain, {"preset": "gap-pairwise-cache"}),
    "chain-minibatch": (_chain, {"batch_size": 2}),
    "chain-mp": (_chain, {"solver": "mp-bcfw"}),
    "multiclass": (_multiclass, {}),
    "active-set": (_active_set, {"preset": "gap-fw"}),
    "dense": (_dense, {}),
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


_REFERENCES: dict = {}


def reference_primal(kind: str) -> float:
    """An upper bound on the optimum ``P*`` within its certified gap (below 1e-2 for these problems): the primal value
    of a long solve.  A certified dual value above it is a lie."""
    problem = KINDS[kind][0]
    if problem not in _REFERENCES:
        model, data = problem()
        r = fit(model, data, LAM, max_passes=600, gap_check=100, progress=False)
        assert r.gap < 1e-2, f"the reference solve of {kind} stopped at a gap of {r.gap}"
        _REFERENCES[problem] = float(r.primal)
    return _REFERENCES[problem]


def lift(d: dict, kind: str, how: str, rng: random.Random) -> None:
    """Lift the saved dual state in ``d`` within its documented bounds: ``"lift"`` raises some ``l_i`` towards
    ``max_y L_i(y) / n`` (and ``l`` to their sum), ``"lift-avg"`` raises the averaged ``l`` towards the same bound."""
    model, data = KINDS[kind][0]()
    st = d["solver_state"]["state"]
    top = model.max_loss(data).to(torch.float64) / len(data)
    if how == "lift":
        chosen = torch.tensor([rng.random() < 0.5 for _ in range(len(data))])
        room = (top - st["block_ell"] > 1e-6).nonzero().reshape(-1).tolist()
        if room:  # at least one block that can be lifted
            chosen[rng.choice(room)] = True
        u = torch.tensor([0.2 + 0.8 * rng.random() for _ in range(len(data))], dtype=torch.float64)
        st["block_ell"] = torch.where(chosen, st["block_ell"] + u * (top - st["block_ell"]), st["block_ell"])
        st["ell"] = float(st["block_ell"].sum())
    else:  # lbar = l - avg_ell_u / total: a smaller accumulator lifts the averaged dual
        t = st["avg_t"]
        total = t * (t + 1) / 2.0
        lbar = st["ell"] - st["avg_ell_u"] / total if t else st["ell"]
        st["avg_ell_u"] = st["avg_ell_u"] - rng.random() * max(float(top.sum()) - lbar, 0.0) * total


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
    if out.gap is not None and out.gap < -1e-12:
        return f"LIE: negative certified gap {out.gap!r}"
    if out.gap is not None:  # the gap certifies P(w) - P* <= gap: the dual value it uses is at most P*
        dual = min(p for p in (rec.primal, rec.primal_avg) if p is not None) - out.gap
        if dual > p_ref + 1e-9 * (1 + abs(p_ref)):
            return f"LIE: a certified gap {out.gap!r} uses the dual value {dual!r} above the optimum {p_ref!r}"
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
