"""MkDocs hook: links from the docs to repository files outside ``docs/`` (benchmark JSON, plots, configs,
examples) work both on the repository browser and in the built site.

A page links a repository file by its relative path, e.g. ``[JSON](../../benchmarks/results/ocr_speed.json)``
from ``docs/results/ocr_speed.md``.  This hook copies every such file that exists into the site under
``repo/<path>`` and rewrites the link to it; a link to a file that does not exist is left alone, so
``mkdocs build --strict`` reports it.
"""
from __future__ import annotations

import posixpath
import re
from pathlib import Path

from mkdocs.structure.files import File

_LINK = re.compile(r"(\]\()([^)\s]+)(\))")
_PREFIX = "repo"
_outside: dict[str, str] = {}  # repository-relative path -> src_uri in the site


def _target(page_src_uri: str, link: str, docs_dir: Path, root: Path) -> str | None:
    """The repository-relative path of ``link`` when it leaves ``docs/`` and names an existing file."""
    if re.match(r"^[a-z][a-z0-9+.-]*:", link) or link.startswith(("#", "/")):
        return None
    path = link.split("#", 1)[0]
    if not path:
        return None
    resolved = (docs_dir / posixpath.dirname(page_src_uri) / path).resolve()
    try:
        resolved.relative_to(docs_dir)
        return None  # inside docs/: MkDocs handles it
    except ValueError:
        pass
    try:
        rel = resolved.relative_to(root)
    except ValueError:
        return None
    return rel.as_posix() if resolved.is_file() else None


def on_files(files, config):
    docs_dir = Path(config["docs_dir"]).resolve()
    root = docs_dir.parent
    _outside.clear()
    for f in list(files.documentation_pages()):
        text = Path(f.abs_src_path).read_text(encoding="utf-8")
        for m in _LINK.finditer(text):
            rel = _target(f.src_uri, m.group(2), docs_dir, root)
            if rel is not None and rel not in _outside:
                uri = f"{_PREFIX}/{rel}"
                _outside[rel] = uri
                files.append(File.generated(config, uri, abs_src_path=str(root / rel)))
    return files


def on_page_markdown(markdown, page, config, files):
    docs_dir = Path(config["docs_dir"]).resolve()
    root = docs_dir.parent

    def rewrite(m):
        link = m.group(2)
        rel = _target(page.file.src_uri, link, docs_dir, root)
        if rel is None or rel not in _outside:
            return m.group(0)
        anchor = link[len(link.split("#", 1)[0]):]
        new = posixpath.relpath(_outside[rel], posixpath.dirname(page.file.src_uri) or ".")
        return f"{m.group(1)}{new}{anchor}{m.group(3)}"

    return _LINK.sub(rewrite, markdown)
