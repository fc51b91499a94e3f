"""random_similarity: frames and keypoints warped together (a blob follows its keypoint), the identity, keypoints
leaving the frame."""
from __future__ import annotations

import pytest
import torch

from torch_bcfw.vision import random_similarity


def _blob_frames(points: torch.Tensor, S: int = 48) -> torch.Tensor:
    """One frame per point ``[B, 2]`` (x, y): a Gaussian blob centred there (continuous pixel coordinates)."""
    ys, xs = torch.meshgrid(torch.arange(S) + 0.5, torch.arange(S) + 0.5, indexing="ij")
    d2 = (xs[None] - points[:, 0, None, None]) ** 2 + (ys[None] - points[:, 1, None, None]) ** 2
    return torch.exp(-d2 / (2 * 1.5**2))[:, None].to(torch.float64)


def _centre_of_mass(frames: torch.Tensor) -> torch.Tensor:
    S = frames.shape[-1]
    ys, xs = torch.meshgrid(torch.arange(S) + 0.5, torch.arange(S) + 0.5, indexing="ij")
    m = frames[:, 0]
    total = m.sum(dim=(-2, -1))
    return torch.stack(((m * xs).sum(dim=(-2, -1)) / total, (m * ys).sum(dim=(-2, -1)) / total), dim=-1)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_blob_follows_its_keypoint(seed):
    gen = torch.Generator().manual_seed(seed)
    S, B = 48, 16
    points = torch.rand(B, 2, generator=gen, dtype=torch.float64) * 16 + 16  # near the centre: stays inside
    frames = _blob_frames(points, S)
    warped, moved, vis = random_similarity(frames, points[:, None], torch.ones(B, 1, dtype=torch.bool), gen,
                                           scale=(0.8, 1.2), rotation=30, shift=0.05)
    assert warped.shape == frames.shape and moved.shape == (B, 1, 2) and bool(vis.all())
    torch.testing.assert_close(_centre_of_mass(warped), moved[:, 0], atol=0.15, rtol=0)
    assert float((moved[:, 0] - points).abs().max()) > 1.0  # it did move


def test_identity_parameters_change_nothing():
    gen = torch.Generator().manual_seed(3)
    frames = torch.rand(2, 3, 20, 20, generator=gen)
    pts = torch.rand(2, 5, 2, generator=gen) * 20
    vis = torch.rand(2, 5, generator=gen) < 0.7
    out, moved, v = random_similarity(frames, pts, vis, gen, scale=(1.0, 1.0), rotation=0.0, shift=0.0)
    torch.testing.assert_close(out, frames, atol=1e-5, rtol=0)
    torch.testing.assert_close(moved, pts, atol=1e-5, rtol=0)
    assert torch.equal(v, vis)


def test_keypoints_that_leave_the_frame_become_invisible():
    gen = torch.Generator().manual_seed(4)
    pts = torch.tensor([[[1.0, 1.0], [10.0, 10.0]]]).repeat(64, 1, 1)  # a corner point and the centre
    _, moved, vis = random_similarity(torch.zeros(64, 1, 20, 20), pts, torch.ones(64, 2, dtype=torch.bool), gen,
                                      scale=(1.2, 1.5), rotation=0.0, shift=0.0)
    assert bool(vis[:, 1].all()) and not bool(vis[:, 0].any())  # zoomed about the centre: the corner leaves
    assert bool(((moved[:, 0] < 0) | (moved[:, 0] > 20)).any(-1).all())


def test_bad_inputs_are_refused():
    f, p, v = torch.zeros(1, 3, 8, 8), torch.zeros(1, 2, 2), torch.ones(1, 2, dtype=torch.bool)
    with pytest.raises(ValueError, match="images"):
        random_similarity(torch.zeros(1, 3, 8, 9), p, v)
    with pytest.raises(ValueError, match="keypoints"):
        random_similarity(f, torch.zeros(2, 2, 2), v)
    with pytest.raises(ValueError, match="visible"):
        random_similarity(f, p, v.long())
    with pytest.raises(ValueError, match="scale"):
        random_similarity(f, p, v, scale=(1.2, 0.8))
