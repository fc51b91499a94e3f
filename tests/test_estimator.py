"""torch_bcfw.SSVM: the scikit-learn style estimator (clone, get/set_params, fit/predict/score, GridSearchCV)."""
import numpy as np
import pytest
import torch

from conftest import random_chain_problem, random_multiclass_problem, shared_data
from torch_bcfw import SSVM, Chain, FitResult, GraphCut, Multiclass, fit
from torch_bcfw.estimator import NotFittedError
from torch_bcfw.solvers.run import option_defaults

OPTS = dict(max_passes=6, gap_check=3, seed=3)


def chain_lists(n=12, seed=0, F=4, K=3):
    """A random chain problem as lists (one [L_i, F] array and one [L_i] label array per sequence)."""
    model, data = random_chain_problem(n=n, F=F, K=K, max_len=5, seed=seed)
    off = data.offsets.tolist()
    xs = [data.x[off[i]:off[i + 1]].numpy() for i in range(n)]
    ys = [data.y[off[i]:off[i + 1]].numpy() for i in range(n)]
    return model, data, xs, ys


# ----------------------------------------------------------------------------- parameters
def test_get_params_lists_model_lam_solver_and_every_solver_option():
    model = Chain(4, 3)
    est = SSVM(model, lam=0.5, solver="fw", max_passes=7, gap_tol=1e-3)
    params = est.get_params()
    assert set(params) == {"model", "lam", "solver", "warm_start", *option_defaults()}
    assert params["model"] is model and params["lam"] == 0.5 and params["solver"] == "fw"
    assert params["max_passes"] == 7 and params["gap_tol"] == 1e-3 and params["seed"] == 1  # default
    assert est.get_params(deep=False) == params
    assert "max_passes=7" in repr(est) and "Chain(n_features=4, n_labels=3)" in repr(est)


def test_set_params_round_trip_and_unknown_names_raise():
    est = SSVM(Chain(4, 3))
    assert est.set_params(lam=0.25, max_passes=3, preset="gap-fw") is est
    p = est.get_params()
    assert (p["lam"], p["max_passes"], p["preset"]) == (0.25, 3, "gap-fw")
    again = SSVM(**p)
    assert again.get_params() == p
    with pytest.raises(ValueError, match="Invalid parameter 'max_pases'"):
        est.set_params(max_pases=3)
    with pytest.raises(TypeError, match="unknown solver option"):
        SSVM(Chain(4, 3), max_pases=3)


def test_clone():
    sklearn_base = pytest.importorskip("sklearn.base")
    est = SSVM(Chain(4, 3), lam=0.3, **OPTS)
    twin = sklearn_base.clone(est)
    assert type(twin) is SSVM and twin is not est
    assert twin.model is not est.model and twin.model.config() == est.model.config()
    p, q = est.get_params(), twin.get_params()
    p.pop("model"), q.pop("model")
    assert p == q
    model, data, xs, ys = chain_lists()
    est.fit(xs, ys)
    fresh = sklearn_base.clone(est)
    assert not hasattr(fresh, "result_")  # a clone is unfitted
    assert np.array_equal(fresh.fit(xs, ys).coef_, est.coef_)


def _sklearn_checks():
    """scikit-learn's estimator checks (>= 1.6: tags and ``expected_failed_checks``) or ``None``."""
    try:
        import sklearn
        from sklearn.utils import estimator_checks
    except ImportError:
        return None
    major, minor = (int(v) for v in sklearn.__version__.split(".")[:2])
    return estimator_checks if (major, minor) >= (1, 6) else None


#: the scikit-learn checks ``SSVM(Multiclass())`` fails on purpose, with the reason
EXPECTED_FAILED_CHECKS = {
    "check_supervised_y_2d": "a column vector y [n, 1] is refused with a one-line error rather than ravelled with a "
                             "warning: the library never coerces input silently",
}

