"""A cell's source, wherever its code runs: printed tracebacks show the cell's lines on every worker.

A cell's code objects carry a filename that names the cell (``<remote-cell-…>``, see
:func:`._execute.cell_filename`), and the process that compiles a cell puts its lines in :mod:`linecache`. A
function or class that a cell defines travels by value (cloudpickle) to workers that never compiled that cell:
there a traceback that the user's code prints (``traceback.print_exc()``, ``logging.exception``, a library's own
error report) would show the frame and no line, where ``python`` shows the line.

So the agent publishes each cell's source in Ray's key-value store (the GCS, which every worker of the cluster
reaches), once per distinct source, off its event loop; and every worker of the agent's job (Ray's
``worker_process_setup_hook``) lets :mod:`linecache` ask that store for a cell's lines it does not have.
"""

from __future__ import annotations

import linecache
import logging
from collections import OrderedDict
from typing import Any

log = logging.getLogger("jupyter_cluster.agent")

#: The key-value store's namespace, and what a cell's key starts with.
NAMESPACE = "jupyter_cluster"
PREFIX = "<remote-cell-"
#: Sources the agent remembers having published (a cell run again is not published again).
REMEMBERED = 4096

_published: OrderedDict[str, None] = OrderedDict()
_installed = False


def _key(filename: str) -> bytes:
    return f"cell-source:{filename}".encode()


def publish(filename: str, source: str) -> None:
    """Put ``source`` in the cluster's store under ``filename`` (blocking: call it off the event loop)."""
    if filename in _published:
        _published.move_to_end(filename)
        return
    try:
        from ray.experimental.internal_kv import _internal_kv_put

        _internal_kv_put(_key(filename), source.encode(), overwrite=False, namespace=NAMESPACE)
    except Exception:  # a traceback without lines is the worst of it
        log.debug("could not publish the source of %s", filename, exc_info=True)
        return
    _published[filename] = None
    while len(_published) > REMEMBERED:
        _published.popitem(last=False)


def _fetch(filename: str) -> str | None:
    try:
        from ray.experimental.internal_kv import _internal_kv_get, _internal_kv_initialized

        if not _internal_kv_initialized():
            return None
        found = _internal_kv_get(_key(filename), namespace=NAMESPACE)
    except Exception:
        return None
    return found.decode(errors="replace") if found else None


def install() -> None:
    """Let :mod:`linecache` in this process find a cell's lines in the cluster's store."""
    global _installed
    if _installed:
        return
    original = linecache.updatecache

    def updatecache(filename: str, module_globals: Any = None) -> list[str]:
        if filename.startswith(PREFIX):
            source = _fetch(filename)
            if source is not None:
                lines = source.splitlines(True)
                linecache.cache[filename] = (len(source), None, lines, filename)
                return lines
        return original(filename, module_globals)

    updatecache.__wrapped__ = original  # type: ignore[attr-defined]
    linecache.updatecache = updatecache
    _installed = True


__all__ = ["install", "publish"]
