"""The cost model of the strategies ``fit`` can run on a process group: replicate the single-process solve on every
rank, split a replicated run's oracle calls over the ranks, or shard the examples.

From the figures a calibration measured (:class:`Calibration`, :func:`torch_bcfw.planning.choose_strategy`), per
effective pass, replicating costs ``n t_step``; splitting the oracle ``n (t_oracle / P + t_apply) + (n / R) (t_round
+ t_gather)`` for rounds of ``R`` blocks (the smallest multiple of ``P`` whose fixed costs are at most a tenth of a
rank's oracle calls, at most ``n / 16``); sharding ``(n / P) t_step + (n / tau) t_allreduce`` for rounds of ``tau``
blocks (the given ``batch_size``, or the smallest multiple of ``P`` whose all-reduce costs at most a tenth of the
round's steps, and at most ``MAX_SHARD_ROUND`` per process and ``n / 4``: larger rounds need more passes).  Another
way than replicating must be predicted ``SHARD_MARGIN`` times faster; splitting goes before sharding (it needs the
passes of BCFW, ``docs/results/scale.md``).
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass

from .context import DistributedContext

__all__ = ["Calibration", "shard_pass_seconds", "split_pass_seconds", "pass_seconds", "warn_if_slow",
           "SHARD_MARGIN", "MAX_SHARD_ROUND", "SLOW_SETTING_RATIO"]

#: sharding must be predicted this many times faster per pass than replicating to be chosen
SHARD_MARGIN = 1.5
#: nor are rounds of more than this many blocks per process chosen: they need many more passes than one-block
#: steps (OCR-large: rounds of 256 need 9x the passes of BCFW, docs/results/scale.md)
MAX_SHARD_ROUND = 8
#: a forced setting predicted this many times slower per pass than the calibration's choice gets a warning
SLOW_SETTING_RATIO = 3.0


@dataclass(frozen=True)
class Calibration:
    """What :func:`torch_bcfw.planning.choose_strategy` measured and predicted (rank 0's figures, the same on every
    rank)."""

    strategy: str
    step_seconds: float  # one block step in one process
    allreduce_seconds: float  # one all-reduce of d + 2 numbers
    shard_batch_size: int  # the round size a sharded run would use
    replicate_pass_seconds: float
    shard_pass_seconds: float
    oracle_seconds: float  # one oracle call (block_oracle)
    apply_seconds: float  # one step towards a given corner, per block of a round (corner_steps)
    apply_round_seconds: float  # ... and per call
    gather_seconds: float  # one all-gather of a labeling
    split_batch_size: int  # the round size a split-oracle run would use
    split_pass_seconds: float


def shard_pass_seconds(n: int, p: int, tau: int, t_step: float, t_ar: float) -> float:
    """Predicted seconds of one effective pass sharded over ``p`` ranks in rounds of ``tau`` blocks."""
    return (n / p) * t_step + (n / max(tau, 1)) * t_ar


def split_pass_seconds(n: int, p: int, r: int, t_oracle: float, t_apply: float, t_round: float,
                       t_gather: float) -> float:
    """Predicted seconds of one effective pass with the oracle calls of rounds of ``r`` blocks split over ``p``
    ranks."""
    return n * (t_oracle / p + t_apply) + (n / max(r, 1)) * (t_round + t_gather)


def pass_seconds(calibration: Calibration, strategy: str, batch_size, n: int, p: int) -> float:
    """Predicted seconds per pass of ``strategy`` with ``batch_size`` (``"auto"``: the calibration's round size)."""
    c = calibration
    if strategy == "shard":
        tau = batch_size if isinstance(batch_size, int) else c.shard_batch_size
        return shard_pass_seconds(n, p, tau, c.step_seconds, c.allreduce_seconds)
    if strategy == "split-oracle":
        r = batch_size if isinstance(batch_size, int) else c.split_batch_size
        return split_pass_seconds(n, p, r, c.oracle_seconds, c.apply_seconds, c.apply_round_seconds, c.gather_seconds)
    return c.replicate_pass_seconds


def warn_if_slow(calibration: Calibration, strategy: str, batch_size, n: int, ctx: DistributedContext) -> None:
    """One line (rank 0) when the forced ``strategy`` / ``batch_size`` is predicted ``SLOW_SETTING_RATIO`` times
    slower per pass than what ``strategy="auto"`` would run."""
    cost = pass_seconds(calibration, strategy, batch_size, n, ctx.world_size)
    chosen = calibration.strategy
    best = pass_seconds(calibration, chosen, "auto", n, ctx.world_size)
    if ctx.is_main and cost > SLOW_SETTING_RATIO * best:
        better = {"replicate": "strategy='replicate'",
                  "shard": f"strategy='shard' with batch_size={calibration.shard_batch_size}",
                  "split-oracle": f"strategy='split-oracle' with batch_size={calibration.split_batch_size}"}[chosen]
        warnings.warn(f"strategy={strategy!r} with batch_size={batch_size!r} is predicted {cost / best:.0f}x slower per "
                      f"pass than {better} ({cost:.3g} s against {best:.3g} s, measured on this group)", stacklevel=3)
