"""Identical seeds give identical runs, and a warm start continues a run exactly.

* MP-BCFW's automatic number of approximate passes reads a deterministic cost model by default
  (``mp_clock="work"``): two runs are equal bit for bit whatever the clock says; ``mp_clock="wall"`` still
  follows the clock.
* ``fit(a + b passes)`` equals ``fit(a)`` then ``fit(b, init=...)`` for BCFW with gap sampling (plain FW steps
  and the full ``gap-pairwise-cache`` preset) at any split, not only on a gap-check boundary.
"""
import itertools
import time

import numpy as np
import pytest
import torch

from conftest import random_chain_problem, random_multiclass_problem
from torch_bcfw import FitResult, fit
from torch_bcfw.models import Multiclass

pytestmark = pytest.mark.usefixtures("one_torch_thread")

#: history columns that measure time (or count the extra final check of a split run): not compared
TIMING = {"solver_time", "gap_time", "gap_oracle_calls", "exact_time", "approx_time"}


def _records(history):
    return [{k: v for k, v in rec.to_dict().items() if k not in TIMING} for rec in history]


# ---------------------------------------------------------------------- MP-BCFW: the automatic rule's clock
def _with_clock(clock, fn):
    """Run ``fn()`` while ``time.perf_counter`` (what the solvers time themselves with) is ``clock``."""
    real = time.perf_counter
    time.perf_counter = clock
    try:
        return fn()
    finally:
        time.perf_counter = real


def _ticking():
    c = itertools.count()
    return lambda: float(next(c))


def _noisy(seed):
    rng, t = np.random.default_rng(seed), [0.0]

    def clock():
        t[0] += rng.exponential(1.0)
        return t[0]

    return clock


def _mp_run(model, data, **kw):
    return fit(model, data, 0.02, "mp-bcfw", max_passes=6, gap_check=2, **kw)


def test_mp_bcfw_identical_seeds_give_identical_runs():
    model, data = random_chain_problem(n=10, F=4, K=3, max_len=5, seed=5)
    runs = [_mp_run(model, data), _mp_run(model, data),
            _with_clock(_ticking(), lambda: _mp_run(model, data)),
            _with_clock(_noisy(0), lambda: _mp_run(model, data)),
            _with_clock(_noisy(1), lambda: _mp_run(model, data, mp_clock="work"))]
    ref = runs[0]
    assert ref.options.own.clock == "auto" and ref.history[-1].approx_passes > 3  # the rule is at work
    for r in runs[1:]:
        assert torch.equal(r.w, ref.w) and torch.equal(r.w_avg, ref.w_avg)
        assert _records(r.history) == _records(ref.history)
        assert [h.primal for h in r.history] == [h.primal for h in ref.history]
        assert [h.dual for h in r.history] == [h.dual for h in ref.history]


def test_mp_bcfw_wall_clock_rule_still_reads_the_clock():
    model, data = random_chain_problem(n=10, F=4, K=3, max_len=5, seed=5)
    a = _with_clock(_ticking(), lambda: _mp_run(model, data, mp_clock="wall"))
    b = _with_clock(_noisy(0), lambda: _mp_run(model, data, mp_clock="wall"))
    c = _with_clock(_noisy(1), lambda: _mp_run(model, data, mp_clock="wall"))
    passes = [[h.approx_passes for h in r.history] for r in (a, b, c)]
    assert len({tuple(p) for p in passes}) > 1, passes  # the number of approximate passes follows the clock
    for r in (a, b, c):  # and every run is still a valid MP-BCFW run
        duals = [h.dual for h in r.history]
        assert all(h.gap_last >= -1e-12 for h in r.history) and duals == sorted(duals)  # line search: dual ascent
        assert r.options.own.clock == "wall"


class _SlowOracle(Multiclass):
    """A costly exact oracle: 3 ms per block oracle call."""

    def oracle(self, w, data, loss_augmented=True):
        if loss_augmented and len(data) == 1:
            time.sleep(0.003)
        return super().oracle(w, data, loss_augmented)


def test_mp_bcfw_wall_clock_buys_approximate_passes_for_a_costly_oracle_and_work_does_not_look():
    base, data = random_multiclass_problem(n=10, F=3, K=4, seed=5)
    slow, fast = _SlowOracle(base.n_inputs, base.n_labels), Multiclass(base.n_inputs, base.n_labels)
    kw = dict(max_passes=4, gap_check=2, mp_max_approx_passes=30)
    wall = [fit(m, data, 0.01, "mp-bcfw", mp_clock="wall", **kw).history[-1].approx_passes for m in (slow, fast)]
    assert wall[0] > wall[1]  # the real (wall) rule: a costly oracle makes approximate passes worth more
    work = [fit(m, data, 0.01, "mp-bcfw", **kw) for m in (slow, fast)]
    assert torch.equal(work[0].w, work[1].w) and _records(work[0].history) == _records(work[1].history)


