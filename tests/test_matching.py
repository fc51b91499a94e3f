"""Word alignment as bipartite matching: the Matching model and its data, the Hansards loader, the text features,
AER.  Oracles, joint features, losses and the duality gap are checked against brute-force enumeration of every
partial matching of tiny pairs."""
from __future__ import annotations

import itertools
import random
import shutil

import numpy as np
import pytest
import torch

from conftest import partial_matchings as enumerate_matchings
from conftest import requires_cuda, shared_data
from torch_bcfw import fit
from torch_bcfw.datasets.hansards import (
    SentencePair, alignment_data, hansards_split, load_hansards, matching_target, read_links, read_sentences,
)
from torch_bcfw.datasets.registry import load_problem
from torch_bcfw.features.alignment import (
    AlignmentFeaturizer, dice_competitive_linking, link_indicator_features, symmetrize,
)
from torch_bcfw.metrics.alignment import alignment_scores, alignment_scores_from_labelings
from torch_bcfw.data import MatchingData
from torch_bcfw.models import Matching, model_from_config, model_name
from torch_bcfw.models.matching import max_weight_matching

COSTS = [(3.0, 1.0), (1.0, 1.0), (0.5, 2.0), (0.0, 1.0), (2.0, 0.0)]


# ----------------------------------------------------------------------------- brute force
def partial_matchings(m: int, f: int):
    """Every partial matching of an ``m x f`` bipartite graph as a set of links ``(j, k)``."""
    return [frozenset(M) for M in enumerate_matchings(m, f)]


def as_labels(links, m, f) -> torch.Tensor:
    y = torch.zeros(m * f, dtype=torch.long)
    for j, k in links:
        y[j * f + k] = 1
    return y


def random_problem(n=5, F=3, max_len=3, seed=0, min_len=1):
    g = torch.Generator().manual_seed(seed)
    xs, ys = [], []
    for _ in range(n):
        m, f = torch.randint(min_len, max_len + 1, (2,), generator=g).tolist()
        xs.append(torch.randn(m, f, F, generator=g, dtype=torch.float64))
        links = partial_matchings(m, f)
        ys.append(as_labels(links[int(torch.randint(len(links), (1,), generator=g))], m, f).view(m, f))
    return MatchingData.from_pairs(xs, ys)


def pair_links(data, i, y):
    """Pair ``i``'s links of a packed labeling as a set of ``(j, k)``."""
    m, f = (int(v) for v in data.sizes[i])
    yi = y[int(data.offsets[i]): int(data.offsets[i + 1])].view(m, f)
    return {(int(j), int(k)) for j, k in torch.nonzero(yi)}


def independent_value(model, data, i, links, w, aug):
    """``[L_i(y)] + <w, phi(x_i, y)>`` from the definitions, link by link (no model code)."""
    m, f = (int(v) for v in data.sizes[i])
    X = data.x[int(data.offsets[i]): int(data.offsets[i + 1])].view(m, f, -1)
    Z = (m + f) if model.normalize == "words" else 1.0
    value = sum(float(X[j, k] @ w) for j, k in links) / Z
    if aug:
        truth = pair_links(data, i, data.y)
        value += (model.extra_cost * len(links - truth) + model.miss_cost * len(truth - links)) / Z
    return value


def brute_force_best(model, data, i, w, aug):
    m, f = (int(v) for v in data.sizes[i])
    return max(independent_value(model, data, i, M, w, aug) for M in partial_matchings(m, f))


def brute_force_primal(model, data, w, lam):
    total = 0.0
    for i in range(len(data)):
        total += brute_force_best(model, data, i, w, True) - independent_value(
            model, data, i, pair_links(data, i, data.y), w, False)
    return 0.5 * lam * float(w @ w) + total / len(data)


def test_enumeration_counts_partial_matchings():
    # sum_k C(m,k) C(f,k) k!: 7 for 2x2, 34 for 3x3, 13 for 2x3
    assert [len(partial_matchings(*s)) for s in ((2, 2), (3, 3), (2, 3), (1, 4))] == [7, 34, 13, 5]


