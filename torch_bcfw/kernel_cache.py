"""numba's on-disk cache of this package's kernels, keyed so that an edited kernel never runs stale.

numba caches a compiled function (``cache=True``) under a stamp of its own source file only.  A kernel that inlines
or calls kernels of other modules (the chain's step loop and its block operations, the graph cut's loop and the
batched oracle's gains) would keep running the old code after an edit of those modules.  :func:`install` puts a cache
locator in front of numba's own for the functions of this package: the cache lives where numba would put it (beside
the module, or under ``NUMBA_CACHE_DIR``), and its stamp adds a digest of the source of every module of the package
that imports numba (the only modules whose code or constants a kernel can compile in).  Any edit of such a module
invalidates every cached kernel of the package once; functions outside the package keep numba's own locators.
"""
from __future__ import annotations

import hashlib
from pathlib import Path

from numba.core import caching

__all__ = ["install", "kernel_sources_digest", "PACKAGE"]

#: the package's directory: the functions defined below it are cached with the package's digest
PACKAGE = Path(__file__).resolve().parent

_digest: str | None = None


def kernel_sources_digest() -> str:
    """SHA-256 over the path and text of every module of the package that imports numba (computed once)."""
    global _digest
    if _digest is None:
        h = hashlib.sha256()
        for path in sorted(PACKAGE.rglob("*.py")):
            text = path.read_bytes()
            if b"numba" in text:
                h.update(str(path.relative_to(PACKAGE)).encode() + b"\0" + text + b"\0")
        _digest = h.hexdigest()
    return _digest


class PackageKernelLocator(caching._CacheLocator):
    """numba's own locator for a function of this package (the first of numba's that accepts it), with the package's
    :func:`kernel_sources_digest` added to the function's source stamp."""

    def __init__(self, inner):
        self._inner = inner
        self._py_file = inner._py_file

    def ensure_cache_path(self):
        self._inner.ensure_cache_path()

    def get_cache_path(self):
        return self._inner.get_cache_path()

    def get_source_stamp(self):
        return self._inner.get_source_stamp(), kernel_sources_digest()

    def get_disambiguator(self):
        return self._inner.get_disambiguator()

    @classmethod
    def from_function(cls, py_func, py_file):
        try:
            Path(py_file).resolve().relative_to(PACKAGE)
        except (ValueError, OSError):
            return None
        for base in caching.CacheImpl._locator_classes:
            if base is not cls:
                inner = base.from_function(py_func, py_file)
                if inner is not None:
                    return cls(inner)
        return None


def install() -> None:
    """Put :class:`PackageKernelLocator` first in numba's locators (idempotent).  Must run before the package's
    kernels are defined: ``torch_bcfw/__init__.py`` calls it first."""
    if PackageKernelLocator not in caching.CacheImpl._locator_classes:
        caching.CacheImpl._locator_classes.insert(0, PackageKernelLocator)
