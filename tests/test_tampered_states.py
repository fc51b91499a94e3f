"""A tampered dual state never certifies a gap below the true one, for every state kind: those of
tests/load_fuzz_worker.py (chain with plain, cached, mini-batch and MP-BCFW runs, multiclass, active set, generic
dense, graph cut), a chain of three labels, online EG's chain, graph cuts with an active pairwise weight, a matching
and a pose tree; any tensor of the saved state perturbed by any amount, scaled, sign-flipped, or a chain's transition
counts swapped ``(a, b), (c, d) -> (a, d), (c, b)`` (which keeps their sums and the token marginals' row and column
sums).  The load is refused with a ``ValueError`` or the resumed run's certified gap is at least the primal value
(enumerated) minus the optimum (a solve with pairwise steps to a gap of 1e-10).  Targeted cases: the swap that
raises the dual most, a graph cut's expected edge cuts lowered, a working set's weight moved between planes, online
EG's Gibbs parameters, and one shard of a problem (a state with ``n_total > n``) through the same checks."""
from __future__ import annotations

import itertools
import random

import load_fuzz_worker as worker
import pytest
import torch
from conftest import brute_force_primal, random_chain_problem

from torch_bcfw import FitResult, fit

pytestmark = pytest.mark.usefixtures("one_torch_thread")

_OPTIMA: dict = {}


def _chain_k3():
    return random_chain_problem(n=6, F=2, K=3, max_len=3, seed=5)


def _smooth_graphs():
    """Chains of 4 nodes labelled all 0 or all 1 with uninformative node features: the pairwise weight does the work."""
    from torch_bcfw import GraphCut
    from torch_bcfw.data import GraphData

    g = torch.Generator().manual_seed(1)
    p = torch.arange(3)
    xs = [torch.randn(4, 2, generator=g, dtype=torch.float64) for _ in range(4)]
    es, exs = [torch.stack([p, p + 1], 1)] * 4, [torch.ones(3, 1, dtype=torch.float64)] * 4
    return GraphCut(2, 1, processes=1), GraphData.from_graphs(xs, es, exs, [torch.full((4,), j % 2) for j in range(4)])


def _matching():
    from test_matching import random_problem

    from torch_bcfw.models import Matching

    return Matching(3), random_problem(n=5, F=3, max_len=3, seed=4)


def _pose():
    from test_pose import TINY, _tiny_data

    from torch_bcfw.models.pose import PoseTree

    mu = torch.tensor([[0.5, -1.0], [1.0, 0.25]], dtype=torch.float64)
    return PoseTree(2, mu, n_joints=3, n_unary=2, edges=TINY), _tiny_data(n=4, seed=4, G=2)


#: the state kinds of tests/load_fuzz_worker.py, a chain of three labels, online EG's chain, graph cuts with an
#: active pairwise weight, word alignment (matching) and a pose tree (both on the generic dense state)
KINDS = dict(worker.KINDS, **{"chain-k3": (_chain_k3, {}), "chain-eg": (worker.KINDS["chain"][0], {"solver": "online-eg"}),
                              "graphcut-smooth": (_smooth_graphs, {}), "matching": (_matching, {}), "pose": (_pose, {})})


def _primal(kind: str, model, data, w) -> float:
    """``P(w)`` by enumerating every labeling (the matching and pose tests' own enumerations)."""
    if kind == "matching":
        from test_matching import brute_force_primal as matching_primal

        return matching_primal(model, data, w, worker.LAM)
    if kind == "pose":
        from test_pose import _primal as pose_primal

        return pose_primal(model, data, w, worker.LAM)
    return brute_force_primal(model, data, w, worker.LAM)


def _run_options(kind: str) -> tuple[str, dict]:
    opts = dict(KINDS[kind][1])
    return opts.pop("solver", "bcfw"), opts


def _optimum_bound(kind: str) -> float:
    """``P*`` from above: the primal value of a solve with pairwise steps to a certified gap of 1e-10 (the pose tree,
    whose oracle is slower: 600 passes, a gap below 1e-2, so a lie smaller than that goes unseen there)."""
    problem = KINDS[kind][0]
    passes, tol = (600, 1e-2) if kind == "pose" else (3000, 1e-10)
    if problem not in _OPTIMA:
        model, data = problem()
        r = fit(model, data, worker.LAM, max_passes=passes, gap_check=50, gap_tol=1e-11, step_rule="pairwise",
                progress=False)
        assert r.gap <= tol
        _OPTIMA[problem] = float(r.primal)
    return _OPTIMA[problem]


