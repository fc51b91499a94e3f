"""Nothing read from a file runs code: model files are safetensors (a pickle is refused with the command that converts
it), the conversion of a pickle refuses crafted ones, dataset pickles are checked, and the marker file a payload would
write never appears."""
from __future__ import annotations

import os
import pickle
import subprocess
import sys

import pytest
import torch

from conftest import random_chain_problem
from torch_bcfw import Chain, FitResult, fit, register_model
from torch_bcfw.datasets.ocr import load_ocr
from torch_bcfw.io.pickle_stream import UnsafeFileError, load_pickle_file
from torch_bcfw.io.tree_file import save_tree


class _Payload:
    """Unpickling this calls ``os.system`` (the classic pickle exploit)."""

    def __init__(self, command):
        self.command = command

    def __reduce__(self):
        return os.system, (self.command,)


def _touch(marker) -> str:
    return f"{sys.executable} -c \"open(r'{marker}', 'w').write('ran')\""


def _valid_dict():
    model, data = random_chain_problem()
    return fit(model, data, 0.1, max_passes=2).to_dict()


def test_pickled_call_in_a_model_file_is_refused_and_not_run(tmp_path):
    marker = tmp_path / "pwned"
    d = _valid_dict()
    d["history"] = [_Payload(_touch(marker))]
    torch.save(d, tmp_path / "evil.pt")
    with pytest.raises(ValueError, match=r"is a pickle file .*torch-bcfw convert .*evil\.pt .*evil\.safetensors"):
        FitResult.load(tmp_path / "evil.pt")
    with pytest.raises(UnsafeFileError, match="nothing was run"):  # the conversion checks it
        load_pickle_file(tmp_path / "evil.pt")
    assert not marker.exists()


def test_model_class_naming_a_function_is_refused_and_not_called(tmp_path):
    marker = tmp_path / "pwned"
    d = _valid_dict()
    d["model_class"] = "subprocess.run"
    d["model_config"] = {"args": _touch(marker), "shell": True}
    save_tree(d, tmp_path / "evil.safetensors")  # tensors and plain values only: the file format accepts it
    with pytest.raises(ValueError, match="not a registered model"):
        FitResult.load(tmp_path / "evil.safetensors")
    assert not marker.exists()


def test_cli_evaluate_refuses_both_crafted_files(tmp_path):
    marker = tmp_path / "pwned"
    d = _valid_dict()
    d["stopped_by"] = _Payload(_touch(marker))
    torch.save(d, tmp_path / "pickled.pt")
    d = _valid_dict()
    d["model_class"], d["model_config"] = "os.system", {"command": _touch(marker)}
    save_tree(d, tmp_path / "named.safetensors")
    torch.save(d, tmp_path / "named.pt")
    for command in (["evaluate", "--model", str(tmp_path / "pickled.pt")],
                    ["evaluate", "--model", str(tmp_path / "named.safetensors")],
                    ["convert", str(tmp_path / "pickled.pt"), str(tmp_path / "out.safetensors")],
                    ["convert", str(tmp_path / "named.pt"), str(tmp_path / "out.safetensors")]):
        proc = subprocess.run([sys.executable, "-m", "torch_bcfw", *command], capture_output=True, text=True,
                              timeout=120)
        assert proc.returncode == 2, proc.stderr
        assert proc.stderr.startswith("torch-bcfw: error:") and len(proc.stderr.strip().splitlines()) == 1
    assert not marker.exists() and not (tmp_path / "out.safetensors").exists()


def test_ocr_pickle_with_a_payload_is_refused_and_not_run(tmp_path):
    marker = tmp_path / "pwned"
    with open(tmp_path / "letters.pickle", "wb") as f:
        pickle.dump({"data": [], "labels": [], "folds": _Payload(_touch(marker))}, f, protocol=2)
    with pytest.raises(ValueError, match="posix.system|os.system|nt.system"):
        load_ocr(tmp_path)
    assert not marker.exists()


