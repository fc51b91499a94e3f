"""BCFWCallback with ``lam`` chosen on held-out data at every solve (``LamChoice``): the choice equals a brute-force
grid's on the same held-out data, the record carries the chosen lam with its certificate, a resumed run is exact."""
import pytest

pytest.importorskip("lightning", reason="the [lightning] extra is not installed")

import torch
from conftest import random_chain_problem
from test_lightning import Toy, _batches, _features, _trainer

from torch_bcfw import fit
from torch_bcfw.duals.rebind import rebindable_state
from torch_bcfw.lightning import BCFWCallback, LamChoice, lam_grid
from torch_bcfw.certificate import certify, task_loss

LAMS = [10.0, 3.0, 1.0, 0.3]


class ValToy(Toy):
    """:class:`Toy` with held-out labelled examples (``bcfw_val_dataloader``)."""

    def __init__(self, raw, val, **kw):
        super().__init__(raw, **kw)
        self.val = val

    def bcfw_val_dataloader(self):
        return _batches(self.val, 3)


def _problem():
    _, raw = random_chain_problem(n=14, F=4, K=3, max_len=4, seed=11)
    return raw[list(range(9))], raw[list(range(9, 14))]


def test_the_choice_is_the_brute_force_grid_choice_and_is_certified(tmp_path):
    train, val = _problem()
    choice = LamChoice(LAMS, passes=100)
    cb = BCFWCallback(lam_choice=choice, passes_per_call=30, rel_gap_tol=1e-4, averaging=False)
    module = ValToy(train, val)
    _trainer(tmp_path, [cb], epochs=2).fit(module)
    # brute force on the features of the last call (no backbone update after it): every lam solved on its own,
    # from scratch, to a tight gap; its held-out task loss
    xtr, xval = _features(module, train), _features(module, val)
    model = module.head.model
    losses = {}
    for lam in LAMS:
        res = fit(model, xtr, lam, max_passes=1000, rel_gap_tol=1e-3, averaging=False)
        assert res.gap <= 1e-3 * res.history[-1].model_primal
        losses[lam] = task_loss(model, xval, res.w)
    assert len(set(losses.values())) > 1  # the choice matters on this problem
    expected = min(LAMS, key=lambda v: (losses[v], -v))
    assert cb.lam == expected
    last = choice.history[-1]
    assert [c["lam"] for c in last["candidates"]] == LAMS
    assert [c["val_loss"] for c in last["candidates"]] == pytest.approx([losses[v] for v in LAMS], abs=1e-12)
    # the record: the chosen lam, the held-out loss of the head and the exact gap of the head at that lam
    rec = cb.last_record
    assert rec.lam == expected and rec.val_loss == pytest.approx(losses[expected], abs=1e-12)
    assert rec.val_loss == task_loss(model, xval, module.head.w)
    state = type(rebindable_state(model, xtr, expected)).from_state_dict(model, xtr, expected, cb.dual_sd)
    cert = certify(model, xtr, module.head.w, state.dual_ell(), expected)
    assert torch.allclose(state.w, module.head.w, atol=1e-12)
    assert rec.gap == pytest.approx(cert.gap, abs=1e-10) and rec.gap <= 1e-2 * rec.model_primal
    logged = {k: float(v) for k, v in module.trainer.callback_metrics.items() if k.startswith("ssvm/")}
    assert logged["ssvm/lam"] == expected
    assert logged["ssvm/val_loss"] == pytest.approx(rec.val_loss, abs=1e-12)
    assert logged["ssvm/gap"] == pytest.approx(rec.gap, rel=1e-12, abs=1e-15)
    assert len(choice.history) == len(cb.history) == 3  # the initial solve and one per epoch


def test_resume_chooses_the_same_lam_and_writes_the_same_head(tmp_path):
    train, val = _problem()

    def callback():
        return BCFWCallback(lam_choice=LamChoice(LAMS, passes=2), passes_per_call=2, seed=5)

    full_cb = callback()
    full = ValToy(train, val)
    _trainer(tmp_path / "a", [full_cb], epochs=4).fit(full)
    first_cb = callback()
    first = ValToy(train, val)
    t1 = _trainer(tmp_path / "b", [first_cb], epochs=2)
    t1.fit(first)
    ckpt = tmp_path / "mid.ckpt"
    t1.save_checkpoint(ckpt)
    second_cb = callback()
    second = ValToy(train, val, seed=123)
    _trainer(tmp_path / "c", [second_cb], epochs=4).fit(second, ckpt_path=ckpt)
    assert second_cb.lam == full_cb.lam
    assert [h["lam"] for h in second_cb.lam_choice.history] == [h["lam"] for h in full_cb.lam_choice.history]
    assert second_cb.lam_choice.history == full_cb.lam_choice.history
    assert torch.equal(second.head.w, full.head.w)
    assert [h.gap for h in second_cb.history] == [h.gap for h in full_cb.history]
    # a callback without lam_choice cannot continue it
    with pytest.raises(ValueError, match="lam_choice"):
        BCFWCallback(lam=0.3).load_state_dict(full_cb.state_dict())


