"""Atomic writes: :func:`atomic_write_stream` / :func:`atomic_write_text` write a temporary file beside the
destination, fsync it and ``os.replace`` it, so that a kill leaves the previous complete file or the new one, never a
truncated one; :func:`check_writable_file` refuses a destination that cannot be written before any work is done."""
from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

__all__ = ["atomic_write_stream", "atomic_write_text", "check_writable_file"]


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
    except OSError as exc:  # a full disk, a file-size limit
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        reason = exc.strerror or (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        err = OSError(f"cannot write {path}: {reason} (is the disk full, or the file size limited?); the previous "
                      "file, if any, is unchanged")
        err.errno = exc.errno  # a caller tells a full disk (ENOSPC, EFBIG, EDQUOT) from other failures
        raise err from None
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    _fsync_dir(path.parent)


def atomic_write_stream(path, write) -> None:
    """``write(f)`` into a binary file ``f`` that then replaces ``path`` atomically (e.g. a figure's ``savefig``)."""
    _atomic(path, write)


def atomic_write_text(path, text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` atomically."""
    data = text.encode("utf-8")
    _atomic(path, lambda f: f.write(data))
