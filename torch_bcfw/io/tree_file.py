"""Nested structures of tensors and plain values in one safetensors file: nothing in it can run code or expand.

:func:`save_tree` writes a tree of dicts (string keys), lists, tensors, strings, numbers, booleans, ``None`` and bytes
as one `safetensors <https://huggingface.co/docs/safetensors>`_ file: every tensor under the key of its path in the
tree (``"solver_state/state/alpha"``, list positions as numbers), and the rest of the tree as JSON in the header's
metadata entry ``"torch_bcfw"``, where a tensor stands as ``{"$tensor": key}`` and bytes as ``{"$bytes": hex}``.
Tuples are written as lists; :func:`to_plain` turns numpy arrays and scalars into tensors and Python numbers first.
The file is written atomically (:func:`~torch_bcfw.io.serialization.atomic_write_stream`).

:func:`load_tree` reads it back with bounds checked before anything is built: the header at most
:data:`MAX_HEADER_BYTES`, at most :data:`MAX_TENSORS` tensors of the dtypes :data:`DTYPES` (the safetensors library
checks that each fills exactly its bytes of the file), JSON nested at most :data:`MAX_DEPTH` levels, every tensor
referenced exactly once.  A file that is not one raises ``ValueError`` in one line naming the file and the field; a
pickle (the ``torch.save`` format) is refused with the command that converts it.
"""
from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from .serialization import atomic_write_stream

__all__ = ["save_tree", "load_tree", "save_tensors", "read_header", "to_plain", "DTYPES", "MAX_HEADER_BYTES",
           "MAX_TENSORS", "MAX_DEPTH", "METADATA_KEY"]

#: the safetensors dtype names of the tensors a file may hold
DTYPES = {torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
          torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8",
          torch.bool: "BOOL"}
#: the header (tensor table and JSON) a file may have: decoded JSON takes at most ~30x its bytes
MAX_HEADER_BYTES = 8 << 20
#: tensors a file may hold
MAX_TENSORS = 65536
#: nesting levels of the JSON tree
MAX_DEPTH = 32
#: the metadata entry holding the JSON tree
METADATA_KEY = "torch_bcfw"


def to_plain(obj):
    """A copy of ``obj`` in which numpy arrays are CPU tensors and numpy scalars Python numbers (containers copied
    recursively, tensors detached CPU clones, other values kept): what :func:`save_tree` writes."""
    if isinstance(obj, dict):
        return {k: to_plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(to_plain(v) for v in obj)
    if isinstance(obj, np.ndarray):
        return torch.from_numpy(np.array(obj, copy=True))
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, torch.Tensor):
        return obj.detach().cpu().clone()
    return obj


def _encode(obj, parts: tuple, tensors: dict):
    """The JSON form of ``obj`` at ``parts``; its tensors go into ``tensors`` (key -> contiguous CPU tensor)."""
    where = "/".join(map(str, parts)) or "the top level"
    if isinstance(obj, dict):
        out = {}
        for k, v in obj.items():
            if not isinstance(k, str) or k.startswith("$"):
                raise ValueError(f"cannot save the key {k!r} at {where}: keys are strings not starting with '$'")
            out[k] = _encode(v, parts + (k,), tensors)
        return out
    if isinstance(obj, (list, tuple)):
        return [_encode(v, parts + (j,), tensors) for j, v in enumerate(obj)]
    if isinstance(obj, torch.Tensor):
        if obj.layout != torch.strided or obj.dtype not in DTYPES:
            raise ValueError(f"cannot save the tensor at {where}: {obj.layout} {obj.dtype} (dense tensors of "
                             f"{', '.join(str(d).removeprefix('torch.') for d in DTYPES)} only)")
        key = where
        while key in tensors or key == "__metadata__":
            key += "#"
        tensors[key] = obj.detach().cpu().resolve_neg().resolve_conj().contiguous()
        return {"$tensor": key}
    if isinstance(obj, (bytes, bytearray)):
        return {"$bytes": bytes(obj).hex()}
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    raise ValueError(f"cannot save a {type(obj).__name__} at {where}: tensors, dicts, lists, strings, numbers, "
                     "booleans, None and bytes only")


def save_tree(tree, path) -> None:
    """Write ``tree`` to ``path`` as one safetensors file (see the module docstring), atomically.  ``ValueError``
    naming the place of a value it cannot hold."""
    tensors: dict = {}
    text = json.dumps(_encode(tree, (), tensors), separators=(",", ":"))
    save_tensors(tensors, {METADATA_KEY: text}, path)


def save_tensors(tensors: dict, metadata: dict, path) -> None:
    """Write the named CPU tensors ``tensors`` (contiguous, of :data:`DTYPES`) and the string entries ``metadata``
    to ``path`` as a safetensors file, atomically."""
    # the widest elements first: every tensor starts at a multiple of its element size (the data starts at one of 8)
    order = sorted(tensors, key=lambda k: -tensors[k].element_size())
    header, at = {"__metadata__": metadata}, 0
    for key in order:
        t = tensors[key]
        n = t.numel() * t.element_size()
        header[key] = {"dtype": DTYPES[t.dtype], "shape": list(t.shape), "data_offsets": [at, at + n]}
        at += n
    head = json.dumps(header, separators=(",", ":")).encode()
    head += b" " * (-len(head) % 8)
    if len(head) > MAX_HEADER_BYTES or len(tensors) > MAX_TENSORS:
        raise ValueError(f"cannot save {path}: {len(head)} bytes of header and {len(tensors)} tensors exceed what "
                         f"a file may hold ({MAX_HEADER_BYTES} bytes, {MAX_TENSORS} tensors)")

    def write(f):
        f.write(struct.pack("<Q", len(head)))
        f.write(head)
        for key in order:
            t = tensors[key]
            if t.numel():
                f.write(memoryview(t.reshape(-1).view(torch.uint8).numpy()))

    atomic_write_stream(path, write)


