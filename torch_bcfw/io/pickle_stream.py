"""Pickles written by ``torch.save`` (the files of earlier versions, Lightning's ``.ckpt``), read once under checks.

Meant for files one trusts: the library's own files are safetensors (:mod:`~torch_bcfw.io.tree_file`), and only
``torch-bcfw convert`` and the export of a Lightning checkpoint read a pickle, through :func:`load_pickle_file`.
Before ``torch.load(weights_only=True)`` builds anything, :func:`check_torch_archive` walks ``data.pkl`` with
:func:`pickletools.genops` and a small symbolic stack (no object is built): the stream may name only the globals
a saved run uses (:data:`ALLOWED_GLOBALS`: the tensor rebuild functions, the typed storages, dtypes, ``torch.Size``
and ``collections.OrderedDict``), use only the opcodes of plain containers, and every allocation it asks for is
counted against the file's budget:

* each storage (``BINPERSID``) holds exactly the bytes of its record in the archive, and all storages together at
  most :data:`TENSOR_BYTES_PER_BYTE` times the file;
* container entries (``APPEND(S)``, ``SETITEM(S)``, tuples) and what the allowed callables copy (``torch.Size``,
  ``OrderedDict`` and ``_codecs.encode`` of an argument: its entries or characters, every time) at most
  :data:`NODES_FIXED` plus :data:`NODES_PER_BYTE` per byte of the file, so that memo references (``GET``) cannot
  multiply a few bytes into gigabytes;
* the archive holds exactly one ``data.pkl`` and no two records whose names differ only in case (torch's reader
  compares them case-insensitively), all under one folder;
* dict keys are strings or numbers (a nested tuple key would take exponential time to hash) and there are no sets.

After the load the objects are walked again (:func:`check_loaded`: tensor views within their storage, entries and
nesting depth within the budget).  A refusal is one ``ValueError`` naming the file and the reason.
"""
from __future__ import annotations

import pickle
import pickletools
import zipfile
from pathlib import Path

import torch

__all__ = ["load_pickle_file", "check_archive_records", "check_torch_archive", "check_loaded", "UnsafeFileError",
           "ALLOWED_GLOBALS", "STORAGE_ITEMSIZE", "NODES_FIXED", "NODES_PER_BYTE", "TENSOR_BYTES_PER_BYTE", "MAX_DEPTH"]

#: entries of containers a file may build: a fixed allowance plus this many per byte of the file
NODES_FIXED, NODES_PER_BYTE = 1_000_000, 0.5
#: bytes of tensor storage per byte of the file (the storages are records of the file: at most 1x in a genuine one)
TENSOR_BYTES_PER_BYTE = 2
#: nesting levels of the loaded objects
MAX_DEPTH = 64


class UnsafeFileError(ValueError):
    """A pickle names something other than tensors and plain containers (it would run code to load)."""

#: the typed storages ``torch.save`` names in a persistent id, with the bytes of one element
STORAGE_ITEMSIZE = {
    "DoubleStorage": 8, "FloatStorage": 4, "HalfStorage": 2, "BFloat16Storage": 2, "LongStorage": 8,
    "IntStorage": 4, "ShortStorage": 2, "CharStorage": 1, "ByteStorage": 1, "BoolStorage": 1,
    "ComplexDoubleStorage": 16, "ComplexFloatStorage": 8, "UntypedStorage": 1,
}
_DTYPES = ("float64", "float32", "float16", "bfloat16", "int64", "int32", "int16", "int8", "uint8", "bool",
           "complex128", "complex64")

#: the globals a file written by torch_bcfw names (``_codecs.encode(text, "latin1")``: how protocol 2 pickles bytes)
ALLOWED_GLOBALS = frozenset(
    {("torch._utils", "_rebuild_tensor_v2"), ("torch._utils", "_rebuild_sparse_tensor"),
     ("collections", "OrderedDict"), ("torch", "Size"), ("_codecs", "encode")}
    | {("torch", name) for name in STORAGE_ITEMSIZE}
    | {("torch", name) for name in _DTYPES}
)

_LITERALS = {
    "BININT", "BININT1", "BININT2", "INT", "LONG", "LONG1", "LONG4", "BINFLOAT", "FLOAT", "NONE", "NEWTRUE",
    "NEWFALSE", "BINUNICODE", "SHORT_BINUNICODE", "BINUNICODE8", "UNICODE", "BINSTRING", "SHORT_BINSTRING",
    "STRING", "BINBYTES", "SHORT_BINBYTES", "BINBYTES8",
}
_FRAMING = {"PROTO", "FRAME"}


