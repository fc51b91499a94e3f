"""One authority for option names: :func:`torch_bcfw.solvers.run.option_defaults` lists them for ``fit``, configs,
the Lightning callback and ``SSVM``; no other module of the package builds a list of its own."""
import ast
from pathlib import Path

import pytest

from torch_bcfw.solvers.options import OptionGroup, SolverOptions
from torch_bcfw.solvers.run import ALGORITHMS, check_option_names, option_defaults, options_for

PACKAGE = Path(__file__).resolve().parents[1] / "torch_bcfw"
#: the modules allowed to read option names from the dataclasses: the authority and the classes it reads
AUTHORITY = {"solvers/run.py", "solvers/options.py"}
#: what reading a list of option names looks like
LISTING_METHODS = {"flat_names", "shared_names"}


def _option_classes() -> set[str]:
    return {"SolverOptions"} | {cls.Options.__name__ for cls in ALGORITHMS.values() if cls.Options is not None}


def _name_lists(tree: ast.AST, classes: set[str]) -> list[int]:
    """Lines that build a list of option names: ``fields(<an option class>...)``, ``.flat_names()``,
    ``.shared_names()``."""
    lines = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else None
        if name in LISTING_METHODS:
            lines.append(node.lineno)
        elif name == "fields" and node.args:
            arg = ast.unparse(node.args[0])
            if any(c in arg for c in classes) or ".Options" in arg or "options" in arg.lower():
                lines.append(node.lineno)
    return lines


def test_no_module_but_the_authority_lists_option_names():
    classes = _option_classes()
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        if rel in AUTHORITY:
            continue
        lines = _name_lists(ast.parse(path.read_text(encoding="utf-8")), classes)
        if lines:
            found[rel] = lines
    assert found == {}, f"option names listed outside solvers/run.py's option_defaults: {found}"


def test_the_scan_finds_a_list_of_names():
    """The test above can fail: a module that lists names the old way is found."""
    src = "import dataclasses\nnames = [f.name for f in dataclasses.fields(SolverOptions)]\nx = G.flat_names()\n"
    assert sorted(_name_lists(ast.parse(src), _option_classes())) == [2, 3]


def test_option_defaults_lists_every_solver_and_the_shared_options():
    every = option_defaults()
    shared = set(SolverOptions.shared_names())
    assert "own" not in every and "extra" not in every and shared <= set(every)
    for solver, cls in ALGORITHMS.items():
        mine = option_defaults(solver)
        assert set(mine) <= set(every) and shared <= set(mine)
        assert set(mine) - shared == set(cls.Options.flat_names() if cls.Options is not None else ())
        assert options_for(solver).to_dict().keys() == mine.keys()  # a saved dict holds these names, flat
    assert every["mp_max_planes"] == 1000 and every["cache_size"] == 100 and every["preset"] is None


def test_bcfw_refinements_are_bcfw_options_given_flat():
    o = options_for("bcfw", sampling="gap", step_rule="pairwise", cache=True, cache_size=7, gap_power=2,
                    early_gap_check=0.8)
    assert isinstance(o.own, OptionGroup) and type(o.own).__name__ == "BCFWOptions"
    assert (o.own.step_rule, o.own.cache, o.own.cache_size, o.own.gap_power, o.own.early_gap_check) == (
        "pairwise", True, 7, 2.0, 0.8)
    for name in ("step_rule", "cache", "gap_power", "early_gap_check", "preset", "cache_size"):
        assert not hasattr(SolverOptions(), name)  # not a shared option
    assert options_for("bcfw", **o.to_dict()).to_dict() == o.to_dict()


@pytest.mark.parametrize("who, arguments", [("", ()), ("BCFWCallback", ("passes_per_call", "every_n_epochs"))])
def test_an_unknown_name_gets_the_closest_valid_one(who, arguments):
    with pytest.raises(TypeError, match="did you mean 'early_gap_check'"):
        check_option_names("bcfw", ["early_gap_chek"], arguments=arguments, who=who)
    with pytest.raises(TypeError, match="did you mean 'eg_step0'"):
        check_option_names("online-eg", ["eg_step_0"], arguments=arguments, who=who)
    with pytest.raises(TypeError, match="belong to solver 'bcfw', not 'ssg'"):
        check_option_names("ssg", ["cache_F"], arguments=arguments, who=who)
    check_option_names("mp-bcfw", ["mp_clock", "seed", *arguments], arguments=arguments, who=who)  # all fine
