"""CoNLL-2000 data layer: loader, chunking features and conlleval chunk F1."""

from __future__ import annotations

import json
import random
import shutil
import zipfile
from dataclasses import FrozenInstanceError
from pathlib import Path

import pytest
import torch

from torch_bcfw.datasets.conll import CHUNK_TAGS, Sentence, load_conll2000, parse_conll
from torch_bcfw.features.chunking import (
    NUM_TEMPLATES,
    PAD_ID,
    TEMPLATE_NAMES,
    AttributeVocabulary,
    pad_attribute_ids,
    token_attributes,
)
from torch_bcfw.metrics.chunking import chunk_f1, extract_chunks

DATA_DIR = Path(__file__).resolve().parents[1].parent / "shared" / "data"
CONLL_ZIP = DATA_DIR / "conll2000" / "conll2000.zip"

HAND = Sentence(words=["He", "Reckons", "."], pos=["PRP", "VBZ", "."], chunks=["B-NP", "B-VP", "O"])


@pytest.fixture(scope="module")
def conll_zip() -> Path:
    if not CONLL_ZIP.is_file():
        pytest.fail(f"CoNLL-2000 data missing: expected {CONLL_ZIP} (see shared/data/README.md)")
    return CONLL_ZIP


@pytest.fixture(scope="module")
def train(conll_zip: Path) -> list[Sentence]:
    return load_conll2000(conll_zip, split="train")


@pytest.fixture(scope="module")
def test_split(conll_zip: Path) -> list[Sentence]:
    return load_conll2000(conll_zip, split="test")


# ---------------------------------------------------------------------------- loader


def test_split_sizes(train: list[Sentence], test_split: list[Sentence]) -> None:
    assert (len(train), sum(map(len, train))) == (8936, 211_727)
    assert (len(test_split), sum(map(len, test_split))) == (2012, 47_377)
    assert train[0].words[:3] == ("Confidence", "in", "the")
    assert train[0].pos[:3] == ("NN", "IN", "DT")
    assert train[0].chunks[:3] == ("B-NP", "B-PP", "B-NP")


def test_chunk_tag_set(train: list[Sentence], test_split: list[Sentence]) -> None:
    train_tags = {tag for sentence in train for tag in sentence.chunks}
    test_tags = {tag for sentence in test_split for tag in sentence.chunks}
    assert CHUNK_TAGS == tuple(sorted(train_tags))
    assert len(CHUNK_TAGS) == 22
    assert test_tags - set(CHUNK_TAGS) == {"I-LST"}  # documented in CHUNK_TAGS
    assert len({tag for sentence in train for tag in sentence.pos}) == 44


def test_load_from_directory_holding_zip(conll_zip: Path, test_split: list[Sentence]) -> None:
    assert load_conll2000(conll_zip.parent, split="test") == test_split


def test_load_from_nltk_data_layout(
    conll_zip: Path, test_split: list[Sentence], tmp_path: Path
) -> None:
    (tmp_path / "corpora").mkdir()
    shutil.copy(conll_zip, tmp_path / "corpora" / "conll2000.zip")
    assert load_conll2000(tmp_path, split="test") == test_split


def test_load_from_extracted_directory(
    conll_zip: Path, test_split: list[Sentence], tmp_path: Path
) -> None:
    with zipfile.ZipFile(conll_zip) as archive:
        archive.extract("conll2000/test.txt", tmp_path)
    assert load_conll2000(tmp_path, split="test") == test_split
    assert load_conll2000(tmp_path / "conll2000", split="test") == test_split
    assert load_conll2000(str(tmp_path / "conll2000"), split="test") == test_split


def test_missing_path_lists_places_and_how_to_get(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError) as info:
        load_conll2000(tmp_path, split="test")
    message = str(info.value)
    for place in (
        tmp_path / "test.txt",
        tmp_path / "conll2000" / "test.txt",
        tmp_path / "conll2000.zip",
        tmp_path / "corpora" / "conll2000.zip",
    ):
        assert str(place) in message
    assert "NLTK" in message and "CoNLL-2000 shared task" in message
    with pytest.raises(FileNotFoundError, match="nowhere"):
        load_conll2000(tmp_path / "nowhere")


def test_bad_inputs_to_loader(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="split"):
        load_conll2000(tmp_path, split="dev")
    not_a_zip = tmp_path / "train.txt"
    not_a_zip.write_text("a DT B-NP\n")
    with pytest.raises(ValueError, match="not a zip"):
        load_conll2000(not_a_zip)
    with pytest.raises(ValueError, match=r"x:2: expected"):
        parse_conll(["a DT B-NP", "b DT", ""], source="x")


