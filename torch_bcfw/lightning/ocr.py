"""The classes of :mod:`torch_bcfw.tasks.ocr` under their ``torch_bcfw.lightning.ocr`` class paths."""
from ..tasks.ocr import LetterCNN, OCRChainCNN, OCRWordsDataModule, pack_words

__all__ = ["LetterCNN", "OCRChainCNN", "OCRWordsDataModule", "pack_words"]