def _tensors(st: dict):
    """The float tensors of a saved dual state, with a setter each."""
    out = [("block_ell", st, "block_ell")]
    out += [(f"storage {k}", st["storage"], k) for k, v in st["storage"].items()
            if isinstance(v, torch.Tensor) and v.is_floating_point() and v.numel()]
    return [(name, holder, key) for name, holder, key in out if holder[key].numel()]


def _tamper(st: dict, how: str, rng: random.Random) -> None:
    _, holder, key = rng.choice(_tensors(st))
    t = holder[key].clone()
    flat = t.reshape(-1)
    j = rng.randrange(flat.numel())
    if how == "perturb":
        flat[j] += rng.choice([-1.0, 1.0]) * 10.0 ** rng.uniform(-6, 1)
    elif how == "scale":
        t = t * rng.choice([0.0, 0.5, 1.5, 3.0])
    else:  # sign flip
        t = -t
    holder[key] = t
    if key == "block_ell":  # keep l = sum_i l_i, so that only the tampered blocks can be wrong
        st["ell"] = float(t.sum())


def _swap(st: dict, rng: random.Random) -> bool:
    """Move mass of one sequence's transition counts from ``(a, b), (c, d)`` to ``(a, d), (c, b)``."""
    T = st["storage"]["T"].clone()
    n, K, _ = T.shape
    for _ in range(100):
        i, a, b, c, d = rng.randrange(n), *(rng.randrange(K) for _ in range(4))
        e = min(float(T[i, a, b]), float(T[i, c, d]))
        if a != c and b != d and e > 1e-6:
            e *= rng.uniform(0.3, 1.0)
            T[i, a, b] -= e
            T[i, c, d] -= e
            T[i, a, d] += e
            T[i, c, b] += e
            st["storage"]["T"] = T
            return True
    return False


def _outcome(kind: str, d: dict) -> str:
    """Resume ``d`` (as :meth:`FitResult.from_dict` reads it, untrusted like a file) for two passes: ``"error: ..."``
    for a refusal, ``"ok"`` when the certificate holds, else what is wrong."""
    model, data = KINDS[kind][0]()
    solver, opts = _run_options(kind)
    try:
        out = fit(model, data, worker.LAM, solver, init=FitResult.from_dict(d), max_passes=2, gap_check=1,
                  progress=False, **opts)
    except ValueError as exc:
        return f"error: {exc}"
    primal = _primal(kind, model, data, out.weights)
    if abs(primal - out.primal) > 1e-9 * (1 + abs(primal)):
        return f"LIE: primal {out.primal!r}, enumerated {primal!r}"
    best = _optimum_bound(kind)  # the certificate: P(w) - P* <= gap, a lie when P(w) - gap > P* (<= best)
    if out.gap is not None and primal - out.gap > best + 1e-9:
        return f"LIE: certified gap {out.gap!r}, true gap >= {primal - best!r}"
    return "ok"


def _copy(base: dict) -> dict:
    d = dict(base)
    sd = base["solver_state"]
    state = dict(sd["state"], storage=dict(sd["state"]["storage"]))
    d["solver_state"] = dict(sd, state=state)
    return d


@pytest.mark.parametrize("kind", list(KINDS))
def test_a_tampered_state_is_refused_or_certifies_honestly(kind):
    model, data = KINDS[kind][0]()
    solver, opts = _run_options(kind)
    base = fit(model, data, worker.LAM, solver, max_passes=3, gap_check=1, progress=False, **opts).to_dict()
    rng = random.Random(hash(kind) % 1000)
    outcomes = []
    for how in ["perturb", "perturb", "scale", "negate"]:
        d = _copy(base)
        _tamper(d["solver_state"]["state"], how, rng)
        outcomes.append(_outcome(kind, d))
    if kind.startswith("chain"):
        for _ in range(3):
            d = _copy(base)
            if _swap(d["solver_state"]["state"], rng):
                outcomes.append(_outcome(kind, d))
    assert all(o == "ok" or o.startswith("error: ") for o in outcomes), outcomes
    assert _outcome(kind, _copy(base)) == "ok"


