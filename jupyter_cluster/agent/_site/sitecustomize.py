"""Run at start by every Python process of the embedded cluster: its folder is first on their ``PYTHONPATH``.

Ray imports jsonschema, and jsonschema imports ``rfc3987_syntax`` where it is installed
(Jupyter's packages install it) for its ``iri`` format checker. That import builds an
Earley parser: 0.77 s of CPU and 10 MiB in every process that imports Ray, on a 2-core
machine where a worker took 1.4 s to start. Here the package stands in unbuilt: the first
IRI check, or anything else that uses the package, imports it then, and the package is
itself from then on. The agent does the same for its own ``import ray``
(``jupyter_cluster.agent._importing.import_ray``).

Then the ``sitecustomize`` this one is in front of, if there is one, runs as it would have.
Nothing here may stop a process from starting: any failure leaves things as they were.
"""

import importlib
import importlib.machinery
import importlib.util
import os
import sys
import types
from typing import Any

_NAME = "rfc3987_syntax"


class _StandIn(types.ModuleType):
    """``rfc3987_syntax`` before its first use: any attribute imports the package and is read from it."""

    def __getattr__(self, name: str) -> Any:
        return getattr(_package(), name)


def _package() -> types.ModuleType:
    if sys.modules.get(_NAME) is _STAND_IN:
        del sys.modules[_NAME]
    return importlib.import_module(_NAME)


def _is_valid_syntax(term: str, value: str) -> Any:
    return _package().is_valid_syntax(term, value)


_STAND_IN: Any = None
try:
    if _NAME not in sys.modules:
        _spec = importlib.util.find_spec(_NAME)
        if _spec is not None:
            _STAND_IN = _StandIn(_NAME)
            _STAND_IN.__spec__ = _spec
            # A package's path, so that `from rfc3987_syntax import x` (which asks for it) and the import of a
            # submodule need not import the package itself.
            if _spec.submodule_search_locations is not None:
                _STAND_IN.__path__ = _spec.submodule_search_locations
            _STAND_IN.is_valid_syntax = _is_valid_syntax
            sys.modules[_NAME] = _STAND_IN
except Exception:
    pass


def _chain() -> None:
    """Run the ``sitecustomize`` found further along the path, as Python would have without this one."""
    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["sitecustomize"] = module
    spec.loader.exec_module(module)


try:
    _chain()
except Exception as error:  # as Python's site module says it of a sitecustomize that fails
    sys.stderr.write(f"Error in sitecustomize; set PYTHONVERBOSE for traceback:\n{type(error).__name__}: {error}\n")
