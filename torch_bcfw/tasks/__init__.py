"""Ready-made tasks for Lightning: datamodules, backbones and LightningModules under BCFW-solved heads.

Every LightningModule here implements the feature protocol of :class:`~torch_bcfw.lightning.BCFWCallback` and is a
``class_path`` of a ``torch-bcfw train`` config: OCR letters (:mod:`~torch_bcfw.tasks.ocr`), CoNLL-2000 chunking
(:mod:`~torch_bcfw.tasks.conll`), Weizmann horses (:mod:`~torch_bcfw.tasks.horses`) and LSP pose
(:mod:`~torch_bcfw.tasks.pose`, :mod:`~torch_bcfw.tasks.lsp_data`).  Needs the ``lightning`` extra.
"""
try:
    import lightning.pytorch  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "torch_bcfw.tasks needs Lightning: pip install 'torch_bcfw[lightning]' (or pip install lightning)"
    ) from exc
