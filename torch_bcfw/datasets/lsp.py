"""Leeds Sports Pose Extended (LSPET; Johnson & Everingham, CVPR 2011) for human pose.

Layout of ``root`` (:func:`load_lsp_extended`): ``joints.mat`` (``joints`` float ``[14, 3, 10000]``: x, y,
visibility) and ``images/im00001.jpg`` ...; from http://sam.johnson.io/research/lspet.html (``lspet_dataset.zip``).
Joints follow ``torch_bcfw.inference.tree.LSP_JOINTS``.

Visibility: in LSPET **1 means annotated and 0 not** (joints flagged 0 have junk coordinates; the original LSP uses
the opposite convention).  Unannotated joints get ``visible`` False and NaN coordinates; visible annotations
outside their image are clamped onto its border.

Split (LSPET has no official test split): images 1-1500 are ``"train"``, 1501-2000 ``"test"``, ``"all"`` 1-2000.

Each image is resized, keeping its aspect ratio, so that its longer side is ``S`` (bilinear) and pasted at the
centre of a black ``S x S`` canvas.  MATLAB pixel coordinates become continuous coordinates of the frame,
``x_new = (x - 0.5) * w / W + pad_x`` (the same for y).  Requires scipy and Pillow (``pip install torch_bcfw[pose]``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

__all__ = ["FLIP_PERMUTATION", "NUM_JOINTS", "LSPSample", "frame_to_original", "grid_to_joints", "joints_to_grid",
           "letterbox_geometry", "load_lsp_extended", "lsp_split_ids", "mirror_cells", "mirror_joints",
           "reference_torso", "torso_size", "torso_with_fallback"]

NUM_JOINTS = 14
#: joint order after a horizontal flip (left and right swap): LSP_JOINTS[FLIP_PERMUTATION[j]] mirrors joint j
FLIP_PERMUTATION = (5, 4, 3, 2, 1, 0, 11, 10, 9, 8, 7, 6, 12, 13)


def mirror_joints(joints: Tensor, visible: Tensor, size: int) -> tuple[Tensor, Tensor]:
    """The joints of the horizontally mirrored ``size x size`` frame: ``(joints [..., 14, 2], visible [..., 14])``
    from ``(x, y)`` frame coordinates ``joints [..., 14, 2]`` and ``visible [..., 14]``: left and right joints swap
    (:data:`FLIP_PERMUTATION`) and ``x -> size - x``."""
    perm = list(FLIP_PERMUTATION)
    mirrored = joints[..., perm, :].clone()
    mirrored[..., 0] = size - mirrored[..., 0]
    return mirrored, visible[..., perm]


def mirror_cells(cells: Tensor, grid_size: int) -> Tensor:
    """The ``(y, x)`` grid cells ``[..., 14, 2]`` of the mirrored frame: left and right joints swap and
    ``x -> G - 1 - x`` (the mirror of a cell under :func:`joints_to_grid`)."""
    mirrored = cells[..., list(FLIP_PERMUTATION), :].clone()
    mirrored[..., 1] = grid_size - 1 - mirrored[..., 1]
    return mirrored


_SPLITS = {"train": range(1, 1501), "test": range(1501, 2001), "all": range(1, 2001)}
_RIGHT_HIP, _LEFT_HIP, _RIGHT_SHOULDER, _LEFT_SHOULDER = 2, 3, 8, 9
_HOW_TO_GET = ("download lspet_dataset.zip from http://sam.johnson.io/research/lspet.html "
               "(Johnson & Everingham 2011), unzip it and pass the folder that contains joints.mat")


@dataclass(frozen=True)
class LSPSample:
    """One preprocessed LSPET image: ``name`` (e.g. ``"im00001"``), ``image`` float32 [3, S, S] RGB in [0, 1],
    ``joints`` float32 [14, 2] (x, y) in the S x S frame (NaN where not visible), ``visible`` bool [14], and
    ``scale``, frame pixels per original image pixel (about ``S / max(W, H)``; :func:`torso_with_fallback`)."""

    name: str
    image: Tensor
    joints: Tensor
    visible: Tensor
    scale: float = 1.0


def lsp_split_ids(split: str) -> range:
    """1-based image numbers of ``split``: ``"train"`` 1-1500, ``"test"`` 1501-2000, ``"all"`` 1-2000."""
    if split not in _SPLITS:
        raise ValueError(f"split must be one of {sorted(_SPLITS)}, got {split!r}")
    return _SPLITS[split]


def _read_joints(root: Path, last_id: int) -> np.ndarray:
    """``joints.mat`` as float64 [N, 14, 3] (x, y, visibility), checked to cover images 1..``last_id``."""
    from scipy.io import loadmat

    path = root / "joints.mat"
    if not path.is_file():
        raise FileNotFoundError(f"LSP Extended annotations not found at {path}; {_HOW_TO_GET}")
    joints = loadmat(str(path)).get("joints")
    if joints is None or joints.ndim != 3 or joints.shape[:2] != (NUM_JOINTS, 3) or joints.shape[2] < last_id:
        found = "no 'joints'" if joints is None else f"shape {joints.shape}"
        raise ValueError(f"{path}: expected 'joints' of shape (14, 3, >= {last_id}), got {found}")
    return np.asarray(joints, dtype=np.float64).transpose(2, 0, 1)


def _image_paths(root: Path, ids: range) -> list[Path]:
    paths = [root / "images" / f"im{i:05d}.jpg" for i in ids]
    missing = [p for p in paths if not p.is_file()]
    if missing:
        raise FileNotFoundError(f"{len(missing)} LSP Extended images missing, first {missing[0]} "
                                f"(looked in {root / 'images'}); {_HOW_TO_GET}")
    return paths


def _letterbox(path: Path, size: int) -> tuple[Tensor, np.ndarray, np.ndarray, np.ndarray]:
    """Resize (aspect kept, longer side ``size``) and centre on a black canvas: ``(image float32 [3, S, S],
    original (W, H), scale (sx, sy), offset (ox, oy))``."""
    from PIL import Image

    with Image.open(path) as img:
        rgb = img.convert("RGB")
    width, height = rgb.size
    (new_w, new_h), scale, offset = letterbox_geometry(width, height, size)
    canvas = Image.new("RGB", (size, size))
    canvas.paste(rgb.resize((new_w, new_h), Image.Resampling.BILINEAR), tuple(int(o) for o in offset))
    image = torch.from_numpy(np.asarray(canvas, dtype=np.float32) / 255.0).permute(2, 0, 1).contiguous()
    return image, np.array([width, height]), scale, offset


def letterbox_geometry(width: int, height: int, size: int) -> tuple[tuple[int, int], np.ndarray, np.ndarray]:
    """Where a ``width x height`` image lands in the ``size x size`` frame: ``((new_w, new_h), scale (sx, sy),
    offset (ox, oy))`` -- frame = original * scale + offset (continuous coordinates)."""
    factor = size / max(width, height)
    new_w, new_h = max(1, round(width * factor)), max(1, round(height * factor))
    return (new_w, new_h), np.array([new_w / width, new_h / height]), np.array([(size - new_w) // 2,
                                                                              (size - new_h) // 2])


def frame_to_original(joints: Tensor, root: str | Path, ids, size: int) -> Tensor:
    """Frame coordinates ``[N, 14, 2]`` (x, y) of the ``size x size`` frames of LSPET images ``ids`` (1-based) back
    to the original images' pixels (MATLAB convention, as in ``joints.mat``: the inverse of the loader's map)."""
    from PIL import Image

    out = torch.empty(joints.shape, dtype=torch.float64)
    for k, path in enumerate(_image_paths(Path(root).expanduser(), ids)):
        with Image.open(path) as img:
            _, scale, offset = letterbox_geometry(*img.size, size)
        out[k] = (joints[k].double() - torch.from_numpy(offset).double()) / torch.from_numpy(scale) + 0.5
    return out


def _sample(path: Path, raw: np.ndarray, size: int) -> LSPSample:
    """Preprocess one image and its raw annotation [14, 3] (MATLAB x, y, visibility)."""
    image, original, scale, offset = _letterbox(path, size)
    visible = raw[:, 2] > 0
    continuous = np.clip(raw[:, :2] - 0.5, 0.0, original)  # in [0, W] x [0, H]
    joints = np.where(visible[:, None], continuous * scale + offset, np.nan)
    return LSPSample(path.stem, image, torch.from_numpy(joints.astype(np.float32)), torch.from_numpy(visible),
                     float(scale.max()))


def load_lsp_extended(
    root: str | Path, split: str = "train", size: int = 128, limit: int | None = None,
) -> list[LSPSample]:
    """Load a fixed split of LSP Extended as :class:`LSPSample` s in image order, preprocessed to ``size x size``
    (see the module docstring).

    Args:
        root: folder containing ``joints.mat`` and ``images/``.
        split: ``"train"`` (images 1-1500), ``"test"`` (1501-2000) or ``"all"`` (1-2000).
        size: side ``S`` of the output frame, in pixels.
        limit: load only the first ``limit`` images of the split (None: all).

    Raises ``FileNotFoundError`` when ``joints.mat`` or an image is missing, ``ValueError`` for bad arguments or a
    malformed ``joints.mat``.
    """
    if size < 1:
        raise ValueError(f"size must be >= 1, got {size}")
    if limit is not None and limit < 0:
        raise ValueError(f"limit must be >= 0 or None, got {limit}")
    ids = lsp_split_ids(split)
    ids = ids if limit is None else ids[:limit]
    root = Path(root).expanduser()
    if not root.is_dir():
        raise FileNotFoundError(f"LSP Extended folder not found at {root}; {_HOW_TO_GET}")
    try:
        import PIL.Image  # noqa: F401
        import scipy.io  # noqa: F401
    except ImportError as err:
        raise ImportError("LSP Extended needs scipy and Pillow: pip install 'torch_bcfw[pose]'") from err
    joints = _read_joints(root, ids[-1] if len(ids) else 0)
    paths = _image_paths(root, ids)
    return [_sample(path, joints[i - 1], size) for path, i in zip(paths, ids, strict=True)]


def torso_size(joints: Tensor, visible: Tensor) -> Tensor:
    """Torso diameter per image: distance from the left shoulder to the right hip, ``[...]`` in the units of
    ``joints [..., 14, 2]`` (any coordinate order; ``visible`` bool ``[..., 14]``).

    The normaliser of the pose loss of Osokin et al. (2016, section 3.5) and of PCK with torso normalisation
    (Toshev & Szegedy 2014).  If either joint is not visible, the other diagonal (right shoulder to left hip) is
    used; if neither is, the result is NaN.
    """
    if joints.shape[-2:] != (NUM_JOINTS, 2) or visible.shape != joints.shape[:-1]:
        raise ValueError(f"expected joints [..., 14, 2] and visible [..., 14], got {tuple(joints.shape)} "
                         f"and {tuple(visible.shape)}")
    main = (joints[..., _LEFT_SHOULDER, :] - joints[..., _RIGHT_HIP, :]).norm(dim=-1)
    other = (joints[..., _RIGHT_SHOULDER, :] - joints[..., _LEFT_HIP, :]).norm(dim=-1)
    has_main = visible[..., _LEFT_SHOULDER] & visible[..., _RIGHT_HIP]
    has_other = visible[..., _RIGHT_SHOULDER] & visible[..., _LEFT_HIP]
    nan = torch.full_like(main, float("nan"))
    return torch.where(has_main, main, torch.where(has_other, other, nan))


def reference_torso(joints: Tensor, visible: Tensor, scale: Tensor) -> float:
    """Median torso size in *original-image* pixels over the images that have one (:func:`torso_size`; about
    48 px on LSPET images 1-1500), for :func:`torso_with_fallback`.

    Args:
        joints: [N, 14, 2] in the preprocessed frame; visible: bool [N, 14]; scale: [N] frame pixels per
            original pixel (:attr:`LSPSample.scale`).
    """
    size = torso_size(joints, visible) / scale
    size = size[torch.isfinite(size)]
    if size.numel() == 0:
        raise ValueError("no image has a torso size (both torso diagonals unannotated everywhere)")
    return float(size.median())


def torso_with_fallback(joints: Tensor, visible: Tensor, scale: Tensor, reference: float) -> Tensor:
    """:func:`torso_size`, with ``reference * scale`` where it is undefined (no torso diagonal annotated; 342 of
    LSPET images 1-2000): ``[N]`` in frame pixels, finite and > 0, as the SSVM loss needs.  ``reference`` is
    :func:`reference_torso`.  PCK does *not* use the fallback (images without a torso are left out of it).
    """
    if not reference > 0:
        raise ValueError(f"reference torso size must be > 0, got {reference}")
    size = torso_size(joints, visible)
    fallback = torch.as_tensor(scale, dtype=size.dtype, device=size.device) * reference
    return torch.where(torch.isfinite(size) & (size > 0), size, fallback)


def joints_to_grid(joints: Tensor, size: int, grid_size: int) -> Tensor:
    """Map (x, y) frame coordinates ``[..., 2]`` of the ``size x size`` frame to (y, x) grid units ``[..., 2]`` of a
    ``G x G`` grid (the unit of the pose model).

    Grid cell ``g`` covers frame coordinates ``[g, g + 1] * size / G`` and its centre maps to ``g``, so
    ``round()`` of the result (clamped to ``[0, G - 1]``) is the cell index.  NaN stays NaN.  Distances scale by
    ``G / size``.
    """
    return joints.flip(-1) * (grid_size / size) - 0.5


def grid_to_joints(positions: Tensor, size: int, grid_size: int) -> Tensor:
    """Inverse of :func:`joints_to_grid`: (y, x) grid positions [..., 2] (integer cells, or float sub-cell positions
    as of :func:`~torch_bcfw.inference.subcell.refine_cells`) to (x, y) frame coordinates [..., 2]."""
    if not positions.is_floating_point():
        positions = positions.to(torch.get_default_dtype())
    return (positions.flip(-1) + 0.5) * (size / grid_size)
