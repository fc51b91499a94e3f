"""Structured models: joint feature map, task loss and max oracle of one structure each."""
from ..duals import ActiveSetDualState, ChainDualState, DenseDualState, DualState, WorkingSet
from .base import StructuredModel
from .chain import Chain
from .graphcut import GraphCut
from .matching import Matching, MatchingData
from .multiclass import Multiclass
from .pose import PoseData, PoseTree
from .registry import model_from_config, model_name, register_model, registered_models
from .table import TableModel, app_c_toy

for _cls in (Chain, Multiclass, GraphCut, PoseTree, TableModel, Matching):
    register_model(_cls)
del _cls

# the dual states are re-exported here for ``from torch_bcfw.models import ChainDualState``; they live in torch_bcfw.duals
__all__ = ["StructuredModel", "Chain", "ChainDualState", "Multiclass", "DualState", "DenseDualState", "ActiveSetDualState",
           "TableModel", "app_c_toy", "Matching", "MatchingData", "WorkingSet", "GraphCut", "PoseData", "PoseTree",
           "register_model", "registered_models", "model_name", "model_from_config"]
