"""A crafted file cannot take far more memory than its bytes: model files are safetensors (a pickle is refused before
anything is read); the conversion of a pickle checks its stream before ``torch.load`` builds anything (only the
globals a saved run uses; every allocation, and every copy an allowed callable makes, against the byte budget; one
``data.pkl`` however its name is spelled; no container as a dict key), and the OCR pickle reader counts every
reference to an array.  The heavy tests measure the peak memory of each load in a separate process (under an
address-space limit, so that a regression fails instead of exhausting the machine)."""
from __future__ import annotations

import json
import pickle
import pickletools
import struct
import subprocess
import sys
import textwrap
import time
import zipfile

import numpy as np
import pytest
import torch

from conftest import random_chain_problem
from torch_bcfw import FitResult, cli, fit
from torch_bcfw.datasets.ocr import load_ocr
from torch_bcfw.io.pickle_stream import UnsafeFileError, load_pickle_file


def _rewrite(src, dst, pkl=None, extra=()):
    """Copy the archive ``src`` to ``dst``, its ``data.pkl`` through ``pkl`` and ``extra`` ``(name, bytes)`` records
    appended."""
    with zipfile.ZipFile(src) as z, zipfile.ZipFile(dst, "w", zipfile.ZIP_STORED) as out:
        for info in z.infolist():
            data = z.read(info.filename)
            if pkl is not None and info.filename.endswith("data.pkl"):
                data = pkl(data)
            out.writestr(info.filename, data)
        for name, data in extra:
            out.writestr(name, data)


def _with_bytearrays(sizes):
    """A ``data.pkl`` transform adding to the top-level dict one record ``junk<j>: bytearray(size)`` per size (23
    bytes each): what torch's ``weights_only`` unpickler allows."""
    def transform(data: bytes) -> bytes:
        assert data.endswith(b".")
        body = data[:-1]
        for j, n in enumerate(sizes):
            key = f"junk{j}".encode()
            body += (b"X" + struct.pack("<I", len(key)) + key + b"cbuiltins\nbytearray\n" + b"\x8a\x05"
                     + int(n).to_bytes(5, "little") + b"\x85Rs")
        return body + b"."
    return transform


def _model_file(tmp_path):
    """A model file as ``torch.save`` wrote it (what ``torch-bcfw convert`` reads)."""
    model, data = random_chain_problem(n=5, seed=3)
    path = tmp_path / "model.pt"
    torch.save(fit(model, data, 0.1, max_passes=2).to_dict(state=False), path)
    return path


def test_a_bytearray_in_a_genuine_model_file_is_refused_before_it_is_built(tmp_path, capsys):
    genuine = _model_file(tmp_path)
    _rewrite(genuine, tmp_path / "crafted.pt", _with_bytearrays([10**7] * 3))
    with pytest.raises(UnsafeFileError) as err:
        load_pickle_file(tmp_path / "crafted.pt")
    msg = str(err.value)
    assert "\n" not in msg and "crafted.pt" in msg and "builtins.bytearray" in msg and "before loading" in msg
    with pytest.raises(ValueError, match="is a pickle file"):  # the normal loader reads no pickle
        FitResult.load(tmp_path / "crafted.pt")
    assert cli.main(["convert", str(genuine), str(tmp_path / "model.safetensors")]) == 0
    assert torch.equal(FitResult.load(tmp_path / "model.safetensors").w, load_pickle_file(genuine)["w"])


def _stream(body: bytes) -> bytes:
    return b"\x80\x02" + body + b"."


def _replace_stream(genuine, dst, body: bytes, extra=()):
    _rewrite(genuine, dst, lambda _: _stream(body), extra)


