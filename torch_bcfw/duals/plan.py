"""What a solver hands to a dual state for a chunk of BCFW iterations (:class:`StepPlan`), what comes back, and the
generic loops that run it through any state's public methods.

A plan names the parts of one iteration (sampling policy, oracle with an optional working set and cache test, step
rule) and holds the solver-side arrays they work on.  One-block plans run in :func:`generic_plan_steps` (or a
state's compiled loop, with the same trajectory), mini-batch plans in :func:`run_rounds`, local or split over
processes; :func:`compiled_plan` gives a plan's parts as a compiled loop takes them.  The iteration, step by step:
``docs/anatomy.md``.  This module imports no solver and no state.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import torch

from .stepsize import AWAY_RULE, FW_RULE, PAIRWISE_RULE, away_choice, cache_hit, move_bound
from .sumtree import est_set, gap_draw, gap_draw_round
from .working_set import block_labelings, ws_away_update, ws_corners, ws_fw_update, ws_pairwise_update

__all__ = ["StepPlan", "GapDraws", "CacheTest", "MultiPlane", "WorkingSetUse", "Rounds", "PlanResult", "RoundStep",
           "MP_EXACT", "MP_APPROX", "PlanFlags", "Sampling", "RunningAverage", "Progress", "DONE", "NEED_GAP_PASS",
           "compiled_plan", "generic_plan_steps", "run_rounds"]

MP_EXACT = 1   #: multi-plane BCFW: exact steps, the oracle answers join the planes
MP_APPROX = 2  #: multi-plane BCFW: approximate steps on the best stored plane

#: :attr:`Progress.status` of a compiled chunk: it ran; gap sampling found every estimate zero
DONE, NEED_GAP_PASS = 0, 1


@dataclass
class GapDraws:
    """Gap sampling (Osokin et al. 2016, Alg. 2): blocks drawn inside the loop from the sum tree of the plan's
    :attr:`StepPlan.estimates`, never-visited blocks first.

    Attributes:
        uniforms: ``float64[m]`` uniforms in [0, 1) for the tree draws, one per iteration (per slot of a round).
        queue, smeta: never-visited blocks and the position in ``queue`` (``int64[1]``, updated).
    """

    uniforms: np.ndarray
    queue: np.ndarray
    smeta: np.ndarray


@dataclass
class CacheTest:
    """The cache test of Alg. 5 (Osokin et al. 2016): the best stored labeling is the corner, without an oracle call,
    when its block gap is at least ``max(F g_i, glob_thr)``, ``glob_thr = (nu / n) g_global``."""

    F: float = 0.25
    glob_thr: float = np.inf


@dataclass
class MultiPlane:
    """The planes of multi-plane BCFW (Shah et al. 2015) in the working set.

    Attributes:
        mode: ``MP_EXACT`` (the oracle answer joins the block's planes, the longest-inactive plane evicted beyond
            ``max_planes``) or ``MP_APPROX`` (the best stored plane at the current ``w`` is the corner; then the planes
            last active before ``cutoff`` are dropped); either stamps the corner's plane ``stamp``.
        running: MP-BCFW-avg's running average, updated after every step (``update(v, l)``, fields ``v``, ``ell``,
            ``k``), or ``None``.
    """

    mode: int
    stamp: float
    cutoff: float = -np.inf
    max_planes: int = 0
    running: object = None


@dataclass
class WorkingSetUse:
    """The oracle's working-set part: the state's :class:`~torch_bcfw.duals.working_set.WorkingSet` is kept (its
    ``alpha`` follow every step, oracle answers join it).

    Attributes:
        keep_inactive: keep labelings whose ``alpha`` dropped to 0 (a cache); else the working set is the active set.
        max_size: labelings per block (0: unbounded).
        cache: the cache test before the oracle call, or ``None``.
        planes: MP-BCFW's planes, or ``None``.
    """

    keep_inactive: bool = False
    max_size: int = 0
    cache: CacheTest | None = None
    planes: MultiPlane | None = None


@dataclass
class Rounds:
    """Mini-batch BCFW (Wang et al. 2016): ``offsets`` (``int64[r + 1]``) cut the plan's ``order`` into rounds of
    distinct blocks, each one joint step (:meth:`DualState.round_step`); ``reduce``: for rounds split over processes,
    the callable that sums a round's ``(V, sums)`` over them.  With gap sampling the slots ``offsets[j]:offsets[j + 1]``
    are filled inside the loop (:func:`~torch_bcfw.duals.sumtree.gap_draw_round`) and unfilled slots stay -1."""

    offsets: np.ndarray
    reduce: object = None


@dataclass
class StepPlan:
    """One chunk of iterations: the blocks, the step rule and the optional parts of the BCFW family.

    Attributes:
        m: maximum number of block iterations.
        order: ``int64[m]`` blocks (uniform / permutation sampling; the slots of gap-sampled rounds).
        rule: step-rule code (``FW_RULE``, ``PAIRWISE_RULE``, ``AWAY_RULE`` of :mod:`torch_bcfw.duals.stepsize`).
        step_code: ``LINE_SEARCH`` or ``FIXED`` (FW steps only).
        averaging: keep the weighted average of the iterates.
        gap: :class:`GapDraws` (gap sampling), or ``None`` (the blocks of ``order``).
        estimates: the gap estimates ``g_i^(k_i)`` the oracle calls update (``est``, their sum tree ``tree`` of
            ``size`` leaves over ``est^power``: a :class:`~torch_bcfw.solvers.sampling.GapEstimates`), or ``None``.
        working_set: :class:`WorkingSetUse` (active sets, the cache, MP-BCFW's planes), or ``None``.
        rounds: :class:`Rounds` (mini-batch BCFW), or ``None`` (one block per iteration).
    """

    m: int
    order: np.ndarray | None = None
    rule: int = FW_RULE
    step_code: int = 0
    averaging: bool = False
    gap: GapDraws | None = None
    estimates: object = None
    working_set: WorkingSetUse | None = None
    rounds: Rounds | None = None

    @classmethod
    def minibatch(cls, order, rounds, step_code: int = 0, averaging: bool = False, reduce=None) -> "StepPlan":
        """Mini-batch BCFW: one joint FW step per round of distinct blocks ``order[rounds[j]:rounds[j + 1]]``."""
        order = np.ascontiguousarray(order, dtype=np.int64)
        rounds = np.ascontiguousarray(rounds, dtype=np.int64)
        if (rounds.ndim != 1 or rounds.size < 1 or rounds[0] != 0 or rounds[-1] != len(order)
                or (np.diff(rounds) < 0).any()):
            raise ValueError("rounds must be non-decreasing offsets into order, from 0 to len(order)")
        return cls(m=len(order), order=order, step_code=step_code, averaging=averaging, rounds=Rounds(rounds, reduce))

    def draw_by_gap(self, uniforms, queue, smeta, estimates) -> "StepPlan":
        """Gap sampling from ``estimates`` (updated by the oracle calls); for a mini-batch plan ``order`` becomes the
        slots the loop fills round by round.  Returns ``self``."""
        if self.rounds is not None:
            self.order = np.full(self.m, -1, dtype=np.int64)
        self.gap = GapDraws(np.ascontiguousarray(uniforms, dtype=np.float64), queue, smeta)
        self.estimates = estimates
        return self

    @classmethod
    def multi_plane(cls, order, mode: int, stamp: float, max_planes: int = 0, cutoff: float = -np.inf,
                    running=None) -> "StepPlan":
        """MP-BCFW's exact (``MP_EXACT``) or approximate (``MP_APPROX``) FW steps on the blocks of ``order`` with the
        state's working set as the planes: line search, no lazy average (``running`` is MP-BCFW-avg's)."""
        order = np.ascontiguousarray(order, dtype=np.int64)
        if mode not in (MP_EXACT, MP_APPROX):
            raise ValueError(f"mode must be MP_EXACT or MP_APPROX, got {mode!r}")
        planes = MultiPlane(mode, float(stamp), float(cutoff), int(max_planes), running)
        return cls(m=len(order), order=order, working_set=WorkingSetUse(keep_inactive=True, planes=planes))

    @classmethod
    def plain(cls, order, step_code: int = 0, averaging: bool = False) -> "StepPlan":
        """Plain BCFW: an FW step on each block of ``order`` after an oracle call, nothing measured or kept."""
        order = np.ascontiguousarray(order, dtype=np.int64)
        return cls(m=len(order), order=order, step_code=step_code, averaging=averaging)

    @property
    def is_plain(self) -> bool:
        """No refinement: FW steps on the blocks of ``order``, no working set, cache or gap estimates."""
        return (self.rule == FW_RULE and self.gap is None and self.working_set is None and self.estimates is None
                and self.rounds is None)


@dataclass
class PlanResult:
    """Outcome of a chunk: iterations done, oracle calls, cache hits, ``need_gap_pass`` (gap sampling found every
    estimate zero), and per iteration the block (``blocks``) and its oracle block gap (``gaps``, ``nan`` on a cache
    hit).  Mini-batch plans: ``rounds`` taken, ``steps`` their slots, ``oracle_calls`` their blocks over all
    processes minus this process' ``cache_hits``, and ``gaps`` each round's numerator at its first slot."""

    steps: int
    oracle_calls: int
    cache_hits: int
    need_gap_pass: bool
    blocks: np.ndarray
    gaps: np.ndarray
    rounds: int = 0


@dataclass
class RoundStep:
    """One joint step of a round (:meth:`~torch_bcfw.duals.base.DualState.round_step`): the numerator ``num`` (the
    sum of the block gaps over all processes), the step ``gamma``, the blocks over all processes ``tau`` (0: no
    step), and for this process' blocks their ``gaps`` (with estimates), their corners' ``planes`` and the cache
    hits ``hit`` (with a working set)."""

    num: float
    gamma: float
    tau: int
    gaps: np.ndarray | None = None
    planes: np.ndarray | None = None
    hit: np.ndarray | None = None


# ---------------------------------------------------------------- a plan's parts as a compiled loop takes them
class PlanFlags(NamedTuple):
    """The fields of a one-block :class:`StepPlan` and of its :class:`WorkingSetUse`, :class:`CacheTest` and
    :class:`MultiPlane` flattened (:func:`compiled_plan`): ``by_gap`` (gap sampling), ``track_estimates`` (the oracle's
    block gaps update the estimates), ``planes`` (0, ``MP_EXACT`` or ``MP_APPROX``)."""

    m: int
    rule: int
    step_code: int
    averaging: bool
    by_gap: bool
    track_estimates: bool
    use_working_set: bool
    keep_inactive: bool
    max_size: int
    cache: bool
    cache_F: float
    cache_threshold: float
    planes: int
    stamp: float
    cutoff: float
    max_planes: int
    running_average: bool


class Sampling(NamedTuple):
    """The blocks of a plan: ``order``, or the :class:`GapDraws` and the estimates with their sum tree (empty arrays
    for the parts a plan does not have)."""

    order: np.ndarray
    uniforms: np.ndarray
    queue: np.ndarray
    queue_pos: np.ndarray
    est: np.ndarray
    tree: np.ndarray
    tree_size: int
    power: float


#: MP-BCFW-avg's running average of ``l`` and its number of updates (one record, :attr:`RunningAverage.totals`)
RUNNING = np.dtype([("ell", np.float64), ("k", np.float64)])


class RunningAverage(NamedTuple):
    """MP-BCFW-avg's running average: ``avg_v`` of the weights ``v`` (the state's untruncated ``w``) and ``totals``
    (one :data:`RUNNING` record)."""

    v: np.ndarray
    avg_v: np.ndarray
    totals: np.ndarray


class Progress(NamedTuple):
    """What a compiled chunk did: iterations ``done``, ``oracle_calls``, ``cache_hits``, ``status`` (:data:`DONE` or
    :data:`NEED_GAP_PASS`) and the state's counters ``k`` and ``clock`` (``avg_t``) after it."""

    done: int
    oracle_calls: int
    cache_hits: int
    status: int
    k: int
    clock: int


