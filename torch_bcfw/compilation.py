"""The one-off compilation of the numba kernels: measure it, announce it, and keep it out of the solver's clock.

The kernels are compiled by numba on their first call and cached on disk (on a fresh machine the first OCR fit
spends ~8 s compiling).  :class:`CompileTimer` measures the compilation inside a block (cache loads not counted);
:func:`precompile` runs a tiny fit first so that the real fit's ``solver_time`` is the solve alone.
"""
from __future__ import annotations

import sys
import time

__all__ = ["CompileTimer", "precompile", "NOTICE", "print_notice"]

#: what :func:`print_notice` prints when the first kernel compilation starts
NOTICE = "torch-bcfw: compiling numba kernels (first run only: cached on disk afterwards)..."


def print_notice(message: str = NOTICE) -> None:
    """Print ``message`` to stderr without breaking a running tqdm progress bar."""
    from tqdm import tqdm

    tqdm.write(message, file=sys.stderr)


class CompileTimer:
    """Context manager measuring numba compilation (cache misses only) inside its block.

    Attributes:
        seconds: wall time spent compiling (nested compilations counted once).
        functions: the compiled functions' qualified names, in order.
        announce: ``None`` or a callable ``announce(NOTICE)`` called once, when the first compilation starts.
    """

    def __init__(self, announce=None):
        self.announce = announce
        self.seconds = 0.0
        self.functions: list[str] = []
        self._depth = 0
        self._t0 = 0.0
        self._listener = None

    # numba's event listener protocol (numba.core.event.Listener), which __enter__ registers
    def on_start(self, event) -> None:
        if self._depth == 0:
            if self.announce is not None and not self.functions:
                self.announce(NOTICE)
            self._t0 = time.perf_counter()
        self._depth += 1
        disp = (event.data or {}).get("dispatcher") if isinstance(event.data, dict) else None
        fn = getattr(disp, "py_func", None)
        self.functions.append(getattr(fn, "__qualname__", repr(disp)))

    def on_end(self, event) -> None:
        self._depth = max(self._depth - 1, 0)
        if self._depth == 0:
            self.seconds += time.perf_counter() - self._t0

    @property
    def compiled(self) -> bool:
        """True when at least one kernel was compiled in the block."""
        return bool(self.functions)

    def __enter__(self) -> "CompileTimer":
        from numba.core import event as ev

        outer = self

        class _Listener(ev.Listener):
            def on_start(self, event):
                outer.on_start(event)

            def on_end(self, event):
                outer.on_end(event)

        self._listener = _Listener()
        ev.register("numba:compile", self._listener)
        return self

    def __exit__(self, *exc) -> bool:
        if self._listener is not None:
            from numba.core import event as ev

            ev.unregister("numba:compile", self._listener)
            self._listener = None
        return False


#: examples of the warm-up fit of :func:`precompile`
WARMUP_EXAMPLES = 4


def precompile(model, data, lam: float, solver: str = "bcfw", *, test_data=None, announce=None,
               **options) -> CompileTimer:
    """Compile (or load from the disk cache) the kernels a :func:`torch_bcfw.fit` of ``model`` on ``data`` uses,
    before that fit, so that its clock measures the solve alone.

    Runs the same solver and options for one pass over the first :data:`WARMUP_EXAMPLES` examples under a
    :class:`CompileTimer` and returns the timer (``.seconds``: 0 when every kernel was cached); ``announce`` is
    called with :data:`NOTICE` when the first compilation starts.  Best effort: an error in the warm-up is
    ignored (the real fit reports it); Ctrl-C raises ``KeyboardInterrupt``.
    """
    from .fit import fit

    timer = CompileTimer(announce=announce)
    opts = dict(options)
    opts.update(max_passes=1, gap_check=1, progress=False, time_budget=None, gap_tol=None, rel_gap_tol=None,
                early_gap_check=None)
    with timer:
        try:
            sub = data[list(range(min(len(data), WARMUP_EXAMPLES)))]
            test_sub = None if test_data is None else test_data[list(range(min(len(test_data), WARMUP_EXAMPLES)))]
            if isinstance(opts.get("batch_size"), int):
                opts["batch_size"] = min(opts["batch_size"], len(sub))
            res = fit(model, sub, lam, solver, test_data=test_sub, distributed=False, **opts)
        except Exception:  # noqa: BLE001 - a warm-up only (Ctrl-C passes): the real fit reports the error
            return timer
    if res.stopped_by == "interrupted":  # fit turns Ctrl-C into a result; here it must stop the command
        raise KeyboardInterrupt
    return timer
