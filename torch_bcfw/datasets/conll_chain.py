"""CoNLL-2000 chunking as a sparse linear-chain SSVM (the CoNLL problem of the BCFW papers).

Pipeline: sentences (:func:`~torch_bcfw.datasets.conll.load_conll2000`) -> attribute ids of the
chunking templates (:class:`~torch_bcfw.features.chunking.AttributeVocabulary`) -> sparse token
features (:class:`~torch_bcfw.data.sequences.SparseFeatures`, indicator values 1) -> :class:`~torch_bcfw.models.Chain`.

Feature set and dimension.  The vocabulary keeps the template attributes seen on at least
``min_count`` training tokens (74,659 at ``min_count=3``).  One of them is the constant
``bias`` attribute, which would duplicate the chain's own per-label bias, so it is dropped
(``drop_bias=True``): ``F = 74,658`` attribute columns and ::

    d = F K + 3 K + K^2 = 74,658 * 22 + 3 * 22 + 22^2 = 1,643,026

(emission, per-label bias, start and end biases, transitions), exactly the ``d`` of the paper.

Labels.  The 22 tags of the training split (:data:`~torch_bcfw.datasets.conll.CHUNK_TAGS`, sorted) get ids
``0..21``.  For the Hamming loss a tag unseen in training (``I-LST`` in the test split) takes the id of ``O``
(:data:`UNSEEN_TAG`); chunk F1 is computed against the *gold tag strings* (:func:`chunk_f1_from_ids`), so such
chunks count as missed, as in conlleval.
"""
from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor

from ..data.base import counts_to_offsets
from ..data.sequences import SequenceData, SparseFeatures
from ..features.chunking import PAD_ID, AttributeVocabulary, TaggedSentence, token_attributes
from ..metrics.chunking import chunk_f1
from .conll import CHUNK_TAGS, Sentence, load_conll2000_splits

__all__ = ["TAG_IDS", "UNSEEN_TAG", "BIAS_ATTRIBUTE", "ConllProblem", "tags_to_ids", "ids_to_tags", "chunk_vocabulary",
           "encode_sentences", "load_conll_problem", "predictions_to_tags", "chunk_f1_from_ids", "evaluate_chunking",
           "token_attribute_strings", "write_crfsuite_data"]

#: chunk tag -> label id (the 22 training tags, sorted)
TAG_IDS: dict[str, int] = {tag: i for i, tag in enumerate(CHUNK_TAGS)}
#: tags unseen in training (``I-LST`` in the test split) take this tag's id for the loss
UNSEEN_TAG = "O"
#: the template attribute that duplicates the chain's per-label bias
BIAS_ATTRIBUTE = "bias"


def tags_to_ids(tags: Sequence[str]) -> Tensor:
    """Label ids of chunk tags (``LongTensor[T]``); a tag outside :data:`TAG_IDS` maps to ``O``'s id."""
    fallback = TAG_IDS[UNSEEN_TAG]
    return torch.tensor([TAG_IDS.get(tag, fallback) for tag in tags], dtype=torch.long)


def ids_to_tags(ids: Tensor | Sequence[int]) -> list[str]:
    """Chunk tags of label ids; raises ``ValueError`` on an id outside ``[0, 22)``."""
    out = []
    for i in torch.as_tensor(ids).reshape(-1).tolist():
        if not 0 <= i < len(CHUNK_TAGS):
            raise ValueError(f"label id {i} is not a chunk tag id (expected 0..{len(CHUNK_TAGS) - 1})")
        out.append(CHUNK_TAGS[i])
    return out


def chunk_vocabulary(sentences: Sequence[TaggedSentence], min_count: int = 3,
                     drop_bias: bool = True) -> AttributeVocabulary:
    """Template attributes seen on at least ``min_count`` tokens of ``sentences`` (sorted); with ``drop_bias``
    without the constant ``bias`` attribute (the chain has its own per-label bias)."""
    vocab = AttributeVocabulary().fit(sentences, min_count=min_count)
    if drop_bias:
        vocab = AttributeVocabulary([a for a in vocab.attributes if a != BIAS_ATTRIBUTE])
    return vocab


def encode_sentences(sentences: Sequence[Sentence], vocab: AttributeVocabulary) -> SequenceData:
    """Sparse indicator token features (``[N_tok, len(vocab)]``) and label ids of ``sentences``.

    Attributes outside the vocabulary are dropped; tags unseen in training map to ``O``'s id.
    """
    if len(sentences) == 0:
        raise ValueError("no sentences to encode")
    # one packed id matrix (not a tensor per sentence): the same SequenceData as
    # SequenceData.from_attribute_ids([vocab.transform(s) ...], ...), with ~36 MB less resident memory on CoNLL-2000
    ids = vocab.transform_packed(sentences)
    offsets = counts_to_offsets(torch.tensor([len(s.words) for s in sentences], dtype=torch.long))
    x = SparseFeatures.from_attribute_ids(ids, len(vocab), pad_id=PAD_ID)
    del ids
    y = tags_to_ids([tag for s in sentences for tag in s.chunks])
    return SequenceData(x, y, offsets)


def token_attribute_strings(sentence: TaggedSentence, vocab: AttributeVocabulary, bias: bool = False) -> list[list[str]]:
    """The attributes the chain sees on each token of ``sentence``, as strings (export for other tools).

    Token ``t`` gets its template attributes that are in ``vocab``, in template order: exactly the columns of its
    row in :func:`encode_sentences`' sparse features.  With ``bias`` the constant :data:`BIAS_ATTRIBUTE` is put
    first on every token when ``vocab`` lacks it (a CRF without its own per-label bias, such as CRFsuite, needs it).
    """
    known = vocab.__contains__
    head = [BIAS_ATTRIBUTE] if bias and not known(BIAS_ATTRIBUTE) else []
    return [head + [a for a in attrs if known(a)] for attrs in token_attributes(sentence)]


