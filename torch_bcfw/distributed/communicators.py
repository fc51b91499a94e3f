"""The communicators of a run, one interface: how a solver's reductions, stopping decisions and exact gap pass cross
the processes of a ``torch.distributed`` group, and how a pass is cut into mini-batch rounds over them.

* :class:`LocalComm` (:data:`LOCAL`): every block in this process, every reduction the identity.
* :class:`ShardComm`: the blocks sharded over the ranks, ``w`` replicated.  A mini-batch round costs ONE all-reduce
  (:meth:`ShardComm.sum_round`), after which every rank takes the same step from the same sums, bit for bit; the
  certificate is :func:`global_certify`, each rank's oracle pass on its examples then ONE all-reduce of
  ``[sum_i H_i, ell_rank, n_rank]`` (the values of :func:`~torch_bcfw.certificate.certify` on the full data up to
  the last bits of the per-rank partial sums; bit for bit with one rank).
* :class:`ReplicaComm`: every block on every rank, the exact gap pass split over the ranks.
* :class:`SplitOracleComm`: a replicated run whose rounds' oracle calls are split over the ranks.
"""
from __future__ import annotations

import math
import time
from typing import NamedTuple

import numpy as np
import torch
import torch.distributed as dist
from torch import Tensor

from ..certificate import Certificate, certify, squared_norm, task_loss, with_dual
from .collectives import all_gather_parts, all_reduce_packed, all_reduce_sum, collective
from .context import DistributedContext
from .errors import DistributedError
from .sharding import shard_bounds, shard_sizes

__all__ = ["LocalComm", "LOCAL", "ShardComm", "ReplicaComm", "SplitOracleComm", "global_certify", "share_of",
           "round_sizes", "pass_rounds"]


def share_of(m: int, sizes: list[int], rank: int) -> int:
    """Rank ``rank``'s part of ``m`` block iterations split over shards of ``sizes`` examples, proportionally to the
    shard sizes (largest remainders, ties to the lower rank): the parts sum to ``m`` and are the same computation on
    every rank."""
    sizes = np.asarray(sizes, dtype=np.int64)
    exact = m * sizes / sizes.sum()
    base = np.floor(exact).astype(np.int64)
    rest = int(m - base.sum())
    order = np.argsort(-(exact - base), kind="stable")
    base[order[:rest]] += 1
    return int(base[rank])


