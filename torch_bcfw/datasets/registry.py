"""Named datasets for configs and the command line: ``name -> (model, train, test)``."""
from __future__ import annotations

__all__ = ["load_problem", "load_problem_with_validation", "DATASETS", "DATASET_KEYS"]

#: the keys each dataset's ``data:`` section accepts (besides ``name``); anything else is an error (a typo such
#: as ``spilt: small`` must not train on the default split silently)
DATASET_KEYS = {
    "ocr": {"path", "split", "fold", "cache_dir", "download", "limit", "device", "validation"},
    "conll": {"path", "min_count", "drop_bias", "limit", "test_limit", "device", "validation"},
    "horses": {"path", "size", "test_split", "loss", "contrast", "processes", "limit", "device", "validation"},
    "hansards": {"path", "n_train", "test_split", "miss_cost", "extra_cost", "normalize", "ibm_iterations",
                 "diagonal_tension", "hmm_iterations", "limit", "device", "validation"},
}


def _int(cfg: dict, key: str, default=None):
    v = cfg.get(key, default)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int):
        raise ValueError(f"data.{key} must be an integer, got {v!r}")
    return v


def _number(cfg: dict, key: str, default: float) -> float:
    v = cfg.get(key, default)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v != v or v in (float("inf"), float("-inf")):
        raise ValueError(f"data.{key} must be a finite number, got {v!r}")
    return float(v)


def _flag(cfg: dict, key: str, default: bool) -> bool:
    v = cfg.get(key, default)
    if not isinstance(v, bool):
        raise ValueError(f"data.{key} must be true or false, got {v!r}")
    return v


def _limited(train, cfg: dict):
    """The first ``data.limit`` training examples (all without a ``limit``)."""
    limit = _int(cfg, "limit")
    return train if limit is None else train[list(range(min(limit, len(train))))]


def _check_keys(cfg: dict) -> None:
    name = cfg.get("name")
    if name not in DATASETS:
        raise ValueError(f"unknown dataset {name!r}; available: {sorted(DATASETS)}")
    unknown = sorted(set(cfg) - DATASET_KEYS[name] - {"name"})
    if unknown:
        raise ValueError(f"unknown data key(s) {unknown} for the {name} dataset; expected some of "
                         f"{sorted(DATASET_KEYS[name])}")


def _ocr(cfg: dict, val_fold: int | None = None):
    """``(model, train, test)``, or with ``val_fold`` ``(model, train, validation, test)``
    (:func:`~torch_bcfw.datasets.ocr.ocr_split_with_validation`)."""
    from ..models import Chain
    from .ocr import N_LETTERS, load_ocr, ocr_split, ocr_split_with_validation

    split, fold = cfg.get("split", "large"), _int(cfg, "fold", 0)
    words = load_ocr(cfg.get("path"), cache_dir=cfg.get("cache_dir"), download=_flag(cfg, "download", False))
    if val_fold is None:
        parts = ocr_split(words, split, fold)
    else:
        parts = ocr_split_with_validation(words, split, fold, val_fold)
    return Chain(parts[0].x.shape[1], N_LETTERS), _limited(parts[0], cfg), *parts[1:]


def _conll(cfg: dict, progress: bool = False):
    """CoNLL-2000 chunking: sparse template attributes (``min_count``, default 3: d = 1,643,026).

    Options: ``path`` (required: the zip or a folder with it / the .txt files),
    ``min_count``, ``drop_bias`` (default true), ``limit`` / ``test_limit`` (first sentences only).
    """
    from .conll_chain import load_conll_problem

    if not cfg.get("path"):
        raise ValueError("the conll dataset needs data.path: conll2000.zip or a folder with it or train.txt/test.txt")
    prob = load_conll_problem(
        cfg["path"], min_count=_int(cfg, "min_count", 3), drop_bias=_flag(cfg, "drop_bias", True),
        limit=_int(cfg, "limit"), test_limit=_int(cfg, "test_limit"), progress=progress,
    )
    return prob.model, prob.train, prob.test


def _horses(cfg: dict):
    """Weizmann horses as pixel-grid graphs with hand-made pixel features (:func:`~torch_bcfw.datasets.horses.horse_graph_data`).

    Options: ``path`` (required: the folder with ``rgb/``, ``gray/``, ``figure_ground/``), ``size`` (``[H, W]``,
    default ``[48, 64]``), ``test_split`` (``test``, default, or ``val``), ``loss`` (``balanced``, default, or
    ``hamming``), ``contrast`` (default true), ``processes`` (worker processes of the batched cuts), ``limit``.
    """
    from ..models import GraphCut
    from .horses import horse_graph_data

    if not cfg.get("path"):
        raise ValueError("the horses dataset needs data.path: the folder with rgb/, gray/ and figure_ground/")
    size = cfg.get("size", (48, 64))
    if not isinstance(size, (list, tuple)) or len(size) != 2 or not all(
            isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in size):
        raise ValueError(f"data.size must be [height, width] (positive integers), got {size!r}")
    size = tuple(size)
    contrast = _flag(cfg, "contrast", True)
    train = horse_graph_data(cfg["path"], "train", size, contrast)
    test = horse_graph_data(cfg["path"], cfg.get("test_split", "test"), size, contrast)
    train = _limited(train, cfg)
    model = GraphCut(train.n_inputs, train.n_edge_inputs, loss=cfg.get("loss", "balanced"),
                     processes=_int(cfg, "processes"))
    return model, train, test


