"""BCFW's own options (:class:`BCFWOptions`): the refinements of Osokin et al. 2016 (gap sampling, pairwise and away
steps, the cache), the presets naming their combinations, and the cache's test."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from .options import OptionGroup, SolverOptions, check_flag, check_int, check_real

__all__ = ["BCFWOptions", "parse_preset", "PRESETS", "AUTO_CHOICES", "auto_fits", "auto_pending", "is_refined",
           "variant_name", "with_combination"]

#: the 8 combinations compared by Osokin et al. 2016 (Sec. 5.1) plus the away-step variants
PRESETS = tuple(
    f"{s}-{r}{c}" for c in ("", "-cache") for r in ("fw", "pairwise", "away") for s in ("uniform", "gap")
) + ("auto",)

#: the combinations ``preset="auto"`` chooses among (:func:`torch_bcfw.planning.resolve_auto_preset`)
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


@dataclass
class BCFWOptions(OptionGroup):
    """The options of ``solver="bcfw"``, given flat by their field names.  Without a preset, BCFW is plain BCFW
    (Lacoste-Julien et al. 2013).  The refinements of Osokin et al. 2016 (gap sampling, the shared option
    ``sampling="gap"``; ``step_rule="pairwise"`` / ``"away"``; ``cache=True``) combine freely; ``preset`` names a
    combination.  A pass of these variants is ``n`` block iterations, cache hits included; the history's ``passes``
    is oracle calls / n.

    Attributes:
        step_rule: ``"fw"`` (default, ``None``: not given), ``"pairwise"`` (BCPFW, Alg. 3) or ``"away"`` (BCAFW,
            Alg. 4); pairwise and away steps keep explicit active sets and need ``step="line_search"``.
        cache: keep a working set of past oracle answers per block and use its best labeling instead of the oracle
            when ``g_hat_i >= max(cache_F g_i, cache_nu / n g_global)`` (Alg. 5).  ``g_global`` starts at the
            exact gap of ``alpha_i = e_{y_i}`` (``mean_i max_y L_i(y)``; ``+inf`` from a moved state) and is
            replaced by every exact gap pass.  Default False (``None``: not given).
        gap_power: exponent ``p`` of gap sampling (every block once in a random order, then ``i ~ g_i^p`` over the
            block-gap estimates, updated by every oracle call and refreshed by every exact gap pass; all estimates 0
            runs the exact gap pass at once), finite > 0 (default 1).
        early_gap_check: with ``gap_tol`` and block-gap estimates, run the exact gap pass as soon as the estimates
            sum to ``<= early_gap_check * gap_tol`` (the gapBCFW code uses 0.8).  ``None`` (default): only the
            scheduled checks.
        preset: a named combination of ``sampling``, ``step_rule`` and ``cache`` (:func:`parse_preset`), e.g.
            ``"gap-pairwise-cache"``; fields given explicitly must agree with it.  ``"auto"``: one of
            :data:`AUTO_CHOICES` fitting the given fields, from properties of the problem
            (:func:`~torch_bcfw.planning.resolve_auto_preset`); until resolved the open fields are ``None``.
        cache_size: maximum labelings per block, an integer >= 1 (default 100); the inactive one with the lowest
            score is evicted, active ones never.
        cache_F: local factor ``F`` of the cache-hit test, > 0 (default 0.25; ``inf`` allowed).
        cache_nu: global factor ``nu`` of the cache-hit test, > 0 (default 0.01); ``inf`` disables hits.
    """

    step_rule: str | None = None
    cache: bool | None = None
    gap_power: float = 1.0
    early_gap_check: float | None = None
    preset: str | None = None
    cache_size: int = 100
    cache_F: float = 0.25
    cache_nu: float = 0.01

    def __post_init__(self) -> None:
        if self.step_rule is not None and self.step_rule not in ("fw", "pairwise", "away"):
            raise ValueError(f"step_rule must be 'fw', 'pairwise' or 'away', got {self.step_rule!r}")
        if self.cache is not None:
            self.cache = check_flag("cache", self.cache)
        self.gap_power = float(check_real("gap_power", self.gap_power, positive=True, finite=True))
        early = check_real("early_gap_check", self.early_gap_check, positive=True, finite=True, optional=True)
        self.early_gap_check = None if early is None else float(early)
        self.cache_size = check_int("cache_size", self.cache_size, 1)
        self.cache_F = float(check_real("cache_F", self.cache_F, positive=True, finite=False))
        self.cache_nu = float(check_real("cache_nu", self.cache_nu, positive=True, finite=False))

    def join(self, options: SolverOptions) -> None:
        """The combination of ``sampling`` (shared), ``step_rule`` and ``cache``: the given fields, then the preset
        (which must agree with them), then the defaults; ``preset="auto"`` sets what every fitting choice agrees on."""
        given = {k: v for k, v in _combination(options).items() if v is not None}
        if self.preset == "auto":
            fits = auto_fits(options)
            if not fits:
                raise ValueError(
                    f"preset='auto' chooses among {', '.join(repr(c) for c in AUTO_CHOICES)} but the given "
                    + ", ".join(f"{k}={v!r}" for k, v in given.items())
                    + (f" (with step={options.step!r})" if options.step != "line_search" else "")
                    + " fits none: drop them or name a preset"
                )
            agreed = {k: {parse_preset(n)[k] for n in fits} for k in _COMBINATION_DEFAULTS}
            settled = {k: v.pop() for k, v in agreed.items() if len(v) == 1}
        elif self.preset is not None:
            settled = parse_preset(self.preset)
            for k, v in settled.items():
                if k in given and given[k] != v:
                    raise ValueError(
                        f"preset {self.preset!r} sets {k}={v!r} but {k}={given[k]!r} was given: a preset names the "
                        "whole combination of sampling, step_rule and cache, so give the preset alone (or the three "
                        "fields without a preset)"
                    )
        else:
            settled = _COMBINATION_DEFAULTS
        for k, v in {**settled, **given}.items():
            setattr(options if k == "sampling" else self, k, v)
        if (self.step_rule not in ("fw", None) or self.cache) and options.step != "line_search":
            raise ValueError("pairwise / away steps and caching need step='line_search'")


def _combination(options: SolverOptions) -> dict:
    """``sampling``, ``step_rule`` and ``cache`` of BCFW ``options`` (``None``: not given / not chosen yet)."""
    return {"sampling": options.sampling, "step_rule": options.own.step_rule, "cache": options.own.cache}


def auto_fits(options: SolverOptions) -> list[str]:
    """``preset="auto"``: the names of :data:`AUTO_CHOICES` that agree with the fields set so far (``sampling``,
    ``step_rule``, ``cache`` given, and ``step``: a fixed step only fits FW steps without the cache)."""
    fields = {k: v for k, v in _combination(options).items() if v is not None}
    return [name for name in AUTO_CHOICES
            if all(parse_preset(name)[k] == v for k, v in fields.items())
            and (options.step == "line_search" or (parse_preset(name)["step_rule"] == "fw"
                                                   and not parse_preset(name)["cache"]))]


def auto_pending(options: SolverOptions) -> bool:
    """True while ``preset="auto"`` still has to choose ``sampling``, ``step_rule`` or ``cache``."""
    return options.own.preset == "auto" and None in _combination(options).values()


def is_refined(options: SolverOptions) -> bool:
    """True when any refinement of Osokin et al. 2016 is on (gap sampling, pairwise / away, cache)."""
    return options.sampling == "gap" or options.own.step_rule != "fw" or bool(options.own.cache)


def variant_name(options: SolverOptions) -> str:
    """The preset name of the combination of BCFW ``options``, e.g. ``"gap-pairwise-cache"`` (``"auto"`` while
    unresolved)."""
    if auto_pending(options):
        return "auto"
    return f"{options.sampling}-{options.own.step_rule}" + ("-cache" if options.own.cache else "")


def with_combination(options: SolverOptions, name: str, **changes) -> SolverOptions:
    """BCFW ``options`` running the combination of the preset ``name`` (:func:`parse_preset`) and the shared
    ``changes``; ``preset="auto"`` stays (the combination is its choice), another preset is dropped."""
    c = parse_preset(name)
    own = BCFWOptions() if options.own is None else options.own
    own = dataclasses.replace(own, step_rule=c["step_rule"], cache=c["cache"],
                              preset="auto" if own.preset == "auto" else None)
    return dataclasses.replace(options, sampling=c["sampling"], own=own, **changes)
