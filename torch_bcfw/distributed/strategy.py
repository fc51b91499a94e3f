"""How ``fit`` uses a process group: replicate the single-process solve on every rank, split a replicated run's
oracle calls over the ranks, or shard the examples.

``choose_strategy`` times, on the live group, one block step, one oracle call, one step towards a given corner, one
all-reduce of ``d + 2`` numbers and one all-gather of a labeling (rank 0's figures decide).  Per effective pass,
replicating costs ``n t_step``; splitting the oracle ``n (t_oracle / P + t_apply) + (n / R) (t_round + t_gather)``
for rounds of ``R`` blocks (the smallest multiple of ``P`` whose fixed costs are at most a tenth of a rank's oracle
calls, at most ``n / 16``); sharding ``(n / P) t_step + (n / tau) t_allreduce`` for rounds of ``tau`` blocks (the
given ``batch_size``, or the smallest multiple of ``P`` whose all-reduce costs at most a tenth of the round's steps,
and at most ``MAX_SHARD_ROUND`` per process and ``n / 4``: larger rounds need more passes).  Another way than
replicating must be predicted ``SHARD_MARGIN`` times faster; splitting goes before sharding (it needs the passes of
BCFW, ``docs/results/scale.md``).
"""
from __future__ import annotations

import math
import time
import warnings
from typing import NamedTuple

import dataclasses

import numpy as np
import torch
import torch.distributed as dist

from torch import Tensor

from ..solvers.certificate import Certificate, squared_norm, with_dual
from ..solvers.local_comm import LocalComm
from ..solvers.bcfw import (chosen_round_size, resolve_batch_size, round_costs, round_size_candidates,
                            seconds_per_block)
from ..solvers.run import make_algorithm
from .collectives import all_gather_parts, all_reduce_sum, broadcast_from_rank0, collective
from .shard_comm import ShardComm
from .context import DistributedContext
from .errors import DistributedError
from .sharding import check_same_dataset, shard, shard_bounds, shard_sizes

__all__ = ["RunStrategy", "resolve_strategy", "continued_strategy", "warn_if_slow_rounds", "Calibration",
           "choose_strategy", "shard_pass_seconds", "split_pass_seconds", "pass_seconds", "warn_if_slow", "ReplicaComm",
           "SplitOracleComm", "SHARD_MARGIN", "MAX_SHARD_ROUND", "SLOW_SETTING_RATIO"]

#: sharding must be predicted this many times faster per pass than replicating to be chosen
SHARD_MARGIN = 1.5
#: nor are rounds of more than this many blocks per process chosen: they need many more passes than one-block
#: steps (OCR-large: rounds of 256 need 9x the passes of BCFW, docs/results/scale.md)
MAX_SHARD_ROUND = 8
#: a forced setting predicted this many times slower per pass than the calibration's choice gets a warning
SLOW_SETTING_RATIO = 3.0
#: block steps, oracle calls (and interpreted steps) and all-reduces timed by the calibration
CALIBRATION_STEPS, CALIBRATION_ORACLES, CALIBRATION_REDUCES = 256, 16, 5


class Calibration(NamedTuple):
    """What ``choose_strategy`` measured and predicted (rank 0's figures, the same on every rank)."""

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


class ReplicaComm(LocalComm):
    """A replicated run: every block here, the clock's stopping decisions taken together, and the exact gap pass
    split: each rank decodes its contiguous share and the per-example terms are gathered, so that every rank sums
    the same vector a single process would (the same bits)."""

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
        return with_dual(0.5 * lam * sq + float(hinge.mean()), ell, lam, sq, y_part)

    def task_loss(self, model, data, w: Tensor) -> float:
        if len(data) < self.ctx.world_size:
            return super().task_loss(model, data, w)
        part = self._share(data)
        losses = model.loss(part, model.decode(w.to(torch.float64), part))
        return float(self._gathered(losses.to(torch.float64), len(data)).mean())


class _PendingCorners(NamedTuple):
    """A round's answers in flight: the all-gather's handle and buffers, the labelings' shapes and their device."""

    handle: object
    out: list
    shapes: list
    device: torch.device


