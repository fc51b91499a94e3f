"""Ctrl-C while the ``torch-bcfw`` command loads its modules: one line and exit code 130, not a traceback.

:func:`exit_on_interrupt_while_loading` runs first in ``torch_bcfw/__init__.py``; only when the process is the command
(``torch-bcfw ...`` or ``python -m torch_bcfw ...``) does it install a SIGINT handler that exits with 130;
:func:`loaded` (called by :func:`torch_bcfw.cli.main`) puts Python's own handler back, so that the command's later
phases handle Ctrl-C themselves.  A program that imports torch_bcfw is never affected.
"""
from __future__ import annotations

import os
import signal
import sys

__all__ = ["exit_on_interrupt_while_loading", "loaded"]

_installed = False


def _is_the_command() -> bool:
    argv = sys.orig_argv
    if "-m" in argv[:-1] and argv[argv.index("-m") + 1] == "torch_bcfw":
        return True
    return bool(sys.argv) and os.path.basename(sys.argv[0]) == "torch-bcfw"


def _exit(signum, frame):
    sys.stderr.write("torch-bcfw: interrupted (Ctrl-C) while loading; nothing was written\n")
    sys.stderr.flush()
    os._exit(130)


def exit_on_interrupt_while_loading() -> None:
    global _installed
    if _is_the_command() and signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, _exit)
        _installed = True


def loaded() -> None:
    """The command's modules are loaded: Ctrl-C raises ``KeyboardInterrupt`` again."""
    global _installed
    if _installed:
        signal.signal(signal.SIGINT, signal.default_int_handler)
        _installed = False
