"""The interface between the solver loop and one algorithm (each solver of :data:`~torch_bcfw.solvers.run.ALGORITHMS`)."""
from __future__ import annotations

import dataclasses

import torch
from torch import Tensor

from ..checks import saved_int
from ..duals.plan import generic_plan_steps
from ..duals.stepsize import FIXED, LINE_SEARCH
from ..certificate import Certificate
from ..distributed.communicators import LOCAL

__all__ = ["Algorithm", "DualAlgorithm", "normalise_bounds"]


class Algorithm:
    """One optimisation algorithm on the SSVM: advances by chunks of block iterations.

    Attributes:
        name: solver name.
        oracle_calls: training oracle calls made so far (gap checks are not counted).
        cache_hits: iterations served by a cache instead of the oracle (BCFW with ``cache``).
        check_requested: set by :meth:`advance` when an exact gap pass is needed now; the loop runs and clears it.
        converged: set when no further progress is possible (every exact block gap is zero); the loop stops.
        whole_passes: True for batch methods, whose iteration visits every block (fractional ``max_passes`` refused).
    """

    name = "base"
    has_dual = True
    whole_passes = False
    #: the :class:`~torch_bcfw.solvers.options.OptionGroup` of this solver's own options, declared beside it
    #: (``None``: it has none)
    Options = None

    def __init__(self, model, data, lam: float, options, comm=None):
        options = self.with_own_options(options)
        self.model, self.data, self.lam, self.options = model, data, lam, options
        self.comm = LOCAL if comm is None else comm
        #: the problem's number of examples (all processes); ``data`` holds this process' ``len(data)`` of them
        self.n = self.comm.n_total if self.comm.sharded else len(data)
        self.oracle_calls = 0
        self.cache_hits = 0
        self.check_requested = False
        self.converged = False

    @classmethod
    def with_own_options(cls, options):
        """``options`` holding this solver's own (:attr:`Options`; its defaults when none are given); ``ValueError``
        for the options of another solver."""
        own = options.own
        if cls.Options is None:
            if own is not None:
                raise ValueError(f"solver {cls.name!r} has no options of its own, got {type(own).__name__}")
            return options
        if own is None:
            return dataclasses.replace(options, own=cls.Options())
        if not isinstance(own, cls.Options):
            raise ValueError(f"solver {cls.name!r} takes {cls.Options.__name__}, got {type(own).__name__}")
        return options

    @property
    def work(self) -> int:
        """Block iterations done (the unit of ``max_passes`` and of the gap-check schedule)."""
        return self.oracle_calls

    def chunk_size(self) -> int:
        """Iterations per chunk: the rest of the pass in progress (keeps the gap-check schedule of a resumed run)."""
        return self.n - self.work % self.n

    def refuse_bcfw_extras(self, bounds, refinements: bool = True) -> None:
        """Refuse (``ValueError``) gap sampling, a BCFW refinement (unless ``refinements=False``), and box constraints
        (``bounds`` or the model's ``weight_bounds``), which only BCFW / FW support."""
        if refinements and self.options.sampling == "gap":
            raise ValueError("gap sampling is a BCFW refinement (solver='bcfw')")
        if normalise_bounds(bounds, self.model) is not None:
            raise ValueError("box constraints (here the model's weight_bounds, if none were given) are supported by "
                             f"solver='bcfw' and solver='fw', not by {self.name!r}")

    def advance(self, m: int) -> None:
        """Do about ``m`` iterations worth of optimisation."""
        raise NotImplementedError

    def iterate(self) -> tuple[Tensor, float | None]:
        """The last iterate ``(w, l)`` (``l = None`` without a dual): ``dual = l - lam/2 ||w||^2``."""
        raise NotImplementedError

    def averaged(self) -> tuple[Tensor, float | None] | None:
        """The averaged iterate, or ``None`` when averaging is off."""
        return None

    def estimated_gap(self) -> float | None:
        """The heuristic duality gap (sum of the block-gap estimates), or ``None`` when the algorithm keeps none."""
        return None

    def certificate(self) -> Certificate:
        """Exact primal, dual and gap of the last iterate (one oracle pass at fixed ``w``)."""
        w, ell = self.iterate()
        return self.certify_point(w, ell)

    def averaged_dual_trusted(self) -> bool:
        """Whether the averaged pair's dual value certifies (its primal value always does)."""
        return True

    def certify_point(self, w: Tensor, ell: float | None) -> Certificate:
        """Exact primal, dual and gap of the pair ``(w, ell)`` over all examples (all processes)."""
        return self.comm.certify(self.model, self.data, w, ell, self.lam)

    def task_loss(self, w: Tensor) -> float:
        """Mean task loss of ``w``'s decoding over all training examples (all processes)."""
        return self.comm.task_loss(self.model, self.data, w)

    def on_scheduled_check(self) -> None:
        """Called before a scheduled gap check (e.g. to remove floating-point drift)."""

    def state_dict(self) -> dict:
        raise NotImplementedError

    def load_state_dict(self, sd: dict) -> None:
        raise NotImplementedError

    def load_progress(self, sd: dict) -> None:
        """Continue the progress of the run that wrote ``sd`` (a :meth:`state_dict`) on a dual state re-bound to new
        features: the sampler's generator, the iteration count and the oracle calls, not what belongs to the state."""
        if "sampler" in sd and hasattr(self, "sampler"):
            self.sampler.load_state_dict(sd["sampler"])
        if "iteration" in sd and hasattr(self, "iteration"):
            self.iteration = saved_int(sd["iteration"], "iteration", 0)
        self.oracle_calls = saved_int(sd["oracle_calls"], "oracle_calls", 0)


