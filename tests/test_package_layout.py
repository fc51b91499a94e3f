"""The package boundaries: the floors of the whole package (no import points up a floor, no import circle), solvers
see models and dual states only through their contracts, the dual states and their machinery live in
``torch_bcfw.duals`` and import no model, and ``torch_bcfw.models`` holds models only."""
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


#: the floors of the package, lowest first (a top-level module or subpackage of ``torch_bcfw`` per name, a whole
#: subpackage on one floor): a module imports, at module level or inside a function, only from its own floor or a
#: lower one
FLOORS = (
    ("runtime", "io", "checks", "convert", "plotting"),  # foundations: the process, files, argument checks, plots
    ("data", "inference"),  # data containers and decoders
    ("head_ops", "metrics"),  # decoding heads; task metrics from data the caller passes
    ("duals",),  # dual states and their step loops
    ("models",),  # joint features, losses, oracles
    ("certificate", "distributed"),  # primal, dual and gap; process groups and the communicators of a run
    ("solvers",),  # the BCFW family and the baselines
    ("planning",),  # a run's "auto" choices, resolved once before any solver exists
    ("checkpoint", "head_solve", "fit", "compilation", "cross_validation", "estimator", "export"),  # the front doors
    ("nn", "head_optimizer", "features", "vision"),  # torch modules under a structured head, its BCFW optimizer;
    # feature extraction; image backbones
    ("datasets",),  # loaders of the real data and their task glue
    ("tasks", "lightning", "compare"),  # Lightning tasks and callback; solver comparisons
    ("cli", "__main__", "__init__"),  # the command line and the package's own namespace
)


def _import_graph() -> dict[str, set[str]]:
    """Module -> the package's modules it imports (lazily or not), from the AST; edges from inside a package into
    its own ``__init__`` are left out (the package's namespace is not a dependency of its parts)."""
    mods = {}
    for path in PACKAGE.rglob("*.py"):
        rel = path.relative_to(PACKAGE.parent).with_suffix("")
        name = ".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)
        mods[name] = path
    graph = {}
    for name, path in mods.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        out = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                cands = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")
                    parts = parts[: len(parts) - (node.level - 1)]
                    base = ".".join(parts + ([base] if base else []))
                cands = [base] + [f"{base}.{a.name}" for a in node.names]
            else:
                continue
            out.update(c for c in cands if c in mods and c != name and not name.startswith(c + "."))
        graph[name] = out
    return graph


def _floor(module: str) -> int:
    unit = module.split(".")[1] if "." in module else "__init__"
    for k, floor in enumerate(FLOORS):
        if unit in floor:
            return k
    raise AssertionError(f"{module} is on no floor of FLOORS: place it")


def test_no_import_of_another_modules_private_name():
    """``from x import _name`` (or ``import x._y``) across modules of the package: a helper shared between modules
    is public, with a name that says what it is."""
    private = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom):
                names = [a.name for a in node.names] + (node.module or "").split(".")
            elif isinstance(node, ast.Import):
                names = [part for a in node.names for part in a.name.split(".")]
            else:
                continue
            private += [f"{path.relative_to(PACKAGE)}:{node.lineno} {n}" for n in names
                        if n.startswith("_") and not n.startswith("__")]
    assert private == []


def _private(name: str) -> bool:
    return name.startswith("_") and not name.endswith("__")


def _class_privates(cls: ast.ClassDef) -> set[str]:
    """The private attributes class ``cls`` defines: its methods, its class-level names and what its own methods
    store on ``self`` / ``cls`` (nested classes left out: they are other classes)."""
    out, todo = set(), list(cls.body)
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node in cls.body:
            out.add(node.name)
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and node in cls.body:
            out.update(t.id for t in (node.targets if isinstance(node, ast.Assign) else [node.target])
                       if isinstance(t, ast.Name))
        if (isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) and isinstance(node.value, ast.Name)
                and node.value.id in ("self", "cls")):
            out.add(node.attr)
        if not isinstance(node, ast.ClassDef):
            todo.extend(ast.iter_child_nodes(node))
    return {n for n in out if _private(n)}


def _chain_root(node: ast.expr) -> ast.expr:
    """The first name of an attribute chain (``a`` of ``a.b(c)[0].d``)."""
    while isinstance(node, (ast.Attribute, ast.Call, ast.Subscript)):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node


def test_no_use_of_another_objects_private_attribute():
    """``x._name`` names a private attribute of the package's own objects only on ``self`` / ``cls`` / ``super()``,
    inside the class that defines it (another instance of that class), or on this module's own classes: what another
    object offers is public, with a name that says what it is.  A private attribute no class of the package defines
    belongs to another library's object (``os._exit``, a named tuple's ``_replace``, numba's cache locators) and is
    not the package's to name; one reached through an import of a package module always counts."""
    trees = {path: ast.parse(path.read_text(encoding="utf-8")) for path in sorted(PACKAGE.rglob("*.py"))}
    classes = {c: _class_privates(c) for t in trees.values() for c in ast.walk(t) if isinstance(c, ast.ClassDef)}
    own = set().union(*classes.values())
    uses = []
    for path, tree in trees.items():
        package_imports = {a.asname or a.name.partition(".")[0] for node in ast.walk(tree)
                           if isinstance(node, ast.Import) for a in node.names if a.name.startswith("torch_bcfw")}
        package_imports |= {a.asname or a.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
                            and (node.level or (node.module or "").startswith("torch_bcfw")) for a in node.names}
        module_names = {n.name for n in tree.body if isinstance(n, ast.ClassDef)}

        def visit(node, cls):
            for child in ast.iter_child_nodes(node):
                visit(child, child if isinstance(child, ast.ClassDef) else cls)
            if not (isinstance(node, ast.Attribute) and _private(node.attr)):
                return
            value, root = node.value, _chain_root(node.value)
            if isinstance(value, ast.Name) and value.id in ("self", "cls") or (
                    isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id == "super"):
                return
            if cls is not None and node.attr in classes[cls]:
                return
            if isinstance(value, ast.Name) and value.id in module_names:
                return
            if node.attr in own or isinstance(root, ast.Name) and root.id in package_imports:
                uses.append(f"{path.relative_to(PACKAGE)}:{node.lineno} {ast.unparse(node)}")

        visit(tree, None)
    assert not uses, "\n".join(uses)


def test_no_import_points_up_a_floor():
    up = sorted(f"{a} -> {b}" for a, targets in _import_graph().items() for b in targets if _floor(b) > _floor(a))
    assert up == []


def test_no_import_circles():
    graph = _import_graph()
    index, low, stack, on, circles = {}, {}, [], set(), []

    def visit(v):  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            scc = []
            while True:
                w = stack.pop()
                on.discard(w)
                scc.append(w)
                if w == v:
                    break
            if len(scc) > 1:
                circles.append(sorted(scc))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    assert circles == []


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
    assert not state.can_run_plan(StepPlan.plain(np.arange(5), 0))
    assert not state.can_run_plan(StepPlan.minibatch(np.arange(5), [0, 5]))


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
