"""How ``fit`` uses a process group: replicate the single-process solve on every rank, or shard the examples.

``choose_strategy`` measures, on the live group, what decides it: the seconds of one block step of this problem in
one process (a short run of plain BCFW steps on a scratch dual state) and of one all-reduce of ``d + 2`` numbers.
Per effective pass, replicating costs ``n t_step`` on every rank at once; sharding over ``P`` ranks costs
``(n / P) t_step + (n / tau) t_allreduce`` for rounds of ``tau`` blocks (the given ``batch_size``, or the smallest
multiple of ``P`` whose all-reduce costs at most a tenth of the round's steps).  Rounds converge more slowly per pass
than one-block steps, the more so the larger they are, so sharding is chosen only when it is predicted
``SHARD_MARGIN`` times faster with rounds of at most ``MAX_SHARD_ROUND`` blocks per process and a quarter of the
examples (a costly oracle); rank 0's measurements decide for every rank.
"""
from __future__ import annotations

import math
import time
import warnings
from typing import NamedTuple

import dataclasses

import numpy as np
import torch

from torch import Tensor

from ..solvers.certificate import Certificate, squared_norm
from ..solvers.comm import LocalComm
from ..solvers.bcfw import seconds_per_block
from ..solvers.run import make_algorithm
from .collectives import all_gather_parts, all_reduce_sum, broadcast_from_rank0
from .context import DistributedContext
from .sharding import shard_bounds, shard_sizes

__all__ = ["Calibration", "choose_strategy", "shard_pass_seconds", "warn_if_slow", "ReplicaComm", "SHARD_MARGIN",
           "MAX_SHARD_ROUND", "SLOW_SETTING_RATIO"]

#: sharding must be predicted this many times faster per pass than replicating to be chosen
SHARD_MARGIN = 1.5
#: nor are rounds of more than this many blocks per process chosen: they need many more passes than one-block
#: steps (OCR-large: rounds of 256 need 9x the passes of BCFW, docs/results/scale.md)
MAX_SHARD_ROUND = 8
#: a forced setting predicted this many times slower per pass than the calibration's choice gets a warning
SLOW_SETTING_RATIO = 3.0
#: block steps and all-reduces timed by the calibration
CALIBRATION_STEPS, CALIBRATION_REDUCES = 256, 5


class Calibration(NamedTuple):
    """What ``choose_strategy`` measured and predicted (rank 0's figures, the same on every rank)."""

    strategy: str
    step_seconds: float  # one block step in one process
    allreduce_seconds: float  # one all-reduce of d + 2 numbers
    shard_batch_size: int  # the round size a sharded run would use
    replicate_pass_seconds: float
    shard_pass_seconds: float


class ReplicaComm(LocalComm):
    """A replicated run: every block in this process (the reductions are the identity), but the stopping decisions
    that read a clock (``time_budget``) are taken together, so that the replicas stay identical, and the exact gap
    pass is split: each rank decodes its contiguous share of the examples and the per-example hinge terms (task
    losses) are gathered, so that every rank sums the same vector a single process would (the same bits)."""

    def __init__(self, ctx: DistributedContext):
        self.ctx = ctx
        self._data = self._part = None

    def any(self, flag: bool) -> bool:
        return bool(all_reduce_sum(torch.tensor([float(bool(flag))]), self.ctx)[0] > 0)

    def _share(self, data):
        """This rank's contiguous share of ``data`` (made once per data object)."""
        if self._data is not data:
            lo, hi = shard_bounds(len(data), self.ctx.rank, self.ctx.world_size)
            self._data, self._part = data, data[lo:hi]
        return self._part

    def _gathered(self, part: Tensor, n: int) -> Tensor:
        return all_gather_parts(part, shard_sizes(n, self.ctx.world_size), self.ctx)

    def certify(self, model, data, w: Tensor, ell: float | None, lam: float) -> Certificate:
        if len(data) < self.ctx.world_size:  # some rank without a share: the whole pass here
            return super().certify(model, data, w, ell, lam)
        w64 = w.to(torch.float64)
        y_part, h_part = model.hinge_terms(w64, self._share(data))
        hinge = self._gathered(h_part.to(torch.float64), len(data))
        sq = squared_norm(w64)
        primal = 0.5 * lam * sq + float(hinge.mean())
        if ell is None:
            return Certificate(primal, None, None, y_part)
        dual = float(ell) - 0.5 * lam * sq
        return Certificate(primal, dual, primal - dual, y_part)

    def task_loss(self, model, data, w: Tensor) -> float:
        if len(data) < self.ctx.world_size:
            return super().task_loss(model, data, w)
        part = self._share(data)
        losses = model.loss(part, model.decode(w.to(torch.float64), part))
        return float(self._gathered(losses.to(torch.float64), len(data)).mean())


