"""Lightning integration: :class:`BCFWCallback` solves the structured head of a trainable backbone with BCFW, and
:func:`torch_bcfw.lightning.cli.train_main` runs ``torch-bcfw train --config ...`` (LightningCLI).  The ready-made
tasks are in :mod:`torch_bcfw.tasks`.  Needs the ``lightning`` extra (``pip install torch_bcfw[lightning]``).
"""
try:
    import lightning.pytorch  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "torch_bcfw.lightning needs Lightning: pip install 'torch_bcfw[lightning]' (or pip install lightning)"
    ) from exc

from .callback import BCFWCallback, collect_features
from .lam_choice import LamChoice, lam_grid
from .sampler import SeededShuffle

__all__ = ["BCFWCallback", "LamChoice", "SeededShuffle", "collect_features", "lam_grid"]