class SplitOracleComm(ReplicaComm):
    """``strategy="split-oracle"``: a replicated run whose rounds' oracle calls are split over the ranks (rank ``r``
    decodes positions ``r, r + P, ...``; one asynchronous all-gather shares the labelings).  The trajectory is the
    same under any number of ranks."""

    def __init__(self, ctx: DistributedContext):
        super().__init__(ctx)
        self._shapes_of = self._shapes = None

    def _label_shapes(self, state) -> list:
        """The shape of every block's labeling (read once per data object)."""
        if self._shapes_of is not state.data:
            self._shapes_of, self._shapes = state.data, [state.block_data(i).y.shape for i in range(state.n)]
        return self._shapes

    def start_corners(self, state, blocks: np.ndarray) -> _PendingCorners:
        p, r = self.ctx.world_size, self.ctx.rank
        every = self._label_shapes(state)
        shapes = [every[i] for i in blocks.tolist()]
        sizes = [sum(math.prod(s) for s in shapes[k::p]) for k in range(p)]
        buf = torch.zeros(max(sizes), dtype=torch.long)
        mine = [state.block_oracle(i).to(torch.long).reshape(-1) for i in blocks[r::p].tolist()]
        if mine:
            buf[:sizes[r]] = torch.cat(mine)
        out = [torch.empty_like(buf) for _ in range(p)]
        with collective("split-oracle all_gather", self.ctx):
            handle = dist.all_gather(out, buf.to(self.ctx.device), async_op=True)
        return _PendingCorners(handle, out, shapes, state.w.device)

    def finish_corners(self, pending: _PendingCorners) -> list[Tensor]:
        with collective("split-oracle all_gather", self.ctx):
            pending.handle.wait()
        p, shapes = self.ctx.world_size, pending.shapes
        answers = [None] * len(shapes)
        for k in range(p):  # rank k's answers, in the order of its positions
            flat, at = pending.out[k].to(pending.device), 0
            for j in range(k, len(shapes), p):
                c = math.prod(shapes[j])
                answers[j] = flat[at:at + c].reshape(shapes[j])
                at += c
        return answers


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


def shard_pass_seconds(n: int, p: int, tau: int, t_step: float, t_ar: float) -> float:
    """Predicted seconds of one effective pass sharded over ``p`` ranks in rounds of ``tau`` blocks."""
    return (n / p) * t_step + (n / max(tau, 1)) * t_ar


def split_pass_seconds(n: int, p: int, r: int, t_oracle: float, t_apply: float, t_round: float,
                       t_gather: float) -> float:
    """Predicted seconds of one effective pass with the oracle calls of rounds of ``r`` blocks split over ``p``
    ranks."""
    return n * (t_oracle / p + t_apply) + (n / max(r, 1)) * (t_round + t_gather)


