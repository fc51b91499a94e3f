"""``StageBar``: a progress bar over the named stages of a data loader's feature building, shown on stderr (with
the stage now running) once the work has taken :data:`SHOW_AFTER_S` seconds.
"""
from __future__ import annotations

import sys

__all__ = ["StageBar", "SHOW_AFTER_S"]

#: seconds of work before the bar appears
SHOW_AFTER_S = 2.0


class StageBar:
    """``with StageBar(["read", "vocabulary", ...], enabled=True) as bar: ...; bar.done("read"); ...``

    Args:
        stages: the names of the stages, in order (the bar's total).
        enabled: ``False``: nothing is shown (the calls still check the stage names).
        desc: the bar's label.
    """

    def __init__(self, stages: list[str], enabled: bool = True, desc: str = "preparing features"):
        self.stages = list(stages)
        self._next = 0
        self._bar = None
        if enabled:
            from tqdm.auto import tqdm

            self._bar = tqdm(total=len(self.stages), desc=desc, unit="stage", delay=SHOW_AFTER_S, mininterval=0, file=sys.stderr,
                             leave=False)
            self._bar.set_postfix_str(self.stages[0] if self.stages else "", refresh=False)

    def done(self, stage: str) -> None:
        """Mark ``stage`` (the next one in order) as finished."""
        if self._next >= len(self.stages) or self.stages[self._next] != stage:
            expected = self.stages[self._next] if self._next < len(self.stages) else "none (all done)"
            raise ValueError(f"StageBar: stage {stage!r} finished out of order; expected {expected!r}")
        self._next += 1
        if self._bar is not None:  # the stage now running, then the count (which redraws)
            self._bar.set_postfix_str(self.stages[self._next] if self._next < len(self.stages) else "done",
                                      refresh=False)
            self._bar.update(1)

    def __enter__(self) -> "StageBar":
        return self

    def __exit__(self, *exc) -> None:
        if self._bar is not None:
            self._bar.close()
