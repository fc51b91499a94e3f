"""What ``"auto"`` means for one run, decided once before any solver exists (:func:`plan_run`): the device it solves
on, how it uses a process group (strategy and communicator), its round size, BCFW's preset, and the calibration
figures behind these choices.  ``fit`` and the Lightning callback call :func:`plan_run` once per solve; the solvers
only check that nothing is left on ``"auto"``.

Only a choice that needs a measurement times scratch runs, all through :func:`seconds_per_block`: the device of a
fit whose data is on a GPU (:func:`solver_placement`), its round size (:func:`measured_round_size`) and the
strategy over a process group (:func:`choose_strategy`, on the cost model of :mod:`torch_bcfw.distributed.strategy`).
The preset reads properties of the problem, never a clock (:func:`resolve_auto_preset`).
"""
from __future__ import annotations

import dataclasses
import math
import time
import warnings
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import Tensor

from .distributed.collectives import all_gather_parts, all_reduce_sum, broadcast_from_rank0
from .distributed.communicators import ReplicaComm, ShardComm, SplitOracleComm
from .distributed.context import DistributedContext
from .distributed.sharding import check_same_dataset, shard, shard_sizes
from .distributed.strategy import (MAX_SHARD_ROUND, SHARD_MARGIN, SLOW_SETTING_RATIO, Calibration,
                                   shard_pass_seconds, split_pass_seconds, warn_if_slow)
from .solvers.bcfw import BCFW
from .solvers.bcfw_options import auto_fits, auto_pending, with_combination
from .solvers.run import make_algorithm

__all__ = ["plan_run", "RunPlan", "continued_strategy", "resolve_auto_preset", "seconds_per_block",
           "plain_seconds_per_block", "round_costs", "round_size_candidates", "chosen_round_size",
           "measured_round_size", "warn_if_slow_rounds", "faster_device", "solver_placement", "choose_strategy",
           "PLACEMENT_COUNTERS"]

#: the round sizes :func:`measured_round_size` times, and the slack within which it prefers the smaller one
ROUND_SIZE_CANDIDATES, ROUND_SIZE_SLACK = (64, 256, 1024), 2.0
#: the counters of a :class:`~torch_bcfw.FitResult` that record the device choice: 1.0 when the solve moved to the
#: CPU, and the measured seconds per block step on each device
PLACEMENT_COUNTERS = ("placement_moved_to_cpu", "placement_cpu_block_seconds", "placement_gpu_block_seconds")
#: one-block steps timed on each device by :func:`solver_placement` (two chunks: the first warms up)
CPU_BLOCKS, GPU_BLOCKS = 128, 4
#: block steps, oracle calls (and interpreted steps) and all-reduces timed by the calibration
CALIBRATION_STEPS, CALIBRATION_ORACLES, CALIBRATION_REDUCES = 256, 16, 5


def resolve_auto_preset(model, data, options, rounds: bool = False):
    """``preset="auto"``: the first of :data:`~torch_bcfw.solvers.bcfw_options.AUTO_CHOICES` fitting the given
    fields, in an order set by properties of the problem, never a clock (``docs/results/presets.md``): ``uniform-fw``
    for ``rounds`` (``batch_size > 1``, sharded blocks or ``strategy="split-oracle"``); ``gap-pairwise`` when the
    model's :attr:`~torch_bcfw.models.base.StructuredModel.compiled_steps` is ``"all"`` (a chain on the CPU);
    ``uniform-fw`` for ``"plain"`` or a cheap oracle; else ``gap-pairwise-cache`` (an
    :attr:`~torch_bcfw.models.base.StructuredModel.expensive_oracle`, Osokin et al. 2016, Sec. 5.1).

    Returns the resolved BCFW options with ``extra["auto"]`` recording the choice and its reasons; resolved options
    are returned unchanged."""
    if not auto_pending(options):
        return options
    expensive = bool(model.expensive_oracle)
    compiled = model.compiled_steps if data.device.type == "cpu" else "none"
    if rounds:
        order = ("uniform-fw", "gap-fw", "gap-pairwise", "gap-pairwise-cache")
    elif compiled == "all":
        order = ("gap-pairwise", "gap-fw", "uniform-fw", "gap-pairwise-cache")
    elif compiled == "plain" or not expensive:
        order = ("uniform-fw", "gap-fw", "gap-pairwise", "gap-pairwise-cache")
    else:
        order = ("gap-pairwise-cache", "gap-pairwise", "gap-fw", "uniform-fw")
    fits = auto_fits(options)
    name = next(n for n in order if n in fits)
    extra = dict(options.extra)
    extra["auto"] = {"compiled_steps": compiled, "expensive_oracle": expensive, "rounds": bool(rounds),
                     "model": type(model).__name__, "chosen": name}
    return with_combination(options, name, extra=extra)