def _hansards(cfg: dict, progress: bool = False):
    """Hansards English-French word alignment as bipartite matching, with text-only link features
    (:func:`~torch_bcfw.datasets.hansards.load_hansards_problem`): train on gold pairs ``1..n_train`` (default 100).

    Options: ``path`` (required: the folder with ``test/``, ``dev/`` and ``train/``), ``n_train``, ``test_split``
    (``test``, default: gold pairs ``n_train+1..447``; or ``trial``: the 37 trial pairs), ``miss_cost`` (3),
    ``extra_cost`` (1), ``normalize`` (``words``, default, or ``none``), ``ibm_iterations`` (5),
    ``diagonal_tension`` (4; 0 drops the diagonal IBM features), ``hmm_iterations`` (5; 0 drops the HMM
    features), ``limit`` (first training pairs only).
    """
    from .hansards import load_hansards_problem

    if not cfg.get("path"):
        raise ValueError("the hansards dataset needs data.path: the folder with test/, dev/ and train/ "
                         "(the HLT-NAACL 2003 English-French Hansards alignment data)")
    split = cfg.get("test_split", "test")
    if split not in ("test", "trial"):
        raise ValueError(f"data.test_split must be test or trial, got {split!r}")
    normalize = cfg.get("normalize", "words")
    if normalize not in ("words", "none"):
        raise ValueError(f"data.normalize must be words or none, got {normalize!r}")
    prob = load_hansards_problem(cfg["path"], n_train=_int(cfg, "n_train", 100),
                                 miss_cost=_number(cfg, "miss_cost", 3.0), extra_cost=_number(cfg, "extra_cost", 1.0),
                                 normalize=normalize, ibm_iterations=_int(cfg, "ibm_iterations", 5),
                                 diagonal_tension=_number(cfg, "diagonal_tension", 4.0),
                                 hmm_iterations=_int(cfg, "hmm_iterations", 5), progress=progress)
    return prob.model, _limited(prob.train, cfg), prob.test if split == "test" else prob.trial


DATASETS = {"ocr": _ocr, "conll": _conll, "horses": _horses, "hansards": _hansards}
#: the datasets whose loading builds features for long enough to show a "preparing features" bar
SHOWS_PROGRESS = {"conll", "hansards"}


def load_problem_with_validation(cfg: dict):
    """``(model, train, validation, test)`` for a ``data:`` section with a ``validation:`` entry:

    * ``validation: {fold: k}`` (OCR): the words of fold ``k`` (see :func:`~torch_bcfw.datasets.ocr.ocr_split_with_validation`);
    * ``validation: {fraction: f, seed: s}`` (any dataset): a random fraction ``f`` of the training examples
      (default seed 0) is held out.

    Without a ``validation`` entry the validation set is ``None``.
    """
    cfg = dict(cfg)
    _check_keys(cfg)
    device = _device(cfg)  # before the data is read
    spec = cfg.pop("validation", None)
    if spec is None:
        model, train, test = load_problem(cfg)
        return model, train, None, test
    if not isinstance(spec, dict):
        raise ValueError(f"data.validation must be a mapping such as {{fold: 1}} or {{fraction: 0.2}}, got {spec!r}")
    unknown = sorted(set(spec) - {"fold", "fraction", "seed"})
    if unknown:
        raise ValueError(f"unknown data.validation key(s) {unknown}; use fold (OCR) or fraction and seed")
    if "fold" in spec:
        if cfg.get("name") != "ocr":
            raise ValueError("data.validation.fold is only defined for the ocr dataset; use fraction for others")
        model, train, val, test = _ocr(cfg, _int(spec, "fold"))
    else:
        import torch

        frac = float(spec.get("fraction", 0.2))
        if not 0 < frac < 1:
            raise ValueError(f"data.validation.fraction must lie in (0, 1), got {frac}")
        model, full, test = load_problem(cfg)
        n = len(full)
        perm = torch.randperm(n, generator=torch.Generator().manual_seed(int(spec.get("seed", 0))))
        k = int(round(frac * n))
        if k < 1 or k >= n:
            raise ValueError(f"validation fraction {frac} of n = {n} leaves an empty part")
        val, train = full[perm[:k].sort().values], full[perm[k:].sort().values]
        return model, train, val, test
    if device is not None:
        train, val, test = train.to(device), val.to(device), test.to(device)
    return model, train, val, test


def _device(cfg: dict) -> torch.device | None:
    """``data.device`` as a device this machine has (``None``: where the loader puts the data, the CPU)."""
    import torch

    name = cfg.get("device")
    if name is None:
        return None
    try:
        dev = torch.device(name) if isinstance(name, str) else None
    except RuntimeError:
        dev = None
    if dev is None or dev.type not in ("cpu", "cuda"):
        raise ValueError(f"data.device must be 'cpu', 'cuda' or 'cuda:N', got {name!r}")
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"data.device {name!r}: CUDA is not available (this torch build or machine has no GPU); "
                         "use data.device=cpu")
    if dev.type == "cuda" and dev.index is not None and dev.index >= torch.cuda.device_count():
        raise ValueError(f"data.device {name!r}: this machine has {torch.cuda.device_count()} CUDA device(s)")
    return dev


def load_problem(cfg: dict, progress: bool = False):
    """``(model, train, test)`` for a ``data:`` config section (``name`` plus the loader's arguments).
    ``progress``: a "preparing features" bar on stderr for the datasets of :data:`SHOWS_PROGRESS` when their feature
    building takes over 2 s."""
    cfg = dict(cfg)
    _check_keys(cfg)
    if "validation" in cfg:
        raise ValueError("data.validation is used by `torch-bcfw path` only; remove it here")
    name = cfg.pop("name")
    device = _device(cfg)  # before the data is read
    model, train, test = DATASETS[name](cfg, progress) if name in SHOWS_PROGRESS else DATASETS[name](cfg)
    if device is not None:
        train, test = train.to(device), test.to(device)
    return model, train, test