# ----------------------------------------------------------------------------- model
@pytest.mark.parametrize("miss,extra", COSTS)
@pytest.mark.parametrize("normalize", ["words", "none"])
def test_oracle_equals_enumeration(miss, extra, normalize):
    data = random_problem(n=6, F=3, max_len=3, seed=int(10 * miss + extra))
    model = Matching(3, miss_cost=miss, extra_cost=extra, normalize=normalize)
    g = torch.Generator().manual_seed(1)
    for trial in range(3):
        w = torch.randn(3, generator=g, dtype=torch.float64) * (0.3 + trial)
        for aug in (True, False):
            y = model.oracle(w, data, loss_augmented=aug)
            data.check_labeling(y)  # a matching
            for i in range(len(data)):
                got = independent_value(model, data, i, pair_links(data, i, y), w, aug)
                assert got == pytest.approx(brute_force_best(model, data, i, w, aug), abs=1e-12)


def test_max_weight_matching_on_random_and_tied_matrices():
    rng = np.random.default_rng(0)
    for m, f in [(1, 1), (1, 4), (4, 1), (3, 3), (2, 4), (4, 3)]:
        for S in (rng.normal(size=(m, f)), rng.integers(-1, 2, size=(m, f)).astype(float), np.zeros((m, f))):
            r, c = max_weight_matching(S)
            assert len(set(r)) == len(r) and len(set(c)) == len(c)
            assert all(S[r, c] > 0)  # non-positive links are dropped
            best = max(sum(S[j, k] for j, k in M) for M in partial_matchings(m, f))
            assert S[r, c].sum() == pytest.approx(best, abs=1e-12)


@pytest.mark.parametrize("normalize", ["words", "none"])
def test_joint_feature_loss_and_score_against_independent_code(normalize):
    data = random_problem(n=7, F=4, max_len=4, seed=3)
    model = Matching(4, miss_cost=3.0, extra_cost=1.0, normalize=normalize)
    g = torch.Generator().manual_seed(2)
    w = torch.randn(4, generator=g, dtype=torch.float64)
    y = model.oracle(w, data)
    phi = model.joint_feature(data, y)
    assert phi.shape == (len(data), 4)
    for i in range(len(data)):
        m, f = (int(v) for v in data.sizes[i])
        Z = (m + f) if normalize == "words" else 1.0
        X = data.x[int(data.offsets[i]): int(data.offsets[i + 1])].view(m, f, -1)
        links, truth = pair_links(data, i, y), pair_links(data, i, data.y)
        expect = sum((X[j, k] for j, k in links), torch.zeros(4, dtype=torch.float64)) / Z
        assert torch.allclose(phi[i], expect, atol=1e-14)
        loss = (1.0 * len(links - truth) + 3.0 * len(truth - links)) / Z
        assert float(model.loss(data, y)[i]) == pytest.approx(loss, abs=1e-14)
    assert torch.allclose(model.joint_feature_sum(data, y), phi.sum(0), atol=1e-13)
    assert torch.allclose(model.score(w, data, y), phi @ w, atol=1e-13)
    assert torch.all(model.loss(data, data.y) == 0)
    _, H = model.hinge_terms(w, data)
    for i in range(len(data)):
        ref = brute_force_best(model, data, i, w, True) - independent_value(model, data, i, pair_links(data, i, data.y),
                                                                           w, False)
        assert float(H[i]) == pytest.approx(ref, abs=1e-12)


def test_max_loss_is_exact():
    data = random_problem(n=6, F=2, max_len=3, seed=7)
    for miss, extra in COSTS[:3]:
        model = Matching(2, miss, extra)
        w0 = torch.zeros(2, dtype=torch.float64)
        ref = [brute_force_best(model, data, i, w0, True) for i in range(len(data))]
        assert model.max_loss(data).tolist() == pytest.approx(ref, abs=1e-12)
        assert all(v <= (miss + extra) / 2 + 1e-12 for v in ref)  # the bound of the module docstring


