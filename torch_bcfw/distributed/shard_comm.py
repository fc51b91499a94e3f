""":class:`ShardComm`: the communicator (:class:`torch_bcfw.solvers.local_comm.LocalComm`'s interface) of a BCFW run
whose blocks are sharded over the ranks, ``w`` replicated.  A mini-batch round costs ONE all-reduce
(:meth:`ShardComm.sum_round`), after which every rank takes the same step from the same sums, bit for bit.
"""
from __future__ import annotations

import time

import torch
import torch.distributed as dist
from torch import Tensor

from ..solvers.certificate import Certificate, squared_norm, with_dual
from .certificate import global_certify
from .collectives import all_reduce_packed, collective
from .context import DistributedContext

__all__ = ["ShardComm"]


class ShardComm:
    """Blocks sharded over the ranks of ``ctx`` (``sizes``: examples per rank, in rank order)."""

    sharded = True

    def __init__(self, ctx: DistributedContext, sizes: list[int]):
        if len(sizes) != ctx.world_size:
            raise ValueError(f"{len(sizes)} shard sizes for a world of {ctx.world_size} ranks")
        self.ctx = ctx
        self.sizes = [int(s) for s in sizes]
        self.rank, self.world_size = ctx.rank, ctx.world_size
        self.n_total = sum(self.sizes)
        #: seconds spent in the all-reduces of the rounds, and their number (the benchmarks report the share)
        self.round_seconds = 0.0
        self.rounds = 0

    def sum_round(self, V: Tensor, sums: Tensor) -> tuple[Tensor, Tensor]:
        """One all-reduce of ``[V, sums]`` (float64); returns the sums on ``V``'s device."""
        t0 = time.perf_counter()
        d = V.numel()
        buf = torch.cat([V.reshape(-1), sums.to(V)]).to(self.ctx.device, torch.float64)
        with collective("mini-batch round all_reduce", self.ctx):
            dist.all_reduce(buf, op=dist.ReduceOp.SUM)
        buf = buf.to(V.device)
        self.round_seconds += time.perf_counter() - t0
        self.rounds += 1
        return buf[:d], buf[d:]

    def sum_pair(self, vector: Tensor, scalar) -> tuple[Tensor, float]:
        v, s = all_reduce_packed(vector, {"s": scalar}, self.ctx)
        return v.to(vector.device), s["s"]

    def sum_scalar(self, value) -> float:
        return all_reduce_packed(None, {"s": value}, self.ctx)[1]["s"]

    def certify(self, model, data, w: Tensor, ell: float | None, lam: float) -> Certificate:
        c = global_certify(model, data, w, None, lam, self.n_total, self.ctx)
        return with_dual(c.primal, ell, lam, squared_norm(w), c.y_star)

    def task_loss(self, model, data, w: Tensor) -> float:
        y = model.decode(w.to(torch.float64), data)
        _, s = all_reduce_packed(None, {"loss": model.loss(data, y).sum(), "n": float(len(data))}, self.ctx)
        return s["loss"] / s["n"]

    def any(self, flag: bool) -> bool:
        return self.sum_scalar(1.0 if flag else 0.0) > 0.0
