"""Files written and read by the library: atomic saves and loads that never execute code.

* :func:`atomic_save` / :func:`atomic_write_text` write a temporary file beside the destination, fsync it and
  ``os.replace`` it: a kill leaves the previous complete file or the new one, never a truncated one.
* :func:`load_checked` reads with ``weights_only=True``: only tensors and plain containers come out.
* :func:`to_plain` turns numpy arrays and scalars into tensors and Python numbers (bit for bit), so every saved
  state loads with ``weights_only=True``.
"""
from __future__ import annotations

import contextlib
import os
import pickle
import tempfile
import zipfile
from pathlib import Path

import numpy as np
import torch

from .pickle_stream import NODES_FIXED, NODES_PER_BYTE, TENSOR_BYTES_PER_BYTE, check_torch_archive

__all__ = ["atomic_save", "atomic_write_stream", "atomic_write_text", "load_checked", "to_plain", "UnsafeFileError"]


class UnsafeFileError(ValueError):
    """A file holds something other than tensors and plain containers (it would run code to load)."""


def to_plain(obj):
    """A copy of ``obj`` in which numpy arrays are CPU tensors and numpy scalars Python numbers (containers copied
    recursively, tensors detached CPU clones, other values kept)."""
    if isinstance(obj, dict):
        return {k: to_plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(to_plain(v) for v in obj)
    if isinstance(obj, np.ndarray):
        return torch.from_numpy(np.array(obj, copy=True))
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, torch.Tensor):
        return obj.detach().cpu().clone()
    return obj


def _fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:  # not supported (e.g. some network file systems)
        return
    try:
        with contextlib.suppress(OSError):
            os.fsync(fd)
    finally:
        os.close(fd)


def _umask() -> int:
    """The process' umask, read from ``/proc`` where possible (setting it to read it would briefly affect other
    threads)."""
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _file_mode(path: Path) -> int:
    """Permission bits for the file written at ``path``: those of the file it replaces, else ``0o666`` less the umask
    (as ``open`` gives, where ``mkstemp`` alone would give ``0o600``)."""
    try:
        return path.stat().st_mode & 0o777
    except OSError:
        return 0o666 & ~_umask()


def check_writable_file(path, what: str = "file") -> Path:
    """``path`` as a ``Path`` once it can be written (not a folder; its nearest existing ancestor a writable folder),
    else ``IsADirectoryError`` / ``NotADirectoryError`` / ``PermissionError`` naming it."""
    path = Path(path)
    if path.is_dir():
        raise IsADirectoryError(f"the {what} {path} is a folder: give the path of a file in it")
    anc = path.parent
    while not anc.exists() and anc != anc.parent:
        anc = anc.parent
    if not anc.is_dir():
        raise NotADirectoryError(f"cannot write the {what} {path}: {anc} is not a folder")
    if not os.access(anc, os.W_OK | os.X_OK):
        raise PermissionError(f"cannot write the {what} {path}: no write permission in {anc}")
    return path