def test_the_transition_swap_of_the_issue_is_refused():
    """``0 0 0`` and ``0 1 0`` at weights 1/2 have the counts ``(0, 0): 1, (0, 1): 1/2, (1, 0): 1/2``; moving the
    half of ``(0, 1), (1, 0)`` to ``(0, 0), (1, 1)`` keeps every row and column sum, but the first position, always
    label 0 before a half of label 1, needs ``(0, 1)``."""
    from torch_bcfw.duals.chain import transitions_decompose

    mu = torch.tensor([[1.0, 0.0], [0.5, 0.5], [1.0, 0.0]], dtype=torch.float64)
    off = torch.tensor([0, 3]).numpy()
    honest = torch.tensor([[[1.0, 0.5], [0.5, 0.0]]], dtype=torch.float64)
    swapped = torch.tensor([[[1.5, 0.0], [0.0, 0.5]]], dtype=torch.float64)
    assert transitions_decompose(mu.numpy(), honest.numpy(), off, 1e-9) == -1
    assert transitions_decompose(mu.numpy(), swapped.numpy(), off, 1e-9) == 0


def test_the_swap_that_raises_the_dual_most_is_refused():
    """Near the optimum, every sequence's transition counts swapped in the direction that raises the dual the most
    (``w`` moved with them, so that ``w = sum_i w_i`` still holds): resumed, it certified a gap below the true one;
    the counts decompose into no per-position tables, and the load names ``T``."""
    kind = "chain-k3"
    model, data = _chain_k3()
    d = fit(model, data, worker.LAM, max_passes=300, gap_check=100, progress=False).to_dict()
    st = d["solver_state"]["state"]
    T, w = st["storage"]["T"].clone(), st["w"].clone()
    trans, scale = model.unpack(w)[4], worker.LAM * len(data)  # a view: the transition block of w
    K = T.shape[1]
    for i in range(T.shape[0]):
        gain, best = 0.0, None
        for a, b, c, e in itertools.product(range(K), repeat=4):
            amount = min(float(T[i, a, b]), float(T[i, c, e]))
            up = float(trans[a, e] + trans[c, b] - trans[a, b] - trans[c, e]) * amount
            if a != c and b != e and up > gain:
                gain, best = up, (a, b, c, e, amount)
        if best is not None:
            a, b, c, e, amount = best
            for (p, q), sign in (((a, b), -1), ((c, e), -1), ((a, e), 1), ((c, b), 1)):
                T[i, p, q] += sign * amount
                trans[p, q] -= sign * amount / scale  # w_T = (T(y) - T) / (lam n)
    st["storage"]["T"], st["w"] = T, w
    out = _outcome(kind, d)
    assert out.startswith("error: ") and "state storage T" in out, out


def test_a_graph_cut_state_from_a_file_counts_its_blocks_at_the_ground_truth():
    """Graph cuts cannot check that saved marginals are a distribution's (the marginal polytope): a state from a file
    keeps its weights and primal values but certifies only its steps' part (each loaded block's fraction at the
    ground truth): at least the in-process resume's gap, closer to it as steps shrink the loaded fractions.  Near the
    optimum, 1% fewer expected edge cuts ``pw`` (``w`` and the ``w_i`` table moved with them: within every load check)
    certified a gap of 0 where the true one is >= 5e-5; it now certifies honestly."""
    model, data = _smooth_graphs()
    base = fit(model, data, worker.LAM, max_passes=300, gap_check=100, progress=False)
    excess = []
    for passes in (1, 20):
        honest = fit(model, data, worker.LAM, init=base, max_passes=passes, gap_check=passes, progress=False)
        filed = fit(model, data, worker.LAM, init=FitResult.from_dict(base.to_dict()), max_passes=passes,
                    gap_check=passes, progress=False)
        assert torch.equal(filed.w, honest.w) and filed.primal == honest.primal
        excess.append(filed.gap - honest.gap)
    assert 0.0 < excess[1] < excess[0]
    d = base.to_dict()
    st = d["solver_state"]["state"]
    sto, F = st["storage"], model.n_inputs
    shift = 0.01 * sto["pw"] / (worker.LAM * len(data))  # w_i's pairwise part: (phi_P(y_i) - pw_i) / (lam n)
    sto["pw"] = 0.99 * sto["pw"]
    wb = sto["same_features"]["w_blocks"].clone()
    wb[:, F:] += shift
    sto["same_features"] = dict(sto["same_features"], w_blocks=wb)
    st["w"] = st["w"].clone()
    st["w"][F:] += shift.sum(0)
    assert _outcome("graphcut-smooth", d) == "ok"


