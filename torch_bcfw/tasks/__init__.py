"""Ready-made tasks for Lightning: datamodules, backbones and LightningModules under BCFW-solved heads.

Every LightningModule here implements the feature protocol of :class:`~torch_bcfw.lightning.BCFWCallback`
(``bcfw_dataloader`` / ``bcfw_features``) and is a ``class_path`` of a ``torch-bcfw train`` config:

* :mod:`torch_bcfw.tasks.ocr` -- OCR letters, a CNN under a chain head (``configs/ocr_cnn.yaml``);
* :mod:`torch_bcfw.tasks.conll` -- CoNLL-2000 chunking, word / POS / character embeddings and a BiLSTM or CNN
  encoder under a chain head (``configs/conll_embeddings.yaml``);
* :mod:`torch_bcfw.tasks.horses` -- Weizmann horses, an FCN under unary and graph-cut heads (``configs/horses.yaml``);
* :mod:`torch_bcfw.tasks.pose` and :mod:`torch_bcfw.tasks.lsp_data` -- LSP pose, heatmap CNNs under a
  pictorial-structures tree head (``configs/pose_lsp.yaml``);
* :mod:`torch_bcfw.tasks.eval_hooks` -- the validation / test hooks these modules share.

Their metrics live in :mod:`torch_bcfw.metrics`.  Needs the ``lightning`` extra (``pip install torch_bcfw[lightning]``).
"""
try:
    import lightning.pytorch  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "torch_bcfw.tasks needs Lightning: pip install 'torch_bcfw[lightning]' (or pip install lightning)"
    ) from exc