def _atomic(path, write) -> None:
    path = check_writable_file(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    mode = _file_mode(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.chmod(tmp, mode)
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except (OSError, RuntimeError) as exc:  # a full disk, a file-size limit: torch's zip writer raises RuntimeError
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc).strip().splitlines()[0]
        raise OSError(f"cannot write {path}: {reason} (is the disk full, or the file size limited?); the previous "
                      "file, if any, is unchanged") from None
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    _fsync_dir(path.parent)


def atomic_save(obj, path) -> None:
    """``torch.save(obj, path)`` atomically (temporary file in the same folder, fsync, ``os.replace``)."""
    _atomic(path, lambda f: torch.save(obj, f))


def atomic_write_stream(path, write) -> None:
    """``write(f)`` into a binary file ``f`` that then replaces ``path`` atomically (e.g. a figure's ``savefig``)."""
    _atomic(path, write)


def atomic_write_text(path, text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` atomically."""
    data = text.encode("utf-8")
    _atomic(path, lambda f: f.write(data))


def load_checked(path, map_location="cpu", what: str = "file"):
    """``torch.load(path, weights_only=True)`` with clear errors.

    Raises:
        FileNotFoundError: no file at ``path``.
        UnsafeFileError: the file holds objects other than tensors and plain containers (nothing was run).
        ValueError: the file is not a torch save, or its objects would take far more memory than its bytes
            (:func:`_check_archive`; :func:`~torch_bcfw.io.pickle_stream.check_torch_archive` before anything is
            built; :func:`_check_expansion`).
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{what} {path} not found")
    if not zipfile.is_zipfile(path):  # torch.save writes a zip archive (since torch 1.6)
        raise ValueError(f"{path} is not a readable {what}: not a zip archive written by torch.save")
    size = path.stat().st_size
    _check_archive(path, size, what)
    check_torch_archive(path, size, unsafe=UnsafeFileError)
    try:
        obj = torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as exc:
        first = str(exc).strip().splitlines()
        detail = next((ln.strip() for ln in first if "GLOBAL" in ln or "Unsupported" in ln), first[0] if first else "")
        raise UnsafeFileError(
            f"refusing to load {path}: it holds objects other than tensors and plain containers, which could run "
            f"code when unpickled (loaded with weights_only=True; nothing was run). Detail: {detail}"
        ) from None
    except (RuntimeError, EOFError, OSError, ValueError) as exc:
        raise ValueError(f"{path} is not a readable {what} (truncated or not written by torch.save): {exc}") from None
    _check_expansion(obj, size, f"{path} ({what})")
    return obj


#: the budget of a loaded file's objects: entries of containers (shared ones counted each time they are reached)
#: per byte of the file plus a fixed allowance, nesting depth, and tensor bytes per byte of the file (the same
#: budget the pickle stream is held to before loading, :mod:`torch_bcfw.io.pickle_stream`)
LOAD_NODES_PER_BYTE, LOAD_NODES_FIXED, LOAD_MAX_DEPTH, LOAD_TENSOR_BYTES_PER_BYTE = (NODES_PER_BYTE, NODES_FIXED, 64,
                                                                                    TENSOR_BYTES_PER_BYTE)


def _check_archive(path: Path, size: int, what: str) -> None:
    """torch.save stores its records uncompressed: a compressed record (which could expand far beyond the file) or
    records larger than the file refuse it before anything is read."""
    try:
        with zipfile.ZipFile(path) as z:
            infos = z.infolist()
    except (zipfile.BadZipFile, OSError, ValueError) as exc:
        raise ValueError(f"{path} is not a readable {what}: {exc}") from None
    if any(i.compress_type != zipfile.ZIP_STORED for i in infos) or sum(i.file_size for i in infos) > size:
        raise ValueError(f"{path} is not a readable {what}: its records are compressed or larger than the file "
                         "(torch.save stores them as they are)")


def _tensor_parts(t: torch.Tensor) -> list:
    """The strided tensors a sparse tensor is made of (``[]`` for a strided tensor itself)."""
    if t.layout == torch.sparse_coo:
        return [t._indices(), t._values()]
    if t.layout == torch.sparse_csr:
        return [t.crow_indices(), t.col_indices(), t.values()]
    raise ValueError(f"a tensor of layout {t.layout}")


def _check_expansion(obj, size: int, where: str) -> None:
    """Refuse loaded objects that would take far more memory or time than the file's ``size`` bytes: a tensor viewing
    more elements than its storage, tensors above ``LOAD_TENSOR_BYTES_PER_BYTE`` times the file, more container
    entries than the budget (shared containers counted each time reached) or nesting deeper than ``LOAD_MAX_DEPTH``."""
    nodes_left = LOAD_NODES_FIXED + int(size * LOAD_NODES_PER_BYTE)
    tensor_left = LOAD_TENSOR_BYTES_PER_BYTE * size + 2**20
    stack = [(obj, 0)]
    while stack:
        o, depth = stack.pop()
        nodes_left -= 1
        if nodes_left < 0:
            raise ValueError(f"{where}: more entries than a file of {size} bytes holds (shared references); refused")
        if depth > LOAD_MAX_DEPTH:
            raise ValueError(f"{where}: nested deeper than {LOAD_MAX_DEPTH} levels; refused")
        if isinstance(o, torch.Tensor):
            if o.layout != torch.strided:
                try:
                    stack.extend((p, depth + 1) for p in _tensor_parts(o))
                except ValueError as exc:
                    raise ValueError(f"{where}: {exc}, which no saved run holds") from None
                continue
            nbytes = o.numel() * o.element_size()
            if nbytes > o.untyped_storage().nbytes():
                raise ValueError(f"{where}: a tensor of shape {tuple(o.shape)} views more elements than its storage "
                                 "holds (a zero-stride or overlapping view); refused")
            tensor_left -= nbytes
            if tensor_left < 0:
                raise ValueError(f"{where}: its tensors hold more than {LOAD_TENSOR_BYTES_PER_BYTE}x the file's {size} "
                                 "bytes (views of shared storage); refused")
        elif isinstance(o, dict):
            for k, v in o.items():
                stack.append((k, depth + 1))
                stack.append((v, depth + 1))
        elif isinstance(o, (list, tuple, set, frozenset)):
            stack.extend((v, depth + 1) for v in o)
