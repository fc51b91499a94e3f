"""Weizmann Horse Database (Borenstein & Ullman) for binary figure/ground segmentation.

Expected layout under ``root`` (as distributed by the authors)::

    root/rgb/horse001.jpg ... horse328.jpg            colour images, original resolution
    root/gray/horse001.jpg ... horse328.jpg           grey images, same size as the masks
    root/figure_ground/horse001.jpg ... horse328.jpg  grey-level masks (JPEG)

Preprocessing (fixed so that results are comparable): masks are thresholded at the native resolution (foreground
iff grey value > 127); the image (rgb or gray) is resized directly to the working resolution (computed from the
mask size) with bilinear interpolation, stretching it onto the mask's frame; the binary mask is resized with box
averaging and re-thresholded at 1/2.

Split (no official one exists; fixed here): images 1-200 train, 201-228 validation (``"val"``), 229-328 test.

Requires Pillow (``pip install torch_bcfw[graphcut]``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

NUM_IMAGES = 328
SPLITS = {
    "train": range(1, 201),
    "val": range(201, 229),
    "test": range(229, NUM_IMAGES + 1),
    "all": range(1, NUM_IMAGES + 1),
}
"""1-based image numbers of each split."""

_DOWNLOAD_HINT = (
    "The Weizmann Horse Database must be downloaded from its authors' page "
    "(Borenstein & Ullman, Weizmann Institute) and unpacked so that ROOT/rgb, ROOT/gray and "
    "ROOT/figure_ground hold horse001.jpg ... horse328.jpg."
)


@dataclass
class HorseImage:
    """One image: ``name`` (file stem, e.g. ``"horse001"``), ``image`` float ``Tensor[C, H, W]`` in ``[0, 1]``
    (``C = 3`` rgb or ``1`` gray), ``mask`` ``LongTensor[H, W]`` (1 = horse)."""

    name: str
    image: Tensor
    mask: Tensor


def split_numbers(split: str) -> range:
    """1-based image numbers of ``split`` (``"train"``, ``"val"``, ``"test"`` or ``"all"``)."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {sorted(SPLITS)}, got {split!r}")
    return SPLITS[split]


def working_size(mask_size: tuple[int, int], size: tuple[int, int] | None = None,
                 max_side: int | None = None) -> tuple[int, int]:
    """Working resolution ``(H, W)`` of an image whose mask is ``mask_size = (H0, W0)``: ``size`` (fixed, aspect
    ratio not kept), or the aspect-preserving rescale with longest side ``max_side`` (sides rounded, >= 1), or
    ``mask_size`` when neither is given (at most one may be)."""
    if size is not None and max_side is not None:
        raise ValueError("give at most one of size and max_side")
    if size is not None:
        if len(size) != 2 or min(size) < 1:
            raise ValueError(f"size must be (height, width) with positive entries, got {size}")
        return int(size[0]), int(size[1])
    if max_side is not None:
        if max_side < 1:
            raise ValueError(f"max_side must be >= 1, got {max_side}")
        scale = max_side / max(mask_size)
        return max(1, round(mask_size[0] * scale)), max(1, round(mask_size[1] * scale))
    return mask_size


def _check_root(root: Path, color: str) -> tuple[Path, Path]:
    """Return the image and mask folders, or raise FileNotFoundError saying where we looked."""
    if color not in ("rgb", "gray"):
        raise ValueError(f"color must be 'rgb' or 'gray', got {color!r}")
    image_dir, mask_dir = root / color, root / "figure_ground"
    for folder in (image_dir, mask_dir):
        if not folder.is_dir():
            raise FileNotFoundError(f"Weizmann horses: folder {folder} not found (looked under root={root}). "
                                    + _DOWNLOAD_HINT)
    return image_dir, mask_dir


