"""Multi-plane BCFW (Shah, Kolmogorov & Lampert, CVPR 2015, Alg. 3): BCFW for costly max-oracles.

Every exact oracle answer joins its block's working set of *planes* (:class:`~torch_bcfw.duals.working_set.WorkingSet`:
LRU eviction at the cap ``N``, eviction after ``T`` inactive iterations).  One outer iteration is an exact pass (``n``
BCFW steps) and up to ``M`` approximate passes (each block once in a random order, stepping towards its best stored
plane at the current ``w``).  After approximate pass ``B`` the passes stop when ``r dF_B t_A < dF_A t_B`` (Sec. 3.4;
``A`` everything since the start of the iteration before ``B``, ``dF`` the dual gain, ``t`` the cost of
:attr:`MPOptions.clock`) or when ``dF_B <= min_gain |F|``.  MP-BCFW-avg (Sec. 3.5) keeps one average after the exact and
one after the approximate steps and returns their mixture maximising the dual.  With ``N = 0`` this is plain BCFW,
bit for bit.  ``max_passes`` and ``gap_check`` count exact passes.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import torch
from torch import Tensor

from ..checks import saved_float, saved_int, saved_tensor
from ..duals.plan import MP_APPROX, MP_EXACT, StepPlan
from ..duals.stepsize import line_search_step
from ..certificate import squared_norm
from .algorithm import DualAlgorithm
from .callbacks import Callback
from .options import OptionGroup, check_int, check_real
from .sampling import make_sampler

__all__ = ["MPBCFW", "MPOptions", "MP_CLOCKS", "RecordAccounting", "stop_approximate_passes", "TwoAverages", "PLANES_PER_ORACLE_CALL"]

#: seed salt of the generator of the approximate passes' orders (kept apart from the exact pass's sampler)
_APPROX_SALT = 0x6D70

#: values of :attr:`MPOptions.clock`
MP_CLOCKS = ("auto", "work", "wall")

#: ``mp_clock="work"``: scoring this many planes costs as much as one exact oracle call (a fixed constant, so that
#: the automatic rule is deterministic)
PLANES_PER_ORACLE_CALL = 10.0


@dataclass
class MPOptions(OptionGroup):
    """The options of ``solver="mp-bcfw"`` (Shah et al. 2015; the paper's values), given as ``mp_max_planes``, ...

    Attributes:
        max_planes: cap ``N`` on the planes kept per block, the longest-inactive evicted.  Default 1000; ``0``: no
            working set, exactly BCFW.
        inactive_iters: ``T``: planes inactive during the last ``T`` outer iterations are dropped during the
            approximate passes.  Default 10; ``0``: never.
        max_approx_passes: ``M``: most approximate passes per outer iteration (default 1000); ``0``: exact passes
            only.
        approx_ratio: ``r`` of the automatic rule: stop the approximate passes when ``r x`` the dual gain per unit of
            cost of the last pass falls below that of the whole iteration so far.  Default 1 (the paper); ``0``: one
            approximate pass per iteration; ``inf``: always ``M``.
        min_gain: also stop when an approximate pass gains ``<= min_gain x |dual|`` (default 1e-12).
        clock: the cost the automatic rule measures: ``"work"`` (deterministic: an exact block step costs 1, an
            approximate one over ``p`` planes ``p /`` :data:`PLANES_PER_ORACLE_CALL`), ``"wall"`` (seconds, the
            paper's rule) or ``"auto"`` (default: ``"work"``).
    """

    prefix: ClassVar[str] = "mp"
    max_planes: int = 1000
    inactive_iters: int = 10
    max_approx_passes: int = 1000
    approx_ratio: float = 1.0
    min_gain: float = 1e-12
    clock: str = "auto"

    def __post_init__(self) -> None:
        for name in ("max_planes", "inactive_iters", "max_approx_passes"):
            setattr(self, name, check_int(f"mp_{name}", getattr(self, name), 0))
        for name in ("approx_ratio", "min_gain"):
            setattr(self, name, float(check_real(f"mp_{name}", getattr(self, name), positive=False, finite=False)))
        if self.clock not in MP_CLOCKS:
            raise ValueError(f"mp_clock must be one of {MP_CLOCKS}, got {self.clock!r}")


def stop_approximate_passes(gain_a: float, time_a: float, gain_b: float, time_b: float, ratio: float,
                            min_gain: float, dual: float) -> bool:
    """The stopping rule after an approximate pass ``B`` (see the module docstring): True to stop (``B`` is kept).
    ``gain_a, time_a``: dual gain and cost before ``B`` in the outer iteration; ``gain_b, time_b``: those of ``B``."""
    if not gain_b > min_gain * abs(dual):
        return True  # the guard: nothing (or too little) gained
    if ratio == math.inf:
        return False
    return ratio * gain_b * time_a < gain_a * time_b


class _Average:
    """A weighted average ``(v_bar, l_bar)`` updated by ``x_bar <- (1 - rho) x_bar + rho x``, ``rho = 2/(k+2)``
    (``k`` updates so far: the first copies), i.e. ``2/(K(K+1)) sum_t t x_t`` (Shah et al. 2015, Sec. 3.5)."""

    def __init__(self, d: int, device):
        self.v = torch.zeros(d, dtype=torch.float64, device=device)
        self.ell = 0.0
        self.k = 0

    def update(self, v: Tensor, ell: float) -> None:
        rho = 2.0 / (self.k + 2.0)
        self.v.mul_(1.0 - rho).add_(v, alpha=rho)
        self.ell = (1.0 - rho) * self.ell + rho * ell
        self.k += 1

    def state_dict(self) -> dict:
        return {"v": self.v.cpu().clone(), "ell": self.ell, "k": self.k}

    def load_state_dict(self, sd: dict) -> None:
        if not isinstance(sd, dict) or not {"v", "ell", "k"} <= sd.keys():
            raise ValueError("an MP-BCFW average must be the dict of its state_dict")
        self.v = saved_tensor(sd["v"], "MP-BCFW average v", tuple(self.v.shape)).to(self.v.device)
        self.ell, self.k = saved_float(sd["ell"], "MP-BCFW average ell"), saved_int(sd["k"], "MP-BCFW average k", 0)


class TwoAverages:
    """The averages of MP-BCFW-avg: ``exact`` (after exact steps) and ``approx`` (after approximate steps),
    and their best mixture for a dual state's problem (``lam``, box constraints)."""

    def __init__(self, d: int, device):
        self.exact = _Average(d, device)
        self.approx = _Average(d, device)

    def _dual(self, state, v: Tensor, ell: float) -> float:
        w = torch.clamp(v, state.lower, state.upper) if state.has_bounds else v
        return ell - state.box_term(v) - 0.5 * state.lam * squared_norm(w)

    def mixture(self, state) -> tuple[float, Tensor, float]:
        """``(g, v_mix, l_mix)``: the mixing weight of ``approx`` maximising the dual and the mixed pair."""
        a, b = self.exact, self.approx
        if b.k == 0 or a.k == 0:
            return (0.0, a.v, a.ell) if b.k == 0 else (1.0, b.v, b.ell)
        delta = b.v - a.v
        if not state.has_bounds:  # D(g) = l(g) - lam/2 ||v(g)||^2 is a concave quadratic
            num = (b.ell - a.ell) - state.lam * float(a.v @ delta)
            den = state.lam * float(delta @ delta)
            g = float(line_search_step(num, den))
        else:  # concave in g (the dual of the constrained problem): golden section on [0, 1]
            f = lambda t: self._dual(state, a.v + t * delta, a.ell + t * (b.ell - a.ell))  # noqa: E731
            lo, hi = 0.0, 1.0
            phi = (math.sqrt(5.0) - 1.0) / 2.0
            for _ in range(60):
                m1, m2 = hi - phi * (hi - lo), lo + phi * (hi - lo)
                if f(m1) < f(m2):
                    lo = m1
                else:
                    hi = m2
            g = 0.5 * (lo + hi)
            g = max((0.0, 1.0, g), key=f)
        return g, a.v + g * delta, a.ell + g * (b.ell - a.ell)

    def state_dict(self) -> dict:
        return {"exact": self.exact.state_dict(), "approx": self.approx.state_dict()}

    def load_state_dict(self, sd: dict) -> None:
        self.exact.load_state_dict(sd["exact"])
        self.approx.load_state_dict(sd["approx"])


class MPBCFW(DualAlgorithm):
    """Multi-plane BCFW; see the module docstring and the ``mp_*`` fields of
    :class:`~torch_bcfw.solvers.options.SolverOptions`.

    Args:
        clock: a function returning the current time in seconds (default ``time.perf_counter``), read at pass
            boundaries; when given, the automatic rule measures it instead of ``options.mp_clock``.

    Attributes:
        iteration: completed outer iterations (the exact pass in progress belongs to ``iteration + 1``).
        approx_steps, approx_passes: approximate block steps and passes so far.
        exact_time, approx_time: clock time spent in exact and in approximate passes.
        exact_work, approx_work: their cost in oracle-call units (``mp_clock="work"``).
        rule_clock: ``"work"``, ``"wall"`` or ``"clock"`` (a given clock): what the automatic rule measures.
        last_approx_passes: approximate passes of the last completed outer iteration.
    """

    name = "mp-bcfw"
    Options = MPOptions

    def __init__(self, model, data, lam, options, state=None, bounds=None, clock=None):
        if options.sampling == "gap":
            raise ValueError("mp-bcfw takes FW steps with uniform or perm sampling: gap sampling is a refinement of "
                             "solver='bcfw' (Osokin et al. 2016)")
        options = self.with_own_options(options)
        mp = options.own
        if mp.max_planes > 0 and options.step != "line_search":
            raise ValueError("mp-bcfw with a working set (mp_max_planes > 0) needs step='line_search'")
        super().__init__(model, data, lam, options, state, bounds)
        self.clock = clock if clock is not None else time.perf_counter
        self.rule_clock = "clock" if clock is not None else "wall" if mp.clock == "wall" else "work"
        self.N = mp.max_planes
        self.M = mp.max_approx_passes if self.N > 0 else 0
        self.T = mp.inactive_iters
        self.sampler = make_sampler(options.sampling, self.n, options.seed)
        self.approx_rng = np.random.Generator(np.random.PCG64([options.seed, _APPROX_SALT]))
        self.iteration = 0
        self.pos = 0  # block iterations done in the exact pass in progress
        self.approx_steps = self.approx_passes = self.last_approx_passes = 0
        self.exact_time = self.approx_time = 0.0
        self.exact_work = self.approx_work = 0.0
        self._iter_dual0 = 0.0  # dual value at the start of the outer iteration in progress
        self._iter_exact_cost = 0.0  # the rule's cost (seconds or work units) of its exact pass so far
        self.averages = TwoAverages(self.state.d, self.state.w.device) if (options.averaging and self.N > 0) else None
        self.ws = self.state.ensure_working_set(cache_only=True) if self.N > 0 else None

    # ------------------------------------------------------------ helpers
    def dual_value(self) -> float:
        """``F = dual_ell - lam/2 ||w||^2`` of the current iterate (``O(d)``, no oracle call)."""
        return self.state.dual_ell() - 0.5 * self.lam * squared_norm(self.state.w)

    # ------------------------------------------------------------ the algorithm
    def chunk_size(self) -> int:
        return self.n - self.pos  # the rest of the exact pass; its end runs the approximate passes

    def advance(self, m: int) -> None:
        m = min(int(m), self.n - self.pos)
        if self.pos == 0:
            self._iter_dual0 = self.dual_value()
            self._iter_exact_cost = 0.0
        order = self.sampler.draw(m)
        t0 = self.clock()
        if self.ws is None:  # N = 0: BCFW's own code path
            plan = StepPlan.plain(order, self.step_code, self.options.averaging)
            self.last_block_gaps = self.state.run_plan(plan).gaps
        else:
            avg = self.averages.exact if self.averages is not None else None
            self.run_plan(StepPlan.multi_plane(order, MP_EXACT, float(self.iteration + 1), self.N, running=avg))
        dt = self.clock() - t0
        self.exact_time += dt
        self.exact_work += m  # one oracle call per exact step
        self._iter_exact_cost += float(m) if self.rule_clock == "work" else dt
        self.oracle_calls += m
        self.pos += m
        if self.pos == self.n:
            self.pos = 0
            self.iteration += 1
            self._approximate_passes()

    def _approximate_passes(self) -> None:
        """Up to ``M`` approximate passes after the exact pass of outer iteration ``self.iteration``."""
        self.last_approx_passes = 0
        if self.M == 0:
            return
        o = self.options.own
        k = self.iteration
        cutoff = float(k - self.T) if self.T > 0 else -math.inf
        dual = self.dual_value()
        gain_a, time_a = dual - self._iter_dual0, self._iter_exact_cost
        avg = self.averages.approx if self.averages is not None else None
        for p in range(1, self.M + 1):
            stamp = k + p / (self.M + 1.0)
            order = self.approx_rng.permutation(self.n)
            work_b = float(self.ws.size.sum()) / PLANES_PER_ORACLE_CALL
            t0 = self.clock()
            self.run_plan(StepPlan.multi_plane(order, MP_APPROX, stamp, cutoff=cutoff, running=avg))
            dt = self.clock() - t0
            time_b = work_b if self.rule_clock == "work" else dt
            new_dual = self.dual_value()
            gain_b = new_dual - dual
            self.approx_time += dt
            self.approx_work += work_b
            self.approx_steps += self.n
            self.approx_passes += 1
            self.last_approx_passes = p
            stop = stop_approximate_passes(gain_a, time_a, gain_b, time_b, o.approx_ratio, o.min_gain, new_dual)
            gain_a, time_a, dual = gain_a + gain_b, time_a + time_b, new_dual
            if stop:
                break

    def averaged(self):
        if not self.options.averaging:
            return None
        if self.averages is None:  # N = 0: every step is exact, the state's average is the exact one
            return self.state.averaged()
        st = self.state
        if self.averages.exact.k == 0 and self.averages.approx.k == 0:
            return st.w.clone(), st.dual_ell()
        _, v, ell = self.averages.mixture(st)
        if st.has_bounds:
            return torch.clamp(v, st.lower, st.upper), ell - st.box_term(v)
        return v.clone(), ell

    def accounting(self) -> dict:
        """Oracle cost accounting for the history."""
        ws = self.ws
        return {
            "exact_calls": self.oracle_calls, "approx_steps": self.approx_steps, "approx_passes": self.approx_passes,
            "outer_iterations": self.iteration, "last_approx_passes": self.last_approx_passes,
            "exact_time": self.exact_time, "approx_time": self.approx_time,
            "planes_mean": None if ws is None else float(ws.size.mean()),
            "avg_mix": None if self.averages is None else self.averages.mixture(self.state)[0],
        }

    # ------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict:
        sd = {"state": self.state.state_dict(), "sampler": self.sampler.state_dict(),
              "approx_rng": self.approx_rng.bit_generator.state, "oracle_calls": self.oracle_calls,
              "iteration": self.iteration, "pos": self.pos, "approx_steps": self.approx_steps,
              "approx_passes": self.approx_passes, "last_approx_passes": self.last_approx_passes,
              "exact_time": self.exact_time, "approx_time": self.approx_time, "iter_dual0": self._iter_dual0,
              "exact_work": self.exact_work, "approx_work": self.approx_work, "rule_clock": self.rule_clock,
              "iter_exact_cost": self._iter_exact_cost}
        if self.averages is not None:
            sd["averages"] = self.averages.state_dict()
        return sd

    def load_state_dict(self, sd: dict) -> None:
        self.state.load_state_dict(sd["state"])
        self.sampler.load_state_dict(sd["sampler"])
        try:
            self.approx_rng.bit_generator.state = sd["approx_rng"]
        except (ValueError, TypeError, KeyError, OverflowError) as exc:
            raise ValueError(f"approx_rng is not a state of its generator: {exc!r}") from None
        self.oracle_calls = saved_int(sd["oracle_calls"], "oracle_calls", 0)
        self.iteration, self.pos = saved_int(sd["iteration"], "iteration", 0), saved_int(sd["pos"], "pos", 0, self.n - 1)
        for key in ("approx_steps", "approx_passes", "last_approx_passes"):
            setattr(self, key, saved_int(sd[key], key, 0))
        self.exact_time = saved_float(sd["exact_time"], "exact_time", lo=0.0)
        self.approx_time = saved_float(sd["approx_time"], "approx_time", lo=0.0)
        self._iter_dual0 = saved_float(sd["iter_dual0"], "iter_dual0")
        self.exact_work = saved_float(sd.get("exact_work", 0.0), "exact_work", lo=0.0)
        self.approx_work = saved_float(sd.get("approx_work", 0.0), "approx_work", lo=0.0)
        # the cost of an exact pass in progress, in the unit of the rule (a checkpoint of the other unit: restart it)
        same_unit = sd.get("rule_clock", "wall") == self.rule_clock
        cost = saved_float(sd.get("iter_exact_cost", sd.get("iter_exact_time", 0.0)), "iter_exact_cost", lo=0.0)
        self._iter_exact_cost = cost if same_unit else (float(self.pos) if self.rule_clock == "work" else 0.0)
        # the averages are feature-space vectors: after a warm start on other features they restart
        if self.averages is not None and "averages" in sd and not self.state.rebound:
            if not isinstance(sd["averages"], dict) or not {"exact", "approx"} <= sd["averages"].keys():
                raise ValueError("MP-BCFW averages must be the dict of TwoAverages.state_dict")
            self.averages.load_state_dict(sd["averages"])
            top = float(self.state.model.max_loss(self.state.data).sum()) / self.state.n_total  # l of any dual point
            for avg in (self.averages.exact, self.averages.approx):
                if not -1e-12 <= avg.ell <= top * (1 + 1e-9) + 1e-12:
                    raise ValueError(f"MP-BCFW average ell = {avg.ell!r} lies outside [0, {top!r}] (no dual point has it)")
        if self.N > 0:
            self.ws = self.state.ensure_working_set(cache_only=True)


class RecordAccounting(Callback):
    """Adds ``alg.accounting()`` to every history record (first in the callback list, so that the others see it)."""

    def __init__(self, alg):
        self.alg = alg

    def on_check(self, record) -> None:
        record.update(self.alg.accounting())
