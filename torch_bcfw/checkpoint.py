"""Periodic checkpoints of a run (:func:`torch_bcfw.fit` with ``checkpoint=``, ``torch-bcfw fit --checkpoint-every``).

A checkpoint is a saved :class:`~torch_bcfw.fit.FitResult` of the run so far: the weights and certificate
of its last exact check, and the solver's whole state (dual blocks, sampler, counters), written atomically
(:func:`~torch_bcfw.serialization.atomic_save`), so that a kill at any moment leaves the previous complete
checkpoint or a newer complete one.  ``fit(..., init=FitResult.load(path))`` continues the run exactly; a
kill loses at most one checkpoint interval.
"""
from __future__ import annotations

import math
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

from .serialization import check_writable_file

__all__ = ["Checkpoint", "parse_interval", "rank_path"]

_UNITS = {"s": 1.0, "sec": 1.0, "seconds": 1.0, "m": 60.0, "min": 60.0, "minutes": 60.0, "h": 3600.0,
          "hours": 3600.0}
_PASS_UNITS = ("p", "pass", "passes")


def parse_interval(text) -> dict:
    """``{"every_passes": ...}`` or ``{"every_seconds": ...}`` from ``"5p"``, ``"5 passes"``, ``"90s"``, ``"2m"``,
    ``"1h"``; ``{}`` for ``"off"``.  A number needs its unit (seconds or passes are both plausible)."""
    if not isinstance(text, str):
        raise ValueError(f"a checkpoint interval must be a string such as '60s', '2m' or '5p', got {text!r}")
    t = text.strip().lower()
    if t in ("off", "none", "never"):
        return {}
    m = re.fullmatch(r"([0-9]*\.?[0-9]+(?:e[-+]?[0-9]+)?)\s*([a-z]+)", t)
    if m is None or (m.group(2) not in _UNITS and m.group(2) not in _PASS_UNITS):
        raise ValueError(
            f"bad checkpoint interval {text!r}: give a number and a unit, e.g. '60s', '2m', '1h' (wall-clock) or "
            "'5p' / '5 passes' (effective passes), or 'off'"
        )
    value = float(m.group(1))
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"a checkpoint interval must be > 0, got {text!r}")
    if m.group(2) in _PASS_UNITS:
        return {"every_passes": value}
    return {"every_seconds": value * _UNITS[m.group(2)]}


@dataclass
class Checkpoint:
    """Save the run to ``path`` every ``every_passes`` effective passes and/or every ``every_seconds``
    wall-clock seconds (whichever comes first), and once more when the run ends.

    Attributes:
        path: the checkpoint file (written atomically; its folder is created).
        every_passes: interval in effective passes (``None``: not by passes).
        every_seconds: interval in seconds (``None``: not by time).  Default 60.
    """

    path: str | Path
    every_passes: float | None = None
    every_seconds: float | None = 60.0
    _last_passes: float = field(default=0.0, init=False, repr=False)
    _last_time: float = field(default_factory=time.monotonic, init=False, repr=False)

    def __post_init__(self) -> None:
        self.path = check_writable_file(self.path, "checkpoint")  # fail now, not at the first save
        for name in ("every_passes", "every_seconds"):
            v = getattr(self, name)
            if v is None:
                continue
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not (math.isfinite(v) and v > 0):
                raise ValueError(f"Checkpoint.{name} must be a finite number > 0 or None, got {v!r}")
        if self.every_passes is None and self.every_seconds is None:
            raise ValueError("Checkpoint needs every_passes or every_seconds")

    def start(self, passes: float) -> None:
        """Start the clocks (called by ``fit`` when the run starts)."""
        self._last_passes, self._last_time = passes, time.monotonic()

    def due(self, passes: float, agree=None) -> bool:
        """Whether a checkpoint is due at ``passes``; if so the clocks restart.  ``agree(flag) -> bool``: the
        decision of all processes of a sharded run together (each saves its shard at the same point)."""
        now = time.monotonic()
        flag = (self.every_passes is not None and passes - self._last_passes >= self.every_passes - 1e-9) or (
            self.every_seconds is not None and now - self._last_time >= self.every_seconds
        )
        if agree is not None:
            flag = agree(flag)
        if flag:
            self._last_passes, self._last_time = passes, now
        return bool(flag)

    def for_rank(self, rank: int, world_size: int) -> "Checkpoint":
        """The checkpoint of rank ``rank`` of a sharded run: ``path`` with ``.rank<r>-of-<P>`` before its suffix
        (:func:`rank_path`), same intervals."""
        return Checkpoint(rank_path(self.path, rank, world_size), self.every_passes, self.every_seconds)


def rank_path(path, rank: int, world_size: int) -> Path:
    """Where rank ``rank`` of ``world_size`` processes keeps its shard of the run saved at ``path``:
    ``run.pt`` -> ``run.rank0-of-2.pt``.  Each rank saves and resumes from its own file."""
    p = Path(path)
    return p.with_name(f"{p.stem}.rank{rank}-of-{world_size}{p.suffix}")
