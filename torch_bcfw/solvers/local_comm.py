"""Where the blocks of a run live: in this process (:class:`LocalComm`, every reduction the identity), or sharded over
the processes of a ``torch.distributed`` group (:class:`torch_bcfw.distributed.ShardComm`, same interface)."""
from __future__ import annotations

import numpy as np
from torch import Tensor

from .certificate import certify, task_loss

__all__ = ["LocalComm", "LOCAL", "share_of", "round_sizes", "pass_rounds"]


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
    sizes = getattr(comm, "sizes", [n])
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