def test_parse_conll_without_trailing_blank_line() -> None:
    lines = ["", "a DT B-NP", "dog NN I-NP", "", "", "runs VBZ B-VP"]
    assert parse_conll(lines) == [
        Sentence(("a", "dog"), ("DT", "NN"), ("B-NP", "I-NP")),
        Sentence(("runs",), ("VBZ",), ("B-VP",)),
    ]


def test_sentence_validation() -> None:
    assert isinstance(HAND.words, tuple) and len(HAND) == 3
    with pytest.raises(FrozenInstanceError):
        HAND.words = ("x",)  # type: ignore[misc]
    with pytest.raises(ValueError, match="differ in length"):
        Sentence(["a", "b"], ["DT"], ["O", "O"])
    with pytest.raises(ValueError, match="at least one token"):
        Sentence([], [], [])


# -------------------------------------------------------------------------- features


def test_templates_on_hand_sentence() -> None:
    attributes = token_attributes(HAND)
    assert len(attributes) == 3 and all(len(row) == NUM_TEMPLATES == 20 for row in attributes)
    assert attributes[0] == [
        "bias",
        "w[-2]=__BOS__",
        "w[-1]=__BOS__",
        "w[0]=he",
        "w[1]=reckons",
        "w[2]=.",
        "w[-1]|w[0]=__BOS__|he",
        "w[0]|w[1]=he|reckons",
        "pos[-2]=__BOS__",
        "pos[-1]=__BOS__",
        "pos[0]=PRP",
        "pos[1]=VBZ",
        "pos[2]=.",
        "pos[-2]|pos[-1]=__BOS__|__BOS__",
        "pos[-1]|pos[0]=__BOS__|PRP",
        "pos[0]|pos[1]=PRP|VBZ",
        "pos[1]|pos[2]=VBZ|.",
        "pos[-2]|pos[-1]|pos[0]=__BOS__|__BOS__|PRP",
        "pos[-1]|pos[0]|pos[1]=__BOS__|PRP|VBZ",
        "pos[0]|pos[1]|pos[2]=PRP|VBZ|.",
    ]
    assert attributes[1] == [
        "bias",
        "w[-2]=__BOS__",
        "w[-1]=he",
        "w[0]=reckons",
        "w[1]=.",
        "w[2]=__EOS__",
        "w[-1]|w[0]=he|reckons",
        "w[0]|w[1]=reckons|.",
        "pos[-2]=__BOS__",
        "pos[-1]=PRP",
        "pos[0]=VBZ",
        "pos[1]=.",
        "pos[2]=__EOS__",
        "pos[-2]|pos[-1]=__BOS__|PRP",
        "pos[-1]|pos[0]=PRP|VBZ",
        "pos[0]|pos[1]=VBZ|.",
        "pos[1]|pos[2]=.|__EOS__",
        "pos[-2]|pos[-1]|pos[0]=__BOS__|PRP|VBZ",
        "pos[-1]|pos[0]|pos[1]=PRP|VBZ|.",
        "pos[0]|pos[1]|pos[2]=VBZ|.|__EOS__",
    ]
    assert attributes[2] == [
        "bias",
        "w[-2]=he",
        "w[-1]=reckons",
        "w[0]=.",
        "w[1]=__EOS__",
        "w[2]=__EOS__",
        "w[-1]|w[0]=reckons|.",
        "w[0]|w[1]=.|__EOS__",
        "pos[-2]=PRP",
        "pos[-1]=VBZ",
        "pos[0]=.",
        "pos[1]=__EOS__",
        "pos[2]=__EOS__",
        "pos[-2]|pos[-1]=PRP|VBZ",
        "pos[-1]|pos[0]=VBZ|.",
        "pos[0]|pos[1]=.|__EOS__",
        "pos[1]|pos[2]=__EOS__|__EOS__",
        "pos[-2]|pos[-1]|pos[0]=PRP|VBZ|.",
        "pos[-1]|pos[0]|pos[1]=VBZ|.|__EOS__",
        "pos[0]|pos[1]|pos[2]=.|__EOS__|__EOS__",
    ]
    assert [a.split("=")[0] for a in attributes[0]] == list(TEMPLATE_NAMES)


def test_vocabulary_is_deterministic_and_sorted(train: list[Sentence]) -> None:
    sample = train[:300]
    vocab = AttributeVocabulary().fit(sample)
    assert vocab.attributes == tuple(sorted(vocab.attributes))
    assert AttributeVocabulary().fit(sample[::-1]).attributes == vocab.attributes
    frequent = AttributeVocabulary().fit(sample, min_count=3)
    assert 0 < len(frequent) < len(vocab) and set(frequent.attributes) <= set(vocab.attributes)
    assert "bias" in frequent and "w[0]=confidence" in vocab


