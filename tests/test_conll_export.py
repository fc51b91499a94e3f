"""Export of the sparse chain's CoNLL attributes for other tools (CRFsuite): the same attributes, token by token."""
from __future__ import annotations

import pytest
import torch

from torch_bcfw.data import SequenceData
from torch_bcfw.datasets.conll import Sentence
from torch_bcfw.datasets.conll_chain import (
    BIAS_ATTRIBUTE,
    chunk_vocabulary,
    encode_sentences,
    tags_to_ids,
    token_attribute_strings,
    write_crfsuite_data,
)
from torch_bcfw.features.chunking import NUM_TEMPLATES, PAD_ID, token_attributes

SENTENCES = [
    Sentence(["He", "reckons", "the", "deficit", "."], ["PRP", "VBZ", "DT", "NN", "."],
             ["B-NP", "B-VP", "B-NP", "I-NP", "O"]),
    Sentence(["The", "deficit", "at", "3:30", "."], ["DT", "NN", "IN", "CD", "."], ["B-NP", "I-NP", "B-PP", "B-NP", "O"]),
    Sentence(["He", "said", "a\\b", "."], ["PRP", "VBD", "NN", "."], ["B-NP", "B-VP", "B-NP", "O"]),
]


@pytest.mark.parametrize("min_count", [1, 2])
@pytest.mark.parametrize("drop_bias", [True, False])
def test_exported_attributes_are_the_rows_of_the_sparse_features(min_count, drop_bias):
    vocab = chunk_vocabulary(SENTENCES, min_count=min_count, drop_bias=drop_bias)
    data = encode_sentences(SENTENCES, vocab)
    indptr, indices = data.x.indptr.tolist(), data.x.indices.tolist()
    row = 0
    for sentence in SENTENCES:
        exported = token_attribute_strings(sentence, vocab)
        assert len(exported) == len(sentence)
        for attrs in exported:
            assert attrs == [vocab.attributes[j] for j in indices[indptr[row]:indptr[row + 1]]]
            row += 1
    assert row == data.n_tokens


def test_bias_is_added_only_when_the_vocabulary_lacks_it():
    dropped = chunk_vocabulary(SENTENCES, min_count=1, drop_bias=True)
    kept = chunk_vocabulary(SENTENCES, min_count=1, drop_bias=False)
    for attrs in token_attribute_strings(SENTENCES[0], dropped, bias=True):
        assert attrs[0] == BIAS_ATTRIBUTE and attrs.count(BIAS_ATTRIBUTE) == 1
    assert all(BIAS_ATTRIBUTE not in a for a in token_attribute_strings(SENTENCES[0], dropped))
    assert token_attribute_strings(SENTENCES[0], kept, bias=True) == token_attribute_strings(SENTENCES[0], kept)
    assert token_attribute_strings(SENTENCES[0], kept)[0] == token_attributes(SENTENCES[0])[0]  # every attribute kept


def _unescape(field: str) -> str:
    out, i = [], 0
    while i < len(field):
        if field[i] == "\\":
            i += 1
        out.append(field[i])
        i += 1
    return "".join(out)


def test_crfsuite_file_holds_tags_and_escaped_attributes(tmp_path):
    vocab = chunk_vocabulary(SENTENCES, min_count=1, drop_bias=True)
    path = tmp_path / "train.crfsuite.txt"
    n = write_crfsuite_data(path, SENTENCES, vocab)
    assert n == sum(map(len, SENTENCES))
    blocks = path.read_text(encoding="utf-8").split("\n\n")
    assert blocks[-1] == "" and len(blocks) == len(SENTENCES) + 1
    for sentence, block in zip(SENTENCES, blocks):
        lines = block.split("\n")
        assert [line.split("\t")[0] for line in lines] == list(sentence.chunks)
        expected = token_attribute_strings(sentence, vocab, bias=True)
        for line, attrs in zip(lines, expected):
            fields = line.split("\t")[1:]
            assert all(":" not in f.replace("\\:", "") for f in fields)  # no unescaped value separator
            assert [_unescape(f) for f in fields] == attrs
    text = path.read_text(encoding="utf-8")
    assert "w[0]=3\\:30" in text and "w[0]=a\\\\b" in text


def test_packed_encoding_equals_the_per_sentence_one():
    vocab = chunk_vocabulary(SENTENCES, min_count=2, drop_bias=True)
    packed = vocab.transform_packed(SENTENCES)
    assert packed.dtype == torch.long and torch.equal(packed, torch.cat([vocab.transform(s) for s in SENTENCES]))
    assert vocab.transform_packed([]).shape == (0, NUM_TEMPLATES)
    data = encode_sentences(SENTENCES, vocab)
    ref = SequenceData.from_attribute_ids([vocab.transform(s) for s in SENTENCES], len(vocab),
                                          [tags_to_ids(s.chunks) for s in SENTENCES], pad_id=PAD_ID)
    for a, b in ((data.x.indptr, ref.x.indptr), (data.x.indices, ref.x.indices), (data.x.values, ref.x.values),
                 (data.y, ref.y), (data.offsets, ref.offsets)):
        assert a.dtype == b.dtype and torch.equal(a, b)
    assert data.x.n_features == ref.x.n_features
