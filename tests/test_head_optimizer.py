"""BCFWHeadOptimizer: a plain BCFW block step per example of a batch with the hinge's decodings, on blocks re-bound to
the batch's features (issue 61)."""
from __future__ import annotations

import dataclasses
import io

import numpy as np
import pytest
import torch

import torch_bcfw as tb
from conftest import brute_force_primal, random_chain_problem, random_multiclass_problem
from torch_bcfw.data.base import segment_rows
from torch_bcfw.duals.stepsize import LINE_SEARCH
from torch_bcfw.duals.working_set import block_labelings
from torch_bcfw.head_optimizer import BCFWHeadOptimizer
from torch_bcfw.nn import StructuredHead, StructuredHingeLoss

pytestmark = pytest.mark.usefixtures("one_torch_thread")

LAM = 0.1


def _features(data, x):
    return dataclasses.replace(data, x=x)


def _rows(data, idx):
    off = getattr(data, "offsets", None)
    return idx if off is None else segment_rows(off, idx)[0]


def _batches(n, size, epochs, seed):
    g = torch.Generator().manual_seed(seed)
    return [perm[s:s + size] for _ in range(epochs) for perm in [torch.randperm(n, generator=g)]
            for s in range(0, n, size)]


def _hinge_step(opt, loss, data, x, ids):
    """The batch ``ids`` at features ``x`` (all examples): the hinge's decoding, then the optimizer's step."""
    batch = _features(data, x)[ids]
    loss(batch.x, batch.y, getattr(batch, "offsets", None))
    return opt.step(ids, loss.last_decoding)


def _optimum(model, data, lam):
    """``P*`` to 1e-9, solved independently of the optimizer (pairwise steps with a cache: linear convergence)."""
    best = tb.fit(model, data, lam=lam, max_passes=5000, gap_tol=1e-11, gap_check=50, preset="gap-pairwise-cache")
    assert best.gap <= 1e-9
    return best


@pytest.mark.parametrize("maker", [random_chain_problem, random_multiclass_problem])
def test_step_is_a_plain_block_step_on_rebound_blocks(maker):
    """(a) Every step equals, to 1e-12, plain BCFW block steps (``DualState.block_step``, line search) on a state
    re-bound in full to the features each block last saw, towards the same oracle answers."""
    model, data = maker(n=7, seed=3)
    head = StructuredHead(model)
    loss = StructuredHingeLoss(head)
    opt = BCFWHeadOptimizer(head, data, LAM)
    ref = type(opt.state)(model, data, LAM)
    seen = data.x.clone()  # the features each block was last bound to
    g = torch.Generator().manual_seed(0)
    for t, ids in enumerate(_batches(len(data), 3, 4, seed=1)):
        x = data.x + 0.3 * t * torch.randn(data.x.shape, generator=g, dtype=torch.float64)  # the backbone moved
        nums = _hinge_step(opt, loss, data, x, ids)
        seen[_rows(data, ids)] = x[_rows(data, ids)]
        ref = type(ref).from_state_dict(model, _features(data, seen.clone()), LAM, ref.state_dict())
        dec = loss.last_decoding
        ref_nums = [ref.block_step(i, torch.from_numpy(y), LINE_SEARCH)[0]
                    for i, y in zip(ids.tolist(), block_labelings(dec.y_star, dec.offsets))]
        assert np.allclose(nums, ref_nums, rtol=0, atol=1e-12)
        assert float((opt.state.w - ref.w).abs().max()) <= 1e-12
        assert torch.allclose(opt.state.block_ell, ref.block_ell, rtol=0, atol=1e-15)
        assert opt.state.k == ref.k
        assert torch.equal(head.w, opt.state.w)
    assert torch.equal(opt.state.data.x, seen)
    # w = sum_i w_i, each w_i at the features its block was last bound to
    assert opt.state.refresh() <= 1e-12
    assert bool((ref.w != 0).any())


def test_resume_is_exact():
    """(b) state_dict mid-run (through a file), load into a new optimizer, continue: the same weights bit for bit."""
    model, data = random_chain_problem(n=8, seed=5)
    g = torch.Generator().manual_seed(1)
    xs = [data.x + 0.2 * t * torch.randn(data.x.shape, generator=g, dtype=torch.float64) for t in range(12)]
    batches = _batches(len(data), 3, 4, seed=2)
    head = StructuredHead(model)
    loss = StructuredHingeLoss(head)
    a = BCFWHeadOptimizer(head, data, LAM)
    for t in range(5):
        _hinge_step(a, loss, data, xs[t], batches[t])
    buf = io.BytesIO()
    torch.save(a.state_dict(), buf)
    buf.seek(0)
    head_b = StructuredHead(model)
    loss_b = StructuredHingeLoss(head_b)
    b = BCFWHeadOptimizer(head_b, data, LAM)
    b.load_state_dict(torch.load(buf, weights_only=True))
    assert b.steps == 5 and torch.equal(head_b.w, head.w)
    for t in range(5, 12):
        na = _hinge_step(a, loss, data, xs[t], batches[t])
        nb = _hinge_step(b, loss_b, data, xs[t], batches[t])
        assert np.array_equal(na, nb) and torch.equal(head.w, head_b.w)
    assert torch.equal(a.state.data.x, b.state.data.x) and a.state.k == b.state.k


