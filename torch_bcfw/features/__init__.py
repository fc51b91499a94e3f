"""Feature extraction for structured models."""

from torch_bcfw.features.chunking import (
    BOS, EOS, NUM_TEMPLATES, PAD_ID, TEMPLATE_NAMES, TEMPLATES, AttributeVocabulary, pad_attribute_ids,
    token_attributes,
)

__all__ = ["BOS", "EOS", "NUM_TEMPLATES", "PAD_ID", "TEMPLATES", "TEMPLATE_NAMES", "AttributeVocabulary",
           "pad_attribute_ids", "token_attributes"]