@pytest.mark.filterwarnings("ignore:Duplicate name")
def test_crafted_streams_are_refused_in_one_line_within_seconds(tmp_path, capsys):
    """The attacks on the conversion's checks: a second ``DATA.PKL`` (torch's reader compares names ignoring case),
    ``torch.Size`` and ``OrderedDict`` copying one memoised object again and again, a nested tuple as a dict key
    (hashing it takes time doubling per level), a set: each refused by ``torch-bcfw convert`` with rc 2, one line,
    within 5 s, nothing written."""
    genuine = _model_file(tmp_path)
    with zipfile.ZipFile(genuine) as z:
        folder = next(n for n in z.namelist() if n.endswith("data.pkl"))[: -len("data.pkl")]
    evil = _stream(b"cbuiltins\nbytearray\nJ\x00\x00\x00\x40\x85R")
    _rewrite(genuine, tmp_path / "case.pt", extra=[(folder + "DATA.PKL", evil)])
    big_tuple = b"(" + b"K\x00" * 1000 + b"tq\x01"
    sizes = b"ctorch\nSize\nq\x02" + big_tuple + b"](" + b"h\x02h\x01\x85R" * 200_000 + b"e"
    _replace_stream(genuine, tmp_path / "size.pt", sizes)
    pairs = b"(" + b"(K\x00K\x00tq\x05" + b"h\x05" * 999 + b"lq\x01"
    odict = b"ccollections\nOrderedDict\nq\x02" + pairs + b"](" + b"h\x02h\x01\x85R" * 1000 + b"e"
    _replace_stream(genuine, tmp_path / "odict.pt", odict)
    nested = b"K\x00\x85q\x00" + b"".join(bytes([104, j, 104, j, 0x86, 113, j + 1]) for j in range(60))
    _replace_stream(genuine, tmp_path / "hash.pt", b"}" + nested + b"K\x01s")
    _replace_stream(genuine, tmp_path / "set.pt", b"\x8f(K\x01K\x02\x90")
    for name, message in (("case.pt", "two records of the same name"), ("size.pt", "more entries than a file"),
                          ("odict.pt", "builds an OrderedDict from an argument"),
                          ("hash.pt", "uses a container as a dict key"), ("set.pt", "opcode EMPTY_SET")):
        out = tmp_path / "converted.safetensors"
        t0 = time.perf_counter()
        rc = cli.main(["convert", str(tmp_path / name), str(out)])
        err = capsys.readouterr().err.strip()
        assert time.perf_counter() - t0 < 5.0 and rc == 2 and not out.exists(), (name, err)
        assert len(err.splitlines()) == 1 and name in err and message in err, (name, err)


@pytest.mark.filterwarnings("ignore:Duplicate name")
def test_storages_must_hold_the_bytes_of_their_records(tmp_path):
    """A storage declaring more elements than its record holds, or a second record of the same name, is refused
    before torch reads it."""
    genuine = _model_file(tmp_path)
    with zipfile.ZipFile(genuine) as z:
        pkl = z.read(next(n for n in z.namelist() if n.endswith("data.pkl")))
    def inflate(data: bytes) -> bytes:  # the numel of the first storage's persistent id becomes 10^8
        ops = list(pickletools.genops(data))
        at = next(k for k, (op, _, _) in enumerate(ops) if op.name == "BINPERSID")
        tup = max(k for k in range(at) if ops[k][0].name == "TUPLE")
        op, _, pos = ops[tup - 1]  # ... numel TUPLE [BINPUT] BINPERSID
        assert op.name in ("BININT1", "BININT2", "BININT")
        width = {"BININT1": 2, "BININT2": 3, "BININT": 5}[op.name]
        return data[:pos] + b"J" + struct.pack("<i", 10**8) + data[pos + width:]

    _rewrite(genuine, tmp_path / "inflated.pt", inflate)
    with pytest.raises(ValueError, match=r"inflated\.pt: its storage .* declares 800000000 bytes"):
        load_pickle_file(tmp_path / "inflated.pt")
    with zipfile.ZipFile(genuine) as z:
        first = z.namelist()[0]
        dup = z.read(first)
    _rewrite(genuine, tmp_path / "dup.pt", extra=[(first, dup)])
    with pytest.raises(ValueError, match="two records of the same name"):
        load_pickle_file(tmp_path / "dup.pt")


def _shared_reference_pickle(path, refs=20_000, letters=2900):
    """A ``letters.pickle`` whose ``refs`` words all name one array of ``letters`` letters (pickle's memo)."""
    img = np.zeros((letters, 128), dtype=np.uint8)
    lab = np.zeros(letters, dtype=np.int64)
    with open(path, "wb") as f:
        pickle.dump({"data": [img] * refs, "labels": [lab] * refs, "folds": np.zeros(refs, dtype=np.int64)}, f,
                    protocol=2)


def test_ocr_pickle_shared_references_count_each_time(tmp_path):
    _shared_reference_pickle(tmp_path / "letters.pickle", refs=2_000, letters=300)
    assert (tmp_path / "letters.pickle").stat().st_size < 100_000
    with pytest.raises(ValueError, match="shared references counted each time") as err:
        load_ocr(tmp_path)
    assert "\n" not in str(err.value) and "letters.pickle" in str(err.value)


