"""The collectives of a distributed BCFW run, each bounded by the group's timeout and raising
:class:`~torch_bcfw.distributed.DistributedError` (naming the operation and the rank) when a peer fails.  Every rank
must call the same collectives in the same order with tensors of the same shapes.
"""
from __future__ import annotations

import hashlib
from contextlib import contextmanager
from typing import Iterator, Mapping

import torch
import torch.distributed as dist
from torch import Tensor

from .context import DistributedContext
from .errors import DistributedError

__all__ = ["all_reduce_sum", "all_reduce_packed", "pack_sum_buffer", "unpack_sum_buffer", "broadcast_from_rank0",
           "all_gather_int64", "assert_replicated", "collective"]


@contextmanager
def collective(op: str, ctx: DistributedContext) -> Iterator[None]:
    """Run a collective, turning a backend failure into a :class:`DistributedError` naming ``op`` and the rank."""
    try:
        yield
    except RuntimeError as exc:
        if isinstance(exc, DistributedError):
            raise
        raise DistributedError(
            f"{op} failed on rank {ctx.rank} of {ctx.world_size} ({ctx.backend}, timeout {ctx.timeout_s:g} s): "
            f"a peer rank died, did not reach this collective in time, or passed a tensor of another size; "
            f"stopping. Cause: {exc}") from exc


def all_reduce_sum(x: Tensor, ctx: DistributedContext) -> Tensor:
    """``sum_r x_r``: the float64 sum over the ranks of ``x`` (any shape), flattened: ``Tensor[x.numel()]`` on
    ``ctx.device``.  ``x`` itself is left unchanged."""
    if not isinstance(x, Tensor):
        raise TypeError(f"x must be a tensor, got {type(x).__name__}")
    if x.is_complex() or not (x.is_floating_point() or x.dtype in (torch.int32, torch.int64)):
        raise TypeError(f"x must be a real floating-point (or integer) tensor, got {x.dtype}")
    buf = x.detach().reshape(-1).to(device=ctx.device, dtype=torch.float64).clone()
    with collective("all_reduce_sum", ctx):
        dist.all_reduce(buf, op=dist.ReduceOp.SUM)
    return buf


def pack_sum_buffer(vector: Tensor | None, scalars: Mapping[str, float | Tensor],
                    device: torch.device | str = "cpu") -> Tensor:
    """``Tensor[d + k]`` float64: ``vector`` flattened (``d`` entries; ``None``: none) then the ``k`` scalars in
    ``scalars``' order (floats, ints or one-element tensors)."""
    parts = [] if vector is None else [vector.detach().reshape(-1).to(device=device, dtype=torch.float64)]
    for name, v in scalars.items():
        t = torch.as_tensor(v.detach() if isinstance(v, Tensor) else v, dtype=torch.float64, device=device)
        if t.numel() != 1:
            raise ValueError(f"scalar {name!r} must have one element, got shape {tuple(t.shape)}")
        parts.append(t.reshape(1))
    if not parts:
        raise ValueError("nothing to pack: give a vector or at least one scalar")
    return torch.cat(parts)


def unpack_sum_buffer(buf: Tensor, d: int, names: list[str]) -> tuple[Tensor, dict[str, float]]:
    """The inverse of :func:`pack_sum_buffer`: ``(buf[:d], {names[j]: float(buf[d + j])})``."""
    if buf.dim() != 1 or buf.numel() != d + len(names):
        raise ValueError(f"buffer of shape {tuple(buf.shape)} does not hold a {d}-vector and {len(names)} scalars")
    tail = buf[d:].tolist()
    return buf[:d], dict(zip(names, tail))


def all_reduce_packed(vector: Tensor | None, scalars: Mapping[str, float | Tensor],
                      ctx: DistributedContext) -> tuple[Tensor, dict[str, float]]:
    """Sum ``vector`` (any shape, ``d`` entries) and the named ``scalars`` over the ranks in one all-reduce
    (:func:`pack_sum_buffer`): ``(Tensor[d] float64 on ctx.device, {name: float})``."""
    d = 0 if vector is None else vector.numel()
    buf = pack_sum_buffer(vector, scalars, ctx.device)
    with collective("all_reduce_packed", ctx):
        dist.all_reduce(buf, op=dist.ReduceOp.SUM)
    return unpack_sum_buffer(buf, d, list(scalars))


