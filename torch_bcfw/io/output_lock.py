"""One run per output folder: :func:`claim_output` locks a folder for the process that writes a run there.

The lock is an advisory ``flock`` on ``FOLDER/.torch-bcfw.lock``, which holds the owner (pid, host, start time).  The
kernel releases it when its process ends, however it ends (a SIGKILL included), so a folder is free again as soon as
its run is gone; the file itself stays (removing it would let two later runs lock two different files).  A second
run refuses with one line naming the live one, and deletes nothing; the owner of the lock may remove the temporary
files that a killed run left behind, since no live run can be writing them.
"""
from __future__ import annotations

import contextlib
import datetime
import fcntl
import json
import os
import socket
from pathlib import Path

__all__ = ["OutputFolderBusy", "claim_output", "LOCK_NAME"]

#: the lock file of an output folder
LOCK_NAME = ".torch-bcfw.lock"


class OutputFolderBusy(ValueError):
    """Another live run holds the output folder."""


def _owner_text(raw: str) -> str:
    try:
        d = json.loads(raw)
        return f"pid {int(d['pid'])} on {d['host']}, started {d['start']}"
    except (ValueError, KeyError, TypeError):
        return "owner unknown"


@contextlib.contextmanager
def claim_output(folder, overwrite: bool = False, resume: bool = False, finished: str = "model.safetensors"):
    """Hold ``folder`` for this process while the ``with`` block runs.

    Raises:
        OutputFolderBusy: another live run holds the folder (the message names its pid, host and start).
        FileExistsError: ``folder / finished`` holds a finished run and neither ``overwrite`` nor ``resume`` is set.
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / LOCK_NAME
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            with open(path, encoding="utf-8", errors="replace") as f:
                owner = _owner_text(f.read(4096))
            raise OutputFolderBusy(f"the output folder {folder} is in use by a live run ({owner}): wait for it to end "
                                   "or give another output folder") from None
        if not resume and not overwrite and (folder / finished).exists():
            raise FileExistsError(f"{folder / finished} holds a finished run: pass --overwrite to replace it, "
                                  f"--resume {folder} to continue it, or give another output folder")
        start = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "start": start}).encode(), 0)
        yield folder
        os.ftruncate(fd, 0)
    finally:
        os.close(fd)  # releases the lock