def test_mp_bcfw_checkpoint_of_the_work_clock_resumes_exactly():
    model, data = random_chain_problem(n=10, F=4, K=3, max_len=5, seed=5)
    full = _mp_run(model, data)
    first = fit(model, data, 0.02, "mp-bcfw", max_passes=2.5, gap_check=2)
    second = fit(model, data, 0.02, "mp-bcfw", max_passes=3.5, gap_check=2, init=first)
    assert torch.equal(full.w, second.w) and torch.equal(full.w_avg, second.w_avg)


# ---------------------------------------------------------------------- BCFW with gap sampling: exact resume
CONFIGS = {
    "gap-fw": dict(sampling="gap"),
    "gap-pairwise-cache": dict(preset="gap-pairwise-cache", cache_size=3),
    "uniform-fw": dict(sampling="uniform"),
}
SPLITS = [1, 3, 7, 10, 13, 2.5, 7.25, 19.5]


def _split_run(model, data, kw, split, total=20, save_to=None):
    first = fit(model, data, 0.05, max_passes=split, **kw)
    if save_to is not None:
        first.save(save_to)
        first = FitResult.load(save_to)
    return first, fit(model, data, 0.05, max_passes=total - split, init=first, **kw)


def _assert_same_run(full, first, second):
    assert torch.equal(full.w, second.w)
    assert torch.equal(full.w_avg, second.w_avg)
    checked = {rec.steps for rec in full.history}
    extra = [rec for rec in second.history if rec.steps not in checked]
    # the only extra record is the final check of the first run, at the split
    assert extra == ([first.history[-1]] if first.history[-1].steps not in checked else [])
    kept = [rec for rec in second.history if rec.steps in checked]
    assert _records(kept) == _records(full.history)
    for key in ("primal", "dual", "gap_last", "primal_avg", "dual_avg", "gap_avg"):
        assert [getattr(rec, key) for rec in kept] == [getattr(rec, key) for rec in full.history]


@pytest.mark.parametrize("split", SPLITS)
@pytest.mark.parametrize("config", list(CONFIGS))
def test_bcfw_resume_is_exact_at_any_split(config, split):
    kw = dict(CONFIGS[config], gap_check=5, seed=3)
    model, data = random_chain_problem(n=12, F=5, K=3, max_len=5, seed=3)
    full = fit(model, data, 0.05, max_passes=20, **kw)
    assert full.stopped_by == "max_passes" and len(full.history) == 4
    if config == "gap-pairwise-cache":
        assert full.history[-1].cache_hits > 0
    first, second = _split_run(model, data, kw, split)
    _assert_same_run(full, first, second)


@pytest.mark.parametrize("config", ["gap-fw", "gap-pairwise-cache"])
def test_bcfw_resume_through_a_saved_file_with_early_checks(config, tmp_path):
    """A generic (non-chain) model, the early gap checks of ``early_gap_check`` and a reload from disk."""
    kw = dict(CONFIGS[config], gap_check=4, seed=1, gap_tol=1e-12, early_gap_check=0.8)
    model, data = random_multiclass_problem(n=12, F=4, K=4, seed=1)
    full = fit(model, data, 0.05, max_passes=20, **kw)
    for split in (3, 6.5):
        first, second = _split_run(model, data, kw, split, save_to=tmp_path / f"r{split}.pt")
        _assert_same_run(full, first, second)


def test_gap_sampling_random_stream_does_not_depend_on_where_chunks_end():
    """A chunk that stops early (every estimate zero: an exact gap pass is due) gives back the uniforms it did not
    use, so the stream of draws is the same however the run is cut into chunks (a split inside such a chunk)."""
    from torch_bcfw.solvers.sampling import GapSampler

    whole = GapSampler(10, seed=7).uniforms(25)
    cut = GapSampler(10, seed=7)
    first = cut.uniforms(10)
    cut.consumed(4, 10)  # the chunk stopped after 4 steps
    rest = cut.uniforms(21)
    assert np.array_equal(np.concatenate([first[:4], rest]), whole)
    cut.consumed(21, 21)  # a chunk that used all its uniforms changes nothing
    assert np.array_equal(cut.uniforms(3), GapSampler(10, seed=7).uniforms(28)[25:])


def test_resume_of_a_run_that_asks_for_its_own_gap_pass():
    """App. C toy: the first visits, then a gap pass requested by the step loop (every estimate zero) and the
    convergence; a warm start from any point before it reaches the same optimum at the same step."""
    from conftest import app_c_toy

    model, data, lam = app_c_toy(6, 3)
    kw = dict(preset="gap-fw", gap_check=10, averaging=False, seed=4)
    full = fit(model, data, lam, max_passes=30, **kw)
    assert full.stopped_by == "converged"
    for split in (0.5, 1, 1.5):
        first = fit(model, data, lam, max_passes=split, **kw)
        second = fit(model, data, lam, max_passes=30 - split, init=first, **kw)
        assert torch.equal(full.w, second.w)
        assert second.history[-1].steps == full.history[-1].steps
        assert second.history[-1].gap_last == full.history[-1].gap_last
