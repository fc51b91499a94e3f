"""The CoNLL-2000 embedding route: vocabulary, packed token features, BCFW head end to end, chunk F1, errors."""
import json
import os
from pathlib import Path

import pytest

pytest.importorskip("lightning", reason="the [lightning] extra is not installed")

import lightning.pytorch as pl
import torch
from conftest import shared_data

from torch_bcfw.datasets.conll import Sentence
from torch_bcfw.datasets.conll_chain import chunk_f1_from_ids
from torch_bcfw.lightning import BCFWCallback, collect_features
from torch_bcfw.tasks.conll import (
    ChunkBatch,
    ConllChainTagger,
    ConllChunkingDataModule,
    ConllVocab,
    TokenEncoder,
    pack_sentences,
)
from torch_bcfw.duals import ChainDualState
from torch_bcfw.certificate import certify

ROOT = Path(__file__).resolve().parents[1]
SMALL = {"word_dim": 8, "pos_dim": 4, "char_dim": 4, "char_channels": 6, "hidden": 8, "feature_dim": 6, "dropout": 0.1}
LAM = 0.1


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Small models: one torch thread is as fast, and robust on a CPU shared with other jobs."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _data(limit=100, test_limit=40, **kw):
    dm = ConllChunkingDataModule(path=str(shared_data("conll2000")), batch_size=16, eval_batch_size=32,
                                 limit=limit, test_limit=test_limit, **kw)
    dm.setup()
    return dm


def _trainer(root, callbacks, epochs=1):
    return pl.Trainer(accelerator="cpu", devices=1, max_epochs=epochs, callbacks=callbacks, logger=False,
                      enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                      num_sanity_val_steps=0, default_root_dir=root)


def test_vocabulary():
    s = [Sentence(["The", "cat", "sat", "1999"], ["DT", "NN", "VBD", "CD"], ["B-NP", "I-NP", "B-VP", "B-NP"]),
         Sentence(["the", "Cat", "ran", "2001"], ["DT", "NN", "VBD", "CD"], ["B-NP", "I-NP", "B-VP", "B-NP"])]
    v = ConllVocab.fit(s, min_word_count=2)
    assert v.words == ["0000", "cat", "the"]  # lower-cased, digits -> 0, seen >= 2 times; sat / ran once
    w, p, c = v.encode(Sentence(["THE", "dog", "sat", "42"], ["DT", "NN", "VBD", "XX"], ["O"] * 4))
    assert w.tolist() == [v.word_ids["the"], 1, 1, 1]  # dog unseen, sat seen once, 42 -> 00 unseen: <unk>
    assert p.tolist() == [v.pos_ids["DT"], v.pos_ids["NN"], v.pos_ids["VBD"], 1]
    assert c.shape == (4, 3) and c[3, 2] == 0  # "42" padded to the longest word
    # characters keep their case: "T" was seen in training, "H", "E" and "d" were not
    assert c[0].tolist() == [v.char_ids["T"], 1, 1] and c[1, 0] == 1
    assert c[2].tolist() == [v.char_ids[ch] for ch in "sat"]
    assert (v.n_words, v.n_pos) == (5, 6)
    v2 = ConllVocab.from_state_dict(v.state_dict())
    assert torch.equal(v2.encode(s[0])[0], v.encode(s[0])[0])


