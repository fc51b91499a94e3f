"""Torch intra-op threads for loops of tiny tensor operations."""
from __future__ import annotations

import contextlib

import torch

__all__ = ["single_thread"]


@contextlib.contextmanager
def single_thread(device):
    """One torch intra-op thread inside the block when ``device`` is a CPU (restored after): per-example steps on a
    few rows gain nothing from threads but synchronisation costs (32 ms against 1 ms per SSG step, OCR-small)."""
    if torch.device(device).type != "cpu":
        yield
        return
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)
