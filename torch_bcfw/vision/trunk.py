"""A pretrained backbone under the vision heads: features cached once, the later blocks and a decoder trained.

Any ``nn.Module`` mapping images ``[B, 3, H, W]`` in ``[0, 1]`` to a feature map ``[B, C, h, w]`` or a list of
maps (finest first) is a backbone; it stays frozen (the "linear probe").  A :class:`SplittableBackbone` (as
:class:`~torch_bcfw.vision.efficientnet.EfficientNetLite0`) is also split at a block ``train_from``: its earlier
blocks are frozen and cached, the later ones trained.  :func:`cache_features` runs the frozen part once per image
(and per mirrored image, for flip augmentation and test-time flipping) and keeps the output in float16;
:class:`PretrainedTrunk` is what is trained on top: the backbone's remaining blocks and a :class:`FeatureDecoder`
that fuses the maps into a dense output.
"""
from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Protocol, runtime_checkable

import torch
from safetensors.torch import load_file, save
from torch import Tensor, nn
from torch.nn import functional as F

from ..io.serialization import atomic_write_stream

__all__ = ["FeatureDecoder", "PretrainedTrunk", "SplittableBackbone", "cache_features", "feature_channels",
           "frozen_part", "stored_features"]


@runtime_checkable
class SplittableBackbone(Protocol):
    """A backbone that splits at a block ``b`` into a frozen part (cached) and a trained part.

    ``blocks_until(images, b)``: the frozen part's outputs, a list of maps whose last one is the input of block
    ``b`` (the earlier ones: maps tapped before it, passed through to the decoder); ``forward(x, start=b)``: the
    maps of blocks ``>= b`` from that input; ``parameters_from(b)``: the parameters of blocks ``>= b`` (the
    others stay frozen).  ``blocks_until(images, b)[:-1] + forward(blocks_until(images, b)[-1], start=b)`` equals
    ``forward(images)``.
    """

    def blocks_until(self, images: Tensor, stop: int) -> list[Tensor]: ...

    def forward(self, x: Tensor, start: int = 0) -> list[Tensor]: ...

    def parameters_from(self, start: int) -> Iterator[nn.Parameter]: ...


def _splittable(backbone: nn.Module) -> SplittableBackbone:
    if not isinstance(backbone, SplittableBackbone):
        raise TypeError(f"train_from needs a SplittableBackbone (blocks_until, forward(x, start=), parameters_from); "
                        f"{type(backbone).__name__} is not one: give train_from=None to keep it frozen")
    return backbone


def _as_maps(out) -> list[Tensor]:
    maps = [out] if isinstance(out, Tensor) else list(out)
    if not maps or any(not isinstance(m, Tensor) or m.dim() != 4 for m in maps):
        raise TypeError("a backbone must return a [B, C, h, w] feature map or a list of them")
    return maps


def frozen_part(backbone: nn.Module, images: Tensor, train_from: int | None) -> list[Tensor]:
    """The inputs of the trained part for float images ``[B, 3, H, W]`` in ``[0, 1]``: the taps before the split
    and the activation at it (or, with ``train_from=None``, every map of the frozen backbone), as
    :func:`cache_features` stores them (but in the images' dtype, with gradient unless under ``no_grad``)."""
    if train_from is None:
        return _as_maps(backbone(images))
    return _splittable(backbone).blocks_until(images, train_from)


