"""Ctrl-C (SIGINT) and SIGTERM held back while a solver's state changes, then delivered.

A ``KeyboardInterrupt`` raised in the middle of a block step could leave the dual state half-moved (a block
updated, ``w`` or ``l`` not), and a certificate computed from such a state would be wrong.  The solver loop
runs its steps inside :func:`deferred_signals`: a signal that arrives there is recorded and re-delivered, to
the handler that was installed, as soon as the block of steps ends.  A Ctrl-C therefore stops a run within
one chunk of steps (one effective pass for most solvers).
"""
from __future__ import annotations

import contextlib
import signal
import threading

__all__ = ["deferred_signals"]


@contextlib.contextmanager
def deferred_signals(signals=(signal.SIGINT, signal.SIGTERM)):
    """Hold ``signals`` back until the block ends, then raise them again (``signal.raise_signal``) so that the
    handlers installed before the block (the default SIGINT handler raises ``KeyboardInterrupt``) run then.

    Only signals with a Python-level handler are held (a signal left to its default action, e.g. SIGTERM in a
    plain script, still ends the process at once).  Outside the main thread, where Python runs no signal
    handler, the block runs as is.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    got, old = [], {}

    def hold(signum, frame):
        got.append(signum)

    try:
        for sig in signals:
            handler = signal.getsignal(sig)
            if callable(handler):
                old[sig] = signal.signal(sig, hold)
    except ValueError:  # no signal handling in this interpreter
        for sig, handler in old.items():
            signal.signal(sig, handler)
        yield
        return
    try:
        yield
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)
        for sig in dict.fromkeys(got):
            signal.raise_signal(sig)
