"""Which blocks (training examples) each rank owns, and the check that all ranks shard the same dataset.

Layout: contiguous, balanced ranges in rank order, depending on ``(n, P)`` only (:func:`shard_bounds`).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import Tensor

from ..checks import check_int
from ..duals.fingerprint import features_fingerprint, labels_fingerprint
from .collectives import all_gather_int64, collective
from .context import DistributedContext
from .errors import DistributedError

__all__ = ["Shard", "shard", "shard_bounds", "shard_indices", "shard_sizes", "check_same_dataset", "gather_shards",
           "dataset_fingerprint"]


def shard_bounds(n: int, rank: int, world_size: int) -> tuple[int, int]:
    """``(start, stop)``: rank ``rank`` owns examples ``start .. stop-1`` of ``n`` split over ``world_size`` ranks
    (contiguous, balanced: sizes differ by at most one, the larger shards first)."""
    n = check_int(n, "n", minimum=0)
    world_size = check_int(world_size, "world_size", minimum=1)
    rank = check_int(rank, "rank", minimum=0)
    if rank >= world_size:
        raise ValueError(f"rank {rank} is not in [0, world_size={world_size})")
    q, r = divmod(n, world_size)
    return rank * q + min(rank, r), (rank + 1) * q + min(rank + 1, r)


def shard_indices(n: int, rank: int, world_size: int) -> Tensor:
    """``LongTensor[n_rank]``: the global indices of the examples rank ``rank`` owns, increasing (see
    :func:`shard_bounds`; empty when ``n < world_size`` and ``rank >= n``)."""
    start, stop = shard_bounds(n, rank, world_size)
    return torch.arange(start, stop, dtype=torch.long)


def shard_sizes(n: int, world_size: int) -> list[int]:
    """The number of examples of every rank, in rank order (sums to ``n``)."""
    return [b - a for a, b in (shard_bounds(n, k, world_size) for k in range(world_size))]


@dataclass
class Shard:
    """One rank's part of a dataset.

    Attributes:
        data: the rank's examples (a container of the dataset's type, ``len(data) = n_rank``).
        indices: ``LongTensor[n_rank]``: their global indices in the full dataset (increasing, contiguous).
        n_total: ``n``, the size of the full dataset (the ``n`` of the objective's ``1/n``).
    """

    data: object
    indices: Tensor
    n_total: int


def dataset_fingerprint(data) -> int:
    """A signed 64-bit fingerprint of ``data``: of its labels (and sequence boundaries) when labelled, of all its
    features otherwise."""
    hexdigest = labels_fingerprint(data) if getattr(data, "y", None) is not None else features_fingerprint(data)
    return int.from_bytes(bytes.fromhex(hexdigest[:16]), "little", signed=True)


def check_same_dataset(data, ctx: DistributedContext) -> int:
    """Check that every rank holds the same dataset (same ``n``, same fingerprint; one all-gather); return ``n``.
    On a mismatch every rank raises the same :class:`DistributedError`, listing each rank's ``n`` and fingerprint."""
    table = all_gather_int64([len(data), dataset_fingerprint(data)], ctx)
    if bool((table == table[0]).all()):
        return int(table[0, 0])
    rows = ", ".join(f"rank {r}: n={int(n)} fingerprint={(int(fp) & (2**64 - 1)).to_bytes(8, 'little').hex()}"
                     for r, (n, fp) in enumerate(table.tolist()))
    raise DistributedError(f"the ranks hold different datasets (seen on rank {ctx.rank}): {rows}. Every rank must "
                           "load the same training set (same examples in the same order); each keeps its own shard")


def shard(data, ctx: DistributedContext, check: bool = True) -> Shard:
    """This rank's :class:`Shard` of the full dataset ``data`` (which every rank passes; ``check``: first
    :func:`check_same_dataset`, a collective).  ``DistributedError`` on every rank when there are fewer examples
    than ranks."""
    n = check_same_dataset(data, ctx) if check else len(data)
    if n < ctx.world_size:
        raise DistributedError(f"{n} examples cannot be sharded over {ctx.world_size} ranks (rank {ctx.rank}): every "
                               "rank must own at least one example; use fewer processes")
    idx = shard_indices(n, ctx.rank, ctx.world_size)
    return Shard(data[idx], idx, n)


def gather_shards(shard_data, ctx: DistributedContext):
    """The full dataset on every rank: all ranks' shards concatenated in rank order, on ``shard_data``'s device
    (pickled through ``all_gather_object``: for tests and checkpoints, not the training loop)."""
    parts = [None] * ctx.world_size
    with collective("gather_shards", ctx):
        dist.all_gather_object(parts, shard_data.to("cpu"))
    return type(shard_data).cat(parts).to(shard_data.device)
