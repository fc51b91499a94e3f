"""Lightning integration: BCFW on the structured head of a trainable backbone.

* :class:`BCFWCallback` -- every ``k`` epochs, computes the training features (any
  :class:`~torch_bcfw.data.StructuredData` container), re-binds the dual state to them, runs BCFW passes,
  writes the head's weights and logs ``ssvm/gap`` & co.;
* :func:`torch_bcfw.lightning.cli.train_main` -- ``torch-bcfw train --config ...`` (LightningCLI).

The ready-made tasks (datamodules, backbones, LightningModules) are in :mod:`torch_bcfw.tasks`.  Needs the
``lightning`` extra (``pip install torch_bcfw[lightning]``).
"""
try:
    import lightning.pytorch  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "torch_bcfw.lightning needs Lightning: pip install 'torch_bcfw[lightning]' (or pip install lightning)"
    ) from exc

from .callback import BCFWCallback, collect_features, make_dual_state

__all__ = ["BCFWCallback", "collect_features", "make_dual_state"]