def test_holdout_fraction_solves_the_head_on_the_rest():
    train, _ = _problem()
    choice = LamChoice(lam_range=(0.01, 1.0), num=3, passes=3, holdout=0.34)
    assert choice.lams == pytest.approx([1.0, 0.1, 0.01])
    cb = BCFWCallback(lam_choice=choice, passes_per_call=2)
    module = Toy(train)
    cb.solve(None, module, 2.0, log=False)
    n_val = 4  # ceil(0.34 * 9)
    assert len(choice.val_data) == n_val and cb.last_data is not None
    assert len(cb.dual_sd["block_ell"]) == len(train) - n_val
    assert cb.last_record.lam in choice.lams


def test_bad_choices_are_reported():
    with pytest.raises(ValueError, match="exactly one"):
        BCFWCallback(lam=0.1, lam_choice=LamChoice([0.1]))
    with pytest.raises(ValueError, match="exactly one"):
        BCFWCallback()
    with pytest.raises(ValueError, match="exactly one"):
        LamChoice([0.1], lam_range=(0.1, 1.0))
    with pytest.raises(ValueError, match="replicate"):
        BCFWCallback(lam_choice=LamChoice([0.1]), strategy="shard")
    with pytest.raises(ValueError, match="holdout"):
        LamChoice([0.1], holdout=1.5)
    with pytest.raises(ValueError, match="lam_min must be <= lam_max"):
        lam_grid(1.0, 0.1, 3)


class NoSplitToy(Toy):
    """A module whose ``bcfw_val_dataloader`` says it has no validation split (as a datamodule without one)."""

    def bcfw_val_dataloader(self):
        raise ValueError("NoSplitToy has no validation split for bcfw_val_dataloader")


@pytest.mark.parametrize("module", [Toy, NoSplitToy])
def test_missing_validation_split_is_reported_before_training(tmp_path, module):
    train, _ = _problem()
    cb = BCFWCallback(lam_choice=LamChoice(LAMS, passes=1), passes_per_call=1)
    trainer = _trainer(tmp_path, [cb], epochs=1)
    with pytest.raises(ValueError, match="bcfw_val_dataloader"):
        trainer.fit(module(train))
    assert trainer.global_step == 0 and cb.calls == 0  # no training step, no solve


def test_a_window_solves_the_current_choice_and_its_neighbours_only(tmp_path):
    lams = [30.0, 10.0, 3.0, 1.0, 0.3, 0.1]
    choice = LamChoice(lams, window=1)
    assert choice.candidates(None) == lams  # the first call: every candidate
    assert choice.candidates(30.0) == [30.0, 10.0] and choice.candidates(1.0) == [3.0, 1.0, 0.3]
    assert choice.candidates(0.1) == [0.3, 0.1]
    train, val = _problem()
    cb = BCFWCallback(lam_choice=choice, passes_per_call=3, seed=2)
    _trainer(tmp_path, [cb], epochs=3).fit(ValToy(train, val))
    hist = choice.history
    assert [c["lam"] for c in hist[0]["candidates"]] == lams
    # passes=None: each candidate is solved as far as the head (the callback's passes_per_call), fresh at first
    assert [c["passes"] for c in hist[0]["candidates"]] == [3.0] * len(lams)
    for before, now in zip(hist, hist[1:]):
        solved = [c["lam"] for c in now["candidates"]]
        assert solved == choice.candidates(before["lam"])  # the window around the previous choice
        assert now["lam"] in solved and abs(lams.index(now["lam"]) - lams.index(before["lam"])) <= 1
    with pytest.raises(ValueError, match="window"):
        LamChoice(lams, window=0)
    with pytest.raises(ValueError, match="passes"):
        LamChoice(lams, passes=0)


def test_the_choice_is_returned_and_kept_only_once_committed():
    """``LamChoice.choose`` returns its pick and changes nothing (an interrupted call leaves no trace); ``commit``
    keeps the candidates' states and the record; the callback writes its own ``lam`` and state."""
    from torch_bcfw.planning import plan_run
    from torch_bcfw.solvers.run import options_for

    train, val = _problem()
    module = ValToy(train, val)
    xtr, xval = _features(module, train), _features(module, val)
    model = module.head.model
    choice = LamChoice(LAMS, passes=3)
    plan = plan_run(model, xtr, LAMS[0], "bcfw", options_for("bcfw", strategy="replicate"), test_data=xval)
    pick = choice.choose(model, plan.data, plan.test_data, "bcfw", plan.options, passes=2.0, lam=LAMS[0], state=None)
    assert choice.states == {} and choice.history == [] and choice.val_data is None
    assert pick.lam in LAMS and pick.state is pick.states[pick.lam] and set(pick.states) == set(LAMS)
    best = min(pick.record["candidates"], key=lambda c: (c["val_loss"], -c["lam"]))
    assert pick.record["lam"] == pick.lam == best["lam"]
    choice.commit(pick, epoch=3)
    assert choice.states is pick.states and choice.history == [{"epoch": 3, **pick.record}] and choice.val_data is xval
    cb = BCFWCallback(lam_choice=LamChoice(LAMS, passes=3), passes_per_call=2)
    cb.solve(None, ValToy(train, val), 2.0, log=False)
    assert cb.lam == cb.lam_choice.history[-1]["lam"] == cb.last_record.lam
