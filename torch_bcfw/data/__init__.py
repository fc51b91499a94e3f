"""The data containers: every one implements :class:`~torch_bcfw.data.base.StructuredData`, so code that only
moves, splits and joins data serves every model.

* :class:`MulticlassData` -- one feature vector and one label per example (:mod:`torch_bcfw.data.sequences`);
* :class:`SequenceData` -- variable-length sequences, packed, with dense or :class:`SparseFeatures` token features;
* :class:`GraphData` -- graphs of nodes and edges (:mod:`torch_bcfw.data.graphs`);
* :class:`PoseData` -- images of candidate part positions (:mod:`torch_bcfw.data.poses`);
* :class:`MatchingData` -- sentence pairs of candidate links (:mod:`torch_bcfw.data.matching`).

:mod:`torch_bcfw.data.base` holds the protocol and the helpers that select, pack and join examples.
"""
from .base import StructuredData, as_index, cat_field, cat_offsets, check_cat_parts, counts_to_offsets, segment_rows
from .graphs import GraphData, edge_features, grid_edges, grid_graph_data
from .matching import MatchingData
from .poses import PoseData
from .sequences import MulticlassData, SequenceData, SparseFeatures

__all__ = ["GraphData", "MatchingData", "MulticlassData", "PoseData", "SequenceData", "SparseFeatures",
           "StructuredData", "as_index", "cat_field", "cat_offsets", "check_cat_parts", "counts_to_offsets",
           "edge_features", "grid_edges", "grid_graph_data", "segment_rows"]
