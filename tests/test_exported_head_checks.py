"""The exported head's loader (head.py, a copy of torch_bcfw/io/standalone_head.py) checks its file: a safetensors
file whose metadata names the format and kind, holding exactly the tensors of that kind (unknown ones refused), of
consistent shapes, one floating dtype and finite values; each failure one line naming the file and the entry."""
from __future__ import annotations

import importlib.util

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from conftest import random_chain_problem, random_multiclass_problem
from torch_bcfw import fit
from torch_bcfw.export import export_head


def _exported(tmp_path, model, data):
    folder = export_head(fit(model, data, 0.1, max_passes=2), tmp_path / "head").parent
    spec = importlib.util.spec_from_file_location("exported_head", folder / "head.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # the deployed copy, not the package's module
    with safe_open(str(folder / "head.safetensors"), framework="pt") as f:
        d = {"metadata": f.metadata(), "tensors": {k: f.get_tensor(k) for k in f.keys()}}
    return module, d


def _save_tampered(d, change, path):
    d = {"metadata": dict(d["metadata"]), "tensors": dict(d["tensors"])}
    change(d)
    save_file({k: v for k, v in d["tensors"].items() if v is not None}, path, metadata=d["metadata"])


@pytest.mark.parametrize("change, message", [
    (lambda d: d["tensors"].update(start=d["tensors"]["start"][:1]),
     r"'start' has shape \(1,\), but the head's K is 3"),
    (lambda d: d["tensors"]["bias"].__setitem__(0, float("nan")), "'bias' holds NaN or infinite values"),
    (lambda d: d["tensors"].update(transitions=torch.zeros(3, 4, dtype=torch.float64)),
     r"'transitions' has shape \(3, 4\), but the head's K is 3"),
    (lambda d: d["metadata"].update(kind="multiclass"), r"a multiclass head holds the tensors \['bias', 'weights'\]"),
    (lambda d: d["metadata"].update(kind="['chain']"), "unknown head kind"),
    (lambda d: d["metadata"].update(format="torch_bcfw.head/1"), "not a head file of format"),
    (lambda d: d["tensors"].update(extra=torch.zeros(10)), r"also \['extra'\]"),
    (lambda d: d["tensors"].pop("end"), "head tensor 'end' is missing"),
    (lambda d: d["tensors"].update(end=d["tensors"]["end"].to(torch.int64)), "'end' has dtype torch.int64"),
    (lambda d: d["tensors"].update(emission=d["tensors"]["emission"][None]), "'emission' has shape .* expected 2"),
])
def test_a_tampered_chain_head_is_refused_in_one_line(tmp_path, change, message):
    head, d = _exported(tmp_path, *random_chain_problem(n=4, F=2, K=3, seed=1))
    _save_tampered(d, change, tmp_path / "bad.safetensors")
    with pytest.raises(ValueError, match=message) as err:
        head.load_head(tmp_path / "bad.safetensors")
    assert "\n" not in str(err.value) and "bad.safetensors" in str(err.value)
    head.load_head(tmp_path / "head" / "head.safetensors")  # the genuine file still loads


def test_a_pickle_or_junk_is_refused_in_one_line(tmp_path):
    head, d = _exported(tmp_path, *random_chain_problem(n=4, F=2, K=3, seed=1))
    torch.save({"format": "torch_bcfw.head/1", "kind": "chain", "tensors": d["tensors"]}, tmp_path / "head.pt")
    (tmp_path / "junk").write_bytes(b"\xff" * 64)
    for name in ("head.pt", "junk"):
        with pytest.raises(ValueError, match="not a readable head file") as err:
            head.load_head(tmp_path / name)
        assert "\n" not in str(err.value) and name in str(err.value)


def test_a_tampered_multiclass_head_is_refused_and_a_bias_free_one_loads(tmp_path):
    head, d = _exported(tmp_path, *random_multiclass_problem(n=6, F=3, K=4, seed=1))
    _save_tampered(d, lambda d: d["tensors"].update(bias=d["tensors"]["bias"][:2].clone()), tmp_path / "bad.st")
    with pytest.raises(ValueError, match=r"'bias' has shape \(2,\), but the head's K is 4"):
        head.load_head(tmp_path / "bad.st")
    _save_tampered(d, lambda d: d["tensors"].update(bias=None), tmp_path / "nobias.st")
    assert head.load_head(tmp_path / "nobias.st").bias is None
