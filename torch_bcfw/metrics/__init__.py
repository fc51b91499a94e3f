"""Task metrics, one module per kind of task.

* :mod:`torch_bcfw.metrics.chunking` -- chunk precision, recall and F1 (conlleval);
* :mod:`torch_bcfw.metrics.alignment` -- alignment error rate, precision and recall with sure / possible links;
* :mod:`torch_bcfw.metrics.segmentation` -- pixel accuracy and foreground IoU of binary segmentations;
* :mod:`torch_bcfw.metrics.pck` -- PCK of human pose, with a paired image-bootstrap interval of differences.

Which metric a dataset reports in ``torch-bcfw fit`` is in :mod:`torch_bcfw.datasets.task_metrics`.
"""
from .alignment import AlignmentScores, alignment_scores, alignment_scores_from_labelings

__all__ = ["AlignmentScores", "alignment_scores", "alignment_scores_from_labelings"]
