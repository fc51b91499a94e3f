"""Config class paths: the tasks live in torch_bcfw.tasks; the torch_bcfw.lightning.* paths name the same classes."""
from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

pl = pytest.importorskip("lightning.pytorch")

from torch_bcfw.lightning import BCFWCallback  # noqa: E402
from torch_bcfw.lightning.cli import TrainCLI  # noqa: E402
from torch_bcfw.tasks.ocr import OCRChainCNN, OCRWordsDataModule  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]

#: module of a config class path -> (the module that defines its classes, the names it must give)
ALIASES = {
    "torch_bcfw.lightning.ocr": ("torch_bcfw.tasks.ocr", ["LetterCNN", "OCRChainCNN", "OCRWordsDataModule"]),
    "torch_bcfw.lightning.conll": ("torch_bcfw.tasks.conll", ["ConllChainTagger", "ConllChunkingDataModule",
                                                              "ConllVocab", "TokenEncoder"]),
    "torch_bcfw.lightning.horses": ("torch_bcfw.tasks.horses", ["GraphCutHead", "HorseSegmenter", "HorsesDataModule",
                                                                "SegmentationFCN"]),
    "torch_bcfw.lightning.pose": ("torch_bcfw.tasks.pose", ["CrossFittedCNN", "HeatmapCNN", "PoseHead", "PoseTreeCNN"]),
    "torch_bcfw.lightning.pose_data": ("torch_bcfw.tasks.lsp_data", ["LSPPoseDataModule", "augment_batch"]),
}


@pytest.mark.parametrize("old", sorted(ALIASES))
def test_lightning_class_paths_name_the_task_classes(old) -> None:
    new, names = ALIASES[old]
    old_mod, new_mod = importlib.import_module(old), importlib.import_module(new)
    for name in names:
        assert getattr(old_mod, name) is getattr(new_mod, name), name
        assert name in old_mod.__all__ and name in new_mod.__all__


def test_the_task_callbacks_are_the_one_callback() -> None:
    from torch_bcfw.lightning.horses import GraphBCFWCallback
    from torch_bcfw.lightning.pose import PoseBCFWCallback

    assert GraphBCFWCallback is BCFWCallback and PoseBCFWCallback is BCFWCallback


def _cli(args, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["torch-bcfw train"])
    return TrainCLI(model_class=pl.LightningModule, datamodule_class=pl.LightningDataModule, subclass_mode_model=True,
                    subclass_mode_data=True, run=False, args=args, seed_everything_default=0)


def test_a_config_with_lightning_class_paths_parses(tmp_path, monkeypatch) -> None:
    cfg = tmp_path / "old_paths.yaml"
    cfg.write_text(f"""\
seed_everything: 0
trainer:
  accelerator: cpu
  logger: false
  enable_checkpointing: false
  enable_progress_bar: false
  default_root_dir: {tmp_path}
  callbacks:
    - class_path: torch_bcfw.lightning.horses.GraphBCFWCallback
      init_args: {{lam: 0.01, passes_per_call: 2}}
model:
  class_path: torch_bcfw.lightning.ocr.OCRChainCNN
  init_args: {{feature_dim: 8, channels: [4, 8]}}
data:
  class_path: torch_bcfw.lightning.ocr.OCRWordsDataModule
  init_args: {{path: {tmp_path}, limit: 5}}
""")
    cli = _cli(["--config", str(cfg)], monkeypatch)
    assert type(cli.model) is OCRChainCNN and type(cli.datamodule) is OCRWordsDataModule
    solvers = [c for c in cli.trainer.callbacks if isinstance(c, BCFWCallback)]
    assert [type(c) for c in solvers] == [BCFWCallback] and solvers[0].lam == 0.01


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
    """Besides the callback and the CLI, ``torch_bcfw.lightning`` only names classes defined elsewhere."""
    import ast

    import torch_bcfw

    for path in sorted((Path(torch_bcfw.__file__).parent / "lightning").glob("*.py")):
        if path.stem in ("__init__", "callback", "cli"):
            continue
        body = ast.parse(path.read_text(encoding="utf-8")).body
        assert all(isinstance(node, (ast.ImportFrom, ast.Assign, ast.Expr)) for node in body), path.name


def test_nn_uses_the_model_contract_only() -> None:
    import ast

    import torch_bcfw

    tree = ast.parse((Path(torch_bcfw.__file__).parent / "nn.py").read_text(encoding="utf-8"))
    imported = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert not {m for m in imported if m and m.startswith("models.") and m != "models.base"}, imported
