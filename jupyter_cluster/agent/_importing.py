"""How the agent, and the embedded cluster's other processes, import Ray: without a grammar nothing uses.

Ray imports jsonschema (to check runtime_envs), and jsonschema imports ``rfc3987_syntax``
where it is installed (Jupyter's packages install it) for its ``iri`` format checker. That
import builds an Earley parser: 0.77 s of the 1.04 s that ``import ray`` took on a 2-core
machine, and 10 MiB, in every process. The agent imports Ray through :func:`import_ray`
on every head; the embedded cluster's processes get ``_site/sitecustomize.py`` first on
their ``PYTHONPATH`` (:func:`lean_pythonpath`), which does the same for them. The two are
apart because that file runs before anything of this package can be imported, and this
module is shipped to heads that lack the package, where ``_site`` is not.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import types
from typing import Any


def import_ray() -> Any:
    """``import ray``, jsonschema given an ``iri`` checker that imports ``rfc3987_syntax`` the first time it checks
    one; anything else that imports the package gets the package itself."""
    if "jsonschema" in sys.modules or importlib.util.find_spec("rfc3987_syntax") is None:
        import ray

        return ray
    stand_in = types.ModuleType("rfc3987_syntax")

    def is_valid_syntax(term: str, value: str) -> bool:
        from rfc3987_syntax import is_valid_syntax as check

        return bool(check(term, value))

    stand_in.is_valid_syntax = is_valid_syntax  # type: ignore[attr-defined]
    sys.modules["rfc3987_syntax"] = stand_in
    try:
        import ray
    finally:
        if sys.modules.get("rfc3987_syntax") is stand_in:
            del sys.modules["rfc3987_syntax"]
    return ray


#: The folder of the ``sitecustomize`` that does for other processes what :func:`import_ray` does here.
LEAN_SITE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_site")


def lean_pythonpath(pythonpath: str | None) -> str:
    """``pythonpath`` (a ``PYTHONPATH`` value, or None) with :data:`LEAN_SITE` first."""
    return os.pathsep.join([LEAN_SITE, *filter(None, [pythonpath])])
