"""What every data container shares: the :class:`StructuredData` protocol and the helpers that select, pack and
join examples (``as_index``, ``segment_rows``, ``cat_field``, ...), used by the containers of this package and by the
models and tasks that move packed tensors.
"""
from __future__ import annotations

from typing import Protocol, Sequence, runtime_checkable

import torch
from torch import Tensor

from ..checks import check_finite, check_index_tensor, check_input_tensor

__all__ = ["StructuredData", "as_index", "cat_field", "cat_offsets", "check_cat_parts", "counts_to_offsets",
           "dense_features", "segment_rows"]


def as_index(idx, n: int) -> Tensor:
    """Example indices ``idx`` (an int, a slice, a list / array / ``LongTensor`` of ints; negative ones count
    from the end) as a CPU ``LongTensor`` of indices in ``[0, n)``."""
    if isinstance(idx, slice):
        return torch.arange(n)[idx]
    if isinstance(idx, Tensor) and idx.dtype == torch.bool:
        raise TypeError("example indices must hold integers, got a bool tensor (select with mask.nonzero()[:, 0])")
    try:
        idx = check_index_tensor(idx, "example indices").reshape(-1).cpu()
    except ValueError as exc:  # a float index is a type error, as for Python lists
        raise TypeError(str(exc)) from None
    if idx.numel() and (int(idx.min()) < -n or int(idx.max()) >= n):
        raise IndexError(f"example index out of range for {n} examples")
    return torch.where(idx < 0, idx + n, idx)


def counts_to_offsets(counts: Tensor, dtype: torch.dtype = torch.long) -> Tensor:
    """``Tensor[len(counts) + 1]`` on ``counts``' device: 0, then the running sums of ``counts``."""
    out = torch.zeros(counts.numel() + 1, dtype=dtype, device=counts.device)
    out[1:] = torch.cumsum(counts, 0)
    return out


def segment_rows(offsets: Tensor, idx: Tensor) -> tuple[Tensor, Tensor]:
    """The rows of the segments ``idx`` (repeats allowed, in that order) of a packed array with ``offsets``, and
    the offsets of the selection (on ``offsets``' device)."""
    lengths = offsets.diff()[idx]
    new_off = counts_to_offsets(lengths)
    # row k of the selection: start of its segment + position inside the segment
    pos = torch.arange(int(new_off[-1]), device=offsets.device)
    return torch.repeat_interleave(offsets[:-1][idx] - new_off[:-1], lengths) + pos, new_off


def cat_offsets(offsets: Sequence[Tensor]) -> Tensor:
    """The offsets of packed arrays (with ``offsets``) laid one after another."""
    out, base = [offsets[0][:1]], 0
    for off in offsets:
        out.append(off[1:] + base)
        base += int(off[-1])
    return torch.cat(out)


@runtime_checkable
class StructuredData(Protocol):
    """What every data container implements (``isinstance`` checks the methods): ``n`` examples (the blocks of the
    SSVM dual) with their labels packed in ``y`` (``None`` for prediction-only data).

    * ``len(data)``: ``n``; ``data.device``: the device of its tensors;
    * ``data[idx]``: the examples ``idx`` (int, slice, list or ``LongTensor``; repeats allowed), in that order;
    * ``data.to(device)`` / ``to(dtype)`` / ``to(device, dtype)``: moved, and / or the floating-point *features*
      cast (labels, offsets and masks keep their dtypes);
    * ``type(data).cat(parts)``: the examples of non-empty ``parts`` (same feature sizes, one device, labelled all
      or none) one after another.
    """

    y: Tensor | None

    @property
    def device(self) -> torch.device: ...

    def __len__(self) -> int: ...

    def __getitem__(self, idx) -> "StructuredData": ...

    def to(self, *args, **kwargs) -> "StructuredData": ...

    @classmethod
    def cat(cls, parts: Sequence["StructuredData"]) -> "StructuredData": ...


def check_cat_parts(cls, parts: Sequence, key) -> None:
    """The checks of every container's ``cat``: ``parts`` non-empty, all ``cls`` (else ``TypeError``), agreeing on
    ``key(part)`` (feature sizes, device, ...) and labelled all or none."""
    if len(parts) == 0:
        raise ValueError(f"{cls.__name__}.cat needs at least one part")
    bad = [type(p).__name__ for p in parts if not isinstance(p, cls)]
    if bad:
        raise TypeError(f"{cls.__name__}.cat takes {cls.__name__} parts only, got {sorted(set(bad))}")
    keys = {key(p) for p in parts}
    if len(keys) != 1:
        raise ValueError(f"{cls.__name__}.cat: the parts differ in feature sizes or device: {sorted(map(str, keys))}")
    if len({p.y is None for p in parts}) != 1:
        raise ValueError(f"{cls.__name__}.cat: some parts are labelled and others are not")


def cat_field(parts: Sequence, name: str) -> Tensor | None:
    """``torch.cat`` of the parts' ``name`` tensors, or ``None`` when the first part has none."""
    if getattr(parts[0], name) is None:
        return None
    return torch.cat([getattr(p, name) for p in parts])


def dense_features(x, name: str, shape: str) -> Tensor:
    """``x`` as a checked 2-D floating tensor (integers become float64); ``shape`` names its dimensions."""
    x = torch.as_tensor(x)
    check_input_tensor(x, name)
    if not x.is_floating_point():
        x = x.double()
    if x.dim() != 2:
        raise ValueError(f"{name} must be 2-D {shape}, got shape {tuple(x.shape)}")
    check_finite(x, name)
    return x
