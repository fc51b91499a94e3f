"""numba's disk cache never runs stale kernels of this package: an edit of a module whose kernel another module's
cached kernel compiles in takes effect in the next process (torch_bcfw/runtime/kernel_cache.py)."""
from __future__ import annotations

import json
import os
import pickle
import shutil
import subprocess
import sys
from pathlib import Path

import numba
import pytest

import torch_bcfw
from torch_bcfw.runtime.kernel_cache import PackageKernelLocator

PACKAGE = Path(torch_bcfw.__file__).resolve().parent

# A kernel of duals/chain_kernels.py that compiles in the Viterbi decoder of inference/viterbi.py: a tie of every
# label decodes to label 0 (the first maximum).
SCRIPT = """
import json, numpy as np
from torch_bcfw.duals.chain_kernels import loss_augmented_decode
L, K = 3, 4
U = np.zeros((L, K)); y = np.zeros(L, dtype=np.int64); ystar = np.full(L, -1, dtype=np.int64)
loss_augmented_decode(U, np.empty((L, K)), L, 0, y, 0.0, np.zeros((K, K)), ystar, np.empty((L, K)))
s = loss_augmented_decode.stats
print(json.dumps({"labels": ystar.tolist(), "hits": sum(s.cache_hits.values()), "misses": sum(s.cache_misses.values()),
                  "file": __import__("torch_bcfw").__file__}))
"""


def _run(root: Path) -> dict:
    env = dict(os.environ, PYTHONPATH=str(root), NUMBA_CACHE_DIR="")
    env.pop("NUMBA_DISABLE_JIT", None)
    out = subprocess.run([sys.executable, "-c", SCRIPT], env=env, cwd=root, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.heavy
def test_an_edited_inlined_kernel_is_recompiled(tmp_path):
    root = tmp_path / "copy"
    shutil.copytree(PACKAGE, root / "torch_bcfw", ignore=shutil.ignore_patterns("__pycache__"))
    first = _run(root)
    assert first["file"] == str(root / "torch_bcfw" / "__init__.py")
    assert first["labels"] == [0, 0, 0] and first["misses"] >= 1
    again = _run(root)
    assert again["labels"] == [0, 0, 0] and again["hits"] >= 1 and again["misses"] == 0  # loaded from the cache
    # the first version's indexes now name a type that no longer exists (as after a rename): numba unpickles an
    # index before it compares stamps, so another version must never read them
    for index in (root / "torch_bcfw").rglob("*.nbi"):
        index.write_bytes(pickle.dumps(numba.__version__) + b"cbuiltins\nNoSuchType\n.")
    # edit the decoder that the cached kernel of another module compiled in: ties now go to the last label
    viterbi = root / "torch_bcfw" / "inference" / "viterbi.py"
    text = viterbi.read_text(encoding="utf-8")
    assert "        if v[c] > v[arg]:" in text
    viterbi.write_text(text.replace("        if v[c] > v[arg]:", "        if v[c] >= v[arg]:"), encoding="utf-8")
    edited = _run(root)
    assert edited["labels"] == [0, 0, 3] and edited["misses"] >= 1  # the new code (the last label), compiled anew


def test_the_guard_covers_the_package_only(tmp_path):
    from torch_bcfw.duals.chain_kernels import fw_move

    assert isinstance(fw_move._cache._impl.locator, PackageKernelLocator)
    outside = tmp_path / "mod.py"
    outside.write_text("def f():\n    return 1\n")
    assert PackageKernelLocator.from_function(lambda: 1, str(outside)) is None
