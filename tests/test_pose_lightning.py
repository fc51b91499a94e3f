"""Lightning wiring of the pose example: head, BCFW callback on PoseData, augmentation, LSP datamodule."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

pl = pytest.importorskip("lightning.pytorch")

from torch_bcfw.data import PoseData
from torch_bcfw.datasets.lsp import FLIP_PERMUTATION
from torch_bcfw.datasets.lsp_tensors import augment_batch
from torch_bcfw.inference.subcell import argmax_positions
from torch_bcfw.inference.tree import LSP_TREE_EDGES
from torch_bcfw.lightning import BCFWCallback
from torch_bcfw.models.pose import PoseTree
from torch_bcfw.tasks.lsp_data import LSPPoseDataModule
from torch_bcfw.tasks.pose import PoseHead
from torch_bcfw.vision.heatmaps import log_heatmaps

LSP_ROOT = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "lspet"
G = 6


def _trainer(root=None, callbacks=(), max_epochs: int = 1):
    """A quiet CPU trainer: no logger, checkpoints, progress bar, summary or validation."""
    return pl.Trainer(accelerator="cpu", max_epochs=max_epochs, callbacks=list(callbacks), logger=False,
                      enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                      default_root_dir=root, num_sanity_val_steps=0, limit_val_batches=0)


def _lsp(tmp_path, size: int = 32, grid_size: int = 8, **kwargs) -> LSPPoseDataModule:
    """A small LSP Extended datamodule, set up for fitting (fails, not skips, when the data is missing)."""
    if not (LSP_ROOT / "joints.mat").is_file():
        pytest.fail(f"LSP Extended data missing at {LSP_ROOT}")
    dm = LSPPoseDataModule(str(LSP_ROOT), size=size, grid_size=grid_size, cache_dir=str(tmp_path), **kwargs)
    dm.setup("fit")
    return dm


def test_flip_permutation_mirrors_left_and_right() -> None:
    from torch_bcfw.inference.tree import LSP_JOINTS

    for j, k in enumerate(FLIP_PERMUTATION):
        a, b = LSP_JOINTS[j], LSP_JOINTS[k]
        assert a == b if a in ("neck", "head_top") else a.split("_")[1] == b.split("_")[1] and a != b
    # a flipped skeleton is still a tree with the same edges up to the relabelling
    edges = {(FLIP_PERMUTATION[p], FLIP_PERMUTATION[c]) for p, c in LSP_TREE_EDGES}
    assert edges == set(LSP_TREE_EDGES)


def test_augment_batch_moves_images_and_joints_together() -> None:
    S = 16
    image = torch.zeros(4, 3, S, S)
    image[:, 0, 3, 10] = 1.0  # a marked pixel (x=10, y=3) ...
    joints = torch.full((4, 14, 2), float("nan"))
    joints[:, 5] = torch.tensor([10.5, 3.5])  # ... at the left ankle, the only visible joint
    visible = torch.zeros(4, 14, dtype=torch.bool)
    visible[:, 5] = True
    gen = torch.Generator().manual_seed(0)
    flips = 0
    for _ in range(5):
        out = augment_batch({"image": image, "joints": joints, "visible": visible}, max_shift=3, generator=gen)
        for b in range(4):
            ys, xs = torch.nonzero(out["image"][b, 0], as_tuple=True)
            j = int(out["visible"][b].nonzero())
            assert j in (0, 5)  # a flip turns the left ankle into the right ankle
            flips += j == 0
            torch.testing.assert_close(out["joints"][b, j], torch.stack((xs[0], ys[0])).float() + 0.5)
            assert torch.isnan(out["joints"][b, [k for k in range(14) if k != j]]).all()
    assert 0 < flips < 20


def test_heatmap_cnn_in_channels_last_format_computes_the_same_maps() -> None:
    from torch_bcfw.tasks.pose import HeatmapCNN

    torch.manual_seed(0)
    plain = HeatmapCNN(14, 4, 8, (1, 2), grid_size=8, channels_last=False).eval()
    fast = HeatmapCNN(14, 4, 8, (1, 2), grid_size=8, channels_last=True).eval()
    fast.load_state_dict(plain.state_dict())  # the checkpoints are interchangeable
    assert fast.stem[0].weight.is_contiguous(memory_format=torch.channels_last)
    images = torch.rand(3, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(log_heatmaps(fast(images)), log_heatmaps(plain(images)), rtol=1e-4, atol=1e-4)
    plain.load_state_dict(fast.state_dict())


def test_pose_head_decodes_like_the_model_and_restores_offsets() -> None:
    gen = torch.Generator().manual_seed(0)
    mu = torch.randn(13, 2, generator=gen, dtype=torch.float64)
    head = PoseHead(PoseTree(G))
    scales = torch.rand(13, 2, generator=gen, dtype=torch.float64) + 0.5
    head.set_offsets(mu, scales)
    w = torch.rand(head.n_features, generator=gen, dtype=torch.float64)
    head.set_weights(w)
    unary = torch.randn(3, 14, G, G, generator=gen)
    expected = head.model.decode_positions(w, PoseData(unary))
    assert torch.equal(head(unary), expected)
    other = PoseHead(PoseTree(G))
    other.load_state_dict(head.state_dict())
    assert torch.equal(other.model.mu, mu) and torch.equal(other.model.scales, scales)
    assert torch.equal(other(unary), expected)
    head.float()
    assert head.w.dtype == torch.float64
    with pytest.raises(ValueError, match="mu"):
        head.set_offsets(torch.zeros(3, 2))
    with pytest.raises(TypeError, match="PoseTree"):
        PoseHead(object())  # type: ignore[arg-type]


class _Synthetic(pl.LightningModule):
    """Noisy one-hot heatmaps of a fixed skeleton; a 1-parameter 'backbone' scales them."""

    def __init__(self, n: int = 12):
        super().__init__()
        gen = torch.Generator().manual_seed(0)
        mu = torch.tensor([[1.0, 0.0]] * 13, dtype=torch.float64)
        self.cells = torch.randint(1, G - 1, (n, 14, 2), generator=gen)
        hot = torch.zeros(n, 14, G * G)
        hot.scatter_(2, (self.cells[..., 0] * G + self.cells[..., 1])[..., None], 3.0)
        self.noise = hot.reshape(n, 14, G, G) + torch.randn(n, 14, G, G, generator=gen) * 1.5
        self.scale = torch.nn.Parameter(torch.ones(()))
        self.head = PoseHead(PoseTree(G, mu))

    def bcfw_dataloader(self):
        return torch.utils.data.DataLoader(torch.arange(len(self.cells)), batch_size=5)

    def train_dataloader(self):
        return self.bcfw_dataloader()

    def bcfw_features(self, idx) -> PoseData:
        logp = log_heatmaps(self.noise[idx] * self.scale)
        return PoseData(logp.unsqueeze(2), self.cells[idx], torso=torch.full((len(idx),), 2.0, dtype=torch.float64))

    def training_step(self, idx, _):
        return (self.scale - 1.1) ** 2

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def test_bcfw_callback_solves_the_tree_head_on_pose_features(tmp_path) -> None:
    module = _Synthetic()
    cb = BCFWCallback(lam=0.01, passes_per_call=3, initial_passes=3, solver_options={"seed": 0})
    trainer = _trainer(tmp_path, [cb], max_epochs=2)
    trainer.fit(module)
    assert cb.calls == 3 and cb.last_record.gap >= 0
    assert trainer.callback_metrics["ssvm/gap"] == pytest.approx(cb.last_record.gap)
    w = module.head.w
    assert bool((w[module.head.model.quadratic_index()] >= 0).all()) and float(w.abs().sum()) > 0
    # the solved head decodes the training images better than the per-joint argmax of the noisy heatmaps
    data = cb.last_data
    tree = module.head.model.loss(data, module.head.model.oracle(w, data, loss_augmented=False)).mean()
    argmax = argmax_positions(data.unary[:, :, 0])
    flat = (argmax[..., 0] * G + argmax[..., 1]).reshape(-1)
    assert float(tree) <= float(module.head.model.loss(data, flat).mean())


def test_lsp_datamodule_fields(tmp_path) -> None:
    dm = _lsp(tmp_path, size=64, grid_size=16, limit=10, test_limit=4)
    assert dm.mean_offsets.shape == (13, 2) and len(dm.train) == 10 and len(dm.test) == 4
    assert dm.offset_scales.shape == (13, 2) and bool((dm.offset_scales >= 4).all())
    assert 20 < dm.reference_torso < 100  # original pixels (LSPET people are ~150 px tall)
    f = dm.train.fields
    assert f["cells"].shape == (10, 14, 2) and int(f["cells"].min()) >= 0 and int(f["cells"].max()) < 16
    assert bool((f["torso"] > 0).all()) and bool(torch.isfinite(f["torso"]).all())
    batch = next(iter(dm.bcfw_dataloader()))
    assert batch["image"].shape == (10, 3, 64, 64) and batch["image"].dtype == torch.float32
    PoseData(torch.zeros(10, 14, 1, 16, 16), batch["cells"], batch["visible"], batch["torso"])
    assert any(tmp_path.iterdir())  # the cache was written
    again = LSPPoseDataModule(str(LSP_ROOT), size=64, grid_size=16, limit=10, test_limit=4, cache_dir=str(tmp_path))
    again.setup("fit")
    assert torch.equal(again.train.fields["cells"], f["cells"])
    with pytest.raises(ValueError, match="multiple"):
        LSPPoseDataModule(str(LSP_ROOT), size=65, grid_size=16)
    # head_holdout: the CNN trains on the first images, the head on the last ones (disjoint, together all)
    held = LSPPoseDataModule(str(LSP_ROOT), size=64, grid_size=16, limit=10, test_limit=4, cache_dir=str(tmp_path),
                             head_holdout=4, batch_size=3)
    held.setup("fit")
    cnn = torch.cat([b["cells"] for b in held.train_dataloader()])
    head = next(iter(held.bcfw_dataloader()))["cells"]
    assert len(cnn) == 6 and torch.equal(head, f["cells"][6:])
    assert sorted(map(tuple, cnn.reshape(6, -1).tolist())) == sorted(map(tuple, f["cells"][:6].reshape(6, -1).tolist()))
    with pytest.raises(ValueError, match="no image"):
        LSPPoseDataModule(str(LSP_ROOT), size=64, grid_size=16, limit=10, test_limit=4, cache_dir=str(tmp_path),
                          head_holdout=10).setup("fit")
    # holdout: the last images are the validation split, out of both trainings (and of bcfw_val_dataloader)
    with pytest.raises(ValueError, match="no validation split"):
        again.bcfw_val_dataloader()
    val = LSPPoseDataModule(str(LSP_ROOT), size=64, grid_size=16, limit=10, test_limit=4, cache_dir=str(tmp_path),
                            holdout=3, head_holdout=2)
    val.setup("fit")
    assert len(val.train) == 7 and len(val.val) == 3
    assert torch.equal(next(iter(val.bcfw_val_dataloader()))["joints"], again.train.fields["joints"][7:])
    assert torch.equal(next(iter(val.bcfw_dataloader()))["joints"], again.train.fields["joints"][5:7])
    with pytest.raises(ValueError, match="no training image"):
        LSPPoseDataModule(str(LSP_ROOT), size=64, grid_size=16, limit=10, test_limit=4, cache_dir=str(tmp_path),
                          holdout=10).setup("fit")


@pytest.mark.parametrize("type_features", [False, True])
def test_cnn_with_a_mixture_tree_head_trains_end_to_end_on_lsp(tmp_path, type_features: bool) -> None:
    from torch_bcfw.tasks.pose import PoseTreeCNN

    K = 3
    dm = _lsp(tmp_path, limit=24, test_limit=8, batch_size=8, eval_batch_size=12, n_types=K)
    assert dm.type_offsets.shape == (13, K, 2) and dm.type_scales.shape == (13, K, 2)
    assert dm.head_offsets is dm.type_offsets and dm.train.fields["types"].shape == (24, 13)
    assert int(dm.train.fields["types"].max()) < K
    model = PoseTreeCNN(size=32, stem=4, width=8, dilations=(1, 2), n_types=K, type_features=type_features)
    cb = BCFWCallback(lam=0.1, every_n_epochs=1, passes_per_call=3, initial_passes=0, solver_options={"seed": 0})
    trainer = _trainer(tmp_path, [cb])
    trainer.fit(model, datamodule=dm)
    head = model.head.model
    assert head.n_types == K and torch.equal(head.mu, dm.type_offsets) and head.type_features == type_features
    assert cb.calls == 1 and cb.last_record.gap >= 0 and cb.last_data.types is not None
    if type_features:  # the head sees the CNN's edge-type maps and weighs them
        assert cb.last_data.type_unary.shape == (24, 13, K, 2, 8, 8)
        assert float(head.type_feature_weights(model.head.w).abs().sum()) > 0
    else:
        assert cb.last_data.type_unary is None
    assert bool((model.head.w[head.quadratic_index()] >= 0).all()) and float(model.head.w.abs().sum()) > 0
    trainer.test(model, datamodule=dm, verbose=False)
    res = model.test_results
    assert 0.0 <= res["test/pck_tree"] <= 1.0 and 0.0 <= res["test/task_loss_tree"] <= 1.0
    d = res["test/pck_tree_minus_argmax"]
    assert d == pytest.approx(res["test/pck_tree"] - res["test/pck_argmax"], abs=1e-6)
    assert res["test/pck_tree_minus_argmax_low"] <= d <= res["test/pck_tree_minus_argmax_high"]
    with pytest.raises(ValueError, match="types per edge"):
        other = PoseTreeCNN(size=32, stem=4, width=8, dilations=(1, 2))
        _trainer().fit(other, datamodule=dm)


def test_cross_fitted_cnn_maps_every_image_by_its_out_of_fold_net_and_tests_with_the_ensemble() -> None:
    from torch_bcfw.tasks.pose import CrossFittedCNN

    torch.manual_seed(0)
    cnn = CrossFittedCNN(3, 14, 4, 8, (1, 2), grid_size=8).eval()
    images, folds = torch.rand(5, 3, 32, 32), torch.tensor([2, 0, 1, 0, 2])
    with torch.no_grad():
        each = torch.stack([log_heatmaps(net(images)) for net in cnn.nets])  # [K, B, J, G, G]
        oof = cnn(images, folds)
        ens = cnn(images)
    torch.testing.assert_close(oof, each[folds, torch.arange(5)])
    # the ensemble is the log of the mean probability: a normalised map, between the nets' own maps
    torch.testing.assert_close(ens.exp(), each.exp().mean(0))
    torch.testing.assert_close(ens.exp().sum((-2, -1)), torch.ones(5, 14))
    assert not torch.allclose(each[0], each[1])  # the nets are initialised independently
    with pytest.raises(ValueError, match="folds"):
        cnn(images, torch.tensor([0, 1, 2, 3, 0]))
    with pytest.raises(ValueError, match="folds"):
        cnn(images, torch.tensor([0, 1]))
    with pytest.raises(ValueError, match="n_folds >= 2"):
        CrossFittedCNN(1)


def test_type_maps_are_normalised_per_cell_and_ensembled_like_the_heatmaps() -> None:
    from torch_bcfw.tasks.pose import CrossFittedCNN, log_maps

    torch.manual_seed(1)
    E, K, G = 13, 3, 8
    logits = torch.randn(2, 14 + 2 * E * K, G, G)
    logp, logq = log_maps(logits, 14, E, K)
    assert logp.shape == (2, 14, G, G) and logq.shape == (2, E, K, 2, G, G)
    torch.testing.assert_close(logp.exp().sum((-2, -1)), torch.ones(2, 14))
    torch.testing.assert_close(logq.exp().sum(2), torch.ones(2, E, 2, G, G))  # a distribution over types per cell
    # channel 14 + (2 e + s) K + k is type k of edge e seen from side s (0: child, 1: parent)
    e, s_, k = 5, 1, 2
    manual = torch.log_softmax(logits[:, 14 + (2 * e + s_) * K : 14 + (2 * e + s_ + 1) * K], dim=1)[:, k]
    torch.testing.assert_close(logq[:, e, k, s_], manual)
    assert log_maps(logits[:, :14])[1] is None
    with pytest.raises(ValueError, match="channels"):
        log_maps(logits, 14, E, 2)
    cnn = CrossFittedCNN(2, 14, 4, 8, (1,), grid_size=G, type_maps=(E, K)).eval()
    images, folds = torch.rand(3, 3, 32, 32), torch.tensor([1, 0, 1])
    with torch.no_grad():
        each = [log_maps(net(images), 14, E, K) for net in cnn.nets]
        oof_p, oof_q = cnn.maps(images, folds)
        _ens_p, ens_q = cnn.maps(images)
    torch.testing.assert_close(oof_q, torch.stack([each[int(f)][1][i] for i, f in enumerate(folds)]))
    torch.testing.assert_close(oof_p, cnn(images, folds))
    torch.testing.assert_close(ens_q.exp(), (each[0][1].exp() + each[1][1].exp()) / 2)


def test_the_type_loss_trains_the_type_channels_only_with_type_features(tmp_path) -> None:
    from torch_bcfw.tasks.pose import PoseTreeCNN

    dm = _lsp(tmp_path, limit=8, test_limit=4, batch_size=8, n_types=2)
    batch = next(iter(dm.train_dataloader()))
    losses = {}
    for w in (0.0, 1.0):
        torch.manual_seed(0)
        model = PoseTreeCNN(size=32, stem=4, width=8, dilations=(1,), n_types=2, type_features=True, type_weight=w,
                            max_shift=0, flip=False)
        model.head.set_offsets(dm.head_offsets, dm.head_scales)
        model.log = lambda *a, **k: None
        loss = model.training_step(batch, 0)
        loss.backward()
        grad = model.backbone.out.weight.grad[14:]  # the type channels
        losses[w] = (float(loss.detach()), float(grad.abs().sum()))
    assert losses[0.0][1] == 0.0 and losses[1.0][1] > 0  # type channels learn from the type loss only
    assert losses[1.0][0] > losses[0.0][0] > 0  # the type cross-entropy adds to the heatmap loss
    with pytest.raises(ValueError, match="n_types >= 2"):
        PoseTreeCNN(size=32, type_features=True)


def test_cross_fitted_pose_model_never_trains_a_cnn_on_its_own_fold(tmp_path) -> None:
    from torch_bcfw.tasks.pose import CrossFittedCNN, PoseTreeCNN

    K = 3
    dm = _lsp(tmp_path, limit=12, test_limit=6, batch_size=6, eval_batch_size=12, cross_fit=K)
    assert torch.equal(dm.train.fields["fold"], torch.arange(12) % K) and "fold" not in dm.test.fields
    model = PoseTreeCNN(size=32, stem=4, width=8, dilations=(1, 2), cross_fit=K, max_shift=0, flip=False)
    assert isinstance(model.backbone, CrossFittedCNN) and model.backbone.n_folds == K
    # a batch of fold-1 images only: the loss moves CNNs 0 and 2, never CNN 1
    batch = next(iter(torch.utils.data.DataLoader(torch.utils.data.Subset(dm.train, [1, 4, 7, 10]), batch_size=4)))
    model.log = lambda *a, **k: None  # no trainer attached
    model.training_step(batch, 0).backward()
    grads = [sum(float(p.grad.abs().sum()) for p in net.parameters() if p.grad is not None)
             for net in model.backbone.nets]
    assert grads[1] == 0.0 and grads[0] > 0 and grads[2] > 0
    # the head's features are out-of-fold; test images get the ensemble
    model.eval()
    full = next(iter(dm.bcfw_dataloader()))
    with torch.no_grad():
        feats = model.bcfw_features(full).unary[:, :, 0]
        for i in range(12):
            k = int(full["fold"][i])
            torch.testing.assert_close(feats[i], log_heatmaps(model.backbone.nets[k](full["image"][i:i + 1]))[0])
    with pytest.raises(ValueError, match="'fold'"):
        model.bcfw_features({k: v for k, v in full.items() if k != "fold"})
    # end to end: the callback solves the head on the out-of-fold heatmaps, test reports the ensemble
    model.train()
    cb = BCFWCallback(lam=0.1, every_n_epochs=1, passes_per_call=3, initial_passes=0, solver_options={"seed": 0})
    trainer = _trainer(tmp_path, [cb])
    trainer.fit(model, datamodule=dm)
    assert cb.calls == 1 and len(cb.last_data.unary) == 12 and cb.last_record.gap >= 0
    trainer.test(model, datamodule=dm, verbose=False)
    assert 0.0 <= model.test_results["test/pck_tree"] <= 1.0
    # the datamodule and the model must agree on the folds; cross-fitting and a head hold-out exclude each other
    with pytest.raises(ValueError, match="cross_fit"):
        _trainer().fit(PoseTreeCNN(size=32, stem=4, width=8, dilations=(1, 2)), datamodule=dm)
    with pytest.raises(ValueError, match="exclude"):
        LSPPoseDataModule(str(LSP_ROOT), limit=12, cross_fit=2, head_holdout=3)
    with pytest.raises(ValueError, match="at least"):
        LSPPoseDataModule(str(LSP_ROOT), size=32, grid_size=8, limit=2, test_limit=2, cache_dir=str(tmp_path),
                          cross_fit=3).setup("fit")
