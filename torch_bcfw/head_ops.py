"""Differentiable scores, decoding and losses of the linear models, for :class:`torch_bcfw.nn.StructuredHead`.

A model's :meth:`~torch_bcfw.models.base.StructuredModel.head_ops` returns one of these objects (or ``None``), with

* ``model``, ``n_inputs`` (the backbone's feature dimension ``F``), ``n_labels`` (labels per position) and
  ``sequences`` (``True``: packed ``[N_tok, F]`` / padded ``[B, T, F]`` sequences; ``False``: rows ``[B, F]``);
* ``decode(w, x, offsets, y=None)`` -- the (loss-augmented, when ``y`` is given) argmax labels, no gradient needed;
* ``scores(w, x, offsets, y)`` -- ``<w, phi(x_i, y_i)>`` per example, differentiable in ``w`` and ``x``;
* ``loss(y_pred, y, offsets, dtype)`` -- the task loss ``L_i(y_pred)`` per example.

``offsets`` is ``LongTensor[n + 1]`` for sequences and ``None`` for rows.
"""
from __future__ import annotations

import torch
from torch import Tensor, nn

from .inference.viterbi import viterbi_packed

__all__ = ["ChainHeadOps", "MulticlassHeadOps"]


def _token_sequences(offsets: Tensor) -> tuple[int, Tensor, Tensor]:
    """``(n, lengths [n], the sequence of every token [N_tok])`` of packed sequences with ``offsets``."""
    n = offsets.numel() - 1
    lengths = offsets[1:] - offsets[:-1]
    return n, lengths, torch.repeat_interleave(torch.arange(n, device=offsets.device), lengths)


class ChainHeadOps:
    """A :class:`~torch_bcfw.models.Chain` on packed token features ``x: [N_tok, F]`` with ``offsets: [n + 1]``."""

    sequences = True

    def __init__(self, model):
        self.model = model
        self.n_inputs = model.n_inputs
        self.n_labels = model.n_labels

    def unaries(self, w: Tensor, x: Tensor, offsets: Tensor) -> Tensor:
        """Emission plus start / end scores ``[N_tok, K]``, differentiable in ``w`` and ``x``."""
        We, b, s, e, _ = self.model.unpack(w)
        U = x @ We + b
        n = offsets.numel() - 1
        U = U.index_add(0, offsets[:-1], s.expand(n, -1))
        return U.index_add(0, offsets[1:] - 1, e.expand(n, -1))

    def loss_unaries(self, y: Tensor, offsets: Tensor, dtype) -> Tensor:
        """The normalised Hamming loss as per-token scores ``[N_tok, K]`` (``1 / length`` off the true label)."""
        lengths = offsets[1:] - offsets[:-1]
        inv_len = (1.0 / lengths.to(dtype)).repeat_interleave(lengths)
        aug = inv_len[:, None].expand(-1, self.model.n_labels).clone()
        aug[torch.arange(y.numel(), device=y.device), y] = 0.0
        return aug

    def decode(self, w: Tensor, x: Tensor, offsets: Tensor, y: Tensor | None = None) -> Tensor:
        """Viterbi labels ``[N_tok]`` (loss-augmented against ``y`` when given)."""
        U = self.unaries(w, x, offsets)
        if y is not None:
            U = U + self.loss_unaries(y, offsets, U.dtype)
        labels, _ = viterbi_packed(U, offsets, self.model.unpack(w)[4])
        return labels

    def scores(self, w: Tensor, x: Tensor, offsets: Tensor, y: Tensor) -> Tensor:
        """``<w, phi(x_i, y_i)>`` per sequence, differentiable in ``w`` and ``x``: ``[n]``."""
        U = self.unaries(w, x, offsets)
        n, _, seq = _token_sequences(offsets)
        out = U.new_zeros(n).index_add(0, seq, U.gather(1, y[:, None])[:, 0])
        keep = torch.ones(y.numel(), dtype=torch.bool, device=x.device)
        keep[offsets[1:] - 1] = False
        j = torch.nonzero(keep)[:, 0]
        trans = self.model.unpack(w)[4]
        return out.index_add(0, seq[j], trans[y[j], y[j + 1]])

    def loss(self, y_pred: Tensor, y: Tensor, offsets: Tensor, dtype) -> Tensor:
        """Normalised Hamming loss per sequence ``[n]``."""
        n, lengths, seq = _token_sequences(offsets)
        wrong = torch.zeros(n, dtype=dtype, device=y.device).index_add(0, seq, (y_pred != y).to(dtype))
        return wrong / lengths.to(dtype)


class MulticlassHeadOps:
    """A :class:`~torch_bcfw.models.Multiclass` model on rows ``x: [B, F]`` (one example each)."""

    sequences = False

    def __init__(self, model):
        self.model = model
        self.n_inputs = model.n_inputs
        self.n_labels = model.n_labels

    def class_scores(self, w: Tensor, x: Tensor) -> Tensor:
        """``[B, n_labels]`` scores, differentiable in ``w`` and ``x``."""
        W = w.view(self.model.n_labels, -1)
        s = x @ W[:, : self.n_inputs].T
        return s + W[:, self.n_inputs] if self.model.bias else s

    def decode(self, w: Tensor, x: Tensor, offsets=None, y: Tensor | None = None) -> Tensor:
        """Arg-max classes ``[B]`` (loss-augmented against ``y`` when given)."""
        s = self.class_scores(w, x)
        if y is not None:
            s = s + 1.0 - nn.functional.one_hot(y, self.model.n_labels).to(s.dtype)
        return s.argmax(1)

    def scores(self, w: Tensor, x: Tensor, offsets, y: Tensor) -> Tensor:
        """``<w, phi(x_i, y_i)>`` per example ``[B]``, differentiable in ``w`` and ``x``."""
        return self.class_scores(w, x).gather(1, y[:, None])[:, 0]

    def loss(self, y_pred: Tensor, y: Tensor, offsets, dtype) -> Tensor:
        """0/1 loss per example ``[B]``."""
        return (y_pred != y).to(dtype)
