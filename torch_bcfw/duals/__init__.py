"""Dual states of the BCFW family and their machinery: what a solver steps on, apart from the models.

* :mod:`.base` -- :class:`DualState`, the contract every state implements (block steps, averaging, gaps,
  box constraints, checkpoints, rebinding to new features); :mod:`.checks` and :mod:`.fingerprint` -- the
  checks of ``lam`` / bounds and the fingerprints saved with a state;
* :mod:`.dense` -- :class:`DenseDualState` (one dense ``w_i`` per example, any model);
  :mod:`.active_set` -- :class:`ActiveSetDualState` (dense ``w_i`` plus the labelings, re-bindable);
* :mod:`.driver` -- the compiled step driver of every plan, generic over the dual states: a state supplies the
  compiled block operations of :mod:`.block_ops` for its kernel bundle;
* :mod:`.chain` -- :class:`ChainDualState` (label marginals), its compiled block operations (:mod:`.chain_kernels`,
  given to the driver by :mod:`.chain_ops`) and its mini-batch rounds (:mod:`.chain_minibatch_kernels`);
  :mod:`.graphcut` -- ``GraphCutDualState`` (node marginals; the driver's plain plans with the graph cut's fused
  step);
* :mod:`.working_set` -- :class:`WorkingSet`, the per-block labelings (active sets, caches, MP-BCFW planes);
  :mod:`.plan` -- the :class:`StepPlan` a solver hands a state; :mod:`.stepsize` and :mod:`.sumtree` -- step
  rules and the gap sampler's sum tree shared by the Python and compiled step loops;
* :mod:`.prox` -- the prox geometries of the extragradient method (chains, matchings).

A model says which state it uses (:meth:`~torch_bcfw.models.base.StructuredModel.dual_state`); nothing here
imports a model.
"""
from .active_set import ActiveSetDualState
from .base import DualState
from .chain import ChainDualState
from .dense import DenseDualState
from .plan import PlanResult, StepPlan
from .working_set import WorkingSet

__all__ = ["DualState", "DenseDualState", "ActiveSetDualState", "ChainDualState", "WorkingSet", "StepPlan",
           "PlanResult"]
