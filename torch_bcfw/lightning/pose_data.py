"""The classes of :mod:`torch_bcfw.tasks.lsp_data` under their ``torch_bcfw.lightning.pose_data`` class paths."""
from ..tasks.lsp_data import FLIP_PERMUTATION, LSPPoseDataModule, PoseTensors, augment_batch

__all__ = ["FLIP_PERMUTATION", "LSPPoseDataModule", "PoseTensors", "augment_batch"]