_checks = _sklearn_checks()
if _checks is not None:
    @_checks.parametrize_with_checks([SSVM(Multiclass(), max_passes=20)],
                                     expected_failed_checks=lambda est: EXPECTED_FAILED_CHECKS)
    def test_sklearn_estimator_checks(estimator, check):
        """Every scikit-learn common check on a Multiclass SSVM whose sizes and classes are learned at fit."""
        check(estimator)


def test_check_estimator_runs_its_checks_and_fails_only_the_documented_ones():
    ec = _sklearn_checks()
    if ec is None:
        pytest.skip("scikit-learn >= 1.6 is not installed")
    results = ec.check_estimator(SSVM(Multiclass(), max_passes=20), on_fail=None)
    ran = [r for r in results if r["status"] != "skipped"]
    failed = {r["check_name"] for r in results if r["status"] == "failed"}
    assert len(ran) >= 30 and failed <= set(EXPECTED_FAILED_CHECKS) and len(failed) <= 3
    # the estimator is a classifier of 2-D arrays for scikit-learn
    from sklearn.base import is_classifier
    from sklearn.utils import get_tags

    assert is_classifier(SSVM(Multiclass())) and get_tags(SSVM(Multiclass())).input_tags.two_d_array
    assert not get_tags(SSVM(Chain(4, 3))).input_tags.two_d_array


def test_sizes_and_classes_are_learned_at_fit():
    """``Multiclass()`` without sizes: F from X, the classes from the distinct labels (sklearn's convention); the
    estimator's ``model`` parameter is left as given, the fitted model is ``model_``."""
    model, data = random_multiclass_problem(n=30, F=4, K=3, seed=7)
    names = np.array(["b", "a", "c"])  # sorted: a, b, c
    est = SSVM(Multiclass(), lam=0.05, **OPTS).fit(data.x.numpy(), names[data.y.numpy()])
    assert est.model.n_inputs is None and est.model.n_labels is None  # the parameter is not changed by fit
    assert est.model_.config() == {"n_features": 4, "n_labels": 3, "bias": True}
    assert est.n_features_in_ == 4 and list(est.classes_) == ["a", "b", "c"]
    codes = np.searchsorted(est.classes_, names[data.y.numpy()])
    ref = fit(Multiclass(4, 3), type(data)(data.x, torch.as_tensor(codes)), 0.05, **OPTS)
    assert torch.equal(est.result_.weights, ref.weights)
    assert list(est.predict(data.x.numpy())) == list(est.classes_[ref.predict(data).numpy()])
    # integer labels that are not 0..K-1 are class values too
    odd = SSVM(Multiclass(), lam=0.05, **OPTS).fit(data.x.numpy(), data.y.numpy() * 10 + 5)
    assert list(odd.classes_) == [5, 15, 25] and set(odd.predict(data.x.numpy())) <= {5, 15, 25}
    with pytest.raises(ValueError, match="X has 3 features, but SSVM is expecting 4 features as input"):
        est.predict(np.ones((2, 3)))
    with pytest.raises(ValueError, match="needs at least 2 classes"):
        SSVM(Multiclass(), **OPTS).fit(data.x.numpy(), np.zeros(30, dtype=int))
    with pytest.raises(ValueError, match="Unknown label type: continuous"):
        SSVM(Multiclass(), **OPTS).fit(data.x.numpy(), np.linspace(0, 1, 30))
    with pytest.raises(ValueError, match="has no sizes yet"):
        fit(Multiclass(), data, 0.1)
    with pytest.raises(ValueError, match="X has 4 features, but SSVM is expecting 5 features"):
        SSVM(Multiclass(5), **OPTS).fit(data.x.numpy(), data.y.numpy())


def test_fitted_estimator_pickles():
    import pickle

    model, data, xs, ys = chain_lists()
    est = SSVM(model, lam=0.1, **OPTS).fit(xs, ys)
    back = pickle.loads(pickle.dumps(est))
    assert np.array_equal(back.coef_, est.coef_) and back.get_params()["lam"] == 0.1
    assert all(np.array_equal(a, b) for a, b in zip(back.predict(xs), est.predict(xs)))


