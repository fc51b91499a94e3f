"""The pickle stream of a ``torch.save`` archive, checked before ``torch.load`` builds anything.

:func:`check_torch_archive` walks ``data.pkl`` with :func:`pickletools.genops` and a small symbolic stack (no object
is built): the stream may name only the globals a saved run uses (:data:`ALLOWED_GLOBALS`: the tensor rebuild
functions, the typed storages, dtypes, ``torch.Size`` and ``collections.OrderedDict``), use only the opcodes of
plain containers, and every allocation it asks for is counted against the file's budget:

* each storage (``BINPERSID``) holds exactly the bytes of its record in the archive, and all storages together at
  most :data:`TENSOR_BYTES_PER_BYTE` times the file;
* container entries (``APPEND(S)``, ``SETITEM(S)``, ``ADDITEMS``, tuples) at most :data:`NODES_FIXED` plus
  :data:`NODES_PER_BYTE` per byte of the file, so that memo references (``GET``) cannot multiply a few bytes into
  gigabytes of pointers.

A refusal is one ``ValueError`` naming the file and the reason.
"""
from __future__ import annotations

import pickletools
import zipfile

__all__ = ["check_torch_archive", "ALLOWED_GLOBALS", "STORAGE_ITEMSIZE", "NODES_FIXED", "NODES_PER_BYTE",
           "TENSOR_BYTES_PER_BYTE"]

#: entries of containers a file may build: a fixed allowance plus this many per byte of the file
NODES_FIXED, NODES_PER_BYTE = 1_000_000, 0.5
#: bytes of tensor storage per byte of the file (the storages are records of the file: at most 1x in a genuine one)
TENSOR_BYTES_PER_BYTE = 2

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
    """A placeholder for something the stream would build (a container, or the result of a call)."""

    __slots__ = ("what",)

    def __init__(self, what):
        self.what = what


_MARK = object()


def _refuse(path, reason: str):
    return ValueError(f"refusing to load {path}: {reason} (checked before loading; nothing was built or run)")


def _pickle_record(z: zipfile.ZipFile, path) -> tuple[str, dict]:
    """The name of the archive's ``data.pkl`` record and the sizes of its records by name (duplicate names, which
    readers resolve differently, refuse the file)."""
    infos = z.infolist()
    names = [i.filename for i in infos]
    if len(set(names)) != len(names):
        raise _refuse(path, "its archive holds two records of the same name")
    pkl = [n for n in names if n.endswith("/data.pkl") or n == "data.pkl"]
    if len(pkl) != 1:
        raise _refuse(path, f"its archive holds {len(pkl)} data.pkl records, torch.save writes one")
    return pkl[0], {i.filename: i.file_size for i in infos}


def check_torch_archive(path, size: int, unsafe=ValueError) -> None:
    """``ValueError`` (one line naming ``path``) unless the ``data.pkl`` of the ``torch.save`` archive at ``path``
    (``size`` bytes) names only :data:`ALLOWED_GLOBALS`, builds only plain containers and asks for no more memory
    than the budget of a file of ``size`` bytes (see the module docstring).  Globals outside the list raise
    ``unsafe`` (a subclass of ``ValueError``)."""
    with zipfile.ZipFile(path) as z:
        name, sizes = _pickle_record(z, path)
        stream = z.read(name)
    prefix = name[: -len("data.pkl")]
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
            elif o in ("EMPTY_DICT", "EMPTY_LIST", "EMPTY_TUPLE", "EMPTY_SET"):
                stack.append(() if o == "EMPTY_TUPLE" else _Obj(o))
            elif o in ("TUPLE1", "TUPLE2", "TUPLE3"):
                k = int(o[-1])
                count(k)
                stack.append(tuple(pop(k)))
            elif o == "TUPLE":
                items = pop_mark()
                count(len(items))
                stack.append(tuple(items))
            elif o in ("LIST", "DICT", "FROZENSET"):
                count(len(pop_mark()))
                stack.append(_Obj(o))
            elif o == "APPEND":
                pop(1)
                count(1)
            elif o in ("APPENDS", "SETITEMS", "ADDITEMS"):
                count(len(pop_mark()))
            elif o == "SETITEM":
                pop(2)
                count(1)
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
                stack.append(_Obj(func[2]))
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
    record = f"{prefix}data/{key}"
    if sizes.get(record) != nbytes:
        raise _refuse(path, f"its storage {key!r} declares {nbytes} bytes but the archive's record holds "
                            f"{sizes.get(record, 'none')}")
    if key in seen:
        return 0
    seen.add(key)
    return nbytes
