"""The documentation is tested: every Python code block of README.md and docs/**/*.md runs, the option table
matches ``SolverOptions``, the API page lists every public name, every benchmark has a results page.

Code blocks: the ```` ```python ```` blocks of one file run in order in one namespace, with the repository root
as the working directory (the real data is at ``../shared/data``).  A block right after the HTML comment
``<!-- illustrative -->`` is not run (a fragment that needs a GPU, a trained backbone or hours); a block after
``<!-- slow -->`` runs only under ``pytest -m slow``.  Other languages (``bash``, ``yaml``, plain) are not run.
"""
from __future__ import annotations

import ast
import dataclasses
import re
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from conftest import shared_data

import torch_bcfw

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
DOC_FILES = [ROOT / "README.md"] + sorted(DOCS.rglob("*.md"))
MARKERS = {"<!-- illustrative -->": "illustrative", "<!-- slow -->": "slow"}
_FENCE = re.compile(r"^(?P<fence>`{3,}|~{3,})\s*(?P<info>[^`\s]*)")


@dataclass
class Block:
    path: Path
    line: int  # 1-based line of the first code line
    source: str
    kind: str  # "run", "illustrative" or "slow"


def code_blocks(path: Path) -> list[Block]:
    """The Python code blocks of a Markdown file, each with the marker (if any) on the line before its fence."""
    lines = path.read_text(encoding="utf-8").splitlines()
    blocks, i = [], 0
    while i < len(lines):
        m = _FENCE.match(lines[i].strip())
        if m is None:
            i += 1
            continue
        fence, info, indent = m.group("fence"), m.group("info").lower(), len(lines[i]) - len(lines[i].lstrip())
        j = i + 1
        while j < len(lines) and not lines[j].strip().startswith(fence):
            j += 1
        if info in ("python", "py"):
            prev = next((ln.strip() for ln in reversed(lines[:i]) if ln.strip()), "")
            body = "\n".join(ln[indent:] if ln[:indent].strip() == "" else ln for ln in lines[i + 1:j])
            blocks.append(Block(path, i + 2, body, MARKERS.get(prev, "run")))
        i = j + 1
    return blocks


def _files_with(kinds: set[str]) -> list[Path]:
    return [p for p in DOC_FILES if any(b.kind in kinds for b in code_blocks(p))]


def _rel(p: Path) -> str:
    return p.relative_to(ROOT).as_posix()


def _run_file(path: Path, kinds: set[str], monkeypatch) -> None:
    blocks = [b for b in code_blocks(path) if b.kind in kinds]
    if any("../shared/data" in b.source for b in blocks):
        shared_data()  # a clear failure when the data is missing
    monkeypatch.chdir(ROOT)
    monkeypatch.setenv("MPLBACKEND", "Agg")
    import matplotlib

    matplotlib.use("Agg")
    namespace = {"__name__": "__docs__"}
    for b in blocks:
        # pad with newlines so that a traceback names the file and the line of the Markdown source
        # dont_inherit: the page's code compiles as a user's file would, without this module's __future__ flags
        code = compile("\n" * (b.line - 1) + b.source, str(path), "exec", dont_inherit=True)
        exec(code, namespace)  # noqa: S102 -- the documentation's own examples
    import matplotlib.pyplot as plt

    plt.close("all")


#: pages whose code blocks load full-size data (CoNLL-2000) or launch processes: run in the heavy tier
_HEAVY_PAGES = {"docs/guides/conll.md", "docs/scaling.md"}


@pytest.mark.parametrize("path", [pytest.param(p, marks=pytest.mark.heavy) if _rel(p) in _HEAVY_PAGES else p
                                  for p in _files_with({"run"})], ids=_rel)
def test_code_blocks_run(path: Path, monkeypatch) -> None:
    _run_file(path, {"run"}, monkeypatch)


@pytest.mark.slow
@pytest.mark.parametrize("path", _files_with({"slow"}), ids=_rel)
def test_slow_code_blocks_run(path: Path, monkeypatch) -> None:
    _run_file(path, {"run", "slow"}, monkeypatch)


def test_code_block_collector_reads_markers(tmp_path: Path) -> None:
    md = tmp_path / "x.md"
    md.write_text("text\n\n```python\na = 1\n```\n\n<!-- illustrative -->\n```python\nb = 2\n```\n"
                  "<!-- slow -->\n\n```py\nc = 3\n```\n```bash\nls\n```\n- item\n\n  ```python\n  d = 4\n  ```\n")
    got = [(b.line, b.source, b.kind) for b in code_blocks(md)]
    assert got == [(4, "a = 1", "run"), (9, "b = 2", "illustrative"), (14, "c = 3", "slow"), (22, "d = 4", "run")]


