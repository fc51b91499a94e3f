"""Structured models: joint feature map, task loss and max oracle of one structure each."""
from .base import StructuredModel
from .chain import Chain, ChainDualState
from .dual import ActiveSetDualState, DenseDualState, DualState
from .graphcut import GraphCut
from .multiclass import Multiclass
from .pose import PoseData, PoseTree
from .table import TableModel, app_c_toy
from .working_set import WorkingSet

__all__ = ["StructuredModel", "Chain", "ChainDualState", "Multiclass", "DualState", "DenseDualState", "ActiveSetDualState",
           "TableModel", "app_c_toy", "WorkingSet", "GraphCut", "PoseData", "PoseTree"]