def _refuse(path, what: str, detail: str) -> ValueError:
    return ValueError(f"{path} is not a readable {what}: {detail}")


def read_header(path, what: str = "file") -> dict:
    """The safetensors header of the file at ``path`` (tensor name -> ``{"dtype", "shape", "data_offsets"}``, and
    ``"__metadata__"``), its size and dtypes checked.  ``FileNotFoundError``; ``ValueError`` (one line) for a file that
    is not a safetensors file of at most :data:`MAX_HEADER_BYTES` of header and :data:`MAX_TENSORS` tensors of
    :data:`DTYPES`, naming the conversion for a pickle."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{what} {path} not found")
    size = path.stat().st_size
    with open(path, "rb") as f:
        start = f.read(8)
        n = struct.unpack("<Q", start)[0] if len(start) == 8 else None
        raw = f.read(n) if n is not None and n <= min(MAX_HEADER_BYTES, size - 8) else b""
    if not raw.startswith(b"{") and (start[:4] == b"PK\x03\x04" or start[:1] == b"\x80"):
        raise ValueError(f"{path} is a pickle file (torch.save), which torch_bcfw does not load as a {what}: if "
                         f"you trust it, convert it once with `torch-bcfw convert {path} "
                         f"{path.with_suffix('.safetensors')}`")
    if n is None:
        raise _refuse(path, what, f"{size} bytes, shorter than a safetensors header")
    if n > MAX_HEADER_BYTES or n > size - 8:
        raise _refuse(path, what, f"its header declares {n} bytes (the file has {size}, a header at most "
                                  f"{MAX_HEADER_BYTES})")
    try:
        header = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise _refuse(path, what, f"its header is not JSON ({str(exc).splitlines()[0][:100] or 'too deep'})") from None
    if not isinstance(header, dict) or not isinstance(header.get("__metadata__", {}), dict):
        raise _refuse(path, what, "its header is not a safetensors header")
    if len(header) > MAX_TENSORS + 1:
        raise _refuse(path, what, f"it holds {len(header) - 1} tensors, at most {MAX_TENSORS} are read")
    allowed = set(DTYPES.values())
    for key, info in header.items():
        if key != "__metadata__" and not (isinstance(info, dict) and info.get("dtype") in allowed):
            dtype = info.get("dtype") if isinstance(info, dict) else info
            raise _refuse(path, what, f"tensor {key!r} has dtype {str(dtype)[:40]!r}, not one of {sorted(allowed)}")
    return header


def load_tree(path, what: str = "file"):
    """The tree :func:`save_tree` wrote to ``path`` (tensors on the CPU).  ``FileNotFoundError``; ``ValueError``
    (one line naming ``path`` and the field) for anything else (see the module docstring)."""
    header = read_header(path, what)
    text = header["__metadata__"].get(METADATA_KEY) if "__metadata__" in header else None
    if not isinstance(text, str):
        raise _refuse(path, what, f"its metadata has no {METADATA_KEY!r} entry (not written by torch_bcfw)")
    try:
        tree = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise _refuse(path, what, f"its {METADATA_KEY!r} entry is not JSON "
                                  f"({str(exc).splitlines()[0][:100] or 'too deep'})") from None
    try:
        tensors = load_file(path)
    except (SafetensorError, OSError, RuntimeError, ValueError) as exc:
        raise _refuse(path, what, str(exc).strip().splitlines()[0][:200]) from None
    used: set = set()

    def resolve(node, parts: tuple, depth: int):
        if depth > MAX_DEPTH:
            raise _refuse(path, what, f"{'/'.join(map(str, parts))} is nested deeper than {MAX_DEPTH} levels")
        if isinstance(node, dict):
            marks = [k for k in node if k.startswith("$")]
            if marks:
                return reference(node, marks, parts)
            for k, v in node.items():
                node[k] = resolve(v, parts + (k,), depth + 1)
        elif isinstance(node, list):
            for j, v in enumerate(node):
                node[j] = resolve(v, parts + (j,), depth + 1)
        return node

    def reference(node: dict, marks: list, parts: tuple):
        field = "/".join(map(str, parts)) or "the top level"
        value = node[marks[0]]
        if len(node) != 1 or marks[0] not in ("$tensor", "$bytes") or not isinstance(value, str):
            raise _refuse(path, what, f"{field} is neither a tensor reference nor bytes ({sorted(node)[:3]})")
        if marks[0] == "$bytes":
            try:
                return bytes.fromhex(value)
            except ValueError:
                raise _refuse(path, what, f"{field} holds bytes that are not hexadecimal") from None
        if value not in tensors or value in used:
            raise _refuse(path, what, f"{field} names the tensor {value[:80]!r}, which the file does not hold "
                                      "or another field names too")
        used.add(value)
        return tensors[value]

    tree = resolve(tree, (), 0)
    if len(used) != len(tensors):
        extra = sorted(set(tensors) - used)
        raise _refuse(path, what, f"it holds tensors no field names ({', '.join(map(repr, extra[:3]))})")
    return tree
