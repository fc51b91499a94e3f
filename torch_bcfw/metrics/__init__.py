"""Evaluation metrics (chunk F1, alignment error rate, ...)."""
from .alignment import AlignmentScores, alignment_scores, alignment_scores_from_labelings

__all__ = ["AlignmentScores", "alignment_scores", "alignment_scores_from_labelings"]
