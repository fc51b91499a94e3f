"""Block-Coordinate Frank-Wolfe (Lacoste-Julien et al. 2013, Alg. 4) and its refinements (Osokin et al.
2016: gap sampling, pairwise and away steps, caching), on a model's dual state.

A run is chunks of :class:`~torch_bcfw.duals.plan.StepPlan` (sampling, oracle with working set and cache test, step
rule) that the state runs (:meth:`~torch_bcfw.duals.base.DualState.run_plan`; see ``docs/anatomy.md``).
"""
from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import torch

from ..checks import saved_float, saved_int
from ..duals.plan import CacheTest, StepPlan, WorkingSetUse
from ..duals.stepsize import FW_RULE, STEP_RULES
from .algorithm import DualAlgorithm
from .certificate import Certificate, squared_norm, with_dual
from .local_comm import pass_rounds
from .options import OptionGroup, SolverOptions, check_int, check_real, parse_preset
from .sampling import GapEstimates, GapSampler, make_sampler

__all__ = ["seconds_per_block", "round_costs", "measured_round_size", "round_size_candidates", "chosen_round_size",
           "resolve_batch_size", "BCFW", "CacheOptions", "resolve_auto_preset"]


def resolve_auto_preset(model, data, options, rounds: bool = False):
    """``preset="auto"``: the first of :data:`~torch_bcfw.solvers.options.AUTO_CHOICES` fitting the given fields, in
    an order set by properties of the problem, never a clock (``docs/results/presets.md``): ``uniform-fw`` for
    ``rounds`` (``batch_size > 1``, sharded blocks or ``strategy="split-oracle"``); ``gap-pairwise`` when the
    model's :attr:`~torch_bcfw.models.base.StructuredModel.compiled_steps` is ``"all"`` (a chain on the CPU);
    ``uniform-fw`` for ``"plain"`` or a cheap oracle; else ``gap-pairwise-cache`` (an
    :attr:`~torch_bcfw.models.base.StructuredModel.expensive_oracle`, Osokin et al. 2016, Sec. 5.1).

    Returns the resolved options with ``extra["auto"]`` recording the choice and its reasons; resolved options are
    returned unchanged."""
    if not options.auto_pending:
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
    fits = options.auto_fits()
    name = next(n for n in order if n in fits)
    extra = dict(options.extra)
    extra["auto"] = {"compiled_steps": compiled, "expensive_oracle": expensive, "rounds": bool(rounds),
                     "model": type(model).__name__, "chosen": name}
    return dataclasses.replace(options, **parse_preset(name), extra=extra)


#: the round sizes :func:`measured_round_size` times, and the slack within which it prefers the smaller one
ROUND_SIZE_CANDIDATES, ROUND_SIZE_SLACK = (64, 256, 1024), 2.0


def seconds_per_block(alg, m: int) -> float:
    """Seconds per block iteration of the scratch algorithm ``alg``: the second of two chunks of ``m`` iterations."""
    alg.advance(m)
    t0, work = time.perf_counter(), alg.work
    alg.advance(m)
    return (time.perf_counter() - t0) / max(1, alg.work - work)


def round_costs(model, data, lam: float, options: SolverOptions, sizes) -> dict[int, float]:
    """Seconds per block of plain BCFW in rounds of each size of ``sizes`` (:func:`seconds_per_block`)."""
    return {tau: seconds_per_block(BCFW(model, data, lam, dataclasses.replace(
        options, batch_size=tau, progress=False, sampling="uniform", step_rule="fw", cache=False, preset=None)), tau)
        for tau in sizes}


def measured_round_size(model, data, lam: float, options: SolverOptions) -> int:
    """``batch_size="auto"`` with the data off the CPU: the :func:`chosen_round_size` of the timed
    :func:`round_size_candidates` (docs/results/gpu.md)."""
    return chosen_round_size(round_costs(model, data, lam, options, round_size_candidates(len(data))))