def test_pickles_hold_the_weights_unless_warm_start_keeps_the_dual_state():
    """scikit-learn's digits (1797 x 64, 10 classes): the default pickle holds the weights and history (kilobytes),
    not the 16 n d bytes of the dual state; ``warm_start=True`` keeps it, and a fit continued from an unpickled
    estimator equals one uninterrupted fit bit for bit."""
    import pickle

    datasets = pytest.importorskip("sklearn.datasets")
    X, y = datasets.load_digits(return_X_y=True)
    est = SSVM(Multiclass(), lam=0.01, max_passes=2, gap_check=1, seed=0).fit(X, y)
    size = len(pickle.dumps(est))
    assert size <= 200_000, size
    back = pickle.loads(pickle.dumps(est))
    assert np.array_equal(back.predict(X), est.predict(X)) and not back.result_.has_state
    assert est.result_.has_state  # the fitted estimator itself keeps it until pickled
    warm = SSVM(Multiclass(), lam=0.01, max_passes=2, gap_check=1, seed=0, warm_start=True).fit(X, y)
    kept = pickle.dumps(warm)
    assert len(kept) > 10 * size
    again = pickle.loads(kept).fit(X, y)  # two more passes from the kept dual state
    whole = SSVM(Multiclass(), lam=0.01, max_passes=4, gap_check=1, seed=0).fit(X, y)
    assert again.n_iter_ == 4 and np.array_equal(again.coef_, whole.coef_) and again.gap_ == whole.gap_


def test_dataframes_read_as_their_values_and_sparse_input_is_refused_or_read():
    model, data = random_multiclass_problem(n=24, F=3, K=3, seed=4)
    X, y = data.x.numpy(), data.y.numpy()
    ref = SSVM(Multiclass(), lam=0.1, **OPTS).fit(X, y)
    sparse = pytest.importorskip("scipy.sparse")
    for Xs in (sparse.csr_matrix(X), sparse.csr_array(X)):
        for est in (SSVM(Multiclass(), **OPTS), SSVM(Multiclass(3, 3), **OPTS)):
            with pytest.raises(TypeError, match="sparse input is not supported") as info:
                est.fit(Xs, y)
            assert "\n" not in str(info.value)
        with pytest.raises(TypeError, match="sparse input is not supported"):
            ref.predict(Xs)
    # a Chain takes sparse token features: the same fit as on the dense arrays
    chain, _, xs, ys = chain_lists(n=10, seed=3)
    dense = SSVM(chain, lam=0.1, **OPTS).fit(xs, ys)
    sp = SSVM(chain, lam=0.1, **OPTS).fit([sparse.csr_matrix(x) for x in xs], ys)
    assert np.allclose(sp.coef_, dense.coef_, atol=1e-12) and sp.result_.gap == pytest.approx(dense.gap_)
    assert all(np.array_equal(a, b) for a, b in zip(sp.predict([sparse.csr_array(x) for x in xs]), dense.predict(xs)))
    with pytest.raises(ValueError, match="mixes 1 sparse and 9 dense"):
        SSVM(chain, **OPTS).fit([sparse.csr_matrix(xs[0])] + xs[1:], ys)
    pd = pytest.importorskip("pandas")
    frame = pd.DataFrame(X, columns=["a", "b", "c"])
    est = SSVM(Multiclass(), lam=0.1, **OPTS).fit(frame, pd.Series(y))
    assert np.array_equal(est.coef_, ref.coef_) and np.array_equal(est.predict(frame), ref.predict(X))
    assert est.score(frame, pd.Series(y)) == ref.score(X, y)


