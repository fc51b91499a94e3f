"""Solver options: the options every solver shares (:class:`SolverOptions`, the defaults of the papers' reference
code), and the base of the option groups one solver reads (:class:`OptionGroup`, declared beside that solver)."""
from __future__ import annotations

import dataclasses
import math
import numbers
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np

__all__ = ["SolverOptions", "OptionGroup", "parse_preset", "PRESETS", "AUTO_CHOICES", "check_int", "check_real"]

#: the 8 combinations compared by Osokin et al. 2016 (Sec. 5.1) plus the away-step variants
PRESETS = tuple(
    f"{s}-{r}{c}" for c in ("", "-cache") for r in ("fw", "pairwise", "away") for s in ("uniform", "gap")
) + ("auto",)


#: the combinations ``preset="auto"`` chooses among (:func:`torch_bcfw.solvers.bcfw.resolve_auto_preset`)
AUTO_CHOICES = ("gap-pairwise-cache", "gap-pairwise", "gap-fw", "uniform-fw")

#: what ``sampling``, ``step_rule`` and ``cache`` are when neither they nor a preset are given (plain BCFW)
_COMBINATION_DEFAULTS = {"sampling": "uniform", "step_rule": "fw", "cache": False}

_SAMPLING_TOKENS = {"uniform": "uniform", "perm": "perm", "gap": "gap"}
_RULE_TOKENS = {"fw": "fw", "bcfw": "fw", "pairwise": "pairwise", "bcpfw": "pairwise", "away": "away", "bcafw": "away"}


