"""The one-off numba compilation: measured (CompileTimer), announced, and done before the solve (precompile)."""
import json
import os
import subprocess
import sys
from pathlib import Path

import numba
import pytest

from conftest import random_chain_problem, random_multiclass_problem
from torch_bcfw import fit
from torch_bcfw.compilation import NOTICE, CompileTimer, precompile

ROOT = Path(__file__).resolve().parents[1]


def test_compile_timer_counts_real_compilations_once_and_announces_the_first():
    @numba.njit(cache=False)
    def inner(x):
        return x + 1

    @numba.njit(cache=False)
    def outer(x):
        return inner(x) * 2

    said = []
    with CompileTimer(announce=said.append) as timer:
        assert outer(1) == 4
    assert said == [NOTICE]
    assert timer.compiled and "test_compile_timer_counts_real_compilations_once_and_announces_the_first.<locals>.outer" \
        in timer.functions
    assert timer.seconds > 0
    with CompileTimer(announce=said.append) as again:
        assert outer(2) == 6  # compiled already: nothing to do
    assert not again.compiled and again.seconds == 0 and said == [NOTICE]
    outer(3.5)  # outside any timer: not recorded anywhere
    assert not again.compiled


def test_precompile_leaves_the_fit_unchanged():
    model, data = random_chain_problem(n=8, seed=3)
    before = fit(model, data, 0.1, max_passes=4, gap_check=2)
    timer = precompile(model, data, 0.1, test_data=data, max_passes=4, gap_check=2, gap_tol=0.5, progress=True)
    assert isinstance(timer, CompileTimer) and timer.seconds >= 0
    after = fit(model, data, 0.1, max_passes=4, gap_check=2)
    assert (after.w == before.w).all() and after.history[-1].gap == before.history[-1].gap
    mc, mdata = random_multiclass_problem()
    precompile(mc, mdata, 0.1, "fw", max_passes=3)
    precompile(mc, mdata, 0.1, "ssg")
    # a warm-up error is left to the real fit to report
    assert isinstance(precompile(model, data, -1.0), CompileTimer)


_COLD = """
import json, sys
sys.path.insert(0, {tests!r})
from conftest import random_chain_problem
from torch_bcfw import fit
from torch_bcfw.compilation import CompileTimer, precompile
model, data = random_chain_problem(n=30, max_len=6, seed=0)
said = []
pre = precompile(model, data, 0.1, test_data=data, announce=said.append, max_passes=4, gap_check=2)
with CompileTimer() as during:
    res = fit(model, data, 0.1, test_data=data, max_passes=4, gap_check=2)
print(json.dumps({{"pre": pre.seconds, "pre_functions": len(pre.functions), "said": said,
                  "during": during.functions, "solver_time": res.history[-1].solver_time}}))
"""


@pytest.mark.slow
def test_on_a_cold_numba_cache_precompile_compiles_every_kernel_the_fit_uses(tmp_path):
    """A fresh machine: an empty NUMBA_CACHE_DIR.  The warm-up compiles, announces it once, and the fit after it
    compiles nothing (its solver time is the solve alone).  Slow: it compiles every chain kernel (7-15 s)."""
    code = _COLD.format(tests=str(ROOT / "tests"))
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "numba"), "OMP_WAIT_POLICY": "PASSIVE"}
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, env=env, timeout=600)
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout.strip().splitlines()[-1])
    assert out["pre_functions"] > 5 and out["pre"] > 0.5, out
    assert out["said"] == ["torch-bcfw: compiling numba kernels (first run only: cached on disk afterwards)..."]
    assert out["during"] == [], out
    assert out["solver_time"] < out["pre"], out
