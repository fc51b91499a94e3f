"""Sparse token features for the chain: same model, same answers, same BCFW trajectory as dense.

Every comparison builds one random sparse problem and the *same* features densified; the sparse
path must give the dense path's unary scores, oracle answers, joint features, gaps and BCFW
iterates.  The compiled kernel gets identical CSR/Gram inputs from both layouts, so its
trajectory is compared bit for bit.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from conftest import brute_force_max, shared_data
from torch_bcfw import fit
from torch_bcfw.data import SequenceData, SparseFeatures
from torch_bcfw.datasets.conll import CHUNK_TAGS, Sentence
from torch_bcfw.datasets.conll_chain import (
    TAG_IDS, chunk_f1_from_ids, ids_to_tags, load_conll_problem, predictions_to_tags, tags_to_ids,
)
from torch_bcfw.datasets.registry import load_problem
from torch_bcfw.duals import ChainDualState, DenseDualState
from torch_bcfw.duals.plan import StepPlan, generic_plan_steps
from torch_bcfw.duals.chain import sequence_grams
from torch_bcfw.duals.stepsize import FIXED, LINE_SEARCH
from torch_bcfw.models import Chain


def random_sparse_problem(n=8, F=30, K=3, max_len=5, min_len=1, per_token=4, seed=0, binary=False):
    """A chain problem with sparse token features (sorted, distinct ids per token; some tokens empty)
    and the same problem with the features densified."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(min_len, max_len + 1, (n,), generator=g)
    ids, vals, ys = [], [], []
    for L in lengths.tolist():
        a = torch.full((L, per_token), -1, dtype=torch.long)
        v = torch.zeros(L, per_token, dtype=torch.float64)
        for t in range(L):
            m = int(torch.randint(0, per_token + 1, (1,), generator=g))  # 0..per_token attributes
            cols = torch.randperm(F, generator=g)[:m].sort().values
            a[t, :m] = cols
            v[t, :m] = 1.0 if binary else torch.randn(m, generator=g, dtype=torch.float64)
        ids.append(a)
        vals.append(v)
        ys.append(torch.randint(0, K, (L,), generator=g))
    sparse = SequenceData.from_attribute_ids(ids, F, ys, values=vals)
    return Chain(F, K), sparse, sparse.to_dense()


# ------------------------------------------------------------------ the container


@pytest.mark.filterwarnings("ignore:Sparse CSR tensor support is in beta")
def test_sparse_features_construction_and_views():
    ids = torch.tensor([[2, -1, 0], [-1, -1, -1], [4, 4, 1]])
    vals = torch.tensor([[1.5, 9.0, -2.0], [7.0, 7.0, 7.0], [1.0, 2.0, 0.5]], dtype=torch.float64)
    X = SparseFeatures.from_attribute_ids(ids, 5, vals)
    assert X.shape == (3, 5) and X.nnz == 5 and X.indptr.tolist() == [0, 2, 2, 5]
    dense = torch.tensor([[-2.0, 0, 1.5, 0, 0], [0, 0, 0, 0, 0], [0, 0.5, 0, 0, 3.0]], dtype=torch.float64)
    assert torch.equal(X.to_dense(), dense)  # the duplicate id 4 of row 2 adds up
    assert torch.equal(X[torch.tensor([2, 0, 2])].to_dense(), dense[[2, 0, 2]])
    assert torch.equal(SparseFeatures.from_dense(dense).to_dense(), dense)
    assert torch.equal(SparseFeatures.from_torch(dense.to_sparse()).to_dense(), dense)
    assert torch.equal(SparseFeatures.from_torch(dense.to_sparse_csr()).to_dense(), dense)
    assert X.to(torch.float32).dtype == torch.float32 and X.to("cpu") is X
    W = torch.randn(5, 3, dtype=torch.float64)
    M = torch.randn(3, 4, dtype=torch.float64)
    assert torch.allclose(X.matmul(W), dense @ W, atol=1e-14)
    assert torch.allclose(X.t_matmul(M), dense.T @ M, atol=1e-14)
    assert torch.equal(SparseFeatures.from_attribute_ids(ids, 5).to_dense(), (dense != 0).double() + torch.tensor(
        [[0.0] * 5, [0.0] * 5, [0, 0, 0, 0, 1.0]], dtype=torch.float64))  # default values 1 (id 4 twice)
    # a torch sparse tensor given as SequenceData.x becomes a SparseFeatures
    data = SequenceData(dense.to_sparse(), torch.tensor([0, 1, 0]), torch.tensor([0, 1, 3]))
    assert data.is_sparse and data.n_inputs == 5 and torch.equal(data.x.to_dense(), dense)