def test_transform_matches_vocabulary(train: list[Sentence]) -> None:
    vocab = AttributeVocabulary().fit(train[:50])
    sentence = train[0]
    ids = vocab.transform(sentence)
    assert ids.dtype == torch.long and ids.shape == (len(sentence), NUM_TEMPLATES)
    expected = [[vocab.attributes.index(a) for a in row] for row in token_attributes(sentence)]
    assert ids.tolist() == expected


def test_unknown_attributes_are_dropped() -> None:
    vocab = AttributeVocabulary().fit([HAND])
    assert len(vocab) == len({a for row in token_attributes(HAND) for a in row})
    other = Sentence(["She", "reckons"], ["PRP", "VBZ"], ["B-NP", "B-VP"])
    ids = vocab.transform(other)
    known = torch.tensor([[a in vocab for a in row] for row in token_attributes(other)])
    assert torch.equal(ids == PAD_ID, ~known)
    assert ids[0, TEMPLATE_NAMES.index("w[0]")] == PAD_ID  # "she" unseen
    assert ids[1, TEMPLATE_NAMES.index("w[0]")] == vocab.attributes.index("w[0]=reckons")
    assert (ids[:, 0] == vocab.attributes.index("bias")).all()


def test_state_dict_round_trip(train: list[Sentence]) -> None:
    vocab = AttributeVocabulary().fit(train[:100], min_count=2)
    state = json.loads(json.dumps(vocab.state_dict()))
    restored = AttributeVocabulary.from_state_dict(state)
    assert restored.attributes == vocab.attributes
    assert torch.equal(restored.transform(train[200]), vocab.transform(train[200]))
    with pytest.raises(ValueError, match="templates"):
        AttributeVocabulary.from_state_dict({**state, "templates": ["bias"]})


def test_transform_batch_pads(train: list[Sentence]) -> None:
    vocab = AttributeVocabulary().fit(train[:20])
    batch = [train[0], HAND, train[1]]
    ids, lengths = vocab.transform_batch(batch)
    assert lengths.tolist() == [len(s) for s in batch]
    assert ids.shape == (3, max(map(len, batch)), NUM_TEMPLATES)
    for b, sentence in enumerate(batch):
        assert torch.equal(ids[b, : len(sentence)], vocab.transform(sentence))
        assert (ids[b, len(sentence) :] == PAD_ID).all()


def test_feature_bad_inputs() -> None:
    with pytest.raises(ValueError, match="empty"):
        AttributeVocabulary().fit([])
    with pytest.raises(ValueError, match="min_count"):
        AttributeVocabulary().fit([HAND], min_count=0)
    with pytest.raises(ValueError, match="empty"):
        pad_attribute_ids([])
    narrow, wide = torch.zeros(2, 3, dtype=torch.long), torch.zeros(2, 4, dtype=torch.long)
    with pytest.raises(ValueError, match="sharing A"):
        pad_attribute_ids([narrow, wide])


@pytest.mark.slow
def test_full_train_attribute_count(train: list[Sentence]) -> None:
    """324,344 attributes at min_count=1; 74,659 at min_count=3, which (with the ``bias``
    attribute as unary bias, plus start/end biases) gives the BCFW paper's d = 1,643,026."""
    assert len(AttributeVocabulary().fit(train)) == 324_344
    frequent = AttributeVocabulary().fit(train, min_count=3)
    assert len(frequent) == 74_659
    assert len(frequent) * 22 + 22 * 22 + 2 * 22 == 1_643_026


# --------------------------------------------------------------------------- metrics


@pytest.mark.parametrize(
    ("tags", "chunks"),
    [
        (["B-NP", "I-NP", "O", "B-VP"], {("NP", 0, 2), ("VP", 3, 4)}),
        (["O", "I-NP", "I-NP", "O"], {("NP", 1, 3)}),  # I- after O starts a chunk (IOB1)
        (["I-NP"], {("NP", 0, 1)}),  # I- at sentence start
        (["B-NP", "I-VP", "I-VP"], {("NP", 0, 1), ("VP", 1, 3)}),  # type change
        (["I-NP", "B-NP", "I-NP"], {("NP", 0, 1), ("NP", 1, 3)}),  # B- splits same type
        (["B-PP", "B-PP", "O", "O"], {("PP", 0, 1), ("PP", 1, 2)}),
        (["O", "O"], set()),
        ([], set()),
    ],
)
def test_extract_chunks(tags: list[str], chunks: set[tuple[str, int, int]]) -> None:
    assert extract_chunks(tags) == chunks


