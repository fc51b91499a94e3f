"""One run per output folder: :func:`claim_output` locks a folder for the process that writes a run there.

The lock is an advisory ``flock`` on ``FOLDER/.torch-bcfw.lock``, which holds the owner (pid, host, start time).  The
kernel releases it when its process ends, however it ends (a SIGKILL included), so a folder is free again as soon as
its run is gone; the file itself stays (removing it would let two later runs lock two different files).  A second
run refuses with one line naming the live one, and deletes nothing; the owner of the lock may remove the temporary
files that a killed run left behind, since no live run can be writing them.  Someone may still delete the lock file
and let a second run in: :meth:`OutputClaim.check` (before every save) then stops the first run, which no longer
holds the file at the path.

A folder holding a finished run or a resumable checkpoint is continued only with ``resume`` and replaced only with
``overwrite``, which writes into the fresh sibling :func:`overwrite_folder` and swaps it with the folder in one
``renameat2(RENAME_EXCHANGE)`` when the ``with`` block ends (an exception removes the sibling instead), so that the
folder holds one complete run or the other at every moment.  A sibling that a killed run left is removed by the next
claim of the folder.
"""
from __future__ import annotations

import contextlib
import ctypes
import datetime
import fcntl
import json
import os
import shutil
import socket
from pathlib import Path

__all__ = ["OutputFolderBusy", "OutputClaim", "claim_output", "overwrite_folder", "LOCK_NAME"]

#: the lock file of an output folder
LOCK_NAME = ".torch-bcfw.lock"


class OutputFolderBusy(ValueError):
    """Another live run holds the output folder, or may have taken it from this one."""


def overwrite_folder(folder) -> Path:
    """The sibling an ``overwrite`` claim of ``folder`` writes into: ``runs/ocr`` -> ``runs/ocr.tmp-overwrite``."""
    folder = Path(folder).resolve()
    return folder.with_name(f"{folder.name}.tmp-overwrite")


def _owner_text(raw: str) -> str:
    try:
        d = json.loads(raw)
        return f"pid {int(d['pid'])} on {d['host']}, started {d['start']}"
    except (ValueError, KeyError, TypeError):
        return "owner unknown"


def _lock(folder: Path) -> int:
    """An open descriptor of ``folder``'s lock file, locked by this process (``OutputFolderBusy`` naming the owner)."""
    path = folder / LOCK_NAME
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        with open(path, encoding="utf-8", errors="replace") as f:
            owner = _owner_text(f.read(4096))
        raise OutputFolderBusy(f"the output folder {folder} is in use by a live run ({owner}): wait for it to end "
                               "or give another output folder") from None
    return fd


class OutputClaim:
    """An output folder held by this process: :attr:`folder` is where the run writes (:attr:`target` itself, or with
    ``overwrite`` its :func:`overwrite_folder`, which replaces it at the end)."""

    def __init__(self, target: Path, folder: Path):
        self.target, self.folder = target, folder
        self.locks: list[tuple[Path, int]] = []  # (lock file, its locked descriptor)

    def hold(self, folder: Path) -> None:
        """Lock ``folder`` too, and write this process as its owner."""
        fd = _lock(folder)
        self.locks.append((folder / LOCK_NAME, fd))
        self.check()  # the file was not replaced between its open and its lock
        start = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "start": start}).encode(), 0)

    def check(self) -> None:
        """``OutputFolderBusy`` unless every lock file this claim holds is still the file at its path: one deleted or
        replaced lets another run into the folder, so this one must not save there any more."""
        for path, fd in self.locks:
            try:
                same = os.path.samestat(os.stat(path), os.fstat(fd))
            except FileNotFoundError:
                same = False
            if not same:
                raise OutputFolderBusy(f"the lock file {path} was deleted or replaced while this run held "
                                       f"{self.target}: another run may be writing there, so this run stops without "
                                       "saving more")

    def release(self) -> None:
        """Close the lock files, which releases the locks."""
        for _, fd in self.locks:
            os.close(fd)
        self.locks.clear()


def _exchange(new: Path, old: Path) -> None:
    """Swap the folders ``new`` and ``old`` in one step: Linux's ``renameat2(..., RENAME_EXCHANGE)``."""
    at_fdcwd, rename_exchange = -100, 2
    libc = ctypes.CDLL(None, use_errno=True)
    why = "this system has no renameat2" if not hasattr(libc, "renameat2") else None
    if why is None and libc.renameat2(at_fdcwd, os.fsencode(new), at_fdcwd, os.fsencode(old), rename_exchange) != 0:
        why = os.strerror(ctypes.get_errno())
    if why is not None:
        raise OSError(f"cannot swap {new} into {old} ({why}): the finished run is in {new}; move it before the next "
                      f"run into {old}, which removes it")


def _remove_stale(side: Path) -> None:
    """Remove ``side``, the sibling a killed ``overwrite`` run left (``OutputFolderBusy`` if a live run holds it)."""
    fd = _lock(side) if side.is_dir() else None
    try:
        shutil.rmtree(side, ignore_errors=True)
    finally:
        if fd is not None:
            os.close(fd)


@contextlib.contextmanager
def claim_output(folder, overwrite: bool = False, resume: bool = False, finished: str = "model.safetensors",
                 resumable: str = "checkpoint*.safetensors"):
    """Hold ``folder`` for this process while the ``with`` block runs; yields an :class:`OutputClaim`, whose
    ``folder`` is where to write.  With ``overwrite`` that is a fresh sibling, swapped with ``folder`` when the block
    ends and removed if it raises.

    Raises:
        OutputFolderBusy: another live run holds the folder (the message names its pid, host and start).
        FileExistsError: ``folder / finished`` holds a finished run, or a file matching ``resumable`` the checkpoint of
            an unfinished one, and neither ``overwrite`` nor ``resume`` is set.
    """
    target = Path(folder)
    target.mkdir(parents=True, exist_ok=True)
    side = overwrite_folder(target)
    claim = OutputClaim(target, side if overwrite else target)
    try:
        claim.hold(target)
        if not resume and not overwrite:
            if (target / finished).exists():
                raise FileExistsError(f"{target / finished} holds a finished run: pass --overwrite to replace it, "
                                      f"--resume {target} to continue it, or give another output folder")
            saved = sorted(target.glob(resumable)) if resumable else []
            if saved:
                raise FileExistsError(f"{saved[0]} holds the checkpoint of a run that did not finish: pass --resume "
                                      f"{target} to continue it or --overwrite to replace it, or give another output "
                                      "folder")
        _remove_stale(side)
        if overwrite:
            side.mkdir()
            claim.hold(side)
        try:
            yield claim
        except BaseException:
            if overwrite:
                shutil.rmtree(side, ignore_errors=True)
            raise
        if overwrite:
            try:
                claim.check()
            except OutputFolderBusy as exc:
                raise OutputFolderBusy(f"{exc}; its files are in {side}") from None
            _exchange(side, target.resolve())
            shutil.rmtree(side, ignore_errors=True)  # the replaced run
        for _, fd in claim.locks:
            os.ftruncate(fd, 0)
    finally:
        claim.release()
