"""torch_bcfw: structured SVMs trained by Block-Coordinate Frank-Wolfe with a certified duality gap.

Objective (as in the BCFW papers)::

    min_w  lam/2 ||w||^2 + 1/n sum_i max_y [ L_i(y) - <w, phi(x_i, y_i) - phi(x_i, y)> ]

Entry points: :func:`fit`, the models in :mod:`torch_bcfw.models`, the data containers
:class:`SequenceData` / :class:`MulticlassData` / :class:`GraphData` / :class:`PoseData` / :class:`MatchingData`
(all following the :class:`StructuredData` protocol), and the ``torch-bcfw`` command line.
"""
import os as _os

# numba's parallel loops and torch's intra-op threads share one OpenMP runtime, whose default busy-waiting spins
# for milliseconds at every switch (a 10x slower gap pass on OCR); effective only when imported before torch.
_os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from .runtime import launch as _launch  # noqa: E402 - Ctrl-C while the torch-bcfw command loads: exit 130

_launch.exit_on_interrupt_while_loading()

from .runtime import kernel_cache as _kernel_cache  # noqa: E402 - before any kernel is defined

_kernel_cache.install()

from .convert import lam_from_pystruct_C, lam_from_svmstruct_C, pystruct_C_from_lam, svmstruct_C_from_lam
from .checkpoint import Checkpoint
from .cross_validation import CrossValidationInterrupted, FoldFit, cross_validate
from .data import GraphData, MatchingData, MulticlassData, PoseData, SequenceData, StructuredData
from .fit import FitResult, fit
from .estimator import SSVM
from .models import Chain, GraphCut, Matching, Multiclass, PoseTree, StructuredModel, register_model
from .solvers.options import SolverOptions
from .solvers.record import CheckRecord

__version__ = "0.1.0"

__all__ = [
    "fit", "FitResult", "CheckRecord", "SSVM", "Checkpoint", "cross_validate", "FoldFit", "CrossValidationInterrupted", "SolverOptions", "StructuredData", "SequenceData", "MulticlassData", "GraphData", "PoseData", "MatchingData", "Chain",
    "Multiclass", "GraphCut", "PoseTree", "Matching",
    "StructuredModel", "register_model", "lam_from_pystruct_C", "pystruct_C_from_lam", "lam_from_svmstruct_C",
    "svmstruct_C_from_lam",
]
