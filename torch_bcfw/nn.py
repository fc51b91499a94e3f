"""``torch.nn`` building blocks: a structured linear head and the structured hinge loss.

* :class:`StructuredHead` holds the weights ``w`` of a linear structured model on a backbone's features
  ``x = f_theta(raw)`` and decodes (``argmax_y <w, phi(x, y)>``) on the device of the features, with the
  model's differentiable operations (:meth:`~torch_bcfw.models.base.StructuredModel.head_ops`).
* :func:`pose_hinge` is the structured hinge of a pose tree (:class:`~torch_bcfw.models.PoseTree`) differentiable in
  its unary maps: a heatmap network trained for the tree that decodes it.
* :class:`StructuredHingeLoss` is the SSVM loss of a batch,
  ``1/B sum_i max_y [L_i(y) + <w, phi(x_i, y)>] - <w, phi(x_i, y_i)>`` (plus ``lam/2 ||w||^2`` when asked): the
  maximisation runs without gradient, the hinge is rebuilt with differentiable ops, so autograd gives a
  subgradient in the features (and ``w``).

``w`` is a **float64 buffer** by default (``trainable=False``): written by BCFW, saved bit for bit in the
``state_dict``, and kept in its dtype when the module is cast; scores are computed in the features' dtype.  With
``trainable=True`` it is an ``nn.Parameter``.

Input layouts (chains): *packed* ``x: [N_tok, F]`` with ``offsets: LongTensor[n + 1]``, or *padded*
``x: [B, T, F]`` with ``lengths: [B]`` (``None``: all of length ``T``); labels ``[N_tok]`` or ``[B, T]``.
Multiclass: ``x: [B, F]``, labels ``[B]``.
"""
from __future__ import annotations

import math
import warnings
from typing import NamedTuple

import torch
from torch import Tensor, nn

from .checks import check_index_tensor, check_offsets
from .data.base import counts_to_offsets
from .data.poses import PoseData
from .models.base import StructuredModel

__all__ = ["HingeDecoding", "StructuredHead", "StructuredHingeLoss", "pose_hinge", "structured_hinge"]


def _ops_for(model: StructuredModel):
    ops = model.head_ops() if isinstance(model, StructuredModel) else None
    if ops is None:
        raise TypeError(f"StructuredHead supports models with differentiable head operations (StructuredModel.head_ops: "
                        f"Chain, Multiclass), got {type(model).__name__}")
    return ops


# ---------------------------------------------------------------------------- layouts
def _pack(ops, x: Tensor, offsets, lengths, y: Tensor | None):
    """Bring the inputs to the packed layout: ``(x [N, F], offsets or None, y or None, unpack fn)``."""
    if x.dim() not in (2, 3):
        raise ValueError(f"features must be [N, F] (packed) or [B, T, F] (padded), got shape {tuple(x.shape)}")
    if x.shape[-1] != ops.n_inputs:
        raise ValueError(
            f"features have dimension {x.shape[-1]} but the head's {type(ops.model).__name__} model expects "
            f"{ops.n_inputs} (d = {ops.model.n_features})"
        )
    if not x.is_floating_point():
        raise ValueError(f"features must be floating point, got {x.dtype}")
    if not ops.sequences:
        if x.dim() != 2:
            raise ValueError(f"a multiclass head expects features [B, F], got shape {tuple(x.shape)}")
        if y is not None and y.shape != (x.shape[0],):
            raise ValueError(f"labels must have shape [{x.shape[0]}], got {tuple(y.shape)}")
        return x, None, y, lambda lab: lab
    if x.dim() == 3:
        if offsets is not None:
            raise ValueError("padded features [B, T, F] take lengths=..., not offsets=...")
        B, T, _ = x.shape
        if lengths is None:
            lengths = torch.full((B,), T, dtype=torch.long, device=x.device)
        lengths = check_index_tensor(lengths, "lengths", device=x.device)
        if lengths.shape != (B,) or (B and (int(lengths.min()) < 1 or int(lengths.max()) > T)):
            raise ValueError(f"lengths must be [B] = [{B}] with values in [1, {T}]")
        mask = torch.arange(T, device=x.device)[None, :] < lengths[:, None]
        offsets = counts_to_offsets(lengths)
        if y is not None:
            if y.shape != (B, T):
                raise ValueError(f"padded labels must be [B, T] = {(B, T)}, got {tuple(y.shape)}")
            y = y[mask]

        def unpack(lab: Tensor) -> Tensor:
            out = torch.full((B, T), -1, dtype=torch.long, device=x.device)
            out[mask] = lab
            return out

        return x[mask], offsets, y, unpack
    if offsets is None:
        raise ValueError("packed chain features [N_tok, F] need offsets=LongTensor[n + 1]")
    offsets = check_index_tensor(offsets, "offsets", device=x.device)
    check_offsets(offsets, x.shape[0], "offsets", "N_tok", "sequence")
    if y is not None and y.shape != (x.shape[0],):
        raise ValueError(f"packed labels must be [N_tok] = [{x.shape[0]}], got {tuple(y.shape)}")
    return x, offsets, y, lambda lab: lab


