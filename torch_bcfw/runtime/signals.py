"""Ctrl-C (SIGINT) and SIGTERM held back while a solver's state changes, then delivered.

A ``KeyboardInterrupt`` in the middle of a block step could leave the dual state half-moved (and its certificate
wrong): the solver loop runs its steps inside :func:`deferred_signals`, which re-delivers a signal when the steps
end.
"""
from __future__ import annotations

import contextlib
import signal
import threading

__all__ = ["deferred_signals"]


@contextlib.contextmanager
def deferred_signals(signals=(signal.SIGINT, signal.SIGTERM)):
    """Hold ``signals`` back until the block ends, then raise them again for the handlers installed before it.
    Only signals with a Python-level handler are held; outside the main thread the block runs as is."""
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
