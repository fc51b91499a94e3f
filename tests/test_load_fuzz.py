"""Mutated saved states never crash and never lie: random truncation, extension, dtype change, NaN, infinity,
scaling and sign flips of every array and number of the saved solver state of every state kind (chain, chain with the
working set and gap estimates, mini-batch, MP-BCFW planes, dense, active set, graph cut).  Each mutated file is
loaded and resumed in a separate process (tests/load_fuzz_worker.py): the outcome must be a clear error or a run
whose certificate holds against enumeration.  "Lift within bounds" mutations raise the saved losses ``l_i`` or the
averaged ``l`` of every state kind towards their documented bounds: the certified gap must stay at least the true
suboptimality.  ``TORCH_BCFW_HYPOTHESIS_PROFILE=thorough python -m pytest -m heavy tests/test_load_fuzz.py`` runs 600
mutations and 512 lifts."""
from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import load_fuzz_worker as worker
from torch_bcfw.io.tree_file import save_tree

WORKER = Path(worker.__file__)
THOROUGH = os.environ.get("TORCH_BCFW_HYPOTHESIS_PROFILE") == "thorough"

pytestmark = pytest.mark.heavy  # a subprocess per batch of files: the tier .ci/run runs after the README's command


def _leaves(obj, path=()):
    """Every tensor and number inside a saved dict, with its path of keys."""
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _leaves(v, path + (k,))
    elif isinstance(obj, (list, tuple)):
        for k, v in enumerate(obj):
            yield from _leaves(v, path + (k,))
    elif isinstance(obj, torch.Tensor) or (isinstance(obj, (int, float)) and not isinstance(obj, bool)):
        yield path, obj


def _mutate(value, how: str, rng: random.Random):
    if isinstance(value, torch.Tensor):
        t = value.clone()
        if how == "truncate":
            return t[: max(0, t.shape[0] - 1)] if t.ndim else t.reshape(1)
        if how == "extend":
            return torch.cat([t, t[:1]]) if t.ndim and t.shape[0] else t.reshape(-1).repeat(2)
        if how == "dtype":
            return t.to(torch.int64) if t.is_floating_point() else t.to(torch.float64) + 0.5
        if how == "scale":
            return t * 1000 if t.dtype != torch.bool else ~t
        if how == "negate":
            return -t if t.dtype != torch.bool else ~t
        if how in ("nan", "inf", "big") and t.numel():
            flat = t.reshape(-1)
            j = rng.randrange(flat.numel())
            if t.is_floating_point():
                flat[j] = float("nan") if how == "nan" else float("inf") if how == "inf" else 1e300
            elif t.dtype != torch.bool:
                info = torch.iinfo(t.dtype)
                flat[j] = info.max if how != "nan" else info.min
            return flat.reshape(t.shape)
        return t.reshape(-1)[:0]
    if how in ("nan", "inf"):
        return float(how)
    if isinstance(value, int):
        return {"truncate": -1, "extend": 10**12, "dtype": value + 0.5, "scale": value * 1000, "negate": -value,
                "big": 10**18}[how]
    return {"truncate": -1.0, "extend": 1e300, "dtype": int(value) if abs(value) < 1e18 else 0, "scale": value * 1000,
            "negate": -value, "big": 1e300}[how]


MUTATIONS = ("truncate", "extend", "dtype", "nan", "inf", "scale", "negate", "big")


def _mutated_files(tmp_path: Path, count: int, seed: int = 0) -> list[Path]:
    rng = random.Random(seed)
    bases = {kind: worker.saved_run(kind) for kind in worker.KINDS}
    leaves = {kind: list(_leaves(d["solver_state"], ("solver_state",))) for kind, d in bases.items()}
    files = []
    for j in range(count):
        kind = list(worker.KINDS)[j % len(worker.KINDS)]
        path, value = rng.choice(leaves[kind])
        how = rng.choice(MUTATIONS)
        d = _copy(bases[kind])
        node = d
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = _mutate(value, how, rng)
        name = f"{kind}__{j:04d}_{how}_{'.'.join(map(str, path[1:]))}.safetensors"
        save_tree(d, tmp_path / name)
        files.append(tmp_path / name)
    return files


def _lifted_files(tmp_path: Path, count: int, seed: int = 0) -> list[Path]:
    rng = random.Random(seed)
    bases = {kind: worker.saved_run(kind) for kind in worker.KINDS}
    files = []
    for j in range(count):
        kind = list(worker.KINDS)[j % len(worker.KINDS)]
        how = rng.choice(("lift", "lift-avg"))
        d = _copy(bases[kind])
        worker.lift(d, kind, how, rng)
        save_tree(d, tmp_path / f"{kind}__{j:04d}_{how}.safetensors")
        files.append(tmp_path / f"{kind}__{j:04d}_{how}.safetensors")
    return files


def _copy(obj):
    if isinstance(obj, dict):
        return {k: _copy(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):  # a tuple as a list, so that a leaf inside can be replaced
        return [_copy(v) for v in obj]
    return obj.clone() if isinstance(obj, torch.Tensor) else obj


def _run_worker(tmp_path: Path, files: list[Path]) -> dict:
    out = tmp_path / "results.json"
    proc = subprocess.run([sys.executable, str(WORKER), str(out), *map(str, files)], capture_output=True, text=True,
                          timeout=3000)
    last = proc.stdout.strip().splitlines()[-1:] or ["(none)"]
    assert proc.returncode == 0, f"the worker died (code {proc.returncode}) on {last[0]}:\n{proc.stderr[-3000:]}"
    return json.loads(out.read_text())


def test_the_unmutated_states_resume_with_a_certificate(tmp_path):
    files = []
    for kind in worker.KINDS:
        save_tree(worker.saved_run(kind), tmp_path / f"{kind}__clean.safetensors")
        files.append(tmp_path / f"{kind}__clean.safetensors")
    assert set(_run_worker(tmp_path, files).values()) == {"ok"}


@pytest.mark.parametrize("seed", [0] if not THOROUGH else [0, 1, 2])
def test_mutated_states_give_a_clear_error_or_a_true_certificate(tmp_path, seed):
    files = _mutated_files(tmp_path, 200 if THOROUGH else 42, seed)
    results = _run_worker(tmp_path, files)
    bad = {f: r for f, r in results.items() if not (r == "ok" or r.startswith("error: "))}
    assert bad == {}
    assert sum(r.startswith("error: ") for r in results.values()) >= len(results) // 2  # most mutations are caught


def test_states_lifted_within_their_bounds_never_lie(tmp_path):
    """Every state kind, its losses or its averaged loss lifted within their bounds: refused, or resumed with a
    certified gap at least the true suboptimality (0 lies; 512 cases in the thorough profile)."""
    files = _lifted_files(tmp_path, 512 if THOROUGH else 32, seed=7)
    results = _run_worker(tmp_path, files)
    bad = {f: r for f, r in results.items() if not (r == "ok" or r.startswith("error: "))}
    assert bad == {}
    assert len(results) >= (512 if THOROUGH else 32)
