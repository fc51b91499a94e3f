"""Named datasets for configs and the command line: ``name -> (model, train, test)``."""
from __future__ import annotations

__all__ = ["load_problem", "load_problem_with_validation", "DATASETS"]


def _ocr(cfg: dict):
    from ..models import Chain
    from .ocr import N_LETTERS, load_ocr_split

    train, test = load_ocr_split(cfg.get("path"), split=cfg.get("split", "large"), fold=int(cfg.get("fold", 0)),
                                 cache_dir=cfg.get("cache_dir"), download=bool(cfg.get("download", False)))
    limit = cfg.get("limit")
    if limit is not None:
        train = train[list(range(min(int(limit), len(train))))]
    return Chain(train.x.shape[1], N_LETTERS), train, test


def _conll(cfg: dict):
    """CoNLL-2000 chunking: sparse template attributes (``min_count``, default 3: d = 1,643,026).

    Options: ``path`` (required: the zip or a folder with it / the .txt files),
    ``min_count``, ``drop_bias`` (default true), ``limit`` / ``test_limit`` (first sentences only).
    """
    from .conll_chain import load_conll_problem

    if not cfg.get("path"):
        raise ValueError("the conll dataset needs data.path: conll2000.zip or a folder with it or train.txt/test.txt")
    prob = load_conll_problem(
        cfg["path"], min_count=int(cfg.get("min_count", 3)),
        drop_bias=bool(cfg.get("drop_bias", True)),
        limit=None if cfg.get("limit") is None else int(cfg["limit"]),
        test_limit=None if cfg.get("test_limit") is None else int(cfg["test_limit"]),
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
    size = tuple(int(s) for s in cfg.get("size", (48, 64)))
    contrast = bool(cfg.get("contrast", True))
    train = horse_graph_data(cfg["path"], "train", size, contrast)
    test = horse_graph_data(cfg["path"], cfg.get("test_split", "test"), size, contrast)
    if cfg.get("limit") is not None:
        train = train[list(range(min(int(cfg["limit"]), len(train))))]
    procs = cfg.get("processes")
    model = GraphCut(train.n_inputs, train.n_edge_inputs, loss=cfg.get("loss", "balanced"),
                     processes=None if procs is None else int(procs))
    return model, train, test


DATASETS = {"ocr": _ocr, "conll": _conll, "horses": _horses}


def load_problem_with_validation(cfg: dict):
    """``(model, train, validation, test)`` for a ``data:`` section with a ``validation:`` entry:

    * ``validation: {fold: k}`` (OCR): the words of fold ``k`` (see :func:`~torch_bcfw.datasets.ocr.ocr_split_with_validation`);
    * ``validation: {fraction: f, seed: s}`` (any dataset): a random fraction ``f`` of the training examples
      (default seed 0) is held out.

    Without a ``validation`` entry the validation set is ``None``.
    """
    cfg = dict(cfg)
    spec = cfg.pop("validation", None)
    if spec is None:
        return _no_validation(cfg)
    if not isinstance(spec, dict):
        raise ValueError(f"data.validation must be a mapping such as {{fold: 1}} or {{fraction: 0.2}}, got {spec!r}")
    unknown = sorted(set(spec) - {"fold", "fraction", "seed"})
    if unknown:
        raise ValueError(f"unknown data.validation key(s) {unknown}; use fold (OCR) or fraction and seed")
    if "fold" in spec:
        if cfg.get("name") != "ocr":
            raise ValueError("data.validation.fold is only defined for the ocr dataset; use fraction for others")
        from ..models import Chain
        from .ocr import N_LETTERS, load_ocr, ocr_split_with_validation

        words = load_ocr(cfg.get("path"), cache_dir=cfg.get("cache_dir"), download=bool(cfg.get("download", False)))
        train, val, test = ocr_split_with_validation(words, cfg.get("split", "large"), int(cfg.get("fold", 0)),
                                                     int(spec["fold"]))
        model = Chain(train.x.shape[1], N_LETTERS)
        if cfg.get("limit") is not None:
            train = train[list(range(min(int(cfg["limit"]), len(train))))]
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
    device = cfg.get("device")
    if device is not None:
        train, val, test = train.to(device), val.to(device), test.to(device)
    return model, train, val, test


def _no_validation(cfg: dict):
    model, train, test = load_problem(cfg)
    return model, train, None, test


def load_problem(cfg: dict):
    """``(model, train, test)`` for a ``data:`` config section (``name`` plus the loader's arguments)."""
    cfg = dict(cfg)
    name = cfg.pop("name", None)
    if name not in DATASETS:
        raise ValueError(f"unknown dataset {name!r}; available: {sorted(DATASETS)}")
    model, train, test = DATASETS[name](cfg)
    device = cfg.get("device")
    if device is not None:
        train, test = train.to(device), test.to(device)
    return model, train, test
