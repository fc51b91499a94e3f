"""Dual states of the BCFW family and their machinery: what a solver steps on, apart from the models.

* :mod:`.base` -- :class:`DualState`, the contract every state implements; :mod:`.plan` -- the :class:`StepPlan` a
  solver hands a state and the generic loops; :mod:`.stepsize`, :mod:`.sumtree`, :mod:`.working_set` -- the step
  rules, the gap sampler's sum tree and the per-block labelings, shared by the generic and compiled loops;
* the states: :mod:`.dense`, :mod:`.active_set`, :mod:`.multiclass`, :mod:`.chain` (with :mod:`.chain_kernels`,
  :mod:`.chain_driver`, :mod:`.chain_rounds`) and :mod:`.graphcut`; :mod:`.prox` -- the extragradient's geometries;
  :mod:`.subgradient` (with :mod:`.chain_subgradient`) -- the SSG baseline's state, which has no dual variables.

A model says which state it uses (:meth:`~torch_bcfw.models.base.StructuredModel.dual_state`); nothing here imports
a model.  How a step runs and what a new state implements: ``docs/anatomy.md``.
"""
from .active_set import ActiveSetDualState
from .base import DualState
from .chain import ChainDualState
from .dense import DenseDualState
from .plan import PlanResult, StepPlan
from .working_set import WorkingSet

__all__ = ["DualState", "DenseDualState", "ActiveSetDualState", "ChainDualState", "WorkingSet", "StepPlan",
           "PlanResult"]
