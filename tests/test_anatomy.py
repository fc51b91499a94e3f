"""The minimal dual state written on docs/anatomy.md: run from the page itself, its certificate is checked against
enumeration and against the library's own dense state, so the page cannot drift from the library."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

import torch_bcfw as tb
from torch_bcfw.duals.base import DualState
from conftest import brute_force_primal, random_multiclass_problem
from test_docs import code_blocks

PAGE = Path(__file__).resolve().parents[1] / "docs" / "anatomy.md"
MARK = "<!-- anatomy: minimal state -->"


def _page_namespace() -> dict:
    """The namespace after the page's marked code block (the class definitions and its small example)."""
    lines = PAGE.read_text(encoding="utf-8").splitlines()
    start = lines.index(MARK) + 2  # the block's first code line (1-based: the line after the fence)
    block = next(b for b in code_blocks(PAGE) if b.line == start + 1)
    namespace = {"__name__": "__anatomy__"}
    exec(compile(block.source, str(PAGE), "exec"), namespace)  # noqa: S102 -- the documentation's own code
    return namespace


def test_the_pages_state_implements_exactly_the_listed_methods():
    cls = _page_namespace()["ListedDualState"]
    own = {name for name in vars(cls) if callable(vars(cls)[name]) and name != "__init__"}
    listed = set(DualState.__abstractmethods__)  # the required hooks
    assert own == listed  # the page's table and its example agree
    text = PAGE.read_text(encoding="utf-8")
    assert all(f"`{name}" in text for name in listed)


@pytest.mark.parametrize("preset", [None, "gap-fw", "uniform-fw-cache"])
def test_the_pages_state_certifies_the_enumerated_optimum(preset):
    ns = _page_namespace()
    model_cls = ns["ListedMulticlass"]
    base, data = random_multiclass_problem(n=7, F=3, K=3, seed=4)
    model = model_cls(base.n_inputs, base.n_classes)
    lam = 0.2
    r = tb.fit(model, data, lam, preset=preset, max_passes=2000, gap_check=10, gap_tol=1e-3, track_train_loss=False)
    # the primal by enumerating every labeling, the dual from the listed alpha directly
    assert brute_force_primal(model, data, r.weights, lam) == pytest.approx(r.primal, abs=1e-12)
    state = ns["ListedDualState"].from_state_dict(model, data, lam, r.solver_state["state"])
    w = torch.einsum("ik,ikd->d", state.alpha, state.psi) / lam
    assert torch.allclose(w, state.w, atol=1e-12)
    assert torch.allclose(state.alpha.sum(1), torch.ones(len(data), dtype=torch.float64), atol=1e-12)
    assert float(state.alpha.min()) >= 0.0
    dual = float((state.alpha * state.b).sum()) - 0.5 * lam * float(w @ w)
    assert r.stopped_by == "gap_tol" and 0.0 <= r.gap <= 1e-3
    assert r.primal - dual >= r.gap - 1e-12  # the certificate uses the best dual seen, at least this one
    assert brute_force_primal(model, data, state.w, lam) - dual >= -1e-12  # weak duality, by enumeration
    # the same optimum as the library's dense state (each within its certified gap)
    ref = tb.fit(base, data, lam, max_passes=2000, gap_check=10, gap_tol=1e-3, track_train_loss=False)
    assert abs(r.primal - ref.primal) <= r.gap + ref.gap + 1e-12


def test_the_pages_state_keeps_its_weights_on_the_regularization_path():
    """``rescale_lam`` (the path's step, Osokin et al. 2016, Prop. 1) keeps ``w`` of the page's state: its
    ``_rescale_storage`` moves ``alpha`` with ``lam``."""
    ns = _page_namespace()
    base, data = random_multiclass_problem(n=7, F=3, K=3, seed=4)
    model = ns["ListedMulticlass"](base.n_inputs, base.n_classes)
    r = tb.fit(model, data, 0.2, max_passes=20, gap_check=20, track_train_loss=False)
    state = ns["ListedDualState"].from_state_dict(model, data, 0.2, r.solver_state["state"])
    w = state.w.clone()
    rho = state.rescale_lam(0.05)
    assert rho == pytest.approx(0.25)
    assert torch.allclose(torch.einsum("ik,ikd->d", state.alpha, state.psi) / 0.05, w, atol=1e-12)
