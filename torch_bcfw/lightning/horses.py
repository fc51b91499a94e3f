"""The classes of :mod:`torch_bcfw.tasks.horses` under their ``torch_bcfw.lightning.horses`` class paths
(``GraphBCFWCallback`` is :class:`~torch_bcfw.lightning.BCFWCallback`)."""
from ..metrics.segmentation import segmentation_counts
from ..tasks.horses import GraphCutHead, HorseSegmenter, HorsesDataModule, SegmentationFCN
from .callback import BCFWCallback as GraphBCFWCallback

__all__ = ["GraphBCFWCallback", "GraphCutHead", "HorseSegmenter", "HorsesDataModule", "SegmentationFCN",
           "segmentation_counts"]