def test_ocr_pickle_of_the_wrong_shape_is_refused(tmp_path):
    with open(tmp_path / "letters.pickle", "wb") as f:
        pickle.dump([1, 2, 3], f, protocol=2)
    with pytest.raises(ValueError, match="top level is a list"):
        load_ocr(tmp_path)


@pytest.mark.parametrize("field,value,message", [
    ("format", "torch_bcfw.FitResult/99", "not a saved torch_bcfw FitResult"),
    ("lam", float("nan"), "bad lam"),
    ("lam", -1.0, "bad lam"),
    ("solver", "rm -rf", "unknown solver"),
    ("options", {"max_passes": 1, "bogus": 2}, "bad solver options"),
    ("w", torch.zeros(3, dtype=torch.float64), "shape"),
    ("w", "not a tensor", "must be a tensor"),
    ("w_avg", torch.full((1,), float("nan")), "shape|NaN"),
    ("history", [{"primal": 1.0, "evil": 2}], "unknown column"),
    ("history", "x", "history must be a list"),
    ("stopped_by", "bored", "stopped_by"),
    ("solver_state", [1, 2], "solver_state must be a dict"),
    ("counters", {"solver_time": "soon"}, "counters"),
    ("model_config", {"n_features": [1, 2]}, "does not build a Chain"),
    ("model_config", {"n_features": torch.ones(2)}, "model_config"),
])
def test_every_field_is_validated(tmp_path, field, value, message):
    d = _valid_dict()
    d[field] = value
    save_tree(d, tmp_path / "bad.safetensors")
    with pytest.raises(ValueError, match=message):
        FitResult.load(tmp_path / "bad.safetensors")


def test_missing_and_extra_fields_and_junk_files(tmp_path):
    d = _valid_dict()
    del d["w"]
    save_tree(d, tmp_path / "missing.safetensors")
    with pytest.raises(ValueError, match=r"missing field\(s\) \['w'\]"):
        FitResult.load(tmp_path / "missing.safetensors")
    (tmp_path / "junk.safetensors").write_bytes(b"\x00not a torch file")
    with pytest.raises(ValueError, match="not a readable"):
        FitResult.load(tmp_path / "junk.safetensors")
    with pytest.raises(FileNotFoundError, match="not found"):
        FitResult.load(tmp_path / "absent.safetensors")


def test_user_models_round_trip_once_registered(tmp_path):
    class MyChain(Chain):
        pass

    model, data = random_chain_problem()
    r = fit(MyChain(model.n_inputs, model.n_labels), data, 0.1, max_passes=2)
    with pytest.raises(ValueError, match="not registered"):
        r.save(tmp_path / "m.safetensors")
    register_model(MyChain, name="tests.MyChain")
    r.save(tmp_path / "m.safetensors")
    back = FitResult.load(tmp_path / "m.safetensors")
    assert type(back.model) is MyChain and torch.equal(back.w, r.w) and back.gap == r.gap
    with pytest.raises(ValueError, match="already registered"):
        register_model(Chain, name="tests.MyChain")


def test_saved_results_are_plain_safetensors_for_every_solver(tmp_path):
    import json

    from safetensors import safe_open

    model, data = random_chain_problem()
    for solver, kw in [("bcfw", {"preset": "gap-pairwise-cache"}), ("fw", {}), ("ssg", {}), ("mp-bcfw", {})]:
        r = fit(model, data, 0.1, solver, max_passes=3, **kw)
        r.save(tmp_path / "r.safetensors")
        with safe_open(str(tmp_path / "r.safetensors"), framework="pt") as f:  # the safetensors library alone
            tree = json.loads(f.metadata()["torch_bcfw"])
            assert torch.equal(f.get_tensor(tree["w"]["$tensor"]), r.w) and tree["lam"] == r.lam
        back = FitResult.load(tmp_path / "r.safetensors")
        cont = fit(model, data, 0.1, solver, max_passes=2, init=back, **kw)
        ref = fit(model, data, 0.1, solver, max_passes=2, init=r, **kw)
        assert torch.equal(cont.w, ref.w)


