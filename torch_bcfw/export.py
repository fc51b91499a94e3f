"""``export_head``: a trained head as plain torch modules that load without torch_bcfw.

Writes ``head.safetensors`` (named tensors, the kind in its metadata: ``docs/formats.md``) and ``head.py`` (a copy
of :mod:`torch_bcfw.io.standalone_head`, which needs only ``torch`` and ``safetensors``)::

    result = torch_bcfw.fit(Chain(128, 26), train, lam=0.01)
    export_head(result, "deploy/")
    # elsewhere, without torch_bcfw:
    # from head import load_head; labels = load_head("deploy/head.safetensors")(x, lengths)

A :class:`~torch_bcfw.nn.StructuredHead` exports the same way (``export_head(module.head, "deploy/")``), and so does
the head of a Lightning checkpoint written with a :class:`~torch_bcfw.lightning.BCFWCallback`
(:func:`lightning_heads`; ``torch-bcfw export --model last.ckpt --output deploy/``), read through the checks of
:func:`~torch_bcfw.io.pickle_stream.load_pickle_file` (Lightning writes pickles).

Chains with dense token features and multiclass models export; other models (graph cuts, pose trees, matchings)
need their own decoders and raise ``ValueError``.
"""
from __future__ import annotations

import shutil
from pathlib import Path

import torch

from .io import standalone_head
from .io.pickle_stream import load_pickle_file
from .io.tree_file import save_tensors
from .models import Chain, Multiclass
from .models.registry import model_from_config

__all__ = ["export_head", "write_head", "head_tensors", "lightning_heads", "HEADS_KEY"]

#: the entry of a Lightning checkpoint where :class:`~torch_bcfw.lightning.BCFWCallback` records the model of each
#: head it solves: ``{head_attr: {"model_class": registered name, "model_config": config}}``
HEADS_KEY = "torch_bcfw_heads"


def head_tensors(model, w: torch.Tensor) -> tuple[str, dict]:
    """``(kind, named tensors)`` of ``model``'s head at weights ``w: [d]`` (float64 copies, CPU)."""
    w = w.detach().to("cpu", torch.float64).clone()
    if type(model) is Chain:
        emission, bias, start, end, trans = model.unpack(w)
        return "chain", {"emission": emission.clone(), "bias": bias.clone(), "start": start.clone(),
                         "end": end.clone(), "transitions": trans.clone()}
    if type(model) is Multiclass:
        table = w.view(model.n_labels, -1)
        if model.bias:
            return "multiclass", {"weights": table[:, :-1].clone(), "bias": table[:, -1].clone()}
        return "multiclass", {"weights": table.clone(), "bias": None}
    raise ValueError(f"export_head supports Chain and Multiclass heads, not {type(model).__name__} (its decoder "
                     "needs torch_bcfw)")


def export_head(result, folder, weights: torch.Tensor | None = None) -> Path:
    """Write ``head.safetensors`` and ``head.py`` for ``result`` (a :class:`~torch_bcfw.FitResult`, a
    :class:`~torch_bcfw.nn.StructuredHead`, or anything with ``model`` and ``weights``) into ``folder``; returns
    the path of ``head.safetensors``.  ``weights``: the weights to export (default ``result.weights``, the certified
    model; a head's ``w``)."""
    model = result.model
    if weights is None:
        weights = result.weights if hasattr(result, "weights") else result.w
    w = weights
    if w.shape != (model.n_features,):
        raise ValueError(f"weights must have shape ({model.n_features},), got {tuple(w.shape)}")
    return write_head(*head_tensors(model, w), Path(folder) / "head.safetensors")


def write_head(kind: str, tensors: dict, path: Path) -> Path:
    """Write the head ``kind`` of the named ``tensors`` (``None``: an absent optional one) to ``path`` and the
    decoder ``head.py`` beside it; returns ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    present = {name: t.contiguous() for name, t in tensors.items() if t is not None}
    save_tensors(present, {"format": standalone_head.FORMAT, "kind": kind}, path)
    shutil.copyfile(standalone_head.__file__, path.parent / "head.py")
    return path


def lightning_heads(path) -> dict:
    """The heads of a Lightning checkpoint written with a :class:`~torch_bcfw.lightning.BCFWCallback`:
    ``{head_attr: (model, w)}`` from the models the callback recorded (:data:`HEADS_KEY`) and the weights
    ``{head_attr}.w`` of the module's ``state_dict``.  Read through the checks of
    :func:`~torch_bcfw.io.pickle_stream.load_pickle_file`; ``ValueError`` (one line) for a checkpoint without them."""
    ckpt = load_pickle_file(path, what="Lightning checkpoint")
    if not isinstance(ckpt, dict) or not isinstance(ckpt.get("state_dict"), dict):
        raise ValueError(f"{path}: not a Lightning checkpoint (no state_dict)")
    heads = ckpt.get(HEADS_KEY)
    if not isinstance(heads, dict) or not heads:
        raise ValueError(f"{path}: the checkpoint records no torch_bcfw head (write it with a BCFWCallback in the "
                         "Trainer's callbacks); export a StructuredHead from Python with export_head(module.head, ...)")
    out = {}
    for attr, spec in heads.items():
        if not isinstance(spec, dict):
            raise ValueError(f"{path}: the record of head {attr!r} is not a dict")
        model = model_from_config(spec.get("model_class"), spec.get("model_config"))
        w = ckpt["state_dict"].get(f"{attr}.w")
        if not isinstance(w, torch.Tensor) or w.shape != (model.n_features,):
            raise ValueError(f"{path}: the state_dict has no weights {attr}.w of shape [{model.n_features}] for the "
                             f"head's {type(model).__name__}")
        out[attr] = (model, w)
    return out
