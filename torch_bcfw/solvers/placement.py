"""Where a single-process BCFW fit solves when its data is on a GPU: the device whose block steps are measured
fastest, not the device the data happens to be on.

On a GPU each block step is a handful of kernel launches: hundreds of times slower than the CPU's compiled kernel
(docs/results/gpu.md), and the mini-batch rounds that amortise the launches make less progress per pass.
:func:`solver_placement` times a few one-block steps of plain BCFW (the same algorithm, hence the same progress per
block) on the CPU kernel and on the data's GPU, and moves the data to the CPU when the CPU is faster
(:func:`faster_device`).  ``fit`` calls it once and records the choice in its counters (:data:`COUNTERS`).
"""
from __future__ import annotations

import dataclasses

from .bcfw import BCFW, seconds_per_block
from .options import SolverOptions

__all__ = ["COUNTERS", "block_seconds", "faster_device", "solver_placement"]

#: the counters of a :class:`~torch_bcfw.FitResult` that record the choice: 1.0 when the solve moved to the CPU,
#: and the measured seconds per block step on each device
COUNTERS = ("placement_moved_to_cpu", "placement_cpu_block_seconds", "placement_gpu_block_seconds")

#: one-block steps timed on each device (two chunks: the first warms up, e.g. compiles the CPU kernel)
CPU_BLOCKS = 128
GPU_BLOCKS = 4


def block_seconds(model, data, lam: float, options: SolverOptions, blocks: int) -> float:
    """Seconds per one-block step of plain BCFW (uniform sampling, FW steps, no cache) on ``data``'s device: the
    second of two chunks of ``blocks`` steps from a fresh dual state."""
    plain = dataclasses.replace(options, batch_size=1, progress=False, sampling="uniform", step_rule="fw",
                                cache=False, preset=None)
    return seconds_per_block(BCFW(model, data, lam, plain), max(1, min(blocks, len(data))))


def faster_device(cpu_block_seconds: float, gpu_block_seconds: float) -> str:
    """``"cpu"`` or ``"cuda"``: the device of the cheaper block step (the CPU on a tie: no transfer, the compiled
    kernel)."""
    return "cuda" if gpu_block_seconds < cpu_block_seconds else "cpu"


def solver_placement(model, data, test_data, lam: float, solver: str, options: SolverOptions, *, group=None,
                     init=None, bounds=None):
    """``(data, test_data, counters)`` for a fresh single-process BCFW fit (no process ``group``, no ``init``, no
    ``bounds``) whose data is on a GPU and whose round size is ``"auto"``: the data moved to the CPU when the CPU
    kernel's block steps are measured faster (:func:`faster_device`), and the figures of the choice
    (:data:`COUNTERS`).  Anything else is returned as it is, with no counters."""
    if (solver != "bcfw" or group is not None or init is not None or bounds is not None or data.device.type == "cpu"
            or options.batch_size != "auto"):
        return data, test_data, {}
    cpu_data = data.to("cpu")
    cpu_s = block_seconds(model, cpu_data, lam, options, CPU_BLOCKS)
    gpu_s = block_seconds(model, data, lam, options, GPU_BLOCKS)
    moved = faster_device(cpu_s, gpu_s) == "cpu"
    counters = dict(zip(COUNTERS, (float(moved), cpu_s, gpu_s)))
    if not moved:
        return data, test_data, counters
    return cpu_data, None if test_data is None else test_data.to("cpu"), counters