@pytest.mark.parametrize("kind", ["chain-cache", "chain-mp"])
def test_a_working_set_weight_moved_between_planes_is_refused(kind):
    """A complete block's listed weights moved from one plane to another (still on the simplex): a later pairwise or
    away step would take weight the block does not have, so the load refuses a mixture that is not the block."""
    model, data = KINDS[kind][0]()
    solver, opts = _run_options(kind)
    d = fit(model, data, worker.LAM, solver, max_passes=3, gap_check=1, progress=False, **opts).to_dict()
    ws = d["solver_state"]["state"]["working_set"]
    size, fl = ws["size"], ws["fl"].clone()
    start = torch.cumsum(size, 0) - size
    i = next(i for i in range(len(size)) if size[i] >= 2 and not ws["incomplete"][i] and fl[start[i], 0] > 1e-3)
    fl[start[i], 0] -= 1e-3  # ALPHA of the block's first plane to its second
    fl[start[i] + 1, 0] += 1e-3
    d["solver_state"]["state"]["working_set"] = dict(ws, fl=fl)
    out = _outcome(kind, d)
    assert out.startswith("error: ") and f"block {i} do not give back its w_i and l_i" in out, out


def test_a_shard_state_is_checked_as_a_whole_one():
    """A state holding one shard of a problem (``n_total > n``: one process of a sharded run) loads through the same
    checks, so the transition swap is refused and a graph-cut shard's loaded blocks count at the ground truth (its
    ``w``, the sum over the processes, is checked when the sharded run starts: tests/test_distributed_fit.py)."""
    from torch_bcfw.duals.chain import transitions_decompose
    from torch_bcfw.duals.stepsize import LINE_SEARCH

    for problem in (_chain_k3, _smooth_graphs):
        model, data = problem()
        shard = data[torch.arange(3)]
        state = model.dual_state(shard, worker.LAM, n_total=len(data))
        for _ in range(3):
            for i in range(3):
                state.block_step(i, state.block_oracle(i), LINE_SEARCH)
        sd = state.state_dict()
        loaded = model.dual_state(shard, worker.LAM, n_total=len(data))
        loaded.load_state_dict(sd)
        if problem is _smooth_graphs:
            assert loaded.has_untrusted_blocks() and not state.has_untrusted_blocks()
            continue
        refused = 0
        for seed in range(20):  # a swap that no per-position tables give is refused
            swapped = _copy({"solver_state": {"state": sd}})["solver_state"]["state"]
            if not _swap(swapped, random.Random(seed)):
                continue
            s = swapped["storage"]
            bad = transitions_decompose(s["mu"].numpy(), s["T"].numpy(), shard.offsets.numpy(), 1e-7) >= 0
            try:
                model.dual_state(shard, worker.LAM, n_total=len(data)).load_state_dict(swapped)
            except ValueError as exc:
                assert bad and "state storage T" in str(exc)
                refused += 1
            else:
                assert not bad
        assert refused


def test_online_eg_marginals_are_those_of_its_gibbs_parameters():
    """Online EG's saved marginals are checked against its saved Gibbs parameters ``theta`` (the marginals of
    ``exp(theta_i)``: feasible by construction, and fast for dense marginals): ``theta`` moved alone is refused."""
    model, data = KINDS["chain-eg"][0]()
    d = fit(model, data, worker.LAM, "online-eg", max_passes=3, gap_check=1, progress=False).to_dict()
    assert _outcome("chain-eg", _copy(d)) == "ok"
    d["solver_state"] = dict(d["solver_state"], theta_trans=d["solver_state"]["theta_trans"] + 0.1)
    assert _outcome("chain-eg", d) == "ok"  # a constant shift of every transition keeps each distribution
    theta = d["solver_state"]["theta_node"].clone()
    theta[0, 0] += 0.1
    d["solver_state"] = dict(d["solver_state"], theta_node=theta)
    assert "not those of the solver's saved parameters" in _outcome("chain-eg", d)
