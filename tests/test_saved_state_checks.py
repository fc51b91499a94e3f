"""A saved state is checked before anything runs on it: arrays of the wrong length never reach the compiled kernels
(a crash, in its own process, fails the test), a state at another ``lam`` or with dual variables off their simplices
is refused with a message naming the field, and a dual value above a primal one gives no certificate."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import random_chain_problem, random_multiclass_problem
from torch_bcfw import FitResult, fit
from torch_bcfw.io.tree_file import save_tree

HERE = Path(__file__).resolve().parent

# fit, damage one field of the saved state, save, load and resume: in a fresh process
SCRIPT = """
import sys
sys.path.insert(0, {here!r})
import torch
from conftest import random_chain_problem
from torch_bcfw import FitResult, fit
from torch_bcfw.io.tree_file import save_tree
model, data = random_chain_problem(n=60, seed=0, max_len=5)
r = fit(model, data, 0.1, max_passes=2, gap_check=1, progress=False, **{options!r})
d = r.to_dict()
st = d["solver_state"]
{damage}
save_tree(d, {path!r})
try:
    fit(model, data, 0.1, init=FitResult.load({path!r}), max_passes=2, gap_check=1, progress=False, **{options!r})
except ValueError as exc:
    print("refused:", exc)
else:
    print("accepted")
"""

DAMAGE = {
    "block_ell": ({}, 'st["state"]["block_ell"] = st["state"]["block_ell"][:3]', "state block_ell"),
    "avg_last": ({}, 'st["state"]["avg_last"] = st["state"]["avg_last"][:2]', "state avg_last"),
    "mu_acc": ({}, 'st["state"]["storage"]["mu_acc"] = st["state"]["storage"]["mu_acc"][:3]', "mu_acc"),
    "estimates": ({"preset": "gap-fw"}, 'st["estimates"]["est"] = torch.ones(10 ** 6)', "gap estimates"),
    "queue": ({"preset": "gap-fw"}, 'st["sampler"]["queue"] = st["sampler"]["queue"] + 10 ** 6', "sampler queue"),
    "planes": ({"preset": "gap-pairwise-cache"}, 'st["state"]["working_set"]["size"][0] = 10 ** 5', "working_set"),
}


@pytest.mark.heavy  # a process per damaged file (a crash must not take the test run with it)
@pytest.mark.parametrize("field", sorted(DAMAGE))
def test_arrays_of_the_wrong_size_are_refused_before_any_kernel_runs(tmp_path, field):
    options, damage, name = DAMAGE[field]
    script = SCRIPT.format(here=str(HERE), options=options, damage=damage, path=str(tmp_path / "r.safetensors"))
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]  # not killed by a memory error
    assert proc.stdout.startswith("refused:") and name in proc.stdout, proc.stdout


def _chain_result():
    model, data = random_chain_problem(n=8, seed=4)
    return model, data, fit(model, data, 0.1, max_passes=3, gap_check=1, progress=False)


def test_a_state_saved_at_another_lam_is_refused(tmp_path):
    model, data, r = _chain_result()
    d = r.to_dict()
    d["solver_state"]["state"]["lam"] = 0.01
    save_tree(d, tmp_path / "r.safetensors")
    with pytest.raises(ValueError, match="saved at lam = 0.01, this problem has lam = 0.1"):
        fit(model, data, 0.1, init=FitResult.load(tmp_path / "r.safetensors"), max_passes=1)


def test_a_size_saved_as_a_string_is_named_as_such(tmp_path):
    model, data, r = _chain_result()
    d = r.to_dict()
    d["solver_state"]["state"]["n"] = "8"  # was reported as "saved for n = 8 ... this problem has n = 8"
    save_tree(d, tmp_path / "r.safetensors")
    with pytest.raises(ValueError, match="state n must be an integer"):
        fit(model, data, 0.1, init=FitResult.load(tmp_path / "r.safetensors"), max_passes=1)


@pytest.mark.parametrize("how", ["mu", "T", "ell"])
def test_marginals_off_the_simplex_or_a_wrong_loss_are_refused(tmp_path, how):
    model, data, r = _chain_result()
    d = r.to_dict()
    st = d["solver_state"]["state"]
    if how == "mu":  # still summing to one, but negative
        st["storage"]["mu"][0, 0] += 0.5
        st["storage"]["mu"][0, 1] -= 0.5
    elif how == "T":
        st["storage"]["T"][0] *= 2
    else:  # a larger l_i (and l) claims a larger dual value
        st["block_ell"][0] += 0.05
        st["ell"] += 0.05
    save_tree(d, tmp_path / "r.safetensors")
    message = {"mu": "mu: a token's marginals are off the simplex", "T": "state storage T",
               "ell": "block_ell is not the expected loss of the marginals"}[how]
    with pytest.raises(ValueError, match=message):
        fit(model, data, 0.1, init=FitResult.load(tmp_path / "r.safetensors"), max_passes=1)


def test_a_dual_value_above_a_primal_value_gives_no_certificate(tmp_path):
    """The generic dense state stores ``w_i``, not ``alpha``: its ``l_i`` cannot be recomputed, only bounded.  Inflated
    within those bounds so that the dual exceeds the primal, the run refuses to certify instead of printing a negative
    gap.  A multiclass state's ``w_i`` determine its ``l_i``: the same file is refused on load."""
    from load_fuzz_worker import DenseMulticlass

    base, data = random_multiclass_problem(n=8, seed=3)
    for model, message in ((DenseMulticlass(base.n_inputs, base.n_labels), "exceeds the primal value"),
                           (base, "not the expected loss .* its w_i determines")):
        r = fit(model, data, 0.1, max_passes=50, gap_check=5, progress=False)
        d = r.to_dict()
        st = d["solver_state"]["state"]
        top = (model.max_loss(data).to(torch.float64) / len(data))
        st["block_ell"] = st["block_ell"] + 0.5 * (top - st["block_ell"])
        st["ell"] = float(st["block_ell"].sum())
        save_tree(d, tmp_path / "r.safetensors")
        with pytest.raises(ValueError, match=message):
            fit(model, data, 0.1, init=FitResult.load(tmp_path / "r.safetensors"), max_passes=1, gap_check=1)


