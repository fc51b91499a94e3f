"""Structured models: joint feature map, task loss and max oracle of one structure each."""
from .base import StructuredModel
from .chain import Chain, ChainDualState
from .dual import ActiveSetDualState, DenseDualState, DualState
from .multiclass import Multiclass

__all__ = ["StructuredModel", "Chain", "ChainDualState", "Multiclass", "DualState", "DenseDualState", "ActiveSetDualState"]
