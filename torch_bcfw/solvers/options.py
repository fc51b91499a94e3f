"""Solver options: one dataclass, with the defaults of the papers' reference code."""
from __future__ import annotations

import dataclasses
import math
import numbers
from dataclasses import dataclass, field

import numpy as np

__all__ = ["SolverOptions", "SOLVERS", "parse_preset", "PRESETS", "AUTO_CHOICES",
           "MP_CLOCKS"]

#: solver names accepted by :func:`torch_bcfw.fit`
SOLVERS = ("bcfw", "fw", "ssg", "mp-bcfw", "cutting-plane", "online-eg", "extragradient")

#: the 8 combinations compared by Osokin et al. 2016 (Sec. 5.1) plus the away-step variants
PRESETS = tuple(
    f"{s}-{r}{c}" for c in ("", "-cache") for r in ("fw", "pairwise", "away") for s in ("uniform", "gap")
) + ("auto",)

#: values of ``SolverOptions.mp_clock``
MP_CLOCKS = ("auto", "work", "wall")

#: options of older saved files that no longer exist: read and dropped (``preset="auto"`` decided by a timing)
RETIRED_OPTIONS = ("auto_oracle_threshold",)

#: the combinations ``preset="auto"`` chooses among (:func:`torch_bcfw.solvers.bcfw.resolve_auto_preset`)
AUTO_CHOICES = ("gap-pairwise-cache", "gap-pairwise", "gap-fw", "uniform-fw")

#: what ``sampling``, ``step_rule`` and ``cache`` are when neither they nor a preset are given (plain BCFW)
_COMBINATION_DEFAULTS = {"sampling": "uniform", "step_rule": "fw", "cache": False}

_SAMPLING_TOKENS = {"uniform": "uniform", "perm": "perm", "gap": "gap"}
_RULE_TOKENS = {"fw": "fw", "bcfw": "fw", "pairwise": "pairwise", "bcpfw": "pairwise", "away": "away", "bcafw": "away"}