def round_size_candidates(n: int) -> list[int]:
    """The round sizes ``batch_size="auto"`` times: those of ``ROUND_SIZE_CANDIDATES`` up to ``n / 2``."""
    return [t for t in ROUND_SIZE_CANDIDATES if t <= n // 2] or [max(1, n // 2)]


def chosen_round_size(cost: dict[int, float]) -> int:
    """The smallest round size whose cost per block is within ``ROUND_SIZE_SLACK`` of the cheapest."""
    best = min(cost.values())
    return min(t for t, c in cost.items() if c <= ROUND_SIZE_SLACK * best)


def resolve_batch_size(options: SolverOptions, solver: str, model, data, lam: float, *, sharded: bool = False,
                       planned: int | None = None) -> SolverOptions:
    """``options`` with ``batch_size="auto"`` resolved (the one place it is): a given integer stays; else ``planned``
    (the round size of a distributed strategy's calibration, or of the saved run being continued); else ``1`` for a
    solver other than ``"bcfw"``, for data on the CPU and for a ``sharded`` run's blocks; else (data on a GPU)
    :func:`measured_round_size`."""
    if options.batch_size != "auto":
        return options
    if planned is not None:
        size = planned
    elif solver != "bcfw" or sharded or data.device.type == "cpu":
        size = 1
    else:
        size = measured_round_size(model, data, lam, options)
    return dataclasses.replace(options, batch_size=size)


@dataclass
class CacheOptions(OptionGroup):
    """The options of BCFW's cache (``cache=True``, Osokin et al. 2016, Alg. 5), given as ``cache_size``, ``cache_F``
    and ``cache_nu``: keep a working set of past oracle answers per block and use its best labeling instead of the
    oracle when ``g_hat_i >= max(F g_i, nu / n g_global)``.

    Attributes:
        size: maximum labelings per block, an integer >= 1 (default 100); the inactive one with the lowest score is
            evicted, active ones never.
        F: local factor ``F`` of the cache-hit test, > 0 (default 0.25; ``inf`` allowed).
        nu: global factor ``nu`` of the cache-hit test, > 0 (default 0.01); ``inf`` disables hits.
    """

    prefix: ClassVar[str] = "cache"
    size: int = 100
    F: float = 0.25
    nu: float = 0.01

    def __post_init__(self) -> None:
        self.size = check_int("cache_size", self.size, 1)
        self.F = float(check_real("cache_F", self.F, positive=True, finite=False))
        self.nu = float(check_real("cache_nu", self.nu, positive=True, finite=False))


class BCFW(DualAlgorithm):
    """BCFW and its refinements; see the module docstring and :class:`~torch_bcfw.solvers.options.SolverOptions`.

    Attributes (refined runs):
        estimates: :class:`GapEstimates`, the per-block gap estimates (gap sampling and the cache test).
        glob_gap: the last exact duality gap ``g^(k0)`` (the global term of the cache test).
        steps: block iterations (oracle calls + cache hits).
        last_block_gaps / last_blocks: the oracle block gaps (``nan`` on cache hits) and blocks of the last chunk.
    """

    name = "bcfw"
    Options = CacheOptions

    def __init__(self, model, data, lam, options, state=None, bounds=None, comm=None):
        options = resolve_batch_size(options, self.name, model, data, lam, sharded=comm is not None and comm.sharded)
        if options.preset == "auto":
            options = resolve_auto_preset(model, data, options, rounds=options.batch_size > 1 or options.strategy ==
                                          "split-oracle" or (comm is not None and comm.sharded))
        super().__init__(model, data, lam, options, state, bounds, comm)
        self.batch_size = options.batch_size
        self.split_oracle = options.strategy == "split-oracle"
        if self.split_oracle and (options.refined or options.step_rule != "fw" or self.comm.sharded):
            raise ValueError("strategy='split-oracle' runs plain BCFW rounds (uniform or perm sampling, FW steps, no "
                             f"cache) on a replicated state (got {options.variant_name()!r})")
        self.minibatch = (self.batch_size > 1 and not self.split_oracle) or self.comm.sharded
        if self.minibatch and options.step_rule != "fw":
            raise ValueError(
                "mini-batch BCFW (batch_size > 1) and BCFW over several processes take joint FW steps (with any "
                f"sampling and the cache); pairwise / away steps are one-block refinements (got "
                f"{options.variant_name()!r})")
        if self.batch_size > self.n:
            raise ValueError(f"batch_size = {self.batch_size} exceeds the number of examples n = {self.n}")
        self.rule = STEP_RULES[options.step_rule]
        self.refined = options.refined
        self.steps = 0
        self.last_block_gaps = self.last_blocks = None
        self.glob_gap = np.inf
        self._since_refresh = -1  # iterations since the last exact gap pass (-1: none yet)
        self.exact_block_gaps = None  # (g, H) of the last exact gap pass (refined runs)
        self._scheduled = False  # the next certificate is a check of the run's schedule (on_scheduled_check)
        self._resume_point = None  # the sampling state before an unscheduled certificate (see state_dict)
        n_here = len(data)
        seed = options.seed if not self.comm.sharded else np.random.SeedSequence([options.seed, self.comm.rank])
        self.estimates = GapEstimates(n_here, options.gap_power) if self.refined else None
        self.sampler = make_sampler(options.sampling, n_here, seed, self.estimates)
        if self.refined:
            self.use_ws = options.cache or self.rule != FW_RULE
            if self.use_ws:
                self.state.ensure_working_set()
            st = self.state
            fresh = st.k == 0 and not st.has_bounds and (st.d == 0 or float(st.v.abs().max()) == 0.0)
            if fresh:  # exact gap at alpha_i = e_{y_i}: P(0) - D(0) = mean_i max_y L_i(y)
                self.glob_gap = self.comm.sum_scalar(float(model.max_loss(data).sum())) / self.n

    @property
    def work(self) -> int:
        return self.steps if self.refined else self.oracle_calls

    def chunk_size(self) -> int:  # realign to whole passes after an early gap pass or a mid-pass warm start
        return self.n - self.steps % self.n

    def _refine(self, plan: StepPlan) -> StepPlan:
        """Add the refinements to ``plan``: the gap estimates, the working set and the cache test."""
        o, c = self.options, self.options.solver_options
        plan.estimates = self.estimates
        if self.use_ws:
            cache = None
            if o.cache:
                g = self.glob_gap
                cache = CacheTest(c.F, np.inf if (c.nu == np.inf or g == np.inf) else c.nu / self.n * g)
            plan.working_set = WorkingSetUse(keep_inactive=o.cache, max_size=c.size if o.cache else 0, cache=cache)
        return plan

    def _plan(self, m: int) -> StepPlan:
        plan = self._refine(StepPlan(m=m, rule=self.rule, step_code=self.step_code, averaging=self.options.averaging))
        if isinstance(self.sampler, GapSampler):
            plan.draw_by_gap(self.sampler.uniforms(m), self.sampler.queue, self.sampler.smeta, self.estimates)
        else:
            plan.order = self.sampler.draw(m)
        return plan

    def advance(self, m: int) -> None:
        self._resume_point = None
        if self.minibatch:
            return self._advance_rounds(m)
        if self.split_oracle:
            return self._advance_split_oracle(m)
        if not self.refined:
            plan = StepPlan.plain(self.sampler.draw(m), self.step_code, self.options.averaging)
        else:
            plan = self._plan(m)
        res = self.run_plan(plan)
        if isinstance(self.sampler, GapSampler):
            self.sampler.consumed(res.steps, m)
        self.oracle_calls += res.oracle_calls
        self.cache_hits += res.cache_hits
        self._end_chunk(res, res.steps)

    def _end_chunk(self, res, done: int) -> None:
        """Count the ``done`` block iterations of the chunk ``res`` and take up its request of an exact gap pass."""
        self.steps += done
        self.last_block_gaps, self.last_blocks = res.gaps, res.blocks
        if res.need_gap_pass:
            if self._since_refresh == 0 and done == 0:
                self.converged = True  # the exact block gaps just computed are all zero: optimal
            self.check_requested = True
        if self._since_refresh >= 0:
            self._since_refresh += done

    def _advance_rounds(self, m: int) -> None:
        """At least ``m`` block iterations (all processes) in whole rounds of about ``batch_size`` distinct blocks, one
        joint step each.  A pass is always cut into the same rounds
        (:func:`~torch_bcfw.solvers.local_comm.pass_rounds`), so a run split at a pass boundary continues exactly."""
        local, total = pass_rounds(self.n, self.batch_size, self.comm)
        ends = np.cumsum(total)
        pos = self.steps % self.n
        j0 = int(np.searchsorted(ends, pos, side="right"))
        j1 = int(np.searchsorted(ends, pos + m, side="left")) + 1
        reduce = self.comm.sum_round if self.comm.sharded else None
        by_gap = isinstance(self.sampler, GapSampler)
        if by_gap:  # blocks drawn round by round from the estimates
            sizes = local[j0:j1]
            offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
            plan = StepPlan.minibatch(np.zeros(int(offsets[-1]), dtype=np.int64), offsets, self.step_code,
                                      self.options.averaging, reduce)
            plan.draw_by_gap(self.sampler.uniforms(plan.m), self.sampler.queue, self.sampler.smeta, self.estimates)
        else:
            order, offsets = self.sampler.draw_rounds(local[j0:j1])
            plan = StepPlan.minibatch(order, offsets, self.step_code, self.options.averaging, reduce)
        if self.refined:
            self._refine(plan)
        res = self.state.run_plan(plan)
        done = int(ends[j0 + res.rounds - 1]) - pos if res.rounds else 0
        if by_gap:
            self.sampler.consumed(res.steps, plan.m)
        if self.refined:
            hits = res.cache_hits
            if self.comm.sharded and self.options.cache:
                hits = int(self.comm.sum_scalar(res.cache_hits))  # every process' hits
            self.oracle_calls += res.oracle_calls + res.cache_hits - hits
            self.cache_hits += hits
        else:
            self.oracle_calls += done
        self._end_chunk(res, done)

    def _advance_split_oracle(self, m: int) -> None:
        """At least ``m`` block iterations in whole rounds of ``batch_size`` blocks (cut at its multiples).  Each round
        is decoded at the current ``w`` (:meth:`~torch_bcfw.solvers.local_comm.LocalComm.start_corners`) before the
        previous round takes its one-block FW steps in order (:meth:`~torch_bcfw.duals.base.DualState.corner_steps`): an
        older corner is still a corner, so every step keeps the dual feasible and never decreases it."""
        done, pending = 0, None
        while done < m:
            pos = self.steps % self.n
            size = min(self.batch_size - pos % self.batch_size, self.n - pos)
            blocks = self.sampler.draw(size)
            started = (blocks, self.comm.start_corners(self.state, blocks))
            if pending is not None:
                self._corner_steps(*pending)
            pending = started
            self.steps += size
            self.oracle_calls += size
            done += size
        self._corner_steps(*pending)
        self.last_block_gaps = self.last_blocks = None

    def _corner_steps(self, blocks: np.ndarray, started) -> None:
        self.state.corner_steps(blocks, self.comm.finish_corners(started), self.step_code, self.options.averaging)

    def on_scheduled_check(self) -> None:
        super().on_scheduled_check()
        self._scheduled = True

    def certificate(self) -> Certificate:
        if not self.refined:
            return super().certificate()
        # an unscheduled check refreshes the estimates where an uninterrupted run would not: state_dict saves the
        # state before the refresh, so that a warm start continues exactly
        self._resume_point = None if self._scheduled else self._sampling_state()
        self._scheduled = False
        st = self.state
        g, H, y_star = st.block_gaps()
        self.exact_block_gaps = (g, H)
        self.set_exact_block_gaps(g.detach().cpu().numpy())
        w = st.w
        sq = squared_norm(w)
        if self.comm.sharded:  # sum_i H_i and l over every process' blocks
            sums = self.comm.sum_pair(torch.stack([H.sum(), H.new_tensor(st.ell)]), 0.0)[0]
            hinge, ell = float(sums[0]) / self.n, float(sums[1]) - st.box_term()
        else:
            hinge, ell = float(H.mean()), st.dual_ell()
        cert = with_dual(0.5 * self.lam * sq + hinge, ell, self.lam, sq, y_star)
        self.glob_gap = max(cert.gap, 0.0)
        return self.trusted(cert)

    def estimated_gap(self) -> float | None:
        if self.estimates is None:
            return None
        return self.comm.sum_scalar(float(self.estimates.est.sum()))  # +inf while some block was never measured

    def set_exact_block_gaps(self, g) -> None:
        """Start from known exact block gaps ``g`` (``float64[n]``, e.g. those a rescaling of ``lam`` predicts):
        they become the estimates (the first-visit pass is skipped) and their sum the global gap of the cache
        test, as after an exact gap pass.  Refined runs only."""
        if self.estimates is None:
            raise ValueError("set_exact_block_gaps needs a refined BCFW (gap sampling or cache)")
        g = np.asarray(g, dtype=np.float64)
        self.estimates.refresh(g)
        if isinstance(self.sampler, GapSampler):
            self.sampler.end_first_visits()
        self.glob_gap = max(float(np.clip(g, 0.0, None).sum()), 0.0)
        self._since_refresh = 0

    def _sampling_state(self) -> dict:
        """What an exact gap pass changes besides ``exact_block_gaps`` (estimates, queue position, global gap)."""
        sd = {"sampler": self.sampler.state_dict(), "glob_gap": self.glob_gap, "since_refresh": self._since_refresh}
        if self.estimates is not None:
            sd["estimates"] = self.estimates.state_dict()
        return sd

    def state_dict(self) -> dict:
        """Everything a warm start needs to continue the run exactly; after an unscheduled certificate, the sampling
        state before its refresh (that of the uninterrupted run)."""
        sd = {"state": self.state.state_dict(), "oracle_calls": self.oracle_calls, "steps": self.steps,
              "cache_hits": self.cache_hits}
        if self.comm.sharded:
            sd["shard"] = {"rank": self.comm.rank, "world_size": self.comm.world_size}
        sd.update(self._sampling_state() if self._resume_point is None else self._resume_point)
        return sd

    def load_state_dict(self, sd: dict) -> None:
        saved = sd.get("shard", {"rank": 0, "world_size": 1})
        ours = {"rank": self.comm.rank, "world_size": self.comm.world_size}
        if saved != ours:
            raise ValueError(
                f"this run state was saved by rank {saved['rank']} of {saved['world_size']} process(es); this is rank "
                f"{ours['rank']} of {ours['world_size']}: resume with the world size of the run that saved it, each "
                "rank from its own file (a sharded state is not re-sharded)")
        self.state.load_state_dict(sd["state"])
        if self.comm.sharded:  # w is the sum of every process' blocks
            self.state.check_w(self.comm.sum_pair)
        self.sampler.load_state_dict(sd["sampler"])
        self.oracle_calls = saved_int(sd["oracle_calls"], "oracle_calls", 0)
        self.steps = saved_int(sd.get("steps", self.oracle_calls), "steps", 0)
        self.cache_hits = saved_int(sd.get("cache_hits", 0), "cache_hits", 0)
        self.glob_gap = saved_float(sd.get("glob_gap", np.inf), "glob_gap", finite=False, lo=0.0)
        self._since_refresh = saved_int(sd.get("since_refresh", -1), "since_refresh", -1)
        if self.estimates is not None and "estimates" in sd:
            self.estimates.load_state_dict(sd["estimates"])
        if self.refined and self.use_ws:
            self.state.ensure_working_set()
