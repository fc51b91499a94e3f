"""Distributed BCFW over ``torch.distributed``: blocks (examples) sharded over the ranks, ``w`` replicated.

* :mod:`.context` -- :class:`DistributedContext` (rank, world size, backend, device, timeout),
  :func:`init_from_env` (torchrun's environment), :func:`current_context`.
* :mod:`.sharding` -- which examples each rank owns (:func:`shard_indices`, :func:`shard`), and the check that
  all ranks hold the same dataset.
* :mod:`.collectives` -- float64 sum all-reduces (a vector and named scalars packed into one collective),
  broadcast from rank 0, the replicated-``w`` check; a dead peer raises :class:`DistributedError`.
* :mod:`.certificate` -- :func:`global_certify`, the exact duality gap over all ranks' examples.
* :mod:`.comm` -- :class:`ShardComm`, what a sharded BCFW run asks of the other ranks (one all-reduce per round).

Launch: ``torchrun --nproc-per-node N script.py`` (one node), ``torchrun --nnodes M --node-rank k
--nproc-per-node N --rdzv-backend c10d --rdzv-endpoint HOST:PORT script.py`` (several).
"""
from .certificate import global_certify
from .comm import ShardComm
from .collectives import (all_gather_int64, all_gather_parts, all_reduce_packed, all_reduce_sum, assert_replicated,
                          broadcast_from_rank0, collective, pack_sum_buffer, unpack_sum_buffer)
from .context import DEFAULT_TIMEOUT_S, DistributedContext, current_context, init_from_env
from .errors import DistributedError
from .sharding import (Shard, check_same_dataset, dataset_fingerprint, gather_shards, shard, shard_bounds,
                       shard_indices, shard_sizes)

__all__ = [
    "DistributedContext", "init_from_env", "current_context", "DEFAULT_TIMEOUT_S", "DistributedError",
    "Shard", "shard", "shard_bounds", "shard_indices", "shard_sizes", "check_same_dataset", "dataset_fingerprint",
    "gather_shards",
    "all_reduce_sum", "all_reduce_packed", "pack_sum_buffer", "unpack_sum_buffer", "broadcast_from_rank0",
    "all_gather_int64", "all_gather_parts", "assert_replicated", "collective",
    "global_certify", "ShardComm",
]
