"""Data containers for structured prediction.

Two containers cover the models of the core package:

* :class:`MulticlassData` -- one feature vector and one label per example.
* :class:`SequenceData` -- variable-length sequences, stored *packed*: all tokens of all
  sequences are concatenated (``x: Tensor[N_tok, F]``, ``y: LongTensor[N_tok]``) and
  ``offsets: LongTensor[n + 1]`` marks where each sequence starts.  Build one from a padded
  batch (torch-struct style: ``Tensor[B, T, F]`` plus ``lengths``) with
  :meth:`SequenceData.from_padded`, or from a list of per-sequence tensors with
  :meth:`SequenceData.from_sequences`.

Both check their inputs eagerly (shapes, finiteness, non-empty) so that a bad dataset fails
with a clear message instead of producing a silently wrong model.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch
from torch import Tensor

__all__ = ["MulticlassData", "SequenceData", "check_finite"]


def check_finite(x: Tensor, name: str) -> None:
    """Raise ``ValueError`` if ``x`` holds NaN or infinite values."""
    if x.is_floating_point() and not bool(torch.isfinite(x).all()):
        bad = int((~torch.isfinite(x)).sum())
        raise ValueError(f"{name} contains {bad} NaN or infinite value(s)")


def _as_index(idx, n: int) -> Tensor:
    idx = torch.as_tensor(idx, dtype=torch.long).reshape(-1)
    if idx.numel() and (int(idx.min()) < -n or int(idx.max()) >= n):
        raise IndexError(f"example index out of range for {n} examples")
    return torch.where(idx < 0, idx + n, idx)


@dataclass
class MulticlassData:
    """Examples with a single label each.

    Attributes:
        x: ``Tensor[n, F]`` features (floating point).
        y: ``LongTensor[n]`` labels in ``[0, n_classes)``; may be ``None`` for prediction-only data.
    """

    x: Tensor
    y: Tensor | None = None

    def __post_init__(self) -> None:
        self.x = torch.as_tensor(self.x)
        if not self.x.is_floating_point():
            self.x = self.x.double()
        if self.x.dim() != 2:
            raise ValueError(f"MulticlassData.x must be 2-D [n, F], got shape {tuple(self.x.shape)}")
        if self.x.shape[0] == 0:
            raise ValueError("MulticlassData is empty (n = 0 examples)")
        check_finite(self.x, "MulticlassData.x")
        if self.y is not None:
            self.y = torch.as_tensor(self.y)
            if self.y.is_floating_point():
                raise ValueError("MulticlassData.y must hold integer labels")
            self.y = self.y.long()
            if self.y.shape != (self.x.shape[0],):
                raise ValueError(
                    f"MulticlassData.y must have shape [{self.x.shape[0]}], got {tuple(self.y.shape)}"
                )
            if self.y.device != self.x.device:
                raise ValueError(f"x is on {self.x.device} but y is on {self.y.device}")

    def __len__(self) -> int:
        return self.x.shape[0]

    @property
    def device(self) -> torch.device:
        return self.x.device

    def __getitem__(self, idx) -> "MulticlassData":
        idx = _as_index(idx, len(self)).to(self.x.device)
        return MulticlassData(self.x[idx], None if self.y is None else self.y[idx])

    def to(self, device) -> "MulticlassData":
        return MulticlassData(self.x.to(device), None if self.y is None else self.y.to(device))


@dataclass
class SequenceData:
    """Variable-length sequences in packed form.

    Attributes:
        x: ``Tensor[N_tok, F]`` token features, sequences concatenated.
        y: ``LongTensor[N_tok]`` token labels (or ``None`` for prediction-only data).
        offsets: ``LongTensor[n + 1]``; sequence ``i`` is ``x[offsets[i]:offsets[i+1]]``.
    """

    x: Tensor
    y: Tensor | None
    offsets: Tensor

    def __post_init__(self) -> None:
        self.x = torch.as_tensor(self.x)
        if not self.x.is_floating_point():
            self.x = self.x.double()
        self.offsets = torch.as_tensor(self.offsets, dtype=torch.long, device=self.x.device)
        if self.x.dim() != 2:
            raise ValueError(f"SequenceData.x must be 2-D [N_tok, F], got shape {tuple(self.x.shape)}")
        if self.offsets.dim() != 1 or self.offsets.numel() < 2:
            raise ValueError("SequenceData is empty (needs at least one sequence)")
        lengths = self.offsets[1:] - self.offsets[:-1]
        if int(self.offsets[0]) != 0 or int(self.offsets[-1]) != self.x.shape[0]:
            raise ValueError(
                f"offsets must start at 0 and end at N_tok = {self.x.shape[0]}, "
                f"got {int(self.offsets[0])} .. {int(self.offsets[-1])}"
            )
        if bool((lengths <= 0).any()):
            raise ValueError("every sequence must have length >= 1 (found an empty sequence)")
        check_finite(self.x, "SequenceData.x")
        if self.y is not None:
            self.y = torch.as_tensor(self.y)
            if self.y.is_floating_point():
                raise ValueError("SequenceData.y must hold integer labels")
            self.y = self.y.long()
            if self.y.shape != (self.x.shape[0],):
                raise ValueError(
                    f"SequenceData.y must have one label per token ({self.x.shape[0]}), "
                    f"got shape {tuple(self.y.shape)}"
                )
            if self.y.device != self.x.device:
                raise ValueError(f"x is on {self.x.device} but y is on {self.y.device}")

    # ----------------------------------------------------------------- constructors
    @classmethod
    def from_sequences(cls, xs: Sequence[Tensor], ys: Sequence[Tensor] | None = None) -> "SequenceData":
        """Build from per-sequence tensors ``xs[i]: [L_i, F]`` and ``ys[i]: [L_i]``."""
        if len(xs) == 0:
            raise ValueError("SequenceData is empty (no sequences given)")
        xs = [torch.as_tensor(x) for x in xs]
        for i, x in enumerate(xs):
            if x.dim() != 2:
                raise ValueError(f"sequence {i}: features must be [L, F], got shape {tuple(x.shape)}")
        lengths = torch.tensor([x.shape[0] for x in xs], dtype=torch.long)
        offsets = torch.zeros(len(xs) + 1, dtype=torch.long)
        offsets[1:] = torch.cumsum(lengths, 0)
        y = None
        if ys is not None:
            if len(ys) != len(xs):
                raise ValueError(f"got {len(xs)} feature sequences but {len(ys)} label sequences")
            ys = [torch.as_tensor(v).reshape(-1) for v in ys]
            for i, (x, v) in enumerate(zip(xs, ys)):
                if v.shape[0] != x.shape[0]:
                    raise ValueError(f"sequence {i}: {x.shape[0]} feature rows but {v.shape[0]} labels")
            y = torch.cat(ys).to(xs[0].device)
        return cls(torch.cat(xs), y, offsets.to(xs[0].device))

    @classmethod
    def from_padded(cls, x: Tensor, lengths: Tensor, y: Tensor | None = None) -> "SequenceData":
        """Build from a padded batch ``x: [B, T, F]``, ``lengths: [B]`` and ``y: [B, T]``."""
        x = torch.as_tensor(x)
        lengths = torch.as_tensor(lengths, dtype=torch.long, device=x.device)
        if x.dim() != 3:
            raise ValueError(f"padded features must be [B, T, F], got shape {tuple(x.shape)}")
        if lengths.shape != (x.shape[0],):
            raise ValueError(f"lengths must have shape [{x.shape[0]}], got {tuple(lengths.shape)}")
        if x.shape[0] and (int(lengths.max()) > x.shape[1] or int(lengths.min()) < 1):
            raise ValueError(f"lengths must lie in [1, T = {x.shape[1]}]")
        if y is not None:
            y = torch.as_tensor(y, device=x.device)
            if y.shape != x.shape[:2]:
                raise ValueError(f"padded labels must be [B, T] = {tuple(x.shape[:2])}, got {tuple(y.shape)}")
        mask = torch.arange(x.shape[1], device=x.device)[None, :] < lengths[:, None]
        offsets = torch.zeros(x.shape[0] + 1, dtype=torch.long, device=x.device)
        offsets[1:] = torch.cumsum(lengths, 0)
        return cls(x[mask], None if y is None else y[mask], offsets)

    # ----------------------------------------------------------------- views
    def __len__(self) -> int:
        return self.offsets.numel() - 1

    @property
    def device(self) -> torch.device:
        return self.x.device

    @property
    def lengths(self) -> Tensor:
        """``LongTensor[n]`` sequence lengths."""
        return self.offsets[1:] - self.offsets[:-1]

    @property
    def n_tokens(self) -> int:
        return self.x.shape[0]

    def token_sequence_ids(self) -> Tensor:
        """``LongTensor[N_tok]``: the sequence index of every token."""
        return torch.repeat_interleave(torch.arange(len(self), device=self.device), self.lengths)

    def __getitem__(self, idx) -> "SequenceData":
        idx = _as_index(idx, len(self))
        off = self.offsets.cpu()
        lengths = (off[1:] - off[:-1])[idx]
        starts = off[:-1][idx]
        # token k of the selection: start of its sequence + position inside the sequence
        first_slot = torch.cumsum(lengths, 0) - lengths
        tok = torch.repeat_interleave(starts - first_slot, lengths) + torch.arange(int(lengths.sum()))
        tok = tok.to(self.device)
        offsets = torch.zeros(idx.numel() + 1, dtype=torch.long)
        offsets[1:] = torch.cumsum(lengths, 0)
        return SequenceData(self.x[tok], None if self.y is None else self.y[tok], offsets.to(self.device))

    def to(self, device) -> "SequenceData":
        return SequenceData(
            self.x.to(device), None if self.y is None else self.y.to(device), self.offsets.to(device)
        )

    def padded(self, pad_label: int = -1) -> tuple[Tensor, Tensor, Tensor | None]:
        """Return ``(x [B, T, F], lengths [B], y [B, T] or None)`` padded with zeros / ``pad_label``."""
        n, T = len(self), int(self.lengths.max())
        mask = torch.arange(T, device=self.device)[None, :] < self.lengths[:, None]
        xp = self.x.new_zeros(n, T, self.x.shape[1])
        xp[mask] = self.x
        yp = None
        if self.y is not None:
            yp = torch.full((n, T), pad_label, dtype=torch.long, device=self.device)
            yp[mask] = self.y
        return xp, self.lengths, yp
