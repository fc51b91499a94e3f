"""The LSP pose splits as plain torch: importable without Lightning, and the same tensors as the Lightning
datamodule."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
LSP_ROOT = ROOT.parent / "shared" / "data" / "lspet"


def test_lsp_tensors_and_vision_import_without_lightning() -> None:
    code = ("import sys\n"
            "sys.modules['lightning'] = None\n"
            "sys.modules['lightning.pytorch'] = None\n"
            "sys.modules['pytorch_lightning'] = None\n"
            "import torch_bcfw.datasets.lsp_tensors as m\n"
            "import torch_bcfw.vision\n"
            "assert {'LSPPoseSplits', 'PoseTensors', 'augment_batch'} <= set(dir(m))\n"
            "try:\n"
            "    import torch_bcfw.tasks.lsp_data\n"
            "except ImportError:\n"
            "    pass\n"
            "else:\n"
            "    raise AssertionError('lightning was not blocked')\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                          timeout=300, check=False)
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("kwargs", [{}, {"n_types": 2, "holdout": 2, "cross_fit": 2}, {"head_holdout": 2}],
                         ids=["plain", "types-holdout-folds", "head-holdout"])
def test_splits_match_the_lightning_datamodule(tmp_path, kwargs) -> None:
    pl = pytest.importorskip("lightning.pytorch")
    from torch_bcfw.datasets.lsp_tensors import LSPPoseSplits, PoseTensors
    from torch_bcfw.tasks.lsp_data import LSPPoseDataModule

    if not (LSP_ROOT / "joints.mat").is_file():
        pytest.fail(f"LSP Extended data missing at {LSP_ROOT}")
    args = dict(root=str(LSP_ROOT), size=32, grid_size=8, limit=8, test_limit=3, deformation_scale=3.0, seed=1,
                **kwargs)
    plain = LSPPoseSplits(**args, cache_dir=str(tmp_path / "plain"))
    dm = LSPPoseDataModule(**args, cache_dir=str(tmp_path / "dm"))
    assert isinstance(dm, LSPPoseSplits) and isinstance(dm, pl.LightningDataModule)
    assert not isinstance(plain, pl.LightningDataModule)
    plain.setup()
    dm.setup("fit")
    for name in ("train", "test", "val"):
        a, b = getattr(plain, name), getattr(dm, name)
        if a is None:
            assert b is None and name == "val" and not kwargs.get("holdout")
            continue
        assert isinstance(a, PoseTensors) and isinstance(b, PoseTensors) and len(a) == len(b)
        assert a.fields.keys() == b.fields.keys()
        for k in a.fields:
            assert torch.equal(a.fields[k], b.fields[k]) or (
                a.fields[k].is_floating_point() and torch.equal(a.fields[k].isnan(), b.fields[k].isnan())
                and torch.equal(a.fields[k].nan_to_num(), b.fields[k].nan_to_num())), (name, k)
    assert len(plain.train) == 8 - kwargs.get("holdout", 0) and len(plain.test) == 3
    assert plain.mean_offsets.shape == plain.offset_scales.shape == (13, 2)
    for name in ("mean_offsets", "offset_scales", "type_offsets", "type_scales", "head_offsets", "head_scales"):
        a, b = getattr(plain, name), getattr(dm, name)
        assert (a is None and b is None) or torch.equal(a, b), name
    assert plain.reference_torso == dm.reference_torso
    if kwargs.get("n_types", 1) > 1:
        assert plain.head_offsets.shape == (13, 2, 2) and "types" in plain.train.fields
    split_a, split_b = plain._split(head=True), dm._split(head=True)
    assert len(split_a) == len(split_b) == (kwargs.get("head_holdout") or len(plain.train))
    # the constructor checks are the datamodule's
    for bad in ({"size": 33}, {"deformation_scale": 0.0}, {"n_types": 0}, {"cross_fit": 2, "head_holdout": 1}):
        for cls in (LSPPoseSplits, LSPPoseDataModule):
            with pytest.raises(ValueError):
                cls(**{**args, **bad})


def test_mirrored_cells_are_the_cells_of_the_mirrored_joints():
    """One mirror rule for frame joints and grid cells: the cells of ``mirror_joints`` are ``mirror_cells``."""
    from torch_bcfw.datasets.lsp import FLIP_PERMUTATION, joints_to_grid, mirror_cells, mirror_joints

    gen = torch.Generator().manual_seed(0)
    S, G = 64, 16
    joints = torch.rand(5, 14, 2, generator=gen, dtype=torch.float64) * S
    visible = torch.rand(5, 14, generator=gen) < 0.8
    cells = joints_to_grid(joints, S, G).round().clamp(0, G - 1).long()
    mj, mv = mirror_joints(joints, visible, S)
    assert torch.equal(mv, visible[:, list(FLIP_PERMUTATION)])
    torch.testing.assert_close(mirror_joints(mj, mv, S)[0], joints)  # an involution
    mirrored = joints_to_grid(mj, S, G).round().clamp(0, G - 1).long()
    assert torch.equal(mirror_cells(cells, G), mirrored)