def compiled_plan(plan: StepPlan, v: np.ndarray) -> tuple[PlanFlags, Sampling, RunningAverage]:
    """The parts of the one-block ``plan`` as a compiled loop takes them (``v``: the state's untruncated weights,
    which MP-BCFW-avg's running average follows)."""
    wsu = plan.working_set if plan.working_set is not None else WorkingSetUse()
    cache = wsu.cache if wsu.cache is not None else CacheTest()
    planes = wsu.planes if wsu.planes is not None else MultiPlane(0, 0.0)
    run = planes.running
    flags = PlanFlags(int(plan.m), int(plan.rule), int(plan.step_code), bool(plan.averaging), plan.gap is not None,
                      plan.estimates is not None, plan.working_set is not None, bool(wsu.keep_inactive),
                      int(wsu.max_size), wsu.cache is not None, float(cache.F), float(cache.glob_thr),
                      int(planes.mode), float(planes.stamp), float(planes.cutoff), int(planes.max_planes),
                      run is not None)
    order = plan.order if plan.order is not None else np.zeros(0, dtype=np.int64)
    gap, est = plan.gap, plan.estimates
    uniforms, queue, qpos = ((gap.uniforms, gap.queue, gap.smeta) if gap is not None
                             else (np.zeros(0), np.zeros(0, dtype=np.int64), np.zeros(1, dtype=np.int64)))
    e, tree, size, power = (est.est, est.tree, int(est.size), float(est.power)) if est is not None else (
        np.zeros(0), np.zeros(2), 1, 1.0)
    sampling = Sampling(np.ascontiguousarray(order, dtype=np.int64), np.ascontiguousarray(uniforms, dtype=np.float64),
                        queue, qpos, e, tree, size, power)
    running = (RunningAverage(v, run.v.numpy(), np.array([(run.ell, run.k)], dtype=RUNNING)) if run is not None
               else RunningAverage(v, np.zeros(1), np.zeros(1, dtype=RUNNING)))
    return flags, sampling, running


