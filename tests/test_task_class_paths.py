"""Config class paths: the tasks live in torch_bcfw.tasks, the Lightning integration in torch_bcfw.lightning."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

pl = pytest.importorskip("lightning.pytorch")

from torch_bcfw.lightning import BCFWCallback  # noqa: E402
from torch_bcfw.lightning.cli import TrainCLI  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def _cli(args, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["torch-bcfw train"])
    return TrainCLI(model_class=pl.LightningModule, datamodule_class=pl.LightningDataModule, subclass_mode_model=True,
                    subclass_mode_data=True, run=False, args=args, seed_everything_default=0)


@pytest.mark.parametrize("config", ["ocr_cnn.yaml", "conll_embeddings.yaml", "horses.yaml", "pose_lsp.yaml"])
def test_the_lightning_configs_parse(config, tmp_path, monkeypatch) -> None:
    text = (ROOT / "configs" / config).read_text()
    assert "torch_bcfw.tasks." in text and "torch_bcfw.lightning.BCFWCallback" in text
    cli = _cli(["--config", str(ROOT / "configs" / config), "--trainer.logger=false",
                f"--trainer.default_root_dir={tmp_path}"], monkeypatch)
    assert type(cli.model).__module__.startswith("torch_bcfw.tasks.")
    assert type(cli.datamodule).__module__.startswith("torch_bcfw.tasks.")
    assert all(type(c) is BCFWCallback for c in cli.trainer.callbacks if isinstance(c, BCFWCallback))


def test_lightning_holds_the_integration_only() -> None:
    """``torch_bcfw.lightning`` is the callback, its held-out choice of ``lam``, the sampler that makes a resume replay
    the batches, and the command line; the tasks' classes live in ``torch_bcfw.tasks`` only (config class paths name them there)."""
    import torch_bcfw

    modules = sorted(p.stem for p in (Path(torch_bcfw.__file__).parent / "lightning").glob("*.py"))
    assert modules == ["__init__", "callback", "cli", "lam_choice", "sampler"]


def test_nn_uses_the_model_contract_only() -> None:
    import ast

    import torch_bcfw

    tree = ast.parse((Path(torch_bcfw.__file__).parent / "nn.py").read_text(encoding="utf-8"))
    imported = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert not {m for m in imported if m and m.startswith("models.") and m != "models.base"}, imported
