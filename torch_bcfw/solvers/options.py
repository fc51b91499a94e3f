"""Solver options: one dataclass, with the defaults of the papers' reference code."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

__all__ = ["SolverOptions", "SOLVERS", "parse_preset", "PRESETS", "AUTO_ORACLE_THRESHOLD"]

#: solver names accepted by :func:`torch_bcfw.fit`
SOLVERS = ("bcfw", "fw", "ssg", "mp-bcfw")

#: the 8 combinations compared by Osokin et al. 2016 (Sec. 5.1) plus the away-step variants
PRESETS = tuple(
    f"{s}-{r}{c}" for c in ("", "-cache") for r in ("fw", "pairwise", "away") for s in ("uniform", "gap")
) + ("auto",)

#: per-example oracle time (seconds) from which ``preset="auto"`` treats the oracle as expensive
AUTO_ORACLE_THRESHOLD = 1e-4

_SAMPLING_TOKENS = {"uniform": "uniform", "perm": "perm", "gap": "gap"}
_RULE_TOKENS = {"fw": "fw", "bcfw": "fw", "pairwise": "pairwise", "bcpfw": "pairwise", "away": "away", "bcafw": "away"}


def parse_preset(name: str) -> dict:
    """``sampling``, ``step_rule`` and ``cache`` of a preset name.

    A name joins with ``-`` an optional sampling (``uniform`` default, ``perm``, ``gap``), an optional step
    rule (``fw`` default, ``pairwise``, ``away``; the paper's names ``bcfw``, ``bcpfw``, ``bcafw`` also work)
    and an optional ``cache``: ``"gap-pairwise-cache"``, ``"gap"``, ``"pairwise"``, ``"uniform-fw"``...
    ``"auto"`` is resolved by the solver from the measured oracle time (see :class:`SolverOptions`).
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


@dataclass
class SolverOptions:
    """Options shared by BCFW, batch Frank-Wolfe and SSG.

    Defaults follow the authors' BCFWstruct code (line search, weighted averaging, uniform
    sampling with replacement, ``rand_seed = 1``) and the gapBCFW code (exact gap every 10 passes,
    cache of 100 labelings per block, ``F = 0.25``, ``nu = 0.01``, sampling proportional to ``gap^1``).
    Without a preset, BCFW is plain BCFW (Lacoste-Julien et al. 2013), as before.

    The refinements of Osokin et al. 2016 (BCFW only): ``sampling="gap"``, ``step_rule="pairwise"`` /
    ``"away"`` and ``cache=True`` combine freely; ``preset`` names a combination.  A "pass" of these
    variants is ``n`` block iterations (cache hits included, as in the authors' code); the history
    counts oracle calls and cache hits separately, and ``passes`` there is oracle calls / n.

    Attributes:
        max_passes: stop after this many effective passes (oracle calls / n). Default 100.
        gap_check: run an exact duality-gap pass (n oracle calls at a fixed ``w``) every this
            many passes, and always at the end. Default 10.
        gap_tol: stop as soon as a certified gap (of the last or of the averaged iterate) is
            ``<= gap_tol``, in the units of the objective ``lam/2||w||^2 + 1/n sum_i H_i``.
            ``None`` (default) never stops on the gap.
        rel_gap_tol: stop as soon as a certified gap divided by its primal value is ``<= rel_gap_tol``
            (``None``, default: never).
        time_budget: stop after this many seconds of solver time (``None``: no limit). The model
            reached so far is returned, with its certified gap.
        step: ``"line_search"`` (default) or ``"fixed"`` (``2n/(k+2n)`` for BCFW, ``2/(k+2)`` for
            FW). SSG always uses ``1/(lam (k+1))``.
        sampling: ``"uniform"`` (i.i.d. with replacement, the setting of the theory; default),
            ``"perm"`` (a fresh random permutation every pass) or ``"gap"`` (BCFW only: adaptive gap
            sampling, Alg. 2: every block once in a random order, then ``i ~ g_i^gap_power`` over the
            block-gap estimates, which every oracle call updates and every exact gap pass refreshes;
            when all estimates are 0 the exact gap pass is run at once).
        step_rule: ``"fw"`` (default), ``"pairwise"`` (BCPFW, Alg. 3) or ``"away"`` (BCAFW, Alg. 4).
            Pairwise and away steps keep explicit active sets (the dual state's working set) and need
            ``step="line_search"``.
        cache: keep a working set of past oracle answers per block and use its best labeling instead of
            calling the oracle when ``g_hat_i >= max(cache_F g_i, cache_nu / n g_global)`` (Alg. 5).
            ``g_global`` starts at the exact gap of the starting point ``alpha_i = e_{y_i}``
            (``mean_i max_y L_i(y)``: 1 for normalised losses, the value of the authors' code) and is
            replaced by every exact gap pass; ``+inf`` when the run starts from a moved state.
            Default False.
        cache_size: maximum labelings per block (default 100, the authors' code); the inactive one with the
            lowest score is evicted; active labelings are never evicted by pairwise / away steps.
        cache_F: local factor ``F`` of the cache-hit test (default 0.25).
        cache_nu: global factor ``nu`` of the cache-hit test (default 0.01); ``inf`` disables hits.
        gap_power: exponent ``p`` of gap sampling, ``i ~ g_i^p`` (default 1).
        early_gap_check: with ``gap_tol`` and block-gap estimates (gap sampling or cache), run the exact gap
            pass as soon as the sum of the estimates is ``<= early_gap_check * gap_tol`` instead of waiting for
            the next ``gap_check`` pass (the gapBCFW code does this with 0.8; the regularization path uses it).
            ``None`` (default): only the scheduled checks.
        preset: a named combination of ``sampling``, ``step_rule`` and ``cache`` (overrides them):
            ``"gap-pairwise-cache"``, ``"gap"``, ``"uniform-fw-cache"``... (:func:`parse_preset`), or
            ``"auto"``: the paper's recommendation from the measured oracle time per example:
            ``gap-pairwise-cache`` when it is ``>= auto_oracle_threshold`` seconds, else ``gap-fw``.
        auto_oracle_threshold: threshold of ``preset="auto"`` in seconds per oracle call (default 1e-4:
            the compiled chain oracles of this package, 2-40 microseconds, are cheap; graph cuts and
            pose trees are expensive).
        averaging: keep the weighted average ``wbar_k = 2/(k(k+1)) sum_t t w_t`` (and ``lbar``)
            and certify its gap as well. Default True (BCFWstruct: "it made a big difference in
            test error").
        check_averaged: also run the gap pass at the averaged iterate (one more oracle pass per
            check). Default True. Without it the averaged iterate is not certified, so the last
            iterate is returned as the model.
        track_train_loss: record the task loss of the (averaged) model on the training set at every
            gap check (one plain-decoding pass). Default True.
        seed: random seed of the sampler. Default 1.
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
            per second of the last pass falls below that of the whole iteration so far.  Default 1 (the
            paper); ``0``: one approximate pass per iteration; ``inf``: always ``M`` (the timing rule off).
        mp_min_gain: guard of the rule: also stop when an approximate pass gains ``<= mp_min_gain x |dual|``
            (default 1e-12).
    """

    max_passes: float = 100
    gap_check: int = 10
    gap_tol: float | None = None
    rel_gap_tol: float | None = None
    time_budget: float | None = None
    step: str = "line_search"
    sampling: str = "uniform"
    averaging: bool = True
    check_averaged: bool = True
    track_train_loss: bool = True
    seed: int = 1
    progress: bool = False
    step_rule: str = "fw"
    cache: bool = False
    cache_size: int = 100
    cache_F: float = 0.25
    cache_nu: float = 0.01
    gap_power: float = 1.0
    early_gap_check: float | None = None
    preset: str | None = None
    auto_oracle_threshold: float = AUTO_ORACLE_THRESHOLD
    mp_max_planes: int = 1000
    mp_inactive_iters: int = 10
    mp_max_approx_passes: int = 1000
    mp_approx_ratio: float = 1.0
    mp_min_gain: float = 1e-12
    extra: dict = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if self.preset is not None and self.preset != "auto":
            for k, v in parse_preset(self.preset).items():
                setattr(self, k, v)
        if self.step not in ("line_search", "fixed"):
            raise ValueError(f"step must be 'line_search' or 'fixed', got {self.step!r}")
        if self.sampling not in ("uniform", "perm", "gap"):
            raise ValueError(f"sampling must be 'uniform', 'perm' or 'gap', got {self.sampling!r}")
        if self.step_rule not in ("fw", "pairwise", "away"):
            raise ValueError(f"step_rule must be 'fw', 'pairwise' or 'away', got {self.step_rule!r}")
        self.cache = bool(self.cache)
        if (self.step_rule != "fw" or self.cache) and self.step != "line_search":
            raise ValueError("pairwise / away steps and caching need step='line_search'")
        if int(self.cache_size) < 1:
            raise ValueError(f"cache_size must be >= 1, got {self.cache_size}")
        self.cache_size = int(self.cache_size)
        for name in ("cache_F", "cache_nu", "gap_power", "auto_oracle_threshold"):
            v = float(getattr(self, name))
            if not v > 0:
                raise ValueError(f"{name} must be > 0, got {v}")
            setattr(self, name, v)
        if self.early_gap_check is not None:
            self.early_gap_check = float(self.early_gap_check)
            if not self.early_gap_check > 0:
                raise ValueError(f"early_gap_check must be > 0 (a fraction of gap_tol), got {self.early_gap_check}")
        if not self.max_passes > 0:
            raise ValueError(f"max_passes must be > 0, got {self.max_passes}")
        if int(self.gap_check) < 1:
            raise ValueError(f"gap_check must be >= 1, got {self.gap_check}")
        self.gap_check = int(self.gap_check)
        if self.gap_tol is not None and self.gap_tol < 0:
            raise ValueError(f"gap_tol must be >= 0, got {self.gap_tol}")
        if self.rel_gap_tol is not None and self.rel_gap_tol < 0:
            raise ValueError(f"rel_gap_tol must be >= 0, got {self.rel_gap_tol}")
        for name in ("mp_max_planes", "mp_inactive_iters", "mp_max_approx_passes"):
            v = getattr(self, name)
            if isinstance(v, bool) or int(v) != v or v < 0:
                raise ValueError(f"{name} must be an integer >= 0, got {v!r}")
            setattr(self, name, int(v))
        for name in ("mp_approx_ratio", "mp_min_gain"):
            v = float(getattr(self, name))
            if not v >= 0:
                raise ValueError(f"{name} must be >= 0, got {v}")
            setattr(self, name, v)
        if self.time_budget is not None and self.time_budget <= 0:
            raise ValueError(f"time_budget must be > 0 seconds, got {self.time_budget}")

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
        """The preset name of the (resolved) combination, e.g. ``"gap-pairwise-cache"``."""
        return f"{self.sampling}-{self.step_rule}" + ("-cache" if self.cache else "")

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d.pop("extra")
        return d
