"""A crafted file cannot take far more memory than its bytes: the pickle stream of a model file is checked before
``torch.load`` builds anything (only the globals a saved run uses; every allocation against the byte budget), and the
OCR pickle reader counts every reference to an array.  The heavy tests measure the peak memory of each load in a
separate process (under an address-space limit, so that a regression fails instead of exhausting the machine)."""
from __future__ import annotations

import json
import pickle
import pickletools
import struct
import subprocess
import sys
import textwrap
import zipfile

import numpy as np
import pytest
import torch

from conftest import random_chain_problem
from torch_bcfw import FitResult, fit
from torch_bcfw.datasets.ocr import load_ocr
from torch_bcfw.io.serialization import UnsafeFileError


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
    model, data = random_chain_problem(n=5, seed=3)
    path = tmp_path / "model.pt"
    fit(model, data, 0.1, max_passes=2).save(path, state=False)
    return path


def test_a_bytearray_in_a_genuine_model_file_is_refused_before_it_is_built(tmp_path):
    genuine = _model_file(tmp_path)
    _rewrite(genuine, tmp_path / "crafted.pt", _with_bytearrays([10**7] * 3))
    with pytest.raises(UnsafeFileError) as err:
        FitResult.load(tmp_path / "crafted.pt")
    msg = str(err.value)
    assert "\n" not in msg and "crafted.pt" in msg and "builtins.bytearray" in msg and "before loading" in msg
    FitResult.load(genuine)


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
        FitResult.load(tmp_path / "inflated.pt")
    with zipfile.ZipFile(genuine) as z:
        first = z.namelist()[0]
        dup = z.read(first)
    _rewrite(genuine, tmp_path / "dup.pt", extra=[(first, dup)])
    with pytest.raises(ValueError, match="two records of the same name"):
        FitResult.load(tmp_path / "dup.pt")


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
    import json, resource, sys, traceback
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
    try:
        if kind == "load":
            torch_bcfw.FitResult.load(path)
        elif kind == "evaluate":
            out["rc"] = torch_bcfw.cli.main(["evaluate", "--model", path])
        else:
            load_ocr(path)
    except BaseException as exc:
        out["type"], out["error"] = type(exc).__name__, str(exc)
    out["growth"] = next(int(l.split()[1]) * 1024 for l in open("/proc/self/status") if l.startswith("VmHWM:")) - before
    print(json.dumps(out))
""")


def _measured_load(kind, path, size):
    budget = 2 * size + 300 * 2**20
    proc = subprocess.run([sys.executable, "-c", _WORKER, kind, str(path), str(budget)], capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["growth"] <= budget, out
    return out, proc.stderr


@pytest.mark.heavy
def test_crafted_model_files_load_within_twice_their_size(tmp_path):
    """Three 23-byte bytearray records appended to a genuine model file, and one of 8 GB: every load path refuses
    them in one line, its peak memory within 2x the file plus 300 MB."""
    genuine = _model_file(tmp_path)
    for name, sizes in (("three.pt", [1_500_000_000] * 3), ("big.pt", [8 * 10**9])):
        _rewrite(genuine, tmp_path / name, _with_bytearrays(sizes))
        size = (tmp_path / name).stat().st_size
        out, _ = _measured_load("load", tmp_path / name, size)
        assert out["type"] == "UnsafeFileError" and "bytearray" in out["error"] and "\n" not in out["error"], out
        out, stderr = _measured_load("evaluate", tmp_path / name, size)
        assert out["rc"] == 2 and "bytearray" in stderr and len(stderr.strip().splitlines()) == 1, (out, stderr)


@pytest.mark.heavy
def test_shared_reference_ocr_pickle_loads_within_twice_its_size(tmp_path):
    """20,000 entries naming one array (a 630 KB file that asks for 7 GB): refused within 2x + 300 MB."""
    _shared_reference_pickle(tmp_path / "letters.pickle")
    size = (tmp_path / "letters.pickle").stat().st_size
    assert size < 1_000_000
    out, _ = _measured_load("ocr", tmp_path, size)
    assert out["type"] == "ValueError" and "shared references" in out["error"] and "\n" not in out["error"], out
