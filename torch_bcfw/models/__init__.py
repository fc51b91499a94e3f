"""Structured models: joint feature map, task loss and max oracle of one structure each."""
from .base import StructuredModel
from .chain import Chain
from .graphcut import GraphCut
from .matching import Matching
from .multiclass import Multiclass
from .pose import PoseTree
from .registry import model_from_config, model_name, register_model
from .table import TableModel

for _cls in (Chain, Multiclass, GraphCut, PoseTree, TableModel, Matching):
    register_model(_cls)
del _cls

__all__ = ["StructuredModel", "Chain", "Multiclass", "TableModel", "Matching", "GraphCut", "PoseTree", "register_model",
           "model_name", "model_from_config"]