# ----------------------------------------------------------------------------- fit / predict / score
def test_fit_returns_self_and_sets_the_fitted_attributes():
    model, data, xs, ys = chain_lists()
    est = SSVM(model, lam=0.1, **OPTS)
    assert est.fit(xs, ys) is est
    assert isinstance(est.result_, FitResult)
    assert np.array_equal(est.coef_, est.result_.weights.numpy())  # a chain's weights in its own layout
    assert est.gap_ == est.result_.gap and est.gap_ >= 0
    assert est.primal_ == est.result_.primal and est.primal_ > 0
    assert est.n_iter_ == est.result_.passes == 6
    assert est.stopped_by_ == "max_passes" and est.n_features_in_ == 4


def test_predict_and_score_before_fit_raise_not_fitted():
    model, data, xs, ys = chain_lists()
    est = SSVM(model)
    for call in (lambda: est.predict(xs), lambda: est.score(xs, ys)):
        with pytest.raises(NotFittedError, match="not fitted yet"):
            call()
        with pytest.raises(ValueError):
            call()
        with pytest.raises(AttributeError):
            call()
    exceptions = pytest.importorskip("sklearn.exceptions")
    with pytest.raises(exceptions.NotFittedError):
        est.predict(xs)
    validation = pytest.importorskip("sklearn.utils.validation")
    with pytest.raises(exceptions.NotFittedError):
        validation.check_is_fitted(est)
    validation.check_is_fitted(est.fit(xs, ys))


def test_predictions_equal_those_of_fit_on_the_same_data():
    model, data, xs, ys = chain_lists(n=10, seed=4)
    est = SSVM(model, lam=0.05, **OPTS).fit(xs, ys)
    res = fit(model, data, 0.05, **OPTS)
    assert np.array_equal(est.coef_, res.weights.numpy()) and est.gap_ == res.gap
    pred = est.predict(xs)
    assert isinstance(pred, list) and len(pred) == len(xs)
    assert all(isinstance(p, np.ndarray) and p.dtype == np.int64 and p.shape == y.shape for p, y in zip(pred, ys))
    assert np.array_equal(np.concatenate(pred), res.predict(data).numpy())
    assert est.score(xs, ys) == pytest.approx(1 - res.evaluate(data))
    # tensors in, the same answers
    est_t = SSVM(model, lam=0.05, **OPTS).fit([torch.as_tensor(x) for x in xs], [torch.as_tensor(y) for y in ys])
    assert np.array_equal(est_t.coef_, res.weights.numpy())
    # the data container in (Y=None), the model's decoding out
    est_d = SSVM(model, lam=0.05, **OPTS).fit(data)
    assert np.array_equal(est_d.coef_, res.weights.numpy())
    assert torch.equal(est_d.predict(data), res.predict(data))
    assert est_d.score(data) == pytest.approx(est.score(xs, ys))


def test_multiclass_arrays_and_lists_of_vectors():
    model, data = random_multiclass_problem(n=20, F=3, K=4, seed=2)
    X, Y = data.x.numpy(), data.y.tolist()
    res = fit(model, data, 0.1, **OPTS)
    est = SSVM(model, lam=0.1, **OPTS).fit(X, Y)
    assert torch.equal(est.result_.weights, res.weights)
    pred = est.predict(X)
    assert isinstance(pred, np.ndarray) and pred.shape == (20,) and np.array_equal(pred, res.predict(data).numpy())
    assert est.score(X, Y) == pytest.approx(float((pred == np.array(Y)).mean()))
    vectors = [row for row in X]
    assert np.array_equal(SSVM(model, lam=0.1, **OPTS).fit(vectors, np.array(Y)).predict(vectors), pred)


def test_refit_after_set_params_uses_the_new_parameters():
    model, data, xs, ys = chain_lists()
    est = SSVM(model, lam=1.0, **OPTS).fit(xs, ys)
    w1 = est.coef_
    est.set_params(lam=0.01).fit(xs, ys)
    assert est.result_.lam == 0.01 and not np.array_equal(est.coef_, w1)


