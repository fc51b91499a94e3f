"""Callbacks of a solver run: history, progress bar, logging."""
from __future__ import annotations

import math

__all__ = ["Callback", "ProgressBar", "PrintLogger", "format_record"]


class Callback:
    """Hooks called by :func:`torch_bcfw.solvers.run.run_solver`. All are optional."""

    def on_start(self, info: dict) -> None:
        """``info``: solver name, n, lam, max_passes, options."""

    def on_chunk(self, passes: float, elapsed: float) -> None:
        """After each chunk of steps (usually one effective pass)."""

    def on_check(self, record) -> None:
        """After each exact gap check, with the new history record (a
        :class:`~torch_bcfw.solvers.record.CheckRecord`; ``record.update(...)`` adds columns)."""

    def on_end(self, record, stopped_by: str) -> None:
        """When the run ends (``record`` is the last history record)."""


def _fmt(v) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    return f"{v:.3e}" if isinstance(v, float) else str(v)


def format_record(r) -> str:
    """One line of a :class:`~torch_bcfw.solvers.record.CheckRecord`: the certified gap and the primal value of the
    run's model first, then the iterates' own gaps and the losses."""
    return (
        f"pass {r.passes:7.2f}  gap {_fmt(r.gap)}  primal {_fmt(r.model_primal)}  "
        f"dual {_fmt(r.best_dual)}  gap(last) {_fmt(r.gap_last)}  gap(avg) {_fmt(r.gap_avg)}  "
        f"train {_fmt(r.train_loss)}  test {_fmt(r.test_loss)}  "
        f"t {r.solver_time + r.gap_time:.1f}s"
    )


class ProgressBar(Callback):
    """A tqdm bar over effective passes showing pass, the certified gap, the primal value of the run's model and
    the elapsed time."""

    def __init__(self, leave: bool = True):
        self.leave = leave
        self.bar = None
        self.last = 0.0

    def on_start(self, info: dict) -> None:
        from tqdm.auto import tqdm

        self.bar = tqdm(total=float(info["max_passes"]), unit="pass", desc=info["solver"], leave=self.leave,
                        bar_format="{desc} {n:.1f}/{total:.0f} passes |{bar}| {elapsed}{postfix}")

    def on_chunk(self, passes: float, elapsed: float) -> None:
        if self.bar is not None:
            self.bar.update(passes - self.last)
            self.last = passes

    def on_check(self, record) -> None:
        if self.bar is not None:
            cached = f" oracle passes={record.passes:.1f}" if record.cache_hits else ""  # the cache served steps
            self.bar.set_postfix_str(f"gap={_fmt(record.gap)} primal={_fmt(record.model_primal)}{cached}")

    def on_end(self, record, stopped_by: str) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None


class PrintLogger(Callback):
    """Prints one line per gap check."""

    def __init__(self, print_fn=print):
        self.print_fn = print_fn

    def on_check(self, record) -> None:
        self.print_fn(format_record(record))

    def on_end(self, record, stopped_by: str) -> None:
        self.print_fn(f"stopped: {stopped_by}")
