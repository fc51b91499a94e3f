"""Sparse token attributes for text chunking.

The templates are those of the CRFsuite chunking tutorial (after Sha & Pereira, 2003), with
every token getting all ``A = NUM_TEMPLATES = 20`` attributes:

* ``bias``;
* words (lower-cased) ``w[k]`` for ``k in -2..2``, and bigrams ``w[-1]|w[0]``, ``w[0]|w[1]``;
* part-of-speech tags ``pos[k]`` for ``k in -2..2``; bigrams ``pos[-2]|pos[-1]``,
  ``pos[-1]|pos[0]``, ``pos[0]|pos[1]``, ``pos[1]|pos[2]``; trigrams
  ``pos[-2]|pos[-1]|pos[0]``, ``pos[-1]|pos[0]|pos[1]``, ``pos[0]|pos[1]|pos[2]``.

Offsets are relative to the token; positions outside the sentence read ``__BOS__`` / ``__EOS__``.  An attribute
string is ``<template name>=<values joined by '|'>``, e.g. ``w[-1]|w[0]=he|reckons`` (values are not escaped).

Encoding: a sentence of ``T`` tokens becomes a ``LongTensor (T, A)`` whose column ``j`` holds the id of template
``j``'s attribute, or ``PAD_ID = -1`` where that attribute is not in the vocabulary (or the token is padding).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import numpy as np
import torch

__all__ = ["BOS", "EOS", "NUM_TEMPLATES", "PAD_ID", "TEMPLATES", "TEMPLATE_NAMES", "AttributeVocabulary",
           "TaggedSentence", "pad_attribute_ids", "token_attributes"]

BOS = "__BOS__"
EOS = "__EOS__"
PAD_ID = -1

#: Each template is a tuple of ``(field, offset)`` pairs; ``()`` is the bias.
TEMPLATES: tuple[tuple[tuple[str, int], ...], ...] = (
    (),
    (("w", -2),),
    (("w", -1),),
    (("w", 0),),
    (("w", 1),),
    (("w", 2),),
    (("w", -1), ("w", 0)),
    (("w", 0), ("w", 1)),
    (("pos", -2),),
    (("pos", -1),),
    (("pos", 0),),
    (("pos", 1),),
    (("pos", 2),),
    (("pos", -2), ("pos", -1)),
    (("pos", -1), ("pos", 0)),
    (("pos", 0), ("pos", 1)),
    (("pos", 1), ("pos", 2)),
    (("pos", -2), ("pos", -1), ("pos", 0)),
    (("pos", -1), ("pos", 0), ("pos", 1)),
    (("pos", 0), ("pos", 1), ("pos", 2)),
)

TEMPLATE_NAMES: tuple[str, ...] = tuple(
    "|".join(f"{field}[{offset}]" for field, offset in template) or "bias"
    for template in TEMPLATES
)
NUM_TEMPLATES = len(TEMPLATES)
_MAX_OFFSET = max(abs(offset) for template in TEMPLATES for _, offset in template)
_NAMED = tuple(zip(TEMPLATE_NAMES, TEMPLATES))


class TaggedSentence(Protocol):
    """Anything with per-token ``words`` and ``pos`` (e.g. ``datasets.conll.Sentence``)."""

    @property
    def words(self) -> Sequence[str]: ...

    @property
    def pos(self) -> Sequence[str]: ...


def token_attributes(sentence: TaggedSentence) -> list[list[str]]:
    """Attribute strings of every token: ``T`` lists of ``NUM_TEMPLATES`` strings each."""
    if len(sentence.words) != len(sentence.pos):
        raise ValueError(f"words and pos differ in length: {len(sentence.words)} != {len(sentence.pos)}")
    fields = {"w": _padded([word.lower() for word in sentence.words]), "pos": _padded(list(sentence.pos))}
    return [
        [_attribute(name, template, fields, t + _MAX_OFFSET) for name, template in _NAMED]
        for t in range(len(sentence.words))
    ]


def _padded(values: list[str]) -> list[str]:
    return [BOS] * _MAX_OFFSET + values + [EOS] * _MAX_OFFSET


def _attribute(name: str, template: tuple[tuple[str, int], ...], fields: Mapping[str, list[str]], i: int) -> str:
    if not template:
        return name
    return name + "=" + "|".join(fields[field][i + offset] for field, offset in template)


class AttributeVocabulary:
    """Maps attribute strings to ids ``0..len(self)-1``, sorted by string.

    Build with :meth:`fit` on training sentences; encode with :meth:`transform` (one sentence,
    ``(T, A)``) or :meth:`transform_batch` (``(B, T_max, A)`` plus lengths). Attributes unseen
    at fit time become ``PAD_ID``.  On the CoNLL-2000 train split ``min_count=3`` keeps 74,659 attributes.
    """

    def __init__(self, attributes: Sequence[str] = ()) -> None:
        self._set_attributes(attributes)

    def _set_attributes(self, attributes: Sequence[str]) -> None:
        self._attributes: tuple[str, ...] = tuple(attributes)
        self._index = {attribute: i for i, attribute in enumerate(self._attributes)}
        if len(self._index) != len(self._attributes):
            raise ValueError("attributes must be distinct")

    def fit(self, sentences: Sequence[TaggedSentence], min_count: int = 1) -> AttributeVocabulary:
        """Keep every attribute occurring on at least ``min_count`` tokens; returns ``self``."""
        if not sentences:
            raise ValueError("cannot fit an AttributeVocabulary on an empty list of sentences")
        if min_count < 1:
            raise ValueError(f"min_count must be >= 1, got {min_count}")
        counts: Counter[str] = Counter()
        for sentence in sentences:
            for attributes in token_attributes(sentence):
                counts.update(attributes)
        self._set_attributes(sorted(a for a, count in counts.items() if count >= min_count))
        return self

    def __len__(self) -> int:
        return len(self._attributes)

    def __contains__(self, attribute: object) -> bool:
        return attribute in self._index

    @property
    def attributes(self) -> tuple[str, ...]:
        """All attribute strings; position = id."""
        return self._attributes

    def transform(self, sentence: TaggedSentence) -> torch.Tensor:
        """Attribute ids of one sentence: ``LongTensor (T, NUM_TEMPLATES)``.

        Column ``j`` is template ``j``; an attribute not in the vocabulary gives ``PAD_ID``.
        """
        return self.transform_packed([sentence])

    def transform_packed(self, sentences: Sequence[TaggedSentence]) -> torch.Tensor:
        """``torch.cat([self.transform(s) for s in sentences])``: ``LongTensor (N_tok, NUM_TEMPLATES)``, built in one
        array without a tensor per sentence (less memory on a whole corpus)."""
        get = self._index.get
        n_tokens = sum(len(sentence.words) for sentence in sentences)
        ids = np.fromiter(
            (get(a, PAD_ID) for sentence in sentences for attributes in token_attributes(sentence) for a in attributes),
            dtype=np.int64, count=n_tokens * NUM_TEMPLATES,
        )
        return torch.from_numpy(ids).reshape(n_tokens, NUM_TEMPLATES)

    def transform_batch(self, sentences: Sequence[TaggedSentence]) -> tuple[torch.Tensor, torch.Tensor]:
        """Encode and pad a batch: ids ``(B, T_max, NUM_TEMPLATES)`` and lengths ``(B,)``."""
        return pad_attribute_ids([self.transform(sentence) for sentence in sentences])

    def state_dict(self) -> dict[str, Any]:
        """Plain-Python state (``torch.save``/JSON friendly), including the template names."""
        return {"attributes": list(self._attributes), "templates": list(TEMPLATE_NAMES)}

    @classmethod
    def from_state_dict(cls, state: Mapping[str, Any]) -> AttributeVocabulary:
        """Rebuild a vocabulary saved by :meth:`state_dict`; rejects other feature templates."""
        if list(state.get("templates", ())) != list(TEMPLATE_NAMES):
            raise ValueError("state was saved with different feature templates")
        return cls(state["attributes"])


def pad_attribute_ids(encoded: Sequence[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Stack per-sentence ``(T_b, A)`` id tensors into ``(B, T_max, A)`` padded with ``PAD_ID``.

    Returns ``(ids, lengths)`` with ``lengths`` a ``LongTensor (B,)`` of the ``T_b``.
    """
    if not encoded:
        raise ValueError("cannot pad an empty list of sentences")
    shapes = [tuple(tensor.shape) for tensor in encoded]
    if any(len(shape) != 2 or shape[1] != shapes[0][1] for shape in shapes):
        raise ValueError(f"expected 2-D (T, A) tensors sharing A, got shapes {shapes}")
    lengths = torch.tensor([shape[0] for shape in shapes], dtype=torch.long)
    ids = torch.full((len(encoded), int(lengths.max()), shapes[0][1]), PAD_ID, dtype=torch.long)
    for b, tensor in enumerate(encoded):
        ids[b, : tensor.shape[0]] = tensor
    return ids, lengths
