"""CoNLL-2000 text chunking (Tjong Kim Sang & Buchholz, 2000).

The corpus is one token per line, ``word POS chunk-tag``, with a blank line between
sentences. Train: 8936 sentences / 211,727 tokens; test: 2012 sentences / 47,377 tokens.

The loader accepts the NLTK packaging (``conll2000.zip`` holding ``conll2000/train.txt`` and
``conll2000/test.txt``) or the extracted text files; see :func:`load_conll2000`.
"""

from __future__ import annotations

import io
import os
import zipfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

__all__ = ["CHUNK_TAGS", "SPLITS", "Sentence", "load_conll2000", "parse_conll"]

#: The 22 chunk tags of the CoNLL-2000 *training* split, sorted (B-/I- prefixes for 11 chunk types, plus ``O``).
#: The test split also contains ``I-LST`` (2 tokens), which a model over this label set can never predict.
CHUNK_TAGS: tuple[str, ...] = (
    "B-ADJP", "B-ADVP", "B-CONJP", "B-INTJ", "B-LST", "B-NP", "B-PP", "B-PRT", "B-SBAR",
    "B-UCP", "B-VP", "I-ADJP", "I-ADVP", "I-CONJP", "I-INTJ", "I-NP", "I-PP", "I-PRT",
    "I-SBAR", "I-UCP", "I-VP", "O",
)  # fmt: skip

SPLITS: tuple[str, ...] = ("train", "test")

_ZIP_NAME = "conll2000.zip"
_HOW_TO_GET = (
    "Get the data from NLTK's 'conll2000' corpus (python -m nltk.downloader conll2000, or the "
    "zip at https://raw.githubusercontent.com/nltk/nltk_data/gh-pages/packages/corpora/"
    "conll2000.zip) or from the CoNLL-2000 shared task page "
    "(https://www.clips.uantwerpen.be/conll2000/chunking/: train.txt.gz, test.txt.gz, "
    "gunzipped), and pass the zip file or the folder holding it or the .txt files."
)


@dataclass(frozen=True)
class Sentence:
    """One chunk-annotated sentence; the three tuples (lists are accepted) all have length ``T >= 1``."""

    words: tuple[str, ...]
    pos: tuple[str, ...]
    chunks: tuple[str, ...]

    def __post_init__(self) -> None:
        for name in ("words", "pos", "chunks"):
            object.__setattr__(self, name, tuple(getattr(self, name)))
        lengths = {len(self.words), len(self.pos), len(self.chunks)}
        if len(lengths) != 1:
            raise ValueError(f"Sentence fields differ in length: words={len(self.words)}, pos={len(self.pos)}, "
                             f"chunks={len(self.chunks)}")
        if not self.words:
            raise ValueError("Sentence must have at least one token")

    def __len__(self) -> int:
        return len(self.words)


def parse_conll(lines: Iterable[str], source: str = "<lines>") -> list[Sentence]:
    """Parse ``word POS chunk`` lines (blank line between sentences) into sentences.

    ``source`` only names the input in error messages. Raises ``ValueError`` on a line that
    does not have exactly three whitespace-separated fields.
    """
    sentences: list[Sentence] = []
    rows: list[list[str]] = []
    for line_no, line in enumerate(lines, start=1):
        fields = line.split()
        if fields:
            if len(fields) != 3:
                raise ValueError(f"{source}:{line_no}: expected 'word POS chunk-tag', got {line.rstrip()!r}")
            rows.append(fields)
        elif rows:
            sentences.append(Sentence(*zip(*rows)))
            rows = []
    if rows:
        sentences.append(Sentence(*zip(*rows)))
    return sentences


def load_conll2000(path: str | os.PathLike[str], split: str = "train") -> list[Sentence]:
    """Load one split of CoNLL-2000 as a list of :class:`Sentence`.

    ``path`` may be the ``conll2000.zip`` file itself, or a directory holding ``<split>.txt``,
    ``conll2000/<split>.txt``, ``conll2000.zip`` or ``corpora/conll2000.zip`` (the NLTK_DATA
    layout); candidates are tried in that order. Raises ``FileNotFoundError`` naming every
    place looked at, and ``ValueError`` for an unknown ``split``.
    """
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    root = Path(path)
    if root.is_file():
        return _load_from_zip(root, split)
    candidates = [root / f"{split}.txt", root / "conll2000" / f"{split}.txt", root / _ZIP_NAME,
                  root / "corpora" / _ZIP_NAME]
    for candidate in candidates:
        if candidate.is_file():
            if candidate.suffix == ".zip":
                return _load_from_zip(candidate, split)
            with candidate.open(encoding="utf-8") as handle:
                return parse_conll(handle, source=str(candidate))
    looked = "\n".join(f"  {place}" for place in [root, *candidates])
    raise FileNotFoundError(f"CoNLL-2000 {split!r} split not found. Looked at:\n{looked}\n{_HOW_TO_GET}")


def load_conll2000_splits(path, limit: int | None = None, test_limit: int | None = None) -> tuple[list, list]:
    """``(train, test)`` sentences of :func:`load_conll2000`, the first ``limit`` / ``test_limit`` of each if given."""
    train, test = load_conll2000(path, split="train"), load_conll2000(path, split="test")
    return train[: None if limit is None else int(limit)], test[: None if test_limit is None else int(test_limit)]


def _load_from_zip(zip_path: Path, split: str) -> list[Sentence]:
    if not zipfile.is_zipfile(zip_path):
        raise ValueError(f"{zip_path} is not a zip file; pass the zip or a directory")
    filename = f"{split}.txt"
    with zipfile.ZipFile(zip_path) as archive:
        member = next((n for n in (f"conll2000/{filename}", filename) if n in archive.namelist()), None)
        if member is None:
            raise FileNotFoundError(f"{archive.filename} holds neither conll2000/{filename} nor {filename}. "
                                    f"{_HOW_TO_GET}")
        with archive.open(member) as raw:
            return parse_conll(io.TextIOWrapper(raw, encoding="utf-8"), source=f"{zip_path}:{member}")
