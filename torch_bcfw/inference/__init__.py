"""Decoders (max-product / max-sum inference) used by the models' oracles."""
from .viterbi import viterbi_numba, viterbi_packed

__all__ = ["viterbi_packed", "viterbi_numba"]