def test_the_genuine_ocr_pickle_resaved_by_python3_with_protocol_2_loads(tmp_path):
    """numpy arrays in a protocol-2 pickle from Python 3 carry their bytes through ``_codecs.encode(text, 'latin1')``:
    accepted (as bytes only); NaN folds are an error, not a cast to integers."""
    import numpy as np

    from conftest import shared_data

    with open(shared_data("ocr", "letters.pickle"), "rb") as f:
        raw = pickle.load(f, encoding="latin1")  # the repository's own data file: trusted
    with open(tmp_path / "letters.pickle", "wb") as f:
        pickle.dump(raw, f, protocol=2)
    assert b"_codecs" in (tmp_path / "letters.pickle").read_bytes()
    ref, got = load_ocr(shared_data("ocr")), load_ocr(tmp_path)
    assert np.array_equal(got.folds, ref.folds) and len(got.images) == len(ref.images)
    assert all(np.array_equal(a, b) for a, b in zip(got.images, ref.images))
    raw["folds"] = np.where(np.arange(len(raw["folds"])) == 3, np.nan, raw["folds"])
    with open(tmp_path / "letters.pickle", "wb") as f:
        pickle.dump(raw, f, protocol=2)
    with pytest.raises(ValueError, match="folds must hold whole numbers"):
        load_ocr(tmp_path)


def test_ocr_pickle_with_another_codec_is_refused(tmp_path):
    import codecs

    class Encoded:
        def __reduce__(self):
            return codecs.encode, ("x" * 10, "rot13")

    with open(tmp_path / "letters.pickle", "wb") as f:
        pickle.dump({"data": [], "labels": [], "folds": Encoded()}, f, protocol=2)
    with pytest.raises(ValueError, match="only latin1 text"):
        load_ocr(tmp_path)


def _saved_dict(tmp_path):
    model, data = random_chain_problem(n=4, seed=2)
    return fit(model, data, 0.1, max_passes=2, gap_check=1).to_dict()


def _rezip(src, dst, replace=None, compression=None):
    import zipfile

    with zipfile.ZipFile(src) as z, zipfile.ZipFile(dst, "w", compression or zipfile.ZIP_STORED) as out:
        for info in z.infolist():
            data = z.read(info.filename)
            out.writestr(info.filename, replace(info.filename, data) if replace else data)


def test_pickles_that_expand_beyond_their_bytes_are_refused_by_the_conversion(tmp_path):
    """A pickle to convert may not need far more memory than its size: a weight vector viewing 10^11 elements of 8
    bytes of storage, compressed records, 300,000 references to one history record, deep nesting."""
    d = _saved_dict(tmp_path)
    state = dict(d["solver_state"]["state"], w=torch.zeros(1, dtype=torch.float64).expand(10 ** 11))
    torch.save(dict(d, solver_state=dict(d["solver_state"], state=state)), tmp_path / "view.pt")
    with pytest.raises(ValueError, match="views more elements than its storage"):
        load_pickle_file(tmp_path / "view.pt")
    torch.save(d, tmp_path / "ok.pt")
    _rezip(tmp_path / "ok.pt", tmp_path / "deflated.pt", compression=__import__("zipfile").ZIP_DEFLATED)
    with pytest.raises(ValueError, match="compressed"):
        load_pickle_file(tmp_path / "deflated.pt")
    torch.save(dict(d, history=[d["history"][-1]] * 300_000), tmp_path / "shared.pt")
    assert (tmp_path / "shared.pt").stat().st_size < 2_000_000
    with pytest.raises(ValueError, match="more entries than a file"):
        load_pickle_file(tmp_path / "shared.pt")
    nested = []
    for _ in range(200):
        nested = [nested]
    torch.save(dict(d, counters=nested), tmp_path / "deep.pt")
    with pytest.raises(ValueError, match="nested deeper"):
        load_pickle_file(tmp_path / "deep.pt")
    FitResult.from_dict(load_pickle_file(tmp_path / "ok.pt"))  # the genuine file still converts