def _pack_labelled(ops, x: Tensor, y, offsets, lengths) -> tuple[Tensor, Tensor | None, Tensor]:
    """:func:`_pack` with labels ``y``, checked to lie in ``[0, n_labels)``: ``(x, offsets, y)``."""
    x, offsets, y, _ = _pack(ops, x, offsets, lengths, torch.as_tensor(y, device=x.device))
    y = y.long()
    K = ops.n_labels
    if y.numel() and (int(y.min()) < 0 or int(y.max()) >= K):
        raise ValueError(f"labels must lie in [0, {K - 1}], got range [{int(y.min())}, {int(y.max())}]")
    return x, offsets, y


def _check_reduction(reduction: str) -> None:
    if reduction not in ("mean", "sum", "none"):
        raise ValueError(f"reduction must be 'mean', 'sum' or 'none', got {reduction!r}")


class HingeDecoding(NamedTuple):
    """What :func:`structured_hinge` decoded for a batch of ``n`` examples, packed: the features ``x [N, F]``
    (detached), labels ``y [N]``, ``offsets [n + 1]`` (``None`` for one row per example) and the loss-augmented
    decodings ``y_star [N]`` at the weights it scored with: the BCFW oracle's answers for these examples
    (:class:`~torch_bcfw.head_optimizer.BCFWHeadOptimizer`)."""

    x: Tensor
    y: Tensor
    offsets: Tensor | None
    y_star: Tensor


def structured_hinge(model: StructuredModel, w: Tensor, x: Tensor, y: Tensor, offsets=None, lengths=None,
                     reduction: str = "mean") -> Tensor:
    """Structured hinge ``H_i = max_y [L_i(y) + <w, phi(x_i, y)>] - <w, phi(x_i, y_i)>`` of a batch, in ``x``'s
    dtype: the argmax ``y*`` is found without gradient, then ``H_i`` is differentiable in ``x`` and ``w`` (a
    subgradient).  ``reduction``: ``"mean"`` (default), ``"sum"`` or ``"none"`` (``Tensor[n]``).
    """
    return _hinge_and_decoding(model, w, x, y, offsets, lengths, reduction)[0]


def _hinge_and_decoding(model, w, x, y, offsets, lengths, reduction) -> tuple[Tensor, HingeDecoding]:
    """:func:`structured_hinge` and the batch's :class:`HingeDecoding`."""
    _check_reduction(reduction)
    ops = _ops_for(model)
    x, offsets, y = _pack_labelled(ops, x, y, offsets, lengths)
    if w.shape != (model.n_features,):
        raise ValueError(f"weights must have shape [{model.n_features}], got {tuple(w.shape)}")
    w = w.to(device=x.device, dtype=x.dtype)
    with torch.no_grad():
        y_star = ops.decode(w.detach(), x.detach(), offsets, y)
    H = ops.loss(y_star, y, offsets, x.dtype) + ops.scores(w, x, offsets, y_star) - ops.scores(w, x, offsets, y)
    dec = HingeDecoding(x.detach(), y, offsets, y_star)
    if reduction == "mean":
        return H.mean(), dec
    if reduction == "sum":
        return H.sum(), dec
    return H, dec