def test_grid_search_over_lam():
    model_selection = pytest.importorskip("sklearn.model_selection")
    model, data, xs, ys = chain_lists(n=18, seed=1)
    grid = model_selection.GridSearchCV(SSVM(model, **OPTS), {"lam": [1.0, 0.1, 0.01]}, cv=3)
    grid.fit(xs, ys)
    scores = grid.cv_results_["mean_test_score"]
    assert len(scores) == 3 and all(0 <= s <= 1 for s in scores)
    assert grid.best_params_["lam"] == [1.0, 0.1, 0.01][int(np.argmax(scores))]
    assert isinstance(grid.best_estimator_, SSVM) and grid.best_estimator_.result_.lam == grid.best_params_["lam"]
    assert len(grid.predict(xs)) == len(xs)
    cv = model_selection.cross_val_score(SSVM(model, lam=0.1, **OPTS), xs, ys, cv=3)
    assert cv.shape == (3,)


# ----------------------------------------------------------------------------- bad inputs
def test_bad_inputs_raise_clear_errors():
    model, data, xs, ys = chain_lists()
    est = SSVM(model, lam=0.1, **OPTS)
    with pytest.raises(ValueError, match="X has 12 examples but Y has 11"):
        est.fit(xs, ys[:-1])
    with pytest.raises(ValueError, match="X is empty"):
        est.fit([], [])
    with pytest.raises(ValueError, match=r"X\[2\] has shape \(\d+,\); a Chain model needs \[L_i, F\]"):
        est.fit(xs[:2] + [xs[2][0]] + xs[3:], ys)
    with pytest.raises(ValueError, match="one 2-D array"):
        est.fit(xs[0], ys[0])
    with pytest.raises(ValueError, match=r"X\[0\] has 5 features per token but the model expects F = 4"):
        est.fit([np.ones((len(y), 5)) for y in ys], ys)
    bad = [y.copy() for y in ys]
    bad[3] = np.append(bad[3], 0)
    with pytest.raises(ValueError, match=r"example 3: X\[3\] has \d+ tokens but Y\[3\] has \d+ labels"):
        est.fit(xs, bad)
    with pytest.raises(ValueError, match="labels must be integers"):
        est.fit(xs, [y.astype(float) for y in ys])
    with pytest.raises(ValueError, match=r"labels must lie in \[0, 2\]"):
        est.fit(xs, [y + 5 for y in ys])
    with pytest.raises(ValueError, match="holds the labels: pass Y=None"):
        est.fit(data, ys)
    with pytest.raises(ValueError, match="max_passes"):
        SSVM(model, max_passes=-1).fit(xs, ys)
    with pytest.raises(TypeError, match="StructuredModel"):
        SSVM("chain").fit(xs, ys)
    with pytest.raises(TypeError, match="takes its data container as X"):
        SSVM(GraphCut(3, 1)).fit(xs, ys)
    mc = SSVM(Multiclass(3, 2), **OPTS)
    with pytest.raises(ValueError, match="a Multiclass model needs"):
        mc.fit(np.ones((4, 2, 3)), [0, 1, 0, 1])
    with pytest.raises(ValueError, match=r"X\[1\] has 2 features but the model expects F = 3"):
        mc.fit([np.ones(3), np.ones(2)], [0, 1])
    with pytest.raises(ValueError, match="X has 2 examples but Y has 3"):
        mc.fit(np.ones((2, 3)), [0, 1, 1])
    with pytest.raises(ValueError, match="1-D sequence"):
        mc.fit(np.ones((2, 3)), [[0], [1]])
    est.fit(xs, ys)
    with pytest.raises(ValueError, match="model expects F = 4"):
        est.predict([np.ones((3, 2))])


