""":class:`ShardComm`: the communicator of a BCFW run whose blocks are sharded over the ranks of a process group
(the interface of :class:`torch_bcfw.solvers.comm.LocalComm`).

Each rank holds its examples and their dual state; ``w`` is replicated.  A mini-batch round costs ONE all-reduce of
``[V (d), sum l_i, sum l_s, blocks]`` (:meth:`ShardComm.sum_round`): every rank then computes the same line search
from the same sums and applies the same ``w += -gamma V``, so the replicas stay identical bit for bit (every rank
receives the same reduced buffer).  Certificates reduce the hinge sums of an oracle pass at the common ``w``
(:func:`~torch_bcfw.distributed.certificate.global_certify`), so the gap is exact over all examples.
"""
from __future__ import annotations

import time

import torch
import torch.distributed as dist
from torch import Tensor

from ..solvers.certificate import Certificate, squared_norm
from ..solvers.comm import share_of
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

    def share(self, m: int) -> int:
        return share_of(m, self.sizes, self.rank)

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
        if ell is None:
            return c
        dual = float(ell) - 0.5 * lam * squared_norm(w)
        return Certificate(c.primal, dual, c.primal - dual, c.y_star)

    def task_loss(self, model, data, w: Tensor) -> float:
        y = model.decode(w.to(torch.float64), data)
        _, s = all_reduce_packed(None, {"loss": model.loss(data, y).sum(), "n": float(len(data))}, self.ctx)
        return s["loss"] / s["n"]

    def any(self, flag: bool) -> bool:
        return self.sum_scalar(1.0 if flag else 0.0) > 0.0