def test_certified_gap_is_honest_after_the_backbone_moved():
    """(c) Steps on features that move between steps, then the certificate at the final features: its primal is the
    brute-force primal of the head's weights, and gap >= P(w) - P* with P* an independently solved optimum."""
    model, data = random_chain_problem(n=5, F=3, K=3, max_len=3, seed=7)
    head = StructuredHead(model)
    loss = StructuredHingeLoss(head)
    opt = BCFWHeadOptimizer(head, data, 1.0)
    g = torch.Generator().manual_seed(3)
    x = data.x
    for ids in _batches(len(data), 2, 6, seed=4):
        x = x + 0.2 * torch.randn(x.shape, generator=g, dtype=torch.float64)
        _hinge_step(opt, loss, data, x, ids)
    final = _features(data, x)
    stale = head.w.clone()
    cert = opt.certify(final)
    w = head.w.clone()
    assert torch.equal(opt.state.w, w) and not torch.equal(w, stale)  # w = A(x) alpha re-derived at the new features
    primal = brute_force_primal(model, final, w, 1.0)
    assert abs(cert.primal - primal) <= 1e-9
    p_star = _optimum(model, final, 1.0).primal
    assert cert.gap >= primal - p_star - 1e-9
    assert cert.dual <= p_star + 1e-9  # a dual value at these features: a lower bound of P*
    assert cert.gap > 1e-3  # the moved features left work to do: the bound is not vacuous


def test_fixed_features_converge_to_the_optimum_of_fit():
    """(d) With fixed features, epochs of optimizer steps approach fit's optimum at plain BCFW's rate: the gap within
    2x of ``fit``'s after as many passes, the weights within the gap's bound of the optimum's."""
    model, data = random_chain_problem(n=6, F=3, K=3, max_len=4, seed=11)
    head = StructuredHead(model)
    loss = StructuredHingeLoss(head)
    opt = BCFWHeadOptimizer(head, data, 1.0)
    best = _optimum(model, data, 1.0)
    gaps, done = [], 0
    for epochs in (20, 200):
        for ids in _batches(len(data), 2, epochs - done, seed=epochs):
            _hinge_step(opt, loss, data, data.x, ids)
        done = epochs
        cert = opt.certify(data)
        plain = tb.fit(model, data, lam=1.0, max_passes=epochs, gap_check=epochs)
        assert cert.gap <= 2 * plain.gap
        assert -1e-12 <= cert.primal - best.primal <= cert.gap
        assert float((head.w - best.weights).norm()) ** 2 <= 2 * (cert.gap + best.gap)  # lam-strong convexity
        gaps.append(cert.gap)
    assert gaps[1] < gaps[0] / 5


def test_callback_step_mode_moves_the_head_at_every_step(tmp_path):
    """``BCFWCallback(mode="step")``: the head moves after every training step, the solve continues the optimizer's
    state and logs the certified gap of the head's weights at the final features (its primal checked here)."""
    pl = pytest.importorskip("lightning.pytorch")
    from torch_bcfw.certificate import primal_value
    from torch_bcfw.lightning import BCFWCallback

    model, raw = random_chain_problem(n=12, F=4, K=3, seed=2)

    class Module(pl.LightningModule):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.backbone = torch.nn.Linear(4, 3).double()
            self.head = StructuredHead(tb.Chain(3, 3))
            self.hinge = StructuredHingeLoss(self.head)

        def _loader(self, size):
            return [(raw[ids].x, raw[ids].y, raw[ids].offsets, ids) for ids in torch.arange(12).split(size)]

        def train_dataloader(self):
            return torch.utils.data.DataLoader(self._loader(4), batch_size=None)

        def bcfw_dataloader(self):
            return self._loader(5)

        def bcfw_features(self, batch):
            return self.backbone(batch[0]), batch[1], batch[2]

        def bcfw_example_ids(self, batch):
            return batch[3]

        def training_step(self, batch, _):
            feats = self.backbone(batch[0])
            return self.hinge(feats, batch[1], batch[2]) + 0.01 * (feats ** 2).mean()

        def configure_optimizers(self):
            return torch.optim.SGD(self.backbone.parameters(), lr=0.05)

    weights = []

    class Record(pl.Callback):
        def on_train_batch_end(self, trainer, module, *args):
            weights.append(module.head.w.clone())

    for bad in (dict(mode="steps"), dict(mode="step", solver="fw")):
        with pytest.raises(ValueError, match="mode"):
            BCFWCallback(lam=LAM, **bad)
    cb = BCFWCallback(lam=LAM, mode="step", passes_per_call=1)
    module = Module()
    pl.Trainer(max_epochs=2, callbacks=[cb, Record()], logger=False, enable_checkpointing=False,
               enable_progress_bar=False, enable_model_summary=False, default_root_dir=tmp_path).fit(module)
    assert len(weights) == 6 and all(not torch.equal(a, b) for a, b in zip(weights, weights[1:]))
    with torch.no_grad():
        final = tb.SequenceData(module.backbone(raw.x), raw.y, raw.offsets)
    rec = cb.last_record
    assert rec.gap >= 0 and cb.calls == 3 and cb.head_optimizer is None
    assert abs(rec.model_primal - primal_value(module.head.model, final, module.head.w, LAM)[0]) <= 1e-9
    # a hinge scoring at a multiple of w does not decode the oracle's answers at w: refused in step mode
    scaled = Module()
    scaled.hinge = StructuredHingeLoss(scaled.head, scale=2.0)
    trainer = pl.Trainer(max_epochs=1, callbacks=[BCFWCallback(lam=LAM, mode="step", passes_per_call=1)], logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                         default_root_dir=tmp_path)
    with pytest.raises(ValueError, match="scale=1"):
        trainer.fit(scaled)