def parse_preset(name: str) -> dict:
    """``sampling``, ``step_rule`` and ``cache`` of a preset name.

    A name joins with ``-`` an optional sampling (``uniform`` default, ``perm``, ``gap``), an optional step
    rule (``fw`` default, ``pairwise``, ``away``; the paper's names ``bcfw``, ``bcpfw``, ``bcafw`` also work)
    and an optional ``cache``: ``"gap-pairwise-cache"``, ``"gap"``, ``"pairwise"``, ``"uniform-fw"``...
    ``"auto"`` is resolved by the solver from the model's ``expensive_oracle`` (see :class:`SolverOptions`).
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"preset must be a non-empty string, got {name!r}")
    out = {"sampling": "uniform", "step_rule": "fw", "cache": False}
    seen = set()
    for tok in name.lower().split("-"):
        if tok in _SAMPLING_TOKENS and "s" not in seen:
            out["sampling"] = _SAMPLING_TOKENS[tok]
            seen.add("s")
        elif tok in _RULE_TOKENS and "r" not in seen:
            out["step_rule"] = _RULE_TOKENS[tok]
            seen.add("r")
        elif tok == "cache" and "c" not in seen:
            out["cache"] = True
            seen.add("c")
        else:
            raise ValueError(
                f"unknown preset {name!r}: join with '-' a sampling (uniform, perm, gap), a step rule (fw, pairwise, "
                f"away) and optionally 'cache', e.g. 'gap-pairwise-cache'; or 'auto'. Named presets: {list(PRESETS)}"
            )
    return out


def _is_bool(v) -> bool:
    return isinstance(v, (bool, np.bool_))


def _is_int(v) -> bool:
    return isinstance(v, numbers.Integral) and not _is_bool(v)


def _is_real(v) -> bool:
    return isinstance(v, numbers.Real) and not _is_bool(v)


def _check_int(name: str, v, minimum: int) -> int:
    """An integer option (``int`` or numpy integer; not a bool, not a float even if integral) ``>= minimum``."""
    if _is_real(v) and not _is_int(v) and math.isfinite(v) and v == int(v):  # 1e3 in a config is a float
        raise ValueError(f"{name} must be an integer >= {minimum}, got the float {v!r}: write it as {int(v)}")
    if not _is_int(v) or v < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {v!r}")
    return int(v)


def _check_real(name: str, v, *, positive: bool, finite: bool, optional: bool = False):
    """A real option (``int``, ``float`` or numpy number; not a bool, never NaN), ``> 0`` (``positive``) or ``>= 0``,
    finite unless ``finite=False`` (then ``+inf`` is allowed); ``None`` passes when ``optional``."""
    if v is None and optional:
        return None
    bound = "> 0" if positive else ">= 0"
    what = f"a finite number {bound}" if finite else f"a number {bound} (inf allowed)"
    if not _is_real(v) or math.isnan(v) or (finite and math.isinf(v)) or not (v > 0 if positive else v >= 0):
        raise ValueError(f"{name} must be {what}" + (" or None" if optional else "") + f", got {v!r}")
    return v.item() if isinstance(v, np.generic) else v  # a Python number (saved results hold no numpy scalars)


#: the values of ``SolverOptions.strategy``
STRATEGIES = ("auto", "replicate", "shard", "split-oracle")


@dataclass
class SolverOptions:
    """Options shared by BCFW, batch Frank-Wolfe and SSG.

    Defaults follow the authors' BCFWstruct code (line search, weighted averaging, uniform
    sampling with replacement, ``rand_seed = 1``) and the gapBCFW code (exact gap every 10 passes,
    cache of 100 labelings per block, ``F = 0.25``, ``nu = 0.01``, sampling proportional to ``gap^1``).
    Without a preset, BCFW is plain BCFW (Lacoste-Julien et al. 2013).

    The refinements of Osokin et al. 2016 (BCFW only): ``sampling="gap"``, ``step_rule="pairwise"`` /
    ``"away"`` and ``cache=True`` combine freely; ``preset`` names a combination.  A "pass" of these
    variants is ``n`` block iterations (cache hits included, as in the authors' code); the history
    counts oracle calls and cache hits separately, and ``passes`` there is oracle calls / n.

    Every option is checked, nothing is coerced (``ValueError`` naming the option and the value): integer
    options take an ``int`` or a numpy integer (not a bool, not a float even if integral such as ``3.0``);
    bool options take ``True`` / ``False`` or a numpy bool (not ``"no"``, not ``0``); numeric options take
    real numbers, never a bool and never NaN, and are finite unless said otherwise below.

    **Warm starts** (``fit(..., init=result)``) continue a run exactly: ``fit(a + b passes)`` equals ``fit(a)``
    then ``fit(b, init=...)`` bit for bit (weights, averages and every history record but the timings), at any
    split, whole or fractional, for ``solver="bcfw"`` with every sampling and refinement (gap sampling
    included: the estimates, the first-visit queue, the global gap of the cache test and the random stream are
    saved, and the final check of the first run does not refresh the saved estimates) and for ``"mp-bcfw"`` --
    except that the first run's history holds one more record, the final check at the split.  Limits:
    ``time_budget`` and Ctrl-C stops depend on the clock; ``solver="mp-bcfw"`` with ``mp_clock="wall"`` depends on the clock at every outer iteration.

    Attributes:
        max_passes: stop after this many effective passes (oracle calls / n), a finite number > 0 (fractions
            allowed; to stop on the gap or the time only, give a large number with ``gap_tol`` /
            ``time_budget``). Default 100.
        gap_check: run an exact duality-gap pass (n oracle calls at a fixed ``w``) every this
            many passes, and always at the end: an integer >= 1. Default 10.
        gap_tol: stop as soon as a certified gap (of the last or of the averaged iterate) is
            ``<= gap_tol`` (finite, >= 0), in the units of the objective ``lam/2||w||^2 + 1/n sum_i H_i``.
            ``None`` (default) never stops on the gap.
        rel_gap_tol: stop as soon as a certified gap divided by its primal value is ``<= rel_gap_tol``
            (finite, >= 0; ``None``, default: never).
        time_budget: stop after this many seconds of solver time (finite, > 0; ``None``: no limit). The model
            reached so far is returned, with its certified gap.
        step: ``"line_search"`` (default) or ``"fixed"`` (``2n/(k+2n)`` for BCFW, ``2/(k+2)`` for
            FW). SSG always uses ``1/(lam (k+1))``.
        sampling: ``"uniform"`` (i.i.d. with replacement, the setting of the theory; the default when neither
            it nor a preset is given: ``None`` stands for "not given"),
            ``"perm"`` (a fresh random permutation every pass) or ``"gap"`` (BCFW only: adaptive gap
            sampling, Alg. 2: every block once in a random order, then ``i ~ g_i^gap_power`` over the
            block-gap estimates, which every oracle call updates and every exact gap pass refreshes;
            when all estimates are 0 the exact gap pass is run at once).
        step_rule: ``"fw"`` (default, ``None``: not given), ``"pairwise"`` (BCPFW, Alg. 3) or ``"away"`` (BCAFW,
            Alg. 4).
            Pairwise and away steps keep explicit active sets (the dual state's working set) and need
            ``step="line_search"``.
        cache: keep a working set of past oracle answers per block and use its best labeling instead of
            calling the oracle when ``g_hat_i >= max(cache_F g_i, cache_nu / n g_global)`` (Alg. 5).
            ``g_global`` starts at the exact gap of the starting point ``alpha_i = e_{y_i}``
            (``mean_i max_y L_i(y)``: 1 for normalised losses, the value of the authors' code) and is
            replaced by every exact gap pass; ``+inf`` when the run starts from a moved state.
            Default False (``None``: not given).
        cache_size: maximum labelings per block, an integer >= 1 (default 100, the authors' code); the inactive one with the
            lowest score is evicted; active labelings are never evicted by pairwise / away steps.
        cache_F: local factor ``F`` of the cache-hit test, > 0 (default 0.25; ``inf`` allowed).
        cache_nu: global factor ``nu`` of the cache-hit test, > 0 (default 0.01); ``inf`` disables hits.
        gap_power: exponent ``p`` of gap sampling, ``i ~ g_i^p``, finite > 0 (default 1).
        early_gap_check: with ``gap_tol`` and block-gap estimates (gap sampling or cache), run the exact gap
            pass as soon as the sum of the estimates is ``<= early_gap_check * gap_tol`` instead of waiting for
            the next ``gap_check`` pass (the gapBCFW code does this with 0.8; the regularization path uses it).
            ``None`` (default): only the scheduled checks.
        preset: a named combination of ``sampling``, ``step_rule`` and ``cache``:
            ``"gap-pairwise-cache"``, ``"gap"``, ``"uniform-fw-cache"``... (:func:`parse_preset`).  A preset never
            overrides a field given explicitly: giving one that disagrees with the preset is an error (the same
            value is fine, so the reload of :meth:`to_dict`, which holds the preset and the resolved fields,
            works).  ``"auto"``: one of :data:`AUTO_CHOICES` from properties of the problem, never a clock
            (:func:`~torch_bcfw.solvers.bcfw.resolve_auto_preset`): what the model's dual state runs compiled
            first (``gap-pairwise`` for a chain on the CPU, plain BCFW for a graph cut), then the oracle
            (``gap-pairwise-cache`` for an expensive one, else plain BCFW); recorded in ``extra["auto"]``.  Fields given with ``"auto"`` must fit one of the choices (``step="fixed"`` only fits
            the FW steps without the cache, ``cache=True`` only ``gap-pairwise-cache``); when they fit only one, it
            is chosen at once.
            Until the solver resolves it, ``step_rule`` and ``cache`` are ``None`` (:attr:`auto_pending`).
        averaging: (a bool, like ``check_averaged``, ``track_train_loss``, ``progress`` and ``cache``) keep the weighted average ``wbar_k = 2/(k(k+1)) sum_t t w_t`` (and ``lbar``)
            and certify its gap as well. Default True (BCFWstruct: "it made a big difference in
            test error").
        check_averaged: also run the gap pass at the averaged iterate (one more oracle pass per
            check). Default True. Without it the averaged iterate is not certified, so the last
            iterate is returned as the model.
        track_train_loss: record the task loss of the (averaged) model on the training set at every
            gap check (one plain-decoding pass). Default True.
        seed: random seed of the sampler, an integer >= 0 (not a float, not a bool). Default 1.
        progress: show a progress bar (pass, gap, primal, elapsed). Default False.
        mp_max_planes: ``solver="mp-bcfw"`` (Shah et al. 2015): cap ``N`` on the planes (past oracle
            answers) kept per block; the longest-inactive plane is evicted at the cap.  Default 1000 (the
            paper's runs; a high bound, ``mp_inactive_iters`` is what limits the sets).  ``0``: no working
            set and no approximate pass, i.e. exactly BCFW.
        mp_inactive_iters: ``T``: planes not active (returned by an exact or approximate oracle) during the
            last ``T`` outer iterations are dropped during the approximate passes.  Default 10; ``0``: never.
        mp_max_approx_passes: ``M``: most approximate passes per outer iteration (default 1000, a cap: the
            automatic rule decides); ``0``: exact passes only.
        mp_approx_ratio: ``r`` of the automatic rule: stop the approximate passes when ``r x`` the dual gain
            per unit of cost (``mp_clock``) of the last pass falls below that of the whole iteration so far.
            Default 1 (the paper); ``0``: one approximate pass per iteration; ``inf``: always ``M`` (the rule off).
        mp_min_gain: guard of the rule: also stop when an approximate pass gains ``<= mp_min_gain x |dual|``
            (default 1e-12).
        mp_clock: how the automatic rule measures the cost of a pass: ``"work"`` (deterministic: a cost model in
            oracle-call units, an exact block step costs 1 and an approximate block step over ``p`` planes
            ``p / PLANES_PER_ORACLE_CALL`` with the constant
            :data:`torch_bcfw.solvers.mpbcfw.PLANES_PER_ORACLE_CALL` = 10, so that two runs with the same seed are
            identical bit for bit), ``"wall"`` (seconds, the paper's rule: the number of approximate passes, hence
            the run, depends on the machine's speed and load) or ``"auto"`` (default: ``"work"``).  The history's
            ``exact_time`` / ``approx_time`` stay in seconds with either.
        cp_inner_tol: ``solver="cutting-plane"``: the restricted dual over the planes is solved to an inner duality
            gap ``<= cp_inner_tol * max(1, |dual|)`` (default 1e-10).  The certified gap is exact whatever this is.
        cp_inner_iters: ``solver="cutting-plane"``: at most this many pairwise Frank-Wolfe steps per inner solve
            (default 10000).
        eg_step0: ``solver="online-eg"``: initial step size of every example (default 0.5, Collins et al.'s code).
        eg_max_halvings_first: ``solver="online-eg"``: most halvings of the step in the first pass' line searches
            (default 2).
        eg_max_halvings: ``solver="online-eg"``: most halvings afterwards (default 5).
        eg_step_growth: ``solver="online-eg"``: factor applied to an example's step after each line search
            (default 1.05).
        xg_step_scale: ``solver="extragradient"``: the step is ``xg_step_scale / L`` with ``L`` the Lipschitz
            constant of the saddle-point operator (default 1: the step of the theory; above 1 convergence is not
            guaranteed, the certificate stays exact).
        xg_proj_tol: ``solver="extragradient"`` on matchings: every Euclidean projection onto the matching polytope is
            computed to a certified distance ``<= xg_proj_tol`` from the exact one (default 1e-9; the projected point
            is feasible whatever this is).
        xg_proj_iters: ``solver="extragradient"`` on matchings: most Newton steps per projection (default 50).
        batch_size: ``solver="bcfw"``: ``tau``, the blocks of one mini-batch round (Wang et al. 2016), an integer
            ``>= 1`` (1: BCFW), or ``"auto"`` (default): 1 where the data is on the CPU (the compiled one-block
            kernel); with the data on a GPU, where one-block steps are hundreds of times slower than rounds, the
            round size of :func:`measured_round_size`; when ``fit`` shards the examples or splits the oracle calls,
            the calibration's (:func:`torch_bcfw.distributed.strategy.choose_strategy`).  The result's options
            record the number.  With ``strategy="split-oracle"`` it is the round of blocks decoded at one ``w``,
            each then taking its own one-block step (see ``strategy``).  Otherwise, above 1 every round draws ``tau``
            distinct blocks (``uniform``: without
            replacement within the round; ``perm``: consecutive blocks of the permutations), decodes them in one
            batched oracle call at the same ``w`` and moves them together along the joint direction with one exact
            line search (its numerator is the sum of the blocks' gaps) or the fixed step
            ``min(1, 2 n tau / (tau k + 2 n))``.  ``gap``: each round draws its blocks from the gap estimates
            without replacement, and the round's block gaps update them; ``cache``: the oracle is called once for
            the round's blocks that miss the cache.  FW steps only (pairwise / away steps are refused).  With the
            blocks sharded over processes ``tau`` counts the blocks of all processes.
        strategy: how ``fit`` uses a ``torch.distributed`` process group of several ranks (ignored without one):
            ``"replicate"`` (every rank runs the same single-process solve on all examples, with no communication
            but the agreed stopping decisions; the heads are checked identical at the end; rank 0 saves one
            checkpoint, which resumes under any number of processes), ``"shard"`` (the examples sharded over the
            ranks, mini-batch rounds with one all-reduce each), ``"split-oracle"`` (for a costly oracle: the dual
            state replicated as with ``"replicate"``, the oracle calls of each round of ``batch_size`` blocks split
            over the ranks at the same ``w`` and their answers gathered, then every rank takes the round's one-block
            steps in order, each with its exact line search; the trajectory does not depend on the number of ranks,
            and one process runs the same rounds alone) or ``"auto"`` (default: a short calibration on the live group
            picks one, see :func:`torch_bcfw.distributed.strategy.choose_strategy`; the result's options record the
            choice).
    """

    max_passes: float = 100
    gap_check: int = 10
    gap_tol: float | None = None
    rel_gap_tol: float | None = None
    time_budget: float | None = None
    step: str = "line_search"
    sampling: str | None = None
    averaging: bool = True
    check_averaged: bool = True
    track_train_loss: bool = True
    seed: int = 1
    progress: bool = False
    step_rule: str | None = None
    cache: bool | None = None
    cache_size: int = 100
    cache_F: float = 0.25
    cache_nu: float = 0.01
    gap_power: float = 1.0
    early_gap_check: float | None = None
    preset: str | None = None
    mp_max_planes: int = 1000
    mp_inactive_iters: int = 10
    mp_max_approx_passes: int = 1000
    mp_approx_ratio: float = 1.0
    mp_min_gain: float = 1e-12
    mp_clock: str = "auto"
    cp_inner_tol: float = 1e-10
    cp_inner_iters: int = 10000
    eg_step0: float = 0.5
    eg_max_halvings_first: int = 2
    eg_max_halvings: int = 5
    eg_step_growth: float = 1.05
    xg_step_scale: float = 1.0
    xg_proj_tol: float = 1e-9
    xg_proj_iters: int = 50
    batch_size: int | str = "auto"
    strategy: str = "auto"
    extra: dict = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        # ---- bools: True / False or numpy bools only (cache may be None: not given)
        for name in ("averaging", "check_averaged", "track_train_loss", "progress", "cache"):
            v = getattr(self, name)
            if v is None and name == "cache":
                continue
            if not _is_bool(v):
                raise ValueError(f"{name} must be a bool (True or False), got {v!r}")
            setattr(self, name, bool(v))
        if self.step not in ("line_search", "fixed"):
            raise ValueError(f"step must be 'line_search' or 'fixed', got {self.step!r}")
        if self.sampling is not None and self.sampling not in ("uniform", "perm", "gap"):
            raise ValueError(f"sampling must be 'uniform', 'perm' or 'gap', got {self.sampling!r}")
        if self.step_rule is not None and self.step_rule not in ("fw", "pairwise", "away"):
            raise ValueError(f"step_rule must be 'fw', 'pairwise' or 'away', got {self.step_rule!r}")
        # ---- the combination (sampling, step rule, cache): the given fields, then the preset (which must agree
        # with them), then the defaults
        given = {k: getattr(self, k) for k in _COMBINATION_DEFAULTS if getattr(self, k) is not None}
        if self.preset == "auto":
            self._filter_auto_choices(given)
        elif self.preset is not None:
            for k, v in parse_preset(self.preset).items():
                if k in given and given[k] != v:
                    raise ValueError(
                        f"preset {self.preset!r} sets {k}={v!r} but {k}={given[k]!r} was given: a preset names the whole "
                        "combination of sampling, step_rule and cache, so give the preset alone (or the three fields "
                        "without a preset)"
                    )
                setattr(self, k, v)
        else:
            for k, v in _COMBINATION_DEFAULTS.items():
                if getattr(self, k) is None:
                    setattr(self, k, v)
        if (self.step_rule not in ("fw", None) or self.cache) and self.step != "line_search":
            raise ValueError("pairwise / away steps and caching need step='line_search'")
        # ---- numbers: real ints / reals, never bools, never NaN
        self.gap_check = _check_int("gap_check", self.gap_check, 1)
        self.seed = _check_int("seed", self.seed, 0)
        self.cache_size = _check_int("cache_size", self.cache_size, 1)
        for name in ("mp_max_planes", "mp_inactive_iters", "mp_max_approx_passes"):
            setattr(self, name, _check_int(name, getattr(self, name), 0))
        self.max_passes = _check_real("max_passes", self.max_passes, positive=True, finite=True)
        self.gap_tol = _check_real("gap_tol", self.gap_tol, positive=False, finite=True, optional=True)
        self.rel_gap_tol = _check_real("rel_gap_tol", self.rel_gap_tol, positive=False, finite=True, optional=True)
        self.time_budget = _check_real("time_budget", self.time_budget, positive=True, finite=True, optional=True)
        for name in ("cache_F", "cache_nu"):
            setattr(self, name, float(_check_real(name, getattr(self, name), positive=True, finite=False)))
        self.gap_power = float(_check_real("gap_power", self.gap_power, positive=True, finite=True))
        if self.early_gap_check is not None:
            self.early_gap_check = float(
                _check_real("early_gap_check", self.early_gap_check, positive=True, finite=True, optional=True))
        for name in ("mp_approx_ratio", "mp_min_gain"):
            setattr(self, name, float(_check_real(name, getattr(self, name), positive=False, finite=False)))
        if self.mp_clock not in MP_CLOCKS:
            raise ValueError(f"mp_clock must be one of {MP_CLOCKS}, got {self.mp_clock!r}")
        self.cp_inner_tol = float(_check_real("cp_inner_tol", self.cp_inner_tol, positive=True, finite=True))
        self.cp_inner_iters = _check_int("cp_inner_iters", self.cp_inner_iters, 1)
        self.eg_step0 = float(_check_real("eg_step0", self.eg_step0, positive=True, finite=True))
        self.eg_step_growth = float(_check_real("eg_step_growth", self.eg_step_growth, positive=True, finite=True))
        self.eg_max_halvings_first = _check_int("eg_max_halvings_first", self.eg_max_halvings_first, 0)
        self.eg_max_halvings = _check_int("eg_max_halvings", self.eg_max_halvings, 0)
        self.xg_step_scale = float(_check_real("xg_step_scale", self.xg_step_scale, positive=True, finite=True))
        self.xg_proj_tol = float(_check_real("xg_proj_tol", self.xg_proj_tol, positive=True, finite=True))
        self.xg_proj_iters = _check_int("xg_proj_iters", self.xg_proj_iters, 1)
        if self.batch_size != "auto":
            self.batch_size = _check_int("batch_size", self.batch_size, 1)
        if self.strategy not in STRATEGIES:
            raise ValueError(f"strategy must be one of {STRATEGIES}, got {self.strategy!r}")
        if not isinstance(self.extra, dict):
            raise ValueError(f"extra must be a dict, got {self.extra!r}")

    def auto_fits(self) -> list[str]:
        """``preset="auto"``: the names of :data:`AUTO_CHOICES` that agree with the fields set so far (``sampling``,
        ``step_rule``, ``cache`` given, and ``step``: a fixed step only fits FW steps without the cache)."""
        fields = {k: getattr(self, k) for k in _COMBINATION_DEFAULTS if getattr(self, k) is not None}
        return [name for name in AUTO_CHOICES
                if all(parse_preset(name)[k] == v for k, v in fields.items())
                and (self.step == "line_search" or (parse_preset(name)["step_rule"] == "fw"
                                                   and not parse_preset(name)["cache"]))]

    def _filter_auto_choices(self, given: dict) -> None:
        """``preset="auto"``: keep the choices of :data:`AUTO_CHOICES` that agree with the given fields (and with
        ``step``); none: error; one: it is fixed now; more: the fields they differ in stay ``None`` until the solver
        sees the model (:func:`torch_bcfw.solvers.bcfw.resolve_auto_preset`, which picks among them)."""
        fits = self.auto_fits()
        if not fits:
            raise ValueError(
                f"preset='auto' chooses among {', '.join(repr(c) for c in AUTO_CHOICES)} but the given "
                + ", ".join(f"{k}={v!r}" for k, v in given.items())
                + (f" (with step={self.step!r})" if self.step != "line_search" else "")
                + " fits none: drop them or name a preset"
            )
        for k in _COMBINATION_DEFAULTS:  # a field every remaining choice agrees on is set now
            values = {parse_preset(name)[k] for name in fits}
            if len(values) == 1:
                setattr(self, k, values.pop())

    @property
    def auto_pending(self) -> bool:
        """True while ``preset="auto"`` still has to choose ``sampling``, ``step_rule`` or ``cache`` (from the
        model)."""
        return self.preset == "auto" and any(getattr(self, k) is None for k in _COMBINATION_DEFAULTS)

    @classmethod
    def from_kwargs(cls, **kwargs) -> "SolverOptions":
        """Build from keyword arguments; unknown names raise ``TypeError`` listing the valid ones."""
        names = {f.name for f in dataclasses.fields(cls)} - {"extra"}
        unknown = sorted(set(kwargs) - names)
        if unknown:
            raise TypeError(f"unknown solver option(s) {unknown}; valid options: {sorted(names)}")
        return cls(**kwargs)

    @property
    def refined(self) -> bool:
        """True when any refinement of Osokin et al. 2016 is on (gap sampling, pairwise / away, cache)."""
        return self.sampling == "gap" or self.step_rule != "fw" or self.cache

    def variant_name(self) -> str:
        """The preset name of the (resolved) combination, e.g. ``"gap-pairwise-cache"`` (``"auto"`` while
        ``preset="auto"`` is not resolved yet)."""
        if self.auto_pending:
            return "auto"
        return f"{self.sampling}-{self.step_rule}" + ("-cache" if self.cache else "")

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d.pop("extra")
        return d