# ---------------------------------------------------------------------------- the option table
def _option_table() -> dict[str, str]:
    """``{name: default cell}`` of the table under the heading "Options" in docs/solvers.md."""
    text = (DOCS / "solvers.md").read_text(encoding="utf-8")
    rows, in_table = {}, False
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")] if line.lstrip().startswith("|") else None
        if cells and cells[:2] == ["option", "default"]:
            in_table = True
            continue
        if in_table and cells is None:
            break
        if in_table and not set(cells[0]) <= set("-: "):
            m = re.fullmatch(r"`([A-Za-z_][A-Za-z0-9_]*)`", cells[0])
            assert m, f"docs/solvers.md: option cell {cells[0]!r} must be one name in backticks"
            assert m.group(1) not in rows, f"docs/solvers.md: option {m.group(1)} listed twice"
            rows[m.group(1)] = cells[1]
    assert rows, "docs/solvers.md has no table with the header | option | default | meaning |"
    return rows


def test_option_table_matches_solver_options() -> None:
    from torch_bcfw.solvers.run import option_defaults

    table = _option_table()
    defaults = option_defaults()  # every solver's option names, flat, with their defaults
    assert sorted(set(defaults) - set(table)) == [], "options missing from the table in docs/solvers.md"
    assert sorted(set(table) - set(defaults)) == [], "options in docs/solvers.md that no solver has"
    for name, cell in table.items():
        default = defaults[name]
        m = re.fullmatch(r"`([^`]*)`", cell)
        assert m, f"docs/solvers.md: the default of {name} must be a Python literal in backticks, got {cell!r}"
        documented = ast.literal_eval(m.group(1))
        assert documented == default and type(documented) in (type(default), int, float), (
            f"docs/solvers.md documents {name} = {documented!r}, the options have {default!r}")


# ---------------------------------------------------------------------------- the API page
def test_api_page_documents_every_public_name() -> None:
    text = (DOCS / "api.md").read_text(encoding="utf-8")
    # a name that is also a submodule (torch_bcfw.fit) is named by its full path, else the module would render
    missing = [n for n in torch_bcfw.__all__
               if not re.search(rf"^::: torch_bcfw\.{re.escape(n)}(\.{re.escape(n)})?\s*$", text, re.M)]
    assert missing == [], f"add '::: torch_bcfw.NAME' entries to docs/api.md for {missing}"


# ---------------------------------------------------------------------------- results pages
def _benchmark_scripts() -> list[Path]:
    return sorted(p for p in (ROOT / "benchmarks").glob("*.py") if p.stem != "common")


@pytest.mark.parametrize("script", _benchmark_scripts(), ids=lambda p: p.name)
def test_every_benchmark_has_a_results_page(script: Path) -> None:
    page = DOCS / "results" / f"{script.stem}.md"
    assert page.exists(), f"{_rel(page)} is missing: every script in benchmarks/ has a results page"
    text = page.read_text(encoding="utf-8")
    assert f"benchmarks/{script.name}" in text, f"{_rel(page)} must give the command that runs {script.name}"
    assert re.search(r"\b20\d\d-\d\d-\d\d\b", text) or "No figures in the repository" in text, (
        f"{_rel(page)} must give the date of its figures (or say 'No figures in the repository' and how to make them)")
    for link in re.findall(r"\]\(([^)\s]+\.(?:json|png))\)", text):
        assert (page.parent / link).resolve().is_file(), f"{_rel(page)} links {link}, which does not exist"


# ---------------------------------------------------------------------------- user-facing text
_CHRONOLOGY = re.compile(
    r"\b[Ss]ession[- ]?\d+|\bS\d{1,2}\b|\bprevious (default|kernel|version|session|run)s?\b|\bas before\b"
    r"|\bnow (restores|gives|uses|runs)\b|\bwe (tried|found)\b"
)


