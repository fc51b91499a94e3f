"""Lightning integration: BCFW on the structured head of a trainable backbone.

* :class:`BCFWCallback` -- every ``k`` epochs, computes the training features, re-binds the dual
  state to them, runs BCFW passes, writes the head's weights and logs ``ssvm/gap`` & co.;
* :mod:`torch_bcfw.lightning.ocr` -- the OCR letter CNN (datamodule and LightningModule) of
  ``examples/ocr_cnn_lightning.py`` and ``configs/ocr_cnn.yaml``;
* :mod:`torch_bcfw.lightning.conll` -- word, POS and character embeddings with a BiLSTM / CNN encoder on
  CoNLL-2000 chunking (datamodule, vocabulary and LightningModule) of
  ``examples/conll_embeddings_lightning.py`` and ``configs/conll_embeddings.yaml``;
* :func:`torch_bcfw.lightning.cli.train_main` -- ``torch-bcfw train --config ...`` (LightningCLI).

Needs the ``lightning`` extra (``pip install torch_bcfw[lightning]``).
"""
try:
    import lightning.pytorch  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "torch_bcfw.lightning needs Lightning: pip install 'torch_bcfw[lightning]' (or pip install lightning)"
    ) from exc

from .callback import BCFWCallback, collect_features, make_dual_state

__all__ = ["BCFWCallback", "collect_features", "make_dual_state"]
