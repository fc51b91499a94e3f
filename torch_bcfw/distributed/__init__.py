"""Distributed BCFW over ``torch.distributed`` (launched by ``torchrun``): the process context, the sharding of the
examples, the collectives, the exact certificate over all ranks and the communicators of a run (single-process,
sharded, replicated and split-oracle).
"""
from .communicators import ShardComm, global_certify
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
