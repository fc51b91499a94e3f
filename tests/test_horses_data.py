"""Weizmann horse loader (torch_bcfw.datasets.horses) on the real data in ../shared/data."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

pytest.importorskip("PIL", reason="Pillow is part of the optional [graphcut] dependencies")

from torch_bcfw.datasets.horses import (  # noqa: E402
    HorseImage,
    load_weizmann_horses,
    split_numbers,
    working_size,
)

ROOT = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "weizmann_horse"
MAX_SIDE = 48


@pytest.fixture(scope="module")
def root() -> Path:
    assert ROOT.is_dir(), f"Weizmann horse data missing at {ROOT} (see shared/data/README.md)"
    return ROOT


@pytest.fixture(scope="module")
def all_horses(root) -> list[HorseImage]:
    return load_weizmann_horses(root, max_side=MAX_SIDE, split="all")


def test_splits_partition_the_328_images():
    sizes = {name: len(split_numbers(name)) for name in ("train", "val", "test")}
    assert sizes == {"train": 200, "val": 28, "test": 100}
    union = [k for name in ("train", "val", "test") for k in split_numbers(name)]
    assert union == list(split_numbers("all")) == list(range(1, 329))
    with pytest.raises(ValueError, match="split"):
        split_numbers("validation")


def test_all_images_masks_and_shapes(all_horses):
    assert len(all_horses) == 328
    assert [h.name for h in all_horses[:2]] == ["horse001", "horse002"]
    for horse in all_horses:
        c, h, w = horse.image.shape
        assert c == 3 and max(h, w) == MAX_SIDE and horse.mask.shape == (h, w)
        assert horse.image.dtype == torch.float32 and horse.mask.dtype == torch.int64
        assert 0.0 <= float(horse.image.min()) and float(horse.image.max()) <= 1.0
        assert set(horse.mask.unique().tolist()) <= {0, 1}
    foreground = torch.tensor([float(h.mask.float().mean()) for h in all_horses])
    assert 0.2 <= float(foreground.mean()) <= 0.35
    assert float(foreground.min()) > 0.0


def test_split_loading_matches_all(root, all_horses):
    val = load_weizmann_horses(root, max_side=MAX_SIDE, split="val")
    assert [h.name for h in val] == [f"horse{k:03d}" for k in range(201, 229)]
    for loaded, reference in zip(val, all_horses[200:228], strict=True):
        assert torch.equal(loaded.image, reference.image)
        assert torch.equal(loaded.mask, reference.mask)


def test_fixed_size_gray_and_rgb_alignment(root):
    rgb = load_weizmann_horses(root, size=(40, 56), split="val")
    gray = load_weizmann_horses(root, size=(40, 56), split="val", color="gray")
    assert all(h.image.shape == (3, 40, 56) and h.mask.shape == (40, 56) for h in rgb)
    assert all(h.image.shape == (1, 40, 56) for h in gray)
    assert all(torch.equal(a.mask, b.mask) for a, b in zip(rgb, gray, strict=True))
    # rgb (native size differs from the mask) must land on the mask's frame, like gray does
    luminance = torch.tensor([0.299, 0.587, 0.114])[:, None, None]
    pairs = [
        torch.stack([(a.image * luminance).sum(0).flatten(), b.image.flatten()])
        for a, b in zip(rgb, gray, strict=True)
    ]
    correlations = torch.tensor([float(torch.corrcoef(pair)[0, 1]) for pair in pairs])
    assert float(correlations.median()) > 0.98


def test_native_resolution_matches_mask_file(root):
    from PIL import Image

    horse = load_weizmann_horses(root, split="val")[0]
    with Image.open(root / "figure_ground" / "horse201.jpg") as mask_file:
        width, height = mask_file.size
    assert horse.image.shape == (3, height, width) and horse.mask.shape == (height, width)


def test_working_size():
    assert working_size((200, 300)) == (200, 300)
    assert working_size((200, 300), size=(10, 20)) == (10, 20)
    assert working_size((200, 300), max_side=60) == (40, 60)
    assert working_size((301, 100), max_side=3) == (3, 1)
    with pytest.raises(ValueError, match="at most one"):
        working_size((200, 300), size=(10, 20), max_side=60)


def test_missing_root_raises_with_path(tmp_path):
    missing = tmp_path / "no_horses_here"
    with pytest.raises(FileNotFoundError, match="no_horses_here") as info:
        load_weizmann_horses(missing)
    assert "Weizmann Horse Database must be downloaded" in str(info.value)
    (missing / "rgb").mkdir(parents=True)
    with pytest.raises(FileNotFoundError, match="figure_ground"):
        load_weizmann_horses(missing)
