"""Modules from the notebook's own folder, shipped as source and imported on the cluster.

A notebook's ``helpers.py`` (or a local package) is importable in the kernel and
nowhere else. The kernel sends its source with the cells that need it (see
:mod:`jupyter_cluster._modules`); each process that runs such a cell installs it
under its own name with a finder at the front of ``sys.meta_path``, so ``import
helpers``, a function pickled by reference as ``helpers.double``, and objects of
``helpers.Point`` all work there as in the notebook, in both directions. A new
version (another digest) replaces the old one; compiled code never travels this way.
Only the standard library is used here.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import threading
import types
from collections.abc import Iterable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class ModuleSource:
    """A top-level module or package of the notebook's, as source files.

    ``files`` holds ``(module name, file name, is package, source)`` for the module
    and, for a package, each of its submodules (a namespace package has no file
    name and no source); ``digest`` changes with any of them.
    """

    name: str
    digest: str
    files: tuple[tuple[str, str, bool, str], ...]


class ShippedSourceFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds and loads the shipped modules; other names fall through to the usual finders."""

    def __init__(self) -> None:
        self.files: dict[str, tuple[str, bool, str]] = {}

    def find_spec(
        self, fullname: str, path: Sequence[str] | None = None, target: types.ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        entry = self.files.get(fullname)
        if entry is None:
            return None
        filename, is_package, _ = entry
        spec = importlib.machinery.ModuleSpec(fullname, self, origin=filename or None, is_package=is_package)
        spec.has_location = bool(filename)  # a namespace package has no file
        return spec

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType | None:
        return None  # the default module object

    def exec_module(self, module: types.ModuleType) -> None:
        filename, _, source = self.files[module.__name__]
        if filename:
            module.__file__ = filename
        exec(compile(source, filename or f"<{module.__name__}>", "exec", dont_inherit=True), module.__dict__)

    def get_source(self, fullname: str) -> str:
        return self.files[fullname][2]


_finder = ShippedSourceFinder()
_installed: dict[str, str] = {}
_lock = threading.Lock()


def install_sources(sources: Iterable[ModuleSource]) -> None:
    """Make each shipped module importable here, in the version given."""
    with _lock:
        for source in sources:
            if _installed.get(source.name) == source.digest:
                continue
            prefix = source.name + "."
            # Whatever this process imported under that name before is another version.
            for name in [n for n in sys.modules if n == source.name or n.startswith(prefix)]:
                del sys.modules[name]
            for name in [n for n in _finder.files if n == source.name or n.startswith(prefix)]:
                del _finder.files[name]
            for module, filename, is_package, text in source.files:
                _finder.files[module] = (filename, is_package, text)
            _installed[source.name] = source.digest
        if _installed and (not sys.meta_path or sys.meta_path[0] is not _finder):
            if _finder in sys.meta_path:
                sys.meta_path.remove(_finder)
            sys.meta_path.insert(0, _finder)


__all__ = ["ModuleSource", "ShippedSourceFinder", "install_sources"]
