"""``CheckRecord``: what one exact gap check of a solver run certified (one entry of a run's history): typed
columns, plus ``extra`` columns some solvers or callers add (read as attributes too); :meth:`CheckRecord.to_dict` is
the form saved in files and :meth:`CheckRecord.from_dict` reads it back, also from older files.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

__all__ = ["CheckRecord", "RECORD_FIELDS", "plain_history", "as_records"]


@dataclass(kw_only=True)
class CheckRecord:
    """One exact gap check.

    Attributes:
        passes: oracle calls / ``n`` (training calls; the checks' own calls are in ``gap_oracle_calls``).
        oracle_calls: training oracle calls so far.
        cache_hits: block iterations served by the cache instead of the oracle (BCFW with ``cache``).
        steps: block iterations so far (the unit of ``max_passes`` and of the gap-check schedule).
        primal: exact primal value of the last iterate.
        dual: exact dual value of the last iterate (``None`` without a dual: SSG).
        gap_last: ``primal - dual`` of the last iterate (``None`` without a dual).
        primal_avg, dual_avg, gap_avg: the same for the averaged iterate (``None`` without averaging or
            when ``check_averaged`` is off).
        selected: the iterate the run returns as its model, ``"last"`` or ``"averaged"`` (the lower primal).
        gap: the certified gap of that model: its primal minus the better of the two duals (``None`` without
            a dual): "the gap" (``FitResult.gap``, the bar, tables and plots).
        train_loss: mean task loss of the model on the training data (``None`` unless ``track_train_loss``).
        test_loss: mean task loss of the model on the test data (``None`` without test data).
        solver_time: cumulative seconds of solver steps.
        gap_time: cumulative seconds of gap checks (this one included).
        gap_oracle_calls: cumulative oracle calls of the gap checks (this one included).
        extra: further columns (name -> number, string or ``None``), e.g. mp-bcfw's ``approx_steps``; each also
            reads as an attribute.

    Columns missing from an older file are ``None`` and stay absent from :meth:`to_dict`.
    """

    passes: float | None = None
    oracle_calls: int | None = None
    cache_hits: int | None = None
    steps: int | None = None
    primal: float | None = None
    dual: float | None = None
    gap_last: float | None = None
    primal_avg: float | None = None
    dual_avg: float | None = None
    gap_avg: float | None = None
    selected: str | None = None
    gap: float | None = None
    train_loss: float | None = None
    test_loss: float | None = None
    solver_time: float | None = None
    gap_time: float | None = None
    gap_oracle_calls: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    #: field columns the record does not have (a record loaded from an older file)
    absent: frozenset = field(default=frozenset(), repr=False)

    def __getattr__(self, name: str):
        """An extra column as an attribute (only called when no field has the name)."""
        extra = self.__dict__.get("extra")
        if extra is not None and name in extra:
            return extra[name]
        raise AttributeError(f"{type(self).__name__} has no column {name!r}")

    @classmethod
    def from_dict(cls, d: Mapping) -> "CheckRecord":
        """The record of a plain dict (``to_dict``'s output; the columns it lacks stay absent, the names it adds are
        ``extra`` columns)."""
        known = {k: d[k] for k in RECORD_FIELDS if k in d}
        extra = {k: v for k, v in d.items() if k not in RECORD_FIELDS}
        return cls(**known, extra=extra, absent=frozenset(k for k in RECORD_FIELDS if k not in d))

    @property
    def model_primal(self) -> float | None:
        """The primal value of the run's model (the ``selected`` iterate)."""
        return self.primal_avg if self.selected == "averaged" else self.primal

    @property
    def best_dual(self) -> float | None:
        """The better of the two dual values (the one ``gap`` is measured against), ``None`` without a dual."""
        duals = [d for d in (self.dual, self.dual_avg) if d is not None]
        return max(duals) if duals else None

    def to_dict(self) -> dict:
        """The plain dict of the record (what files hold): the columns in order, then the extra ones."""
        out = {k: getattr(self, k) for k in RECORD_FIELDS if k not in self.absent}
        out.update(self.extra)
        return out

    def update(self, columns: Mapping | None = None, **more) -> None:
        """Set columns: a field's name sets that field, any other name an extra column."""
        for k, v in {**(columns or {}), **more}.items():
            if k in _FIELD_SET:
                setattr(self, k, v)
                self.absent = self.absent - {k}
            else:
                self.extra[k] = v


#: the typed columns of a :class:`CheckRecord`, in the order of its saved dict
RECORD_FIELDS = tuple(f.name for f in fields(CheckRecord) if f.name not in ("extra", "absent"))
_FIELD_SET = frozenset(RECORD_FIELDS)


def as_records(history) -> list[CheckRecord]:
    """``history`` (records or saved dicts) as a new list of new records."""
    return [CheckRecord.from_dict(r.to_dict() if isinstance(r, CheckRecord) else r) for r in history]


def plain_history(history) -> list[dict]:
    """``history`` (records or dicts) as a list of plain dicts, the form files hold."""
    return [r.to_dict() if isinstance(r, CheckRecord) else dict(r) for r in history]
