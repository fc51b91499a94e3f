"""Tests of the LSP Extended loader and pose metrics (torch_bcfw.datasets.lsp), on the real data."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from scipy.io import loadmat

from torch_bcfw.datasets.lsp import (
    grid_to_joints,
    joints_to_grid,
    load_lsp_extended,
    lsp_split_ids,
    reference_torso,
    torso_size,
    torso_with_fallback,
)
from torch_bcfw.metrics.pck import pck, pck_difference

LSP_ROOT = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "lspet"
SIZE = 96
COUNT = 12  # images loaded per split: keeps the test fast


@pytest.fixture(scope="module")
def root() -> Path:
    if not (LSP_ROOT / "joints.mat").is_file():
        pytest.fail(f"LSP Extended data missing at {LSP_ROOT} (see ../shared/data/README.md)")
    return LSP_ROOT


@pytest.fixture(scope="module")
def raw_joints(root: Path) -> np.ndarray:
    return loadmat(str(root / "joints.mat"))["joints"]  # [14, 3, 10000]


@pytest.fixture(scope="module")
def samples(root: Path) -> dict[str, list]:
    return {split: load_lsp_extended(root, split, size=SIZE, limit=COUNT) for split in ("train", "test")}


def test_split_sizes_are_fixed_and_disjoint() -> None:
    train, test, everything = lsp_split_ids("train"), lsp_split_ids("test"), lsp_split_ids("all")
    assert (len(train), len(test), len(everything)) == (1500, 500, 2000)
    assert (train[0], train[-1], test[0], test[-1]) == (1, 1500, 1501, 2000)
    assert set(train).isdisjoint(test) and set(train) | set(test) == set(everything)
    with pytest.raises(ValueError, match="split"):
        lsp_split_ids("val")


def test_every_split_image_is_present(root: Path) -> None:
    assert all((root / "images" / f"im{i:05d}.jpg").is_file() for i in lsp_split_ids("all"))


def test_samples_have_documented_names_shapes_and_ranges(samples: dict[str, list]) -> None:
    assert [s.name for s in samples["train"]] == [f"im{i:05d}" for i in range(1, COUNT + 1)]
    assert [s.name for s in samples["test"]] == [f"im{i:05d}" for i in range(1501, 1501 + COUNT)]
    for s in samples["train"] + samples["test"]:
        assert s.image.shape == (3, SIZE, SIZE) and s.image.dtype == torch.float32
        assert s.image.min() >= 0.0 and s.image.max() <= 1.0 and s.image.max() > 0.1
        assert s.joints.shape == (14, 2) and s.joints.dtype == torch.float32
        assert s.visible.shape == (14,) and s.visible.dtype == torch.bool


def test_visibility_mask_hides_junk_coordinates(samples: dict[str, list], raw_joints: np.ndarray) -> None:
    hidden = 0
    for s in samples["train"]:
        raw = raw_joints[:, :, int(s.name[2:]) - 1]
        assert torch.equal(s.visible, torch.from_numpy(raw[:, 2] > 0))
        junk = raw[~s.visible.numpy(), :2]
        assert ((junk[:, 0] <= 0) | (junk[:, 1] <= 0)).all()  # e.g. (0, -26)
        assert torch.isnan(s.joints[~s.visible]).all() and torch.isfinite(s.joints[s.visible]).all()
        hidden += int((~s.visible).sum())
    assert hidden > 0  # the first images do contain invisible joints (im00001: right ankle)


def test_visible_joints_follow_the_image_into_the_frame(
    root: Path, samples: dict[str, list], raw_joints: np.ndarray,
) -> None:
    for s in samples["train"] + samples["test"]:
        visible = s.joints[s.visible]
        assert (visible >= 0).all() and (visible <= SIZE).all()
        width, height = Image.open(root / "images" / f"{s.name}.jpg").size
        scale = SIZE / max(width, height)
        pad = torch.tensor([(SIZE - width * scale) / 2, (SIZE - height * scale) / 2])
        raw = torch.from_numpy(raw_joints[:, :2, int(s.name[2:]) - 1]).float()[s.visible]
        torch.testing.assert_close(visible, raw * scale + pad, rtol=0, atol=1.0)  # rounding, half-pixel shift


def test_missing_data_raises_file_not_found(tmp_path: Path, root: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"lspet\.html") as info:
        load_lsp_extended(tmp_path / "nowhere")
    assert "nowhere" in str(info.value)
    with pytest.raises(FileNotFoundError, match=r"joints\.mat"):
        load_lsp_extended(tmp_path)
    (tmp_path / "joints.mat").symlink_to(root / "joints.mat")
    with pytest.raises(FileNotFoundError, match=r"im00001\.jpg"):
        load_lsp_extended(tmp_path, "train", limit=2)


def test_torso_size_uses_left_shoulder_to_right_hip_then_the_other_diagonal() -> None:
    joints = torch.zeros(3, 14, 2)
    joints[:, 9] = torch.tensor([0.0, 0.0])  # left shoulder
    joints[:, 2] = torch.tensor([3.0, 4.0])  # right hip
    joints[:, 8] = torch.tensor([0.0, 0.0])  # right shoulder
    joints[:, 3] = torch.tensor([6.0, 8.0])  # left hip
    visible = torch.ones(3, 14, dtype=torch.bool)
    visible[1, 2] = False
    visible[2, [2, 3]] = False
    size = torso_size(joints, visible)
    assert size[0].item() == 5.0 and size[1].item() == 10.0 and size[2].isnan()


def test_torso_size_on_real_samples(samples: dict[str, list]) -> None:
    joints = torch.stack([s.joints for s in samples["train"]])
    visible = torch.stack([s.visible for s in samples["train"]])
    size = torso_size(joints, visible)
    defined = size[torch.isfinite(size)]
    assert len(defined) >= COUNT // 2 and (defined > 2).all() and (defined < SIZE).all()


def test_pck() -> None:
    true = torch.zeros(2, 14, 2)
    pred = true.clone()
    pred[0, 0] = torch.tensor([3.0, 0.0])  # 3 > 0.2 * 10: wrong
    pred[0, 1] = torch.tensor([2.0, 0.0])  # on the threshold: correct
    visible = torch.ones(2, 14, dtype=torch.bool)
    visible[0, 2] = False
    torso = torch.tensor([10.0, float("nan")])  # image 1 is not counted
    torch.testing.assert_close(pck(pred, true, visible, torso), torch.tensor(12 / 13))


def test_pck_difference_is_the_difference_of_pcks_with_a_paired_image_bootstrap() -> None:
    gen = torch.Generator().manual_seed(0)
    N = 60
    true = torch.rand(N, 14, 2, generator=gen) * 100
    torso = torch.full((N,), 20.0)
    torso[3] = float("nan")  # not counted
    visible = torch.rand(N, 14, generator=gen) > 0.2
    base = true + torch.randn(N, 14, 2, generator=gen) * 5
    better = base.clone()
    better[:40] = true[:40]  # right on 40 images, the same as the baseline elsewhere
    r = pck_difference(better, base, true, visible, torso, n_boot=500)
    expected = float(pck(better, true, visible, torso) - pck(base, true, visible, torso))
    assert r["diff"] == pytest.approx(expected, abs=1e-6) and expected > 0.1
    assert r["lost"] == 0 and r["gained"] > 0 and r["joints"] == int(visible[torch.arange(N) != 3].sum())
    assert (r["gained"] - r["lost"]) / r["joints"] == pytest.approx(expected)
    assert 0 < r["low"] < r["diff"] < r["high"]
    same = pck_difference(base, base, true, visible, torso, n_boot=200)
    assert same["diff"] == same["low"] == same["high"] == 0.0 and same["gained"] == same["lost"] == 0
    # swapping the roles flips the sign; the interval is a bootstrap of the same draws
    worse = pck_difference(base, better, true, visible, torso, n_boot=500)
    assert worse["diff"] == pytest.approx(-r["diff"]) and worse["high"] == pytest.approx(-r["low"])
    # a lower level gives an interval nested in the 95% one (same draws)
    narrow = pck_difference(better, base, true, visible, torso, n_boot=500, level=0.5)
    assert r["low"] <= narrow["low"] <= narrow["high"] <= r["high"]
    with pytest.raises(ValueError, match="shape"):
        pck_difference(better[:, :13], base, true, visible, torso)
    with pytest.raises(ValueError, match="no joint"):
        pck_difference(better, base, true, torch.zeros_like(visible), torso)
    with pytest.raises(ValueError, match="level"):
        pck_difference(better, base, true, visible, torso, level=1.0)


def test_grid_mapping_round_trip() -> None:
    size, grid = 128, 32
    joints = torch.tensor([[0.0, 0.0], [128.0, 64.0], [2.0, 6.0]])  # (x, y) frame coordinates
    positions = joints_to_grid(joints, size, grid)  # (y, x) grid coordinates
    torch.testing.assert_close(positions[2], torch.tensor([1.0, 0.0]))  # centre of cell (y=1, x=0)
    torch.testing.assert_close(grid_to_joints(positions, size, grid), joints)
    torch.testing.assert_close(grid_to_joints(torch.tensor([[1, 0]]), size, grid), torch.tensor([[2.0, 6.0]]))


def test_torso_fallback_uses_the_reference_torso_scaled_to_the_frame(samples: dict[str, list]) -> None:
    train = samples["train"]
    joints = torch.stack([s.joints for s in train])
    visible = torch.stack([s.visible for s in train])
    scale = torch.tensor([s.scale for s in train])
    assert bool(((scale > 0) & (scale <= 1.5)).all())
    ref = reference_torso(joints, visible, scale)
    assert 20 < ref < 100  # original pixels: LSPET people are about 150 px tall
    visible[0, [2, 3]] = False  # image 0 loses both torso diagonals
    size = torso_with_fallback(joints, visible, scale, ref)
    assert bool(torch.isfinite(size).all()) and bool((size > 0).all())
    assert size[0].item() == pytest.approx(ref * scale[0].item())
    direct = torso_size(joints, visible)
    defined = torch.isfinite(direct)
    torch.testing.assert_close(size[defined], direct[defined])
    with pytest.raises(ValueError, match="reference"):
        torso_with_fallback(joints, visible, scale, 0.0)