def _load_one(image_path: Path, mask_path: Path, color: str, size: tuple[int, int] | None,
              max_side: int | None) -> HorseImage:
    """Read, threshold and resize one image/mask pair (see the module docstring)."""
    try:
        from PIL import Image
    except ImportError as err:
        raise ImportError("Loading the Weizmann horses needs Pillow: pip install torch_bcfw[graphcut]") from err
    for path in (image_path, mask_path):
        if not path.is_file():
            raise FileNotFoundError(f"Weizmann horses: file {path} not found. " + _DOWNLOAD_HINT)
    with Image.open(mask_path) as mask_file:
        mask = np.asarray(mask_file.convert("L")) > 127
    height, width = working_size(mask.shape, size, max_side)
    if (height, width) != mask.shape:
        binary = Image.fromarray(mask.astype(np.uint8) * 255)
        mask = np.asarray(binary.resize((width, height), Image.BOX)) >= 128
    with Image.open(image_path) as image_file:
        pixels = image_file.convert("RGB" if color == "rgb" else "L")
        if pixels.size != (width, height):
            pixels = pixels.resize((width, height), Image.BILINEAR)
        array = np.asarray(pixels, dtype=np.float32) / 255.0
    image = torch.from_numpy(array.reshape(height, width, -1)).permute(2, 0, 1).contiguous()
    return HorseImage(mask_path.stem, image, torch.from_numpy(mask.astype(np.int64)))


def load_weizmann_horses(root: str | Path, size: tuple[int, int] | None = None, max_side: int | None = None,
                         split: str = "train", color: str = "rgb") -> list[HorseImage]:
    """Load one split of the Weizmann Horse Database as :class:`HorseImage` s in file order.

    Args:
        root: folder holding ``rgb/``, ``gray/`` and ``figure_ground/``.
        size: fixed working resolution ``(H, W)`` for every image.
        max_side: aspect-preserving working resolution with longest side ``max_side``.
            Give at most one of ``size`` / ``max_side``; with neither, images keep their native
            mask resolution (112-508 x 195-560, differing between images).
        split: ``"train"`` (1-200), ``"val"`` (201-228), ``"test"`` (229-328) or ``"all"``.
        color: ``"rgb"`` (3 channels) or ``"gray"`` (1 channel).

    Raises ``FileNotFoundError`` when ``root`` or one of its folders/files is missing.
    """
    numbers = split_numbers(split)
    image_dir, mask_dir = _check_root(Path(root), color)
    working_size((1, 1), size, max_side)  # validate the resolution options before any I/O
    names = [f"horse{k:03d}.jpg" for k in numbers]
    return [_load_one(image_dir / n, mask_dir / n, color, size, max_side) for n in names]


def pixel_features(images: Tensor) -> Tensor:
    """Hand-made per-pixel features of ``images [B, C, H, W]`` in ``[0, 1]`` for a graph-cut model without a CNN:
    ``[B, 2C + 5, H, W]`` float64 -- the colour, its 5 x 5 box-smoothed colour, the position ``(y, x)`` in
    ``[-1, 1]`` and its squares, and a constant 1 (the unary bias)."""
    if images.dim() != 4:
        raise ValueError(f"images must be [B, C, H, W], got {tuple(images.shape)}")
    images = images.to(torch.float64)
    B, _, H, W = images.shape
    ys = torch.linspace(-1, 1, H, dtype=torch.float64, device=images.device)[:, None].expand(H, W)
    xs = torch.linspace(-1, 1, W, dtype=torch.float64, device=images.device)[None, :].expand(H, W)
    coords = torch.stack([ys, xs, ys**2, xs**2]).expand(B, 4, H, W)
    smooth = torch.nn.functional.avg_pool2d(images, 5, stride=1, padding=2, count_include_pad=False)
    return torch.cat([images, smooth, coords, images.new_ones(B, 1, H, W)], 1)


def horse_graph_data(root: str | Path, split: str = "train", size: tuple[int, int] = (48, 64),
                     contrast: bool = True):
    """One split as a :class:`~torch_bcfw.data.graphs.GraphData` on the 4-connected pixel grid.

    Node features: :func:`pixel_features` (``F = 11`` for rgb); edge features ``[1, exp(-beta ||I_p - I_q||^2)]``
    (``contrast=False``: ``[1]``); labels: the masks.  All images share one working resolution ``size``
    ``(H, W)`` (default 48 x 64, the resolution of the horses benchmark and demo).
    """
    from ..data.graphs import grid_graph_data

    horses = load_weizmann_horses(root, size=tuple(size), split=split)
    images = torch.stack([h.image for h in horses])
    masks = torch.stack([h.mask for h in horses])
    return grid_graph_data(pixel_features(images), images.to(torch.float64), masks, contrast=contrast)
