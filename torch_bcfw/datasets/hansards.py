"""English-French Hansards word alignment: the HLT-NAACL 2003 shared-task gold set (Mihalcea & Pedersen 2003),
the data of Taskar, Lacoste-Julien & Klein (2005) and of the BCFW paper's matching task.

Layout of the folder ``root`` passed to :func:`load_hansards`::

    root/test/test.e, test.f, test.align       447 gold-aligned sentence pairs
    root/dev/trial.e, trial.f, trial.align     37 trial pairs (gold-aligned as well)
    root/train/*.e, *.f                        unlabelled parallel text (same stems, one sentence per line)

``*.e`` / ``*.f`` of the gold and trial sets hold one ``<s snum=NNNN> tokens ... </s>`` line per sentence (UTF-8,
already tokenised); the ``.align`` files hold one line per pair of space-separated links ``fpos-epos`` (a *sure*
link) or ``fpos-epos-P`` (a *possible* link), 0-based, **French position first**.  The unlabelled files are
plain tokenised lines (line ``t`` of ``X.e`` translates line ``t`` of ``X.f``).

Links are returned in the (English, French) orientation: ``(j, k)`` links English word ``j`` to French word ``k``;
``SentencePair.possible`` is AER's ``P``, the possible links *and* the sure ones.

Protocol (Taskar et al. 2005; the BCFW paper's 347 gold test pairs): train on gold pairs 1-100, choose settings
on the 37 trial pairs, test on gold pairs 101-447 (:func:`hansards_split`).  Data: the HLT-NAACL 2003 workshop
on parallel texts, http://web.eecs.umich.edu/~mihalcea/wpt/.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np
import torch

__all__ = ["SentencePair", "HansardsCorpus", "HansardsSplit", "load_hansards", "hansards_split", "read_sentences",
           "read_links", "read_unlabelled", "matching_target", "N_TRAIN", "HansardsProblem", "load_hansards_problem",
           "alignment_data"]

#: gold pairs used for training by the protocol (the rest, 347, are the test set)
N_TRAIN = 100
_HOW_TO_GET = ("get the HLT-NAACL 2003 English-French Hansards alignment data (trial and test sets with their .align "
               "files, plus the unlabelled training text) from http://web.eecs.umich.edu/~mihalcea/wpt/ and pass the "
               "folder holding test/, dev/ and train/")
_SENT = re.compile(r"^\s*<s snum=(\d+)>(.*)</s>\s*$")
_LINK = re.compile(r"^(\d+)-(\d+)(-P)?$")


@dataclass(frozen=True)
class SentencePair:
    """One English-French sentence pair: ``snum`` (the ``snum`` attribute; the line number for unlabelled text),
    the ``english`` and ``french`` tokens, the ``sure`` links ``(j, k)`` (English ``j``, French ``k``) and the
    ``possible`` ones including the sure ones (AER's ``P``), both ``None`` for unlabelled pairs."""

    snum: int
    english: tuple[str, ...]
    french: tuple[str, ...]
    sure: frozenset | None = None
    possible: frozenset | None = None

    @property
    def sizes(self) -> tuple[int, int]:
        return len(self.english), len(self.french)

    def text_only(self) -> "SentencePair":
        """The same pair without its links."""
        return SentencePair(self.snum, self.english, self.french)


@dataclass
class HansardsCorpus:
    """The three parts of the data: ``gold`` (447), ``trial`` (37), ``unlabelled`` (2,383 pairs)."""

    gold: list
    trial: list
    unlabelled: list = field(default_factory=list)
    root: Path | None = None

    def texts(self) -> list:
        """Every pair's text (unlabelled, gold and trial; links dropped): the corpus the features are built from."""
        return [p.text_only() for p in (*self.unlabelled, *self.gold, *self.trial)]


@dataclass
class HansardsSplit:
    """The protocol split: ``train`` = gold 1-100, ``trial`` = the 37 trial pairs, ``test`` = gold 101-447."""

    train: list
    trial: list
    test: list


def _need(path: Path, what: str) -> Path:
    if not path.is_file():
        raise FileNotFoundError(f"Hansards {what} not found: looked for {path}; {_HOW_TO_GET}")
    return path


def read_sentences(path) -> list:
    """``[(snum, tokens)]`` from a ``<s snum=NNNN> ... </s>`` file (``ValueError`` naming the line otherwise)."""
    path = Path(path)
    out = []
    with open(_need(path, "sentence file"), encoding="utf-8") as fh:
        for t, line in enumerate(fh, 1):
            if not line.strip():
                continue
            m = _SENT.match(line)
            if m is None:
                raise ValueError(f"{path}:{t}: expected '<s snum=NNNN> tokens ... </s>', got {line.strip()[:80]!r}")
            tokens = tuple(m.group(2).split())
            if not tokens:
                raise ValueError(f"{path}:{t}: sentence {m.group(1)} is empty")
            out.append((int(m.group(1)), tokens))
    if not out:
        raise ValueError(f"{path}: no sentences")
    return out


def read_links(path, sizes) -> list:
    """``[(sure, possible)]`` per line of an ``.align`` file, in (English, French) orientation (``possible``
    includes the sure links).  ``sizes[t] = (m, f)`` are the lengths of pair ``t``; a link outside them, a malformed
    token or a line count other than ``len(sizes)`` raises ``ValueError`` naming the file and line."""
    path = Path(path)
    with open(_need(path, "alignment file"), encoding="utf-8") as fh:
        lines = fh.read().split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    if len(lines) != len(sizes):
        raise ValueError(f"{path}: {len(lines)} alignment lines but {len(sizes)} sentence pairs")
    out = []
    for t, (line, (m, f)) in enumerate(zip(lines, sizes), 1):
        sure, possible = set(), set()
        for tok in line.split():
            mt = _LINK.match(tok)
            if mt is None:
                raise ValueError(f"{path}:{t}: malformed link {tok!r} (expected fpos-epos or fpos-epos-P, 0-based)")
            k, j = int(mt.group(1)), int(mt.group(2))
            if j >= m or k >= f:
                raise ValueError(f"{path}:{t}: link {tok!r} is outside the pair (English length {m}, French length "
                                 f"{f}; links are fpos-epos, 0-based)")
            (possible if mt.group(3) else sure).add((j, k))
        out.append((frozenset(sure), frozenset(possible | sure)))
    return out


def _gold(root: Path, folder: str, stem: str) -> list:
    base = root / folder / stem
    e = read_sentences(Path(f"{base}.e"))
    f = read_sentences(Path(f"{base}.f"))
    if len(e) != len(f):
        raise ValueError(f"{base}.e has {len(e)} sentences but {base}.f has {len(f)}")
    for (se, _), (sf, _) in zip(e, f):
        if se != sf:
            raise ValueError(f"{base}.e and {base}.f disagree: sentence {se} faces sentence {sf}")
    links = read_links(Path(f"{base}.align"), [(len(a), len(b)) for (_, a), (_, b) in zip(e, f)])
    return [SentencePair(s, a, b, sure, pos) for (s, a), (_, b), (sure, pos) in zip(e, f, links)]


def _lines(path: Path) -> list[str]:
    """The lines of a text file, trailing blank lines dropped."""
    lines = path.read_text(encoding="utf-8").split("\n")
    while lines and not lines[-1].strip():
        lines.pop()
    return lines


def read_unlabelled(folder) -> list:
    """The pairs of every ``X.e`` / ``X.f`` file pair in ``folder`` (files sorted by name; empty lines skipped)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"Hansards unlabelled text not found: looked for the folder {folder}; {_HOW_TO_GET}")
    stems = sorted(p.with_suffix("") for p in folder.glob("*.e"))
    if not stems:
        raise FileNotFoundError(f"Hansards unlabelled text not found: no *.e files in {folder}; {_HOW_TO_GET}")
    out = []
    for stem in stems:
        fe, ff = Path(f"{stem}.e"), _need(Path(f"{stem}.f"), "unlabelled French file")
        le, lf = _lines(fe), _lines(ff)
        if len(le) != len(lf):
            raise ValueError(f"{fe} has {len(le)} lines but {ff} has {len(lf)}: the files must be line-aligned")
        for t, (a, b) in enumerate(zip(le, lf), 1):
            a, b = tuple(a.split()), tuple(b.split())
            if a and b:
                out.append(SentencePair(t, a, b))
    return out


def load_hansards(root, unlabelled: bool = True) -> HansardsCorpus:
    """Read the gold (447 pairs), trial (37) and (``unlabelled=True``) unlabelled (2,383) parts from ``root``.
    Raises ``FileNotFoundError`` naming the missing folder or file and ``ValueError`` for malformed sentences or
    links (file and line named)."""
    if root is None:
        raise ValueError(f"load_hansards needs the data folder; {_HOW_TO_GET}")
    root = Path(root).expanduser()
    if not root.is_dir():
        raise FileNotFoundError(f"Hansards alignment data not found: {root} is not a folder; {_HOW_TO_GET}")
    gold = _gold(root, "test", "test")
    trial = _gold(root, "dev", "trial")
    rest = read_unlabelled(root / "train") if unlabelled else []
    return HansardsCorpus(gold, trial, rest, root)


def hansards_split(corpus: HansardsCorpus, n_train: int = N_TRAIN) -> HansardsSplit:
    """The protocol: gold pairs ``1..n_train`` train, the trial pairs choose settings, the other gold pairs test."""
    if not 0 < n_train < len(corpus.gold):
        raise ValueError(f"n_train must lie in [1, {len(corpus.gold) - 1}], got {n_train}")
    return HansardsSplit(list(corpus.gold[:n_train]), list(corpus.trial), list(corpus.gold[n_train:]))


def matching_target(pair: SentencePair) -> np.ndarray:
    """The training labeling of a gold pair: a largest one-to-one subset of its **sure** links (``int64 [m, f]``).

    Gold sure links may give a word several partners, but the SSVM's truth must be a matching: this keeps a
    maximum-cardinality matching of the sure links, ties broken towards the smallest relative-position distortion
    (the assignment maximises ``#links - eps * sum distortion``).  Possible links never enter the target.
    """
    from scipy.optimize import linear_sum_assignment

    if pair.sure is None:
        raise ValueError(f"pair {pair.snum} has no gold links")
    m, f = pair.sizes
    y = np.zeros((m, f), dtype=np.int64)
    if not pair.sure:
        return y
    W = np.zeros((m, f))
    eps = 1.0 / (4 * (m + f))  # total distortion penalty < 1/2: never trades a link away
    for j, k in pair.sure:
        W[j, k] = 1.0 - eps * abs((j + 0.5) / m - (k + 0.5) / f)
    r, c = linear_sum_assignment(W, maximize=True)
    keep = W[r, c] > 0
    y[r[keep], c[keep]] = 1
    return y


@dataclass
class HansardsProblem:
    """The Hansards matching problem of the protocol: model, ``MatchingData`` of each part, and the featurizer."""

    model: object
    train: object
    trial: object
    test: object
    featurizer: object
    split: HansardsSplit
    corpus: HansardsCorpus


def load_hansards_problem(root, n_train: int = N_TRAIN, miss_cost: float = 3.0, extra_cost: float = 1.0,
                          normalize: str = "words", ibm_iterations: int = 5, diagonal_tension: float = 4.0,
                          hmm_iterations: int = 5, unlabelled: bool = True, progress: bool = False) -> HansardsProblem:
    """Load the data, fit the text features on every pair's text (never their links), and build the
    :class:`~torch_bcfw.models.matching.Matching` model and its train / trial / test data.  ``progress``: a
    "preparing features" bar on stderr when the work takes over 2 s."""
    from ..features.alignment import AlignmentFeaturizer
    from ..models.matching import Matching
    from ..runtime.progress import StageBar

    featurizer = AlignmentFeaturizer(ibm_iterations=ibm_iterations, diagonal_tension=diagonal_tension,
                                     hmm_iterations=hmm_iterations)
    parts = ("train", "trial", "test")
    with StageBar(["read", *featurizer.fit_stages(), *(f"features {p}" for p in parts)], progress) as bar:
        corpus = load_hansards(root, unlabelled=unlabelled)
        split = hansards_split(corpus, n_train)
        bar.done("read")
        featurizer.fit(corpus.texts(), on_stage=bar.done)
        data = {}
        for part in parts:
            data[part] = alignment_data(getattr(split, part), featurizer)
            bar.done(f"features {part}")
    model = Matching(featurizer.n_features, miss_cost=miss_cost, extra_cost=extra_cost, normalize=normalize)
    return HansardsProblem(model, data["train"], data["trial"], data["test"], featurizer, split, corpus)


def alignment_data(pairs: Sequence, featurizer, labels: bool = True):
    """A :class:`~torch_bcfw.data.matching.MatchingData` of ``pairs`` with the link features of a fitted
    :class:`~torch_bcfw.features.alignment.AlignmentFeaturizer`.  With ``labels`` (and gold links on every pair)
    ``y`` is :func:`matching_target` and ``sure`` / ``possible`` keep the full gold sets for AER.
    """
    from ..data.matching import MatchingData

    xs = featurizer.transform(pairs)
    if not labels or any(p.sure is None for p in pairs):
        return MatchingData.from_pairs(xs)
    ys = [torch.from_numpy(matching_target(p)) for p in pairs]
    sure = [_link_mask(p.sure, p.sizes) for p in pairs]
    possible = [_link_mask(p.possible, p.sizes) for p in pairs]
    return MatchingData.from_pairs(xs, ys, sure, possible)


def _link_mask(links, sizes: tuple[int, int]) -> torch.Tensor:
    """bool ``[m, f]``, True at the links ``(j, k)``."""
    mask = torch.zeros(sizes, dtype=torch.bool)
    for j, k in links:
        mask[j, k] = True
    return mask