class _Obj:
    """A placeholder for something the stream would build (a container, or the result of a call) and its entries."""

    __slots__ = ("what", "size")

    def __init__(self, what, size: int = 0):
        self.what, self.size = what, size


def _size(obj) -> int:
    """Entries a callable given ``obj`` copies (a string's characters counted as pointers' worth: 8 to an entry)."""
    if isinstance(obj, _Obj):
        return obj.size
    if isinstance(obj, (str, bytes)):
        return len(obj) // 8 + 1
    return len(obj) if isinstance(obj, tuple) else 1


_MARK = object()


def _refuse(path, reason: str):
    return ValueError(f"refusing to load {path}: {reason} (checked before loading; nothing was built or run)")


def _pickle_record(z: zipfile.ZipFile, path) -> tuple[str, dict]:
    """The name of the archive's ``data.pkl`` record and the sizes of its records by name (duplicate names, which
    readers resolve differently, refuse the file)."""
    infos = z.infolist()
    names = [i.filename.lower() for i in infos]
    if len(set(names)) != len(names):
        raise _refuse(path, "its archive holds two records of the same name (compared ignoring case)")
    pkl = [n for n in names if n.endswith("/data.pkl") or n == "data.pkl"]
    if len(pkl) != 1:
        raise _refuse(path, f"its archive holds {len(pkl)} data.pkl records, torch.save writes one")
    prefix = pkl[0][: -len("data.pkl")]
    if not all(n.startswith(prefix) for n in names):
        raise _refuse(path, "its archive holds records outside the folder of its data.pkl")
    return infos[names.index(pkl[0])].filename, {n: i.file_size for n, i in zip(names, infos)}