# ----------------------------------------------------------------------------------------- the timings
def seconds_per_block(alg, m: int) -> float:
    """Seconds per block iteration of the scratch algorithm ``alg``: the second of two chunks of ``m`` iterations."""
    alg.advance(m)
    t0, work = time.perf_counter(), alg.work
    alg.advance(m)
    return (time.perf_counter() - t0) / max(1, alg.work - work)


def plain_seconds_per_block(model, data, lam: float, options, batch_size: int, blocks: int) -> float:
    """:func:`seconds_per_block` of plain BCFW (uniform sampling, FW steps, no cache) in rounds of ``batch_size``
    on ``data``'s device, ``blocks`` block iterations a chunk, from a fresh dual state."""
    alg = BCFW(model, data, lam, with_combination(options, "uniform-fw", batch_size=batch_size, progress=False))
    return seconds_per_block(alg, blocks)


def round_costs(model, data, lam: float, options, sizes) -> dict[int, float]:
    """Seconds per block of plain BCFW in rounds of each size of ``sizes`` (chunks of one round)."""
    return {tau: plain_seconds_per_block(model, data, lam, options, tau, tau) for tau in sizes}


def round_size_candidates(n: int) -> list[int]:
    """The round sizes ``batch_size="auto"`` times: those of ``ROUND_SIZE_CANDIDATES`` up to ``n / 2``."""
    return [t for t in ROUND_SIZE_CANDIDATES if t <= n // 2] or [max(1, n // 2)]


def chosen_round_size(cost: dict[int, float]) -> int:
    """The smallest round size whose cost per block is within ``ROUND_SIZE_SLACK`` of the cheapest."""
    best = min(cost.values())
    return min(t for t, c in cost.items() if c <= ROUND_SIZE_SLACK * best)


def measured_round_size(model, data, lam: float, options) -> int:
    """``batch_size="auto"`` with the data off the CPU: the :func:`chosen_round_size` of the timed
    :func:`round_size_candidates` (docs/results/gpu.md)."""
    return chosen_round_size(round_costs(model, data, lam, options, round_size_candidates(len(data))))


def warn_if_slow_rounds(model, data, lam: float, options) -> float:
    """Time a forced ``batch_size`` (one process, data on a GPU) against the round sizes ``batch_size="auto"`` would
    choose from and warn when it is predicted :data:`~torch_bcfw.distributed.strategy.SLOW_SETTING_RATIO` times
    slower per pass.  Returns the ratio."""
    forced = int(options.batch_size)
    candidates = round_size_candidates(len(data))
    costs = round_costs(model, data, lam, options, sorted({forced, *candidates}))
    auto = chosen_round_size({t: costs[t] for t in candidates})
    ratio = costs[forced] / costs[auto]
    if ratio > SLOW_SETTING_RATIO:
        warnings.warn(f"batch_size={forced} is predicted {ratio:.0f}x slower per pass than batch_size={auto} "
                      f"({costs[forced] * len(data):.3g} s against {costs[auto] * len(data):.3g} s, measured on "
                      f"{data.device}); batch_size='auto' chooses the round size by this measurement", stacklevel=4)
    return ratio


def faster_device(cpu_block_seconds: float, gpu_block_seconds: float) -> str:
    """``"cpu"`` or ``"cuda"``: the device of the cheaper block step (the CPU on a tie: no transfer, the compiled
    kernel)."""
    return "cuda" if gpu_block_seconds < cpu_block_seconds else "cpu"


def solver_placement(model, data, test_data, lam: float, options):
    """``(data, test_data, counters)`` of a fresh single-process BCFW run whose data is on a GPU: on a GPU each block
    step is a handful of kernel launches, hundreds of times slower than the CPU's compiled kernel
    (docs/results/gpu.md), so a few one-block steps of plain BCFW (the same progress per block) are timed on each
    device and the data moved to the CPU when it is faster (:func:`faster_device`); ``counters``: the figures of
    the choice (:data:`PLACEMENT_COUNTERS`)."""
    cpu_data = data.to("cpu")
    cpu_s = plain_seconds_per_block(model, cpu_data, lam, options, 1, max(1, min(CPU_BLOCKS, len(data))))
    gpu_s = plain_seconds_per_block(model, data, lam, options, 1, max(1, min(GPU_BLOCKS, len(data))))
    moved = faster_device(cpu_s, gpu_s) == "cpu"
    counters = dict(zip(PLACEMENT_COUNTERS, (float(moved), cpu_s, gpu_s)))
    if not moved:
        return data, test_data, counters
    return cpu_data, None if test_data is None else test_data.to("cpu"), counters


def _oracle_apply_seconds(alg) -> tuple[float, float, float]:
    """Seconds per oracle call (``block_oracle``), and of the steps towards given answers (``corner_steps``) per block
    and per call (``t(m) = t_round + m t_apply``, the fastest of three rounds of 1 and of ``m`` blocks)."""
    st, m = alg.state, min(alg.n, CALIBRATION_ORACLES)
    blocks = np.arange(m, dtype=np.int64)
    st.block_oracle(0)  # warm-up
    t0 = time.perf_counter()
    ys = [st.block_oracle(i) for i in range(m)]
    t_oracle = (time.perf_counter() - t0) / m

    def steps(k: int) -> float:
        t = time.perf_counter()
        st.corner_steps(blocks[:k], ys[:k], alg.step_code)
        return time.perf_counter() - t

    steps(1)  # warm-up
    one, many = min(steps(1) for _ in range(3)), min(steps(m) for _ in range(3))
    t_apply = max(many - one, 0.0) / max(m - 1, 1)
    return t_oracle, t_apply, max(one - t_apply, 0.0)


def _collective_seconds(op, buf: Tensor, ctx: DistributedContext) -> float:
    """Median seconds of ``op(buf, ctx)`` over ``CALIBRATION_REDUCES`` calls after one warm-up."""
    op(buf, ctx)
    times = []
    for _ in range(CALIBRATION_REDUCES):
        t0 = time.perf_counter()
        op(buf, ctx)
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def choose_strategy(model, data, lam: float, options, ctx: DistributedContext) -> Calibration:
    """Time, on the live group, one block step, one oracle call, one step towards a given corner, one all-reduce of
    ``d + 2`` numbers and one all-gather of a labeling, and predict each strategy's pass (the cost model of
    :mod:`torch_bcfw.distributed.strategy`); every rank of ``ctx`` calls it and gets rank 0's answer."""
    # one scratch single-process run (one-block steps of the run's variant) for every timing
    probe = dataclasses.replace(options, batch_size=1, progress=False)
    alg = make_algorithm("bcfw", model, data, lam, resolve_auto_preset(
        model, data, probe, rounds=options.strategy == "split-oracle"))
    t_step = seconds_per_block(alg, min(alg.n, CALIBRATION_STEPS))
    t_oracle, t_apply, t_round = _oracle_apply_seconds(alg)
    t_ar = _collective_seconds(all_reduce_sum, torch.zeros(model.n_features + 2, dtype=torch.float64), ctx)
    label = torch.zeros(max(1, data[:1].y.numel()), dtype=torch.long)
    t_gather = _collective_seconds(lambda buf, c: all_gather_parts(buf, [buf.numel()] * c.world_size, c), label, ctx)
    figures = [t_step, t_ar, t_oracle, t_apply, t_round, t_gather]
    t_step, t_ar, t_oracle, t_apply, t_round, t_gather = broadcast_from_rank0(
        torch.tensor(figures, dtype=torch.float64), ctx).tolist()
    n, p = len(data), ctx.world_size
    given = options.batch_size if options.batch_size != "auto" else 1
    tau = given if given > 1 else p * max(1, math.ceil(10 * t_ar / max(t_step, 1e-12)))
    tau = min(tau, n)
    r = given if given > 1 else min(p * max(1, math.ceil(10 * (t_round + t_gather) / max(t_oracle, 1e-12))),
                                    max(p, n // 16))
    replicate = n * t_step
    shard_s = shard_pass_seconds(n, p, tau, t_step, t_ar)
    split = split_pass_seconds(n, p, r, t_oracle, t_apply, t_round, t_gather)
    own = options.own
    plain = options.sampling != "gap" and own.step_rule in (None, "fw") and not own.cache
    if plain and replicate >= SHARD_MARGIN * split:  # split rounds run plain BCFW only
        chosen = "split-oracle"
    elif tau <= min(MAX_SHARD_ROUND * p, n // 4) and replicate >= SHARD_MARGIN * shard_s:
        chosen = "shard"
    else:
        chosen = "replicate"
    return Calibration(chosen, t_step, t_ar, int(tau), replicate, shard_s, t_oracle, t_apply, t_round, t_gather,
                       int(r), split)


# ----------------------------------------------------------------------------------------- the plan
def continued_strategy(sharded_state: bool, full_state: bool, previous: str | None) -> str | None:
    """The strategy that continues a saved run: a sharded state continues sharded, a full dual state (a replicated,
    split-oracle or single-process run's) replicated or split-oracle as it was saved; without a saved state the
    ``previous`` decision (``None``: none yet)."""
    if sharded_state:
        return "shard"
    if full_state:
        return "split-oracle" if previous == "split-oracle" else "replicate"
    return previous


@dataclass
class RunPlan:
    """A run's choices (what :func:`plan_run` decided).

    Attributes:
        data, test_data: all the examples and the test data (or ``None``), on the device the run solves on.
        options: the run's options, nothing left on ``"auto"``: ``batch_size`` a number, BCFW's preset resolved,
            ``strategy`` the one chosen over a process group.
        group: the process group (``None``: one process).
        comm: the communicator the algorithm takes (``None``: one process).
        calibration: the :class:`~torch_bcfw.distributed.strategy.Calibration` behind the strategy, when this run
            calibrated.
        placement: the figures of the device choice (:data:`PLACEMENT_COUNTERS`; empty when none was measured).
    """

    data: object
    test_data: object
    options: object
    group: DistributedContext | None = None
    comm: object = None
    calibration: Calibration | None = None
    placement: dict = field(default_factory=dict)

    @property
    def strategy(self) -> str:
        return self.options.strategy

    @property
    def sharded(self) -> bool:
        return self.strategy == "shard" and self.group is not None

    @property
    def round_size(self) -> int:
        return self.options.batch_size

    def data_here(self):
        """This process's examples: its shard of :attr:`data` in a sharded run, else all of them."""
        return shard(self.data, self.group, check=False).data if self.sharded else self.data

    def record(self, rounds: bool = True) -> dict:
        """The counters the run adds: the calibration's figures (``calibration_*``) and (``rounds``) a sharded run's
        all-reduce time and count so far."""
        out = {}
        if self.calibration is not None:
            out.update({f"calibration_{k}": v for k, v in dataclasses.asdict(self.calibration).items()
                        if k not in ("strategy", "shard_batch_size", "split_batch_size")})
        if rounds and self.sharded:
            out.update(allreduce_seconds=self.comm.round_seconds, allreduce_rounds=self.comm.rounds)
        return out

    def describe(self) -> str:
        """One line: the chosen strategy and the calibration's predictions."""
        c = self.calibration
        line = f"strategy {self.strategy} over {self.group.world_size if self.group else 1} processes"
        if c is None:
            return line
        return (f"{line}: predicted {c.replicate_pass_seconds:.3g} s per pass replicated, {c.shard_pass_seconds:.3g} s "
                f"sharded in rounds of {c.shard_batch_size}, {c.split_pass_seconds:.3g} s with the oracle split in "
                f"rounds of {c.split_batch_size} (oracle {c.oracle_seconds:.3g} s, all-gather {c.gather_seconds:.3g} "
                f"s; block step {c.step_seconds:.3g} s, all-reduce {c.allreduce_seconds:.3g} s)")


def plan_run(model, data, lam: float, solver: str, options, group: DistributedContext | None = None, *,
             test_data=None, bounds=None, saved: str | None = None, saved_round_size: int | None = None,
             check_data: bool = True) -> RunPlan:
    """Every ``"auto"`` choice of a run of ``solver`` on the full ``data`` (the one place these rules live).

    * **device**: a fresh (``saved`` is ``None``) single-process BCFW run without ``bounds`` whose data is on a GPU
      and whose ``batch_size`` is ``"auto"`` solves where plain block steps are measured cheaper
      (:func:`solver_placement`; ``data`` and ``test_data`` moved).
    * **strategy** (``group``: a process group of several ranks): the saved run's (``saved``,
      :func:`continued_strategy`); ``"replicate"`` when asked, or under ``"auto"`` for a solver other than BCFW
      (only BCFW shards or splits its oracle calls); else :func:`choose_strategy` calibrates (a forced setting
      predicted slow gets a warning).  ``check_data``: check first that every rank holds the same examples.
    * **round size** (``batch_size="auto"``): the calibration's for a sharded or split-oracle run, the saved run's
      (``saved_round_size``); else 1 for a solver other than BCFW, for data on the CPU and for a sharded run's
      blocks; else (data on a GPU) :func:`measured_round_size`.  A forced round size on a GPU is timed against
      these (:func:`warn_if_slow_rounds`).
    * **preset** (BCFW): :func:`resolve_auto_preset`, with rounds for a round size above 1, a sharded or a
      split-oracle run.
    """
    if solver == "bcfw":
        options = BCFW.with_own_options(options)
    placement, given, planned, cal, comm = {}, options.strategy, saved_round_size, None, None
    fresh_gpu_bcfw = saved is None and solver == "bcfw" and data.device.type != "cpu"
    if group is None:
        if fresh_gpu_bcfw and bounds is None and options.batch_size == "auto":
            data, test_data, placement = solver_placement(model, data, test_data, lam, options)
        elif fresh_gpu_bcfw and options.batch_size != "auto":
            warn_if_slow_rounds(model, data, lam, options)
        strategy = given
    else:
        if check_data:
            check_same_dataset(data, group)
        if saved is not None:
            if given not in ("auto", saved):
                kind = {"shard": "sharded", "split-oracle": "split-oracle"}.get(saved, "replicated or single-process")
                raise ValueError(f"the run to continue is a {kind} run: it continues with strategy={saved!r}, not "
                                 f"{given!r}")
            strategy = saved
        elif given == "split-oracle" and solver != "bcfw":
            raise ValueError(f"strategy='split-oracle' runs BCFW rounds; solver={solver!r} replicates or shards")
        elif given == "replicate" or (given == "auto" and solver != "bcfw"):
            strategy = "replicate"
        else:
            cal = choose_strategy(model, data, lam, options, group)
            strategy = cal.strategy if given == "auto" else given
            planned = cal.shard_batch_size if strategy == "shard" else cal.split_batch_size
            warn_if_slow(cal, strategy, options.batch_size, len(data), group)
        if strategy == "replicate":
            planned = saved_round_size
        elif options.batch_size == "auto" and planned is None:
            raise ValueError(f"the saved state of this {strategy} run does not record its round size: give batch_size")
    sharded = strategy == "shard" and group is not None
    size = options.batch_size
    if size == "auto":
        if planned is not None:
            size = planned
        elif solver != "bcfw" or sharded or data.device.type == "cpu":
            size = 1
        else:
            size = measured_round_size(model, data, lam, options)
    opts = dataclasses.replace(options, strategy=strategy, batch_size=size)
    if solver == "bcfw":
        opts = resolve_auto_preset(model, data, opts, rounds=size > 1 or strategy == "split-oracle" or sharded)
    if sharded:
        comm = ShardComm(group, shard_sizes(len(data), group.world_size))
    elif group is not None:  # every rank the same single-process solve; stopping decisions agreed; rank 0 shows
        comm = SplitOracleComm(group) if strategy == "split-oracle" else ReplicaComm(group)
        if not group.is_main:
            opts = dataclasses.replace(opts, progress=False)
    return RunPlan(data, test_data, opts, group, comm, cal, placement)