def _step_seconds(model, data, lam: float, options) -> float:
    """Seconds per block step of the single-process BCFW solve of ``(model, data, lam)`` with ``options`` (one-block
    steps, the model's box constraints) on a scratch state: the second of two timed chunks (the first compiles or
    loads the kernels)."""
    alg = make_algorithm("bcfw", model, data, lam, dataclasses.replace(options, batch_size=1, progress=False))
    return seconds_per_block(alg, min(len(data), CALIBRATION_STEPS))


def _allreduce_seconds(d: int, ctx: DistributedContext) -> float:
    buf = torch.zeros(d + 2, dtype=torch.float64)
    all_reduce_sum(buf, ctx)  # warm-up
    times = []
    for _ in range(CALIBRATION_REDUCES):
        t0 = time.perf_counter()
        all_reduce_sum(buf, ctx)
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def shard_pass_seconds(n: int, p: int, tau: int, t_step: float, t_ar: float) -> float:
    """Predicted seconds of one effective pass sharded over ``p`` ranks in rounds of ``tau`` blocks."""
    return (n / p) * t_step + (n / max(tau, 1)) * t_ar


def choose_strategy(model, data, lam: float, options, ctx: DistributedContext) -> Calibration:
    """Measure and predict (see the module's docstring); every rank of ``ctx`` calls it and gets rank 0's answer."""
    t_step = _step_seconds(model, data, lam, options)
    t_ar = _allreduce_seconds(model.n_features, ctx)
    t_step, t_ar = broadcast_from_rank0(torch.tensor([t_step, t_ar], dtype=torch.float64), ctx).tolist()
    n, p = len(data), ctx.world_size
    given = options.batch_size if options.batch_size != "auto" else 1
    tau = given if given > 1 else p * max(1, math.ceil(10 * t_ar / max(t_step, 1e-12)))
    tau = min(tau, n)
    replicate = n * t_step
    shard = shard_pass_seconds(n, p, tau, t_step, t_ar)
    pays = tau <= min(MAX_SHARD_ROUND * p, n // 4) and replicate >= SHARD_MARGIN * shard
    return Calibration("shard" if pays else "replicate", t_step, t_ar, int(tau), replicate, shard)


def warn_if_slow(calibration: Calibration, strategy: str, batch_size, n: int, ctx: DistributedContext) -> None:
    """One line (rank 0) when the forced ``strategy`` / ``batch_size`` is predicted ``SLOW_SETTING_RATIO`` times
    slower per pass than what ``strategy="auto"`` would run."""
    if strategy == "shard":
        tau = batch_size if isinstance(batch_size, int) else calibration.shard_batch_size
        cost = shard_pass_seconds(n, ctx.world_size, tau, calibration.step_seconds, calibration.allreduce_seconds)
    else:
        cost = calibration.replicate_pass_seconds
    chosen = calibration.strategy
    best = calibration.replicate_pass_seconds if chosen == "replicate" else calibration.shard_pass_seconds
    if ctx.is_main and cost > SLOW_SETTING_RATIO * best:
        better = ("strategy='replicate'" if chosen == "replicate"
                  else f"strategy='shard' with batch_size={calibration.shard_batch_size}")
        warnings.warn(f"strategy={strategy!r} with batch_size={batch_size!r} is predicted {cost / best:.0f}x slower per "
                      f"pass than {better} ({cost:.3g} s against {best:.3g} s, measured on this group)", stacklevel=3)