# ----------------------------------------------------------------------------- real data
def test_ocr_small_with_the_estimator():
    """OCR-small (train on fold 0, n = 626 words; test on the other folds): a few BCFW passes."""
    from torch_bcfw.datasets.ocr import N_LETTERS, load_ocr

    words = load_ocr(shared_data("ocr"))
    train, test = np.nonzero(words.folds == 0)[0], np.nonzero(words.folds != 0)[0]
    X, Y = [words.images[i] for i in train], [words.labels[i] for i in train]
    X_test, Y_test = [words.images[i] for i in test], [words.labels[i] for i in test]
    est = SSVM(Chain(128, N_LETTERS), lam=0.01, max_passes=5, gap_check=5).fit(X, Y)
    assert len(X) == 626 and est.n_iter_ == 5 and 0 < est.gap_ < 1
    pred = est.predict(X_test[:50])
    assert [p.shape for p in pred] == [y.shape for y in Y_test[:50]]
    acc = est.score(X_test, Y_test)
    assert 0.7 < acc < est.score(X, Y) <= 1  # per-letter accuracy ~0.79 after 5 passes


def test_the_ocr_estimator_example_runs():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "examples" / "ocr_estimator.py"
    spec = importlib.util.spec_from_file_location("ocr_estimator_example", path)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    report = example.main(["--data", str(shared_data("ocr")), "--passes", "3"])
    assert report["passes"] == 3 and 0.7 < report["test_accuracy"] < report["train_accuracy"] <= 1


def test_any_hashable_labels_classes_and_decision_function():
    """String labels: ``classes_`` are the sorted distinct labels, predictions and scores use them, the fit equals the
    one on their integer codes; integer labels keep ``classes_ = 0..K-1``; ``decision_function`` gives the Multiclass
    class scores (argmax = predict) and does not exist for a Chain."""
    model, data = random_multiclass_problem(n=40, F=4, K=3, seed=5)
    names = np.array(["cat", "dog", "emu"])
    y = data.y.numpy()
    est = SSVM(model, lam=0.05, max_passes=5).fit(data.x.numpy(), names[y].tolist())
    ints = SSVM(model, lam=0.05, max_passes=5).fit(data.x.numpy(), y)
    assert list(est.classes_) == ["cat", "dog", "emu"] and list(ints.classes_) == [0, 1, 2]
    assert np.array_equal(est.coef_, ints.coef_)
    assert list(est.predict(data.x.numpy())) == list(names[ints.predict(data.x.numpy())])
    assert est.score(data.x.numpy(), names[y].tolist()) == ints.score(data.x.numpy(), y)
    scores = est.decision_function(data.x.numpy())
    assert scores.shape == (40, 3) and (scores.argmax(1) == ints.predict(data.x.numpy())).all()
    with pytest.raises(ValueError, match="label 'yak' is not one of the fitted classes_"):
        est.score(data.x.numpy()[:2], ["cat", "yak"])
    with pytest.raises(ValueError, match="2 distinct labels"):
        SSVM(model, max_passes=1).fit(data.x.numpy()[:4], ["a", "b", "a", "b"])
    with pytest.raises(ValueError, match="not floats"):
        SSVM(model, max_passes=1).fit(data.x.numpy()[:3], [0.0, 1.0, 2.0])
    chain, _, xs, ys = chain_lists(n=12, seed=2)
    tags = np.array(["B", "I", "O"])
    seq = SSVM(chain, **OPTS).fit(xs, [tags[y] for y in ys])
    plain = SSVM(chain, **OPTS).fit(xs, ys)
    assert list(seq.classes_) == ["B", "I", "O"] and np.array_equal(seq.coef_, plain.coef_)
    assert all(list(a) == list(tags[b]) for a, b in zip(seq.predict(xs), plain.predict(xs)))
    assert not hasattr(seq, "decision_function") and hasattr(est, "decision_function")