def test_gap_equals_primal_minus_dual_by_enumeration():
    data = random_problem(n=6, F=3, max_len=3, seed=11, min_len=2)
    model = Matching(3)
    lam = 0.05
    r = fit(model, data, lam, max_passes=40, gap_check=10, seed=0, progress=False)
    last = r.history[-1]
    assert last.primal == pytest.approx(brute_force_primal(model, data, r.w, lam), abs=1e-12)
    assert last.primal_avg == pytest.approx(brute_force_primal(model, data, r.w_avg, lam), abs=1e-12)
    st = r.solver_state["state"]
    dual = st["ell"] - 0.5 * lam * float(st["w"] @ st["w"])  # D(alpha) = b^T alpha - lam/2 ||A alpha||^2
    assert last.dual == pytest.approx(dual, abs=1e-12)
    assert last.gap_last == pytest.approx(last.primal - last.dual, abs=1e-12)
    ref = fit(model, data, lam, max_passes=400, gap_check=50, gap_tol=1e-6, progress=False)
    ref_dual = ref.history[-1].dual if ref.selected == "last" else ref.history[-1].dual_avg
    p_ref = brute_force_primal(model, data, ref.weights, lam)
    assert p_ref - ref_dual == pytest.approx(ref.gap, abs=1e-12) and ref.gap <= 1e-4
    # weak duality across the two runs: every dual value bounds every enumerated primal value from below
    assert last.dual <= p_ref + 1e-12 and ref_dual <= last.primal + 1e-12
    assert r.primal - ref_dual >= r.primal - p_ref >= -1e-12  # P(w) - P* <= P(w) - D(ref): a certified bound


def test_matching_data_container():
    data = random_problem(n=5, F=2, max_len=4, seed=5)
    sub = data[[3, 1, 3]]
    assert len(sub) == 3 and sub.sizes.tolist() == [data.sizes[3].tolist(), data.sizes[1].tolist(),
                                                     data.sizes[3].tolist()]
    assert torch.equal(sub.pair_matrix(sub.x, 1), data.pair_matrix(data.x, 1))
    assert torch.equal(sub.pair_matrix(sub.y, 2), data.pair_matrix(data.y, 3))
    j, k = data.link_positions()
    m, f = (int(v) for v in data.sizes[2])
    assert torch.equal(data.pair_matrix(j, 2), torch.arange(m)[:, None].expand(m, f))
    assert torch.equal(data.pair_matrix(k, 2), torch.arange(f)[None, :].expand(m, f))
    assert data.to("cpu").n_links == data.n_links
    model = Matching(2)
    assert model_name(model) == "Matching"
    assert model_from_config("Matching", model.config()).config() == model.config()