def _as_labels(y, device) -> torch.Tensor:
    return torch.as_tensor(np.asarray(y), dtype=torch.long).reshape(-1).to(device)


# ---------------------------------------------------------------- the generic loops
def generic_plan_steps(state, plan: StepPlan) -> PlanResult:
    """Run the one-block ``plan`` on ``state`` one block at a time through its public methods (``block_value``,
    ``corner_values``, ``block_oracle``, ``block_step``, ``block_move``).  A plain plan measures nothing: its block
    gaps are the FW steps' numerators."""
    m = int(plan.m)
    gaps = np.full(m, np.nan)
    blocks = np.full(m, -1, dtype=np.int64)
    wsu, gap, est = plan.working_set, plan.gap, plan.estimates
    ws = state.working_set if wsu is not None else None
    cache = wsu.cache if wsu is not None else None
    planes = wsu.planes if wsu is not None else None
    mp = planes.mode if planes is not None else 0
    measure = (ws is not None and not mp) or est is not None  # the corner values h_i, h_s (block gaps and estimates)
    dev = state.w.device
    n_oracle = n_hits = done = 0
    need_pass = False
    for j in range(m):
        if gap is not None:
            i = int(gap_draw(gap.queue, gap.smeta, est.tree, est.size, float(gap.uniforms[j])))
            if i < 0:
                need_pass = True
                break
        else:
            i = int(plan.order[j])
        blocks[j] = i
        h_i = state.block_value(i) if measure else 0.0
        jmax = jmin = -1
        nact = 0
        hit = False
        if ws is not None and mp != MP_EXACT:
            ys = ws.labelings(i)
            ws.scores(i)[:] = state.corner_values(i, ys)
            jmax, jmin, nact = (int(v) for v in ws_corners(ws.arrays(), i))
            if cache is not None:
                hit = bool(cache_hit(float(ws.scores(i)[jmax]) - h_i, float(est.est[i]), float(cache.F),
                                     float(cache.glob_thr)))
            hit = hit or mp == MP_APPROX  # MP-BCFW's approximate step: always the best plane
        if hit:
            n_hits += 1
            j_s = jmax
            y_s = _as_labels(ws.labeling(i, j_s), dev)
            h_s = float(ws.scores(i)[j_s])
        else:
            n_oracle += 1
            y_s = state.block_oracle(i)
            j_s = -1
            h_s = 0.0
            if measure:
                h_s = float(state.corner_values(i, [y_s.cpu().numpy()])[0])
                g = h_s - h_i
                gaps[j] = g
                if est is not None:
                    est_set(est.est, est.tree, est.size, i, g, est.power, gap is not None)
            if ws is not None:
                ynp = y_s.cpu().numpy()
                j_s = -1 if mp else ws.find(i, ynp)
                if j_s < 0:
                    ell_s = float(state.model.loss(state.block_data(i), y_s)[0]) / state.n_total
                    if mp:  # stored once: a new plane evicts the longest inactive beyond max_planes
                        j_s = ws.add_plane(i, ynp, ell_s, planes.stamp, planes.max_planes)
                    else:
                        j_s = ws.insert(i, ynp, ell_s, wsu.max_size, plan.rule != FW_RULE)
                        ws.scores(i)[j_s] = h_s
        if mp == MP_APPROX:
            ws.touch(i, j_s, planes.stamp)
        kind = plan.rule
        if plan.rule == AWAY_RULE:
            kind = int(away_choice(h_s - h_i, h_i - float(ws.scores(i)[jmin]), nact))
        if kind == FW_RULE:
            num, gamma = state.block_step(i, y_s, plan.step_code, plan.averaging)
            if not measure:
                gaps[j] = num
            if ws is not None and gamma != 0.0:
                ws_fw_update(ws.arrays(), i, j_s, gamma)
        elif kind in (PAIRWISE_RULE, AWAY_RULE) and not (kind == PAIRWISE_RULE and jmin == j_s):
            alpha_a = float(ws.alphas(i)[jmin])
            y_a = _as_labels(ws.labeling(i, jmin), dev)
            _, gamma, drop = state.block_move(i, y_s, y_a, kind, float(move_bound(kind, alpha_a)),
                                              averaging=plan.averaging)
            if gamma != 0.0:
                if kind == PAIRWISE_RULE:
                    ws_pairwise_update(ws.arrays(), i, j_s, jmin, gamma, drop)
                else:
                    ws_away_update(ws.arrays(), i, jmin, gamma, drop)
        else:
            state.skip_step()
        if ws is not None and not wsu.keep_inactive:
            ws.drop_inactive(i)
        if mp == MP_APPROX and planes.cutoff > -np.inf:
            ws.drop_stale(i, planes.cutoff)
        if planes is not None and planes.running is not None:
            planes.running.update(state.v, state.ell)
        done += 1
    return PlanResult(steps=done, oracle_calls=n_oracle, cache_hits=n_hits, need_gap_pass=need_pass,
                      blocks=blocks[:done], gaps=gaps[:done])


