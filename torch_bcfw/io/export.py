"""``export_head``: a trained head as plain torch modules that load without torch_bcfw.

Writes ``head.pt`` (named tensors; loads with ``weights_only=True``) and ``head.py`` (a copy of
:mod:`torch_bcfw.io.standalone_head`, which needs only ``torch``)::

    result = torch_bcfw.fit(Chain(128, 26), train, lam=0.01)
    export_head(result, "deploy/")
    # elsewhere, with torch only:  from head import load_head; labels = load_head("deploy/head.pt")(x, lengths)

Chains with dense token features and multiclass models export; other models (graph cuts, pose trees, matchings)
need their own decoders and raise ``ValueError``.
"""
from __future__ import annotations

import shutil
from pathlib import Path

import torch

from . import standalone_head
from ..models import Chain, Multiclass
from .serialization import atomic_save

__all__ = ["export_head", "head_tensors"]


def head_tensors(model, w: torch.Tensor) -> tuple[str, dict]:
    """``(kind, named tensors)`` of ``model``'s head at weights ``w: [d]`` (float64 copies, CPU)."""
    w = w.detach().to("cpu", torch.float64).clone()
    if type(model) is Chain:
        emission, bias, start, end, trans = model.unpack(w)
        return "chain", {"emission": emission.clone(), "bias": bias.clone(), "start": start.clone(),
                         "end": end.clone(), "transitions": trans.clone()}
    if type(model) is Multiclass:
        table = w.view(model.n_classes, -1)
        if model.bias:
            return "multiclass", {"weights": table[:, :-1].clone(), "bias": table[:, -1].clone()}
        return "multiclass", {"weights": table.clone(), "bias": None}
    raise ValueError(f"export_head supports Chain and Multiclass heads, not {type(model).__name__} (its decoder "
                     "needs torch_bcfw)")


def export_head(result, folder, weights: torch.Tensor | None = None) -> Path:
    """Write ``head.pt`` and ``head.py`` for ``result`` (a :class:`~torch_bcfw.FitResult`, or anything with ``model``
    and ``weights``, e.g. a :class:`~torch_bcfw.nn.StructuredHead` via ``weights=head.w``) into ``folder``; returns
    the path of ``head.pt``.  ``weights``: the weights to export (default ``result.weights``, the certified model)."""
    model = result.model
    w = result.weights if weights is None else weights
    if w.shape != (model.n_features,):
        raise ValueError(f"weights must have shape ({model.n_features},), got {tuple(w.shape)}")
    kind, tensors = head_tensors(model, w)
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    atomic_save({"format": standalone_head.FORMAT, "kind": kind, "tensors": tensors}, out / "head.pt")
    shutil.copyfile(standalone_head.__file__, out / "head.py")
    return out / "head.pt"