def test_bad_attribute_ids_and_malformed_csr_raise_clearly():
    with pytest.raises(ValueError, match=r"attribute id 7 at row 1, slot 0 is outside \[0, 4\]"):
        SparseFeatures.from_attribute_ids(torch.tensor([[0, -1], [7, 1]]), 5)
    with pytest.raises(ValueError, match=r"attribute id -3 .* outside"):
        SparseFeatures.from_attribute_ids(torch.tensor([[0, -3]]), 5)
    with pytest.raises(ValueError, match=r"attribute ids must lie in \[0, 4\] \(n_features = 5\); found 1 id"):
        SparseFeatures(torch.tensor([0, 1, 2]), torch.tensor([0, 5]), None, 5)
    with pytest.raises(ValueError, match="indptr must start at 0 and end at nnz"):
        SparseFeatures(torch.tensor([0, 1]), torch.tensor([0, 1]), None, 5)
    with pytest.raises(ValueError, match="non-decreasing"):
        SparseFeatures(torch.tensor([0, 2, 1, 2]), torch.tensor([0, 1]), None, 5)
    with pytest.raises(ValueError, match="NaN or infinite"):
        SparseFeatures(torch.tensor([0, 2]), torch.tensor([0, 1]), torch.tensor([1.0, float("nan")]), 5)
    with pytest.raises(ValueError, match="integers"):
        SparseFeatures(torch.tensor([0, 1]), torch.tensor([0.5]), None, 5)
    with pytest.raises(ValueError, match="sequence 1: 1 tokens but 3 labels"):
        SequenceData.from_attribute_ids([torch.zeros(1, 2, dtype=torch.long)] * 2, 3, [torch.zeros(1), torch.zeros(3)])
    X = SparseFeatures.from_attribute_ids(torch.tensor([[0], [1]]), 4)
    with pytest.raises(ValueError, match="offsets must start at 0 and end at N_tok = 2"):
        SequenceData(X, None, torch.tensor([0, 3]))
    model, sparse, _ = random_sparse_problem(F=30)
    with pytest.raises(ValueError, match="dimension 30 but the model expects 31"):
        Chain(31, 3).check_data(sparse)
    with pytest.raises(ValueError, match="padded\\(\\) would materialise"):
        SequenceData(SparseFeatures.from_attribute_ids(torch.zeros(40, 1, dtype=torch.long), 1 << 23),
                     None, torch.tensor([0, 20, 40])).padded()
    big = Chain(1 << 23, 3)  # d ~ 25M: a joint-feature table of 20 sequences would be 4 GB
    data = SequenceData(SparseFeatures.from_attribute_ids(torch.zeros(20, 1, dtype=torch.long), 1 << 23),
                        torch.zeros(20, dtype=torch.long), torch.arange(21))
    with pytest.raises(ValueError, match="joint_feature would materialise a dense"):
        big.joint_feature(data, data.y)
    assert big.joint_feature(data[[0]], data[[0]].y).shape == (1, big.n_features)


def test_indexing_device_and_padding_follow_the_dense_data():
    _, sparse, dense = random_sparse_problem(n=9, seed=2)
    idx = [4, 0, 7, 4]
    sub = sparse[idx]
    assert sub.is_sparse
    assert torch.equal(sub.x.to_dense(), dense[idx].x)
    assert torch.equal(sub.y, dense[idx].y) and torch.equal(sub.offsets, dense[idx].offsets)
    moved = sparse.to("cpu")
    assert moved.is_sparse and torch.equal(moved.x.to_dense(), dense.x)
    for a, b in zip(sparse.padded(), dense.padded()):
        assert torch.equal(a, b)
    for a, b in zip(sparse.x_csr(), dense.x_csr()):
        assert torch.equal(a, b)  # sorted distinct ids: the stored entries are the dense non-zeros


# ------------------------------------------------------------------ model: sparse == dense


@pytest.mark.parametrize("seed,binary", [(0, False), (1, True), (2, False)])
def test_scores_oracles_and_joint_features_match_dense(seed, binary):
    model, sparse, dense = random_sparse_problem(n=10, F=25, K=4, max_len=6, seed=seed, binary=binary)
    g = torch.Generator().manual_seed(seed)
    for scale in (0.3, 2.0):
        w = torch.randn(model.n_features, generator=g, dtype=torch.float64) * scale
        assert torch.allclose(model.unary_scores(w, sparse), model.unary_scores(w, dense), atol=1e-12)
        for aug in (True, False):
            assert torch.equal(model.oracle(w, sparse, aug), model.oracle(w, dense, aug))
        y = model.oracle(w, dense)
        assert torch.equal(model.joint_feature(sparse, y), model.joint_feature(dense, y))
        assert torch.allclose(model.joint_feature_sum(sparse, y), model.joint_feature_sum(dense, y), atol=1e-12)
        assert torch.allclose(model.score(w, sparse, y), model.score(w, dense, y), atol=1e-12)
        ys, Hs = model.hinge_terms(w, sparse)
        yd, Hd = model.hinge_terms(w, dense)
        assert torch.equal(ys, yd) and torch.allclose(Hs, Hd, atol=1e-12)
    # the joint feature map itself, checked entry by entry on one sequence
    i = int(torch.argmax(dense.lengths))
    blk = dense[[i]]
    phi = model.joint_feature(sparse[[i]], blk.y)[0]
    We, b, s, e, tr = model.unpack(phi)
    X = blk.x
    onehot = torch.nn.functional.one_hot(blk.y, model.n_labels).double()
    assert torch.allclose(We, X.T @ onehot, atol=1e-14)
    assert torch.equal(b, onehot.sum(0)) and torch.equal(s, onehot[0]) and torch.equal(e, onehot[-1])
    assert float(tr.sum()) == blk.n_tokens - 1