# ----------------------------------------------------------------------------- the doors a newcomer meets
def test_coef_and_intercept_have_scikit_learns_shapes():
    """A Multiclass model's ``coef_`` is ``[K, F]`` with ``intercept_`` ``[K]`` (scikit-learn's linear models), and
    the decision function is ``X @ coef_.T + intercept_``; two classes give ``[1, F]``, the margin of class 1."""
    model, data = random_multiclass_problem(n=30, F=4, K=3, seed=3)
    X, Y = data.x.numpy(), data.y.numpy()
    est = SSVM(Multiclass(), lam=0.1, **OPTS).fit(X, Y)
    assert isinstance(est.coef_, np.ndarray) and est.coef_.shape == (3, 4) and est.intercept_.shape == (3,)
    assert np.allclose(est.decision_function(X), X @ est.coef_.T + est.intercept_)
    two = SSVM(Multiclass(), lam=0.1, **OPTS).fit(X, Y % 2)
    assert two.coef_.shape == (1, 4) and two.intercept_.shape == (1,)
    assert np.allclose(two.decision_function(X), (X @ two.coef_.T + two.intercept_)[:, 0])
    plain = SSVM(Multiclass(bias=False), lam=0.1, **OPTS).fit(X, Y)
    assert plain.coef_.shape == (3, 4) and not hasattr(plain, "intercept_")
    chain, _, xs, ys = chain_lists()
    flat = SSVM(chain, lam=0.1, **OPTS).fit(xs, ys)
    assert isinstance(flat.coef_, np.ndarray) and flat.coef_.shape == (chain.n_features,)


def test_feature_names_are_recorded_and_other_columns_refused():
    pd = pytest.importorskip("pandas")
    model, data = random_multiclass_problem(n=20, F=3, K=3, seed=4)
    frame = pd.DataFrame(data.x.numpy(), columns=["a", "b", "c"])
    est = SSVM(Multiclass(), lam=0.1, **OPTS).fit(frame, data.y.numpy())
    assert list(est.feature_names_in_) == ["a", "b", "c"] and est.feature_names_in_.dtype == object
    assert np.array_equal(est.predict(frame), est.predict(data.x.numpy()))
    with pytest.raises(ValueError, match=r"X has the columns \['c', 'b', 'a'\], the fit saw \['a', 'b', 'c'\]"):
        est.predict(frame[["c", "b", "a"]])
    with pytest.raises(ValueError, match=r"should match those that were passed during fit: X has the columns \['a', 'b', 'z'\]"):
        est.score(frame.rename(columns={"c": "z"}), data.y.numpy())
    with pytest.raises(ValueError, match="the fit saw"):
        est.decision_function(frame[["a", "b"]])
    assert not hasattr(SSVM(Multiclass(), lam=0.1, **OPTS).fit(data.x.numpy(), data.y.numpy()), "feature_names_in_")


def test_every_option_of_every_solver_round_trips():
    """``SSVM`` takes every solver's options by their flat names, through get_params / set_params / clone / pickle,
    and passes them to its solver."""
    import pickle

    sklearn_base = pytest.importorskip("sklearn.base")
    names = option_defaults()
    assert {"mp_max_planes", "cache_size", "preset", "cp_inner_tol", "max_passes"} <= set(names)
    est = SSVM(Chain(4, 3), solver="mp-bcfw", mp_max_planes=5)
    assert est.get_params()["mp_max_planes"] == 5 and "mp_max_planes=5" in repr(est)
    for copy in (sklearn_base.clone(est), pickle.loads(pickle.dumps(est)), SSVM(**est.get_params())):
        assert copy.get_params()["mp_max_planes"] == 5 and copy.get_params().keys() == est.get_params().keys()
    assert est.set_params(mp_max_planes=0, max_passes=4).get_params()["mp_max_planes"] == 0
    _, _, xs, ys = chain_lists()
    fitted = est.set_params(gap_check=2).fit(xs, ys)
    assert fitted.result_.options.own.max_planes == 0 and fitted.result_.solver == "mp-bcfw"
    with pytest.raises(TypeError, match="belong to solver 'mp-bcfw'"):  # another solver's option, at fit
        SSVM(Chain(4, 3), mp_max_planes=5, **OPTS).fit(xs, ys)
    with pytest.raises(TypeError, match="did you mean 'mp_max_planes'"):
        SSVM(Chain(4, 3), solver="mp-bcfw", mp_max_plane=5)
    with pytest.raises(TypeError, match=r"data\.to\('cuda'\)"):
        SSVM(Chain(4, 3), device="cuda")
