"""Dual states of the BCFW family and their machinery: what a solver steps on, apart from the models.

How a step runs, layer by layer, and exactly what a new dual state implements (torch path and compiled path):
``docs/anatomy.md``.

* :mod:`.base` -- :class:`DualState`, the contract every state implements (block steps, averaging, gaps, box
  constraints, checkpoints, rebinding to new features, running a :class:`StepPlan`); :mod:`.fingerprint` -- the
  fingerprints saved with a state;
* :mod:`.plan` -- the :class:`StepPlan` a solver hands a state, the generic step loop and the one round loop;
  :mod:`.stepsize`, :mod:`.sumtree` and :mod:`.working_set` -- the step rules, the gap sampler's sum tree and the
  per-block labelings (active sets, caches, MP-BCFW planes), shared by the generic and the compiled loops;
* :mod:`.dense` -- :class:`DenseDualState` (one dense ``w_i`` per example, any model);
  :mod:`.active_set` -- :class:`ActiveSetDualState` (dense ``w_i`` plus the labelings, re-bindable);
* :mod:`.chain` -- :class:`ChainDualState` (label marginals) with its compiled block operations
  (:mod:`.chain_kernels`), its compiled step loop (:mod:`.chain_driver`) and mini-batch rounds
  (:mod:`.chain_rounds`); :mod:`.graphcut` -- ``GraphCutDualState`` (node marginals, its own compiled loop of plain
  steps);
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
