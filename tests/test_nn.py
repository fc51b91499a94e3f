"""torch_bcfw.nn: the structured head and the structured hinge loss against enumeration and finite differences."""
import pytest
import torch
from conftest import (
    brute_force_max,
    random_chain_problem,
    random_multiclass_problem,
    requires_cuda,
)

from torch_bcfw.data import MulticlassData, SequenceData
from torch_bcfw.models import Chain, Multiclass
from torch_bcfw.nn import StructuredHead, StructuredHingeLoss, structured_hinge


def _problem(kind, seed=0):
    if kind == "chain":
        return random_chain_problem(n=4, F=3, K=3, max_len=3, seed=seed)
    return random_multiclass_problem(n=7, F=3, K=4, seed=seed)


def _layout(data):
    return {"offsets": data.offsets} if isinstance(data, SequenceData) else {}


def _random_w(model, seed):
    return torch.randn(model.n_features, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


@pytest.mark.parametrize("kind", ["chain", "multiclass"])
def test_hinge_value_equals_enumeration(kind):
    model, data = _problem(kind, seed=1)
    w = _random_w(model, 2)
    H = structured_hinge(model, w, data.x, data.y, reduction="none", **_layout(data))
    for i in range(len(data)):
        best, _ = brute_force_max(model, data, w, i)  # max_y L_i(y) + <w, phi(x_i, y)>
        blk = data[[i]]
        truth = float(model.joint_feature(blk, blk.y)[0] @ w)
        assert float(H[i]) == pytest.approx(best - truth, abs=1e-10)
    assert bool((H >= -1e-12).all())
    # the same value as the model's own hinge terms, and mean / sum reductions
    _, H_model = model.hinge_terms(w, data)
    assert torch.allclose(H, H_model, atol=1e-10)
    mean = structured_hinge(model, w, data.x, data.y, **_layout(data))
    assert float(mean) == pytest.approx(float(H.mean()))
    head = StructuredHead(model)
    head.set_weights(w)
    lam = 0.3
    loss = StructuredHingeLoss(head, lam=lam)(data.x, data.y, **_layout(data))
    assert float(loss) == pytest.approx(float(H.mean()) + 0.5 * lam * float(w @ w))


@pytest.mark.parametrize("kind", ["chain", "multiclass"])
def test_scaled_hinge_is_the_hinge_at_scaled_weights(kind):
    """``StructuredHingeLoss(scale=s)`` at the head's ``w`` is the brute-force hinge at ``s * w`` (value, decodings,
    regulariser); the head itself is untouched; a scale that is not a finite positive number is refused."""
    model, data = _problem(kind, seed=4)
    w, s, lam = _random_w(model, 5), 3.5, 0.2
    head = StructuredHead(model)
    head.set_weights(w)
    loss_fn = StructuredHingeLoss(head, lam=lam, scale=s, reduction="none")
    H = loss_fn(data.x, data.y, **_layout(data))
    for i in range(len(data)):
        best, _ = brute_force_max(model, data, s * w, i)
        blk = data[[i]]
        truth = float(model.joint_feature(blk, blk.y)[0] @ (s * w))
        assert float(H[i]) == pytest.approx(best - truth + 0.5 * lam * s * s * float(w @ w), abs=1e-9)
    plain = StructuredHead(model)
    plain.set_weights(s * w)
    StructuredHingeLoss(plain)(data.x, data.y, **_layout(data))
    assert torch.equal(loss_fn.last_decoding.y_star, plain_decoding(plain, data))
    assert torch.equal(head.w, w.to(head.w.dtype))
    for bad in (0.0, -1.0, float("nan"), float("inf"), "2"):
        with pytest.raises(ValueError, match="scale"):
            StructuredHingeLoss(head, scale=bad)


def plain_decoding(head, data):
    """The loss-augmented decodings of ``head`` (scale 1) on ``data``."""
    loss_fn = StructuredHingeLoss(head)
    loss_fn(data.x, data.y, **_layout(data))
    return loss_fn.last_decoding.y_star


@pytest.mark.parametrize("kind", ["chain", "multiclass"])
def test_hinge_gradient_matches_finite_differences(kind):
    model, data = _problem(kind, seed=3)
    w = _random_w(model, 4).requires_grad_(True)
    x = data.x.clone().requires_grad_(True)
    lay = _layout(data)

    def f(x_, w_):
        return structured_hinge(model, w_, x_, data.y, reduction="none", **lay)

    # the loss-augmented argmax is unique and locally constant on a random problem: the hinge is smooth there
    assert torch.autograd.gradcheck(f, (x, w), eps=1e-6, atol=1e-6)
    # and the gradient in x is not trivially zero (it reaches a backbone)
    f(x, w).sum().backward()
    assert float(x.grad.abs().sum()) > 0 and float(w.grad.abs().sum()) > 0


def test_gradient_reaches_a_backbone_and_head_parameters():
    model, data = _problem("chain", seed=5)
    torch.manual_seed(0)
    backbone = torch.nn.Linear(3, 3).double()
    head = StructuredHead(model, trainable=True)
    head.set_weights(_random_w(model, 6))
    loss = StructuredHingeLoss(head, lam=0.1)(backbone(data.x), data.y, offsets=data.offsets)
    loss.backward()
    assert backbone.weight.grad is not None and float(backbone.weight.grad.abs().sum()) > 0
    assert head.w.grad is not None and float(head.w.grad.abs().sum()) > 0
    assert [n for n, _ in head.named_parameters()] == ["w"]
    frozen = StructuredHead(model)
    assert [n for n, _ in frozen.named_parameters()] == [] and "w" in dict(frozen.named_buffers())


def test_a_buffer_head_at_zero_warns_once_that_the_backbone_gets_no_gradient():
    import warnings

    model, data = _problem("chain", seed=5)
    torch.manual_seed(0)
    backbone = torch.nn.Linear(3, 3).double()
    head = StructuredHead(model)  # w = 0, a buffer: nothing but BCFW / set_weights moves it
    loss_fn = StructuredHingeLoss(head)
    with pytest.warns(UserWarning, match="zero gradient; solve the head first"):
        loss = loss_fn(backbone(data.x), data.y, offsets=data.offsets)
    loss.backward()
    assert float(backbone.weight.grad.abs().sum()) == 0  # what the warning says
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once per loss, not every step
        loss_fn(backbone(data.x), data.y, offsets=data.offsets)
        head.set_weights(_random_w(model, 6))  # a started head, or a trainable one, says nothing
        StructuredHingeLoss(head)(backbone(data.x), data.y, offsets=data.offsets)
        StructuredHingeLoss(StructuredHead(model, trainable=True))(backbone(data.x), data.y, offsets=data.offsets)


@pytest.mark.parametrize("kind", ["chain", "multiclass"])
def test_head_decodes_like_the_model(kind):
    model, data = _problem(kind, seed=7)
    w = _random_w(model, 8)
    head = StructuredHead(model)
    head.set_weights(w)
    pred = head(data.x, **_layout(data))
    assert torch.equal(pred, model.decode(w, data))
    # float32 features decode in float32 and give the same labels on this problem
    assert torch.equal(head(data.x.float(), **_layout(data)), pred)


def test_padded_layout_equals_packed():
    model, data = _problem("chain", seed=9)
    w = _random_w(model, 10)
    head = StructuredHead(model)
    head.set_weights(w)
    xp, lengths, yp = data.padded(pad_label=-1)
    pred = head(xp, lengths=lengths)
    mask = yp >= 0
    assert torch.equal(pred[mask], head(data.x, offsets=data.offsets))
    assert bool((pred[~mask] == -1).all())
    a = structured_hinge(model, w, xp, yp.clamp(min=0), lengths=lengths, reduction="none")
    b = structured_hinge(model, w, data.x, data.y, offsets=data.offsets, reduction="none")
    assert torch.allclose(a, b)


def test_head_keeps_float64_weights_across_casts_and_roundtrips():
    model = Chain(4, 3)
    head = StructuredHead(model)
    w = _random_w(model, 1)
    head.set_weights(w)
    head.float()
    assert head.w.dtype == torch.float64 and torch.equal(head.w, w)
    other = StructuredHead(Chain(4, 3))
    other.load_state_dict(head.state_dict())
    assert torch.equal(other.w, w)
    f32 = StructuredHead(model, dtype=torch.float32).double()
    assert f32.w.dtype == torch.float32


def test_bad_inputs_are_reported():
    head = StructuredHead(Chain(4, 3))
    x = torch.randn(5, 6)
    with pytest.raises(ValueError, match="features have dimension 6 but the head's Chain model expects 4"):
        head(x, offsets=torch.tensor([0, 5]))
    with pytest.raises(ValueError, match="need offsets"):
        head(torch.randn(5, 4))
    with pytest.raises(ValueError, match="offsets must"):
        head(torch.randn(5, 4), offsets=torch.tensor([0, 3]))
    with pytest.raises(ValueError, match="labels must lie in"):
        StructuredHingeLoss(head)(torch.randn(5, 4), torch.tensor([0, 1, 2, 3, 0]), offsets=torch.tensor([0, 5]))
    with pytest.raises(ValueError, match="shape"):
        head.set_weights(torch.zeros(3))
    with pytest.raises(TypeError, match="StructuredHead supports"):
        StructuredHead(object())
    mc = StructuredHead(Multiclass(3, 4))
    with pytest.raises(ValueError, match="expects 3"):
        mc(torch.randn(2, 5))
    with pytest.raises(ValueError, match="reduction"):
        StructuredHingeLoss(mc, reduction="max")


@requires_cuda
@pytest.mark.cuda
def test_head_and_loss_on_cuda():
    model, data = _problem("chain", seed=11)
    w = _random_w(model, 12)
    head = StructuredHead(model).cuda()
    head.set_weights(w)
    x = data.x.cuda().requires_grad_(True)
    assert torch.equal(head(x, offsets=data.offsets.cuda()).cpu(), model.decode(w, data))
    loss = StructuredHingeLoss(head)(x, data.y.cuda(), offsets=data.offsets.cuda())
    loss.backward()
    ref = structured_hinge(model, w, data.x, data.y, offsets=data.offsets)
    assert float(loss) == pytest.approx(float(ref), abs=1e-10)
    assert x.grad.is_cuda


# ---------------------------------------------------------------------------- dual states on new features
import numpy as np

from torch_bcfw.duals import ActiveSetDualState, ChainDualState, DenseDualState
from torch_bcfw.duals.stepsize import LINE_SEARCH


def _with_features(data, x):
    return SequenceData(x, data.y, data.offsets) if isinstance(data, SequenceData) else MulticlassData(x, data.y)


@pytest.mark.parametrize("kind,state_cls", [("chain", ChainDualState), ("chain", ActiveSetDualState),
                                            ("multiclass", ActiveSetDualState)])
def test_rebind_recomputes_w_from_the_same_dual_variables(kind, state_cls):
    model, data = _problem(kind, seed=13)
    lam = 0.1
    state = state_cls(model, data, lam)
    order = np.random.default_rng(0).integers(0, len(data), 30)
    state.run_steps(order, LINE_SEARCH)
    ell, k = state.ell, state.k
    new = _with_features(data, torch.tanh(data.x * 1.5 + 0.2))
    # replay the same steps on a second state, recording the oracle answers and step sizes: that is alpha
    alpha = [{tuple(_block_y(data, i).tolist()): 1.0} for i in range(len(data))]
    replay = state_cls(model, data, lam)
    for i in order:
        i = int(i)
        y = model.oracle(replay.w, replay.block_data(i))
        _, gamma = replay.block_step(i, y, LINE_SEARCH)
        for key in alpha[i]:
            alpha[i][key] *= 1.0 - gamma
        alpha[i][tuple(y.tolist())] = alpha[i].get(tuple(y.tolist()), 0.0) + gamma
    assert torch.allclose(replay.w, state.w, atol=1e-12)
    drift = state.rebind(new)
    assert drift > 1e-3  # w did go stale
    # w = sum_i w_i with the blocks evaluated at the new features, l unchanged
    blocks = torch.stack([state.block_w(i) for i in range(len(data))])
    assert torch.allclose(blocks.sum(0), state.w, atol=1e-12)
    assert state.ell == pytest.approx(ell, abs=1e-14) and state.k == k
    # explicit alpha mapped with the new features
    w = torch.zeros(model.n_features, dtype=torch.float64)
    for i in range(len(data)):
        blk = new[[i]]
        for lab, a in alpha[i].items():
            w += a * (model.joint_feature(blk, blk.y)[0] - model.joint_feature(blk, torch.tensor(lab))[0]) / (lam * len(data))
    assert torch.allclose(state.w, w, atol=1e-12)
    # the averaged iterate is re-derived too: a state built directly on the new data from the saved
    # dual variables gives the same average, and the state keeps optimising from there
    again = state_cls.from_state_dict(model, new, lam, state.state_dict())
    assert torch.allclose(again.averaged()[0], state.averaged()[0], atol=1e-12)
    gaps = state.run_steps(np.arange(len(data)), LINE_SEARCH)
    assert np.all(gaps >= -1e-12)


def _block_y(data, i):
    return data.y[data.offsets[i]:data.offsets[i + 1]] if isinstance(data, SequenceData) else data.y[i:i + 1]


def test_dense_state_refuses_to_rebind_and_labels_are_checked():
    model, data = _problem("chain", seed=14)
    dense = DenseDualState(model, data, 0.1)
    with pytest.raises(NotImplementedError, match="ActiveSetDualState"):
        dense.rebind(data)
    state = ChainDualState(model, data, 0.1)
    other = SequenceData(data.x, (data.y + 1) % 3, data.offsets)
    with pytest.raises(ValueError, match="other labels"):
        state.rebind(other)
    with pytest.raises(ValueError, match="other examples"):
        ChainDualState.from_state_dict(model, other, 0.1, state.state_dict())
