"""Modules on both sides: the notebook's own, shipped as source; the cluster's, named lazily.

Installed packages travel by name: the cluster imports its own copy. A module of the
notebook's own (``helpers.py`` beside the notebook, a local package, anything imported
from outside the Python installation's folders) exists only here, so a cell that needs
it gets its source: when the cell reads it, imports it, or reads a value whose pickle
names it (a function ``from helpers import f``, an object of ``helpers.Point``).
The cluster installs it under its own name (:mod:`.agent.cells._sources`). A local package
with compiled code, or too large to send, cannot travel: the cell is refused, naming it.

The other way, a module a remote cell imports that this kernel has not loaded becomes
a :class:`LazyModule`: a later cell reads it by name, and the kernel loads the real
module only when the notebook itself uses it.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.machinery
import os
import re
import site
import sys
import sysconfig
import types
from collections.abc import Iterable
from typing import Any

from ._errors import InputError
from .agent.cells._sources import ModuleSource

#: A package larger than this (in source) is not sent with cells.
MAX_SOURCE = 8 << 20
MAX_FILES = 2000
_OURS = os.path.dirname(os.path.abspath(__file__))
#: A module name as a pickle stores it: SHORT_BINUNICODE, then MEMOIZE.
_NAME_IN_PICKLE = re.compile(rb"\x8c(.)([A-Za-z_][A-Za-z0-9_.]*)\x94", re.DOTALL)


class LazyModule(types.ModuleType):
    """A module a remote cell imported that this kernel had not loaded.

    A later ``%%remote`` cell that reads it gets the cluster's module by name; the
    notebook loads the real one on first use of an attribute (a remote ``import
    torch`` must not load torch into the kernel by itself).
    """

    def __getattr__(self, attribute: str) -> Any:
        if attribute.startswith("_"):  # IPython's display probes must not load it
            raise AttributeError(attribute)
        try:
            module = importlib.import_module(self.__name__)
        except ImportError as exc:
            raise AttributeError(
                f"module {self.__name__!r} was imported on the cluster and cannot be loaded in the "
                f"notebook ({exc}); use it in %%remote cells, or install it here"
            ) from None
        return getattr(module, attribute)

    def __repr__(self) -> str:
        return f"<module {self.__name__!r} (imported on the cluster; loaded here on first use)>"


def _system_dirs() -> tuple[str, ...]:
    """The folders of the Python installation: what is there is installed, not the notebook's."""
    found = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix}
    found.update(v for k, v in sysconfig.get_paths().items() if k in ("stdlib", "platstdlib", "purelib", "platlib"))
    try:
        found.update(site.getsitepackages())
        found.add(site.getusersitepackages())
    except AttributeError:  # some virtualenvs' site module
        pass
    return tuple(os.path.join(os.path.realpath(d), "") for d in found if d)


def module_names_in(data: bytes) -> set[str]:
    """Top-level module names a pickle refers to (by reference, as cloudpickle writes them)."""
    names = set()
    for match in _NAME_IN_PICKLE.finditer(data):
        text = match.group(2)
        if len(text) == match.group(1)[0]:
            names.add(text.split(b".", 1)[0].decode())
    return names