@requires_cuda
@pytest.mark.cuda
def test_matching_on_cuda_equals_cpu():
    data = random_problem(n=6, F=3, max_len=4, seed=2)
    model = Matching(3)
    w = torch.randn(3, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    gpu = data.to("cuda")
    for aug in (True, False):
        assert torch.equal(model.oracle(w.cuda(), gpu, aug).cpu(), model.oracle(w, data, aug))
    y = model.oracle(w, data)
    assert torch.allclose(model.joint_feature(gpu, y.cuda()).cpu(), model.joint_feature(data, y))
    r = fit(model, gpu, 0.1, max_passes=5, gap_check=5, progress=False)
    # fit solves where its block steps are measured cheaper, and says where
    assert r.weights.device.type == ("cpu" if r.counters["placement_moved_to_cpu"] else "cuda") and r.gap >= 0


def test_matching_data_errors():
    x = torch.zeros(2, 2, 1, dtype=torch.float64)
    bad = torch.tensor([[1, 1], [0, 0]])  # English word 0 in two links
    with pytest.raises(ValueError, match="not a matching"):
        MatchingData.from_pairs([x], [bad])
    with pytest.raises(ValueError, match="not a matching"):
        MatchingData.from_pairs([x], [bad.T.contiguous()])  # French word 0 in two links
    with pytest.raises(ValueError, match="0/1"):
        MatchingData.from_pairs([x], [torch.tensor([[2, 0], [0, 0]])])
    with pytest.raises(ValueError, match=r"\[m, f, F\]"):
        MatchingData.from_pairs([torch.zeros(2, 2)])
    with pytest.raises(ValueError, match="candidate links"):
        MatchingData(torch.zeros(5, 1), torch.tensor([[2, 2]]))
    with pytest.raises(ValueError, match="at least one word"):
        MatchingData(torch.zeros(0, 1), torch.tensor([[0, 2]]))
    with pytest.raises(ValueError, match="NaN"):
        MatchingData(torch.full((4, 1), float("nan")), torch.tensor([[2, 2]]))
    with pytest.raises(TypeError, match="MatchingData"):
        Matching(1).check_data(object())
    with pytest.raises(ValueError, match="normalize"):
        Matching(1, normalize="links")
    with pytest.raises(ValueError, match="miss_cost"):
        Matching(1, miss_cost=-1.0)


# ----------------------------------------------------------------------------- AER
def test_aer_hand_worked():
    # pair 1: S = {(0,0), (1,1)}, P = S + {(2,1)}; predicted {(0,0), (2,1), (2,2)}
    # pair 2: S = {(0,1)}, P = S; predicted {}
    pred = [{(0, 0), (2, 1), (2, 2)}, set()]
    sure = [{(0, 0), (1, 1)}, {(0, 1)}]
    possible = [{(2, 1)}, set()]  # given without the sure links: P is taken as P | S
    s = alignment_scores(pred, sure, possible)
    # |A| = 3, |S| = 3, |A & S| = 1, |A & P| = 2
    assert (s.predicted, s.sure, s.hit_sure, s.hit_possible) == (3, 3, 1, 2)
    assert s.precision == pytest.approx(2 / 3)
    assert s.recall == pytest.approx(1 / 3)
    assert s.aer == pytest.approx(1 - (1 + 2) / (3 + 3))  # 0.5
    perfect = alignment_scores([{(0, 0)}], [{(0, 0)}], [{(0, 0), (1, 1)}])
    assert perfect.aer == 0.0 and perfect.precision == 1.0 and perfect.recall == 1.0
    only_possible = alignment_scores([{(1, 1)}], [{(0, 0)}], [{(1, 1)}])  # a possible link counts for precision
    assert only_possible.precision == 1.0 and only_possible.recall == 0.0 and only_possible.aer == pytest.approx(0.5)
    assert alignment_scores([set()], [{(0, 0)}], [set()]).aer == 1.0
    with pytest.raises(ValueError, match="one of each"):
        alignment_scores([set()], [], [])
    # the same numbers from packed labelings of a MatchingData
    x = [torch.zeros(3, 3, 1), torch.zeros(1, 2, 1)]
    S = [torch.zeros(3, 3, dtype=torch.bool), torch.zeros(1, 2, dtype=torch.bool)]
    P = [torch.zeros(3, 3, dtype=torch.bool), torch.zeros(1, 2, dtype=torch.bool)]
    S[0][0, 0] = S[0][1, 1] = S[1][0, 1] = True
    P[0][2, 1] = True
    data = MatchingData.from_pairs(x, sure=S, possible=P)
    y = torch.zeros(data.n_links, dtype=torch.long)
    y[[0, 7, 8]] = 1  # (0,0), (2,1), (2,2) of pair 0
    assert alignment_scores_from_labelings(data, y) == s
    with pytest.raises(ValueError, match="no gold sure / possible links"):
        alignment_scores_from_labelings(MatchingData.from_pairs(x), y)
    from torch_bcfw.datasets.task_metrics import task_metrics  # what `torch-bcfw fit` prints for the hansards dataset

    class Result:
        def predict(self, d):
            return y

    shown = task_metrics("hansards", Matching(1), data, Result())
    assert shown == pytest.approx({"test AER (%)": 50.0, "test precision (%)": 200 / 3, "test recall (%)": 100 / 3})


# ----------------------------------------------------------------------------- Hansards loader
ROOT = ("hansards_alignment",)


def test_hansards_protocol_counts():
    corpus = load_hansards(shared_data(*ROOT), unlabelled=False)
    assert (len(corpus.gold), len(corpus.trial), len(corpus.unlabelled)) == (447, 37, 0)
    sp = hansards_split(corpus)
    assert (len(sp.train), len(sp.trial), len(sp.test)) == (100, 37, 347)
    count = lambda pairs, attr: sum(len(getattr(p, attr)) for p in pairs)  # noqa: E731
    # sure and possible-only link counts of the reference note (possible includes sure here)
    assert (count(sp.train, "sure"), count(sp.train, "possible") - count(sp.train, "sure")) == (949, 2400)
    assert (count(sp.test, "sure"), count(sp.test, "possible") - count(sp.test, "sure")) == (3089, 11000)
    assert (count(sp.trial, "sure"), count(sp.trial, "possible") - count(sp.trial, "sure")) == (338, 1446)
    p = corpus.gold[2]  # "oh , oh !" / "oh , oh !", links 0-0 1-1 2-2 3-3
    assert p.english == ("oh", ",", "oh", "!") and p.sure == frozenset({(0, 0), (1, 1), (2, 2), (3, 3)})
    lost = 0
    for q in corpus.gold:
        y = matching_target(q)
        assert y.sum(0).max() <= 1 and y.sum(1).max() <= 1
        assert all((j, k) in q.sure for j, k in zip(*np.nonzero(y)))
        lost += len(q.sure) - int(y.sum())
    assert lost == 145  # sure links no matching can keep (a word with several sure partners)


def test_hansards_unlabelled_count():
    corpus = load_hansards(shared_data(*ROOT))
    assert len(corpus.unlabelled) == 2383
    assert len(corpus.texts()) == 2383 + 447 + 37 and all(p.sure is None for p in corpus.texts())


def test_hansards_loader_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match=str(tmp_path / "nowhere")):
        load_hansards(tmp_path / "nowhere")
    root = tmp_path / "h"
    (root / "test").mkdir(parents=True)
    with pytest.raises(FileNotFoundError, match=r"looked for .*test\.e"):
        load_hansards(root)
    (root / "test" / "test.e").write_text("<s snum=0001> a b </s>\n<s snum=0002> c </s>\n")
    (root / "test" / "test.f").write_text("<s snum=0001> x y </s>\n<s snum=0002> z </s>\n")
    with pytest.raises(FileNotFoundError, match=r"test\.align"):
        load_hansards(root)
    align = root / "test" / "test.align"
    for text, pattern in [("0-0 1-x\n0-0\n", r"test\.align:1: malformed link '1-x'"),
                          ("0-0\n0-0-Q\n", r"test\.align:2: malformed link"),
                          ("0-0 2-1\n0-0\n", r"test\.align:1: link '2-1' is outside"),
                          ("0-0\n0-1-P\n", r"test\.align:2: link '0-1-P' is outside"),
                          ("0-0\n", "1 alignment lines but 2 sentence pairs")]:
        align.write_text(text)
        with pytest.raises(ValueError, match=pattern):
            load_hansards(root, unlabelled=False)
    align.write_text("1-0 0-1-P\n0-0\n")
    with pytest.raises(FileNotFoundError, match=r"trial\.e"):
        load_hansards(root, unlabelled=False)
    shutil.copytree(root / "test", root / "dev")
    for ext in ("e", "f", "align"):
        (root / "dev" / f"test.{ext}").rename(root / "dev" / f"trial.{ext}")
    corpus = load_hansards(root, unlabelled=False)
    assert corpus.gold[0].sure == frozenset({(0, 1)}) and corpus.gold[0].possible == frozenset({(0, 1), (1, 0)})
    with pytest.raises(FileNotFoundError, match="train"):
        load_hansards(root)
    (root / "test" / "test.e").write_text("<s snum=0001> a b </s>\nno tags\n")
    with pytest.raises(ValueError, match=r"test\.e:2: expected '<s snum=NNNN>"):
        read_sentences(root / "test" / "test.e")
    with pytest.raises(ValueError, match="outside"):
        read_links(align, [(1, 1), (1, 1)])


def test_dataset_registry_checks_keys_before_loading():
    with pytest.raises(ValueError, match="unknown data key"):
        load_problem({"name": "hansards", "path": "x", "n_trian": 5})
    with pytest.raises(ValueError, match="needs data.path"):
        load_problem({"name": "hansards"})
    with pytest.raises(ValueError, match="test_split"):
        load_problem({"name": "hansards", "path": "x", "test_split": "dev"})
    with pytest.raises(ValueError, match="miss_cost must be a finite number"):
        load_problem({"name": "hansards", "path": "x", "miss_cost": "3"})


# ----------------------------------------------------------------------------- features
@pytest.fixture(scope="module")
def small_corpus():
    corpus = load_hansards(shared_data(*ROOT))
    corpus.unlabelled = corpus.unlabelled[:300]
    return corpus


def _shuffled_links(pairs, seed):
    rng = random.Random(seed)
    links = [(p.sure, p.possible) for p in pairs]
    rng.shuffle(links)
    return [SentencePair(p.snum, p.english, p.french, s, q) for p, (s, q) in zip(pairs, links)]


def test_features_never_read_gold_links(small_corpus):
    gold, trial = small_corpus.gold, small_corpus.trial
    # fitted on the pairs *with* their links, then on the same pairs with the links shuffled among them
    a = AlignmentFeaturizer(ibm_iterations=2, hmm_iterations=1).fit([*small_corpus.unlabelled, *gold, *trial])
    b = AlignmentFeaturizer(ibm_iterations=2, hmm_iterations=1).fit(
        [*small_corpus.unlabelled, *_shuffled_links(gold, 0), *_shuffled_links(trial, 1)])
    assert a.names == b.names and a.n_features == len(a.names)
    for p, q in zip(gold[:30], _shuffled_links(gold, 0)[:30]):
        xa, xb = a.pair_features(p), b.pair_features(q)
        assert xa.shape == (len(p.english), len(p.french), a.n_features)
        assert torch.equal(xa, xb)
        assert bool((xa >= 0).all()) and bool((xa <= 1).all())  # every feature in [0, 1]


def test_featurizer_reports_its_stages_in_order(small_corpus):
    fz = AlignmentFeaturizer(ibm_iterations=1, hmm_iterations=1)
    seen = []
    fz.fit(small_corpus.texts(), on_stage=seen.append)
    assert seen == fz.fit_stages() == ["vocabulary", "ibm1 e->f", "ibm1 f->e", "diag e->f", "diag f->e", "hmm e->f",
                                       "hmm f->e"]
    assert AlignmentFeaturizer(diagonal_tension=0.0, hmm_iterations=0).fit_stages() == ["vocabulary", "ibm1 e->f",
                                                                                         "ibm1 f->e"]


def test_feature_values_on_a_known_pair(small_corpus):
    fz = AlignmentFeaturizer(ibm_iterations=2, diagonal_tension=0.0, hmm_iterations=0).fit(small_corpus.texts())
    p = small_corpus.gold[2]  # "oh , oh !" / "oh , oh !"
    X = fz.pair_features(p)
    col = {n: i for i, n in enumerate(fz.names)}
    assert "diag_post_fe" not in col and "hmm_post_fe" not in col
    ident = X[..., col["identical"]]
    assert torch.equal(ident, torch.tensor([[1, 0, 1, 0], [0, 1, 0, 0], [1, 0, 1, 0], [0, 0, 0, 1.]],
                                           dtype=torch.float64))
    assert float(X[1, 1, col["same_punct"]]) == 1.0 and float(X[0, 0, col["same_punct"]]) == 0.0
    assert float(X[0, 0, col["dist"]]) == 0.0 and float(X[0, 3, col["dist"]]) == pytest.approx(0.75)
    D = fz.dice(p)
    assert np.allclose(X[..., col["dice"]].numpy(), D) and np.all((D >= 0) & (D <= 1))
    s = fz.ibm_posteriors(p)
    assert np.all(s["post_fe"].sum(0) <= 1 + 1e-12)  # a distribution over English words (plus NULL) per French word
    with pytest.raises(ValueError, match="not in the fitted text"):
        fz.pair_features(SentencePair(0, ("zzzunseen",), ("oh",)))
    y = dice_competitive_linking(D)
    assert y.sum(0).max() <= 1 and y.sum(1).max() <= 1