@pytest.mark.parametrize("path", DOC_FILES, ids=_rel)
def test_user_facing_text_tells_no_history(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    hits = [(n, m.group(0)) for n, line in enumerate(text.splitlines(), 1) for m in _CHRONOLOGY.finditer(line)]
    assert hits == [], f"{_rel(path)}: say what holds, not when it was found: {hits}"


def test_readme_links_resolve() -> None:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    links = [m for m in re.findall(r"\]\(([^)\s]+)\)", text) if not re.match(r"^[a-z]+:|#", m)]
    missing = [m for m in links if not (ROOT / m.split("#", 1)[0]).exists()]
    assert missing == [], f"README.md links to missing files: {missing}"


def test_readme_is_short() -> None:
    n = len((ROOT / "README.md").read_text(encoding="utf-8").splitlines())
    assert n <= 220, f"README.md has {n} lines; move details to docs/"


def test_every_docs_page_is_in_the_nav() -> None:
    def pages(node):
        if isinstance(node, str):
            yield node
        elif isinstance(node, list):
            for x in node:
                yield from pages(x)
        elif isinstance(node, dict):
            for x in node.values():
                yield from pages(x)

    nav = set(pages(yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))["nav"]))
    on_disk = {p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md")}
    assert sorted(on_disk - nav) == [], "pages missing from the nav of mkdocs.yml"
    assert sorted(nav - on_disk) == [], "nav entries of mkdocs.yml without a page"


_RAW_ROLE = re.compile(r":(?:py:)?(?:func|class|meth|attr|mod|data|exc|obj|const):")


@pytest.mark.heavy
def test_site_builds_strict_with_links_for_every_cross_reference(tmp_path: Path) -> None:
    """``mkdocs build --strict`` (every link resolves); no page shows a raw reST role (``:func:``...: the docstrings'
    cross-references are links or code, docs/_griffe_roles.py); the API page documents each name once."""
    import subprocess
    import sys

    site = tmp_path / "site"
    r = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
                       cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    raw = {p.relative_to(site).as_posix(): len(_RAW_ROLE.findall(p.read_text(encoding="utf-8")))
           for p in site.rglob("*.html")}
    assert {k: v for k, v in raw.items() if v} == {}
    api = (site / "api" / "index.html").read_text(encoding="utf-8")
    names = [i.rsplit(".", 1)[-1] for i in re.findall(r'<h2 id="([^"]+)"', api)]
    assert len(names) > 50 and sorted({n for n in names if names.count(n) > 1}) == []
    assert api.count('class="autorefs autorefs-internal"') > 50  # the cross-references became links
    _check_rendered_in_a_browser(site)


def _check_rendered_in_a_browser(site: Path) -> None:
    """The home page and the API page as a browser renders them (headless Chromium, the DOM after its scripts ran):
    titled, no raw role, the API page's sections there."""
    import shutil
    import subprocess

    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        pytest.skip("Chromium is not installed (.ci/run installs it from the Debian packages)")
    for page, must in (("index.html", "torch_bcfw"), ("api/index.html", "torch_bcfw.SolverOptions")):
        r = subprocess.run([browser, "--headless=new", "--no-sandbox", "--disable-gpu", "--dump-dom",
                            (site / page).as_uri()], capture_output=True, text=True, timeout=120)
        assert r.returncode == 0 and "<title>" in r.stdout, (page, r.stderr[-2000:])
        assert must in r.stdout and not _RAW_ROLE.search(r.stdout), page


# ---------------------------------------------------------------------------- documented timings
_TIMING = re.compile(r"\babout \d+(?:\.\d+)? (?:s|seconds|minutes)\b|\b\d+(?:\.\d+)? s for this fit\b"
                     r"|\b\d+ to \d+ s on\b")
_LOAD = re.compile(r"\b(?:idle|busy|load)\b")
_MACHINE = re.compile(r"\b(?:cores?|CPUs?|vCPU|GPU|H100|H200)\b")


def test_every_documented_timing_says_on_what_machine_and_load() -> None:
    """A user page's 'about N s' / 'N minutes' says, in its paragraph, the machine (cores, GPU) and its load
    (idle or busy): the same command takes several times as long on a shared machine. The results pages give
    their machine and load in their own header."""
    missing = []
    for path in DOC_FILES:
        if "results" in path.relative_to(DOCS if path != ROOT / "README.md" else ROOT).parts:
            continue
        for para in re.split(r"\n\s*\n", path.read_text(encoding="utf-8")):
            for m in _TIMING.finditer(para):
                if not (_LOAD.search(para) and _MACHINE.search(para)):
                    missing.append(f"{_rel(path)}: {m.group(0)!r}")
    assert missing == []


def test_the_docs_extra_formats_signatures_and_the_readme_sizes_the_checkpoint() -> None:
    """mkdocstrings formats signatures with Ruff or Black (else ``mkdocs build`` warns): the docs extra installs ruff;
    the README says what ``checkpoint.safetensors`` holds and weighs next to ``model.safetensors``."""
    import tomllib

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["optional-dependencies"]
    assert any(dep.split(">")[0].split("=")[0].strip() in ("ruff", "black") for dep in extras["docs"])
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert re.search(r"`checkpoint\.safetensors` the full state[^.]*\(with the dual state: \d+ MB for OCR-large\)",
                     readme)
