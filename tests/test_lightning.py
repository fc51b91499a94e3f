"""BCFWCallback on tiny problems: exact logged certificate, checkpoint/resume, several instances, errors."""
import json
from pathlib import Path

import pytest

pytest.importorskip("lightning", reason="the [lightning] extra is not installed")

import lightning.pytorch as pl
import torch
from conftest import (
    brute_force_primal,
    random_chain_problem,
    random_multiclass_problem,
    requires_cuda,
)
from torch import nn

from torch_bcfw.data import MulticlassData, SequenceData
from torch_bcfw.lightning import BCFWCallback
from torch_bcfw.duals import ActiveSetDualState
from torch_bcfw.models import Chain, Multiclass
from torch_bcfw.nn import StructuredHead, StructuredHingeLoss
from torch_bcfw.certificate import certify


def _batches(raw, size, order=None):
    """Packed batches (x, y, offsets) / (x, y) of ``raw`` in a fixed order."""
    idx = list(range(len(raw))) if order is None else list(order)
    out = []
    for s in range(0, len(idx), size):
        sub = raw[idx[s:s + size]]
        out.append((sub.x, sub.y, sub.offsets) if isinstance(sub, SequenceData) else (sub.x, sub.y))
    return out


class Toy(pl.LightningModule):
    """A float64 linear backbone under a chain (or multiclass) head, trained with the structured hinge."""

    def __init__(self, raw, F=3, K=3, heads=("head",), lr=0.05, shuffle_bcfw=False, seed=0):
        super().__init__()
        torch.manual_seed(seed)
        self.raw = raw
        self.seq = isinstance(raw, SequenceData)
        self.backbone = nn.Linear(raw.x.shape[1], F).double()
        self.head_names = heads
        for h in heads:
            setattr(self, h, StructuredHead(Chain(F, K) if self.seq else Multiclass(F, K)))
        self.lr = lr
        self.shuffle_bcfw = shuffle_bcfw
        self.bcfw_calls = 0
        self.val_weights = []

    def train_dataloader(self):
        return torch.utils.data.DataLoader(_batches(self.raw, 4), batch_size=None)

    def bcfw_dataloader(self):
        self.bcfw_calls += 1
        if self.shuffle_bcfw and self.bcfw_calls > 1:
            return _batches(self.raw, 4, order=reversed(range(len(self.raw))))
        return _batches(self.raw, 5)

    def bcfw_features(self, batch):
        return (self.backbone(batch[0]),) + tuple(batch[1:])

    def validation_step(self, batch, _):
        self.val_weights.append(getattr(self, self.head_names[0]).w.clone())

    def training_step(self, batch, _):
        feats = self.backbone(batch[0])
        loss = sum(StructuredHingeLoss(getattr(self, h))(feats, *batch[1:]) for h in self.head_names)
        return loss + 0.01 * (feats ** 2).mean()  # keeps the features bounded

    def configure_optimizers(self):
        return torch.optim.SGD(self.backbone.parameters(), lr=self.lr)


def _trainer(tmp_path, callbacks, epochs, accelerator="cpu", **kw):
    return pl.Trainer(accelerator=accelerator, devices=1, max_epochs=epochs, callbacks=callbacks, logger=False,
                      enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                      default_root_dir=tmp_path, **kw)


def _features(module, raw):
    with torch.no_grad():
        x = module.backbone(raw.x.to(module.device)).cpu().double()
    return SequenceData(x, raw.y, raw.offsets) if isinstance(raw, SequenceData) else MulticlassData(x, raw.y)


def test_logged_gap_is_the_exact_gap_at_the_current_features(tmp_path):
    _, raw = random_chain_problem(n=8, F=4, K=3, max_len=3, seed=1)
    lam = 0.1
    cb = BCFWCallback(lam=lam, passes_per_call=3, averaging=False)
    module = Toy(raw)
    _trainer(tmp_path, [cb], epochs=2).fit(module)
    rec = cb.last_record
    logged = {k: float(v) for k, v in _trainer_metrics(module).items()}
    assert logged["ssvm/gap"] == pytest.approx(rec.gap, rel=1e-12, abs=1e-15)
    # independent computation at the features the backbone gives now (the callback ran after the last update)
    data = _features(module, raw)
    model, w_head = module.head.model, module.head.w
    primal = brute_force_primal(model, data, w_head, lam)  # enumeration of every labeling
    st = cb.dual_sd["storage"]
    n = len(data)
    w_alpha = (model.joint_feature_sum(data, data.y)
               - model.features_from_marginals(data, st["mu"], st["T"].sum(0))) / (lam * n)
    assert torch.allclose(w_alpha, w_head, atol=1e-12)  # head = A(x_now) alpha (last iterate)
    dual = float(cb.dual_sd["block_ell"].sum()) - 0.5 * lam * float(w_alpha @ w_alpha)
    assert logged["ssvm/primal"] == pytest.approx(primal, abs=1e-10)
    assert logged["ssvm/dual"] == pytest.approx(dual, abs=1e-10)
    assert logged["ssvm/gap"] == pytest.approx(primal - dual, abs=1e-10)
    assert logged["ssvm/gap"] >= 0
    # the features did change between calls: a state not re-bound would have been stale
    assert rec.stale > 1e-6
    assert logged["ssvm/passes"] == pytest.approx(3 + 2 * 3)
    assert logged["ssvm/oracle_calls"] == 9 * n
    assert len(cb.history) == 3 and [h.epoch for h in cb.history] == [0, 0, 1]


