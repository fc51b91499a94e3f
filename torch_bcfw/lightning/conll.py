"""The classes of :mod:`torch_bcfw.tasks.conll` under their ``torch_bcfw.lightning.conll`` class paths."""
from ..tasks.conll import (
    ENCODERS,
    ChunkBatch,
    ConllChainTagger,
    ConllChunkingDataModule,
    ConllVocab,
    TokenEncoder,
    pack_sentences,
)

__all__ = ["ENCODERS", "ChunkBatch", "ConllChainTagger", "ConllChunkingDataModule", "ConllVocab", "TokenEncoder",
           "pack_sentences"]
