"""Periodic checkpoints of a run (:func:`torch_bcfw.fit` with ``checkpoint=``, ``torch-bcfw fit --checkpoint-every``).

A checkpoint is a :class:`~torch_bcfw.fit.FitResult` of the run so far (weights and certificate of its last
check, the whole solver state), saved atomically as one safetensors file (``docs/formats.md``);
``fit(..., init=FitResult.load(path))`` continues it exactly.

A sharded run saves one *set*: every rank writes its shard (:func:`shard_path`), rank 0 then commits the set in a
manifest (:func:`save_sharded`), and only then are older files removed, so a kill at any moment leaves the
manifest's set complete (:func:`newest_sharded`).
"""
from __future__ import annotations

import json
import math
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from .io.serialization import atomic_write_text, check_writable_file

__all__ = ["Checkpoint", "parse_interval", "shard_path", "manifest_path", "save_sharded", "newest_sharded",
           "read_manifest", "sharded_sets"]

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
        guard: called before every save; raises to stop the run instead (``torch-bcfw fit`` passes
            :meth:`~torch_bcfw.io.output_lock.OutputClaim.check`, so that a run whose output folder was taken saves
            nothing more).
        saved_passes: :attr:`~torch_bcfw.fit.FitResult.passes` of the last save (``None`` before the first).
    """

    path: str | Path
    every_passes: float | None = None
    every_seconds: float | None = 60.0
    guard: Callable[[], None] | None = field(default=None, repr=False)
    saved_passes: float | None = field(default=None, init=False, repr=False)
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

    def save(self, save, result) -> None:
        """``save(result, self.path)`` (the run's save function) once :attr:`guard` allows it."""
        if self.guard is not None:
            self.guard()
        save(result, self.path)
        self.saved_passes = result.passes

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


def shard_path(path, rank: int, world_size: int, work: int) -> Path:
    """Rank ``rank``'s member of the set a sharded run saved at ``path`` after ``work`` block iterations:
    ``run.safetensors`` -> ``run.rank0-of-2.w1200.safetensors``."""
    p = Path(path)
    return p.with_name(f"{p.stem}.rank{rank}-of-{world_size}.w{int(work)}{p.suffix}")


def manifest_path(path) -> Path:
    """The file naming the newest complete set of the sharded saves at ``path``: ``run.safetensors`` ->
    ``run.shards.json``."""
    p = Path(path)
    return p.with_name(f"{p.stem}.shards.json")


#: the format tag of a sharded set's manifest
MANIFEST_FORMAT = "torch_bcfw.shards/1"


def save_sharded(result, path, ctx) -> None:
    """Save this rank's ``result`` as its member of the set at ``result.counters["work"]``, commit the set once every
    member is written (rank 0 writes the manifest), then remove this rank's older members.  Every rank of ``ctx``
    calls it at the same point."""
    from .distributed import DistributedError, all_gather_int64

    work = int(result.counters.get("work", 0))
    mine = shard_path(path, ctx.rank, ctx.world_size, work)
    result.save(mine)
    works = all_gather_int64([work], ctx)  # every member is on disk (a barrier), at one point
    if not bool((works == work).all()):
        raise DistributedError(f"the ranks saved at different points ({works[:, 0].tolist()} block iterations); the "
                               "set is not committed")
    if ctx.is_main:
        atomic_write_text(manifest_path(path), json.dumps(
            {"format": MANIFEST_FORMAT, "world_size": ctx.world_size, "work": work}))
    all_gather_int64([work], ctx)  # the manifest names the new set: the older ones can go
    _remove_members(path, ctx.rank, ctx.world_size, keep=mine)


def _remove_members(path, rank: int, world_size: int, keep: Path) -> None:
    """Remove this rank's older members of the set at ``path``, all but ``keep``."""
    p = Path(path)
    for old in p.parent.glob(f"{p.stem}.rank{rank}-of-{world_size}.w*{p.suffix}"):
        if old != keep:
            old.unlink(missing_ok=True)


def _read_manifest(path, world_size: int) -> int | None:
    """The block iterations of the set the manifest at ``path`` names (``None``: no manifest, or one of another
    world size).  A manifest that is not one raises ``ValueError``."""
    found = read_manifest(path)
    if found is None:
        return None
    ws, work = found
    if ws != world_size:
        raise ValueError(f"{manifest_path(path)}: the set was saved by {ws} processes, this run has {world_size}: "
                         f"resume it with torchrun --nproc-per-node {ws}")
    return work


#: the largest world size and block-iteration count a manifest may name (what an int64 collective carries)
_MANIFEST_MAX = 2**63 - 1


def read_manifest(path) -> tuple[int, int] | None:
    """``(world_size, work)`` of the set the manifest of the sharded saves at ``path`` commits (``None``: no manifest).
    A manifest that is not one (unreadable, nested, numbers beyond 64 bits) raises ``ValueError`` in one line."""
    m = manifest_path(path)
    if not m.is_file():
        return None
    try:
        if m.stat().st_size > 4096:  # a manifest is one short line
            raise ValueError(f"{m.stat().st_size} bytes")
        d = json.loads(m.read_text())
    except (OSError, ValueError, RecursionError) as exc:
        detail = "nested too deeply" if isinstance(exc, RecursionError) else str(exc).splitlines()[0][:200]
        raise ValueError(f"{m} is not a readable manifest of a sharded save: {detail}") from None
    if not isinstance(d, dict) or d.get("format") != MANIFEST_FORMAT:
        raise ValueError(f"{m} is not a manifest of a sharded save (format {MANIFEST_FORMAT!r})")
    ws, work = d.get("world_size"), d.get("work")
    if not all(isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= _MANIFEST_MAX for v in (ws, work)) \
            or ws < 1:
        raise ValueError(f"{m}: world_size and work must be integers in [0, 2^63), got {_short(ws)} and {_short(work)}")
    return ws, work


def _short(v) -> str:
    text = repr(v) if not isinstance(v, int) or v.bit_length() < 200 else f"an integer of {v.bit_length()} bits"
    return text if len(text) <= 60 else text[:57] + "..."


def sharded_sets(path) -> list[tuple[int, int]]:
    """``(world_size, work)`` of every set of members saved at ``path`` (``run.rank<r>-of-<k>.w<work>.safetensors``),
    newest first: what a folder holds when its manifest is missing."""
    p = Path(path)
    found = set()
    for f in p.parent.glob(f"{p.stem}.rank*-of-*.w*{p.suffix}"):
        m = re.fullmatch(rf"{re.escape(p.stem)}\.rank(\d+)-of-(\d+)\.w(\d+){re.escape(p.suffix)}", f.name)
        if m:
            found.add((int(m.group(2)), int(m.group(3))))
    return sorted(found, key=lambda t: -t[1])


def newest_sharded(paths, ctx) -> Path | None:
    """This rank's member of the newest complete set among the sharded saves at ``paths`` (``None``: none committed);
    rank 0 reads the manifests, and a member missing on any rank raises ``FileNotFoundError`` on every rank."""
    from .distributed import all_gather_int64, broadcast_from_rank0

    choice = [-1, -1]
    error = ""
    if ctx.is_main:
        try:
            works = [_read_manifest(p, ctx.world_size) for p in paths]
            found = [(w, i) for i, w in enumerate(works) if w is not None]
            if found:
                work, index = max(found)
                choice = [index, work]
        except ValueError as exc:
            error, choice = str(exc), [-2, -2]
    index, work = broadcast_from_rank0(torch.tensor(choice, dtype=torch.int64), ctx).tolist()
    if index == -2:
        raise ValueError(error or "rank 0 could not read the manifest of the sharded save")
    if index < 0:
        return None
    mine = shard_path(paths[index], ctx.rank, ctx.world_size, work)
    present = all_gather_int64([int(mine.is_file())], ctx)[:, 0]
    if not bool(present.all()):
        missing = [r for r, ok in enumerate(present.tolist()) if not ok]
        raise FileNotFoundError(f"the committed set {manifest_path(paths[index])} (after {work} block iterations) "
                                f"lacks the member of rank(s) {missing}: were the files moved?")
    return mine