def normalise_bounds(bounds, model):
    """``(lower, upper)`` of the problem: ``bounds`` if given, else ``model.weight_bounds()``; ``None`` when
    there are none or every bound is infinite (then the unconstrained path, which gives the same iterates)."""
    if bounds is None:
        getter = getattr(model, "weight_bounds", None)
        bounds = getter() if getter is not None else None
    if bounds is None:
        return None
    lower, upper = bounds
    lo = None if lower is None else torch.as_tensor(lower, dtype=torch.float64)
    hi = None if upper is None else torch.as_tensor(upper, dtype=torch.float64)
    if (lo is None or bool(torch.isneginf(lo).all())) and (hi is None or bool(torch.isposinf(hi).all())):
        return None
    return lo, hi


class DualAlgorithm(Algorithm):
    """An algorithm on a model's dual state (BCFW, batch FW); ``bounds = (lower, upper)``: box constraints on the
    weights (Osokin et al. 2016, App. H), by default the model's ``weight_bounds``."""

    def __init__(self, model, data, lam: float, options, state=None, bounds=None, comm=None):
        super().__init__(model, data, lam, options, comm)
        if state is None:
            state = model.dual_state(data, lam, n_total=self.n) if self.comm.sharded else model.dual_state(data, lam)
        self.state = state
        self.step_code = LINE_SEARCH if options.step == "line_search" else FIXED
        #: run plans in the state's compiled loop when it has one (tests set False to run the generic loop)
        self.fused = True
        b = normalise_bounds(bounds, model)
        if b is not None:
            self.state.set_bounds(*b)

    def iterate(self):
        st = self.state
        if not self.comm.sharded:
            return st.w, st.dual_ell()
        return st.w, self.comm.sum_scalar(st.ell) - st.box_term()

    def certificate(self) -> Certificate:
        return self.trusted(super().certificate())

    def trusted(self, cert: Certificate) -> Certificate:
        """``cert`` with the dual value of the state's trusted part when a loaded state holds untrusted blocks
        (:meth:`~torch_bcfw.duals.base.DualState.trusted_dual`)."""
        st = self.state
        if cert.dual is None or not st.has_untrusted_blocks():
            return cert
        sharded = self.comm.sharded
        ell = self.comm.sum_scalar(st.ell) if sharded else st.ell
        dual = st.trusted_dual(ell, reduce=self.comm.sum_pair if sharded else None)
        return Certificate(cert.primal, dual, cert.primal - dual, cert.y_star)

    def averaged_dual_trusted(self) -> bool:
        return self.state.avg_trusted and not self.state.has_untrusted_blocks()

    def averaged(self):
        if not self.options.averaging:
            return None
        return self.state.averaged(reduce=self.comm.sum_pair if self.comm.sharded else None)

    def on_scheduled_check(self) -> None:
        self.state.refresh(reduce=self.comm.sum_pair if self.comm.sharded else None)

    def run_plan(self, plan):
        """``plan`` run by the state, or by the generic step loop when :attr:`fused` is off."""
        return self.state.run_plan(plan) if self.fused else generic_plan_steps(self.state, plan)