def pose_hinge(model: StructuredModel, w: Tensor, data: PoseData, unary: Tensor, type_unary: Tensor | None = None,
               reduction: str = "mean") -> Tensor:
    """Structured hinge of a pose tree, differentiable in its unary maps (a tree trained with its unaries).

    ``H_i = max_y [L_i(y) + <w, psi(u_i, y)>] - <w, psi(u_i, y_i)>`` where the unary part of ``psi`` reads the maps
    ``u = unary`` at each joint's cell (and, with ``type_features``, ``type_unary`` at both ends of every edge).
    The loss-augmented MAP ``y*`` is the model's exact oracle, run without gradient; ``H`` is then rebuilt from
    ``u``, so autograd gives the subgradient ``w_U[j] (e_{y*_j} - e_{y_ij})`` in each joint's map (and the type
    maps' counterpart).  Its value equals the hinge of ``data`` (float64).

    Args:
        model: the tree (a :class:`~torch_bcfw.models.PoseTree`, or any model of ``PoseData`` whose joint feature
            reads the maps by indexing).
        w: its weights ``[d]`` (e.g. a BCFW solve of the same tree; quadratic weights ``>= 0``).
        data: labelled :class:`~torch_bcfw.data.PoseData` whose ``unary`` (and ``type_unary``) are
            ``unary.detach()`` (and ``type_unary.detach()``): the labels, visibility, torso sizes and types.
        unary: the maps ``[n, J, K_u, G, G]`` (or ``[n, J, G, G]``) the gradient flows into.
        type_unary: ``[n, E, K, 2, G, G]`` for a ``type_features`` model (else ``None``).
        reduction: ``"mean"`` (default), ``"sum"`` or ``"none"`` (``Tensor[n]``).
    """
    _check_reduction(reduction)
    if not isinstance(model, StructuredModel) or not isinstance(data, PoseData):
        raise TypeError(f"pose_hinge needs a model of PoseData (a PoseTree) and PoseData, got "
                        f"{type(model).__name__} and {type(data).__name__}")
    model.check_data(data, require_labels=True)
    unary = unary.unsqueeze(2) if unary.dim() == 4 else unary
    if unary.shape != data.unary.shape or unary.device != data.device:
        raise ValueError(f"unary must have the shape and device of data.unary {tuple(data.unary.shape)} "
                         f"({data.device}), got {tuple(unary.shape)} ({unary.device})")
    if not torch.equal(unary.detach(), data.unary):
        raise ValueError("data.unary must be unary.detach(): the decodings and the hinge would score different maps")
    if (type_unary is None) != (data.type_unary is None):
        raise ValueError("give type_unary exactly when data has type_unary (a PoseTree(type_features=True) head)")
    if type_unary is not None and not torch.equal(type_unary.detach(), data.type_unary):
        raise ValueError("data.type_unary must be type_unary.detach()")
    with torch.no_grad():
        y_star = model.oracle(w.detach(), data)
    # the same labels over the live maps (validated above as equal to data's, so no second check)
    live = PoseData(unary, data.positions, data.visible, data.torso, data.types, type_unary, check=False)
    w = w.to(device=data.device, dtype=torch.float64)
    H = model.loss(data, y_star) + (model.joint_feature(live, y_star) - model.joint_feature(live, data.y)) @ w
    if reduction == "mean":
        return H.mean()
    return H.sum() if reduction == "sum" else H


# ---------------------------------------------------------------------------- modules
class StructuredHead(nn.Module):
    """The linear weights of a structured model, as a module that decodes.

    Args:
        model: a model with differentiable head operations (:meth:`~torch_bcfw.models.base.StructuredModel.head_ops`:
            :class:`~torch_bcfw.models.Chain`, :class:`~torch_bcfw.models.Multiclass`); its input dimension
            ``model.n_inputs`` is the backbone's feature dimension.
        trainable: ``False`` (default): ``w`` is a buffer written by BCFW (:class:`torch_bcfw.lightning.BCFWCallback`
            or :meth:`set_weights`); ``True``: an ``nn.Parameter`` trained with the backbone.
        dtype: storage dtype of ``w`` (default float64, kept across module casts).

    ``forward(x, offsets=None, lengths=None)`` returns the decoded labels in the layout of ``x`` (``[N_tok]``,
    ``[B, T]`` with -1 beyond each length, or ``[B]``).
    """

    def __init__(self, model: StructuredModel, trainable: bool = False, dtype: torch.dtype = torch.float64):
        super().__init__()
        self.ops = _ops_for(model)
        self.model = model
        self.trainable = bool(trainable)
        self.w_dtype = dtype
        w = torch.zeros(model.n_features, dtype=dtype)
        if self.trainable:
            self.w = nn.Parameter(w)
        else:
            self.register_buffer("w", w)

    @property
    def n_inputs(self) -> int:
        """Feature dimension ``F`` expected from the backbone."""
        return self.ops.n_inputs

    @property
    def n_features(self) -> int:
        """Dimension ``d`` of ``w``."""
        return self.model.n_features

    def extra_repr(self) -> str:
        return (f"{type(self.model).__name__}({self.model.config()}), d={self.n_features}, "
                f"{'parameter' if self.trainable else 'buffer'}, dtype={self.w_dtype}")

    def _apply(self, fn, recurse=True):
        # keep w's storage dtype (and its bits) across .float() / .half() / .double(); follow device moves
        store = self._parameters if self.trainable else self._buffers
        w = store.pop("w")
        try:
            out = super()._apply(fn, recurse)
        finally:
            with torch.no_grad():
                dev = fn(w.detach()).device
            if dev != w.device:
                if self.trainable:
                    w.data = w.data.to(dev)
                else:
                    w = w.to(dev)
            store["w"] = w
        return out

    @torch.no_grad()
    def set_weights(self, w: Tensor) -> None:
        """Copy ``w: [d]`` into the head (device and dtype of the head)."""
        w = torch.as_tensor(w)
        if w.shape != (self.n_features,):
            raise ValueError(f"weights must have shape [{self.n_features}], got {tuple(w.shape)}")
        if not bool(torch.isfinite(w).all()):
            raise ValueError("weights contain NaN or infinite values")
        self.w.copy_(w.to(self.w.device, self.w.dtype))

    def forward(self, x: Tensor, offsets: Tensor | None = None, lengths: Tensor | None = None) -> Tensor:
        x, offsets, _, unpack = _pack(self.ops, x, offsets, lengths, None)
        with torch.no_grad():
            labels = self.ops.decode(self.w.detach().to(x.device, x.dtype), x.detach(), offsets)
        return unpack(labels)

    def score(self, x: Tensor, y: Tensor, offsets: Tensor | None = None, lengths: Tensor | None = None) -> Tensor:
        """``<w, phi(x_i, y_i)>`` per example (differentiable in ``x`` and ``w``)."""
        x, offsets, y = _pack_labelled(self.ops, x, y, offsets, lengths)
        return self.ops.scores(self.w.to(x.device, x.dtype), x, offsets, y)


