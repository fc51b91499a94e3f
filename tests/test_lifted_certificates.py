"""A saved state whose losses are lifted within their documented bounds cannot certify less than the true
suboptimality, for every state kind: the storages that determine their dual variables (chain marginals, graph-cut
marginals, active sets, the multiclass ``w_i``) refuse the lift on load; the generic dense state, which does not,
certifies only the part of its dual variables it computed itself; the saved accumulators of the weighted average
never certify a dual value.  The optimum comes from a solve to a certified gap of 1e-9 and the primal value from
enumeration (tests/load_fuzz_worker.py)."""
from __future__ import annotations

import random

import pytest
import torch

import load_fuzz_worker as worker
from torch_bcfw.io.tree_file import save_tree

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.mark.parametrize("kind", list(worker.KINDS))
def test_a_lifted_state_is_refused_or_certifies_honestly(kind, tmp_path):
    base = worker.saved_run(kind)
    outcomes = {}
    for how in ("lift", "lift-avg"):
        d = {k: v for k, v in base.items()}
        d["solver_state"] = dict(base["solver_state"], state=dict(base["solver_state"]["state"]))
        worker.lift(d, kind, how, random.Random(3))
        save_tree(d, tmp_path / f"{kind}__{how}.safetensors")
        outcomes[how] = worker.check(tmp_path / f"{kind}__{how}.safetensors", worker.reference_primal(kind))
        assert outcomes[how] == "ok" or outcomes[how].startswith("error: "), outcomes
    if kind in ("chain", "chain-cache", "chain-minibatch", "chain-mp", "multiclass", "active-set", "graphcut"):
        assert outcomes["lift"].startswith("error: "), outcomes  # the storage determines l_i: the lift is refused


def test_the_issue_multiclass_lift_is_refused(tmp_path):
    """Raising every saved multiclass loss to 0.3 of the way to its bound (and ``ell`` to their sum) gave a certified
    gap below the distance to the optimum; ``w_i`` determines the losses, so the file is refused naming them."""
    d = worker.saved_run("multiclass")
    st = d["solver_state"]["state"]
    st["block_ell"] = st["block_ell"] + 0.3 * (1.0 / 6 - st["block_ell"])
    st["ell"] = float(st["block_ell"].sum())
    save_tree(d, tmp_path / "multiclass__lifted.safetensors")
    out = worker.check(tmp_path / "multiclass__lifted.safetensors", 0.0)
    assert out.startswith("error: ") and "block_ell" in out and "w_i determines" in out, out