def test_a_deep_or_dangling_tree_file_is_refused_in_one_line(tmp_path):
    """A safetensors file whose JSON nests deeper than the cap, names a tensor it does not hold, holds a tensor no
    field names, or declares a header beyond the file."""
    import json
    import struct

    from safetensors.torch import save_file

    d = _saved_dict(tmp_path)
    nested = []
    for _ in range(200):
        nested = [nested]
    save_tree(dict(d, counters=nested), tmp_path / "deep.safetensors")
    cases = {"deep.safetensors": "nested deeper than 32 levels"}
    w = torch.zeros(3, dtype=torch.float64)
    for name, tree, tensors, message in (
        ("dangling", {"w": {"$tensor": "v"}}, {"w": w}, "names the tensor 'v', which the file does not hold"),
        ("twice", {"w": {"$tensor": "w"}, "v": {"$tensor": "w"}}, {"w": w}, "another field names too"),
        ("unnamed", {"w": {"$tensor": "w"}}, {"w": w, "x": w.clone()}, "holds tensors no field names \\('x'\\)"),
        ("marked", {"w": {"$tensor": "w", "$bytes": "00"}}, {"w": w}, "neither a tensor reference nor bytes"),
        ("complex", {"w": {"$tensor": "w"}}, {"w": torch.zeros(2, dtype=torch.complex64)}, "has dtype 'C64'"),
    ):
        save_file(tensors, tmp_path / name, metadata={"torch_bcfw": json.dumps(tree)})
        cases[name] = message
    save_file({"w": w}, tmp_path / "foreign", metadata={"other": "x"})
    cases["foreign"] = "no 'torch_bcfw' entry"
    (tmp_path / "long").write_bytes(struct.pack("<Q", 10**12) + b"{}")
    cases["long"] = "its header declares 1000000000000 bytes"
    (tmp_path / "notjson").write_bytes(struct.pack("<Q", 8) + b"{{{{{{{{")
    cases["notjson"] = "its header is not JSON"
    for name, message in cases.items():
        with pytest.raises(ValueError, match=message) as err:
            FitResult.load(tmp_path / name)
        assert "\n" not in str(err.value) and name in str(err.value), err.value


@pytest.mark.parametrize("body, message", [
    (b"cnumpy\nndarray\n(J\x00\xca\x9a\x3b\x85U\x02u1tR", "calls numpy.ndarray directly"),
    (b"cnumpy.core.multiarray\n_reconstruct\ncnumpy\nndarray\nJ\x00\xca\x9a\x3b\x85U\x01b\x87R", "empty shell"),
    (b"cnumpy\ndtype\nU\x0bV4000000000\x89\x88\x87R", "names the dtype 'V4000000000'"),
])
def test_ocr_pickle_cannot_allocate_what_it_does_not_hold(tmp_path, body, message):
    """A 30-byte pickle asking numpy for a 10^9-element array or a 4 GB dtype is refused before any allocation."""
    (tmp_path / "letters.pickle").write_bytes(b"\x80\x02" + body + b".")
    with pytest.raises(ValueError, match=message):
        load_ocr(tmp_path)


def test_a_header_length_whose_first_byte_looks_like_a_pickle_still_loads(tmp_path):
    """A safetensors header of 128 + 256 k bytes starts the file with 0x80, a pickle's first byte: it still loads
    (and a real pickle is still named as one)."""
    from torch_bcfw.io.tree_file import load_tree

    seen = 0
    for k in range(64):
        path = tmp_path / f"t{k}.safetensors"
        save_tree({"w": torch.arange(3.0), "pad": "x" * k}, path)
        if path.read_bytes()[:1] == b"\x80":
            seen += 1
            assert load_tree(path)["pad"] == "x" * k
    assert seen >= 1
    torch.save({"w": torch.zeros(2)}, tmp_path / "old.pt")
    with pytest.raises(ValueError, match="is a pickle file.*torch-bcfw convert"):
        load_tree(tmp_path / "old.pt")