def broadcast_from_rank0(x: Tensor, ctx: DistributedContext) -> Tensor:
    """Rank 0's ``x`` on every rank: a new tensor of ``x``'s shape and dtype on ``ctx.device`` (``x`` must have the
    same shape and dtype on every rank)."""
    buf = x.detach().to(ctx.device).clone().contiguous()
    with collective("broadcast_from_rank0", ctx):
        dist.broadcast(buf, src=0)
    return buf


def all_gather_int64(values: Tensor | list[int], ctx: DistributedContext) -> Tensor:
    """``LongTensor[world_size, k]`` on the CPU: row ``r`` is rank ``r``'s ``values`` (``k`` integers, the same
    ``k`` on every rank)."""
    t = torch.as_tensor(values, dtype=torch.int64).reshape(-1).to(ctx.device)
    out = [torch.empty_like(t) for _ in range(ctx.world_size)]
    with collective("all_gather_int64", ctx):
        dist.all_gather(out, t)
    return torch.stack(out).cpu()


def all_gather_parts(part: Tensor, sizes: list[int], ctx: DistributedContext) -> Tensor:
    """Every rank's ``part`` (rank ``r``'s of length ``sizes[r]``, one dtype on all ranks) concatenated in rank
    order, on every rank (on ``part``'s device)."""
    if part.numel() != sizes[ctx.rank]:
        raise DistributedError(f"all_gather_parts (rank {ctx.rank}): a part of {part.numel()} values, "
                               f"{sizes[ctx.rank]} expected")
    width = max(sizes)
    buf = torch.zeros(width, dtype=part.dtype, device=ctx.device)
    buf[:part.numel()] = part.reshape(-1).to(ctx.device)
    out = [torch.empty_like(buf) for _ in range(ctx.world_size)]
    with collective("all_gather_parts", ctx):
        dist.all_gather(out, buf)
    return torch.cat([o[:k] for o, k in zip(out, sizes)]).to(part.device)


def _checksum(x: Tensor) -> int:
    """A signed 64-bit digest of ``x``'s shape, dtype and bytes."""
    t = x.detach().contiguous().cpu()
    h = hashlib.blake2b(f"{t.dtype}{tuple(t.shape)}".encode(), digest_size=8)
    if t.numel():
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return int.from_bytes(h.digest(), "little", signed=True)


def assert_replicated(w: Tensor, ctx: DistributedContext, tol: float = 0.0, name: str = "w") -> None:
    """Check that ``w`` is the same on every rank (bit for bit when ``tol = 0``; ``max |w_r - w_0| <= tol``
    otherwise); else ``DistributedError`` on every rank, naming the ranks that differ and the largest difference."""
    info = all_gather_int64([_checksum(w), w.numel()], ctx)
    if bool((info[:, 0] == info[0, 0]).all()):
        return
    sizes = info[:, 1].tolist()
    if len(set(sizes)) != 1:
        raise DistributedError(f"{name} is not replicated (rank {ctx.rank}): its size differs between the ranks, "
                               f"{dict(enumerate(sizes))}")
    w0 = broadcast_from_rank0(w.to(torch.float64), ctx)
    diff = (w.detach().to(device=ctx.device, dtype=torch.float64).reshape(-1) - w0.reshape(-1)).abs()
    local = diff.max() if diff.numel() else torch.zeros((), dtype=torch.float64, device=ctx.device)
    buf = local.reshape(1).clone()
    with collective("assert_replicated", ctx):
        dist.all_reduce(buf, op=dist.ReduceOp.MAX)
    max_diff = float(buf[0])
    if max_diff <= tol and tol > 0:
        return
    ranks = [r for r in range(ctx.world_size) if info[r, 0] != info[0, 0]]
    raise DistributedError(f"{name} is not replicated (rank {ctx.rank}): rank(s) {ranks} differ from rank 0, "
                           f"max |{name}_r - {name}_0| = {max_diff:.3e} (tolerance {tol:g})")