def _trainer_metrics(module):
    return {k: v for k, v in module.trainer.callback_metrics.items() if k.startswith("ssvm/")}


def test_multiclass_with_averaging_matches_certify(tmp_path):
    _, raw = random_multiclass_problem(n=12, F=4, K=3, seed=2)
    lam = 0.05
    cb = BCFWCallback(lam=lam, passes_per_call=2, every_n_epochs=2, solver_options={"sampling": "perm"})
    module = Toy(raw)
    _trainer(tmp_path, [cb], epochs=4).fit(module)
    assert cb.dual_sd["kind"] == "ActiveSetDualState"  # the dense state cannot follow the features
    data = _features(module, raw)
    state = ActiveSetDualState.from_state_dict(module.head.model, data, lam, cb.dual_sd)
    last = certify(module.head.model, data, state.w, state.ell, lam)
    w_avg, ell_avg = state.averaged()
    avg = certify(module.head.model, data, w_avg, ell_avg, lam)
    logged = {k: float(v) for k, v in _trainer_metrics(module).items()}
    assert logged["ssvm/gap"] == pytest.approx(min(last.primal, avg.primal) - max(last.dual, avg.dual), abs=1e-10)
    best = w_avg if avg.primal < last.primal else state.w
    assert torch.allclose(module.head.w, best, atol=1e-12)
    assert len(cb.history) == 3  # initial solve + epochs 2 and 4
    assert logged["ssvm/passes"] == pytest.approx(6)


def test_checkpoint_resume_equals_uninterrupted_run(tmp_path):
    _, raw = random_chain_problem(n=10, F=4, K=3, max_len=4, seed=3)
    kw = dict(lam=0.05, passes_per_call=2, seed=5)
    full_cb = BCFWCallback(**kw)
    full = Toy(raw)
    _trainer(tmp_path / "a", [full_cb], epochs=4).fit(full)

    first_cb = BCFWCallback(**kw)
    first = Toy(raw)
    t1 = _trainer(tmp_path / "b", [first_cb], epochs=2)
    t1.fit(first)
    ckpt = tmp_path / "mid.ckpt"
    t1.save_checkpoint(ckpt)
    second_cb = BCFWCallback(**kw)
    second = Toy(raw, seed=123)  # other initial weights: everything must come from the checkpoint
    _trainer(tmp_path / "c", [second_cb], epochs=4).fit(second, ckpt_path=ckpt)

    assert torch.equal(second.head.w, full.head.w)
    assert torch.equal(second.backbone.weight, full.backbone.weight)
    assert second_cb.last_record.gap == full_cb.last_record.gap
    assert [h.gap for h in second_cb.history] == [h.gap for h in full_cb.history]
    assert second_cb.alg_sd == full_cb.alg_sd
    assert float(second.trainer.callback_metrics["ssvm/gap"]) == float(full.trainer.callback_metrics["ssvm/gap"])


