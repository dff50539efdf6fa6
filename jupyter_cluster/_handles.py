"""Handles: the notebook's names for values that stay on the cluster.

An :class:`ObjectHandle` stands for an object in Ray's object store: a large cell
output, a ``jc.put``, a ``jc.submit`` result, or an ``--async`` output not computed
yet (a *pending* handle, which resolves in place). A later ``%%remote`` cell that
reads a handle gets the object straight from the object store, and Ray waits for a
pending one as a task dependency. When the last reference to a handle goes, the
agent is told to let go of the object.
"""

from __future__ import annotations

import re
import threading
import time
import weakref
from typing import Any, Protocol

from ._errors import ClusterConnectionError


class HandleOwner(Protocol):
    """What a handle needs of the cluster that made it (a :class:`._cluster.Cluster`, which sits above)."""

    kind: str

    @property
    def session(self) -> str: ...

    def _release(self, handle_id: str) -> None: ...

    def _unreachable(self) -> str | None: ...


#: How often a wait on a pending handle checks that its cluster is still there.
_POLL = 0.25

_UNITS = {
    "": 1,
    "b": 1,
    "k": 10**3,
    "kb": 10**3,
    "m": 10**6,
    "mb": 10**6,
    "g": 10**9,
    "gb": 10**9,
    "t": 10**12,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}


def parse_size(text: str | int | float) -> int:
    """Bytes in a size such as ``"2GiB"``, ``"500 MB"``, ``"1e9"`` or ``4096``.

    >>> parse_size("1.5 GiB")
    1610612736
    """
    if isinstance(text, (int, float)):
        return int(text)
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:e[0-9]+)?)\s*([a-zA-Z]*)\s*", text)
    unit = match.group(2).lower() if match else ""
    if match is None or unit not in _UNITS:
        raise ValueError(f"{text!r} is not a size: write e.g. 512MiB, 2GB or 1e9 (bytes)")
    return int(float(match.group(1)) * _UNITS[unit])


def format_size(nbytes: float) -> str:
    """``7.6 MiB`` for 8_000_000."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(nbytes) < 1024 or unit == "TiB":
            return f"{nbytes:.0f} {unit}" if unit == "B" else f"{nbytes:.1f} {unit}"
        nbytes /= 1024
    raise AssertionError("unreachable")


def format_duration(seconds: float) -> str:
    """``3.2 s``, ``4 min 05 s``, ``2 h 03 min``: how every view and result says a time."""
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes} min {secs:02d} s" if minutes < 60 else f"{minutes // 60} h {minutes % 60:02d} min"


def format_metric(value: Any) -> str:
    """``0.9778``: how every view and result says a metric (a float to 4 significant digits; anything else as it
    is), so that one metric shown in two places (a run's widget, the sidebar, its result) is one number."""
    return f"{value:.4g}" if isinstance(value, float) else str(value)


class ObjectHandle:
    """A value held in the cluster's object store.

    >>> big                                            # doctest: +SKIP
    <remote ndarray float64 (2000, 1000) 15.3 MiB on 10.0.0.2>
    >>> jc.get(big).shape                              # doctest: +SKIP
    (2000, 1000)
    """

    def __init__(
        self,
        handle_id: str,
        meta: dict[str, Any] | None = None,
        *,
        cluster: HandleOwner | None = None,
        name: str = "",
        pending: bool = False,
        label: str = "",
    ) -> None:
        self.id = handle_id
        self.meta = dict(meta or {})
        self.name = name
        #: The cell that computes it ("Cell In[5]"), for a pending handle.
        self.label = label
        #: The cluster that holds it: only that cluster's cells and calls can use it.
        self.cluster = cluster
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._value: Any = _NOTHING
        if not pending:
            self._ready.set()
        if cluster is not None:
            weakref.finalize(self, cluster._release, handle_id)

    def __reduce__(self) -> Any:
        raise TypeError(
            "a handle to a remote value can travel as a variable of its own, or in a list or "
            "tuple of them, but not inside another object"
        )

    @property
    def pending(self) -> bool:
        """True until the cell that computes it has finished."""
        return not self._ready.is_set()

    def _resolve(self, meta: dict[str, Any] | None = None, value: Any = None, has_value: bool = False) -> None:
        if meta:
            self.meta.update(meta)
        if has_value:
            self._value = value
        self._ready.set()

    def _fail(self, error: BaseException) -> None:
        self._error = error
        self._ready.set()

    @property
    def error(self) -> BaseException | None:
        """Why the value will never come: the failure of the cell that was to compute it."""
        return self._error

    def wait(self, timeout: float | None = None) -> bool:
        """Block until resolved (False if ``timeout`` passes first); re-raise the computing
        cell's failure. Ends at once, with an error, if the handle's cluster is gone."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._ready.is_set():
            gone = self.cluster._unreachable() if self.cluster is not None else None
            if gone is not None:
                raise ClusterConnectionError(f"`{self.name or self.id}` cannot arrive: {gone}")
            left = _POLL if deadline is None else min(_POLL, deadline - time.monotonic())
            if left <= 0:
                return False
            self._ready.wait(left)
        if self._error is not None:
            raise self._error
        return True

    @property
    def local_value(self) -> Any:
        """The value, if it already came back to the notebook (small outputs)."""
        return None if self._value is _NOTHING else self._value

    @property
    def has_local_value(self) -> bool:
        return self._value is not _NOTHING

    def __repr__(self) -> str:
        if self._error is not None:
            of = f" of {self.label}" if self.label else ""
            return f"<remote `{self.name}`{of}: failed ({type(self._error).__name__})>"
        if self.pending:
            label = f" `{self.name}`" if self.name else ""
            return f"<pending remote value{label} of cell {self.id.split('/')[0]}>"
        meta = self.meta
        parts = [meta.get("type", "object").rsplit(".", 1)[-1]]
        if "dtype" in meta:
            parts.append(str(meta["dtype"]))
        if "shape" in meta:
            parts.append(str(tuple(meta["shape"])))
        elif "len" in meta:
            parts.append(f"len={meta['len']}")
        if "nbytes" in meta:
            parts.append(format_size(meta["nbytes"]))
        where = f" on {meta['node']}" if meta.get("node") else ""
        return f"<remote {' '.join(parts)}{where}>"


class _Nothing:
    pass


_NOTHING = _Nothing()
