"""Fingerprints saved with a state: which examples (labels, sequence boundaries) and which features it belongs to."""
from __future__ import annotations

import hashlib

import numpy as np
import torch
from torch import Tensor

__all__ = ["labels_fingerprint", "features_fingerprint"]


def labels_fingerprint(data) -> str:
    """A short hash of ``data``'s labels and sequence boundaries: a state is never loaded onto other examples."""
    h = hashlib.sha1()
    h.update(np.ascontiguousarray(data.y.detach().cpu().numpy().astype(np.int64)))  # hashed in place: no byte copy
    offsets = getattr(data, "offsets", None)
    if offsets is not None:
        h.update(b"|")
        h.update(np.ascontiguousarray(offsets.detach().cpu().numpy().astype(np.int64)))
    return h.hexdigest()[:16]


def _feed(h, obj, depth: int = 0) -> None:
    if isinstance(obj, Tensor):
        t = obj.detach()
        if t.is_sparse or t.layout != torch.strided:
            t = t.to_dense()
        t = t.contiguous().cpu()
        h.update(f"T{t.dtype}{tuple(t.shape)}".encode())
        if t.numel():
            h.update(t.reshape(-1).view(torch.uint8).numpy())  # the tensor's own bytes, not a copy
    elif obj is None or isinstance(obj, (bool, int, float, str)):
        h.update(f"{type(obj).__name__}:{obj!r}".encode())
    elif isinstance(obj, (list, tuple)):
        h.update(f"L{len(obj)}".encode())
        for v in obj:
            _feed(h, v, depth + 1)
    elif hasattr(obj, "__dict__") and depth < 3:
        h.update(type(obj).__name__.encode())
        for k in sorted(k for k in vars(obj) if not k.startswith("_")):
            h.update(k.encode())
            _feed(h, getattr(obj, k), depth + 1)
    else:
        raise TypeError(f"cannot fingerprint a {type(obj).__name__} in the data")


def features_fingerprint(data) -> str:
    """A hash of every public attribute of ``data``, recursively (features, labels, boundaries, graphs): a state
    loaded onto other features re-derives ``w = A(x) alpha`` (:attr:`DualState.rebindable`) or is refused."""
    h = hashlib.blake2b(digest_size=16)
    _feed(h, data)
    return h.hexdigest()