def test_checkpoints_without_the_dual_state_are_small_and_resume_by_re_solving(tmp_path):
    """``save_dual_state=False``: the callback's checkpoint state has no dual state or solver state (a fraction of
    the size); a resumed run re-solves the head from a fresh state at its next call, and certifies it."""
    _, raw = random_chain_problem(n=30, F=4, K=3, max_len=6, seed=3)
    sizes = {}
    for keep in (True, False):
        cb = BCFWCallback(lam=0.05, passes_per_call=2, seed=5, save_dual_state=keep)
        t = _trainer(tmp_path / str(keep), [cb], epochs=1)
        t.fit(Toy(raw))
        t.save_checkpoint(tmp_path / f"{keep}.ckpt")
        state = torch.load(tmp_path / f"{keep}.ckpt", weights_only=True)["callbacks"][cb.state_key]
        sizes[keep] = (tmp_path / f"{keep}.ckpt").stat().st_size
        assert (state["dual_state"] is None and state["alg"] is None) == (not keep)
        assert len(state["history"]) == 2
    assert sizes[False] < sizes[True]
    cb = BCFWCallback(lam=0.05, passes_per_call=2, seed=5, save_dual_state=False)
    module = Toy(raw)
    _trainer(tmp_path / "c", [cb], epochs=2).fit(module, ckpt_path=tmp_path / "False.ckpt")
    rec = cb.last_record
    assert cb.calls == 3 and len(cb.history) == 3 and rec.passes == pytest.approx(2.0)  # 2 passes from scratch
    assert float(module.trainer.callback_metrics["ssvm/gap"]) == pytest.approx(rec.gap) and rec.gap >= 0


def test_several_callbacks_in_one_trainer(tmp_path):
    _, raw = random_chain_problem(n=8, F=4, K=3, max_len=3, seed=4)
    a = BCFWCallback(lam=0.1, head_attr="head_a", log_prefix="ssvm_a", passes_per_call=2)
    b = BCFWCallback(lam=0.01, head_attr="head_b", log_prefix="ssvm_b", passes_per_call=1, every_n_epochs=2)
    assert a.state_key != b.state_key
    module = Toy(raw, heads=("head_a", "head_b"))
    trainer = _trainer(tmp_path, [a, b], epochs=2)
    trainer.fit(module)
    m = trainer.callback_metrics
    assert "ssvm_a/gap" in m and "ssvm_b/gap" in m
    assert float(m["ssvm_a/passes"]) == pytest.approx(6) and float(m["ssvm_b/passes"]) == pytest.approx(2)
    assert not torch.equal(module.head_a.w, module.head_b.w)
    ckpt = tmp_path / "two.ckpt"
    trainer.save_checkpoint(ckpt)
    saved = torch.load(ckpt, weights_only=True)["callbacks"]  # loads without pickled objects
    assert saved[a.state_key]["config"]["lam"] == 0.1 and saved[b.state_key]["config"]["lam"] == 0.01
    # two instances that would share a state key (Lightning refuses) or a log prefix (we refuse)
    with pytest.raises(RuntimeError, match="state_key"):
        _trainer(tmp_path, [BCFWCallback(lam=0.1, head_attr="head_a"), BCFWCallback(lam=0.2, head_attr="head_a")],
                 epochs=1)
    same_prefix = [BCFWCallback(lam=0.1, head_attr="head_a"), BCFWCallback(lam=0.2, head_attr="head_b")]
    with pytest.raises(ValueError, match="distinct"):
        _trainer(tmp_path, same_prefix, epochs=1).fit(Toy(raw, heads=("head_a", "head_b")))


def test_bad_configuration_is_reported(tmp_path):
    _, raw = random_chain_problem(n=6, F=4, K=3, max_len=3, seed=5)
    with pytest.raises(TypeError, match="unknown argument"):
        BCFWCallback(lam=0.1, max_pases=3)
    with pytest.raises(ValueError, match="passes_per_call"):
        BCFWCallback(lam=0.1, max_passes=3)
    with pytest.raises(ValueError, match="lam"):
        BCFWCallback(lam=0.0)
    with pytest.raises(ValueError, match="unknown solver"):
        BCFWCallback(lam=0.1, solver="ssg")
    # callback attached to a module without the named head
    with pytest.raises(ValueError, match="no StructuredHead attribute 'classifier'"):
        _trainer(tmp_path, [BCFWCallback(lam=0.1, head_attr="classifier")], epochs=1).fit(Toy(raw))
    # head size does not match the feature dimension
    bad = Toy(raw)
    bad.head = StructuredHead(Chain(5, 3))
    with pytest.raises(ValueError, match="head 'head' \\(Chain\\): token features have dimension 3 but the model expects 5"):
        _trainer(tmp_path, [BCFWCallback(lam=0.1)], epochs=1).fit(bad)
    # a bcfw_dataloader that changes the order of the examples between calls
    with pytest.raises(ValueError, match="same training examples in the same order"):
        _trainer(tmp_path, [BCFWCallback(lam=0.1, passes_per_call=1)], epochs=1).fit(Toy(raw, shuffle_bcfw=True))
    # a checkpoint written at another lam
    cb = BCFWCallback(lam=0.1)
    with pytest.raises(ValueError, match="lam"):
        BCFWCallback(lam=0.2).load_state_dict(cb.state_dict())


