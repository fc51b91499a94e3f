"""Image backbones under the structured heads, without Lightning: :mod:`~torch_bcfw.vision.efficientnet` (an
ImageNet EfficientNet-Lite0) and :mod:`~torch_bcfw.vision.trunk` (the :class:`SplittableBackbone` protocol, cached
features, the trained decoder) and :mod:`~torch_bcfw.vision.augment` (random similarity warps of frames and their
keypoints)."""
from .augment import random_similarity
from .efficientnet import EfficientNetLite0, efficientnet_lite0
from .trunk import (
           FeatureDecoder,
           PretrainedTrunk,
           SplittableBackbone,
           cache_features,
           frozen_part,
           stored_features,
)

__all__ = ["EfficientNetLite0", "FeatureDecoder", "PretrainedTrunk", "SplittableBackbone", "cache_features",
           "efficientnet_lite0", "frozen_part", "random_similarity", "stored_features"]
