"""The horse segmentation pipeline (torch_bcfw.tasks.horses) end to end on a few small images."""
from __future__ import annotations

import pytest
import torch

pytest.importorskip("maxflow", reason="PyMaxflow is the optional [graphcut] dependency")
pytest.importorskip("PIL", reason="Pillow is part of the optional [graphcut] dependencies")
pl = pytest.importorskip("lightning.pytorch")

from conftest import shared_data  # noqa: E402
from torch_bcfw.data import GraphData
from torch_bcfw.lightning import BCFWCallback  # noqa: E402
from torch_bcfw.metrics.segmentation import segmentation_counts  # noqa: E402
from torch_bcfw.tasks.horses import HorseSegmenter, HorsesDataModule, SegmentationFCN  # noqa: E402
from torch_bcfw.duals.graphcut import GraphCutDualState  # noqa: E402


def test_fcn_shapes_and_normalisation():
    net = SegmentationFCN(3, feature_dim=6, width=4)
    f = net(torch.rand(2, 3, 16, 24))
    assert f.shape == (2, 6, 16, 24)
    torch.testing.assert_close(f.mean(1), torch.zeros(2, 16, 24), atol=1e-5, rtol=0)


def test_segmentation_counts():
    pred = torch.tensor([[[1, 1], [0, 0]]])
    truth = torch.tensor([[[1, 0], [1, 0]]])
    assert segmentation_counts(pred, truth).tolist() == [[1, 1, 1, 1]]


@pytest.fixture(scope="module")
def fitted(tmp_path_factory):
    torch.manual_seed(0)
    pl.seed_everything(0)
    dm = HorsesDataModule(str(shared_data("weizmann_horse")), size=(16, 24), batch_size=4, eval_batch_size=10, limit=8)
    model = HorseSegmenter(feature_dim=4, width=4, processes=1)
    opts = {"step": "line_search", "averaging": True, "seed": 0}
    cbs = [BCFWCallback(lam=0.01, head_attr="head", name="potts", log_prefix="ssvm", passes_per_call=3,
                             initial_passes=0, solver_options=opts),
           BCFWCallback(lam=0.01, head_attr="head_unary", name="unary", log_prefix="ssvm_unary",
                             passes_per_call=3, initial_passes=0, solver_options=opts)]
    trainer = pl.Trainer(accelerator="cpu", max_epochs=2, callbacks=cbs, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
                         limit_val_batches=1, default_root_dir=tmp_path_factory.mktemp("horses"))
    trainer.fit(model, datamodule=dm)
    test = trainer.test(model, dataloaders=torch.utils.data.DataLoader(
        torch.utils.data.Subset(dm.splits["test"], range(10)), batch_size=5), verbose=False)[0]
    return model, dm, cbs, trainer, test


def test_callbacks_solve_both_heads_with_the_constraint(fitted):
    model, dm, cbs, trainer, test = fitted
    potts, unary = cbs
    assert potts.calls == 2 and unary.calls == 2
    assert model.head.w.shape == (5 + 2,) and model.head_unary.w.shape == (5,)
    assert bool((model.head.w[-2:] >= 0).all())
    for cb in cbs:
        rec = cb.last_record
        assert rec.gap >= -1e-12 and rec.gap <= rec.primal + 1e-12
        assert cb.dual_sd["kind"] == "GraphCutDualState"
    for key in ("test/cnn_iou", "test/unary_iou", "test/potts_iou", "test/potts_acc", "test/cnn_miou"):
        assert 0.0 <= test[key] <= 1.0
    assert all(cb.figures(cb.last_record)["gap"] == cb.last_record.gap for cb in cbs)


def test_callback_state_round_trip_rebinds_exactly(fitted):
    model, dm, cbs, trainer, _ = fitted
    potts = cbs[0]
    data = potts.training_data(trainer, model)
    assert isinstance(data, GraphData) and len(data) == 8 and data.x.dtype == torch.float64
    clone = BCFWCallback(lam=0.01, head_attr="head", name="potts", log_prefix="ssvm", passes_per_call=3,
                         initial_passes=0, solver_options={"step": "line_search", "averaging": True, "seed": 0})
    clone.load_state_dict(potts.state_dict())
    state = clone._dual_state(model.head.model, data, clone.lam, clone.dual_sd)
    assert isinstance(state, GraphCutDualState) and state.has_bounds
    torch.testing.assert_close(state.v, potts.dual_sd["w"].to(torch.float64), rtol=0, atol=1e-10)
    torch.testing.assert_close(state.w, model.head.w if potts.last_record.selected == "last" else state.w)


def test_heads_decode_graphs(fitted):
    model, dm, *_ = fitted
    images, masks = dm.splits["val"][:3]
    out = model.predict_masks(images)
    assert set(out) == {"cnn", "unary", "potts"}
    for pred in out.values():
        assert pred.shape == masks.shape and set(pred.unique().tolist()) <= {0, 1}
    with pytest.raises(TypeError, match="GraphData"):
        model.head(images)


def test_horses_registry_builds_pixel_feature_graphs():
    """``data: {name: horses}`` gives a GraphCut model on the pixel grid with the documented features."""
    from torch_bcfw.datasets.horses import pixel_features
    from torch_bcfw.datasets.registry import load_problem
    from torch_bcfw.models import GraphCut

    root = str(shared_data("weizmann_horse"))
    model, train, test = load_problem({"name": "horses", "path": root, "size": [12, 16], "limit": 5,
                                       "test_split": "val", "processes": 1})
    assert isinstance(model, GraphCut) and model.loss_name == "balanced"
    assert len(train) == 5 and len(test) == 28
    assert train.n_inputs == 11 and train.n_edge_inputs == 2 and model.n_inputs == 11
    assert train.lengths.tolist() == [12 * 16] * 5
    assert set(train.y.unique().tolist()) <= {0, 1} and 0 < float(train.y.double().mean()) < 1
    # node features: colour, smoothed colour, position and its square, bias (checked on one pixel)
    img = torch.rand(1, 3, 4, 5)
    f = pixel_features(img)
    assert f.shape == (1, 11, 4, 5) and torch.equal(f[0, :3], img[0].double())
    assert torch.allclose(f[0, 3:6, 1, 1], img[0, :, :4, :4].double().mean((1, 2)))
    assert float(f[0, 6, 0, 0]) == -1.0 and float(f[0, 7, 3, 4]) == 1.0 and torch.all(f[0, 10] == 1)
    with pytest.raises(ValueError, match="data.path"):
        load_problem({"name": "horses"})