@pytest.mark.parametrize("encoder", ["bilstm", "cnn"])
def test_packed_features_have_the_right_shapes_and_do_not_mix_sentences(encoder):
    dm = _data(limit=30, test_limit=5)
    torch.manual_seed(0)
    module = ConllChainTagger(encoder=encoder, layers=2, **SMALL)
    module.build(dm.vocab)
    module.eval()
    batch = next(iter(dm.bcfw_dataloader()))
    assert isinstance(batch, ChunkBatch)
    n_tok = sum(len(s) for s in dm.train_sentences)
    with torch.no_grad():
        x, y, offsets = module.bcfw_features(batch)
    assert x.shape == (n_tok, SMALL["feature_dim"]) and x.dtype == torch.float32
    assert y.shape == (n_tok,) and offsets.shape == (31,) and int(offsets[-1]) == n_tok
    assert torch.equal(offsets[1:] - offsets[:-1], torch.tensor([len(s) for s in dm.train_sentences]))
    assert bool(torch.isfinite(x).all())
    # layer-normalised, no affine: every token has mean 0 and norm sqrt(F)
    assert torch.allclose(x.mean(1), torch.zeros(n_tok), atol=1e-5)
    assert torch.allclose(x.norm(dim=1), torch.full((n_tok,), SMALL["feature_dim"] ** 0.5), atol=0.01)  # LayerNorm eps
    # a sentence's features do not depend on its batch mates (packing, padding and masking are exact)
    for i in (0, 7, 29):
        alone = pack_sentences([dm.train[i]])
        with torch.no_grad():
            xi = module.features(alone)
        a, b = int(offsets[i]), int(offsets[i + 1])
        assert torch.allclose(xi, x[a:b], atol=1e-5)
    # and they do depend on the context (the encoder sees the sentence, not one token)
    s = dm.train[0]
    swapped = (s[0].flip(0), s[1].flip(0), s[2].flip(0), s[3].flip(0), s[4][::-1])
    with torch.no_grad():
        xs = module.features(pack_sentences([swapped])).flip(0)
    assert not torch.allclose(xs, x[: int(offsets[1])], atol=1e-3)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """One epoch on 100 sentences (an initial solve and one after the epoch)."""
    pl.seed_everything(0)
    dm = ConllChunkingDataModule(path=str(shared_data("conll2000")), batch_size=16, eval_batch_size=32, limit=100,
                                 test_limit=40)
    module = ConllChainTagger(ce_epochs=0, **SMALL)
    cb = BCFWCallback(lam=LAM, passes_per_call=3, solver_options={"seed": 1})
    trainer = _trainer(tmp_path_factory.mktemp("conll"), [cb])
    trainer.fit(module, datamodule=dm)
    logged = {k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("ssvm/")}
    return dm, module, cb, trainer, logged


@pytest.mark.heavy
def test_one_epoch_logs_the_certified_gap_at_the_final_features(trained):
    dm, module, cb, trainer, logged = trained
    assert cb.calls == 2 and module.encoder is not None
    assert module.training  # the feature pass restores the train mode
    data = collect_features(module, dm.bcfw_dataloader())
    assert len(data) == 100 and data.x.shape[1] == SMALL["feature_dim"]
    assert torch.equal(data.x, cb.last_data.x)  # the callback solved at the features the encoder gives now
    model = module.head.model
    state = ChainDualState.from_state_dict(model, data, LAM, cb.dual_sd)
    last = certify(model, data, state.w, state.ell, LAM)
    w_avg, ell_avg = state.averaged()
    avg = certify(model, data, w_avg, ell_avg, LAM)
    best = avg if avg.primal < last.primal else last
    assert torch.allclose(module.head.w, w_avg if best is avg else state.w, atol=1e-12)
    assert logged["ssvm/primal"] == pytest.approx(best.primal, abs=1e-9)
    assert logged["ssvm/dual"] == pytest.approx(max(last.dual, avg.dual), abs=1e-9)
    assert logged["ssvm/gap"] == pytest.approx(best.primal - max(last.dual, avg.dual), abs=1e-9)
    assert logged["ssvm/gap"] >= 0 and logged["ssvm/passes"] == pytest.approx(6)
    assert logged["ssvm/stale"] > 0  # the encoder moved between the two solves
    # the encoder was trained: the structured hinge was logged and the weights moved off zero
    assert "train/hinge" in trainer.callback_metrics and bool(module.head.w.abs().sum() > 0)


@pytest.mark.heavy
def test_chunk_f1_of_the_heads_predictions(trained):
    dm, module, _, trainer, _ = trained
    res = trainer.test(module, datamodule=dm, verbose=False)[0]
    test = collect_features(module, dm.test_dataloader())
    pred = module.head.model.decode(module.head.w, test)
    ref = chunk_f1_from_ids(pred, test.offsets, dm.test_sentences)
    assert res["test/f1"] == pytest.approx(ref["f1"], abs=1e-6)
    assert res["test/precision"] == pytest.approx(ref["precision"], abs=1e-6)
    assert res["test/error"] == pytest.approx(float((pred != test.y).double().mean()), abs=1e-6)
    assert 0.0 < res["test/f1"] < 1.0 and ref["n_true"] > 0