def test_symmetrize_hand_worked():
    fwd = np.array([[1, 0, 0], [0, 1, 0], [0, 0, 0]])
    rev = np.array([[1, 0, 0], [0, 0, 1], [0, 1, 0]])
    assert symmetrize(fwd, rev, "intersection").tolist() == [[1, 0, 0], [0, 0, 0], [0, 0, 0]]
    assert symmetrize(fwd, rev, "union").tolist() == [[1, 0, 0], [0, 1, 1], [0, 1, 0]]
    # grow-diag from {(0,0)}: (1,1) neighbours it diagonally and both its words are free; then (2,1) neighbours
    # (1,1) and English word 2 is free; (1,2) neighbours (1,1) and French word 2 is free -> all added
    assert symmetrize(fwd, rev, "grow-diag").tolist() == [[1, 0, 0], [0, 1, 1], [0, 1, 0]]
    far = np.array([[1, 0, 0], [0, 0, 0], [0, 0, 1]])  # (2,2) does not touch the intersection {(0,0)}
    assert symmetrize(far, np.eye(3, dtype=int) * np.array([1, 0, 0]), "grow-diag").tolist() == [
        [1, 0, 0], [0, 0, 0], [0, 0, 0]]
    assert symmetrize(far, np.eye(3, dtype=int) * np.array([1, 0, 0]), "grow-diag-final").tolist() == far.tolist()
    X = link_indicator_features(fwd, rev)
    assert X.shape == (3, 3, 7) and X[1, 2].tolist() == [0, 1, 0, 1, 1, 0, 0]
    with pytest.raises(ValueError, match="unknown symmetrization"):
        symmetrize(fwd, rev, "grow")


def test_hmm_posteriors_equal_enumeration():
    """Forward-backward of the HMM aligner against the sum over all ``(2m)^n`` state sequences."""
    from torch_bcfw.features.translation import HMMModel, IBMModel

    rng = np.random.default_rng(0)
    n_src, n_tgt = 3, 4  # source ids 0..2, NULL = 3
    keys = torch.tensor([s * n_tgt + t for s in range(n_src + 1) for t in range(n_tgt)])
    table = torch.from_numpy(rng.uniform(0.05, 1.0, keys.numel()))
    max_jump = 2
    hmm = HMMModel(IBMModel(keys, table, n_tgt, n_src, 0.0, 0.0), rng.uniform(0.1, 1.0, 2 * max_jump + 1), max_jump,
                   0.2)
    src, tgt = np.array([0, 2, 1]), np.array([3, 0, 1])
    m, n = len(src), len(tgt)
    t = lambda s_, f_: float(table[s_ * n_tgt + f_])  # noqa: E731
    J = hmm._jump_matrix(m)  # rows: previous position -1..m-1
    post, z = np.zeros((n, 2 * m)), 0.0
    for states in itertools.product(range(2 * m), repeat=n):
        p, prev = 1.0, -1
        for k, s_ in enumerate(states):
            if s_ < m:
                p *= (1 - hmm.p0) * J[prev + 1, s_] * t(src[s_], tgt[k])
                prev = s_
            else:  # NULL state of position s_ - m: reachable only from that position (or the start, k = 0)
                if k > 0 and s_ - m != prev:
                    p = 0.0
                    break
                p *= (hmm.p0 * J[0, s_ - m] if k == 0 else hmm.p0) * t(n_src, tgt[k])
                prev = s_ - m
        z += p
        for k, s_ in enumerate(states):
            post[k, s_] += p
    post /= z
    got, null = hmm.posteriors(src, tgt)
    assert np.allclose(got, post[:, :m], atol=1e-12) and np.allclose(null, post[:, m:].sum(1), atol=1e-12)


def test_fit_on_real_pairs_reaches_a_small_certified_gap(small_corpus):
    fz = AlignmentFeaturizer(ibm_iterations=3, hmm_iterations=1).fit(small_corpus.texts())
    train = alignment_data(small_corpus.gold[:12], fz)
    model = Matching(fz.n_features)
    r = fit(model, train, 0.01, max_passes=200, gap_check=20, gap_tol=1e-3, progress=False)
    assert r.gap <= 1e-3 and r.gap <= 0.01 * r.primal
    st = alignment_scores_from_labelings(train, model.decode(r.weights, train))
    assert st.aer < 0.3  # the training pairs are fitted (AER against their gold sure / possible links)
