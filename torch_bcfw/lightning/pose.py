"""The classes of :mod:`torch_bcfw.tasks.pose` under their ``torch_bcfw.lightning.pose`` class paths
(``PoseBCFWCallback`` is :class:`~torch_bcfw.lightning.BCFWCallback`)."""
from ..metrics.pck import compare_pck
from ..tasks.pose import (
    CrossFittedCNN,
    HeatmapCNN,
    PoseHead,
    PoseTreeCNN,
    argmax_positions,
    log_heatmaps,
    log_maps,
    soft_targets,
)
from .callback import BCFWCallback as PoseBCFWCallback

__all__ = ["CrossFittedCNN", "HeatmapCNN", "PoseBCFWCallback", "PoseHead", "PoseTreeCNN", "argmax_positions",
           "compare_pck", "log_heatmaps", "log_maps", "soft_targets"]
