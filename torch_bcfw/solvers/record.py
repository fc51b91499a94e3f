"""``CheckRecord``: what one exact gap check of a solver run certified (one entry of a run's history).

A record has typed fields for the columns every check writes and an ``extra`` dict for the columns that some
solvers or callers add (mp-bcfw's cost accounting, the Lightning callback's ``epoch`` / ``stale`` ...).  It is
also a read-only :class:`~collections.abc.Mapping` over all of them, in a fixed order (the fields, then the
extra columns in the order they were added), so ``rec["gap"]``, ``rec.get("dual_avg")``, ``dict(rec)`` and
``rec == {...}`` read it as the plain dict it is written as: :meth:`CheckRecord.to_dict` is the form saved in
files (``FitResult.save``, ``history.json``) and :meth:`CheckRecord.from_dict` reads it back.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

__all__ = ["CheckRecord", "RECORD_FIELDS", "plain_history", "as_records"]


@dataclass(eq=False, kw_only=True)
class CheckRecord(Mapping):
    """One exact gap check.

    Attributes:
        passes: oracle calls / ``n`` (training calls; the checks' own calls are in ``gap_oracle_calls``).
        oracle_calls: training oracle calls so far.
        cache_hits: block iterations served by the cache instead of the oracle (BCFW with ``cache``).
        steps: block iterations so far (the unit of ``max_passes`` and of the gap-check schedule).
        primal: exact primal value of the last iterate.
        dual: exact dual value of the last iterate (``None`` without a dual: SSG).
        gap: ``primal - dual`` of the last iterate (``None`` without a dual).
        primal_avg, dual_avg, gap_avg: the same for the averaged iterate (``None`` without averaging or
            when ``check_averaged`` is off).
        selected: the iterate the run returns as its model, ``"last"`` or ``"averaged"`` (the lower primal).
        gap_best: the certified gap of that model: its primal minus the better of the two duals (``None``
            without a dual).
        train_loss: mean task loss of the model on the training data (``None`` unless ``track_train_loss``).
        test_loss: mean task loss of the model on the test data (``None`` without test data).
        solver_time: cumulative seconds of solver steps.
        gap_time: cumulative seconds of gap checks (this one included).
        gap_oracle_calls: cumulative oracle calls of the gap checks (this one included).
        extra: further columns (name -> number, string or ``None``), e.g. mp-bcfw's ``approx_steps``.

    Records written by older versions may lack some columns: those are ``None`` as attributes and absent from
    the mapping (as they are from the saved dict), so a record always reads as the dict it was loaded from.
    """

    passes: float | None = None
    oracle_calls: int | None = None
    cache_hits: int | None = None
    steps: int | None = None
    primal: float | None = None
    dual: float | None = None
    gap: float | None = None
    primal_avg: float | None = None
    dual_avg: float | None = None
    gap_avg: float | None = None
    selected: str | None = None
    gap_best: float | None = None
    train_loss: float | None = None
    test_loss: float | None = None
    solver_time: float | None = None
    gap_time: float | None = None
    gap_oracle_calls: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    #: field columns the record does not have (a record loaded from an older file); not part of the mapping
    absent: frozenset = field(default=frozenset(), repr=False)

    # ------------------------------------------------------------------ conversion
    @classmethod
    def from_dict(cls, d: Mapping) -> "CheckRecord":
        """The record of a saved dict (``to_dict``'s output, or a dict of an older version with fewer columns)."""
        known = {k: d[k] for k in RECORD_FIELDS if k in d}
        extra = {k: v for k, v in d.items() if k not in RECORD_FIELDS}
        return cls(**known, extra=extra, absent=frozenset(k for k in RECORD_FIELDS if k not in d))

    def to_dict(self) -> dict:
        """The plain dict of the record (what files hold): the columns in order, then the extra ones."""
        return dict(self.items())

    def update(self, other: Mapping | None = None, **columns) -> None:
        """Set columns (``dict.update`` style): a field's name sets that field, any other name an extra column."""
        for k, v in {**(other or {}), **columns}.items():
            self[k] = v

    def __setitem__(self, key: str, value) -> None:
        if key in _FIELD_SET:
            setattr(self, key, value)
            if key in self.absent:
                self.absent = self.absent - {key}
        else:
            self.extra[key] = value

    # ------------------------------------------------------------------ the Mapping protocol
    def __getitem__(self, key: str):
        if key in _FIELD_SET and key not in self.absent:
            return getattr(self, key)
        return self.extra[key]

    def __iter__(self):
        yield from (k for k in RECORD_FIELDS if k not in self.absent)
        yield from self.extra

    def __len__(self) -> int:
        return len(RECORD_FIELDS) - len(self.absent) + len(self.extra)

    def __contains__(self, key) -> bool:
        return (key in _FIELD_SET and key not in self.absent) or key in self.extra

    def __eq__(self, other) -> bool:
        if not isinstance(other, Mapping):
            return NotImplemented
        return dict(self.items()) == dict(other.items())

    __hash__ = None


#: the typed columns of a :class:`CheckRecord`, in the order of its saved dict
RECORD_FIELDS = tuple(f.name for f in fields(CheckRecord) if f.name not in ("extra", "absent"))
_FIELD_SET = frozenset(RECORD_FIELDS)


def as_records(history) -> list[CheckRecord]:
    """``history`` (records or saved dicts) as a new list of new records."""
    return [CheckRecord.from_dict(r) for r in history]


def plain_history(history) -> list[dict]:
    """``history`` (records or dicts) as a list of plain dicts, the form files hold."""
    return [r.to_dict() if isinstance(r, CheckRecord) else dict(r) for r in history]
