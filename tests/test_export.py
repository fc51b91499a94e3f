"""A trained head exported as plain torch modules: the files load and decode in a process where torch_bcfw cannot
be imported, with the same labels as the library's own decoder; the model file of a fit holds no dual state and is
small, and the run continues exactly from its checkpoint."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
import torch

from conftest import random_chain_problem, random_multiclass_problem, shared_data
from torch_bcfw import FitResult, fit
from torch_bcfw.export import export_head
from torch_bcfw.models import Chain, GraphCut

_DECODE_WITHOUT_THE_LIBRARY = textwrap.dedent("""
    import json, sys
    sys.modules["torch_bcfw"] = None  # any import of torch_bcfw now fails
    sys.path.insert(0, sys.argv[1])
    import torch
    from head import load_head
    head = load_head(sys.argv[1] + "/head.safetensors")
    x = torch.load(sys.argv[2], weights_only=True)
    out = head(x["x"], x["lengths"]) if "lengths" in x else head(x["x"])
    print(json.dumps(out.tolist()))
""")


def _decode_elsewhere(folder, inputs: dict, tmp_path) -> list:
    torch.save(inputs, tmp_path / "inputs.pt")
    done = subprocess.run([sys.executable, "-c", _DECODE_WITHOUT_THE_LIBRARY, str(folder), str(tmp_path / "inputs.pt")],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


def test_an_exported_chain_head_decodes_like_the_library_without_it(tmp_path):
    from torch_bcfw.datasets.ocr import load_ocr_split

    train, test = load_ocr_split(str(shared_data("ocr")), "small", 0)
    r = fit(Chain(128, 26), train, 0.1, max_passes=3, gap_check=3)
    export_head(r, tmp_path / "head")
    test = test[list(range(300))]
    labels = _decode_elsewhere(tmp_path / "head", {"x": test.x, "lengths": test.lengths}, tmp_path)
    assert labels == r.predict(test).tolist()
    # random chains of every length, against the library's decoder
    model, data = random_chain_problem(n=12, F=4, K=5, max_len=6, seed=3, min_len=1)
    r = fit(model, data, 0.05, max_passes=5)
    export_head(r, tmp_path / "toy")
    assert _decode_elsewhere(tmp_path / "toy", {"x": data.x, "lengths": data.lengths}, tmp_path) == \
        r.predict(data).tolist()


def test_the_exported_chain_head_takes_padded_words_as_the_library_head_does(tmp_path):
    """``head(x [B, T, F], lengths)`` gives ``[B, T]`` labels with -1 past each word, as ``StructuredHead``; a wrong
    layout is answered with the layouts it takes."""
    import importlib.util

    from torch_bcfw.nn import StructuredHead

    model, data = random_chain_problem(n=9, F=4, K=5, max_len=6, seed=4, min_len=1)
    r = fit(model, data, 0.05, max_passes=5)
    export_head(r, tmp_path / "toy")
    spec = importlib.util.spec_from_file_location("exported_head", tmp_path / "toy" / "head.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    head = mod.load_head(tmp_path / "toy" / "head.safetensors")
    lengths = data.lengths
    B, T = len(lengths), int(lengths.max())
    padded = torch.zeros(B, T, 4, dtype=data.x.dtype)
    padded[torch.arange(T)[None, :] < lengths[:, None]] = data.x
    library = StructuredHead(model)
    library.set_weights(r.weights)
    assert torch.equal(head(padded, lengths), library(padded, lengths=lengths))
    assert torch.equal(head(padded, lengths)[torch.arange(T)[None, :] < lengths[:, None]], r.predict(data))
    full = padded[:, :2]
    assert torch.equal(head(full), library(full))  # no lengths: every word of length T
    with pytest.raises(ValueError, match=r"packed tokens \[N_tok, 4\].*padded words \[B, T, 4\]"):
        head(padded[..., :3], lengths)
    with pytest.raises(ValueError, match="need lengths"):
        head(data.x)


@pytest.mark.parametrize("table_entries", [0, 7 * 7 * 3, 10 ** 9], ids=["one-word-chunks", "three-word-chunks", "one-table"])
def test_the_exported_viterbi_decodes_like_the_library_in_any_chunking(monkeypatch, table_entries):
    from torch_bcfw.io import standalone_head

    model, data = random_chain_problem(n=40, F=6, K=7, max_len=9, seed=5, min_len=1)
    r = fit(model, data, 0.01, max_passes=4)
    emission, bias, start, end, trans = model.unpack(r.weights)
    head = standalone_head.ChainHead(emission, bias, start, end, trans)
    monkeypatch.setattr(standalone_head, "MOVE_TABLE_ENTRIES", table_entries)
    assert torch.equal(head(data.x, data.lengths), r.predict(data))


def test_an_exported_multiclass_head_and_the_refused_models(tmp_path):
    model, data = random_multiclass_problem(n=30, F=5, K=4, seed=2)
    r = fit(model, data, 0.05, max_passes=5)
    export_head(r, tmp_path / "mc")
    assert _decode_elsewhere(tmp_path / "mc", {"x": data.x}, tmp_path) == r.predict(data).tolist()
    with pytest.raises(ValueError, match="supports Chain and Multiclass heads, not GraphCut"):
        export_head(type("R", (), {"model": GraphCut(3, 2), "weights": torch.zeros(GraphCut(3, 2).n_features)})(),
                    tmp_path / "gc")


def test_the_model_file_holds_no_state_and_the_checkpoint_continues_exactly(tmp_path):
    """``torch-bcfw fit`` writes a small model.safetensors (what prediction needs) and the full state to checkpoint.safetensors;
    --resume continues from the checkpoint as one uninterrupted run would; ``export`` writes the head."""
    from torch_bcfw.cli import main

    cfg = tmp_path / "ocr.yaml"
    cfg.write_text(f"data: {{name: ocr, path: {shared_data('ocr')}, split: large, fold: 0}}\nlam: 0.01\n"
                   "options: {max_passes: 4, gap_check: 2}\n")
    whole, part = tmp_path / "whole", tmp_path / "part"
    assert main(["fit", "--config", str(cfg), "--quiet", "--output", str(whole), "--set", "options.max_passes=6"]) == 0
    assert main(["fit", "--config", str(cfg), "--quiet", "--output", str(part)]) == 0
    model_file = FitResult.load(part / "model.safetensors")
    assert not model_file.has_state and FitResult.load(part / "checkpoint.safetensors").has_state
    size, full = (part / "model.safetensors").stat().st_size, (part / "checkpoint.safetensors").stat().st_size
    assert size < 200_000 < full, (size, full)  # OCR-large: weights and history, not the 6251-word dual state
    with pytest.raises(ValueError, match="holds no dual state"):
        fit(model_file.model, None, 0.01, init=model_file)
    assert main(["fit", "--resume", str(part), "--quiet", "--set", "options.max_passes=6"]) == 0
    a, b = FitResult.load(whole / "model.safetensors"), FitResult.load(part / "model.safetensors")
    assert torch.equal(a.w, b.w) and torch.equal(a.w_avg, b.w_avg) and a.gap == b.gap
    assert main(["export", "--model", str(part / "model.safetensors"), "--output", str(tmp_path / "deploy")]) == 0
    assert (tmp_path / "deploy" / "head.safetensors").is_file() and (tmp_path / "deploy" / "head.py").is_file()


def test_a_lightning_checkpoint_and_a_structured_head_export(tmp_path, capsys):
    """``torch-bcfw export`` reads a Lightning ``.ckpt`` written with a BCFWCallback (through the pickle checks: the
    head's model from the callback's record, its weights from the state_dict); a StructuredHead exports directly to
    the same bytes; both decode like the module's head without torch_bcfw."""
    pytest.importorskip("lightning")
    import lightning.pytorch as pl

    from torch_bcfw.cli import main
    from torch_bcfw.lightning import BCFWCallback
    from torch_bcfw.nn import StructuredHead

    _, raw = random_chain_problem(n=10, F=4, K=3, max_len=4, seed=2)

    class Tagger(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.backbone = torch.nn.Linear(4, 3).double()
            self.tagger = StructuredHead(Chain(3, 3))

        def train_dataloader(self):
            return torch.utils.data.DataLoader([(raw.x, raw.y, raw.offsets)], batch_size=None)

        bcfw_dataloader = train_dataloader

        def bcfw_features(self, batch):
            return self.backbone(batch[0]), batch[1], batch[2]

        def training_step(self, batch, _):
            return (self.backbone(batch[0]) ** 2).mean()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    module = Tagger()
    trainer = pl.Trainer(max_epochs=1, callbacks=[BCFWCallback(lam=0.1, head_attr="tagger", passes_per_call=3)],
                         logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, default_root_dir=tmp_path)
    trainer.fit(module)
    trainer.save_checkpoint(tmp_path / "last.ckpt")
    assert main(["export", "--model", str(tmp_path / "last.ckpt"), "--output", str(tmp_path / "ckpt_head")]) == 0
    assert "head 'tagger' of the Lightning checkpoint" in capsys.readouterr().out
    with torch.no_grad():
        feats = module.backbone(raw.x)
    expected = module.tagger(feats, offsets=raw.offsets).tolist()
    inputs = {"x": feats, "lengths": raw.lengths}
    assert _decode_elsewhere(tmp_path / "ckpt_head", inputs, tmp_path) == expected
    export_head(module.tagger, tmp_path / "module_head")  # the same file as the checkpoint's
    from_ckpt, from_module = ((tmp_path / d / "head.safetensors").read_bytes() for d in ("ckpt_head", "module_head"))
    assert from_ckpt == from_module and b'"kind":"chain"' in from_ckpt
    # a checkpoint without a BCFWCallback's record: one line that says so
    ckpt = torch.load(tmp_path / "last.ckpt", weights_only=True)
    del ckpt["torch_bcfw_heads"]
    torch.save(ckpt, tmp_path / "plain.ckpt")
    assert main(["export", "--model", str(tmp_path / "plain.ckpt"), "--output", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "records no torch_bcfw head" in err[0]
