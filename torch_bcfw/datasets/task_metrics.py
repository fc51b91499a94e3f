"""Each dataset's own metric, reported by ``torch-bcfw fit`` beside the task loss (the Hamming error): the glue between
a dataset (its gold annotations, read here) and the metric functions of :mod:`torch_bcfw.metrics`.

The solvers minimise a (normalised) Hamming loss; the tasks are judged by other figures: chunk F1 for CoNLL-2000
(conlleval), foreground IoU for the Weizmann horses.  :func:`task_metrics` computes them for a fitted
:class:`~torch_bcfw.FitResult` on labelled data, keyed by the dataset's name in a config's ``data:`` section
(:mod:`torch_bcfw.datasets.registry`).  Register another with :func:`register_task_metric`.

All values are percentages (``93.48`` for a chunk F1 of 0.9348), as the tasks' literature reports them.
"""
from __future__ import annotations

from collections.abc import Callable

from ..metrics.alignment import alignment_scores_from_labelings
from ..metrics.segmentation import segmentation_metrics
from .conll import load_conll2000
from .conll_chain import chunk_f1_from_ids, ids_to_tags

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
    """The metrics of dataset ``name`` for ``result`` on the labelled ``data`` (the test split):
    ``{"test chunk F1 (%)": 93.4, ...}``; ``{}`` when the dataset has none besides its task loss (OCR: the letter
    error is its metric) or when ``data`` is ``None``.

    Args:
        name: the dataset's name (``data.name`` of a config): ``"conll"``, ``"horses"``, ...
        model: the structured model.
        data: labelled data to score (``None``: nothing to report).
        result: the :class:`~torch_bcfw.FitResult` (its :meth:`~torch_bcfw.FitResult.predict` is used).
        config: the config's ``data:`` section (CoNLL reads the gold tag strings of the test sentences from its
            ``path`` and ``test_limit``).
    """
    fn = TASK_METRICS.get(name or "")
    if fn is None or data is None:
        return {}
    return fn(model, data, result, dict(config or {}))


# ----------------------------------------------------------------------------- CoNLL-2000: chunk F1
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
    tags = ids_to_tags(data.y)
    off = data.offsets.tolist()
    return [tags[off[i]:off[i + 1]] for i in range(len(lengths))]


def conll_metrics(model, data, result, config: dict) -> dict[str, float]:
    """conlleval chunk F1, precision and recall (%) of the plain decoding of ``data``."""
    scores = chunk_f1_from_ids(result.predict(data).cpu(), data.offsets.cpu(), _conll_gold(data, config))
    return {"test chunk F1 (%)": 100 * scores["f1"], "test chunk precision (%)": 100 * scores["precision"],
            "test chunk recall (%)": 100 * scores["recall"]}


register_task_metric("conll", conll_metrics)


# ----------------------------------------------------------------------------- horses: IoU
def horses_metrics(model, data, result, config: dict) -> dict[str, float]:
    """:func:`segmentation_metrics` of the graph-cut decoding of the test images."""
    return segmentation_metrics(result.predict(data), data.y, data.offsets)


register_task_metric("horses", horses_metrics)


# ----------------------------------------------------------------------------- Hansards: AER
def hansards_metrics(model, data, result, config: dict) -> dict[str, float]:
    """AER, precision and recall (%) of the plain decoding of ``data`` (the ``torch-bcfw fit`` table's rows for
    the ``hansards`` dataset)."""
    s = alignment_scores_from_labelings(data, result.predict(data))
    return {"test AER (%)": 100 * s.aer, "test precision (%)": 100 * s.precision, "test recall (%)": 100 * s.recall}


register_task_metric("hansards", hansards_metrics)