def test_chunk_f1_known_values() -> None:
    true = [["B-NP", "I-NP", "O", "B-VP", "B-NP"], ["B-PP", "B-NP", "I-NP"]]
    pred = [["B-NP", "O", "O", "B-VP", "B-NP"], ["B-PP", "B-NP", "B-NP"]]
    # true: NP(0,2) VP NP(4,5) | PP NP(1,3) = 5; pred: NP(0,1) VP NP(4,5) | PP NP NP = 6
    scores = chunk_f1(true, pred)
    assert (scores["n_true"], scores["n_pred"], scores["n_correct"]) == (5, 6, 3)
    assert scores["precision"] == pytest.approx(3 / 6)
    assert scores["recall"] == pytest.approx(3 / 5)
    assert scores["f1"] == pytest.approx(2 * 0.5 * 0.6 / 1.1)
    assert set(scores["per_type"]) == {"NP", "PP", "VP"}
    assert scores["per_type"]["NP"]["precision"] == pytest.approx(1 / 4)
    assert scores["per_type"]["NP"]["recall"] == pytest.approx(1 / 3)
    assert scores["per_type"]["VP"]["f1"] == 1.0


def test_chunk_f1_iob1_reading_and_extremes() -> None:
    true = [["O", "I-NP", "I-NP", "I-VP"]]
    assert chunk_f1(true, [["O", "B-NP", "I-NP", "B-VP"]])["f1"] == 1.0  # same chunks
    perfect = chunk_f1(true, true)
    assert (perfect["precision"], perfect["recall"], perfect["f1"]) == (1.0, 1.0, 1.0)
    all_o = chunk_f1(true, [["O"] * 4])
    assert (all_o["precision"], all_o["recall"], all_o["f1"], all_o["n_pred"]) == (0, 0, 0, 0)
    wrong_type = chunk_f1([["B-NP"]], [["B-VP"]])
    assert wrong_type["f1"] == 0.0 and set(wrong_type["per_type"]) == {"NP", "VP"}


def test_chunk_f1_bad_inputs() -> None:
    with pytest.raises(ValueError, match="at least one sentence"):
        chunk_f1([], [])
    with pytest.raises(ValueError, match="2 sentences"):
        chunk_f1([["O"], ["O"]], [["O"]])
    with pytest.raises(ValueError, match="sentence 1: 2 true tags but 1 predicted"):
        chunk_f1([["O"], ["O", "O"]], [["O"], ["O"]])
    with pytest.raises(TypeError, match="string"):
        chunk_f1(["B-NP"], ["B-NP"])  # type: ignore[list-item]
    with pytest.raises(ValueError, match="bad chunk tag 'NP'"):
        chunk_f1([["NP"]], [["O"]])
    with pytest.raises(ValueError, match="bad chunk tag 'E-NP'"):
        extract_chunks(["E-NP"])


def test_gold_test_split_scores_perfectly(test_split: list[Sentence]) -> None:
    gold = [list(sentence.chunks) for sentence in test_split]
    scores = chunk_f1(gold, gold)
    assert scores["n_true"] == 23_852 and scores["f1"] == 1.0  # conlleval: 23852 phrases


def test_chunk_f1_matches_seqeval() -> None:
    metrics = pytest.importorskip("seqeval.metrics")
    rng = random.Random(0)
    tags = ["O", "B-NP", "I-NP", "B-VP", "I-VP", "B-PP", "I-PP"]
    true, pred = [], []
    for _ in range(300):
        length = rng.randint(1, 12)
        true.append([rng.choice(tags) for _ in range(length)])
        pred.append([rng.choice(tags) for _ in range(length)])
    ours = chunk_f1(true, pred)
    assert ours["precision"] == pytest.approx(metrics.precision_score(true, pred))
    assert ours["recall"] == pytest.approx(metrics.recall_score(true, pred))
    assert ours["f1"] == pytest.approx(metrics.f1_score(true, pred))
    report = metrics.classification_report(true, pred, output_dict=True)
    for chunk_type, scores in ours["per_type"].items():
        assert scores["f1"] == pytest.approx(report[chunk_type]["f1-score"])
        assert scores["n_true"] == report[chunk_type]["support"]
    for sentence in true[:50]:
        seqeval_chunks = metrics.sequence_labeling.get_entities(sentence)
        assert extract_chunks(sentence) == {(t, s, e + 1) for t, s, e in seqeval_chunks}