def parse_preset(name: str) -> dict:
    """``sampling``, ``step_rule`` and ``cache`` of a preset name: joined with ``-``, an optional sampling
    (``uniform`` default, ``perm``, ``gap``), step rule (``fw`` default, ``pairwise``, ``away``; also the paper's
    ``bcfw``, ``bcpfw``, ``bcafw``) and ``cache``, e.g. ``"gap-pairwise-cache"``, ``"pairwise"``."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"preset must be a non-empty string, got {name!r}")
    out = dict(_COMBINATION_DEFAULTS)
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


def check_int(name: str, v, minimum: int) -> int:
    """An integer option (``int`` or numpy integer; not a bool, not a float even if integral) ``>= minimum``."""
    if _is_real(v) and not _is_int(v) and math.isfinite(v) and v == int(v):  # 1e3 in a config is a float
        raise ValueError(f"{name} must be an integer >= {minimum}, got the float {v!r}: write it as {int(v)}")
    if not _is_int(v) or v < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {v!r}")
    return int(v)


def check_real(name: str, v, *, positive: bool, finite: bool, optional: bool = False):
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

#: integer options and their minimum
_INT_OPTIONS = {"gap_check": 1, "seed": 0}
#: real options: ``(> 0 rather than >= 0, finite, None allowed)``; all but ``_NUMBER_OPTIONS`` are made floats
_REAL_OPTIONS = {
    "max_passes": (True, True, False), "gap_tol": (False, True, True), "rel_gap_tol": (False, True, True),
    "time_budget": (True, True, True), "gap_power": (True, True, False), "early_gap_check": (True, True, True),
}
_NUMBER_OPTIONS = ("max_passes", "gap_tol", "rel_gap_tol", "time_budget")


class OptionGroup:
    """The options one solver reads, declared as a dataclass subclass beside that solver (its ``Options``) with the
    papers' defaults.  Users give them flat, ``f"{prefix}_{field}"`` (``mp_max_planes``), to ``fit``, the callback and
    configs; :attr:`SolverOptions.solver_options` holds them.  A subclass checks its fields in ``__post_init__``
    (:func:`check_int`, :func:`check_real`)."""

    #: the prefix of the flat names, e.g. ``"mp"``
    prefix: ClassVar[str] = ""

    @classmethod
    def flat_names(cls) -> list[str]:
        """The flat names of the fields, e.g. ``["mp_max_planes", ...]``."""
        return [f"{cls.prefix}_{f.name}" for f in dataclasses.fields(cls)]

    @classmethod
    def from_flat(cls, flat: dict) -> "OptionGroup":
        """The group from flat names (a subset of :meth:`flat_names`; the others keep their defaults)."""
        return cls(**{k[len(cls.prefix) + 1:]: v for k, v in flat.items()})

    def flat(self) -> dict:
        """The fields under their flat names."""
        return {f"{self.prefix}_{k}": v for k, v in dataclasses.asdict(self).items()}


@dataclass
class SolverOptions:
    """Options shared by every solver (the defaults of the authors' BCFWstruct and gapBCFW code), and the options of
    the solver run (:attr:`solver_options`).

    Without a preset, BCFW is plain BCFW (Lacoste-Julien et al. 2013).  The refinements of Osokin et al. 2016
    (BCFW only: ``sampling="gap"``, ``step_rule="pairwise"`` / ``"away"``, ``cache=True``) combine freely;
    ``preset`` names a combination.  A pass of these variants is ``n`` block iterations, cache hits included; the
    history's ``passes`` is oracle calls / n.

    Every option is checked, nothing is coerced (``ValueError`` naming the option): integer options take an
    ``int`` or numpy integer (not a bool, not an integral float such as ``3.0``); bool options take ``True`` /
    ``False`` or a numpy bool; numeric options take real numbers, never a bool or NaN, finite unless said below.

    Warm starts continue exactly: ``fit(a + b passes)`` equals ``fit(a)`` then ``fit(b, init=...)`` bit for bit (but
    the timings and the first run's final check) for ``"bcfw"`` and ``"mp-bcfw"``, unless a clock decides.

    Attributes:
        max_passes: stop after this many effective passes (oracle calls / n), finite > 0, fractions allowed.
            Default 100.
        gap_check: run an exact duality-gap pass (n oracle calls at a fixed ``w``) every this many passes, and at
            the end: an integer >= 1. Default 10.
        gap_tol: stop once a certified gap (last or averaged iterate) is ``<= gap_tol`` (finite, >= 0), in the
            units of ``lam/2||w||^2 + 1/n sum_i H_i``.  ``None`` (default): never.
        rel_gap_tol: stop once a certified gap / its primal value is ``<= rel_gap_tol`` (finite, >= 0; ``None``,
            default: never).
        time_budget: stop after this many seconds of solver time (finite, > 0; ``None``: no limit); the model
            reached so far is returned, certified.
        step: ``"line_search"`` (default) or ``"fixed"`` (``2n/(k+2n)`` for BCFW, ``2/(k+2)`` for FW). SSG
            always uses ``1/(lam (k+1))``.
        sampling: ``"uniform"`` (i.i.d. with replacement; the default, ``None``: not given), ``"perm"`` (a fresh
            permutation every pass) or ``"gap"`` (BCFW only, Alg. 2: every block once in a random order, then
            ``i ~ g_i^gap_power`` over the block-gap estimates, updated by every oracle call and refreshed by every
            exact gap pass; all estimates 0 runs the exact gap pass at once).
        step_rule: ``"fw"`` (default, ``None``: not given), ``"pairwise"`` (BCPFW, Alg. 3) or ``"away"`` (BCAFW,
            Alg. 4); pairwise and away steps keep explicit active sets and need ``step="line_search"``.
        cache: keep a working set of past oracle answers per block and use its best labeling instead of the oracle
            when ``g_hat_i >= max(cache_F g_i, cache_nu / n g_global)`` (Alg. 5).  ``g_global`` starts at the
            exact gap of ``alpha_i = e_{y_i}`` (``mean_i max_y L_i(y)``; ``+inf`` from a moved state) and is
            replaced by every exact gap pass.  Default False (``None``: not given).
        gap_power: exponent ``p`` of gap sampling, ``i ~ g_i^p``, finite > 0 (default 1).
        early_gap_check: with ``gap_tol`` and block-gap estimates, run the exact gap pass as soon as the estimates
            sum to ``<= early_gap_check * gap_tol`` (the gapBCFW code uses 0.8).  ``None`` (default): only the
            scheduled checks.
        preset: a named combination of ``sampling``, ``step_rule`` and ``cache`` (:func:`parse_preset`), e.g.
            ``"gap-pairwise-cache"``; fields given explicitly must agree with it.  ``"auto"``: one of
            :data:`AUTO_CHOICES` fitting the given fields, from properties of the problem
            (:func:`~torch_bcfw.solvers.bcfw.resolve_auto_preset`); until resolved the open fields are ``None``.
        averaging: keep the weighted average ``wbar_k = 2/(k(k+1)) sum_t t w_t`` (and ``lbar``) and certify its
            gap too. Default True.
        check_averaged: also run the gap pass at the averaged iterate (one more oracle pass per check); without
            it the last iterate is the model. Default True.
        track_train_loss: record the task loss of the model on the training set at every gap check. Default True.
        seed: random seed of the sampler, an integer >= 0. Default 1.
        progress: show a progress bar (pass, gap, primal, elapsed). Default False.
        batch_size: ``solver="bcfw"``: ``tau``, the blocks of one mini-batch round (Wang et al. 2016), an integer
            ``>= 1`` (1: BCFW), or ``"auto"`` (default): 1 on the CPU, on a GPU
            :func:`~torch_bcfw.solvers.bcfw.measured_round_size`, under a distributed strategy the calibration's; the
            result's options record it.  A round draws
            ``tau`` distinct blocks (of all processes), decodes them at one ``w`` and moves them together (FW steps,
            one exact line search or the step ``min(1, 2 n tau / (tau k + 2 n))``); with ``strategy="split-oracle"``
            each block then takes its own one-block step.
        strategy: how ``fit`` uses a ``torch.distributed`` group of several ranks: ``"replicate"`` (every rank runs
            the same single-process solve), ``"shard"`` (examples sharded over the ranks, mini-batch rounds with one
            all-reduce each), ``"split-oracle"`` (a replicated state whose rounds' oracle calls are split over the
            ranks; the trajectory does not depend on their number) or ``"auto"`` (default: a short calibration
            picks one, :func:`torch_bcfw.distributed.strategy.choose_strategy`).
        solver_options: the :class:`OptionGroup` of the solver run (its ``Options``: the cache's options for
            ``"bcfw"``, ``mp_*`` for ``"mp-bcfw"``, ...; ``None``: its defaults), given flat to
            :meth:`from_kwargs`.
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
    gap_power: float = 1.0
    early_gap_check: float | None = None
    preset: str | None = None
    batch_size: int | str = "auto"
    strategy: str = "auto"
    solver_options: OptionGroup | None = None
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
        # the combination: the given fields, then the preset (which must agree with them), then the defaults
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
        for name, lo in _INT_OPTIONS.items():
            setattr(self, name, check_int(name, getattr(self, name), lo))
        for name, (positive, finite, optional) in _REAL_OPTIONS.items():
            v = check_real(name, getattr(self, name), positive=positive, finite=finite, optional=optional)
            setattr(self, name, v if v is None or name in _NUMBER_OPTIONS else float(v))
        if self.batch_size != "auto":
            self.batch_size = check_int("batch_size", self.batch_size, 1)
        if self.solver_options is not None and not isinstance(self.solver_options, OptionGroup):
            raise ValueError(f"solver_options must be a solver's OptionGroup, got {self.solver_options!r}")
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
        """``preset="auto"``: set the fields every choice of :meth:`auto_fits` agrees on (error when none fits);
        the others stay ``None`` until :func:`~torch_bcfw.solvers.bcfw.resolve_auto_preset`."""
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
        """True while ``preset="auto"`` still has to choose ``sampling``, ``step_rule`` or ``cache``."""
        return self.preset == "auto" and any(getattr(self, k) is None for k in _COMBINATION_DEFAULTS)

    @classmethod
    def from_kwargs(cls, group: type[OptionGroup] | None = None, **kwargs) -> "SolverOptions":
        """Build from keyword arguments: the shared options, and the flat names of ``group`` (the solver's
        ``Options``, :func:`~torch_bcfw.solvers.run.solver_options`); unknown names raise ``TypeError`` listing the
        valid ones."""
        names = {f.name for f in dataclasses.fields(cls)} - {"extra", "solver_options"}
        own = set(group.flat_names()) if group is not None else set()
        unknown = sorted(set(kwargs) - names - own)
        if unknown:
            raise TypeError(f"unknown solver option(s) {unknown}; valid options: {sorted(names | own)}")
        flat = {k: kwargs.pop(k) for k in own & set(kwargs)}
        return cls(**kwargs, solver_options=group.from_flat(flat) if group is not None else None)

    @property
    def refined(self) -> bool:
        """True when any refinement of Osokin et al. 2016 is on (gap sampling, pairwise / away, cache)."""
        return self.sampling == "gap" or self.step_rule != "fw" or self.cache

    def variant_name(self) -> str:
        """The preset name of the combination, e.g. ``"gap-pairwise-cache"`` (``"auto"`` while unresolved)."""
        if self.auto_pending:
            return "auto"
        return f"{self.sampling}-{self.step_rule}" + ("-cache" if self.cache else "")

    def to_dict(self) -> dict:
        """The options under the names :meth:`from_kwargs` takes (the solver's options flat)."""
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name not in ("extra", "solver_options")}
        if self.solver_options is not None:
            d.update(self.solver_options.flat())
        return d