class StructuredHingeLoss(nn.Module):
    """The SSVM loss of a batch at the weights of ``head``: :func:`structured_hinge` plus ``lam/2 ||w||^2``.

    Args:
        head: the :class:`StructuredHead` whose weights score the labelings.
        lam: regularisation added as ``lam/2 ||w||^2`` (default 0).
        reduction: ``"mean"`` (default: the SSVM objective on the batch), ``"sum"`` or ``"none"``.
        scale: score the labelings at ``scale * w`` (default 1): the margin the backbone trains for, apart from the
            head that predicts (a head solved by BCFW at the ``lam`` held-out data chose predicts with ``w``; the
            backbone's hinge sees ``scale * w``: ``scale > 1`` asks for fewer violated margins, as a smaller ``lam``
            would).  The regulariser and the decodings (:attr:`last_decoding`) are at ``scale * w`` too.

    ``loss(x, y, offsets=None, lengths=None)`` in the layouts of the module docstring; the gradient flows into
    ``x`` and, for a trainable head, into ``w``.

    After every call, :attr:`last_decoding` is the batch's :class:`HingeDecoding` (its loss-augmented decodings:
    what :class:`~torch_bcfw.head_optimizer.BCFWHeadOptimizer` steps with).

    At ``w = 0`` the hinge's gradient in the features is zero (every score is 0): a head whose ``w`` is a buffer
    (``trainable=False``) must be solved first (:class:`~torch_bcfw.lightning.BCFWCallback` with
    ``initial_passes > 0``, its default) or given a start with :meth:`StructuredHead.set_weights`; the first
    training call of such a head at ``w = 0`` warns once (``UserWarning``).
    """

    def __init__(self, head: StructuredHead, lam: float = 0.0, reduction: str = "mean", scale: float = 1.0):
        super().__init__()
        if not isinstance(head, StructuredHead):
            raise TypeError(f"StructuredHingeLoss needs a StructuredHead, got {type(head).__name__}")
        if lam < 0:
            raise ValueError(f"lam must be >= 0, got {lam}")
        if not (isinstance(scale, (int, float)) and math.isfinite(scale) and scale > 0):
            raise ValueError(f"scale must be a finite number > 0, got {scale!r}")
        self.scale = float(scale)
        _check_reduction(reduction)
        self.head = [head]  # a list: do not register the head as a submodule of the loss
        self.lam = float(lam)
        self.reduction = reduction
        self._checked_start = False
        self.last_decoding: HingeDecoding | None = None

    def _warn_if_zero_start(self, head: StructuredHead) -> None:
        """Once, at the first training call: warn when a buffer head is still at ``w = 0`` (the backbone would get
        zero gradient)."""
        self._checked_start = True
        if not head.trainable and not bool(head.w.detach().any()):
            warnings.warn("StructuredHingeLoss: the head's weights are zero, so the structured hinge gives the "
                          "backbone zero gradient; solve the head first (BCFWCallback with initial_passes > 0) or "
                          "start it with head.set_weights(...) (e.g. small random weights)", UserWarning, stacklevel=3)

    def forward(self, x: Tensor, y: Tensor, offsets: Tensor | None = None, lengths: Tensor | None = None) -> Tensor:
        head = self.head[0]
        if not self._checked_start and x.requires_grad:
            self._warn_if_zero_start(head)
        w = head.w if self.scale == 1.0 else self.scale * head.w
        H, self.last_decoding = _hinge_and_decoding(head.model, w, x, y, offsets, lengths, self.reduction)
        if self.lam:
            w = w.to(x.device, x.dtype)
            H = H + 0.5 * self.lam * (w @ w)
        return H