@requires_cuda
@pytest.mark.cuda
def test_callback_on_cuda(tmp_path):
    _, raw = random_chain_problem(n=8, F=4, K=3, max_len=3, seed=6)
    lam = 0.1
    cb = BCFWCallback(lam=lam, passes_per_call=2, averaging=False)
    module = Toy(raw)

    class HeadDevice(pl.Callback):  # after the solve of each epoch (Lightning moves the module to the CPU at the end)
        seen = []

        def on_train_epoch_end(self, trainer, pl_module):
            self.seen.append(pl_module.head.w.device.type)

    _trainer(tmp_path, [cb, HeadDevice()], epochs=2, accelerator="cuda").fit(module)
    assert HeadDevice.seen == ["cuda", "cuda"]
    data = _features(module, raw)
    primal = brute_force_primal(module.head.model, data, module.head.w.cpu(), lam)
    assert float(module.trainer.callback_metrics["ssvm/primal"]) == pytest.approx(primal, abs=1e-6)


def test_end_of_epoch_validation_sees_the_fresh_head(tmp_path):
    _, raw = random_chain_problem(n=8, F=4, K=3, max_len=3, seed=7)
    cb = BCFWCallback(lam=0.1, passes_per_call=2)
    module = Toy(raw)
    val = torch.utils.data.DataLoader(_batches(raw, 8), batch_size=None)
    _trainer(tmp_path, [cb], epochs=3, num_sanity_val_steps=0).fit(module, val_dataloaders=val)
    assert len(cb.history) == 4  # initial solve + one per epoch, not two
    assert len(module.val_weights) == 3
    heads = [h for h in module.val_weights]
    assert torch.equal(heads[-1], module.head.w)  # the last validation decoded with the final solve
    assert not torch.equal(heads[0], heads[1])


def test_train_command_runs_the_yaml_experiment(tmp_path, capsys):
    from conftest import shared_data

    from torch_bcfw.cli import main

    data = str(shared_data("ocr"))
    common = ["--config", "configs/ocr_cnn.yaml", f"--data.init_args.path={data}", "--data.init_args.limit=40",
              "--data.init_args.test_limit=20", f"--trainer.default_root_dir={tmp_path}",
              f"--trainer.logger.init_args.save_dir={tmp_path}"]
    import os

    cwd = os.getcwd()
    os.chdir(Path(__file__).resolve().parents[1])
    try:
        rc = main(["train", *common, "--trainer.max_epochs=1", f"--report={tmp_path / 'report.json'}"])
        assert rc == 0
        rep = json.loads((tmp_path / "report.json").read_text())
        assert rep["ssvm/calls"] == 2 and rep["ssvm/passes"] == pytest.approx(20)
        assert 0 <= rep["ssvm/gap"] <= rep["ssvm/primal"] and 0 <= rep["test/letter_error"] <= 1
        bad = tmp_path / "bad.yaml"
        cfg = (Path("configs") / "ocr_cnn.yaml").read_text().replace("seed: 1}", "seed: 1, max_pases: 3}")
        assert "max_pases" in cfg
        bad.write_text(cfg)
        rc = main(["train", *common, "--config", str(bad), "--trainer.max_epochs=1"])
        err = capsys.readouterr().err
        assert rc == 2 and "unknown argument(s) ['max_pases']; did you mean 'passes_per_call'?" in err
    finally:
        os.chdir(cwd)


