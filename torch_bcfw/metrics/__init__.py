"""Evaluation metrics (chunk F1, ...)."""
