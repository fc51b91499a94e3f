"""Pose examples on a ``G x G`` grid: the data container of :class:`~torch_bcfw.models.PoseTree`.

One example is an image with ``J`` joints: ``K`` unary features per joint and grid cell, the true cells, the
joints the loss counts, the torso size that scales the loss and, for mixture types, the true edge types and
optional type features.  Labels are packed one block per image (``J`` flat cells ``y * G + x``, then ``E`` edge
types); :attr:`PoseData.positions` gives the ``[n, J, 2]`` view.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from ..checks import check_finite, check_input_tensor, check_not_meta
from .base import as_index, cat_field, check_cat_parts

__all__ = ["PoseData", "flat_to_positions"]


class PoseData:
    """Pose examples on a ``G x G`` grid: unary features, true cells, visibility, torso size.

    Args:
        unary: float ``[n, J, K, G, G]``: ``K`` features per joint and cell (``[n, J, G, G]`` is taken as
            ``K = 1``), finite.
        positions: true cells, integer ``[n, J, 2]`` in ``(y, x)`` order, each in ``[0, G)`` (invisible joints
            imputed: :func:`~torch_bcfw.models.pose.impute_positions`), or ``None`` (unlabelled data).
        visible: bool ``[n, J]``: the joints the loss counts (default: all).
        torso: ``[n]`` torso size ``s_i`` in grid units, finite and ``> 0`` (default: ``G``).
        types: true mixture type of every tree edge, integer ``[n, E]`` (e.g.
            :meth:`~torch_bcfw.models.PoseTree.nearest_types`), or ``None`` (one type per edge, or unlabelled).
        type_unary: optional image-dependent type features, finite float ``[n, E, K, 2, G, G]``: for edge ``e`` in
            type ``k``, a feature at the child's cell (side 0) and the parent's (side 1), e.g. a CNN's
            ``log p(t_e = k | image)`` (Chen & Yuille 2014), for ``PoseTree(type_features=True)``.
        check: validate (default; subsets of a valid set skip it).

    Attributes:
        unary, visible, torso, types, type_unary: as given (``visible`` / ``torso`` filled in when omitted).
        y: ``LongTensor[n * (J + E)]`` packed labelings (see the module docstring; ``None`` without positions).
        offsets: ``LongTensor[n + 1]`` ``= arange(n + 1) * n_labels``.

    Raises:
        ValueError: wrong shapes or dtypes, NaN / infinite values, cells outside the grid, a bad torso size.
    """

    def __init__(self, unary: Tensor, positions: Tensor | None = None, visible: Tensor | None = None,
                 torso: Tensor | None = None, types: Tensor | None = None, type_unary: Tensor | None = None,
                 check: bool = True):
        if check:
            for name, t in (("unary", unary), ("positions", positions), ("visible", visible), ("torso", torso),
                            ("types", types), ("type_unary", type_unary)):
                check_not_meta(t, f"PoseData.{name}")
        unary = torch.as_tensor(unary)
        if unary.dim() == 4:
            unary = unary.unsqueeze(2)
        if check:
            _check_unary(unary)
        n, J, _, G, _ = unary.shape
        dev = unary.device
        self.unary = unary
        self.visible = (torch.ones(n, J, dtype=torch.bool, device=dev) if visible is None
                        else torch.as_tensor(visible, device=dev))
        self.torso = (torch.full((n,), float(G), dtype=torch.float64, device=dev) if torso is None
                      else torch.as_tensor(torso, device=dev))
        self.types = None
        self.y = None
        self.type_unary = None if type_unary is None else torch.as_tensor(type_unary, device=dev)
        if check and self.type_unary is not None:
            _check_type_unary(self.type_unary, n, G)
        if types is not None:
            if positions is None:
                raise ValueError("edge types need the true positions too")
            self.types = torch.as_tensor(types, device=dev)
            if check:
                _check_types(self.types, n)
            self.types = self.types.long()
        if positions is not None:
            positions = torch.as_tensor(positions, device=dev)
            if check:
                _check_positions(positions, n, J, G)
            cells = (positions[..., 0] * G + positions[..., 1]).long()
            self.y = (cells if self.types is None else torch.cat((cells, self.types), dim=1)).reshape(-1)
        self.offsets = torch.arange(n + 1, device=dev) * self.n_labels
        if check:
            _check_visible_torso(self.visible, self.torso, n, J)

    def __len__(self) -> int:
        return self.unary.shape[0]

    @property
    def n_joints(self) -> int:
        return self.unary.shape[1]

    @property
    def n_unary(self) -> int:
        """``K``, the unary features per joint and cell."""
        return self.unary.shape[2]

    @property
    def grid_size(self) -> int:
        return self.unary.shape[-1]

    @property
    def n_labels(self) -> int:
        """Labels per image: ``J`` cells, plus ``E`` edge types when the data has types."""
        return self.n_joints + (0 if self.types is None else self.types.shape[1])

    @property
    def device(self) -> torch.device:
        return self.unary.device

    def __repr__(self) -> str:
        return (f"PoseData(n={len(self)}, joints={self.n_joints}, K={self.n_unary}, grid={self.grid_size}, "
                f"labelled={self.y is not None}, typed={self.types is not None}, device={self.device})")

    @property
    def positions(self) -> Tensor | None:
        """True cells ``LongTensor[n, J, 2]`` in ``(y, x)`` order (``None`` if unlabelled)."""
        if self.y is None:
            return None
        return flat_to_positions(self.y.view(len(self), -1)[:, : self.n_joints], len(self), self.n_joints,
                                 self.grid_size)

    @classmethod
    def _of(cls, unary: Tensor, visible: Tensor, torso: Tensor, types: Tensor | None, type_unary: Tensor | None,
            y: Tensor | None) -> "PoseData":
        """A container of valid fields, unchecked; ``offsets`` derived."""
        out = cls.__new__(cls)
        out.unary, out.visible, out.torso = unary, visible, torso
        out.types, out.type_unary, out.y = types, type_unary, y
        out.offsets = torch.arange(len(out) + 1, device=out.device) * out.n_labels
        return out

    def __getitem__(self, idx) -> "PoseData":
        """The examples ``idx`` (int, slice, list or ``LongTensor``; repeats allowed), in that order."""
        i = as_index(idx, len(self)).to(self.device)
        pick = lambda t: None if t is None else t[i]  # noqa: E731
        y = None if self.y is None else self.y.view(len(self), -1)[i].reshape(-1)
        return PoseData._of(self.unary[i], self.visible[i], self.torso[i], pick(self.types), pick(self.type_unary), y)

    @classmethod
    def cat(cls, parts: Sequence["PoseData"]) -> "PoseData":
        """Concatenate datasets of the same ``J, K, G``, edge types and type features (labelled all or none), in
        order."""
        check_cat_parts(cls, parts, lambda p: (tuple(p.unary.shape[1:]), str(p.device)))
        if len({None if p.types is None else p.types.shape[1] for p in parts}) != 1:
            raise ValueError("PoseData.cat: the parts do not all have the same edge types (or none)")
        if len({None if p.type_unary is None else tuple(p.type_unary.shape[1:]) for p in parts}) != 1:
            raise ValueError("PoseData.cat: the parts do not all have type features of the same shape (or none)")
        fields = ("unary", "visible", "torso", "types", "type_unary", "y")
        return cls._of(*(cat_field(parts, name) for name in fields))

    def to(self, *args, **kwargs) -> "PoseData":
        """Move to a device and / or cast the unary (and type) features (``to(device)``, ``to(dtype)``,
        ``to(device, dtype)``)."""
        unary = self.unary.to(*args, **kwargs)
        move = lambda t: None if t is None else t.to(unary.device)  # noqa: E731
        type_unary = None if self.type_unary is None else self.type_unary.to(*args, **kwargs)
        return PoseData._of(unary, move(self.visible), move(self.torso), move(self.types), type_unary, move(self.y))


def _check_unary(unary: Tensor) -> None:
    check_input_tensor(unary, "PoseData.unary")
    if unary.dim() != 5 or not unary.is_floating_point():
        raise ValueError(f"unary features must be a float tensor [n, J, K, G, G] (or [n, J, G, G]), "
                         f"got {unary.dtype} of shape {tuple(unary.shape)}")
    n, J, K, gy, gx = unary.shape
    if gy != gx:
        raise ValueError(f"the grid must be square (G x G), got {gy} x {gx}")
    if min(n, J, K, gy) < 1:
        raise ValueError(f"unary features must be non-empty, got shape {tuple(unary.shape)}")
    check_finite(unary, "unary features")


def _check_type_unary(type_unary: Tensor, n: int, G: int) -> None:
    check_input_tensor(type_unary, "PoseData.type_unary")
    if type_unary.dim() != 6 or not type_unary.is_floating_point():
        raise ValueError(f"type_unary must be a float tensor [n, E, K, 2, G, G], got {type_unary.dtype} "
                         f"{tuple(type_unary.shape)}")
    if type_unary.shape[0] != n or type_unary.shape[3] != 2 or tuple(type_unary.shape[-2:]) != (G, G):
        raise ValueError(f"type_unary must have shape [{n}, E, K, 2, {G}, {G}] (side 0: child, 1: parent), got "
                         f"{tuple(type_unary.shape)}")
    check_finite(type_unary, "type_unary")


def _check_positions(positions: Tensor, n: int, J: int, G: int) -> None:
    if positions.shape != (n, J, 2):
        raise ValueError(f"positions must have shape [n, J, 2] = [{n}, {J}, 2], got {tuple(positions.shape)}")
    if positions.is_floating_point() or positions.is_complex() or positions.dtype == torch.bool:
        raise ValueError(f"positions must be integer grid cells (use impute_positions), got {positions.dtype}")
    if positions.numel() and (int(positions.min()) < 0 or int(positions.max()) >= G):
        raise ValueError(f"positions must lie on the {G} x {G} grid ([0, {G - 1}]), "
                         f"got range [{int(positions.min())}, {int(positions.max())}]")


def _check_types(types: Tensor, n: int) -> None:
    if types.dim() != 2 or types.shape[0] != n:
        raise ValueError(f"types must have shape [n, E] with n = {n}, got {tuple(types.shape)}")
    if types.is_floating_point() or types.is_complex() or types.dtype == torch.bool:
        raise ValueError(f"types must be integer type indices, got {types.dtype}")
    if types.numel() and int(types.min()) < 0:
        raise ValueError(f"types must be >= 0, got {int(types.min())}")


def _check_visible_torso(visible: Tensor, torso: Tensor, n: int, J: int) -> None:
    if visible.dtype != torch.bool or visible.shape != (n, J):
        raise ValueError(f"visible must be a bool tensor [n, J] = [{n}, {J}], got {visible.dtype} "
                         f"{tuple(visible.shape)}")
    check_input_tensor(torso, "PoseData.torso")
    if torso.shape != (n,) or not torso.is_floating_point():
        raise ValueError(f"torso must be a float tensor [n] = [{n}], got {torso.dtype} {tuple(torso.shape)}")
    bad = ~(torch.isfinite(torso) & (torso > 0))
    if bool(bad.any()):
        raise ValueError(f"torso sizes must be finite and > 0 (give a fallback where the torso joints are "
                         f"not annotated); {int(bad.sum())} are not, first at example {int(bad.nonzero()[0, 0])}")


def flat_to_positions(y: Tensor, n: int, J: int, G: int) -> Tensor:
    """Packed flat cells ``[n * J]`` (or ``[n, J]``) to ``LongTensor[n, J, 2]`` ``(y, x)``."""
    y = torch.as_tensor(y).reshape(n, J).long()
    return torch.stack((torch.div(y, G, rounding_mode="floor"), y % G), dim=-1)