def load_pickle_file(path, what: str = "file"):
    """The objects of the ``torch.save`` archive at ``path``, read with ``weights_only=True`` once the archive
    (:func:`check_archive_records`), its pickle stream (:func:`check_torch_archive`) and then the loaded objects
    (:func:`check_loaded`) pass.  For files one trusts (see the module docstring).

    Raises:
        FileNotFoundError: no file at ``path``.
        UnsafeFileError: the stream names a global other than :data:`ALLOWED_GLOBALS` (nothing was run).
        ValueError: anything else, in one line naming ``path``.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{what} {path} not found")
    if not zipfile.is_zipfile(path):  # torch.save writes a zip archive (since torch 1.6)
        raise ValueError(f"{path} is not a readable {what}: not a zip archive written by torch.save")
    size = path.stat().st_size
    check_archive_records(path, size, what)
    check_torch_archive(path, size, unsafe=UnsafeFileError)
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        first = str(exc).strip().splitlines()
        detail = next((ln.strip() for ln in first if "GLOBAL" in ln or "Unsupported" in ln), first[0] if first else "")
        raise UnsafeFileError(f"refusing to load {path}: it holds objects other than tensors and plain containers "
                              f"(loaded with weights_only=True; nothing was run). Detail: {detail}") from None
    except (RuntimeError, EOFError, OSError, ValueError, TypeError, AttributeError, MemoryError) as exc:
        detail = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
        raise ValueError(f"{path} is not a readable {what} (truncated or not written by torch.save): {detail}") \
            from None
    check_loaded(obj, size, f"{path} ({what})")
    return obj


def check_archive_records(path, size: int, what: str = "file") -> None:
    """torch.save stores its records uncompressed: a compressed record (which could expand far beyond the file) or
    records larger than the file refuse it before anything is read."""
    try:
        with zipfile.ZipFile(path) as z:
            infos = z.infolist()
    except (zipfile.BadZipFile, OSError, ValueError) as exc:
        raise ValueError(f"{path} is not a readable {what}: {exc}") from None
    if any(i.compress_type != zipfile.ZIP_STORED for i in infos) or sum(i.file_size for i in infos) > size:
        raise ValueError(f"{path} is not a readable {what}: its records are compressed or larger than the file "
                         "(torch.save stores them as they are)")


def _tensor_parts(t: torch.Tensor) -> list:
    """The strided tensors a sparse tensor is made of."""
    if t.layout == torch.sparse_coo:
        return [t._indices(), t._values()]
    if t.layout == torch.sparse_csr:
        return [t.crow_indices(), t.col_indices(), t.values()]
    raise ValueError(f"a tensor of layout {t.layout}")


def check_loaded(obj, size: int, where: str) -> None:
    """Refuse loaded objects that would take far more memory or time than the file's ``size`` bytes: a tensor viewing
    more elements than its storage, tensors above ``TENSOR_BYTES_PER_BYTE`` times the file, more container entries
    than the budget (shared containers counted each time reached) or nesting deeper than :data:`MAX_DEPTH`."""
    nodes_left = NODES_FIXED + int(size * NODES_PER_BYTE)
    tensor_left = TENSOR_BYTES_PER_BYTE * size + 2**20
    stack = [(obj, 0)]
    while stack:
        o, depth = stack.pop()
        nodes_left -= 1
        if nodes_left < 0:
            raise ValueError(f"{where}: more entries than a file of {size} bytes holds (shared references); refused")
        if depth > MAX_DEPTH:
            raise ValueError(f"{where}: nested deeper than {MAX_DEPTH} levels; refused")
        if isinstance(o, torch.Tensor):
            if o.layout != torch.strided:
                try:
                    stack.extend((p, depth + 1) for p in _tensor_parts(o))
                except ValueError as exc:
                    raise ValueError(f"{where}: {exc}, which no saved run holds") from None
                continue
            nbytes = o.numel() * o.element_size()
            if nbytes > o.untyped_storage().nbytes():
                raise ValueError(f"{where}: a tensor of shape {tuple(o.shape)} views more elements than its storage "
                                 "holds (a zero-stride or overlapping view); refused")
            tensor_left -= nbytes
            if tensor_left < 0:
                raise ValueError(f"{where}: its tensors hold more than {TENSOR_BYTES_PER_BYTE}x the file's {size} "
                                 "bytes (views of shared storage); refused")
        elif isinstance(o, dict):
            for k, v in o.items():
                stack.append((k, depth + 1))
                stack.append((v, depth + 1))
        elif isinstance(o, (list, tuple)):
            stack.extend((v, depth + 1) for v in o)


def check_torch_archive(path, size: int, unsafe=ValueError) -> None:
    """``ValueError`` (one line naming ``path``) unless the ``data.pkl`` of the ``torch.save`` archive at ``path``
    (``size`` bytes) names only :data:`ALLOWED_GLOBALS`, builds only plain containers and asks for no more memory
    than the budget of a file of ``size`` bytes (see the module docstring).  Globals outside the list raise
    ``unsafe`` (a subclass of ``ValueError``)."""
    with zipfile.ZipFile(path) as z:
        name, sizes = _pickle_record(z, path)
        stream = z.read(name)
    prefix = name[: -len("data.pkl")].lower()
    nodes_left = NODES_FIXED + int(size * NODES_PER_BYTE)
    bytes_left = TENSOR_BYTES_PER_BYTE * size + 2**20
    seen_keys: set = set()
    stack: list = []
    memo: dict = {}

    def pop_mark():
        for j in range(len(stack) - 1, -1, -1):
            if stack[j] is _MARK:
                items = stack[j + 1:]
                del stack[j:]
                return items
        raise _refuse(path, "its pickle stream pops a mark it never set")

    def pop(k: int = 1):
        if len(stack) < k or any(v is _MARK for v in stack[len(stack) - k:]):
            raise _refuse(path, "its pickle stream pops more than it pushed")
        items = stack[len(stack) - k:]
        del stack[len(stack) - k:]
        return items

    def keys(pairs: list):
        for key in pairs[0::2]:
            if not (key is None or isinstance(key, (str, int, float, bool))):
                raise _refuse(path, "its pickle stream uses a container as a dict key, which no saved run does")

    def count(k: int):
        nonlocal nodes_left
        nodes_left -= k
        if nodes_left < 0:
            raise _refuse(path, f"its containers hold more entries than a file of {size} bytes holds "
                                "(shared references counted each time)")

    try:
        for op, arg, _pos in pickletools.genops(stream):
            o = op.name
            if o in _LITERALS:
                stack.append(arg)
            elif o in _FRAMING:
                continue
            elif o == "MARK":
                stack.append(_MARK)
            elif o in ("EMPTY_DICT", "EMPTY_LIST", "EMPTY_TUPLE"):
                stack.append(() if o == "EMPTY_TUPLE" else _Obj(o))
            elif o in ("TUPLE1", "TUPLE2", "TUPLE3"):
                k = int(o[-1])
                count(k)
                stack.append(tuple(pop(k)))
            elif o == "TUPLE":
                items = pop_mark()
                count(len(items))
                stack.append(tuple(items))
            elif o in ("LIST", "DICT"):
                items = pop_mark()
                if o == "DICT":
                    keys(items)
                count(len(items))
                stack.append(_Obj(o, len(items)))
            elif o in ("APPEND", "APPENDS", "SETITEM", "SETITEMS"):
                items = pop_mark() if o.endswith("S") else pop(2 if o == "SETITEM" else 1)
                if o.startswith("SET"):
                    keys(items)
                count(len(items))
                if stack and isinstance(stack[-1], _Obj):
                    stack[-1].size += len(items)
            elif o in ("PUT", "BINPUT", "LONG_BINPUT"):
                if not stack or stack[-1] is _MARK:
                    raise _refuse(path, "its pickle stream memoises nothing")
                memo[arg] = stack[-1]
            elif o == "MEMOIZE":
                if not stack or stack[-1] is _MARK:
                    raise _refuse(path, "its pickle stream memoises nothing")
                memo[len(memo)] = stack[-1]
            elif o in ("GET", "BINGET", "LONG_BINGET"):
                if arg not in memo:
                    raise _refuse(path, f"its pickle stream reads memo entry {arg} before writing it")
                stack.append(memo[arg])
            elif o == "GLOBAL":
                module, _, gname = arg.partition(" ")
                if (module, gname) not in ALLOWED_GLOBALS:
                    raise unsafe(
                        f"refusing to load {path}: it names the global {module}.{gname}, which no saved run holds "
                        "(checked before loading with weights_only=True; nothing was run)")
                stack.append(("global", module, gname))
            elif o == "REDUCE":
                func, args = pop(2)
                if not (isinstance(func, tuple) and len(func) == 3 and func[0] == "global"):
                    raise _refuse(path, "its pickle stream calls something that is not a named function")
                if func[1] == "_codecs" and not (isinstance(args, tuple) and len(args) == 2
                                                 and isinstance(args[0], str) and args[1] == "latin1"):
                    raise _refuse(path, "its pickle stream encodes something other than latin1 text")
                if not isinstance(args, (tuple, _Obj)):
                    raise _refuse(path, "its pickle stream calls a function without a tuple of arguments")
                if func[2] == "OrderedDict" and args != ():
                    raise _refuse(path, "its pickle stream builds an OrderedDict from an argument (torch.save fills "
                                        "an empty one)")
                copied = sum(_size(a) for a in args) if isinstance(args, tuple) else args.size
                count(copied)  # torch.Size, OrderedDict, _codecs.encode copy their argument
                stack.append(_Obj(func[2], copied))
            elif o == "BINPERSID":
                (pid,) = pop(1)
                bytes_left -= _storage_bytes(path, pid, prefix, sizes, seen_keys)
                if bytes_left < 0:
                    raise _refuse(path, f"its tensors hold more than {TENSOR_BYTES_PER_BYTE}x the file's {size} bytes")
                stack.append(_Obj("storage"))
            elif o == "BUILD":  # the attributes of what is below: a module's state_dict carries ``_metadata``
                pop(1)
                count(1)
            elif o == "POP":
                pop(1)
            elif o == "POP_MARK":
                pop_mark()
            elif o == "DUP":
                stack.append(pop(1)[0])
                stack.append(stack[-1])
            elif o == "STOP":
                break
            else:
                raise _refuse(path, f"its pickle stream uses the opcode {o}, which no saved run holds")
    except (ValueError, TypeError) as exc:
        if isinstance(exc, ValueError) and str(exc).startswith("refusing to load"):
            raise
        raise _refuse(path, f"its pickle stream is not readable ({exc})") from None


def _storage_bytes(path, pid, prefix: str, sizes: dict, seen: set) -> int:
    """The bytes the storage named by the persistent id ``pid`` allocates (0 when ``seen`` already holds its key):
    ``('storage', torch.<T>Storage, key, location, numel)`` whose record ``data/<key>`` holds exactly ``numel``
    elements."""
    if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage" and isinstance(pid[1], tuple)
            and pid[1][:2] == ("global", "torch") and pid[1][2] in STORAGE_ITEMSIZE
            and isinstance(pid[2], str) and isinstance(pid[4], int) and pid[4] >= 0):
        raise _refuse(path, "its pickle stream names a persistent object other than a typed storage")
    _, cls, key, _loc, numel = pid
    nbytes = numel * STORAGE_ITEMSIZE[cls[2]]
    record = f"{prefix}data/{key}".lower()
    if sizes.get(record) != nbytes:
        raise _refuse(path, f"its storage {key!r} declares {nbytes} bytes but the archive's record holds "
                            f"{sizes.get(record, 'none')}")
    if key in seen:
        return 0
    seen.add(key)
    return nbytes