def choose_strategy(model, data, lam: float, options, ctx: DistributedContext) -> Calibration:
    """Measure and predict (see the module's docstring); every rank of ``ctx`` calls it and gets rank 0's answer."""
    # one scratch single-process run (one-block steps) for every timing
    alg = make_algorithm("bcfw", model, data, lam, dataclasses.replace(options, batch_size=1, progress=False,
                                                                        solver_options=None))
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
    shard = shard_pass_seconds(n, p, tau, t_step, t_ar)
    split = split_pass_seconds(n, p, r, t_oracle, t_apply, t_round, t_gather)
    plain = options.sampling != "gap" and options.step_rule in (None, "fw") and not options.cache
    if plain and replicate >= SHARD_MARGIN * split:  # split rounds run plain BCFW only
        chosen = "split-oracle"
    elif tau <= min(MAX_SHARD_ROUND * p, n // 4) and replicate >= SHARD_MARGIN * shard:
        chosen = "shard"
    else:
        chosen = "replicate"
    return Calibration(chosen, t_step, t_ar, int(tau), replicate, shard, t_oracle, t_apply, t_round, t_gather, int(r),
                       split)


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


def warn_if_slow_rounds(model, data, lam: float, opts) -> float:
    """Time a forced ``batch_size`` (one process, data on a GPU) against the round sizes ``batch_size="auto"`` would
    choose from and warn when it is predicted :data:`SLOW_SETTING_RATIO` times slower per pass.  Returns the ratio."""
    forced = int(opts.batch_size)
    candidates = round_size_candidates(len(data))
    costs = round_costs(model, data, lam, opts, sorted({forced, *candidates}))
    auto = chosen_round_size({t: costs[t] for t in candidates})
    ratio = costs[forced] / costs[auto]
    if ratio > SLOW_SETTING_RATIO:
        warnings.warn(f"batch_size={forced} is predicted {ratio:.0f}x slower per pass than batch_size={auto} "
                      f"({costs[forced] * len(data):.3g} s against {costs[auto] * len(data):.3g} s, measured on "
                      f"{data.device}); batch_size='auto' chooses the round size by this measurement", stacklevel=4)
    return ratio


def continued_strategy(sharded_state: bool, full_state: bool, previous: str | None) -> str | None:
    """The strategy that continues a saved run: a sharded state continues sharded, a full dual state (a replicated,
    split-oracle or single-process run's) replicated or split-oracle as it was saved; without a saved state the
    ``previous`` decision (``None``: none yet)."""
    if sharded_state:
        return "shard"
    if full_state:
        return "split-oracle" if previous == "split-oracle" else "replicate"
    return previous


@dataclasses.dataclass
class RunStrategy:
    """How one run uses the process group (what :func:`resolve_strategy` decided).

    Attributes:
        strategy: ``"replicate"``, ``"shard"`` or ``"split-oracle"`` (without a group: the given option).
        options: the run's options, ``strategy`` and ``batch_size`` resolved (the round size as a number).
        group: the process group (``None``: one process).
        comm: the communicator the algorithm takes (``None``: one process).
        calibration: the :class:`Calibration` behind the choice, when this run calibrated.
    """

    strategy: str
    options: object
    group: DistributedContext | None = None
    comm: object = None
    calibration: Calibration | None = None

    @property
    def sharded(self) -> bool:
        return self.strategy == "shard" and self.group is not None

    @property
    def round_size(self) -> int:
        return self.options.batch_size

    def data_here(self, data):
        """This process's examples: its shard of ``data`` in a sharded run, else all of them."""
        return shard(data, self.group, check=False).data if self.sharded else data

    def record(self, rounds: bool = True) -> dict:
        """The counters the run adds: the calibration's figures (``calibration_*``) and (``rounds``) a sharded run's
        all-reduce time and count so far."""
        out = {}
        if self.calibration is not None:
            out.update({f"calibration_{k}": v for k, v in self.calibration._asdict().items()
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


def resolve_strategy(model, data, lam: float, solver: str, options, group: DistributedContext | None, *,
                     saved: str | None = None, saved_round_size: int | None = None,
                     check_data: bool = True) -> RunStrategy:
    """The strategy, round size and communicator of a run of ``solver`` on the full ``data`` (the one place these
    rules live; :func:`torch_bcfw.fit` and the Lightning callback call it).

    ``group``: the process group of several ranks (``None``: one process).  ``saved`` / ``saved_round_size``: the
    strategy (:func:`continued_strategy`) and round size of the run being continued.  A fresh run with
    ``strategy="auto"``, ``"shard"`` or ``"split-oracle"`` calibrates (:func:`choose_strategy`; only BCFW shards or
    splits its oracle calls) and warns when a forced setting is predicted slow; ``check_data``: check first that every
    rank holds the same examples."""
    planned = saved_round_size
    if group is None:
        if (saved is None and solver == "bcfw" and data.device.type != "cpu"
                and isinstance(options.batch_size, int)):
            warn_if_slow_rounds(model, data, lam, options)
        return RunStrategy(options.strategy, resolve_batch_size(options, solver, model, data, lam, planned=planned))
    given, cal = options.strategy, None
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
        strategy = "replicate"  # only BCFW shards or splits its oracle calls
    else:
        cal = choose_strategy(model, data, lam, options, group)
        strategy = cal.strategy if given == "auto" else given
        planned = cal.shard_batch_size if strategy == "shard" else cal.split_batch_size
        warn_if_slow(cal, strategy, options.batch_size, len(data), group)
    if strategy == "replicate":
        planned = saved_round_size
    elif options.batch_size == "auto" and planned is None:
        raise ValueError(f"the saved state of this {strategy} run does not record its round size: give batch_size")
    opts = resolve_batch_size(dataclasses.replace(options, strategy=strategy), solver, model, data, lam,
                              sharded=strategy == "shard", planned=planned)
    if strategy == "shard":
        comm = ShardComm(group, shard_sizes(len(data), group.world_size))
    else:  # every rank the same single-process solve; stopping decisions agreed; rank 0 shows and saves
        comm = SplitOracleComm(group) if strategy == "split-oracle" else ReplicaComm(group)
        if not group.is_main:
            opts = dataclasses.replace(opts, progress=False)
    return RunStrategy(strategy, opts, group, comm, cal)
