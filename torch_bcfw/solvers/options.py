"""Solver options: the options every solver shares (:class:`SolverOptions`, the defaults of the papers' reference
code), and the base of the option groups one solver reads (:class:`OptionGroup`, declared beside that solver)."""
from __future__ import annotations

import dataclasses
import math
import numbers
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np

__all__ = ["SolverOptions", "OptionGroup", "check_flag", "check_int", "check_real"]


def _is_bool(v) -> bool:
    return isinstance(v, (bool, np.bool_))


def _is_int(v) -> bool:
    return isinstance(v, numbers.Integral) and not _is_bool(v)


def _is_real(v) -> bool:
    return isinstance(v, numbers.Real) and not _is_bool(v)


def check_flag(name: str, v) -> bool:
    """A bool option: ``True`` / ``False`` or a numpy bool, as a Python bool."""
    if not _is_bool(v):
        raise ValueError(f"{name} must be a bool (True or False), got {v!r}")
    return bool(v)


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
#: real options: ``(> 0 rather than >= 0, None allowed)``, all finite
_REAL_OPTIONS = {"max_passes": (True, False), "gap_tol": (False, True), "rel_gap_tol": (False, True),
                 "time_budget": (True, True)}


class OptionGroup:
    """The options one solver reads, declared as a dataclass subclass beside that solver (its ``Options``) with the
    papers' defaults.  Users give them flat, ``f"{prefix}_{field}"`` (``mp_max_planes``; a group without a prefix:
    the field names), to ``fit``, the callback, configs and ``SSVM``; :attr:`SolverOptions.own` holds them.  A
    subclass checks its fields in ``__post_init__`` (:func:`check_int`, :func:`check_real`), and against the shared
    options in :meth:`join`."""

    #: the prefix of the flat names, e.g. ``"mp"`` (``""``: the field names are the flat names)
    prefix: ClassVar[str] = ""

    @classmethod
    def flat_names(cls) -> list[str]:
        """The flat names of the fields, e.g. ``["mp_max_planes", ...]``."""
        return [f"{cls.prefix}_{f.name}" if cls.prefix else f.name for f in dataclasses.fields(cls)]

    @classmethod
    def from_flat(cls, flat: dict) -> "OptionGroup":
        """The group from flat names (a subset of :meth:`flat_names`; the others keep their defaults)."""
        cut = len(cls.prefix) + 1 if cls.prefix else 0
        return cls(**{k[cut:]: v for k, v in flat.items()})

    def flat(self) -> dict:
        """The fields under their flat names."""
        return dict(zip(self.flat_names(), dataclasses.asdict(self).values()))

    @classmethod
    def described(cls) -> str:
        """The group's names for a message: ``"mp_* (mp_max_planes, ...)"``."""
        return (f"{cls.prefix}_* " if cls.prefix else "") + f"({', '.join(cls.flat_names())})"

    def join(self, options: "SolverOptions") -> None:
        """Check the group against the shared ``options`` and set the shared fields it decides; here ``sampling``
        not given is ``"uniform"`` (BCFW's group lets its preset decide)."""
        if options.sampling is None:
            options.sampling = "uniform"


@dataclass
class SolverOptions:
    """Options shared by every solver (the defaults of the authors' BCFWstruct and gapBCFW code), and the options of
    the solver run (:attr:`own`).

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
        sampling: the order of the blocks of the stochastic solvers: ``"uniform"`` (i.i.d. with replacement; the
            default, ``None``: not given), ``"perm"`` (a fresh permutation every pass) or ``"gap"`` (BCFW's gap
            sampling, :class:`~torch_bcfw.solvers.bcfw_options.BCFWOptions`, which also sets it from a preset).
        averaging: keep the weighted average ``wbar_k = 2/(k(k+1)) sum_t t w_t`` (and ``lbar``) and certify its
            gap too. Default True.
        check_averaged: also run the gap pass at the averaged iterate (one more oracle pass per check); without
            it the last iterate is the model. Default True.
        track_train_loss: record the task loss of the model on the training set at every gap check. Default True.
        seed: random seed of the sampler, an integer >= 0. Default 1.
        progress: show a progress bar (pass, gap, primal, elapsed). Default False.
        batch_size: ``solver="bcfw"``: ``tau``, the blocks of one mini-batch round (Wang et al. 2016), an integer
            ``>= 1`` (1: BCFW), or ``"auto"`` (default): 1 on the CPU, on a GPU
            :func:`~torch_bcfw.planning.measured_round_size`, under a distributed strategy the calibration's; the
            result's options record it.  A round draws
            ``tau`` distinct blocks (of all processes), decodes them at one ``w`` and moves them together (FW steps,
            one exact line search or the step ``min(1, 2 n tau / (tau k + 2 n))``); with ``strategy="split-oracle"``
            each block then takes its own one-block step.
        strategy: how ``fit`` uses a ``torch.distributed`` group of several ranks: ``"replicate"`` (every rank runs
            the same single-process solve), ``"shard"`` (examples sharded over the ranks, mini-batch rounds with one
            all-reduce each), ``"split-oracle"`` (a replicated state whose rounds' oracle calls are split over the
            ranks; the trajectory does not depend on their number) or ``"auto"`` (default: a short calibration
            picks one, :func:`torch_bcfw.planning.choose_strategy`).
        own: the :class:`OptionGroup` of the solver run (its ``Options``: :class:`~torch_bcfw.solvers.bcfw_options.
            BCFWOptions` for ``"bcfw"``, ``mp_*`` for ``"mp-bcfw"``, ...; ``None``: its defaults), given flat to
            :func:`~torch_bcfw.solvers.run.options_for`.
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
    batch_size: int | str = "auto"
    strategy: str = "auto"
    own: OptionGroup | None = None
    extra: dict = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        for name in ("averaging", "check_averaged", "track_train_loss", "progress"):
            setattr(self, name, check_flag(name, getattr(self, name)))
        if self.step not in ("line_search", "fixed"):
            raise ValueError(f"step must be 'line_search' or 'fixed', got {self.step!r}")
        if self.sampling is not None and self.sampling not in ("uniform", "perm", "gap"):
            raise ValueError(f"sampling must be 'uniform', 'perm' or 'gap', got {self.sampling!r}")
        for name, lo in _INT_OPTIONS.items():
            setattr(self, name, check_int(name, getattr(self, name), lo))
        for name, (positive, optional) in _REAL_OPTIONS.items():
            setattr(self, name, check_real(name, getattr(self, name), positive=positive, finite=True, optional=optional))
        if self.batch_size != "auto":
            self.batch_size = check_int("batch_size", self.batch_size, 1)
        if self.strategy not in STRATEGIES:
            raise ValueError(f"strategy must be one of {STRATEGIES}, got {self.strategy!r}")
        if not isinstance(self.extra, dict):
            raise ValueError(f"extra must be a dict, got {self.extra!r}")
        if self.own is not None and not isinstance(self.own, OptionGroup):
            raise ValueError(f"own must be a solver's OptionGroup, got {self.own!r}")
        (OptionGroup() if self.own is None else self.own).join(self)

    @classmethod
    def shared_names(cls) -> list[str]:
        """The names of the shared options (the fields but :attr:`own` and ``extra``)."""
        return [f.name for f in dataclasses.fields(cls) if f.name not in ("own", "extra")]

    def to_dict(self) -> dict:
        """The options under the names :func:`~torch_bcfw.solvers.run.options_for` takes (the solver's own flat)."""
        d = {name: getattr(self, name) for name in self.shared_names()}
        if self.own is not None:
            d.update(self.own.flat())
        return d