def test_sparse_oracle_equals_enumeration():
    model, sparse, _ = random_sparse_problem(n=5, F=12, K=3, max_len=4, seed=7)
    w = torch.randn(model.n_features, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    y = model.oracle(w, sparse)
    for i in range(len(sparse)):
        best, _ = brute_force_max(model, sparse, w, i)
        blk, yi = sparse[[i]], y[sparse.offsets[i]:sparse.offsets[i + 1]]
        assert float(model.joint_feature(blk, yi)[0] @ w) + float(model.loss(blk, yi)[0]) == pytest.approx(best, abs=1e-10)


def test_csr_and_gram_construction():
    model, sparse, dense = random_sparse_problem(n=7, F=20, K=3, max_len=6, seed=4)
    ks = ChainDualState(model, sparse, 0.1).kernel_features()
    kd = ChainDualState(model, dense, 0.1).kernel_features()
    for key in ks._fields:
        assert np.array_equal(getattr(ks, key), getattr(kd, key)), key
    for i in range(len(dense)):
        Xi = dense[[i]].x
        L = Xi.shape[0]
        G = ks.gram[ks.gram_off[i]:ks.gram_off[i + 1]].reshape(L, L)
        np.testing.assert_allclose(G, (Xi @ Xi.T + 1.0).numpy(), atol=1e-13)
    # duplicate ids inside a token add up in the Gram matrix as in the dense product
    X = SparseFeatures.from_attribute_ids(torch.tensor([[1, 1, 3], [3, -1, -1], [0, 2, 1]]), 4,
                                          torch.tensor([[2.0, 0.5, 1.0], [4.0, 0, 0], [1.0, 1.0, -1.0]]))
    gram, off = sequence_grams(X.indptr, X.indices, X.values, torch.tensor([0, 2, 3]), 4)
    D = X.to_dense()
    assert off.tolist() == [0, 4, 5]
    np.testing.assert_allclose(gram[:4].reshape(2, 2).numpy(), (D[:2] @ D[:2].T + 1).numpy())
    np.testing.assert_allclose(gram[4:].numpy(), (D[2] @ D[2] + 1).reshape(1).numpy())


@pytest.mark.parametrize("binary", [False, True])
def test_products_in_runs_of_bags_over_lean_transposed_entries_give_the_same_bits(monkeypatch, binary):
    import torch_bcfw.data.sequences as data_module

    _, sparse, dense = random_sparse_problem(n=30, F=25, K=3, max_len=8, per_token=6, seed=11, binary=binary)
    X = sparse.x
    g = torch.Generator().manual_seed(1)
    W = torch.randn(X.n_features, 5, generator=g, dtype=torch.float64)
    M = torch.randn(X.n_rows, 5, generator=g, dtype=torch.float64)
    order = torch.sort(X.indices, stable=True).indices
    indptr_t = torch.zeros(X.n_features + 1, dtype=torch.long)
    indptr_t[1:] = torch.cumsum(torch.bincount(X.indices, minlength=X.n_features), 0)

    def one_call(ids, table, offsets, weights):  # all entries at once, int64 ids, the CSC with its own values
        return torch.nn.functional.embedding_bag(ids, table, offsets, mode="sum",
                                                 per_sample_weights=weights.to(table.dtype), include_last_offset=True)

    for chunk in (1, 7, 1 << 20):  # one bag at a time, a few bags per run (a larger bag alone), all at once
        monkeypatch.setattr(data_module, "_BAG_CHUNK", chunk)
        Y = SparseFeatures(X.indptr, X.indices, X.values, X.n_features)  # transposed entries not cached yet
        for t in (torch.float64, torch.float32):
            assert torch.equal(Y.matmul(W.to(t)), one_call(X.indices, W.to(t), X.indptr, X.values))
            assert torch.equal(Y.t_matmul(M.to(t)), one_call(X.row_ids()[order], M.to(t), indptr_t, X.values[order]))
    ip, rows, values = Y._transposed()
    assert ip.dtype == rows.dtype == torch.int32 and torch.equal(rows.long(), X.row_ids()[order])
    assert (values is X.values) == binary and torch.equal(values, X.values[order])
    assert torch.allclose(X.t_matmul(M), dense.x.T @ M, atol=1e-13)
    empty = SparseFeatures(torch.zeros(4, dtype=torch.long), torch.zeros(0, dtype=torch.long), None, 6)
    assert torch.equal(empty.matmul(W[:6]), torch.zeros(3, 5, dtype=torch.float64))
    assert torch.equal(empty.t_matmul(M[:3]), torch.zeros(6, 5, dtype=torch.float64))


@pytest.mark.parametrize("binary", [False, True])
def test_label_sums_need_no_one_hot_table_and_give_its_bits(binary):
    model, sparse, dense = random_sparse_problem(n=30, F=25, K=4, max_len=8, per_token=6, seed=12, binary=binary)
    y = torch.randint(0, 4, (sparse.n_tokens,), generator=torch.Generator().manual_seed(2))
    one_hot = torch.nn.functional.one_hot(y, 4).to(torch.float64)
    assert torch.equal(model.one_hot(y), one_hot)
    assert torch.equal(sparse.xt_one_hot(y, 4), sparse.xt_matmul(one_hot))
    assert torch.equal(dense.xt_one_hot(y, 4), dense.xt_matmul(one_hot))
    for data in (sparse, dense, sparse[[3, 0, 3]]):
        labels = data.y if data is not sparse else y
        ref = model.features_from_marginals(data, model.one_hot(labels), model.transition_counts(data, labels).sum(0))
        assert torch.equal(model.joint_feature_sum(data, labels), ref)
        assert torch.allclose(model.joint_feature(data, labels).sum(0), ref, atol=1e-12)
    with pytest.raises(ValueError, match=r"labels must lie in \[0, 3\]"):
        model.joint_feature_sum(sparse, torch.full((sparse.n_tokens,), 4))


def test_fit_hands_the_chain_storage_to_its_result_and_copies_it_on_warm_start():
    model, sparse, _ = random_sparse_problem(n=10, F=20, K=3, max_len=6, seed=13)
    first = fit(model, sparse, 0.05, "bcfw", max_passes=2, gap_check=1, seed=0)
    saved = {k: v.clone() for k, v in first.solver_state["state"]["storage"].items()}
    later = fit(model, sparse, 0.05, "bcfw", init=first, max_passes=2, gap_check=1, seed=0)
    assert all(torch.equal(first.solver_state["state"]["storage"][k], v) for k, v in saved.items())
    assert not torch.equal(later.solver_state["state"]["storage"]["mu"], saved["mu"])  # the later fit moved on
    state = ChainDualState(model, sparse, 0.05)
    sd = state.state_dict()  # a copy: the state goes on
    assert sd["storage"]["mu"].data_ptr() != state.mu.data_ptr()
    state.move_storage_on_save = True
    mu = state.mu
    sd = state.state_dict()  # moved: the state cannot step any more
    assert sd["storage"]["mu"] is mu and state.mu is None
    again = ChainDualState(model, sparse, 0.05)
    again.load_state_dict(sd)
    assert torch.equal(again.mu, mu) and again.mu.data_ptr() != mu.data_ptr()


# ------------------------------------------------------------------ BCFW: sparse == dense


def test_compact_state_trajectory_is_identical():
    model, sparse, dense = random_sparse_problem(n=14, F=40, K=4, max_len=7, seed=5)
    order = np.random.default_rng(0).integers(0, len(dense), 120)
    for code in (LINE_SEARCH, FIXED):
        s, d = ChainDualState(model, sparse, 0.03), ChainDualState(model, dense, 0.03)
        gs, gd = s.run_steps(order, code), d.run_steps(order, code)
        assert np.array_equal(gs, gd)  # identical kernel inputs: bit-identical steps
        assert torch.equal(s.w, d.w) and torch.equal(s.mu, d.mu) and torch.equal(s.T, d.T)
        assert s.ell == d.ell
        (wa, la), (wb, lb) = s.averaged(), d.averaged()
        assert torch.allclose(wa, wb, atol=1e-12) and la == lb
        # torch step path (the one off-CPU devices take) and the dense w_i table on sparse data
        generic = ChainDualState(model, sparse, 0.03)
        table = DenseDualState(model, sparse, 0.03)
        np.testing.assert_allclose(generic_plan_steps(generic, StepPlan.plain(order, code, True)).gaps, gs, atol=1e-12)
        np.testing.assert_allclose(table.run_steps(order, code), gs, atol=1e-12)
        assert torch.allclose(generic.w, s.w, atol=1e-12) and torch.allclose(table.w, s.w, atol=1e-12)
        assert s.refresh() < 1e-12


@pytest.mark.parametrize("solver", ["bcfw", "fw", "ssg"])
def test_fit_history_matches_dense(solver):
    model, sparse, dense = random_sparse_problem(n=12, F=30, K=3, max_len=6, seed=8)
    kw = dict(max_passes=6, gap_check=2, seed=3)
    rs = fit(model, sparse, 0.05, solver, test_data=sparse[[0, 1, 2]], **kw)
    rd = fit(model, dense, 0.05, solver, test_data=dense[[0, 1, 2]], **kw)
    assert len(rs.history) == len(rd.history) == 3
    for a, b in zip(rs.history, rd.history):
        for key in ("passes", "primal", "dual", "gap_last", "primal_avg", "gap_avg", "gap", "train_loss", "test_loss"):
            if getattr(a, key) is None:
                assert getattr(b, key) is None
            else:
                assert getattr(a, key) == pytest.approx(getattr(b, key), abs=1e-10), key
    assert torch.allclose(rs.w, rd.w, atol=1e-10)
    assert torch.allclose(rs.weights, rd.weights, atol=1e-10)
    if solver != "ssg":
        assert rs.gap >= -1e-12 and rs.gap < rs.history[0].gap + 1e-12


# ------------------------------------------------------------------ CoNLL


def test_tag_mapping_and_f1_use_gold_strings():
    assert len(TAG_IDS) == 22 and ids_to_tags(tags_to_ids(CHUNK_TAGS)) == list(CHUNK_TAGS)
    gold = Sentence(["(", "1", ")", "the", "dog"], ["(", "CD", ")", "DT", "NN"], ["B-LST", "I-LST", "O", "B-NP", "I-NP"])
    ids = tags_to_ids(gold.chunks)
    assert ids[1] == TAG_IDS["O"]  # unseen I-LST: O's id, for the loss only
    # predicting the mapped ids does not reproduce the LST chunk: F1 is scored on the gold strings
    scores = chunk_f1_from_ids(ids, torch.tensor([0, 5]), [gold])
    assert (scores["n_true"], scores["n_pred"], scores["n_correct"]) == (2, 2, 1)
    assert predictions_to_tags(ids, torch.tensor([0, 2, 5])) == [["B-LST", "O"], ["O", "B-NP", "I-NP"]]
    with pytest.raises(ValueError, match="label id 22 is not a chunk tag id"):
        ids_to_tags([22])
    with pytest.raises(ValueError, match="offsets cover 4 tokens"):
        predictions_to_tags(ids, torch.tensor([0, 4]))


def test_conll_200_sentences_end_to_end():
    root = shared_data("conll2000")
    prob = load_conll_problem(root, min_count=1, limit=200, test_limit=100)
    F = len(prob.vocab)
    assert "bias" not in prob.vocab and prob.train.is_sparse and prob.test.is_sparse
    assert prob.model.n_features == F * 22 + 3 * 22 + 22 * 22
    assert len(prob.train) == 200 and len(prob.test) == 100
    # every token holds at most the 19 non-bias template attributes, indicator values
    assert int(prob.train.x.indptr.diff().max()) <= 19 and bool((prob.train.x.values == 1).all())
    assert chunk_f1_from_ids(prob.test.y, prob.test.offsets, prob.test_sentences)["f1"] == 1.0  # no I-LST here
    res = fit(prob.model, prob.train, 1.0 / 200, max_passes=10, gap_check=5, test_data=prob.test)
    gaps = [r.gap for r in res.history]
    assert all(np.isfinite(gaps)) and min(gaps) >= 0 and gaps[-1] < gaps[0]
    test_f1 = prob.f1(res.weights)
    train_f1 = prob.f1(res.weights, "train")
    assert 0.0 <= test_f1["f1"] <= 1.0 and test_f1["n_true"] > 1000
    assert test_f1["f1"] > 0.75 and train_f1["f1"] > 0.95  # learns from 200 sentences
    # the registry builds the same problem for configs
    model, train, test = load_problem({"name": "conll", "path": str(root), "min_count": 1, "limit": 200, "test_limit": 100})
    assert model.n_features == prob.model.n_features and train.is_sparse
    assert torch.equal(train.x.indices, prob.train.x.indices) and torch.equal(test.y, prob.test.y)


@pytest.mark.slow
def test_full_conll_dimension_is_the_papers():
    prob = load_conll_problem(shared_data("conll2000"), min_count=3)
    assert len(prob.vocab) == 74_658 and prob.model.n_features == 1_643_026
    assert (len(prob.train), prob.train.n_tokens, len(prob.test), prob.test.n_tokens) == (8936, 211_727, 2012, 47_377)


# ------------------------------------------------------------------ the compiled subgradient steps


@pytest.mark.parametrize("sparse_storage", [True, False])
@pytest.mark.parametrize("averaging", [True, False])
def test_compiled_subgradient_steps_follow_the_generic_recurrence(sparse_storage, averaging):
    """The chain's compiled SSG steps (unrolled sums, non-zeros only) give the generic dense recurrence's ``w`` and
    ``w_avg`` after every chunk, and continue identically from a loaded state.  Every token has real-valued
    features: a token without any ties labelings exactly (bias, start and transition weights are multiples of
    ``1 / (lam k)``) and rounding, different in the two, breaks the tie."""
    from torch_bcfw.duals.chain_subgradient import ChainSubgradientSteps
    from torch_bcfw.duals.subgradient import SubgradientSteps

    g = torch.Generator().manual_seed(3)
    lengths = torch.randint(1, 7, (12,), generator=g)
    F, K = 5, 4
    ids = [torch.arange(F).repeat(int(L), 1) for L in lengths]
    vals = [torch.randn(int(L), F, generator=g, dtype=torch.float64) for L in lengths]
    ys = [torch.randint(0, K, (int(L),), generator=g) for L in lengths]
    model, sparse = Chain(F, K), SequenceData.from_attribute_ids(ids, F, ys, values=vals)
    data = sparse if sparse_storage else sparse.to_dense()
    lam = 0.03
    order = np.random.default_rng(5).integers(0, len(data), size=90)
    generic, compiled = SubgradientSteps(model, data, lam, averaging), ChainSubgradientSteps(model, data, lam, averaging)
    for chunk in np.array_split(order[:60], 4):
        generic.advance(chunk)
        compiled.advance(chunk)
        assert compiled.k == generic.k
        assert torch.allclose(compiled.weights(), generic.weights(), rtol=0, atol=1e-12)
        assert torch.allclose(compiled.averaged(), generic.averaged(), rtol=0, atol=1e-12)
    assert float(generic.weights().abs().max()) > 0.1  # the steps moved w
    resumed = ChainSubgradientSteps(model, data, lam, averaging)
    resumed.load(generic.weights(), generic.averaged(), generic.k)
    generic.advance(order[60:])
    resumed.advance(order[60:])
    assert torch.allclose(resumed.weights(), generic.weights(), rtol=0, atol=1e-10)
    assert torch.allclose(resumed.averaged(), generic.averaged(), rtol=0, atol=1e-10)


def test_chain_ssg_runs_compiled_on_cpu_and_generic_for_an_overridden_oracle():
    from torch_bcfw.duals.chain_subgradient import ChainSubgradientSteps
    from torch_bcfw.duals.subgradient import SubgradientSteps

    model, sparse, _ = random_sparse_problem(n=6, seed=1)

    class Flipped(Chain):
        def oracle(self, w, data, loss_augmented=True):  # the compiled Viterbi must not stand in for this one
            return super().oracle(-w, data, loss_augmented)

    assert type(model.subgradient_steps(sparse, 0.1, True)) is ChainSubgradientSteps
    other = Flipped(model.n_inputs, model.n_labels)
    assert type(other.subgradient_steps(sparse, 0.1, True)) is SubgradientSteps
    a = fit(other, sparse, 0.1, "ssg", max_passes=3, gap_check=3, seed=2)
    b = fit(model, sparse, 0.1, "ssg", max_passes=3, gap_check=3, seed=2)
    assert not torch.allclose(a.w, b.w)  # the overridden oracle was called
