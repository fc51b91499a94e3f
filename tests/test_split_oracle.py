"""``strategy="split-oracle"`` in one process: the rounds of ``batch_size`` blocks decoded at one ``w``, then one-block
steps in order (``BCFW._advance_split_oracle``).  The two-process runs are in ``test_distributed_fit.py``."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from conftest import random_chain_problem, random_multiclass_problem
from torch_bcfw import fit
from torch_bcfw.duals.stepsize import LINE_SEARCH
from torch_bcfw.certificate import certify
from torch_bcfw.solvers.bcfw_options import variant_name

LAM = 0.1


def _reference(model, data, lam: float, r: int, passes: int, seed: int) -> torch.Tensor:
    """The split-oracle iteration written out on the dual state's one-block primitives: per pass, rounds of ``r``
    blocks cut at the multiples of ``r``; each round decoded (``block_oracle``) before the previous round's steps
    (``block_step``, in the drawn order); the pass ends with its last round's steps."""
    from torch_bcfw.solvers.run import make_algorithm, options_for
    from torch_bcfw.solvers.sampling import make_sampler

    alg = make_algorithm("bcfw", model, data, lam, options_for("bcfw", progress=False, preset="uniform-fw", seed=seed, batch_size=1))
    st, n = alg.state, len(data)
    sampler = make_sampler("uniform", n, seed)
    for _ in range(passes):
        pos, pending = 0, []
        while pos < n:
            blocks = sampler.draw(min(r - pos % r, n - pos))
            answers = [st.block_oracle(i) for i in blocks.tolist()]
            for i, y in pending:
                st.block_step(i, y, alg.step_code)
            pending = list(zip(blocks.tolist(), answers))
            pos += len(blocks)
        for i, y in pending:
            st.block_step(i, y, alg.step_code)
    return st.w


@pytest.mark.parametrize("r", [1, 3, 4])
def test_split_rounds_follow_the_written_out_iteration_bit_for_bit(r):
    """``fit(strategy="split-oracle", batch_size=r)`` in one process is the iteration written out in
    :func:`_reference` (the multiclass state's generic steps), bit for bit (no gap check inside the run: a check
    re-sums ``w`` from the blocks)."""
    model, data = random_multiclass_problem(n=14, F=4, K=4, seed=2)
    res = fit(model, data, LAM, max_passes=5, gap_check=10, seed=4, strategy="split-oracle", batch_size=r)
    assert res.options.strategy == "split-oracle" and variant_name(res.options) == "uniform-fw"
    assert torch.equal(res.w, _reference(model, data, LAM, r, 5, seed=4))


def test_the_compiled_chain_steps_towards_given_corners_equal_the_generic_steps():
    """The chain's ``corner_steps`` (one call of the compiled loop with the given answers) against the generic
    one-block steps of the same state run in torch (``block_step``), on answers decoded at an earlier ``w``."""
    from torch_bcfw.solvers.run import make_algorithm, options_for

    model, data = random_chain_problem(n=12, F=3, K=3, max_len=5, seed=4)
    states = [make_algorithm("bcfw", model, data, LAM, options_for("bcfw", progress=False, preset="uniform-fw", batch_size=1)).state
              for _ in range(2)]
    rng = np.random.default_rng(0)
    for _ in range(6):
        blocks = rng.integers(0, len(data), 5)
        ys = [states[0].block_oracle(i) for i in blocks.tolist()]
        states[0].corner_steps(blocks, ys, LINE_SEARCH)
        for i, y in zip(blocks.tolist(), ys):
            states[1].block_step(i, y, LINE_SEARCH)
    torch.testing.assert_close(states[0].w, states[1].w, rtol=1e-12, atol=1e-13)
    torch.testing.assert_close(states[0].block_ell, states[1].block_ell, rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("name", ["chain", "multiclass"])
def test_stale_corners_keep_the_dual_feasible_and_ascending(name):
    """Rounds of 4: the later blocks of a round step towards corners decoded before the round's earlier steps.  The
    dual never decreases from check to check, the certified gap is the independently computed primal minus the dual,
    and the run converges within 3x plain BCFW's gap after the same passes, though a round (and the one decoded
    before its steps) is a third of the 12-15 examples here (the compiled chain and the generic torch steps of the
    multiclass state)."""
    model, data = (random_chain_problem(n=12, F=3, K=3, max_len=5, seed=4) if name == "chain"
                   else random_multiclass_problem(n=15, F=4, K=4, seed=2))
    res = fit(model, data, LAM, max_passes=60, gap_check=3, seed=2, strategy="split-oracle", batch_size=4,
              check_averaged=False)
    duals = [h.dual for h in res.history]
    assert all(b >= a - 1e-12 for a, b in zip(duals, duals[1:]))
    last = res.history[-1]
    primal = certify(model, data, res.w, None, LAM).primal
    assert last.primal == pytest.approx(primal, rel=1e-12, abs=1e-14)
    assert last.gap_last == pytest.approx(primal - last.dual, rel=1e-9, abs=1e-12)
    plain = fit(model, data, LAM, max_passes=60, gap_check=3, seed=2, preset="uniform-fw", check_averaged=False)
    assert last.gap_last < 0.15 * res.history[0].gap_last and last.gap_last < 3 * plain.history[-1].gap_last


def test_split_rounds_refuse_refinements_and_other_solvers():
    model, data = random_chain_problem(n=8, seed=1)
    with pytest.raises(ValueError, match="plain BCFW rounds"):
        fit(model, data, LAM, max_passes=1, strategy="split-oracle", batch_size=2, preset="gap-pairwise")


def test_the_chains_compiled_oracle_answers_as_the_model_decodes():
    """``ChainDualState.block_oracle`` on the CPU runs the compiled decoding of the step kernels: the same labelings
    as the model's torch oracle at random weights."""
    from torch_bcfw.solvers.options import SolverOptions
    from torch_bcfw.solvers.run import make_algorithm

    model, data = random_chain_problem(n=20, F=4, K=5, max_len=6, seed=7)
    st = make_algorithm("bcfw", model, data, LAM, SolverOptions(progress=False, batch_size=1)).state
    g = torch.Generator().manual_seed(3)
    st.v.copy_(torch.randn(st.v.shape, generator=g, dtype=torch.float64))
    st._sync_w()
    for i in range(len(data)):
        expected = model.oracle(st.w, st.block_data(i), loss_augmented=True)
        assert np.array_equal(st.block_oracle(i).numpy(), expected.numpy()), i
