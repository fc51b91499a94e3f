"""Griffe extension (loaded by mkdocstrings, see ``mkdocs.yml``): the reST roles of the docstrings become links.

The docstrings cross-reference with reST roles (``:func:`~torch_bcfw.fit```, ``:class:`.chain.ChainDualState```,
``:meth:`rebind```), which Google-style rendering would print as raw text.  Once the package is loaded, every role
is rewritten:

* to an autorefs link ``[name][identifier]`` when its target is documented on the API page (an object named by a
  ``:::`` line of ``docs/api.md``, or a member of one): the identifier is the one the page renders, whatever path
  the docstring used (``torch_bcfw.solvers.options.SolverOptions`` links to ``torch_bcfw.SolverOptions``);
* to inline code ``name`` otherwise (private helpers, modules without a section).

A ``~`` shows the last component only, as in Sphinx; a leading ``.`` is relative to the docstring's module.
"""
from __future__ import annotations

import re
from pathlib import Path

import griffe

_ROLE = re.compile(r":(?:py:)?(?:func|class|meth|attr|mod|data|exc|obj|const):`(~?)([^`]+?)`")
_TITLED = re.compile(r"(.*?)\s*<([^<>]+)>\s*", re.S)  # :meth:`title <target>`
_API_PAGE = Path(__file__).resolve().parent / "api.md"


def _documented(pkg) -> dict[str, str]:
    """``{canonical path: rendered identifier}`` of the API page's objects and their members."""
    out: dict[str, str] = {}
    for line in _API_PAGE.read_text(encoding="utf-8").splitlines():
        if not line.startswith("::: "):
            continue
        ident = line[4:].strip()
        try:
            obj = pkg[ident.split(".", 1)[1]] if "." in ident else pkg
        except (KeyError, griffe.AliasResolutionError, griffe.CyclicAliasError):
            continue
        target = _final(obj)
        out.setdefault(target.path, ident)
        out.setdefault(ident, ident)
        for name, member in _members(target):
            if not _rendered(name, member):
                continue
            out.setdefault(f"{target.path}.{name}", f"{ident}.{name}")
            out.setdefault(f"{ident}.{name}", f"{ident}.{name}")
            final = _final(member)
            if final is not None:
                out.setdefault(final.path, f"{ident}.{name}")
    return out


def _rendered(name: str, member) -> bool:
    """Whether mkdocstrings shows ``member`` in its owner's section: public, declared there, with a docstring."""
    if name.startswith("_") or getattr(member, "inherited", False):
        return False
    final = _final(member)
    return final is not None and final.docstring is not None and final.parent is not None and not member.is_alias


def _final(obj):
    try:
        return obj.final_target if obj.is_alias else obj
    except (griffe.AliasResolutionError, griffe.CyclicAliasError):
        return None


def _members(obj):
    try:
        return list(obj.members.items())
    except (griffe.AliasResolutionError, griffe.CyclicAliasError, AttributeError):
        return []


def _module_of(obj):
    while obj is not None and not obj.is_module:
        obj = obj.parent
    return obj


class RolesToLinks(griffe.Extension):
    """Rewrite the reST roles of every docstring of the package (see the module docstring): the objects are
    collected while griffe visits them, and rewritten once the package is loaded (the API page's objects known)."""

    def __init__(self) -> None:
        super().__init__()
        self._objects = []

    def on_instance(self, *, obj, **kwargs) -> None:
        if not obj.is_alias:
            self._objects.append(obj)

    def on_package(self, *, pkg, **kwargs) -> None:
        documented = _documented(pkg)
        for obj in self._objects:
            if obj.docstring is not None and ":`" in obj.docstring.value:
                obj.docstring.value = _ROLE.sub(lambda m: self._replace(m, obj, documented), obj.docstring.value)
        self._objects = []

    @staticmethod
    def _replace(m, obj, documented: dict[str, str]) -> str:
        short, target, title = m.group(1) == "~", m.group(2).strip(), None
        titled = _TITLED.fullmatch(target)
        if titled:
            title, target = " ".join(titled.group(1).split()), titled.group(2).strip()
        if target.startswith("."):  # relative: to the package of the docstring's module, one level up per extra dot
            module = _module_of(obj)
            rest = target.lstrip(".")
            base = "" if module is None else (module.path if module.is_init_module else module.path.rsplit(".", 1)[0])
            for _ in range(len(target) - len(rest) - 1):
                base = base.rsplit(".", 1)[0]
            target = f"{base}.{rest}" if base else rest
        label = title or (target.rsplit(".", 1)[-1] if short else target)
        ident = documented.get(target)
        if ident is None and "." not in target and obj.parent is not None:  # a member of the same class
            owner = obj.parent if obj.is_function or obj.is_attribute else obj
            ident = documented.get(f"{owner.path}.{target}")
        return f"[`{label}`][{ident}]" if ident is not None else f"`{label}`"
