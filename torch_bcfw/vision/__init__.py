"""Image backbones under the structured heads, without Lightning: :mod:`~torch_bcfw.vision.efficientnet` (an
ImageNet EfficientNet-Lite0) and :mod:`~torch_bcfw.vision.trunk` (the :class:`SplittableBackbone` protocol, cached
features, the trained decoder)."""
from .efficientnet import EfficientNetLite0, efficientnet_lite0
from .trunk import FeatureDecoder, PretrainedTrunk, SplittableBackbone, cache_features, stored_features

__all__ = ["EfficientNetLite0", "FeatureDecoder", "PretrainedTrunk", "SplittableBackbone", "cache_features",
           "efficientnet_lite0", "stored_features"]
