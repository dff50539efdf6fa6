"""jupyter_cluster: a notebook as the control room of a Ray cluster.

``%load_ext jupyter_cluster`` registers ``%cluster`` and ``%%remote``; the same
things are reachable from Python:

>>> import jupyter_cluster as jc             # doctest: +SKIP
>>> cluster = jc.local(cpus=2)               # doctest: +SKIP
>>> h = jc.submit(sum, [1, 2, 3])            # doctest: +SKIP
>>> jc.get(h)                                # doctest: +SKIP
6
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, cast

from ._cell import CellResult, RemoteCell, RemoteRepr
from ._cluster import Cluster, ClusterStatus, current, local
from ._cluster import attached as _attached
from ._connect import connect, up
from ._errors import (
    AgentLostError,
    CellInterrupted,
    CellSourceError,
    CellTimeoutError,
    ClusterConnectionError,
    ClusterError,
    InputError,
    LinkLostError,
    MissingOutputError,
    RemoteError,
    RequestError,
    WaitTimeoutError,
    WorkerDiedError,
)
from ._handles import ObjectHandle
from ._runs import Checkpoint, Run, RunError, TrainResult, TuneResult, train_torch, tune
from ._sync import SyncError, SyncResult
from ._version import __version__ as __version__
from ._views import use as _use_views
from .agent.runs._space import SpaceError, choice, grid_search, loguniform, randint, uniform
from .widgets import NotebookViews as _NotebookViews

if TYPE_CHECKING:
    from IPython.core.interactiveshell import InteractiveShell

# The API draws with the widgets, which sit above it: handed down here, at the top.
_use_views(_NotebookViews())


def submit(
    fn: Callable[..., Any],
    *args: Any,
    cpus: float | None = None,
    gpus: float | None = None,
    memory: int | str | None = None,
    resources: dict[str, float] | None = None,
    runtime_env: dict[str, Any] | None = None,
) -> ObjectHandle:
    """Run ``fn(*args)`` as a Ray task on the attached cluster (see :meth:`Cluster.submit`);
    ``runtime_env`` is Ray's (``{"pip": [...]}``), over the session's."""
    cluster = _attached()
    return cluster.submit(fn, *args, cpus=cpus, gpus=gpus, memory=memory, resources=resources, runtime_env=runtime_env)


def map(  # noqa: A001 (the mirror of Ray's API, as jc.map)
    fn: Callable[..., Any],
    *iterables: Iterable[Any],
    cpus: float | None = None,
    gpus: float | None = None,
    runtime_env: dict[str, Any] | None = None,
    progress: bool | None = None,
) -> list[ObjectHandle]:
    """One task per element, like ``[f.remote(x) for x in xs]``, with a progress bar in a
    notebook (``progress=False``: none; see :meth:`Cluster.map`)."""
    return _attached().map(fn, *iterables, cpus=cpus, gpus=gpus, runtime_env=runtime_env, progress=progress)


def put(value: Any) -> ObjectHandle:
    """``ray.put`` from the notebook: store ``value`` on the cluster, return its handle."""
    return _attached().put(value)


def _owner(handles: Sequence[Any]) -> Cluster:
    """The cluster the handles belong to (the one that made the first), else the attached one."""
    for handle in handles:
        if isinstance(handle, ObjectHandle) and handle.cluster is not None:
            return cast(Cluster, handle.cluster)  # the only kind of owner a handle has
    return _attached()


def get(handle: ObjectHandle | Sequence[ObjectHandle], timeout: float | None = None) -> Any:
    """``ray.get`` from the notebook: fetch a handle's value (or a list of them).

    A :class:`Checkpoint` (of ``jc.train_torch`` or ``jc.tune``) is copied here: its
    files land in a local folder, which is returned."""
    if isinstance(handle, Checkpoint):
        return handle.to_directory()
    if not isinstance(handle, (ObjectHandle, list, tuple)):
        return handle  # already a value: what a resolved small output is
    return _owner(handle if isinstance(handle, (list, tuple)) else [handle]).get(handle, timeout)


def wait(
    handles: Sequence[ObjectHandle],
    num_returns: int = 1,
    timeout: float | None = None,
    progress: bool | None = None,
) -> tuple[list[ObjectHandle], list[ObjectHandle]]:
    """``ray.wait`` from the notebook: ``(ready, not_ready)``; a long wait on several
    handles shows a progress bar (``progress=False``: none; see :meth:`Cluster.wait`)."""
    return _owner(handles).wait(handles, num_returns, timeout, progress)


def dashboard(window: float = 300.0, prometheus: str | bool | None = None) -> Any:
    """A live dashboard of the attached cluster: each node's object store, CPU, RAM and
    GPUs (the head and the first nodes by address, 32 at most), the whole cluster over the
    last ``window`` seconds, tasks and actors by state.

    Sampling runs on the agent only while a dashboard is open; ``dashboard.close()``
    stops it (when no other dashboard watches) and leaves a static snapshot.
    ``prometheus``: read the figures from this Prometheus server (a URL as the head
    reaches it), or never (``False``); see :meth:`Cluster.metrics_source`. Unset, a server
    where Ray's ``RAY_PROMETHEUS_HOST`` points is used once it has the cluster's nodes.

    >>> jc.dashboard(prometheus="http://localhost:9090")      # doctest: +SKIP
    """
    from .widgets import Dashboard

    cluster = _attached()
    if prometheus is not None:
        cluster.metrics_source(prometheus)
    return Dashboard(cluster, window=window)


def timeline(cell: Any = None) -> Any:
    """The tasks and actor calls a ``%%remote`` cell ran, from Ray's task events: a :class:`Timeline` (a Gantt, a
    lane per worker; ``.spans`` a DataFrame; ``.to_chrome_trace(path)`` for Perfetto). ``cell``: the last cell run
    (None), the cell ``In[N]`` (``N``), or a :class:`RemoteCell`.

    >>> jc.timeline()                       # doctest: +SKIP
    >>> jc.timeline(5).spans.head()         # doctest: +SKIP
    """
    from .widgets import Timeline

    return Timeline(_attached().timeline(cell))


def forward(port: int, local: int | None = None) -> str:
    """Reach ``port`` on the head's loopback (Ray Serve, TensorBoard) from this machine:
    an SSH port forward, or the port itself on the embedded cluster; returns the URL
    here (see :meth:`Cluster.forward`).

    >>> jc.forward(8000)                      # doctest: +SKIP
    'http://127.0.0.1:8000'
    """
    return _attached().forward(port, local)


def sync(path: str | None = None, exclude: str | Iterable[str] = (), max_size: int | str = "100MiB") -> SyncResult:
    """Send ``path`` (default: the notebook's folder) to the head; later cells run in it on
    every node (Ray's ``working_dir``); a second sync sends only what changed (see :meth:`Cluster.sync`).

    >>> jc.sync(exclude=["*.parquet"])          # doctest: +SKIP
    """
    return _attached().sync(path, exclude, max_size)


def load_ipython_extension(ipython: InteractiveShell) -> None:
    """``%load_ext jupyter_cluster``: register the magics (``%debug`` opens a failed remote cell's frames), and the
    JupyterLab sidebar's comm."""
    from ._magics import ClusterMagics, install_debug
    from ._sidebar import Sidebar

    ipython.register_magics(ClusterMagics)
    install_debug(ipython)
    Sidebar.install(ipython)


def __getattr__(name: str) -> Any:
    # The widgets' classes, imported when first asked for (they import ipywidgets and Bokeh).
    if name in ("Dashboard", "Timeline"):
        from . import widgets

        return getattr(widgets, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "AgentLostError",
    "CellInterrupted",
    "CellResult",
    "CellSourceError",
    "CellTimeoutError",
    "Checkpoint",
    "Cluster",
    "ClusterConnectionError",
    "ClusterError",
    "ClusterStatus",
    "Dashboard",
    "InputError",
    "LinkLostError",
    "MissingOutputError",
    "ObjectHandle",
    "RemoteCell",
    "RemoteError",
    "RemoteRepr",
    "RequestError",
    "Run",
    "RunError",
    "SpaceError",
    "SyncError",
    "SyncResult",
    "Timeline",
    "TrainResult",
    "TuneResult",
    "WaitTimeoutError",
    "WorkerDiedError",
    "choice",
    "connect",
    "current",
    "dashboard",
    "forward",
    "get",
    "grid_search",
    "load_ipython_extension",
    "local",
    "loguniform",
    "map",
    "put",
    "randint",
    "submit",
    "sync",
    "timeline",
    "train_torch",
    "tune",
    "uniform",
    "up",
    "wait",
]
