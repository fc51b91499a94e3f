"""The returned weights and their certificate always come from the same check, even when a second
Ctrl-C cuts the final gap pass."""
from __future__ import annotations

import os
import signal

import pytest
import torch

from conftest import brute_force_primal, random_multiclass_problem
from torch_bcfw import fit
from torch_bcfw.duals import DenseDualState
from torch_bcfw.models import Multiclass
from torch_bcfw.solvers.callbacks import Callback

LAM = 0.05


class SecondInterruptModel(Multiclass):
    """Raises ``KeyboardInterrupt`` in the next exact gap pass once armed (a second Ctrl-C during it)."""

    armed = False

    def hinge_terms(self, w, data):
        if self.armed:
            self.armed = False
            raise KeyboardInterrupt
        return super().hinge_terms(w, data)


class CtrlC(Callback):
    def __init__(self, model, at_chunk, second):
        self.model, self.at_chunk, self.second, self.chunks = model, at_chunk, second, 0

    def on_chunk(self, passes, seconds):
        self.chunks += 1
        if self.chunks == self.at_chunk:
            self.model.armed = self.second
            raise KeyboardInterrupt


@pytest.mark.parametrize("at_chunk", [3, 5, 6])
@pytest.mark.parametrize("second", [False, True])
def test_weights_and_certificate_come_from_the_same_check(at_chunk, second):
    _, data = random_multiclass_problem(n=9, F=3, K=4, seed=5)
    model = SecondInterruptModel(3, 4)
    r = fit(model, data, LAM, max_passes=50, gap_check=2, callbacks=[CtrlC(model, at_chunk, second)])
    assert r.stopped_by == "interrupted"
    last = r.history[-1]
    assert r.primal == pytest.approx(brute_force_primal(model, data, r.weights, LAM), abs=1e-12)
    assert last.primal == pytest.approx(brute_force_primal(model, data, r.w, LAM), abs=1e-12)
    assert last.primal_avg == pytest.approx(brute_force_primal(model, data, r.w_avg, LAM), abs=1e-12)
    # the certified passes: the interrupt's own check, or the last scheduled one (every 2 passes, before the
    # interrupted chunk) when the second Ctrl-C cut it
    expected = at_chunk if not second else 2 * ((at_chunk - 1) // 2)
    assert last.passes == expected
    if second:
        state_w = r.solver_state["state"]["w"]
        assert not torch.equal(state_w, r.w)  # the state moved on; the returned weights did not


class MidStepInterruptState(DenseDualState):
    """Sends SIGINT to this process in the middle of a block move (after the block's storage moved, before
    the caller updates ``w`` and ``l``): an interrupt raised there would leave ``w != A alpha``."""

    fire_at = 7
    moves = 0

    def _move_block(self, i, y, gamma, v):
        super()._move_block(i, y, gamma, v)
        type(self).moves += 1
        if type(self).moves == self.fire_at:
            os.kill(os.getpid(), signal.SIGINT)
            for _ in range(1000):  # Python runs the handler at the next bytecodes, still inside the move
                pass


class MidStepModel(Multiclass):
    def dual_state(self, data, lam):
        return MidStepInterruptState(self, data, lam)


def test_ctrl_c_inside_a_step_is_held_until_the_step_is_done():
    _, data = random_multiclass_problem(n=9, F=3, K=4, seed=6)
    model = MidStepModel(3, 4)
    MidStepInterruptState.moves = 0
    r = fit(model, data, LAM, max_passes=50, gap_check=2)
    assert r.stopped_by == "interrupted" and r.passes == 1.0  # stopped at the end of the chunk
    st = model.dual_state(data, LAM)
    st.load_state_dict(r.solver_state["state"])
    assert torch.allclose(st.w_blocks.sum(0), st.w, atol=1e-14)  # w = A alpha
    ref = fit(Multiclass(3, 4), data, LAM, max_passes=2000, gap_check=100, gap_tol=1e-11)
    p_star_bound = brute_force_primal(model, data, ref.weights, LAM)
    assert r.history[-1].dual <= p_star_bound + 1e-12
    assert r.gap >= 0


@pytest.mark.parametrize("at_chunk", [1, 5])
def test_a_resumed_run_first_checks_the_state_whose_check_was_cut(at_chunk):
    """After a second Ctrl-C cut the final check (at chunk 1: before any check, so without a certificate), a warm
    start checks the saved state first: its history and weights are those of a run whose final check finished."""
    _, data = random_multiclass_problem(n=9, F=3, K=4, seed=5)
    runs = {}
    for second in (False, True):
        model = SecondInterruptModel(3, 4)
        cut = fit(model, data, LAM, max_passes=50, gap_check=2, callbacks=[CtrlC(model, at_chunk, second)])
        assert cut.check_was_cut == second and (cut.gap is None) == (second and at_chunk == 1)
        runs[second] = fit(model, data, LAM, max_passes=4, gap_check=2, init=cut)
    untimed = [[{k: v for k, v in h.to_dict().items() if k not in ("solver_time", "gap_time")} for h in r.history]
               for r in (runs[False], runs[True])]
    assert untimed[0] == untimed[1] and untimed[1][-1]["passes"] == at_chunk + 4
    assert torch.equal(runs[False].w, runs[True].w) and not runs[True].check_was_cut


def test_the_squared_norm_of_the_certificate_does_not_depend_on_memory_alignment():
    """A resumed run's weights are read from a file into memory of another alignment: the certificate's ||w||^2
    must have the same bits (the BLAS dot's SIMD path depends on the alignment)."""
    from torch_bcfw.certificate import squared_norm

    g = torch.Generator().manual_seed(0)
    for d in (7, 4082, 40_000):
        v = torch.randn(d, dtype=torch.float64, generator=g)
        for offset in range(8):  # the same values at 8-byte steps of address
            buf = torch.zeros(d + 8, dtype=torch.float64)
            buf[offset:offset + d] = v
            assert squared_norm(buf[offset:offset + d]) == squared_norm(v)
