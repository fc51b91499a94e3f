"""GraphCut model (torch_bcfw.models.graphcut), its GraphData container and the resident worker pool."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

pytest.importorskip("maxflow", reason="PyMaxflow is the optional [graphcut] dependency")

from torch_bcfw import fit  # noqa: E402
from torch_bcfw.data import GraphData, grid_edges, grid_graph_data
from torch_bcfw.models import GraphCut  # noqa: E402

LOSSES = ["hamming", "balanced"]


# ------------------------------------------------------------------ independent reference implementation
def all_labelings(n: int) -> torch.Tensor:
    """LongTensor[2**n, n]: row k is the binary expansion of k."""
    return (torch.arange(2**n)[:, None] >> torch.arange(n)[None, :]) & 1


def reference_loss(y_true: torch.Tensor, y: torch.Tensor, mass: torch.Tensor, loss: str) -> torch.Tensor:
    """Loss of every row of ``y: [K, N]`` from the definitions (not from the package's loss code)."""
    wrong = (y != y_true).double()
    if loss == "hamming":
        return (wrong * mass).sum(1) / mass.sum()
    fg, bg = mass[y_true == 1].sum(), mass[y_true == 0].sum()
    fn = (wrong * mass * (y_true == 1)).sum(1)
    fp = (wrong * mass * (y_true == 0)).sum(1)
    if fg > 0 and bg > 0:
        return 0.5 * (fn / fg + fp / bg)
    return (fn + fp) / mass.sum()  # one class only: its error rate


def reference_scores(x, edges, edge_x, mass, w, F, y):
    """``<w, phi(x, y)>`` for every row of ``y: [K, N]`` from the module docstring's formula."""
    Z = mass.sum()
    unary = (y.double() * (mass * (x.double() @ w[:F]))).sum(1)
    if edges.shape[0] == 0 or w.shape[0] == F:
        return unary / Z
    cut = (y[:, edges[:, 0]] != y[:, edges[:, 1]]).double()
    return (unary - cut @ (edge_x.double() @ w[F:])) / Z


def random_graphs(gen, n_graphs, F=3, E=2, max_nodes=9, weights=False, min_nodes=1):
    xs, es, exs, ys, ws = [], [], [], [], []
    for _ in range(n_graphs):
        n = int(torch.randint(min_nodes, max_nodes + 1, (1,), generator=gen))
        m = int(torch.randint(0, 2 * n + 1, (1,), generator=gen)) if n > 1 else 0
        p = torch.randint(0, n, (m,), generator=gen)
        q = (p + torch.randint(1, max(n, 2), (m,), generator=gen)) % n
        xs.append(torch.randn(n, F, generator=gen, dtype=torch.float64))
        es.append(torch.stack([p, q], 1))
        exs.append(torch.rand(m, E, generator=gen, dtype=torch.float64))
        ys.append(torch.randint(0, 2, (n,), generator=gen))
        ws.append(torch.rand(n, generator=gen, dtype=torch.float64) + 0.2)
    return GraphData.from_graphs(xs, es, exs, ys, ws if weights else None)


def brute_force(model: GraphCut, data: GraphData, w: torch.Tensor, i: int, loss_augmented: bool):
    """``(best value, all values)`` of ``[L_i(y)] + <w, phi(x_i, y)>`` over every labelling of graph ``i``."""
    blk = data[[i]]
    Y = all_labelings(blk.n_nodes)
    vals = reference_scores(blk.x, blk.edges, blk.edge_x, blk.node_mass(), w.double(), model.n_inputs, Y)
    if loss_augmented:
        vals = vals + reference_loss(blk.y, Y, blk.node_mass(), model.loss_name)
    return float(vals.max()), vals, Y


# ------------------------------------------------------------------ the oracle is exact
@pytest.mark.parametrize("loss", LOSSES)
@pytest.mark.parametrize("loss_augmented", [False, True])
def test_oracle_equals_brute_force(loss, loss_augmented):
    gen = torch.Generator().manual_seed(10 + LOSSES.index(loss) + 2 * loss_augmented)
    for weights in (False, True):
        data = random_graphs(gen, 12, max_nodes=12, weights=weights)
        model = GraphCut(3, 2, loss=loss, processes=1)
        for trial in range(3):
            w = torch.randn(5, generator=gen, dtype=torch.float64)
            w[3:] = w[3:].abs() * (3.0 * trial)  # trial 0: no pairwise term (the threshold path)
            y = model.oracle(w, data, loss_augmented=loss_augmented)
            assert y.dtype == torch.long and y.shape == (data.n_nodes,)
            found = model.score(w, data, y) + (model.loss(data, y) if loss_augmented else 0.0)
            for i, y_i in enumerate(data.split_labels(y)):
                best, vals, Y = brute_force(model, data, w, i, loss_augmented)
                assert float(found[i]) == pytest.approx(best, abs=1e-12)
                k = int((y_i << torch.arange(y_i.numel())).sum())
                assert float(vals[k]) == pytest.approx(best, abs=1e-12)


@pytest.mark.parametrize("loss", LOSSES)
def test_joint_feature_loss_and_score_match_the_definitions(loss):
    gen = torch.Generator().manual_seed(20)
    data = random_graphs(gen, 6, max_nodes=8, weights=True)
    model = GraphCut(3, 2, loss=loss, processes=1)
    y = torch.randint(0, 2, (data.n_nodes,), generator=gen)
    w = torch.randn(5, generator=gen, dtype=torch.float64)  # any sign: score is linear in w
    phi = model.joint_feature(data, y)
    assert phi.shape == (6, 5) and phi.dtype == torch.float64
    torch.testing.assert_close(model.score(w, data, y), phi @ w, rtol=0, atol=1e-12)
    for i, y_i in enumerate(data.split_labels(y)):
        blk = data[[i]]
        ref = reference_scores(blk.x, blk.edges, blk.edge_x, blk.node_mass(), w, 3, y_i[None])[0]
        assert float(phi[i] @ w) == pytest.approx(float(ref), abs=1e-12)
        ref_loss = reference_loss(blk.y, y_i[None], blk.node_mass(), loss)[0]
        assert float(model.loss(data, y)[i]) == pytest.approx(float(ref_loss), abs=1e-12)
    assert bool((model.loss(data, data.y) == 0).all())
    unary_only = GraphCut(3, loss=loss, pairwise=False)
    torch.testing.assert_close(unary_only.joint_feature(data, y), phi[:, :3])
    assert unary_only.weight_bounds() is None
    lower, upper = model.weight_bounds()
    assert lower.tolist()[3:] == [0.0, 0.0] and bool(torch.isneginf(lower[:3]).all()) and bool(torch.isposinf(upper).all())


# ------------------------------------------------------------------ BCFW on the model
def tiny_problem(seed=0, n=4, hw=(3, 3), checkerboard=False):
    """``n`` grid graphs of ``hw`` pixels (2**9 labelings each): noisy unary features, contrast edges."""
    gen = torch.Generator().manual_seed(seed)
    H, W = hw
    if checkerboard:
        lab = ((torch.arange(H)[:, None] + torch.arange(W)[None, :]) % 2).expand(n, H, W).clone()
    else:
        lab = torch.zeros(n, H, W, dtype=torch.long)
        lab[:, 1:, 1:] = 1
        lab[1, 0, 0] = 1
    img = lab[:, None].double() + 0.3 * torch.randn(n, 1, H, W, generator=gen, dtype=torch.float64)
    feat = torch.cat([lab[:, None].double() + 1.5 * torch.randn(n, 1, H, W, generator=gen, dtype=torch.float64),
                      torch.ones(n, 1, H, W, dtype=torch.float64)], 1)
    return grid_graph_data(feat, img, lab)


def reference_primal(model, data, w, lam):
    total = 0.0
    for i in range(len(data)):
        blk = data[[i]]
        best, _, _ = brute_force(model, data, w, i, loss_augmented=True)
        truth = reference_scores(blk.x, blk.edges, blk.edge_x, blk.node_mass(), w, model.n_inputs, blk.y[None])[0]
        total += best - float(truth)
    return 0.5 * lam * float(w @ w) + total / len(data)


@pytest.mark.parametrize("loss", LOSSES)
def test_certified_gap_is_primal_minus_dual(loss):
    data = tiny_problem(1)
    model = GraphCut(2, 2, loss=loss, processes=1)
    lam = 0.01
    res = fit(model, data, lam, solver="bcfw", max_passes=60, gap_check=20, seed=0)
    rec = res.history[-1]
    assert rec.gap_last == pytest.approx(rec.primal - rec.dual, abs=1e-12)
    assert rec.primal == pytest.approx(reference_primal(model, data, res.w, lam), abs=1e-10)
    assert -1e-12 <= rec.gap_last < 0.05 * rec.primal
    assert bool((res.w[2:] >= 0).all())
    # weak duality against independent primal values: the dual bounds P(w) for every feasible w
    gen = torch.Generator().manual_seed(2)
    for _ in range(5):
        w = torch.randn(4, generator=gen, dtype=torch.float64)
        w[2:] = w[2:].abs()
        assert rec.dual <= reference_primal(model, data, w, lam) + 1e-12


class EnumeratedGraphCut(GraphCut):
    """The same model decoded by enumeration, for any sign of the pairwise weights (tests only)."""

    def oracle(self, w, data, loss_augmented=True):
        out = []
        for i in range(len(data)):
            _, vals, Y = brute_force(self, data, w, i, loss_augmented)
            out.append(Y[int(vals.argmax())])
        return torch.cat(out)


def test_positivity_constraint_holds_where_the_optimum_is_repulsive():
    data = tiny_problem(3, checkerboard=True)  # every true neighbour pair differs: a repulsive term would help
    lam = 0.01
    free = fit(EnumeratedGraphCut(2, 2, processes=1), data, lam, bounds=(None, None), max_passes=40, gap_check=20)
    assert float(free.w[2:].min()) < -1e-3, "the unconstrained optimum should want a negative pairwise weight"
    model = GraphCut(2, 2, processes=1)
    res = None
    for _ in range(4):  # every chunk of BCFW steps keeps w_P >= 0 (the oracle would raise otherwise)
        res = fit(model, data, lam, max_passes=5, gap_check=5, init=res, seed=0)
        assert bool((res.w[2:] >= 0).all()) and bool((res.w_avg[2:] >= 0).all())
    fw = fit(model, data, lam, solver="fw", max_passes=10, gap_check=5)
    assert bool((fw.w[2:] >= 0).all())
    assert res.history[-1].primal > free.history[-1].primal  # the constraint binds


def test_non_submodular_weights_raise():
    data = tiny_problem(4)
    model = GraphCut(2, 2, processes=1)
    w = torch.tensor([1.0, 0.0, 0.5, -0.2], dtype=torch.float64)
    with pytest.raises(ValueError, match="pairwise weights must be >= 0"):
        model.oracle(w, data)
    with pytest.raises(ValueError, match="pairwise weights must be >= 0"):
        model.decode(w, data[[0]])
    with pytest.raises(ValueError, match="NaN"):
        model.oracle(torch.tensor([1.0, math.nan, 0.5, 0.2], dtype=torch.float64), data)


# ------------------------------------------------------------------ the container and bad input
def test_graph_data_indexing_and_caches():
    gen = torch.Generator().manual_seed(5)
    data = random_graphs(gen, 5, weights=True)
    keys = data.graph_keys()
    sub = data[[3, 0, 3]]
    assert len(sub) == 3 and sub.graph_keys() == [keys[3], keys[0], keys[3]]
    for j, i in enumerate([3, 0, 3]):
        a, b = sub[[j]], data[[i]]
        for name in ("x", "y", "edges", "edge_x", "node_weight"):
            assert torch.equal(getattr(a, name), getattr(b, name))
    model = GraphCut(3, 2, processes=1)
    y = torch.randint(0, 2, (data.n_nodes,), generator=gen)
    ys = data.split_labels(y)
    torch.testing.assert_close(model.joint_feature(sub, torch.cat([ys[3], ys[0], ys[3]])),
                               model.joint_feature(data, y)[[3, 0, 3]])
    assert data[[0]].graph_keys() == [keys[0]] and len(set(keys)) == 5


def _valid_parts():
    x = torch.randn(4, 2, dtype=torch.float64)
    return dict(x=x, y=torch.tensor([0, 1, 1, 0]), offsets=torch.tensor([0, 4]), edges=torch.tensor([[0, 1], [2, 3]]),
                edge_x=torch.ones(2, 2, dtype=torch.float64), edge_offsets=torch.tensor([0, 2]))


@pytest.mark.parametrize("change, message", [
    (dict(x=torch.tensor([[0.0, math.nan]] * 4)), "NaN"),
    (dict(x=torch.zeros(4, 2, dtype=torch.long)), "floating"),
    (dict(x=torch.zeros(4)), r"\[N_tot, F\]"),
    (dict(y=torch.tensor([0, 1, 2, 0])), r"in \{0, 1\}"),
    (dict(y=torch.tensor([0, 1, -1, 0])), r"in \{0, 1\}"),
    (dict(y=torch.tensor([0.0, 1.0, 1.0, 0.0])), "integer"),
    (dict(y=torch.tensor([0, 1, 1])), "one label per node"),
    (dict(offsets=torch.tensor([0, 3])), "end at 4"),
    (dict(edges=torch.tensor([[0, 1], [2, 4]])), "outside its graph"),
    (dict(edges=torch.tensor([[0, 1], [2, 2]])), "self-loop"),
    (dict(edges=torch.tensor([0, 1, 2, 3])), r"\[M_tot, 2\]"),
    (dict(edge_x=-torch.ones(2, 2, dtype=torch.float64)), ">= 0"),
    (dict(edge_x=torch.ones(3, 2, dtype=torch.float64)), "M_tot = 2"),
    (dict(edge_x=torch.tensor([[1.0, math.inf], [1.0, 1.0]])), "NaN or infinite"),
    (dict(edge_offsets=torch.tensor([0, 1])), "end at 2"),
])
def test_bad_graph_data_raises(change, message):
    parts = _valid_parts()
    parts.update(change)
    with pytest.raises(ValueError, match=message):
        GraphData(**parts)


def test_model_rejects_mismatched_data_and_labelings():
    data = GraphData(**_valid_parts())
    with pytest.raises(ValueError, match="node features have dimension 2"):
        GraphCut(3, 2).check_data(data)
    with pytest.raises(ValueError, match="edge features have dimension 2"):
        GraphCut(2, 1).check_data(data)
    with pytest.raises(TypeError, match="GraphData"):
        GraphCut(2, 2).check_data(data.x)
    model = GraphCut(2, 2)
    with pytest.raises(ValueError, match=r"in \{0, 1\}"):
        model.loss(data, torch.tensor([0, 1, 2, 0]))
    with pytest.raises(ValueError, match="expected 4 node labels"):
        model.joint_feature(data, torch.tensor([0, 1]))
    with pytest.raises(ValueError, match="weights must have shape"):
        model.oracle(torch.zeros(3, dtype=torch.float64), data)
    with pytest.raises(ValueError, match="loss must be one of"):
        GraphCut(2, 2, loss="hinge")
    with pytest.raises(ValueError, match="labels"):
        model.check_data(GraphData(**{**_valid_parts(), "y": None}))


def test_grid_graph_data_layout():
    feats, img = torch.randn(2, 3, 4, 5), torch.rand(2, 3, 4, 5)
    lab = torch.randint(0, 2, (2, 4, 5))
    data = grid_graph_data(feats, img, lab)
    assert len(data) == 2 and data.n_nodes == 40 and data.n_edge_inputs == 2
    assert torch.equal(data[[1]].edges, grid_edges(4, 5))
    assert torch.equal(data.x[20 + 7], feats[1, :, 1, 2]) and int(data.y[20 + 7]) == int(lab[1, 1, 2])
    assert grid_graph_data(feats, img, lab, contrast=False).n_edge_inputs == 1
    with pytest.raises(ValueError, match="must agree"):
        grid_graph_data(feats, img[:, :, :3], lab)


# ------------------------------------------------------------------ the resident pool
def test_resident_pool_matches_in_process_and_ships_graphs_once():
    gen = torch.Generator().manual_seed(6)
    H, W = 10, 12
    data = grid_graph_data(torch.randn(7, 3, H, W, generator=gen, dtype=torch.float64),
                           torch.rand(7, 3, H, W, generator=gen, dtype=torch.float64),
                           torch.randint(0, 2, (7, H, W), generator=gen))
    w = torch.tensor([0.5, -0.3, 0.1, 2.0, 6.0], dtype=torch.float64)
    serial = GraphCut(3, 2, processes=1)
    pooled = GraphCut(3, 2, processes=2, pool_min_nodes=1)
    try:
        for loss_augmented in (True, False, True):
            ref = serial.oracle(w, data, loss_augmented)
            assert torch.equal(pooled.oracle(w, data, loss_augmented), ref)
        pool = pooled._pool
        assert pool is not None and pool.calls == 3
        shipped = pool.shipped_graphs
        assert 0 < shipped < len(data)  # the caller keeps its share; each worker graph went over once
        sub = data[[4, 2, 6]]
        assert torch.equal(pooled.oracle(w, sub), serial.oracle(w, sub))
        assert pool.shipped_graphs == shipped
        pool.max_resident = 1  # eviction: workers keep one graph each, the rest is re-sent when needed
        for idx in ([0, 1], [2, 3], [4, 5, 6], list(range(7))) * 2:
            assert torch.equal(pooled.oracle(w, data[idx]), serial.oracle(w, data[idx]))
        assert pool.shipped_graphs > shipped
    finally:
        pooled.close()


def test_pool_processes_never_exceed_the_cpus(monkeypatch):
    """A ``processes`` setting (from a model file, say) above the machine's CPUs starts only as many workers."""
    import torch_bcfw.models.graphcut as gc_module

    monkeypatch.setattr(gc_module, "available_cpus", lambda: 2)
    model = GraphCut(3, 2, processes=10_000, pool_min_nodes=1)
    try:
        assert model._get_pool().processes == 2
        assert GraphCut(3, 2, processes=None)._processes() == 2 and GraphCut(3, 2, processes=1)._processes() == 1
    finally:
        model.close()


def test_pooled_gap_pass_is_bit_identical_and_ships_records_once():
    """hinge_terms / oracle / decode in the pool (records resident in the workers, w only sent per call) equal
    the in-process path bit for bit, for both losses, node weights, subsets and new node features."""
    gen = torch.Generator().manual_seed(11)
    for loss in LOSSES:
        data = random_graphs(gen, 9, max_nodes=12, weights=True, min_nodes=2)
        w = torch.tensor([0.6, -0.5, 0.3, 0.8, 1.7], dtype=torch.float64)
        serial = GraphCut(3, 2, loss=loss, processes=1)
        pooled = GraphCut(3, 2, loss=loss, processes=2, pool_min_nodes=1)
        try:
            y_ref, h_ref = serial.hinge_terms(w, data)
            for _ in range(2):
                y, h = pooled.hinge_terms(w, data)
                assert torch.equal(y, y_ref) and torch.equal(h, h_ref)
            pool = pooled._pool
            shipped = pool.shipped_graphs
            assert 0 < shipped < len(data)
            assert torch.equal(pooled.oracle(w, data, False), serial.oracle(w, data, False))
            sub = data[[7, 1, 4, 4]]
            assert torch.equal(pooled.hinge_terms(w, sub)[1], serial.hinge_terms(w, sub)[1])
            assert pool.shipped_graphs == shipped  # subsets reuse the resident records
            # the records path agrees with the generic loss / score definitions
            ref = serial.loss(data, y_ref) + serial.score(w, data, y_ref) - serial.score(w, data, data.y)
            torch.testing.assert_close(h_ref, ref, rtol=0, atol=1e-12)
            new = data.with_features(data.x * 1.5 - 0.2)  # new features: new records, re-shipped
            y2, h2 = pooled.hinge_terms(w, new)
            assert pool.shipped_graphs > shipped
            y2_ref, h2_ref = serial.hinge_terms(w, new)
            assert torch.equal(y2, y2_ref) and torch.equal(h2, h2_ref)
            zero = w.clone()
            zero[3:] = 0.0  # no pairwise term: a per-node threshold in every process
            assert torch.equal(pooled.hinge_terms(zero, data)[1], serial.hinge_terms(zero, data)[1])
        finally:
            pooled.close()


def test_single_block_oracle_matches_the_batched_records_path():
    gen = torch.Generator().manual_seed(12)
    data = random_graphs(gen, 5, max_nodes=10, weights=True)
    model = GraphCut(3, 2, loss="balanced", processes=1)
    w = torch.tensor([0.4, 0.9, -0.3, 0.5, 1.1], dtype=torch.float64)
    y_all = model.oracle(w, data)
    assert torch.equal(torch.cat([model.oracle(w, data[[i]]) for i in range(len(data))]), y_all)
    with pytest.raises(ValueError, match="pairwise weights must be >= 0"):
        model.hinge_terms(torch.tensor([0.4, 0.9, -0.3, -0.5, 1.1], dtype=torch.float64), data)


# ------------------------------------------------------------------ the compact (re-bindable) dual state
class DenseGraphCut(GraphCut):
    """The same model on the generic dense dual state (reference for GraphCutDualState)."""

    def dual_state(self, data, lam):
        from torch_bcfw.duals.dense import DenseDualState

        return DenseDualState(self, data, lam)


@pytest.mark.parametrize("opts", [
    dict(solver="bcfw"), dict(solver="bcfw", preset="gap-pairwise-cache"), dict(solver="bcfw", preset="uniform-away"),
    dict(solver="fw"),
])
def test_compact_state_follows_the_dense_state(opts):
    """Same iterates as the generic dense state: the fused numpy step loop (plain BCFW), the generic loop with
    pairwise / away steps and the cache, and batch FW."""
    data = tiny_problem(7)
    runs = [fit(cls(2, 2, loss="balanced", processes=1), data, 0.01, max_passes=12, gap_check=4, seed=3, **opts)
            for cls in (GraphCut, DenseGraphCut)]
    torch.testing.assert_close(runs[0].w, runs[1].w, rtol=0, atol=1e-10)
    torch.testing.assert_close(runs[0].w_avg, runs[1].w_avg, rtol=0, atol=1e-10)
    assert runs[0].gap == pytest.approx(runs[1].gap, abs=1e-10)


def test_compact_state_rebinds_to_new_features_exactly():
    from torch_bcfw.duals.active_set import ActiveSetDualState
    from torch_bcfw.solvers.bcfw import BCFW
    from torch_bcfw.solvers.options import SolverOptions

    data = tiny_problem(8)
    model = GraphCut(2, 2, processes=1)
    opts = SolverOptions(max_passes=6, seed=1, batch_size=1)
    states = []
    for make in (model.dual_state, lambda d, lam: ActiveSetDualState(model, d, lam)):
        alg = BCFW(model, data, 0.01, opts, state=make(data, 0.01))
        alg.advance(6 * len(data))
        states.append(alg.state)
    compact, active = states
    torch.testing.assert_close(compact.w, active.w, rtol=0, atol=1e-12)
    new = data.with_features(data.x * torch.tensor([2.0, 1.0], dtype=torch.float64) + 0.5)
    stale = compact.rebind(new)
    active.rebind(new)
    assert stale > 1e-3
    torch.testing.assert_close(compact.v, active.v, rtol=0, atol=1e-12)
    torch.testing.assert_close(compact.averaged()[0], active.averaged()[0], rtol=0, atol=1e-12)
    assert compact.dual_ell() == pytest.approx(active.dual_ell(), abs=1e-12)


def test_hinge_terms_match_the_generic_definition():
    gen = torch.Generator().manual_seed(9)
    data = random_graphs(gen, 6, max_nodes=10, weights=True)
    model = GraphCut(3, 2, loss="balanced", processes=1)
    w = torch.tensor([0.7, -0.4, 0.2, 0.9, 2.0], dtype=torch.float64)
    y, H = model.hinge_terms(w, data)
    ref = model.loss(data, y) + (model.joint_feature(data, y) - model.joint_feature(data, data.y)) @ w
    torch.testing.assert_close(H, ref, rtol=0, atol=1e-12)
    assert bool((H >= -1e-12).all())


def test_checkpoint_resumes_bit_exactly_and_rebind_rederives_the_blocks():
    """A checkpoint carries the w_i table: the fused step loop continues bit-identically after loading it on the
    same data; under other features w_i is re-derived from the node marginals (rebind)."""
    from torch_bcfw.duals.graphcut import GraphCutDualState

    data = tiny_problem(12)
    model = GraphCut(2, 2, loss="balanced", processes=1)
    gen = np.random.default_rng(0)
    first, second = gen.integers(0, len(data), 12), gen.integers(0, len(data), 12)
    a = model.dual_state(data, 0.01)
    a.set_bounds(*model.weight_bounds())
    a.run_steps(first, 0)
    saved = a.state_dict()
    b = model.dual_state(data, 0.01)
    b.load_state_dict(saved)  # the solvers' resume path
    assert torch.equal(b.w_blocks, a.w_blocks) and torch.equal(b.w_blocks_acc, a.w_blocks_acc)
    ga, gb = a.run_steps(second, 0), b.run_steps(second, 0)
    assert np.array_equal(ga, gb)
    for name in ("v", "w_blocks", "w_blocks_acc", "mu", "pw", "mu_acc", "pw_acc"):
        assert torch.equal(getattr(a, name), getattr(b, name)), name
    new = data.with_features(data.x * 1.5 - 0.25)
    c = GraphCutDualState.from_state_dict(model, new, 0.01, saved)
    phi_true = model.joint_feature(new, new.y)
    expected = torch.cat([model.unary_feature(new, c.mu), c.pw], 1)
    torch.testing.assert_close(c.w_blocks, (phi_true - expected) / (0.01 * len(new)), rtol=0, atol=1e-12)
    assert float((c.w_blocks - saved["storage"]["same_features"]["w_blocks"]).abs().max()) > 1e-3  # not the saved table


def test_interrupted_step_loop_leaves_a_consistent_state(monkeypatch):
    """Ctrl-C inside the fused step loop: the counters, the losses and the clipped ``w`` reflect exactly the
    finished steps, and finishing the remaining steps gives the uninterrupted run's state bit for bit."""
    import torch_bcfw.duals.graphcut as gd

    data = tiny_problem(13)
    model = GraphCut(2, 2, loss="balanced", processes=1)
    order = np.random.default_rng(1).integers(0, len(data), 10)
    ref = model.dual_state(data, 0.01)
    ref.set_bounds(*model.weight_bounds())
    ref_gaps = ref.run_steps(order, 0)

    a = model.dual_state(data, 0.01)
    a.set_bounds(*model.weight_bounds())
    k0, t0 = a.k, a.avg_t
    calls, real = [0], gd._cut

    def interrupting(*args, **kwargs):
        calls[0] += 1
        if calls[0] == 7:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(gd, "_cut", interrupting)
    with pytest.raises(KeyboardInterrupt):
        a.run_steps(order, 0)
    monkeypatch.setattr(gd, "_cut", real)
    done = a.k - k0  # steps while w_P = 0 need no cut, so the 7th cut is at step 7 or later
    assert 6 <= done < len(order) and a.avg_t - t0 == done
    assert a.ell == pytest.approx(float(a.block_ell.sum()), abs=1e-12)
    torch.testing.assert_close(a.w, torch.clamp(a.v, a.lower, a.upper), rtol=0, atol=0)
    rest = a.run_steps(order[done:], 0)
    assert np.array_equal(rest, ref_gaps[done:])
    for name in ("v", "w", "w_blocks", "w_blocks_acc", "mu", "pw", "mu_acc", "pw_acc", "block_ell"):
        assert torch.equal(getattr(a, name), getattr(ref, name)), name
    assert (a.k, a.avg_t, a.ell, a.avg_ell_u) == (ref.k, ref.avg_t, ref.ell, ref.avg_ell_u)


def test_step_loop_without_a_box_raises_on_negative_pairwise_weights():
    """Without the positivity box the fused step loop checks ``w_P`` before every cut: a negative pairwise weight
    stops it with the oracle's error, the finished steps kept."""
    data = tiny_problem(5)
    model = GraphCut(2, 2, loss="balanced", processes=1)
    a = model.dual_state(data, 0.01)  # no set_bounds: unconstrained
    a.run_steps(np.arange(3), 0)
    k = a.k
    a.v[2:] = -0.5  # as if the unconstrained dual had moved there
    a._sync_w()
    with pytest.raises(ValueError, match="pairwise weights must be >= 0"):
        a.run_steps(np.arange(5), 0)
    assert a.k == k


# ------------------------------------------------------------------ images at their own size
def reference_grid8(image: torch.Tensor, scales) -> tuple[torch.Tensor, torch.Tensor]:
    """8-connected edges of an ``[C, H, W]`` image and their features ``[1, exp(-s beta d2) per scale] / length``
    from the definitions (every pixel pair at chessboard distance 1, ``beta = 1 / (2 mean d2)``)."""
    C, H, W = image.shape
    pairs = [(r * W + c, r2 * W + c2) for r in range(H) for c in range(W) for r2 in range(H) for c2 in range(W)
             if max(abs(r - r2), abs(c - c2)) == 1 and r * W + c < r2 * W + c2]
    edges = torch.tensor(pairs)
    px = image.reshape(C, -1).T.double()
    d2 = (px[edges[:, 0]] - px[edges[:, 1]]).pow(2).sum(1)
    beta = 1 / (2 * d2.mean())
    rows, cols = edges // W, edges % W
    length = torch.where((rows[:, 0] != rows[:, 1]) & (cols[:, 0] != cols[:, 1]), 2 ** 0.5, 1.0).double()
    feats = torch.stack([torch.ones_like(d2), *(torch.exp(-s * beta * d2) for s in scales)], 1)
    return edges, feats / length[:, None]


@pytest.mark.parametrize("loss", LOSSES)
def test_full_resolution_cut_8_connected_with_contrast_scales_equals_brute_force(loss):
    gen = torch.Generator().manual_seed(21)
    scales = (0.5, 1.0, 2.0)
    for trial in range(6):
        feats = torch.randn(1, 2, 3, 3, generator=gen, dtype=torch.float64)
        image = torch.rand(1, 3, 3, 3, generator=gen, dtype=torch.float64)
        labels = torch.randint(0, 2, (1, 3, 3), generator=gen)
        data = grid_graph_data(feats, image, labels, connectivity=8, contrast_scales=scales)
        assert data.n_edge_inputs == 4 and data.edges.shape[0] == 20  # 12 axis + 8 diagonal
        edges, edge_x = reference_grid8(image[0], scales)
        got = {tuple(e): f for e, f in zip(data.edges.tolist(), data.edge_x)}
        assert set(got) == {tuple(e) for e in edges.tolist()}
        torch.testing.assert_close(torch.stack([got[tuple(e)] for e in edges.tolist()]), edge_x)
        model = GraphCut(2, 4, loss=loss, processes=1)
        w = torch.cat([torch.randn(2, generator=gen, dtype=torch.float64) * 3,
                       torch.rand(4, generator=gen, dtype=torch.float64) * (trial + 1)])
        x, mass, Y = data.x, torch.ones(9, dtype=torch.float64), all_labelings(9)
        for loss_augmented in (False, True):
            vals = reference_scores(x, edges, edge_x, mass, w, 2, Y)
            if loss_augmented:
                vals = vals + reference_loss(data.y, Y, mass, loss)
            y = model.oracle(w, data, loss_augmented)
            k = int((Y == y).all(1).nonzero()[0, 0])
            assert float(vals[k]) == pytest.approx(float(vals.max()), abs=1e-12)


def test_images_of_different_sizes_share_one_graph_data():
    gen = torch.Generator().manual_seed(3)
    sizes = [(2, 3), (4, 5), (2, 3)]
    feats = [torch.randn(2, h, w, generator=gen, dtype=torch.float64) for h, w in sizes]
    images = [torch.rand(3, h, w, generator=gen, dtype=torch.float64) for h, w in sizes]
    labels = [torch.randint(0, 2, (h, w), generator=gen) for h, w in sizes]
    data = grid_graph_data(feats, images, labels, connectivity=8, contrast_scales=(1.0, 3.0))
    assert data.lengths.tolist() == [6, 20, 6]
    for i, (h, w) in enumerate(sizes):
        one = data[[i]]
        assert torch.equal(one.edges, grid_edges(h, w, 8))
        assert torch.equal(one.x, feats[i].permute(1, 2, 0).reshape(h * w, 2)) and torch.equal(one.y, labels[i].reshape(-1))
        torch.testing.assert_close(one.edge_x, grid_graph_data(feats[i][None], images[i][None], None, connectivity=8,
                                                               contrast_scales=(1.0, 3.0)).edge_x)
    model = GraphCut(2, 3, processes=1)
    w = torch.tensor([1.0, -0.5, 0.2, 0.3, 0.1], dtype=torch.float64)
    packed = model.oracle(w, data, loss_augmented=False)
    assert torch.equal(torch.cat([model.oracle(w, data[[i]], loss_augmented=False) for i in range(3)]), packed)
    result = fit(model, data, lam=0.1, max_passes=3, seed=0)
    assert result.gap >= -1e-9 and bool((result.weights[2:] >= 0).all())
    with pytest.raises(ValueError, match="image 1: labels must be"):
        grid_graph_data(feats, images, [labels[0], labels[0], labels[2]])
    with pytest.raises(ValueError, match="one entry per image"):
        grid_graph_data(feats, images[:2])
    with pytest.raises(ValueError, match="connectivity must be 4 or 8"):
        grid_edges(3, 3, 6)