def round_sizes(m_local: int, m: int, tau: int) -> np.ndarray:
    """Blocks of this process in each round of a chunk of ``m`` block iterations (all processes) in rounds of
    ``tau``: ``ceil(m / tau)`` rounds (the same number on every process), this process' ``m_local`` blocks spread
    evenly over them (``int64[rounds]``)."""
    rounds = max(1, -(-m // tau))
    q, r = divmod(m_local, rounds)
    return np.array([q + 1] * r + [q] * (rounds - r), dtype=np.int64)


def pass_rounds(n: int, tau: int, comm) -> tuple[np.ndarray, np.ndarray]:
    """How a pass of ``n`` block iterations is cut into mini-batch rounds of about ``tau`` blocks: ``(local, total)``,
    the blocks of this process (``comm.rank``) and of all processes in each of the ``ceil(n / tau)`` rounds
    (``int64[rounds]`` each; every process computes the same cut)."""
    sizes = comm.sizes if comm.sharded else [n]
    parts = [round_sizes(share_of(n, sizes, r), n, tau) for r in range(len(sizes))]
    return parts[comm.rank], np.sum(parts, axis=0)


class LocalComm:
    """Every block in this process: the reductions are the identity."""

    rank = 0
    world_size = 1
    sharded = False

    def start_corners(self, state, blocks: np.ndarray):
        """Start the oracle calls of a round (``strategy="split-oracle"``): the answers of ``blocks`` (``int64[m]``)
        at the current ``w`` of ``state``, handed over by :meth:`finish_corners` (here: decoded at once)."""
        return [state.block_oracle(i) for i in blocks.tolist()]

    def finish_corners(self, pending) -> list[Tensor]:
        """The answers a :meth:`start_corners` call started, one labeling per block in order."""
        return pending

    def sum_pair(self, vector: Tensor, scalar) -> tuple[Tensor, float]:
        """``(sum vector, sum scalar)`` over the processes."""
        return vector, float(scalar)

    def sum_scalar(self, value) -> float:
        return float(value)

    #: ``certify(model, data, w, ell, lam)``, ``task_loss(model, data, w)``: over all examples (``ell`` the dual's
    #: full linear part)
    certify = staticmethod(certify)
    task_loss = staticmethod(task_loss)

    def any(self, flag: bool) -> bool:
        """True when ``flag`` holds on some process (a stopping decision every process takes together)."""
        return bool(flag)


#: the communicator of a single-process run
LOCAL = LocalComm()


def global_certify(model, shard_data, w: Tensor, ell_local: float | Tensor | None, lam: float,
                   n_total: int | None, ctx: DistributedContext) -> Certificate:
    """Primal, dual and gap of ``(w, ell)`` over the examples of all ranks, in one all-reduce: the same
    :class:`~torch_bcfw.certificate.Certificate` on every rank but ``y_star`` (this rank's answers).

    Args:
        shard_data: this rank's examples (``Shard.data``).
        w: ``Tensor[d]``, the replicated weights (the same on every rank).
        ell_local: this rank's part of ``ell = b^T alpha`` (float or one-element tensor); ``None`` on every rank
            for a primal-only certificate.
        n_total: ``n``, checked against the sum of the shard sizes (``DistributedError``); ``None``: that sum.
    """
    if not lam > 0:
        raise ValueError(f"lam must be > 0, got {lam}")
    w64 = w.to(torch.float64)
    y_star, H = model.hinge_terms(w64, shard_data)
    scalars = {"hinge_sum": H.sum(), "n_blocks": float(len(shard_data))}
    if ell_local is not None:
        scalars["ell"] = ell_local
    _, sums = all_reduce_packed(None, scalars, ctx)
    n = int(sums["n_blocks"])
    if n_total is not None and int(n_total) != n:
        raise DistributedError(f"global_certify (rank {ctx.rank}): n_total = {n_total} but the shards of the "
                               f"{ctx.world_size} ranks hold {n} examples together")
    ww = squared_norm(w64)
    return with_dual(0.5 * lam * ww + sums["hinge_sum"] / n, sums.get("ell"), lam, ww, y_star)


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


class ReplicaComm(LocalComm):
    """A replicated run: every block here, the clock's stopping decisions taken together, and the exact gap pass
    split: each rank decodes its contiguous share and the per-example terms are gathered, so that every rank sums
    the same vector a single process would (the same bits)."""

    def __init__(self, ctx: DistributedContext):
        self.ctx = ctx
        self._data = self._part = None

    def any(self, flag: bool) -> bool:
        return bool(all_reduce_sum(torch.tensor([float(bool(flag))]), self.ctx)[0] > 0)

    def _share(self, data):
        """This rank's contiguous share of ``data`` (made once per data object)."""
        if self._data is not data:
            lo, hi = shard_bounds(len(data), self.ctx.rank, self.ctx.world_size)
            self._data, self._part = data, data[lo:hi]
        return self._part

    def _gathered(self, part: Tensor, n: int) -> Tensor:
        return all_gather_parts(part, shard_sizes(n, self.ctx.world_size), self.ctx)

    def certify(self, model, data, w: Tensor, ell: float | None, lam: float) -> Certificate:
        if len(data) < self.ctx.world_size:  # some rank without a share: the whole pass here
            return super().certify(model, data, w, ell, lam)
        w64 = w.to(torch.float64)
        y_part, h_part = model.hinge_terms(w64, self._share(data))
        hinge = self._gathered(h_part.to(torch.float64), len(data))
        sq = squared_norm(w64)
        return with_dual(0.5 * lam * sq + float(hinge.mean()), ell, lam, sq, y_part)

    def task_loss(self, model, data, w: Tensor) -> float:
        if len(data) < self.ctx.world_size:
            return super().task_loss(model, data, w)
        part = self._share(data)
        losses = model.loss(part, model.decode(w.to(torch.float64), part))
        return float(self._gathered(losses.to(torch.float64), len(data)).mean())


class _PendingCorners(NamedTuple):
    """A round's answers in flight: the all-gather's handle and buffers, the labelings' shapes and their device."""

    handle: object
    out: list
    shapes: list
    device: torch.device


class SplitOracleComm(ReplicaComm):
    """``strategy="split-oracle"``: a replicated run whose rounds' oracle calls are split over the ranks (rank ``r``
    decodes positions ``r, r + P, ...``; one asynchronous all-gather shares the labelings).  The trajectory is the
    same under any number of ranks."""

    def __init__(self, ctx: DistributedContext):
        super().__init__(ctx)
        self._shapes_of = self._shapes = None

    def _label_shapes(self, state) -> list:
        """The shape of every block's labeling (read once per data object)."""
        if self._shapes_of is not state.data:
            self._shapes_of, self._shapes = state.data, [state.block_data(i).y.shape for i in range(state.n)]
        return self._shapes

    def start_corners(self, state, blocks: np.ndarray) -> _PendingCorners:
        p, r = self.ctx.world_size, self.ctx.rank
        every = self._label_shapes(state)
        shapes = [every[i] for i in blocks.tolist()]
        sizes = [sum(math.prod(s) for s in shapes[k::p]) for k in range(p)]
        buf = torch.zeros(max(sizes), dtype=torch.long)
        mine = [state.block_oracle(i).to(torch.long).reshape(-1) for i in blocks[r::p].tolist()]
        if mine:
            buf[:sizes[r]] = torch.cat(mine)
        out = [torch.empty_like(buf) for _ in range(p)]
        with collective("split-oracle all_gather", self.ctx):
            handle = dist.all_gather(out, buf.to(self.ctx.device), async_op=True)
        return _PendingCorners(handle, out, shapes, state.w.device)

    def finish_corners(self, pending: _PendingCorners) -> list[Tensor]:
        with collective("split-oracle all_gather", self.ctx):
            pending.handle.wait()
        p, shapes = self.ctx.world_size, pending.shapes
        answers = [None] * len(shapes)
        for k in range(p):  # rank k's answers, in the order of its positions
            flat, at = pending.out[k].to(pending.device), 0
            for j in range(k, len(shapes), p):
                c = math.prod(shapes[j])
                answers[j] = flat[at:at + c].reshape(shapes[j])
                at += c
        return answers
