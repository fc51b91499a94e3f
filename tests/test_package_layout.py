"""The package boundaries: solvers see models and dual states only through their contracts, the dual states and
their machinery live in ``torch_bcfw.duals`` and import no model, and ``torch_bcfw.models`` holds models only."""
from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import torch

import torch_bcfw
from conftest import random_multiclass_problem
from torch_bcfw.duals import ActiveSetDualState, DenseDualState, StepPlan, WorkingSet
from torch_bcfw.duals.stepsize import LINE_SEARCH

PACKAGE = Path(torch_bcfw.__file__).parent


def _imported_modules(path: Path, package: str) -> set[str]:
    """Absolute names of the ``torch_bcfw`` modules ``path`` (in subpackage ``package``) imports, lazily or not."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = ["torch_bcfw", package][: 3 - node.level]
                mod = ".".join([*base, node.module] if node.module else base)
                out.add(mod)
                out.update(f"{mod}.{a.name}" for a in node.names)
            else:
                out.add(node.module)
                out.update(f"{node.module}.{a.name}" for a in node.names)
    return {m for m in out if m.startswith("torch_bcfw")}


def test_solvers_import_no_concrete_model():
    for path in sorted((PACKAGE / "solvers").glob("*.py")):
        models = {m for m in _imported_modules(path, "solvers") if m.startswith("torch_bcfw.models")}
        assert models <= {"torch_bcfw.models.base", "torch_bcfw.models.base.StructuredModel"}, (path.name, models)


def test_dual_states_import_no_model():
    for path in sorted((PACKAGE / "duals").glob("*.py")):
        models = {m for m in _imported_modules(path, "duals") if m.startswith("torch_bcfw.models")}
        assert not models, (path.name, models)


def test_models_define_no_dual_state():
    for path in sorted((PACKAGE / "models").glob("*.py")):
        classes = [n for n in ast.walk(ast.parse(path.read_text(encoding="utf-8"))) if isinstance(n, ast.ClassDef)]
        assert not [c.name for c in classes if c.name.endswith("DualState")], path.name


def test_contract_defaults():
    model, data = random_multiclass_problem(n=5, F=3, K=3, seed=0)
    assert model.prox_geometry(data, 0.1, 1e-9, 10) is None
    state = DenseDualState(model, data, 0.1)
    assert not state.can_run_plan(StepPlan.plain(np.arange(5), 0)) and not state.can_run_minibatch()


def test_active_set_keeps_its_labelings_in_a_working_set():
    model, data = random_multiclass_problem(n=6, F=3, K=4, seed=1)
    state = ActiveSetDualState(model, data, 0.1)
    state.run_steps(np.random.default_rng(0).integers(0, len(data), 25), LINE_SEARCH)
    ws = state.active_set
    assert isinstance(ws, WorkingSet) and not hasattr(state, "active")
    for i in range(len(data)):
        assert (ws.alphas(i) >= 0).all() and abs(ws.alphas(i).sum() - 1.0) < 1e-12
        ys = torch.as_tensor(np.concatenate(ws.labelings(i))).long()
        assert np.allclose(ws.losses(i), (model.loss(data[[i] * int(ws.size[i])], ys) / len(data)).numpy())
    assert state.active_set_sizes().tolist() == ws.size.tolist()
    # w = A alpha from the listed labelings and weights
    v = 0.0
    for i in range(len(data)):
        blk = data[[i]]
        for y, a in zip(ws.labelings(i), ws.alphas(i)):
            psi = model.joint_feature(blk, blk.y)[0] - model.joint_feature(blk, torch.as_tensor(y).long())[0]
            v = v + a * psi / (0.1 * len(data))
    assert np.allclose(v.numpy(), state.w.numpy(), atol=1e-12)