def round_corners(state, plan: StepPlan, blocks: list[int]):
    """The corners of a round's blocks with the cache (Osokin et al. 2016, Alg. 5, per block): the best cached
    labeling where it passes the test, else the answers of one batched oracle call (which join the working set).
    Returns ``(sub, y, js, hit)``: the round's examples and corners (laid out like ``sub.y``), each corner's plane in
    the working set and the hit mask."""
    ws = state.working_set
    dev = state.w.device
    idx = torch.as_tensor(blocks, dtype=torch.long, device=dev)
    sub = state.data[idx] if len(blocks) != 1 else state.block_data(blocks[0])
    hit = np.zeros(len(blocks), dtype=bool)
    js = np.full(len(blocks), -1, dtype=np.int64)
    labs: list = [None] * len(blocks)
    cache, est = plan.working_set.cache, plan.estimates
    if cache is not None:
        owners = [i for i in blocks for _ in range(int(ws.size[i]))]
        scores = state.pair_values(owners, [y for i in blocks for y in ws.labelings(i)])
        h = state.subset_values(idx, sub).cpu().numpy()
        at = 0
        for q, i in enumerate(blocks):
            ws.scores(i)[:] = scores[at:at + int(ws.size[i])]
            at += int(ws.size[i])
            jmax = int(ws_corners(ws.arrays(), i)[0])
            if cache_hit(float(ws.scores(i)[jmax]) - float(h[q]), float(est.est[i]), float(cache.F),
                         float(cache.glob_thr)):
                hit[q], js[q], labs[q] = True, jmax, ws.labeling(i, jmax).astype(np.int64)
    miss = [q for q in range(len(blocks)) if not hit[q]]
    if miss:
        idx_m = idx[torch.as_tensor(miss, dtype=torch.long, device=dev)]
        sub_m, y_m = state.subset_oracle(idx_m)
        ell_m = (state.model.loss(sub_m, y_m).to(torch.float64) / state.n_total).cpu().numpy()
        for r, (q, ynp) in enumerate(zip(miss, block_labelings(y_m, getattr(sub_m, "offsets", None)))):
            i = blocks[q]
            js[q] = ws.put(i, ynp, float(ell_m[r]), plan.working_set.max_size, False)
            labs[q] = np.asarray(ynp, dtype=np.int64).reshape(-1)
    y = torch.as_tensor(np.concatenate(labs), dtype=torch.long, device=dev).reshape(sub.y.shape)
    return sub, y, js, hit


def run_rounds(state, plan: StepPlan) -> PlanResult:
    """Run a mini-batch plan, local or split over processes (``plan.rounds.reduce``): per round its blocks (drawn
    from the estimates with gap sampling) and one joint step (:meth:`~torch_bcfw.duals.base.DualState.round_step`).
    ``gaps`` holds each round's numerator at its first slot.  With gap sampling the estimates take the block gaps
    (a cache hit keeps its estimate), and a round finding every estimate zero ends the chunk."""
    gap, est, offsets = plan.gap, plan.estimates, plan.rounds.offsets
    ws = state.working_set if plan.working_set is not None else None
    order = plan.order
    gaps = np.full(len(order), np.nan)
    taken = blocks_done = n_hits = 0
    need_pass = False
    bounds = offsets.tolist()
    for j in range(len(bounds) - 1):
        a, b = bounds[j], bounds[j + 1]
        if gap is not None:
            b = a + int(gap_draw_round(gap.queue, gap.smeta, est.tree, est.size, gap.uniforms[a:b], order[a:b]))
        blocks = order[a:b]
        r = state.round_step(blocks, plan)
        if r.tau == 0:  # gap sampling: every estimate is zero on every process
            need_pass = True
            break
        hit = r.hit if r.hit is not None else np.zeros(len(blocks), dtype=bool)
        if r.hit is not None:
            n_hits += int(hit.sum())
        if ws is not None and r.gamma != 0.0:
            for i, jj in zip(blocks.tolist(), r.planes.tolist()):
                ws_fw_update(ws.arrays(), i, jj, r.gamma)
        if est is not None:
            for i, g, h in zip(blocks.tolist(), r.gaps.tolist(), hit.tolist()):
                # a cached corner's gap is not the block's gap: a hit keeps its estimate
                est_set(est.est, est.tree, est.size, i, float(est.est[i]) if h else g, est.power, gap is not None)
        if len(blocks):
            gaps[a] = r.num
        taken += 1
        blocks_done += r.tau
    slots = int(offsets[taken])
    return PlanResult(steps=slots, oracle_calls=blocks_done - n_hits, cache_hits=n_hits, need_gap_pass=need_pass,
                      blocks=order[:slots], gaps=gaps[:slots], rounds=taken)