def test_bad_configuration_is_reported(tmp_path):
    with pytest.raises(ValueError, match="unknown encoder type 'gru'; choose from \\['bilstm', 'cnn'\\]"):
        ConllChainTagger(encoder="gru")
    with pytest.raises(ValueError, match="kernel_size must be odd"):
        ConllChainTagger(encoder="cnn", kernel_size=4)
    with pytest.raises(ValueError, match="dropout"):
        TokenEncoder(10, 10, 10, dropout=1.5)
    with pytest.raises(ValueError, match="feature_dim must be >= 1"):
        ConllChainTagger(feature_dim=0)
    with pytest.raises(ValueError, match="batch_size must be >= 1"):
        ConllChunkingDataModule("unused", batch_size=0)
    with pytest.raises(ValueError, match="holdout > 0 or validate_on_test"):
        ConllChunkingDataModule("unused", holdout=10, validate_on_test=True)
    with pytest.raises(ValueError, match="min_word_count must be >= 1"):
        ConllVocab.fit([Sentence(["a"], ["DT"], ["O"])], min_word_count=0)
    with pytest.raises(FileNotFoundError, match="CoNLL-2000 'train' split not found"):
        ConllChunkingDataModule(path=str(tmp_path)).setup()
    with pytest.raises(ValueError, match="leaves no training sentence"):
        _data(limit=5, holdout=5)
    module = ConllChainTagger(**SMALL)
    batch = next(iter(_data(limit=3, test_limit=2).bcfw_dataloader()))
    with pytest.raises(RuntimeError, match="not built yet"):
        module.features(batch)
    # a datamodule without a ConllVocab cannot build the encoder
    plain = pl.LightningDataModule.from_datasets(train_dataset=[batch], batch_size=None)
    with pytest.raises(ValueError, match="needs a datamodule with a ConllVocab"):
        _trainer(tmp_path, []).fit(module, datamodule=plain)


@pytest.mark.heavy
def test_train_command_runs_the_yaml_experiment_and_resumes(tmp_path):
    from torch_bcfw.cli import main
    from torch_bcfw.tasks.conll import ConllChainTagger as Tagger

    data = str(shared_data("conll2000"))
    small = [f"--model.init_args.{k}={v}" for k, v in SMALL.items()]
    cfg = (ROOT / "configs" / "conll_embeddings.yaml").read_text()
    assert "passes_per_call: 10 " in cfg and "initial_passes: 10 " in cfg
    config = tmp_path / "conll_embeddings.yaml"
    config.write_text(cfg.replace("passes_per_call: 10 ", "passes_per_call: 2 ").replace("initial_passes: 10 ",
                                                                                          "initial_passes: 2 "))
    common = ["--config", str(config), f"--data.init_args.path={data}", "--data.init_args.limit=60",
              "--data.init_args.test_limit=30", f"--trainer.default_root_dir={tmp_path}",
              f"--trainer.logger.init_args.save_dir={tmp_path}", *small]
    cwd = os.getcwd()
    os.chdir(ROOT)
    try:
        rc = main(["train", *common, "--trainer.max_epochs=1", "--test=false", f"--report={tmp_path / 'first.json'}"])
        assert rc == 0
        ckpts = sorted(tmp_path.rglob("last.ckpt"))
        assert len(ckpts) == 1
        # resume: the encoder is rebuilt from the datamodule's vocabulary before the weights are restored
        rc = main(["train", *common, "--trainer.max_epochs=2", f"--ckpt_path={ckpts[0]}",
                   f"--report={tmp_path / 'report.json'}"])
        assert rc == 0
        torch.set_num_threads(2)
        assert main(["train", *common, "--threads=0"]) == 2  # checked before anything is set or trained
        assert torch.get_num_threads() == 2
        torch.set_num_threads(1)
    finally:
        os.chdir(cwd)
    assert json.loads((tmp_path / "first.json").read_text())["ssvm/calls"] == 2
    rep = json.loads((tmp_path / "report.json").read_text())
    assert rep["epochs"] == 2 and rep["ssvm/calls"] == 3 and rep["ssvm/passes"] == pytest.approx(6)
    assert 0 <= rep["ssvm/gap"] <= rep["ssvm/primal"] and 0 <= rep["test/f1"] <= 1
    # a checkpoint alone restores the module: the vocabulary travels with it
    restored = Tagger.load_from_checkpoint(ckpts[0], weights_only=False)
    assert restored.vocab is not None and restored.encoder is not None
    assert restored.vocab.words == ConllVocab.from_state_dict(restored.vocab.state_dict()).words