@torch.no_grad()
def cache_features(backbone: nn.Module, images: Tensor, train_from: int | None = None, batch_size: int = 16,
                   device: str | torch.device = "cpu", flip: bool = False,
                   log: Callable[[str], None] | None = None) -> list[Tensor]:
    """The frozen part's outputs for ``images`` (uint8 or float in ``[0, 1]``, ``[N, 3, H, W]``; mirrored first if
    ``flip``): a list of float16 CPU tensors ``[N, C_k, h_k, w_k]``.

    ``train_from``: with a :class:`SplittableBackbone`, blocks ``< train_from`` are frozen and cached (the taps
    before the split and the activation at it); ``None``: the whole backbone is frozen and its maps cached.
    ``log``: called with a progress line about every tenth of the images.
    """
    backbone = backbone.to(device).eval()
    out: list[list[Tensor]] = []
    step = max(len(images) // 10, 1)
    for start in range(0, len(images), batch_size):
        x = images[start : start + batch_size].to(device)
        x = x.float() / 255.0 if x.dtype == torch.uint8 else x.float()
        if flip:
            x = x.flip(-1)
        out.append([m.to("cpu", torch.float16) for m in frozen_part(backbone, x, train_from)])
        done = min(start + batch_size, len(images))
        if log is not None and done // step > start // step:
            log(f"features of {done} / {len(images)} images")
    return [torch.cat(parts) for parts in zip(*out)]


def stored_features(folder: str | Path | None, name: str, backbone: nn.Module, images: Tensor,
                    train_from: int | None = None, device: str | torch.device = "cpu", flip: bool = False,
                    log: Callable[[str], None] | None = None) -> list[Tensor]:
    """:func:`cache_features`, kept in ``folder`` (``None``: not kept) as a safetensors file (keys ``map0`` ..
    ``mapK``, float16) under a name that holds ``name``, the backbone's class and a fingerprint of its weights and
    of ``images``, the split and ``flip``: a rerun reads the file instead of running the backbone again."""
    if folder is None:
        return cache_features(backbone, images, train_from, device=device, flip=flip, log=log)
    h = hashlib.sha1()
    for p in backbone.parameters():
        h.update(p.detach().flatten()[:256].cpu().to(torch.float32).numpy().tobytes())
    h.update(images[:, :, ::7, ::7].contiguous().cpu().numpy().tobytes())
    h.update(repr((tuple(images.shape), train_from, flip)).encode())
    path = Path(folder) / f"features_{name}_{type(backbone).__name__}_{h.hexdigest()[:16]}.safetensors"
    if path.is_file():
        maps = load_file(path)
        return [maps[f"map{k}"] for k in range(len(maps))]
    feats = cache_features(backbone, images, train_from, device=device, flip=flip, log=log)
    data = save({f"map{k}": m.contiguous() for k, m in enumerate(feats)})
    atomic_write_stream(path, lambda f: f.write(data))
    return feats


def feature_channels(backbone: nn.Module, image_size: tuple[int, int] = (64, 64)) -> list[int]:
    """Channels of every map the backbone returns (one forward pass of a blank image)."""
    with torch.no_grad():
        p = next(backbone.parameters())
        return [m.shape[1] for m in _as_maps(backbone.eval()(torch.zeros(1, 3, *image_size, device=p.device,
                                                                         dtype=p.dtype)))]


class FeatureDecoder(nn.Module):
    """Maps ``[B, C_k, h_k, w_k]`` (finest first) -> ``[B, out_channels, H, W]``: every map projected by a 1x1
    convolution to ``width`` channels and upsampled (bilinear) to the finest map, summed, two ``kernel`` x
    ``kernel`` convolution blocks (BatchNorm, ReLU; ``kernel = 1``: each output cell sees only its own input cell,
    the receptive field stays the backbone's), a 1x1 output, then bilinear upsampling to the requested ``(H, W)``."""

    def __init__(self, in_channels: list[int], out_channels: int, width: int = 128, kernel: int = 3):
        super().__init__()
        if kernel < 1 or kernel % 2 == 0:
            raise ValueError(f"kernel must be odd and >= 1, got {kernel}")
        self.lateral = nn.ModuleList(nn.Conv2d(c, width, 1) for c in in_channels)
        pad = kernel // 2
        self.body = nn.Sequential(
            nn.BatchNorm2d(width), nn.ReLU(inplace=True),
            nn.Conv2d(width, width, kernel, padding=pad, bias=False), nn.BatchNorm2d(width), nn.ReLU(inplace=True),
            nn.Conv2d(width, width, kernel, padding=pad, bias=False), nn.BatchNorm2d(width), nn.ReLU(inplace=True))
        self.out = nn.Conv2d(width, out_channels, 1)

    def forward(self, maps: list[Tensor], size: tuple[int, int]) -> Tensor:
        if len(maps) != len(self.lateral):
            raise ValueError(f"the decoder takes {len(self.lateral)} maps, got {len(maps)}")
        h = self.lateral[0](maps[0])
        for lat, m in zip(self.lateral[1:], maps[1:]):
            h = h + F.interpolate(lat(m), size=h.shape[-2:], mode="bilinear", align_corners=False)
        y = self.out(self.body(h))
        return y if tuple(y.shape[-2:]) == tuple(size) else F.interpolate(y, size=size, mode="bilinear",
                                                                           align_corners=False)


class PretrainedTrunk(nn.Module):
    """The trained part: ``cached`` maps (of :func:`cache_features`) -> ``[B, out_channels, H, W]``.

    Args:
        backbone: the backbone whose outputs were cached.
        out_channels: the decoder's outputs (heatmaps, features per pixel...).
        train_from: the split of :func:`cache_features` (the :class:`SplittableBackbone`'s
            ``parameters_from(train_from)`` are trained here; their BatchNorm statistics stay frozen); ``None``:
            the backbone is frozen entirely.
        width: the decoder's width.
        kernel: the size of the decoder's two hidden convolutions (3; 1: a per-cell decoder).
    """

    def __init__(self, backbone: nn.Module, out_channels: int, train_from: int | None = None, width: int = 128,
                 image_size: tuple[int, int] = (64, 64), kernel: int = 3):
        super().__init__()
        self.train_from = train_from
        self.backbone = backbone if train_from is not None else None
        if train_from is not None:
            _splittable(backbone).requires_grad_(False)
            for p in backbone.parameters_from(train_from):
                p.requires_grad_(True)
        self.decoder = FeatureDecoder(feature_channels(backbone, image_size), out_channels, width, kernel)

    def train(self, mode: bool = True):
        super().train(mode)
        if self.backbone is not None:
            self.backbone.eval()  # frozen BatchNorm statistics (small batches on a CPU)
        return self

    def forward(self, cached: list[Tensor], size: tuple[int, int]) -> Tensor:
        cached = [c.float() for c in cached]
        if self.backbone is None:
            return self.decoder(cached, size)
        *early, x = cached
        return self.decoder(early + self.backbone(x, start=self.train_from), size)