#: runs one load in a fresh process under an address-space limit and prints its outcome and peak RSS growth
_WORKER = textwrap.dedent("""
    import json, resource, sys, time, traceback
    import torch_bcfw, torch_bcfw.cli
    from torch_bcfw.datasets.ocr import load_ocr
    kind, path, budget = sys.argv[1], sys.argv[2], int(sys.argv[3])
    vm = next(int(l.split()[1]) * 1024 for l in open("/proc/self/status") if l.startswith("VmSize:"))
    resource.setrlimit(resource.RLIMIT_AS, (vm + budget + 2**30, vm + budget + 2**30))
    # the resident size now, and the peak reset to it (the imports' transient peak is not the load's): the growth
    # below is the load's own peak growth
    before = next(int(l.split()[1]) * 1024 for l in open("/proc/self/status") if l.startswith("VmRSS:"))
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    out = {"error": None, "type": None}
    t0 = time.perf_counter()
    try:
        if kind == "convert":
            out["rc"] = torch_bcfw.cli.main(["convert", path, path + ".safetensors"])
        elif kind == "evaluate":
            out["rc"] = torch_bcfw.cli.main(["evaluate", "--model", path])
        else:
            load_ocr(path)
    except BaseException as exc:
        out["type"], out["error"] = type(exc).__name__, str(exc)
    out["seconds"] = time.perf_counter() - t0
    out["growth"] = next(int(l.split()[1]) * 1024 for l in open("/proc/self/status") if l.startswith("VmHWM:")) - before
    print(json.dumps(out))
""")


def _measured_load(kind, path, size):
    budget = 2 * size + 300 * 2**20
    proc = subprocess.run([sys.executable, "-c", _WORKER, kind, str(path), str(budget)], capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["growth"] <= budget and out["seconds"] < 5.0, out
    return out, proc.stderr


@pytest.mark.heavy
def test_crafted_model_files_load_within_twice_their_size(tmp_path):
    """Three 23-byte bytearray records appended to a genuine model file, and one of 8 GB: the conversion refuses
    them and evaluate refuses the pickle, each in one line, its peak memory within 2x the file plus 300 MB."""
    genuine = _model_file(tmp_path)
    for name, sizes in (("three.pt", [1_500_000_000] * 3), ("big.pt", [8 * 10**9])):
        _rewrite(genuine, tmp_path / name, _with_bytearrays(sizes))
        size = (tmp_path / name).stat().st_size
        out, stderr = _measured_load("convert", tmp_path / name, size)
        assert out["rc"] == 2 and "bytearray" in stderr and len(stderr.strip().splitlines()) == 1, (out, stderr)
        out, stderr = _measured_load("evaluate", tmp_path / name, size)
        assert out["rc"] == 2 and "is a pickle file" in stderr and len(stderr.strip().splitlines()) == 1, stderr


@pytest.mark.heavy
def test_shared_reference_ocr_pickle_loads_within_twice_its_size(tmp_path):
    """20,000 entries naming one array (a 630 KB file that asks for 7 GB): refused within 2x + 300 MB."""
    _shared_reference_pickle(tmp_path / "letters.pickle")
    size = (tmp_path / "letters.pickle").stat().st_size
    assert size < 1_000_000
    out, _ = _measured_load("ocr", tmp_path, size)
    assert out["type"] == "ValueError" and "shared references" in out["error"] and "\n" not in out["error"], out


@pytest.mark.heavy
def test_crafted_safetensors_headers_load_within_twice_their_size(tmp_path):
    """A model file whose JSON is the largest header allowed, filled with the entries that take the most memory
    once decoded (empty lists and dicts): evaluate refuses it in one line, within 5 s and 2x its size + 300 MB."""
    from safetensors.torch import save_file

    for name, entry in (("lists.safetensors", "[]"), ("dicts.safetensors", "{}")):
        path = tmp_path / name
        save_file({"w": torch.zeros(1)}, path, metadata={"torch_bcfw": "[" + ",".join([entry] * 2_600_000) + "]"})
        out, stderr = _measured_load("evaluate", path, path.stat().st_size)
        assert out["rc"] == 2 and "tensors no field names" in stderr and len(stderr.strip().splitlines()) == 1, stderr
