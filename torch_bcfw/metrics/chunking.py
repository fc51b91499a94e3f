"""Chunk-level precision, recall and F1 with the conlleval definition.

Tags are ``O`` or ``B-<type>`` / ``I-<type>``. As in conlleval (and seqeval's default mode), a
chunk starts at ``B-X``, or at ``I-X`` that follows ``O``, the sentence start or a tag of another
type (so IOB1 and IOB2 are both read correctly); it ends before ``O``, before any ``B-``, before
a tag of another type, or at the sentence end. A predicted chunk is correct when its type,
start and end all equal those of a true chunk. Scores are fractions in ``[0, 1]`` (conlleval
prints percentages), and 0 where the denominator is 0, as conlleval does.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

__all__ = ["chunk_f1", "extract_chunks"]

Chunk = tuple[str, int, int]


def extract_chunks(tags: Sequence[str]) -> set[Chunk]:
    """Chunks of one tag sequence as ``(type, start, end)`` (``tags[start:end]``); ``ValueError`` on a tag that is
    neither ``O`` nor ``B-<type>`` / ``I-<type>``."""
    chunks: set[Chunk] = set()
    start, open_type = -1, ""
    for i, tag in enumerate(tags):
        prefix, chunk_type = _split_tag(tag)
        if start >= 0 and (prefix != "I" or chunk_type != open_type):
            chunks.add((open_type, start, i))
            start = -1
        if prefix == "B" or (prefix == "I" and start < 0):
            start, open_type = i, chunk_type
    if start >= 0:
        chunks.add((open_type, start, len(tags)))
    return chunks


def _split_tag(tag: str) -> tuple[str, str]:
    if tag == "O":
        return "O", ""
    prefix, sep, chunk_type = tag.partition("-")
    if prefix not in ("B", "I") or not sep or not chunk_type:
        raise ValueError(f"bad chunk tag {tag!r}: expected 'O', 'B-<type>' or 'I-<type>'")
    return prefix, chunk_type


def chunk_f1(true_tags: Sequence[Sequence[str]], pred_tags: Sequence[Sequence[str]]) -> dict[str, Any]:
    """Micro-averaged chunk precision, recall and F1 over sentences, plus per-type scores.

    ``true_tags`` and ``pred_tags`` are lists of ``N >= 1`` tag sequences, sentence ``i`` having
    the same length in both. Returns ``{"precision", "recall", "f1", "n_true", "n_pred",
    "n_correct", "per_type"}`` where ``per_type[type]`` holds the same keys (except
    ``per_type``) for every chunk type found in either input. Scores are fractions in [0, 1].
    """
    _check_inputs(true_tags, pred_tags)
    n_true: Counter[str] = Counter()
    n_pred: Counter[str] = Counter()
    n_correct: Counter[str] = Counter()
    for true_seq, pred_seq in zip(true_tags, pred_tags):
        true_chunks, pred_chunks = extract_chunks(true_seq), extract_chunks(pred_seq)
        n_true.update(chunk[0] for chunk in true_chunks)
        n_pred.update(chunk[0] for chunk in pred_chunks)
        n_correct.update(chunk[0] for chunk in true_chunks & pred_chunks)
    per_type = {
        chunk_type: _scores(n_true[chunk_type], n_pred[chunk_type], n_correct[chunk_type])
        for chunk_type in sorted(n_true.keys() | n_pred.keys())
    }
    totals = _scores(sum(n_true.values()), sum(n_pred.values()), sum(n_correct.values()))
    return {**totals, "per_type": per_type}


def _check_inputs(true_tags: Sequence[Sequence[str]], pred_tags: Sequence[Sequence[str]]) -> None:
    if len(true_tags) != len(pred_tags):
        raise ValueError(f"true_tags has {len(true_tags)} sentences but pred_tags has {len(pred_tags)}")
    if len(true_tags) == 0:
        raise ValueError("chunk_f1 needs at least one sentence")
    for i, (true_seq, pred_seq) in enumerate(zip(true_tags, pred_tags)):
        if isinstance(true_seq, str) or isinstance(pred_seq, str):
            raise TypeError(f"sentence {i}: expected a sequence of tags, got a string")
        if len(true_seq) != len(pred_seq):
            raise ValueError(f"sentence {i}: {len(true_seq)} true tags but {len(pred_seq)} predicted tags")


def _scores(n_true: int, n_pred: int, n_correct: int) -> dict[str, float | int]:
    precision = n_correct / n_pred if n_pred else 0.0
    recall = n_correct / n_true if n_true else 0.0
    total = precision + recall
    f1 = 2 * precision * recall / total if total else 0.0
    return {"precision": precision, "recall": recall, "f1": f1, "n_true": n_true, "n_pred": n_pred,
            "n_correct": n_correct}
