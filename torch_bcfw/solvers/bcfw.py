"""Block-Coordinate Frank-Wolfe (Lacoste-Julien et al. 2013, Alg. 4) and its refinements (Osokin et al.
2016: gap sampling, pairwise and away steps, caching), on a model's dual state.

A run is chunks of :class:`~torch_bcfw.duals.plan.StepPlan` (sampling, oracle with working set and cache test, step
rule) that the state runs (:meth:`~torch_bcfw.duals.base.DualState.run_plan`; see ``docs/anatomy.md``).
"""
from __future__ import annotations

import numpy as np
import torch

from ..checks import saved_float, saved_int
from ..duals.plan import CacheTest, StepPlan, WorkingSetUse
from ..duals.stepsize import FW_RULE, STEP_RULES
from .algorithm import DualAlgorithm
from ..certificate import Certificate, squared_norm, with_dual
from ..distributed.communicators import pass_rounds
from .bcfw_options import BCFWOptions, auto_pending, is_refined, variant_name
from .sampling import GapEstimates, GapSampler, make_sampler

__all__ = ["BCFW"]


class BCFW(DualAlgorithm):
    """BCFW and its refinements; see the module docstring and :class:`~torch_bcfw.solvers.options.SolverOptions`.

    Attributes (refined runs):
        estimates: :class:`GapEstimates`, the per-block gap estimates (gap sampling and the cache test).
        glob_gap: the last exact duality gap ``g^(k0)`` (the global term of the cache test).
        steps: block iterations (oracle calls + cache hits).
        last_block_gaps / last_blocks: the oracle block gaps (``nan`` on cache hits) and blocks of the last chunk.
    """

    name = "bcfw"
    Options = BCFWOptions

    def __init__(self, model, data, lam, options, state=None, bounds=None, comm=None):
        options = self.with_own_options(options)
        if options.batch_size == "auto" or auto_pending(options):
            raise ValueError(f"BCFW takes options with nothing left on 'auto' (batch_size={options.batch_size!r}, "
                             f"preset={options.own.preset!r}): torch_bcfw.planning.plan_run resolves them, as fit does")
        super().__init__(model, data, lam, options, state, bounds, comm)
        self.batch_size = options.batch_size
        self.split_oracle = options.strategy == "split-oracle"
        if self.split_oracle and (is_refined(options) or self.comm.sharded):
            raise ValueError("strategy='split-oracle' runs plain BCFW rounds (uniform or perm sampling, FW steps, no "
                             f"cache) on a replicated state (got {variant_name(options)!r})")
        self.minibatch = (self.batch_size > 1 and not self.split_oracle) or self.comm.sharded
        if self.minibatch and options.own.step_rule != "fw":
            raise ValueError(
                "mini-batch BCFW (batch_size > 1) and BCFW over several processes take joint FW steps (with any "
                f"sampling and the cache); pairwise / away steps are one-block refinements (got "
                f"{variant_name(options)!r})")
        if self.batch_size > self.n:
            raise ValueError(f"batch_size = {self.batch_size} exceeds the number of examples n = {self.n}")
        self.rule = STEP_RULES[options.own.step_rule]
        self.refined = is_refined(options)
        self.steps = 0
        self.last_block_gaps = self.last_blocks = None
        self.glob_gap = np.inf
        self._since_refresh = -1  # iterations since the last exact gap pass (-1: none yet)
        self.exact_block_gaps = None  # (g, H) of the last exact gap pass (refined runs)
        self._scheduled = False  # the next certificate is a check of the run's schedule (on_scheduled_check)
        self._resume_point = None  # the sampling state before an unscheduled certificate (see state_dict)
        n_here = len(data)
        seed = options.seed if not self.comm.sharded else np.random.SeedSequence([options.seed, self.comm.rank])
        self.estimates = GapEstimates(n_here, options.own.gap_power) if self.refined else None
        self.sampler = make_sampler(options.sampling, n_here, seed, self.estimates)
        if self.refined:
            self.use_ws = options.own.cache or self.rule != FW_RULE
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
        o = self.options.own
        plan.estimates = self.estimates
        if self.use_ws:
            cache = None
            if o.cache:
                g = self.glob_gap
                cache = CacheTest(o.cache_F, np.inf if (o.cache_nu == np.inf or g == np.inf) else o.cache_nu / self.n * g)
            plan.working_set = WorkingSetUse(keep_inactive=o.cache, max_size=o.cache_size if o.cache else 0, cache=cache)
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
        """Count the ``done`` block iterations of the chunk ``res`` and take up its request of an exact gap pass, or
        request one when the gap estimates sum to ``<= early_gap_check * gap_tol``."""
        self.steps += done
        self.last_block_gaps, self.last_blocks = res.gaps, res.blocks
        if res.need_gap_pass:
            if self._since_refresh == 0 and done == 0:
                self.converged = True  # the exact block gaps just computed are all zero: optimal
            self.check_requested = True
        early, tol = self.options.own.early_gap_check, self.options.gap_tol
        if early is not None and tol is not None and not self.check_requested:
            est = self.estimated_gap()
            self.check_requested = est is not None and est <= early * tol
        if self._since_refresh >= 0:
            self._since_refresh += done

    def _advance_rounds(self, m: int) -> None:
        """At least ``m`` block iterations (all processes) in whole rounds of about ``batch_size`` distinct blocks, one
        joint step each.  A pass is always cut into the same rounds
        (:func:`~torch_bcfw.distributed.communicators.pass_rounds`), so a run split at a pass boundary continues exactly."""
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
            if self.comm.sharded and self.options.own.cache:
                hits = int(self.comm.sum_scalar(res.cache_hits))  # every process' hits
            self.oracle_calls += res.oracle_calls + res.cache_hits - hits
            self.cache_hits += hits
        else:
            self.oracle_calls += done
        self._end_chunk(res, done)

    def _advance_split_oracle(self, m: int) -> None:
        """At least ``m`` block iterations in whole rounds of ``batch_size`` blocks (cut at its multiples).  Each round
        is decoded at the current ``w`` (:meth:`~torch_bcfw.distributed.communicators.LocalComm.start_corners`) before the
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
