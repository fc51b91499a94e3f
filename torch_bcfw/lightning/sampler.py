"""``SeededShuffle``: a shuffling sampler whose order is a function of its seed and the epoch, so that a run resumed
from a checkpoint sees the same batches as an uninterrupted one."""
from __future__ import annotations

import torch
from torch.utils.data import Sampler

__all__ = ["SeededShuffle"]


class SeededShuffle(Sampler[int]):
    """The indices ``0 .. n - 1`` in a random order drawn from ``seed`` and the epoch.

    ``DataLoader(..., shuffle=True)`` draws each epoch's order from torch's global random state, which a Lightning
    checkpoint does not hold: a resumed ``trainer.fit`` trains on other batches than the uninterrupted run, and its
    backbone and head differ.  Lightning calls :meth:`set_epoch` before every training epoch (as for
    ``DistributedSampler``), so with ``DataLoader(data, sampler=SeededShuffle(len(data), seed=0))`` the order of
    epoch ``e`` is the same in both runs: a resume from an end-of-epoch checkpoint continues exactly.

    Args:
        n: the number of items (batches, when the loader's items are prepared batches with ``batch_size=None``).
        seed: the seed of every epoch's order (epoch ``e`` uses ``seed + e``).
    """

    def __init__(self, n: int, seed: int = 0):
        if int(n) < 1:
            raise ValueError(f"SeededShuffle needs n >= 1 items, got {n}")
        self.n = int(n)
        self.seed = int(seed)
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        """The epoch whose order :meth:`__iter__` yields (Lightning calls it before each training epoch)."""
        self.epoch = int(epoch)

    def __len__(self) -> int:
        return self.n

    def __iter__(self):
        # a generator: the order is drawn at the first item, after Lightning's set_epoch (a resumed run may create
        # the iterator before it)
        g = torch.Generator().manual_seed(self.seed + self.epoch)
        yield from torch.randperm(self.n, generator=g).tolist()
