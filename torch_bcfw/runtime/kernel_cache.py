"""numba's on-disk cache of this package's kernels, keyed so that an edited kernel never runs stale.

numba stamps a cached function (``cache=True``) with its own source file only, so a kernel that calls kernels of
other modules would run stale code after an edit of those.  :func:`install` puts a locator in front of numba's own
for this package's functions: numba's cache folder with a subfolder named by a digest of every package module that
imports numba, the digest also added to the stamp.  A changed package (an upgrade, an edit) therefore never reads an
index written by another version: numba unpickles an index before it compares stamps, and an index that names a
renamed type would fail to load instead of counting as a miss.
"""
from __future__ import annotations

import hashlib
import os
from pathlib import Path

from numba.core import caching

__all__ = ["install", "kernel_sources_digest", "PACKAGE"]

#: the package's directory: the functions defined below it are cached with the package's digest
PACKAGE = Path(__file__).resolve().parent.parent

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
        caching._CacheLocator.ensure_cache_path(self)

    def get_cache_path(self):
        return os.path.join(self._inner.get_cache_path(), "kernels-" + kernel_sources_digest()[:16])

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
                    self = cls(inner)
                    try:
                        self.ensure_cache_path()
                    except OSError:  # as numba's own locators: no writable cache folder, no cache
                        return None
                    return self
        return None


def install() -> None:
    """Put :class:`PackageKernelLocator` first in numba's locators (idempotent).  Must run before the package's
    kernels are defined: ``torch_bcfw/__init__.py`` calls it first."""
    if PackageKernelLocator not in caching.CacheImpl._locator_classes:
        caching.CacheImpl._locator_classes.insert(0, PackageKernelLocator)