def write_crfsuite_data(path: str | os.PathLike[str], sentences: Iterable[Sentence], vocab: AttributeVocabulary,
                        bias: bool = True) -> int:
    """Write ``sentences`` with the chain's attributes in CRFsuite's data format; returns the number of tokens.

    One line per token, ``<gold tag>\\t<attribute>\\t<attribute>...`` (the attributes of
    :func:`token_attribute_strings`, value 1, ``:`` and ``\\`` escaped as CRFsuite expects), and an
    empty line after each sentence, as ``crfsuite learn`` reads it.  ``bias=True`` (default) adds the ``bias``
    attribute, CRFsuite's per-label bias, when ``vocab`` lacks it.
    """
    n_tokens = 0
    with open(path, "w", encoding="utf-8") as f:
        for sentence in sentences:
            for tag, attrs in zip(sentence.chunks, token_attribute_strings(sentence, vocab, bias=bias)):
                # CRFsuite reads "name:value": a literal ':' or '\\' in a name is escaped with '\\'
                f.write("\t".join([tag] + [a.replace("\\", "\\\\").replace(":", "\\:") for a in attrs]) + "\n")
                n_tokens += 1
            f.write("\n")
    return n_tokens


@dataclass
class ConllProblem:
    """A CoNLL-2000 chain problem: the model, encoded train/test data and what encoded them.

    ``train_sentences`` / ``test_sentences`` keep the gold tag strings for chunk F1.
    """

    model: object
    train: SequenceData
    test: SequenceData
    vocab: AttributeVocabulary
    train_sentences: list = field(repr=False)
    test_sentences: list = field(repr=False)
    min_count: int = 3
    drop_bias: bool = True

    def f1(self, w: Tensor, split: str = "test") -> dict:
        """Chunk precision / recall / F1 of the plain decoding at ``w`` on ``split`` (``"train"`` or ``"test"``)."""
        if split not in ("train", "test"):
            raise ValueError(f"split must be 'train' or 'test', got {split!r}")
        data, sentences = (self.train, self.train_sentences) if split == "train" else (self.test, self.test_sentences)
        return evaluate_chunking(self.model, w, data, sentences)


def load_conll_problem(
    path: str | os.PathLike[str],
    min_count: int = 3,
    drop_bias: bool = True,
    limit: int | None = None,
    test_limit: int | None = None,
    progress: bool = False,
) -> ConllProblem:
    """Load CoNLL-2000, build the vocabulary on the (first ``limit``) training sentences, encode both splits.

    ``path`` is anything :func:`~torch_bcfw.datasets.conll.load_conll2000` accepts (the
    ``conll2000.zip`` or a folder holding it or the ``.txt`` files).  ``limit`` / ``test_limit``
    keep only the first sentences of each split (quick runs).  ``progress``: a "preparing features" bar on stderr
    when the work takes over 2 s (:class:`~torch_bcfw.runtime.progress.StageBar`).
    """
    from ..models import Chain
    from ..runtime.progress import StageBar

    with StageBar(["read", "vocabulary", "features train", "features test"], progress) as bar:
        train_s, test_s = load_conll2000_splits(path, limit, test_limit)
        bar.done("read")
        vocab = chunk_vocabulary(train_s, min_count=min_count, drop_bias=drop_bias)
        bar.done("vocabulary")
        train = encode_sentences(train_s, vocab)
        bar.done("features train")
        test = encode_sentences(test_s, vocab)
        bar.done("features test")
    model = Chain(len(vocab), len(CHUNK_TAGS))
    return ConllProblem(model, train, test, vocab, train_s, test_s, min_count, drop_bias)


def predictions_to_tags(pred: Tensor, offsets: Tensor) -> list[list[str]]:
    """Split packed label ids ``pred: [N_tok]`` into per-sentence chunk tag lists."""
    pred = torch.as_tensor(pred).reshape(-1).cpu()
    off = torch.as_tensor(offsets).cpu().tolist()
    if off[-1] != pred.numel():
        raise ValueError(f"{pred.numel()} predicted labels but the offsets cover {off[-1]} tokens")
    tags = ids_to_tags(pred)
    return [tags[off[i] : off[i + 1]] for i in range(len(off) - 1)]


def chunk_f1_from_ids(pred: Tensor, offsets: Tensor, gold: Sequence[Sentence] | Sequence[Sequence[str]]) -> dict:
    """conlleval chunk precision / recall / F1 (:func:`~torch_bcfw.metrics.chunking.chunk_f1`'s dict) of packed
    predicted label ids against gold tags: a list of :class:`~torch_bcfw.datasets.conll.Sentence` (their ``chunks``)
    or of tag lists, one per sequence of ``offsets``."""
    gold_tags = [list(g.chunks) if isinstance(g, Sentence) else list(g) for g in gold]
    pred_tags = predictions_to_tags(pred, offsets)
    if len(gold_tags) != len(pred_tags):
        raise ValueError(f"{len(pred_tags)} predicted sequences but {len(gold_tags)} gold sequences")
    return chunk_f1(gold_tags, pred_tags)


def evaluate_chunking(model, w: Tensor, data: SequenceData, sentences: Sequence[Sentence]) -> dict:
    """Decode ``data`` at ``w`` (no loss augmentation) and score the chunks against ``sentences``."""
    pred = model.decode(w.to(data.device), data)
    return chunk_f1_from_ids(pred, data.offsets, sentences)