class NotebookModules:
    """Finds the notebook's own modules among those loaded, and packs their source."""

    def __init__(self) -> None:
        self._system = _system_dirs()
        self._seen = -1
        self._local: dict[str, str] = {}  # top-level name -> its file or folder
        self._packed: dict[str, tuple[tuple[Any, ...], ModuleSource | str]] = {}

    def local(self) -> dict[str, str]:
        """Top-level modules of the notebook's own that the kernel has loaded."""
        if len(sys.modules) != self._seen:
            self._seen = len(sys.modules)
            self._local = {}
            for name, module in list(sys.modules.items()):
                if "." in name or name in ("__main__", "jupyter_cluster"):
                    continue
                path = self._path(module)
                if path is not None:
                    self._local[name] = path
        return self._local

    def _path(self, module: Any) -> str | None:
        file = getattr(module, "__file__", None)
        if not isinstance(file, str) or isinstance(module, LazyModule):
            return None
        real = os.path.realpath(file)
        if real.startswith(self._system) or real.startswith(os.path.join(_OURS, "")):
            return None
        is_package = os.path.basename(real).startswith("__init__.")
        return os.path.dirname(real) if is_package else real

    def for_cell(self, modules: Iterable[str], imports: Iterable[str], pickles: Iterable[bytes]) -> list[ModuleSource]:
        """The sources a cell needs: of the local modules it reads, imports, or whose
        names its inputs' pickles hold. Raises :class:`InputError` for one that cannot travel."""
        local = self.local()
        if not local:
            return []
        wanted = {m.split(".", 1)[0] for m in modules} | set(imports)
        for data in pickles:
            wanted |= module_names_in(data)
        needed = []
        for name in sorted(wanted & local.keys()):
            packed = self._pack(name, local[name])
            if isinstance(packed, str):
                raise InputError(
                    f"the cell needs `{name}`, a module from the notebook's own folder ({local[name]}), "
                    f"which cannot travel: {packed}. Install it on the cluster's machines (e.g. `pip install` "
                    "there), or leave it out of remote cells. Nothing was sent."
                )
            needed.append(packed)
        return needed

    def _pack(self, name: str, path: str) -> ModuleSource | str:
        files = _source_files(name, path)
        if isinstance(files, str):
            return files
        stamp = tuple((f, *_stat(f)) for _, f, _ in files if f)
        cached = self._packed.get(name)
        if cached is not None and cached[0] == stamp:
            return cached[1]
        packed: ModuleSource | str
        total = sum(size for _, _, size in stamp)
        if total > MAX_SOURCE or len(files) > MAX_FILES:
            packed = f"it is too large to send with cells ({total / 2**20:.1f} MiB in {len(files)} files)"
        else:
            entries = []
            digest = hashlib.sha256()
            for module, filename, is_package in files:
                text = ""
                if filename:
                    with open(filename, encoding="utf-8", errors="surrogateescape") as f:
                        text = f.read()
                entries.append((module, filename, is_package, text))
                digest.update(f"{module}\0{text}\0".encode(errors="surrogateescape"))
            packed = ModuleSource(name, digest.hexdigest()[:32], tuple(entries))
        self._packed[name] = (stamp, packed)
        return packed


def _stat(path: str) -> tuple[int, int]:
    info = os.stat(path)
    return info.st_mtime_ns, info.st_size


def _source_files(name: str, path: str) -> list[tuple[str, str, bool]] | str:
    """``(module, file, is package)`` for a module file or a package folder, or why it cannot travel."""
    compiled = tuple(importlib.machinery.EXTENSION_SUFFIXES)
    if os.path.isfile(path):
        if not path.endswith(".py"):
            return f"it is compiled code ({os.path.basename(path)}), which cannot travel as source"
        return [(name, path, False)]
    found: list[tuple[str, str, bool]] = []
    for folder, dirs, names in os.walk(path):
        dirs[:] = sorted(d for d in dirs if not d.startswith((".", "__pycache__")))
        rel = os.path.relpath(folder, path)
        module = name if rel == "." else f"{name}.{rel.replace(os.sep, '.')}"
        binary = [n for n in names if n.endswith(compiled)]
        if binary:
            shown = os.path.join(os.path.basename(path), os.path.relpath(os.path.join(folder, binary[0]), path))
            return f"it contains compiled code ({shown}), which cannot travel as source"
        init = os.path.join(folder, "__init__.py")
        # A folder without __init__.py is a namespace package: an empty module stands for it.
        found.append((module, init if os.path.exists(init) else "", True))
        for filename in sorted(n for n in names if n.endswith(".py") and n != "__init__.py"):
            found.append((f"{module}.{filename[:-3]}", os.path.join(folder, filename), False))
        if len(found) > MAX_FILES:
            break
    return found


__all__ = ["LazyModule", "NotebookModules", "module_names_in"]
