"""docs/anatomy.md against the library: the step table names functions that exist, call each other and run in a plain
fit; the minimal dual state written on the page, run from the page itself, is checked against enumeration and against
the library's own dense state.  The page cannot drift from the library."""
from __future__ import annotations

import ast
import importlib
import sys
from pathlib import Path

import pytest
import torch

import torch_bcfw as tb
from torch_bcfw.duals.base import DualState
from conftest import brute_force_primal, random_chain_problem, random_multiclass_problem
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
    model = model_cls(base.n_inputs, base.n_labels)
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
    model = ns["ListedMulticlass"](base.n_inputs, base.n_labels)
    r = tb.fit(model, data, 0.2, max_passes=20, gap_check=20, track_train_loss=False)
    state = ns["ListedDualState"].from_state_dict(model, data, 0.2, r.solver_state["state"])
    w = state.w.clone()
    rho = state.rescale_lam(0.05)
    assert rho == pytest.approx(0.25)
    assert torch.allclose(torch.einsum("ik,ikd->d", state.alpha, state.psi) / 0.05, w, atol=1e-12)


def _step_table() -> list[tuple[str, list[str]]]:
    """The page's table "From fit to the update": ``(file, [function, ...])`` per row, in order."""
    lines = PAGE.read_text(encoding="utf-8").splitlines()
    start = lines.index("| file | function | what it owns |") + 2
    rows = []
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip("|").split("|")]
        rows.append((cells[0].strip("`"), [f.strip().strip("`") for f in cells[1].split(",")]))
    return rows


def _function_node(path: Path, qualname: str) -> ast.FunctionDef:
    """The definition of ``qualname`` (``f`` or ``Class.f``) in the file ``path``."""
    body = ast.parse(path.read_text(encoding="utf-8")).body
    *owners, name = qualname.split(".")
    for owner in owners:
        body = next(n.body for n in body if isinstance(n, ast.ClassDef) and n.name == owner)
    return next(n for n in body if isinstance(n, ast.FunctionDef) and n.name == name)


def _called_names(node: ast.AST) -> set[str]:
    """The names a function calls: ``f(...)`` and ``x.f(...)`` alike."""
    calls = [n.func for n in ast.walk(node) if isinstance(n, ast.Call)]
    return {f.id for f in calls if isinstance(f, ast.Name)} | {f.attr for f in calls if isinstance(f, ast.Attribute)}


def test_every_function_of_the_step_table_exists_and_is_called_from_a_row_above():
    root = PAGE.parents[1]
    hops = [(root / file, name) for file, names in _step_table() for name in names]
    assert len({file for file, _ in hops}) == 10 and "Ten files" in PAGE.read_text(encoding="utf-8")
    callers = []
    for path, qualname in hops:
        node = _function_node(path, qualname)  # StopIteration: the page names a function the file does not define
        if callers:
            last = qualname.rpartition(".")[2]
            assert any(last in _called_names(c) for c in callers), f"no function above {qualname} calls it"
        callers.append(node)


def test_a_plain_chain_fit_runs_the_functions_of_the_step_table(monkeypatch):
    """The Python hops of the table are entered (a profiler sees them); the compiled entry is the plain kernel, not
    the refined one; the compiled hops below it are numba functions (called by name, checked above)."""
    from torch_bcfw.duals import chain as chain_state

    root = PAGE.parents[1]
    hops = [(str(root / file), name) for file, names in _step_table() for name in names]
    entered = set()

    def profile(frame, event, arg):
        if event == "call":
            entered.add((frame.f_code.co_filename, frame.f_code.co_qualname))

    kernels = []
    plain, refined = chain_state.chain_plain_bcfw_steps, chain_state.chain_refined_plan_steps
    monkeypatch.setattr(chain_state, "chain_plain_bcfw_steps", lambda *a: kernels.append("plain") or plain(*a))
    monkeypatch.setattr(chain_state, "chain_refined_plan_steps", lambda *a: kernels.append("refined") or refined(*a))
    model, data = random_chain_problem(n=5, seed=3)
    sys.setprofile(profile)
    try:
        tb.fit(model, data, 0.1, max_passes=2, track_train_loss=False)
    finally:
        sys.setprofile(None)
    assert kernels and set(kernels) == {"plain"}
    python_hops = [(f, q) for f, q in hops if not hasattr(_module_attribute(f, q), "py_func")]
    assert [h for h in python_hops if h not in entered] == []
    compiled = [(f, q) for f, q in hops if (f, q) not in python_hops]
    assert [q for _, q in compiled] == ["chain_plain_bcfw_steps", "loss_augmented_decode", "fw_move", "move_block",
                                         "viterbi_numba", "fw_commit", "step_size"]


def _module_attribute(file: str, qualname: str):
    """The object ``qualname`` of the package module stored at ``file``."""
    rel = Path(file).relative_to(PAGE.parents[1]).with_suffix("")
    obj = importlib.import_module(".".join(rel.parts))
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj
