"""Named datasets for configs and the command line: ``name -> (model, train, test)``."""
from __future__ import annotations

__all__ = ["load_problem", "DATASETS"]


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


DATASETS = {"ocr": _ocr, "conll": _conll}


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
