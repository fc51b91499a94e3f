"""Torch intra-op threads for loops of tiny tensor operations."""
from __future__ import annotations

import contextlib

import torch

__all__ = ["single_thread"]


@contextlib.contextmanager
def single_thread(device):
    """One torch intra-op thread inside the block when ``device`` is a CPU (restored after).

    Per-example solver steps (SSG, online EG) are sequences of tensor operations on a few rows; on a CPU their
    intra-op threads only add synchronisation, which dominates when other processes share the cores (one SSG
    pass over OCR-small: 32 ms per step with 2 threads on a loaded 2-core machine, about 1 ms with one).
    """
    if torch.device(device).type != "cpu":
        yield
        return
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)