@pytest.mark.parametrize("damage, message", [
    (lambda h, d: h.update(gap=-5.0), r"\['gap'\] = -5.0 is negative"),
    (lambda h, d: h.update(gap_last=float("nan")), "finite"),
    (lambda h, d: h.update(gap_last=h["gap_last"] + 1.0), "primal minus its dual"),
    (lambda h, d: h.update(dual=h["primal"] + 1.0, gap_last=-1.0), "negative"),
    (lambda h, d: d.update(w=d["w"] * 1e150), "below lam/2"),
])
def test_a_saved_certificate_is_loaded_only_when_it_is_possible(tmp_path, damage, message):
    """A certificate that no run can produce (negative, NaN, not primal minus dual, or below the regulariser of the
    saved weights) is refused on load instead of being shown."""
    _, _, r = _chain_result()
    d = r.to_dict()
    damage(d["history"][-1], d)
    save_tree(d, tmp_path / "r.safetensors")
    with pytest.raises(ValueError, match=message):
        FitResult.load(tmp_path / "r.safetensors")


def test_weights_that_are_not_plain_dense_tensors_are_refused(tmp_path):
    """``from_dict`` refuses a sparse or negated view of the weights; a file holds dense tensors only (a sparse tensor
    is not saved, a negated view is saved as its values)."""
    _, _, r = _chain_result()
    for make in (lambda w: w.to_sparse(), lambda w: torch._neg_view(w)):
        d = r.to_dict()
        d["w"] = make(d["w"])
        with pytest.raises(ValueError, match="plain dense tensor"):
            FitResult.from_dict(d)
    d = r.to_dict()
    with pytest.raises(ValueError, match="cannot save the tensor at w: torch.sparse_coo"):
        save_tree(dict(d, w=d["w"].to_sparse()), tmp_path / "r.safetensors")
    save_tree(dict(d, w=torch._neg_view(d["w"])), tmp_path / "r.safetensors")
    assert torch.equal(FitResult.load(tmp_path / "r.safetensors").w, -r.w)


@pytest.mark.parametrize("damage, message", [
    (lambda st: st["state"].__setitem__("k", 10 ** 30), "64-bit integer"),
    (lambda st: st.pop("sampler"), "lacks the field 'sampler'"),
])
def test_a_huge_integer_or_a_missing_field_is_a_clear_error(tmp_path, damage, message):
    model, data, r = _chain_result()
    d = r.to_dict()
    damage(d["solver_state"])
    save_tree(d, tmp_path / "r.safetensors")
    with pytest.raises(ValueError, match=message):
        fit(model, data, 0.1, init=FitResult.load(tmp_path / "r.safetensors"), max_passes=1)
