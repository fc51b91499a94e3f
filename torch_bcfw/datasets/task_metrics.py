"""Each dataset's own metric, reported by ``torch-bcfw fit`` beside the task loss (the Hamming error): chunk F1 for
CoNLL-2000, foreground IoU for the Weizmann horses, AER for the Hansards, keyed by the dataset's name in a config's
``data:`` section (:mod:`torch_bcfw.datasets.registry`; add one with :func:`register_task_metric`).  All values are
percentages (``93.48`` for a chunk F1 of 0.9348), as the tasks' literature reports them.
"""
from __future__ import annotations

from collections.abc import Callable

from ..metrics.alignment import alignment_scores_from_labelings
from ..metrics.segmentation import segmentation_metrics
from .conll import load_conll2000
from .conll_chain import chunk_f1_from_ids, predictions_to_tags

__all__ = ["task_metrics", "register_task_metric", "TASK_METRICS", "conll_metrics", "horses_metrics",
           "hansards_metrics"]

#: dataset name -> ``fn(model, data, result, config) -> {label: value}``
TASK_METRICS: dict[str, Callable] = {}


def register_task_metric(name: str, fn: Callable | None = None):
    """Register ``fn(model, data, result, config) -> dict`` as the metric of dataset ``name`` (usable as a
    decorator: ``@register_task_metric("mydata")``)."""
    def add(f):
        TASK_METRICS[name] = f
        return f

    return add if fn is None else add(fn)


def task_metrics(name: str | None, model, data, result, config: dict | None = None) -> dict[str, float]:
    """The metrics of dataset ``name`` (``data.name`` of a config) for the :class:`~torch_bcfw.FitResult` ``result``
    of ``model`` on the labelled ``data`` (the test split): ``{"test chunk F1 (%)": 93.4, ...}``; ``{}`` when the
    dataset has none besides its task loss or when ``data`` is ``None``.  ``config``: the config's ``data:``
    section (CoNLL reads the gold tag strings of the test sentences from its ``path`` and ``test_limit``).
    """
    fn = TASK_METRICS.get(name or "")
    if fn is None or data is None:
        return {}
    return fn(model, data, result, dict(config or {}))


def _conll_gold(data, config: dict):
    """Gold chunk tags of the test sentences: the strings of the corpus when ``config`` names it (an ``I-LST`` tag
    unseen in training then counts as missed, as in conlleval), else the tags of the label ids."""
    lengths = (data.offsets[1:] - data.offsets[:-1]).tolist()
    path = config.get("path")
    if path:
        try:
            sentences = load_conll2000(path, split="test")
        except (OSError, ValueError):
            sentences = None
        if sentences is not None:
            limit = config.get("test_limit")
            if limit is not None:
                sentences = sentences[: int(limit)]
            if [len(s.chunks) for s in sentences] == lengths:
                return [list(s.chunks) for s in sentences]
    return predictions_to_tags(data.y, data.offsets)


@register_task_metric("conll")
def conll_metrics(model, data, result, config: dict) -> dict[str, float]:
    """conlleval chunk F1, precision and recall (%) of the plain decoding of ``data``."""
    scores = chunk_f1_from_ids(result.predict(data).cpu(), data.offsets.cpu(), _conll_gold(data, config))
    return {"test chunk F1 (%)": 100 * scores["f1"], "test chunk precision (%)": 100 * scores["precision"],
            "test chunk recall (%)": 100 * scores["recall"]}


@register_task_metric("horses")
def horses_metrics(model, data, result, config: dict) -> dict[str, float]:
    """:func:`segmentation_metrics` of the graph-cut decoding of the test images."""
    return segmentation_metrics(result.predict(data), data.y, data.offsets)


@register_task_metric("hansards")
def hansards_metrics(model, data, result, config: dict) -> dict[str, float]:
    """AER, precision and recall (%) of the plain decoding of ``data``."""
    s = alignment_scores_from_labelings(data, result.predict(data))
    return {"test AER (%)": 100 * s.aer, "test precision (%)": 100 * s.precision, "test recall (%)": 100 * s.recall}