def test_the_first_solve_announces_compiling_and_bad_arguments_fail_at_construction(tmp_path, caplog):
    """The first solve announces numba compiling (rank 0; a fresh kernel compiled inside the solve stands for the
    package's own on a machine without their disk cache); later solves say nothing.  A CUDA device without CUDA,
    a typo in an argument (the callback's own or a solver option's) and a 2-tuple for a chain head fail in one line
    that says what to do."""
    import logging

    import numba

    _, raw = random_chain_problem(n=6, F=4, K=3, max_len=3, seed=8)

    @numba.njit(cache=False)
    def fresh(x):  # compiled at its first call, inside the first solve
        return x + 1.0

    class Compiling(Toy):
        def bcfw_features(self, batch):
            fresh(1.0)
            return super().bcfw_features(batch)

    cb = BCFWCallback(lam=0.1, passes_per_call=1)
    with caplog.at_level(logging.INFO):
        _trainer(tmp_path, [cb], epochs=2).fit(Compiling(raw))
    notices = [r.getMessage() for r in caplog.records if "compiling numba kernels" in r.getMessage()]
    assert notices == ["[ssvm] torch-bcfw: compiling numba kernels (first run only: cached on disk afterwards)..."]
    assert cb.calls == 3
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA is not available on this machine") as info:
            BCFWCallback(lam=0.1, device="cuda")
        assert "\n" not in str(info.value)
    with pytest.raises(ValueError, match="is not a torch device"):
        BCFWCallback(lam=0.1, device="gpu0")
    with pytest.raises(TypeError, match=r"did you mean 'passes_per_call'\?.*its arguments: \[.*'every_n_epochs'"):
        BCFWCallback(lam=0.1, passes_per_cal=3)
    with pytest.raises(TypeError, match=r"did you mean 'gap_tol'\?.*options of solver .bcfw.: \[.*'averaging"):
        BCFWCallback(lam=0.1, gap_tl=0.1)

    class Pairs(Toy):  # (x, y) for a chain: the token boundaries are lost
        def bcfw_features(self, batch):
            return self.backbone(batch[0]), batch[1]

    with pytest.raises(TypeError, match=r"a chain head needs per-token features with the sequence boundaries: "
                                        r"return \(x \[N_tok, F\], y \[N_tok\], offsets \[n \+ 1\]\)"):
        _trainer(tmp_path, [BCFWCallback(lam=0.1)], epochs=1).fit(Pairs(raw))


def test_train_command_on_a_machine_without_the_accelerator_says_so_in_one_line(capsys):
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    from torch_bcfw.cli import main

    rc = main(["train", "--config", str(Path(__file__).resolve().parents[1] / "configs" / "ocr_cnn.yaml"),
               "--trainer.accelerator=gpu"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "CUDA is not available on this machine" in err[0] and "gpu" in err[0]


class Shuffled(Toy):
    """Toy whose training loader shuffles its batches every epoch (as the docs' module does)."""

    def __init__(self, raw, seeded: bool, **kw):
        super().__init__(raw, **kw)
        self.seeded = seeded

    def train_dataloader(self):
        from torch_bcfw.lightning import SeededShuffle

        batches = _batches(self.raw, 2)
        if self.seeded:
            return torch.utils.data.DataLoader(batches, batch_size=None, sampler=SeededShuffle(len(batches), seed=4))
        return torch.utils.data.DataLoader(batches, batch_size=None, shuffle=True)


def _resumed_and_uninterrupted(tmp_path, seeded: bool):
    _, raw = random_chain_problem(n=12, F=4, K=3, max_len=4, seed=9)
    kw = dict(lam=0.05, passes_per_call=2, seed=5)
    torch.manual_seed(0)
    full = Shuffled(raw, seeded)
    _trainer(tmp_path / "a", [BCFWCallback(**kw)], epochs=3).fit(full)
    torch.manual_seed(0)
    first = Shuffled(raw, seeded)
    t1 = _trainer(tmp_path / "b", [BCFWCallback(**kw)], epochs=1)
    t1.fit(first)
    t1.save_checkpoint(tmp_path / "mid.ckpt")
    torch.manual_seed(1)  # a new process: another global random state
    second = Shuffled(raw, seeded, seed=123)
    _trainer(tmp_path / "c", [BCFWCallback(**kw)], epochs=3).fit(second, ckpt_path=tmp_path / "mid.ckpt")
    return full, second


def test_a_shuffling_loader_resumes_exactly_with_a_seeded_shuffle(tmp_path):
    """The docs' module shuffles its training batches; Lightning does not replay a plain shuffle after a resume (the
    order comes from the global random state), so the head differs from the uninterrupted run's.  With
    ``SeededShuffle`` (the order a function of the seed and the epoch) the resumed run's backbone and head equal the
    uninterrupted run's bit for bit."""
    full, second = _resumed_and_uninterrupted(tmp_path / "seeded", seeded=True)
    assert torch.equal(second.backbone.weight, full.backbone.weight) and torch.equal(second.head.w, full.head.w)
    full, second = _resumed_and_uninterrupted(tmp_path / "plain", seeded=False)
    assert not torch.equal(second.backbone.weight, full.backbone.weight)  # what SeededShuffle is for
    from torch_bcfw.lightning import SeededShuffle

    s = SeededShuffle(10, seed=3)
    first = list(s)
    s.set_epoch(1)
    assert sorted(first) == list(range(10)) and list(s) != first and list(SeededShuffle(10, seed=3)) == first
