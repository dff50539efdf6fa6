"""The Python API: a :class:`Cluster` the notebook is attached to.

Every magic is a thin layer over this module. ``jc.local()`` starts the embedded
cluster and attaches to it; ``Cluster.run_cell`` runs cell source remotely; the
notebook-side mirror of Ray's core API (``submit``, ``map``, ``put``, ``get``,
``wait``) works on :class:`ObjectHandle` objects. The kernel never imports ``ray``.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import html
import itertools
import linecache
import logging
import os
import platform
import threading
import uuid
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, cast

from . import _environment, _sync, _views
from . import _prompts as prompts
from ._analysis import analyse_cell
from ._cell import RemoteCell
from ._crash import crash_site
from ._errors import (
    AgentLostError,
    ClusterConnectionError,
    ClusterError,
    InputError,
    RequestError,
    WaitTimeoutError,
    remote_error,
)
from ._forward import PortForward, check_port, open_forward, ssh_opener
from ._handles import ObjectHandle, format_size, parse_size
from ._inputs import InputLedger, pickle_value
from ._link import AgentLink, UnixTransport
from ._links import browser_url
from ._local import EmbeddedAgent
from ._modules import NotebookModules
from ._segments import Segment, release
from ._segments import pool as segment_pool
from ._status import ClusterLogs, ClusterStatus
from ._views import ProgressView
from .agent._protocol import Digest, Pickled
from .agent._shared import SHARED_MIN, Needs, Shared, worth_sharing
from .agent.cells._execute import CellSpec, cell_filename

#: Outputs larger than this stay on the cluster behind a handle.
DEFAULT_THRESHOLD = 1 << 20
MODES = ("task", "actor", "driver", "map")

log = logging.getLogger("jupyter_cluster")

_current: Cluster | None = None
_lock = threading.Lock()


def python_mismatch(kernel: str, head: str) -> str | None:
    """Explain a Python version mismatch between kernel and head, or None.

    >>> python_mismatch("3.11.7", "3.11.2") is None
    True
    >>> "3.12" in python_mismatch("3.11.7", "3.12.1")
    True
    """
    if kernel.split(".")[:2] == head.split(".")[:2]:
        return None
    minor = ".".join(head.split(".")[:2])
    return (
        f"the notebook runs Python {kernel} and the cluster Python {head}: Python code "
        "(functions and classes defined in the notebook) cannot travel between different "
        "minor versions. Cells, data inputs and outputs, and functions defined inside a "
        f"remote cell work as usual. To send notebook functions too, run this notebook on "
        f"Python {minor}, or connect with --python naming a Python "
        f"{'.'.join(kernel.split('.')[:2])} on the head that has Ray."
    )


#: How many cells a cluster names by their labels (for timelines).
HISTORY_KEPT = 1_000


#: Values to send that come to this many bytes or more are sent only once the head says it has room.
ROOM_CHECKED = 64 * 2**20
#: How long the kernel waits for the head to say whether it has room for such values, before it sends them anyway.
ROOM_WAIT = 30.0


@contextlib.contextmanager
def _segments_back_on_error(segments: list[Segment]) -> Iterator[None]:
    """Give ``segments`` back to the pool if the block fails before a request took them:
    nothing was sent, so the agent never saw them."""
    try:
        yield
    except BaseException:
        release(segments, done=True)
        raise


class Cluster:
    """A Ray cluster this notebook is attached to.

    Use :func:`local` (or ``%cluster local``) to get one rather than building it.

    >>> cluster = jc.local(cpus=2)                     # doctest: +SKIP
    >>> cluster.run_cell("x = 6 * 7").result().outputs  # doctest: +SKIP
    {'x': 42}
    """

    def __init__(
        self, link: AgentLink, *, kind: str, agent: EmbeddedAgent | None = None, threshold: int = DEFAULT_THRESHOLD
    ) -> None:
        self._link = link
        self._agent = agent
        self._ledger = InputLedger(self)
        self._modules = NotebookModules()
        self._counter = itertools.count(1)
        self._to_release: set[str] = set()
        self._release_lock = threading.Lock()
        self.kind = kind
        self.threshold = threshold
        self.cells: dict[str, RemoteCell] = {}
        #: The last ``--map`` cell that ended (a dashboard opened after it shows its items as it ended).
        self.last_map: RemoteCell | None = None
        #: The cells sent, latest last: cell id -> label (the last :data:`HISTORY_KEPT`; what timelines name).
        self.history: OrderedDict[str, str] = OrderedDict()
        #: Called by :meth:`down`, last first: each stops something this cluster started.
        self.stoppers: list[Callable[[], None]] = []
        #: Ray's dashboard: forwarded to this machine (SSH clusters), or the embedded cluster's own, on loopback.
        self.dashboard_url: str | None = None
        #: What a terminal on this machine sets for Ray's CLI (`ray status`, `ray list`, `ray job`) to reach the
        #: embedded cluster: its GCS address, and Ray's token authentication where it runs with it.
        self.ray_env: str | None = None
        #: Ports of the head reachable here (:meth:`forward`), open ones only.
        self.forwards: list[PortForward] = []
        #: What the head's probe found (SSH clusters): Python, Ray, this package's version.
        self.head: dict[str, Any] = {}
        #: Where the agent's modules were shipped on the head, if they were.
        self.shipped: str | None = None
        #: A note on the kernel's and the head's Ray versions, when they differ.
        self.ray_note: str | None = None
        #: Final events of cells an earlier kernel of this session ran, replayed on resume.
        self.missed = link.orphans
        #: The Ray processes this cluster started (``up``, ``--start-head``), if any.
        self.started: Any = None
        #: The cluster YAML Ray's cluster launcher started this cluster from (``jc.up(config=...)``).
        self.launcher: str | None = None
        #: Whether ``ray up`` ran here for it (``down`` runs ``ray down``), or it was found running.
        self.launched_here = True
        #: The metrics the dashboards draw (a :class:`._feed.MetricsFeed`, made by the first).
        self._metrics_feed: Any = None
        #: Content hashes of the files :meth:`sync` last read (re-read only when they change).
        self._sync_digests = _sync.Digests()
        #: ``jc.map`` calls whose progress bar still runs: their handle ids, and their watch.
        self._trackers: list[tuple[frozenset[str], concurrent.futures.Future[Any]]] = []
        #: Attaches to the head that replaces this one for good (``k8s:``: KubeRay's new head pod); set by connect.
        self.successor: Callable[[], Cluster] | None = None
        link.on_give_up = self._link_gave_up
        link.explain = self._what_went
        link.watchers.append(lambda what: tell("link", self))
        #: Interrupting a cell while the link is down: "cancel" it when the link
        #: returns, or "keep" it running (its result arrives when the link is back).
        self.on_interrupt = "cancel"
        welcome = link.welcome
        self.python = str(welcome.get("python", ""))
        self.ray_version = str(welcome.get("ray", ""))
        self.mismatch = python_mismatch(platform.python_version(), self.python)
        if self.mismatch:
            self._ledger.code_ok = False
            self._ledger.code_reason = (
                f"the notebook runs Python {platform.python_version()} and the cluster Python {self.python}."
            )

    @property
    def session(self) -> str:
        """The session's name: ``jc.connect(..., session=NAME)`` resumes it."""
        return self._link.session

    @property
    def alive(self) -> bool:
        return not self._link.closed

    def __repr__(self) -> str:
        state = "attached" if self.alive else "detached"
        return f"<Cluster {self.kind} Python {self.python} Ray {self.ray_version} {state}>"

    def _repr_html_(self) -> str:
        """The status card (one request to the agent; the link's state alone while it is down)."""
        if self._link.closed:
            return f"<code>{html.escape(repr(self))}</code>"
        return self.status().html(button=True)

    @property
    def link(self) -> dict[str, Any]:
        """The link's state: ``state`` (connected, reconnecting, detached, lost), and while
        reconnecting ``since`` (``time.time()``), ``attempts`` and ``last_error``; ``rtt``
        is the last heartbeat's round trip in seconds."""
        link = self._link
        info: dict[str, Any] = {"state": link.state, "target": link.target, "session": link.session, "rtt": link.rtt}
        if link.state == "reconnecting":
            info.update(since=link.down_since, attempts=link.attempts, last_error=link.last_error)
        elif link.state == "lost":
            info["error"] = link.lost
        return info

    def _what_went(self, gone: str) -> tuple[str, str]:
        """Why the agent is gone, where a crash hit, and what went with it (a crash in a driver cell ends it); and
        what the user can do now."""
        agent = self._agent
        crash = agent.crash_text() if agent is not None else str(getattr(self._link.transport, "crash", ""))
        running = list(self.cells.values())
        words = [gone]
        site = crash_site(crash)
        if site is not None:
            filename, line = site
            cell = next((c for c in running if cell_filename(c.spec.source) == filename), None)
            where = f"{cell.label} ({cell.where})" if cell is not None else "a remote cell's code"
            text = linecache.getline(filename, line).strip()
            words.append(f", in {where}, line {line}" + (f": `{text}`" if text else ""))
        drivers = [c.label for c in running if c.mode == "driver"]
        if drivers:
            words.append(
                f". {', '.join(drivers)} ran in the agent (--driver), the session's Ray driver: a crash there ends it"
            )
        went = "the driver's namespace, the values the notebook's handles stood for, the actors the cells started"
        if running:
            went += f" and the cells that ran ({', '.join(c.label for c in running)})"
        if agent is not None:
            words.append(f". With it went the embedded cluster: {went}")
            then = (
                "The notebook's own variables are intact; the next %%remote cell (or `%cluster local`) starts a new "
                "embedded cluster."
            )
        elif self._succeeds():
            words.append(f". With it went {went}")
            then = (
                "The notebook's own variables are intact. This notebook attaches to the new head now: the next "
                "%%remote cell runs there (`%cluster status` names it)."
            )
        else:
            words.append(f". With it went {went}")
            then = (
                "The notebook's own variables are intact. The Ray cluster runs on, with its detached actors and Serve "
                f"applications; `%cluster connect {self._link.transport.describe()}` starts a new agent."
            )
        return "".join(words), then

    def _succeeds(self) -> bool:
        """Whether a new head replaced this one for good (a KubeRay head pod), and the notebook attaches to it."""
        return self.successor is not None and bool(getattr(self._link.transport, "head_replaced", False))

    def _link_gave_up(self, error: BaseException) -> None:
        # The session lives on in the agent when only the link is gone: a later
        # connect with its name resumes this very object (see ``_detached``).
        if getattr(error, "resume", None):
            _detached[self._link.session] = self
        _forget(self)
        if self._succeeds():
            _succeed(self)

    # ----------------------------------------------------------------- cells
    def run_cell(
        self,
        source: str,
        *,
        namespace: dict[str, Any] | None = None,
        hidden: Iterable[str] = (),
        mode: str = "task",
        actor: str | None = None,
        map_over: tuple[str, Iterable[Any]] | None = None,
        out: Sequence[str] | None = None,
        cpus: float | None = None,
        gpus: float | None = None,
        memory: int | str | None = None,
        resources: dict[str, float] | None = None,
        retries: int | None = None,
        timeout: float | None = None,
        runtime_env: dict[str, Any] | None = None,
        pending_handles: bool = False,
        label: str | None = None,
        ephemeral: bool = False,
    ) -> RemoteCell:
        """Run ``source`` on the cluster; return the running :class:`RemoteCell`.

        Parameters
        ----------
        source
            The cell's Python code.
        namespace
            Where the cell's inputs are read from (none by default: pass ``shell.user_ns`` for the notebook's).
        mode
            ``"task"`` (a Ray task), ``"actor"`` (in the named ``actor``), ``"driver"``
            (the agent's own namespace) or ``"map"`` (once per item of ``map_over``).
        out
            The names to bring back (default: every assigned name, none for actors).
        cpus, gpus, memory, resources, retries, timeout
            As Ray's task options; ``timeout`` cancels the cell after that many seconds.
        runtime_env
            Ray's ``runtime_env`` for this cell (``{"pip": [...], "env_vars": {...}}``), over the
            session's (:meth:`set_runtime_env`); not for driver cells.
        pending_handles
            Make pending handles for the outputs (``--async``), in ``RemoteCell.handles``.
        ephemeral
            An actor cell whose actor is its own: made on the head, and stopped when the
            cell ends, with whatever it started (``jc.train_torch`` and ``jc.tune`` runs).

        Examples
        --------
        >>> cell = jc.current().run_cell("y = x + 1", namespace={"x": 1})  # doctest: +SKIP
        >>> cell.result().outputs                                          # doctest: +SKIP
        {'y': 2}
        """
        if self._link.closed:
            raise AgentLostError(self._link.lost or "the cluster was shut down")
        if mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}, not {mode!r}")
        if mode == "actor" and not actor:
            raise ValueError("an actor cell needs the actor's name (--actor NAME)")
        options = self._options(cpus, gpus, memory, resources, retries, timeout, runtime_env)
        if mode == "driver" and runtime_env:
            raise ValueError(
                "--pip, --env and --runtime-env are for cells that run as Ray tasks or actors; a --driver cell runs "
                "in the agent's own process on the head. Give the tasks it starts their own "
                "(`@ray.remote(runtime_env={...})`), or run this cell without --driver"
            )
        if actor:
            options["actor"] = actor
        if ephemeral:
            if mode != "actor":
                raise ValueError("ephemeral=True is for actor cells")
            options.update(ephemeral=True, head=True)
        analysis = analyse_cell(source)
        # Tracebacks through this cell's code, now or from a later cell, find its lines.
        filename = cell_filename(source)
        linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
        namespace = {} if namespace is None else namespace
        skip = set(hidden) | {"display"}
        map_name = None
        items: list[Any] = []
        if mode == "map":
            if map_over is None:
                raise ValueError("a map cell needs map_over=(name, items)")
            map_name, iterable = map_over
            items = list(iterable)
            if not items:
                raise ValueError(f"--map {map_name}: there are no items to map over")
            skip.add(map_name)
        names = [n for n in analysis.inputs if n in namespace and n not in skip]
        cell_id = f"{self._link.session}-{self._link.tag}c{next(self._counter)}"
        label = label or f"remote cell {cell_id}"
        shipped = self._ledger.prepare(names, namespace, reader=label)
        with _segments_back_on_error(shipped.segments):  # until the request owns them
            sizes = dict(shipped.sizes)
            if mode == "map":
                items_blob = pickle_value(f"the --map items of {map_name}", items)
                sizes[f"the --map items of {map_name}"] = items_blob.nbytes
            self._check_room(sizes, label)
            self._ledger.pack(shipped)
            sources = self._modules.for_cell(shipped.modules.values(), analysis.imports, shipped.pickles)
            if out is not None:
                outputs = tuple(out)
            elif mode == "actor":
                outputs = ()
            else:
                outputs = tuple(n for n in analysis.outputs if n != map_name)
            spec = CellSpec(
                cell_id=cell_id,
                source=source,
                inputs=shipped.names,
                modules=shipped.modules,
                outputs=outputs,
                display_last=analysis.displays_last,
                threshold=self.threshold,
                map_name=map_name,
                label=label,
                sources=tuple(sources),
                announce=pending_handles or mode == "map",
            )
            body: dict[str, Any] = {"spec": spec, "mode": mode, "options": options, "inputs": shipped.entries}
            if mode == "map":
                body["items"] = items_blob
            where = {"task": "task", "actor": f"actor {actor}", "driver": "driver", "map": "map"}[mode]
            cell = RemoteCell(self, spec, mode, shipped, label, where, pending_handles, out_given=out is not None)
            if mode == "map":
                cell.progress = (0, len(items))
            self.cells[cell_id] = cell
            self.history[cell_id] = label
            while len(self.history) > HISTORY_KEPT:
                self.history.popitem(last=False)
            cell.add_done_callback(self._forget_cell)
            try:
                self._link.request("run_cell", body, cell._on_event, segments=shipped.segments)
                tell("cell", cell)
            except KeyboardInterrupt:
                # Interrupted while handing the cell over (the watchers can take a moment): it
                # is on its way, and nobody will wait for it, so stop it there too.
                cell.cancel()
                raise
            return cell

    def _forget_cell(self, cell: RemoteCell) -> None:
        # The last map first: whoever reads the cells meanwhile (the dashboard, on its thread) finds the map in one
        # place or the other.
        if cell.mode == "map" and (self.last_map is None or cell.submitted >= self.last_map.submitted):
            self.last_map = cell
        self.cells.pop(cell.cell_id, None)

    @staticmethod
    def _options(
        cpus: float | None,
        gpus: float | None,
        memory: int | str | None,
        resources: dict[str, float] | None,
        retries: int | None,
        timeout: float | None,
        runtime_env: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        for name, value in (("cpus", cpus), ("gpus", gpus), ("retries", retries), ("timeout", timeout)):
            if value is not None and value < 0:
                raise ValueError(f"{name} must not be negative (got {value})")
        if timeout is not None and timeout == 0:
            raise ValueError("timeout must be positive (seconds)")
        if resources is not None and not (
            isinstance(resources, dict) and all(isinstance(v, (int, float)) for v in resources.values())
        ):
            raise ValueError('resources must map names to amounts, e.g. {"accelerator": 1}')
        if resources and {"CPU", "GPU"} & set(resources):
            raise ValueError("ask for CPUs and GPUs with --cpus and --gpus (cpus=, gpus=), not in resources")
        return {
            "cpus": cpus,
            "gpus": gpus,
            "memory": parse_size(memory) if memory is not None else None,
            "resources": resources,
            "retries": retries,
            "timeout": timeout,
            "runtime_env": _environment.check(runtime_env) if runtime_env else None,
        }

    # --------------------------------------------------------------- objects
    def submit(
        self,
        fn: Callable[..., Any],
        *args: Any,
        cpus: float | None = None,
        gpus: float | None = None,
        memory: int | str | None = None,
        resources: dict[str, float] | None = None,
        runtime_env: dict[str, Any] | None = None,
    ) -> ObjectHandle:
        """Call ``fn(*args)`` as a Ray task; return a handle to its (future) result.

        Handles among ``args`` are passed as Ray dependencies: nothing is fetched.

        >>> h = jc.submit(pow, 2, 10)   # doctest: +SKIP
        >>> jc.get(h)                   # doctest: +SKIP
        1024
        """
        values = {"fn": fn, **{f"arg{i}": a for i, a in enumerate(args)}}
        name = getattr(fn, "__name__", "fn")
        # A fresh ledger: submitted arguments are sent as they are, never by name.
        ledger = InputLedger(self)
        shipped = ledger.prepare(list(values), values, reader=f"jc.submit({name})")
        with _segments_back_on_error(shipped.segments):  # until the request owns them
            if shipped.modules:
                raise InputError("pass modules to submit() by importing them inside the function")
            self._check_room(shipped.sizes, f"jc.submit({name})")
            ledger.pack(shipped)
            sources = self._modules.for_cell((), (), shipped.pickles)
            options = self._options(cpus, gpus, memory, resources, None, None, runtime_env)
            label = f"jc.submit({name})"
            body = {"inputs": shipped.entries, "options": options, "sources": tuple(sources), "label": label}
            handle_id = self._call("submit", body, segments=shipped.segments)
        return ObjectHandle(handle_id, {"type": name}, cluster=self, name=name)

    def map(
        self,
        fn: Callable[..., Any],
        *iterables: Iterable[Any],
        cpus: float | None = None,
        gpus: float | None = None,
        runtime_env: dict[str, Any] | None = None,
        progress: bool | None = None,
    ) -> list[ObjectHandle]:
        """``[submit(fn, *args) for args in zip(*iterables)]``.

        In a notebook, a progress bar below the cell follows the calls to the end (done,
        failed, rate) while the notebook goes on; ``progress=False`` leaves it out.
        """
        options: dict[str, Any] = {"cpus": cpus, "gpus": gpus, "runtime_env": runtime_env}
        handles = [self.submit(fn, *args, **options) for args in zip(*iterables, strict=False)]
        if handles and _show_progress(progress, len(handles)):
            bar = _views.views.progress(len(handles), f"jc.map({getattr(fn, '__name__', 'fn')})", "calls")
            ids = [h.id for h in handles]
            body = {"handles": ids, "num_returns": len(handles), "timeout": None, "progress": True}
            tracker = self._link.request("wait", body, bar.on_wait())
            self._trackers.append((frozenset(ids), tracker.future))
        return handles

    def _settle_trackers(self, ready: Iterable[str]) -> None:
        """Let the bars of ``jc.map`` calls whose handles are all in ``ready`` draw their end now."""
        ready = set(ready)
        for ids, future in list(self._trackers):
            if future.done():
                self._trackers.remove((ids, future))
            elif ids <= ready:
                concurrent.futures.wait([future], timeout=SETTLE)

    def put(self, value: Any) -> ObjectHandle:
        """Store ``value`` in the cluster's object store; return its handle."""
        blob = pickle_value("the value given to put()", value)
        self._check_room({"the value": blob.nbytes}, "jc.put")
        staged = self._stage(blob)  # (unhashed: nothing compares it with anything)
        sent, owned = (staged[0], [staged[1]]) if staged is not None else (blob, [])
        handle_id, meta = self._call("put", {"value": sent}, timeout=None, segments=owned)
        return ObjectHandle(handle_id, meta, cluster=self)

    def _stage(self, blob: Pickled, hash_later: bool = False) -> tuple[Shared, Segment, Digest | None] | None:
        """``blob``, if it is large and the agent shares this machine, written into a segment
        of shared memory (:mod:`._segments`): what travels in its place, the segment, and
        its content hash still to be taken (``hash_later``: see :meth:`.SegmentPool.stage`)."""
        if not self._link.shared or not worth_sharing(blob):
            return None
        return segment_pool().stage(blob, hash_later)

    def _fetch(self, handle: ObjectHandle, timeout: float | None) -> Any:
        """A handle's value, from the agent. Where the agent shares this machine, a large
        value is offered a segment to be written into, and the value is a view on it."""
        nbytes = int(handle.meta.get("nbytes") or 0)
        if not self._link.shared:
            return self._call("get", {"handle": handle.id}, timeout=timeout).load()
        for _ in range(2):  # a value bigger than its handle said is answered Needs: once more, with room for it
            segment = segment_pool().take(nbytes) if nbytes >= SHARED_MIN else None
            body = {"handle": handle.id, "into": segment and segment.name(), "shared": True}
            try:
                answer = self._call("get", body, timeout=timeout)
            except BaseException:
                if segment is not None:
                    segment.close()  # the agent may still write into it: never the pool's again
                raise
            if isinstance(answer, Shared) and segment is not None:
                return segment_pool().receive(answer, segment).load()
            if segment is not None:
                segment_pool().give(segment)
            if not isinstance(answer, Needs):
                return answer.load()
            nbytes = answer.nbytes
        raise RequestError(f"the agent kept asking for more room for `{handle.name or handle.id}`", {})

    def get(self, handle: ObjectHandle | Sequence[ObjectHandle], timeout: float | None = None) -> Any:
        """Fetch a handle's value (or a list of them) into the notebook."""
        if isinstance(handle, (list, tuple)):
            values = [self.get(h, timeout) for h in handle]
            self._settle_trackers(h.id for h in handle if isinstance(h, ObjectHandle))
            return values
        if not isinstance(handle, ObjectHandle):
            return handle  # already a value: what a resolved small output is
        if handle.cluster is not None and handle.cluster is not self:
            return cast(Cluster, handle.cluster).get(handle, timeout)  # the only kind of owner a handle has
        if not handle.wait(timeout):
            raise WaitTimeoutError(f"`{handle.name or handle.id}` was not ready within {timeout} s")
        if handle.has_local_value:
            return handle.local_value
        self._check_reachable(handle)
        return self._fetch(handle, timeout)

    def wait(
        self,
        handles: Sequence[ObjectHandle],
        num_returns: int = 1,
        timeout: float | None = None,
        progress: bool | None = None,
    ) -> tuple[list[ObjectHandle], list[ObjectHandle]]:
        """Like ``ray.wait``: ``(ready, not_ready)`` once ``num_returns`` are ready.

        In a notebook, a wait for several handles (``num_returns`` > 1) that lasts over
        half a second shows a progress bar (ready and failed of all); ``progress=False``
        leaves it out, ``progress=True`` shows it at once.
        """
        handles = list(handles)
        if not handles:
            return [], []
        wrong = [f"item {i} is a {type(h).__name__}" for i, h in enumerate(handles) if not isinstance(h, ObjectHandle)]
        if wrong:
            raise InputError(
                f"jc.wait takes handles (what jc.submit, jc.put and --async cells give); {', '.join(wrong[:3])}"
            )
        if not 0 < num_returns <= len(handles):
            raise InputError(f"num_returns must be between 1 and {len(handles)} (got {num_returns})")
        for handle in handles:
            self._check_reachable(handle)
        ids = [h.id for h in handles]
        answer_timeout = None if timeout is None else timeout + 30
        body = {"handles": ids, "num_returns": num_returns, "timeout": timeout}
        if _show_progress(progress, len(handles) if num_returns > 1 or progress else 1):
            ready_ids = set(self._wait_with_bar(body, answer_timeout, delay=0.0 if progress else 0.5))
        else:
            ready_ids = set(self._call("wait", body, timeout=answer_timeout))
        self._settle_trackers(ready_ids)
        ready = [h for h in handles if h.id in ready_ids]
        return ready, [h for h in handles if h.id not in ready_ids]

    def _wait_with_bar(self, body: dict[str, Any], timeout: float | None, delay: float) -> Any:
        seen: list[tuple[str, Any]] = []
        bar: list[ProgressView] = []
        lock = threading.Lock()

        def on_event(event: str, data: Any) -> None:
            with lock:
                if not bar:
                    seen.append((event, data))
                    return
            relay(event, data)

        pending = self._link.request("wait", {**body, "progress": True}, on_event)
        try:
            return pending.future.result(delay)
        except concurrent.futures.TimeoutError:
            pass
        except RequestError as exc:
            raise self._failure(exc) from None
        with lock:
            bar.append(_views.views.progress(len(body["handles"]), "jc.wait", "handles"))
            relay = bar[0].on_wait(wanted=body["num_returns"])
            for event, data in seen:
                relay(event, data)
        try:
            return pending.future.result(timeout)
        except concurrent.futures.TimeoutError:
            raise WaitTimeoutError(f"the agent did not answer 'wait' within {timeout} s") from None
        except RequestError as exc:
            raise self._failure(exc) from None
        except KeyboardInterrupt:
            bar[0].finish("cancelled", "interrupted")
            raise

    def _check_reachable(self, handle: ObjectHandle) -> None:
        """Refuse, with the reason, a handle this cluster cannot serve (its own is gone,
        or it belongs to another cluster)."""
        name = f"`{handle.name or handle.id}`"
        owner = handle.cluster or self
        gone = owner._unreachable()
        if gone is not None:
            raise ClusterConnectionError(f"{name} cannot be reached: {gone}")
        if owner is not self:
            raise InputError(
                f"{name} lives on another cluster ({owner.kind}, session {owner.session}); "
                "fetch it with jc.get() and pass the value, or use it from that cluster"
            )

    def _unreachable(self) -> str | None:
        """Why this cluster's objects cannot be reached now, or None while attached."""
        if not self._link.closed:
            return None
        if _detached.get(self.session) is self:
            hint = self._link.transport.resume_hint(self.session)
            return f"its session {self.session} is detached" + (f"; `{hint}` resumes it" if hint else "")
        return self._link.lost or "the cluster it belongs to was shut down (`%cluster down`)"

    def _check_room(self, sizes: dict[str, int], reader: str) -> None:
        """Refuse values the head has no memory for, before any byte of them is sent (for
        :data:`ROOM_CHECKED` bytes and more: one round trip, against seconds of sending)."""
        total = sum(sizes.values())
        if total < ROOM_CHECKED or self._link.state != "connected":
            return  # while the link is down, the cell waits for it as any cell does, unasked
        try:
            why = self._link.call("room", {"nbytes": total}, ROOM_WAIT)
        except (RequestError, WaitTimeoutError):
            return  # an agent that does not know the question (or is slow to say) takes the values as before
        if why:
            named = ", ".join(
                f"`{name}` ({format_size(n)})" if name.isidentifier() else f"{name} ({format_size(n)})"
                for name, n in sorted(sizes.items(), key=lambda item: -item[1])
            )
            raise InputError(
                f"cannot send {named} to the cluster for {reader}: {why}. Nothing was sent. Make it smaller, "
                "send it in parts, or make it on the cluster (a remote cell that reads its file there)."
            )

    def _call(
        self,
        op: str,
        body: dict[str, Any] | None = None,
        timeout: float | None = 60.0,
        segments: list[Any] | None = None,
    ) -> Any:
        """A request to the agent; a refusal caused by a failed cell raises that cell's error."""
        try:
            return self._link.call(op, body, timeout, segments)
        except RequestError as exc:
            raise self._failure(exc) from None

    @staticmethod
    def _failure(exc: RequestError) -> BaseException:
        failure = exc.detail.get("failure")
        if failure is None:
            return exc
        return remote_error(failure, failure.origin_source, "", failure.origin, "")

    def kill_actor(self, name: str) -> None:
        """Kill the ``--actor`` namespace ``name`` and whatever it runs (its variables are lost).

        The next ``%%remote --actor NAME`` cell starts a fresh one.

        >>> jc.current().kill_actor("trainer")  # doctest: +SKIP
        """
        killed = self._call("kill_actor", {"name": name})
        tell("actors", self)
        if not killed:
            raise RequestError(f"this cluster has no actor named {name!r} (`%cluster status` lists them)")

    def reset_driver(self) -> dict[str, Any]:
        """Stop what the notebook's cells started on the cluster, and start the driver afresh.

        ``--driver`` cells can start actors (detached ones outlive the agent), Serve
        applications and placement groups; ``%cluster status`` lists them under "started
        by cells". This deletes the Serve applications the cells deployed (and shuts Serve
        down where it runs no other notebook's), kills the named actors the cells' job made
        (detached ones too), removes its placement groups and empties the ``--driver``
        namespace (unnamed actors go with the last handle to them). Other notebooks' work is
        left alone. ``--actor`` namespaces are kept (``kill_actor`` stops those). Refused
        while cells run.

        Returns what was stopped: ``{"serve": [apps], "actors": [names],
        "placement_groups": n, "unnamed": n, "errors": [...]}``.

        >>> jc.current().reset_driver()   # doctest: +SKIP
        {'serve': ['default'], 'actors': ['counter'], 'placement_groups': 1, 'unnamed': 0, 'errors': []}
        """
        answer = self._call("reset_driver", timeout=120)
        tell("actors", self)
        if "refused" in answer:
            raise RequestError(f"reset_driver: {answer['refused']}")
        return dict(answer)

    def _release(self, handle_id: str) -> None:
        with self._release_lock:
            first = not self._to_release
            self._to_release.add(handle_id)
        if first and not self._link.closed:
            self._link._thread.loop.call_soon_threadsafe(self._link._thread.loop.call_later, 0.5, self._flush_releases)

    def _release_many(self, handle_ids: Iterable[str]) -> None:
        for handle_id in handle_ids:
            self._release(handle_id)

    def _flush_releases(self) -> None:
        with self._release_lock:
            ids, self._to_release = sorted(self._to_release), set()
        if ids and not self._link.closed:
            self._link.request("release", {"handles": ids})

    # ----------------------------------------------------------------- ports
    def forward(self, port: int, local: int | None = None) -> str:
        """Make ``port`` on the head's loopback reachable from this machine; return its URL here.

        Over SSH this is a local port forward through the cluster's own connection (it
        outlives a reconnect); ``local`` picks the port here (by default, any free one).
        The embedded cluster runs on this machine: its port is returned as it is, unless
        ``local`` asks for another.
        Forwarding a port twice returns the forward already open. ``%cluster status``
        lists the forwards; ``disconnect()`` and ``down()`` close them.

        Raises ValueError for a port that is not a TCP port number, or a ``local`` port
        already in use here (the message names a free one).

        >>> jc.current().forward(8000)          # doctest: +SKIP
        'http://127.0.0.1:8000'
        """
        forward = self._open_forward(port, local)
        if forward.note:
            log.warning("forward %s: %s yet; it reaches it once something listens there", forward.url, forward.note)
        return forward.url

    def _open_forward(self, port: int, local: int | None) -> PortForward:
        """The forward of ``port`` (opened now, or the one already open); its ``note`` says
        why nothing answers there, if nothing did when it was opened."""
        port = check_port(port)
        wanted = None if local is None else check_port(local, "the local port")
        for forward in self.forwards:
            if forward.remote_port == port and wanted in (None, forward.local_port):
                return forward
        if self._link.closed:
            raise ClusterConnectionError(f"{self!r} is detached: attach again to forward a port")
        embedded = self._agent is not None
        where = "embedded cluster (this machine)" if embedded else f"head {self._link.target}"
        transport = self._link.transport
        # Through the SSH connection, or through relays the command of `--via` runs (its transport opens them).
        opener = None if embedded else getattr(transport, "open_port", None) or ssh_opener(transport)
        forward = open_forward(port, wanted, where, opener)
        self.forwards.append(forward)
        forward.note = forward.probe()
        tell("forwards", self)
        return forward

    def close_forward(self, port: int) -> bool:
        """Close the forwards of the head's ``port``; whether there were any."""
        port = check_port(port)
        closing = [f for f in self.forwards if f.remote_port == port]
        self._close_forwards(closing)
        return bool(closing)

    def _close_forwards(self, closing: Iterable[PortForward] | None = None) -> None:
        closing = list(self.forwards if closing is None else closing)
        for forward in closing:
            try:
                forward.close()
            except Exception:  # its loop is gone: nothing listens any more
                log.debug("closing %r", forward, exc_info=True)
            if forward in self.forwards:
                self.forwards.remove(forward)
        if closing:
            tell("forwards", self)

    # --------------------------------------------------------------- cluster
    # ------------------------------------------------------------ environment
    @property
    def runtime_env(self) -> dict[str, Any]:
        """The session's Ray ``runtime_env``, as the agent holds it (with the ``working_dir`` a sync set)."""
        return dict(self._call("runtime_env", {}))

    def set_runtime_env(self, runtime_env: dict[str, Any] | None) -> dict[str, Any]:
        """Run this session's later cells, tasks and runs in Ray's ``runtime_env`` (``{"pip": [...],
        "env_vars": {...}}``); a cell's own ``--pip``/``--env``/``--runtime-env`` add to it. ``None`` or ``{}``
        clears it (but for the folder :meth:`sync` sent). Ray installs packages on each node that runs the
        work, once per set of packages. Actors keep the environment they were made in.

        >>> jc.current().set_runtime_env({"pip": ["pyjokes"], "env_vars": {"MODE": "fast"}})  # doctest: +SKIP
        """
        env = _environment.check(runtime_env or {})
        return dict(self._call("runtime_env", {"env": env}))

    def sync(
        self,
        path: str | os.PathLike[str] | None = None,
        exclude: str | Iterable[str] = (),
        max_size: int | str = _sync.DEFAULT_MAX_SIZE,
        progress: bool | None = None,
    ) -> _sync.SyncResult:
        """Send ``path`` (default: the notebook's folder) to the head; this session's later task,
        actor and map cells run in it on every node, as Ray's ``working_dir``.

        ``.gitignore`` files are honoured, and version control, caches and virtualenvs are left out;
        ``exclude`` adds glob patterns (``"data/*.parquet"``). Over ``max_size`` (default 100 MiB)
        it is refused, naming the largest files. A second sync sends only the files that changed.
        Actors keep the folder they were made with; driver cells run in the agent on the head, where
        the copy is at ``SyncResult.remote_path``.

        >>> jc.sync()                            # doctest: +SKIP
        <synced /home/me/project (12 files, 1.2 MiB) to ...: sent 12 changed file(s), 1.2 MiB, in 0.4 s; ...>
        """
        excluded = [exclude] if isinstance(exclude, str) else exclude
        return _sync.sync(self, path, excluded, max_size, lambda count: _show_progress(progress, count))

    def unsync(self) -> bool:
        """Stop running cells in the synced folder (its copy on the head is removed); False if none was synced."""
        return bool(self._call("sync_off", {}))

    def metrics_source(self, prometheus: str | bool | None = None) -> dict[str, Any]:
        """Where the dashboards' figures come from, for every dashboard of this cluster.

        ``prometheus="http://host:9090"``: a Prometheus server that scrapes this cluster (as
        Ray documents: file service discovery from ``prom_metrics_service_discovery.json``),
        read on the head, where the agent runs (``http://localhost:9090`` is the head's own;
        ``%cluster forward 9090`` shows its web page here). The dashboard then asks it for sums
        and the nodes it draws, at any number of nodes. ``False``: each node's own metrics
        endpoint, scraped by the agent (spaced out to stay under 3% of a core). ``None`` (the
        default): the server Ray's ``RAY_PROMETHEUS_HOST`` names on the head
        (``http://localhost:9090`` when unset), once it has this cluster's nodes, else the
        nodes' endpoints. Returns what is used, e.g. ``{"kind": "prometheus", "url": ...}``.
        """
        if prometheus is True or not isinstance(prometheus, str | bool | type(None)):
            raise InputError(
                f'prometheus must be a URL such as "http://localhost:9090", False or None, not {prometheus!r}'
            )
        if isinstance(prometheus, str) and not prometheus.startswith(("http://", "https://")):
            raise InputError(
                f"prometheus={prometheus!r} is no URL: give the server's address as the head reaches it, "
                'with its scheme, e.g. "http://localhost:9090"'
            )
        try:
            return cast("dict[str, Any]", self._link.call("metrics_source", {"prometheus": prometheus}))
        except RequestError as exc:
            raise InputError(
                f"{exc}. The URL is read on the head, where the agent runs: check that the server runs there "
                "and answers at this address (`curl URL/api/v1/status/buildinfo` on the head)"
            ) from None

    def status(self) -> ClusterStatus:
        """The link, nodes, resources, running cells and actors, port forwards, and what
        driver cells started (actors, Serve applications, placement groups).

        While the link is down this answers at once, with the link's state only.
        """
        link = self.link
        forwards = [f.describe() for f in self.forwards]
        data = self._link.call("status") if link["state"] == "connected" else None
        return ClusterStatus(
            data,
            self.kind,
            browser_url(self.dashboard_url),
            link,
            self.python,
            forwards,
            self.launcher,
            self.launched_here,
            self.ray_env,
        )

    def timeline(self, cell: Any = None) -> dict[str, Any]:
        """What cell ``cell`` ran (see :func:`jupyter_cluster.timeline`): its label and start, and a span per task
        and actor call, from Ray's task events. ``cell``: None (the last cell sent), ``N`` (the cell ``In[N]``), a
        :class:`RemoteCell`, or a cell id."""
        return cast("dict[str, Any]", self._link.call("timeline", {"cell_id": self._cell_id_of(cell)}, timeout=90))

    def _cell_id_of(self, cell: Any) -> str:
        if isinstance(cell, RemoteCell):
            return cell.cell_id
        if cell is None:
            if not self.history:
                raise InputError("no %%remote cell has run on this cluster yet: a timeline is a cell's")
            return next(reversed(self.history))
        if isinstance(cell, int) and not isinstance(cell, bool):
            label = f"Cell In[{cell}]"
            found = [cell_id for cell_id, shown in self.history.items() if shown == label]
            if not found:
                raise InputError(f"no %%remote cell In[{cell}] ran on this cluster (give a cell's number, or none)")
            return found[-1]
        if isinstance(cell, str) and cell in self.history:
            return cell
        raise InputError(f"timeline(cell=...) takes a cell's number (In[N]), a RemoteCell or None; got {cell!r}")

    def logs(self, tail: int | None = 200) -> ClusterLogs:
        """What the cluster's workers printed that no running cell could take: lines of work a cell started
        that came after the cell ended, of threads of no cell, of Ray's own processes, and a flooding cell's
        overflow. The agent keeps the latest 10,000; ``tail``: how many to return (None: all it keeps).

        >>> print(jc.current().logs(tail=20))  # doctest: +SKIP
        """
        if tail is not None and (not isinstance(tail, int) or isinstance(tail, bool) or tail < 0):
            raise InputError(f"logs(tail=...) takes a count of lines, 0 or more, or None for all; got {tail!r}")
        data = self._link.call("logs", {"tail": tail})
        return ClusterLogs(data["lines"], data["total"], data["kept"])

    def cancel_all(self) -> None:
        for cell in list(self.cells.values()):
            cell.cancel()

    def disconnect(self) -> None:
        """Detach: the agent and the work in flight go on; ``jc.connect`` with the same
        session resumes them (also from another kernel). Port forwards are closed."""
        self._close_forwards()
        self._link.close()
        _detached[self._link.session] = self
        _forget(self)

    @property
    def started_here(self) -> bool:
        """Whether this notebook started the cluster's Ray: the embedded cluster, or a head ``--start-head`` or
        ``up`` started (``down`` stops it then); not a cluster it attached to as it found it."""
        return self._agent is not None or bool(self.stoppers)

    def _refuse(self) -> None:
        """Raise :class:`ClusterError` where this notebook did not start the cluster, or others use it (see
        :meth:`down`)."""
        if not self.started_here:
            raise ClusterError(
                f"this notebook did not start this cluster ({self.kind}), and stopped nothing: its Ray stays up "
                "for whoever started it, whatever this notebook does. `%cluster down --force` "
                "(jc.current().down(force=True)) stops this notebook's agent and what its cells started on the "
                "cluster (Serve applications, named and detached actors, placement groups), and detaches; "
                "`%cluster disconnect` detaches and leaves them running."
            )
        if self._link.closed or self._link.state != "connected":
            return  # nobody to ask: what follows stops what it can
        try:
            data = self._link.call("sharing", timeout=30)
        except Exception:  # the agent does not answer: down goes on, as before
            return
        others = _sharing(data, stops_ray=self.started_here)
        if others:
            raise ClusterError(
                f"others use this cluster ({others}): `%cluster down` would stop their work too, and stopped "
                "nothing. `%cluster down --force` (jc.current().down(force=True)) stops it anyway; "
                "`%cluster disconnect` leaves it, and this notebook's work, running."
            )

    def down(self, force: bool = False) -> None:
        """Stop what this cluster started: its agent, and the Ray it brought up (if any).

        Cells still running fail at once, and so does any wait on their handles. Port
        forwards are closed. On a cluster that outlives the agent (SSH), what the cells
        started is stopped first, as :meth:`reset_driver` does: the cells' Serve applications,
        the named and detached actors of the cells' job, its placement groups.

        Unless ``force`` (``%cluster down --force``), this raises :class:`ClusterError`, saying why, and stops
        nothing:

        - where this notebook did not start the cluster (it attached to a Ray it found running): its Ray stays up
          in any case, and a ``down`` there is more likely meant for a cluster of one's own;
        - where others would lose their work too: other notebooks attached to the same agent (a session resumed
          from another kernel), or, where this stops Ray (the embedded cluster, or one ``--start-head`` or ``up``
          started), the cluster's other Ray drivers, named.

        ``disconnect()`` leaves the cluster and this notebook's work running.
        """
        if not force:
            self._refuse()
        self._close_forwards()
        for cell in list(self.cells.values()):
            cell._fail(AgentLostError(f"it was shut down (`%cluster down`) while {cell.label} ran"))
        if not self._link.closed:
            # While the link is down, give it a moment to come back, not the full wait.
            wait = 120.0 if self._link.state == "connected" else 10.0
            try:
                self._link.call("shutdown", {"stop_started": self._agent is None}, timeout=wait)
            except Exception:  # already gone (or unreachable): what follows settles it
                pass
        self._link.close()
        if self._agent is not None:
            self._agent.stop()
        stoppers, self.stoppers = list(reversed(self.stoppers)), []
        _forget(self)
        failed: BaseException | None = None
        for stop in stoppers:  # each one, even after one failed; the first failure is raised (it says what is left)
            try:
                stop()
            except Exception as exc:
                failed = failed or exc
        if failed is not None:
            raise failed


def _sharing(data: dict[str, Any] | None, stops_ray: bool) -> str:
    """Whose work a ``down`` would stop beside this notebook's, in words ('' for nobody): the other notebooks
    attached to the agent it stops (detached ones are left out: their kernels are gone), and, where it stops Ray
    too, the cluster's other drivers."""
    from ._status import others_said

    if not data:
        return ""
    sessions = {"attached": (data.get("sessions") or {}).get("attached", 0), "detached": 0}
    return others_said(data.get("others") if stops_ray else None, sessions)


def _show_progress(progress: bool | None, count: int) -> bool:
    """Whether to draw a progress bar: as asked, else for several items in a notebook kernel."""
    if progress is not None:
        return progress and _in_kernel()
    return count > 1 and _in_kernel()


#: How long a wait that made a ``jc.map`` call's last handle ready gives that call's bar
#: to draw its end, so that it lands in the same cell (a headless run keeps only that).
SETTLE = 2.0


def _in_kernel() -> bool:
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    return shell is not None and getattr(shell, "kernel", None) is not None


#: Called as ``watcher(kind, data)`` with what the JupyterLab sidebar shows, on any thread:
#: "current" (the attached cluster changed; data: it, or None), "cell" (a cell was
#: submitted), "run" (a training or sweep began), "link" (a cluster's link changed state,
#: or its round trip), "actors" (a cluster's actors may have changed).
watchers: list[Callable[[str, Any], None]] = []


def tell(kind: str, data: Any) -> None:
    for watcher in list(watchers):
        try:
            watcher(kind, data)
        except Exception:
            log.exception("a watcher of the cluster failed on %r", kind)


def _forget(cluster: Cluster) -> None:
    global _current
    with _lock:
        if _current is not cluster:
            return
        _current = None
    tell("current", None)


def attach(cluster: Cluster) -> Cluster:
    """Make ``cluster`` the one the notebook's magics and ``jc.*`` functions use."""
    global _current
    with _lock:
        changed, _current = _current is not cluster, cluster
    _detached.pop(cluster._link.session, None)
    if changed:
        tell("current", cluster)
    return cluster


#: Clusters this kernel disconnected from, by session: a later connect resumes them.
_detached: dict[str, Cluster] = {}


#: The attach to a head that replaced the current one for good (:func:`_succeed`): :func:`current` waits for it.
_succession: concurrent.futures.Future[Cluster] | None = None


def _succeed(old: Cluster) -> None:
    """Attach to the head that replaced ``old``'s, in a thread of its own (the link's loop cannot wait on it)."""
    global _succession
    assert old.successor is not None
    successor = old.successor
    future: concurrent.futures.Future[Cluster] = concurrent.futures.Future()
    _succession = future

    def run() -> None:
        try:
            future.set_result(successor())
        except BaseException as exc:
            log.warning("could not attach to the head that replaced %s: %s", old.kind, exc)
            future.set_exception(exc)

    threading.Thread(target=run, name="jupyter-cluster-successor", daemon=True).start()


def current() -> Cluster | None:
    """The cluster this notebook is attached to, or None. While the notebook attaches to a head that replaced the
    current one (a KubeRay head pod), the new one, once attached: a cell then is not sent to a local cluster."""
    cluster = _current
    succession = _succession
    if (cluster is None or not cluster.alive) and succession is not None and not succession.done():
        with contextlib.suppress(Exception):
            prompts.wait(succession)
        cluster = _current
    return cluster if cluster is not None and cluster.alive else None


def failed_succession() -> BaseException | None:
    """Why the notebook could not attach to the head that replaced its own, once (then None)."""
    global _succession
    succession = _succession
    if succession is None or not succession.done() or _current is not None:
        return None
    _succession = None
    return succession.exception()


def attached() -> Cluster:
    """The attached cluster; :class:`ClusterConnectionError` when there is none."""
    cluster = current()
    if cluster is None:
        raise ClusterConnectionError("no cluster is attached: call jc.local() (or %cluster local) first")
    return cluster


def with_session_env(
    runtime_env: dict[str, Any] | None, attach: Callable[..., Cluster], *args: Any, **kwargs: Any
) -> Cluster:
    """``attach(*args, **kwargs)``, then the attached session's ``runtime_env`` set, if one is given
    (its shape is checked first: a mistake in it attaches nothing)."""
    env = _environment.check(runtime_env) if runtime_env is not None else None
    cluster = attach(*args, **kwargs)
    if env is not None:
        cluster.set_runtime_env(env)
    return cluster


def local(
    cpus: float | None = None,
    gpus: float | None = None,
    object_store: int | str | None = None,
    runtime_env: dict[str, Any] | None = None,
) -> Cluster:
    """Start the embedded local cluster (the agent as a child process) and attach to it.

    If one is already attached, it is returned as it is (with ``runtime_env``, if given, as
    its session's from now on: see :meth:`Cluster.set_runtime_env`).

    >>> cluster = jc.local(cpus=2)   # doctest: +SKIP
    """
    return with_session_env(runtime_env, _local, cpus, gpus, object_store)


def _local(cpus: float | None, gpus: float | None, object_store: int | str | None) -> Cluster:
    global _current
    with _lock:
        if _current is not None and _current.alive:
            return _current
        store = parse_size(object_store) if object_store is not None else None
        agent = EmbeddedAgent(cpus, gpus, store)
        link = AgentLink(UnixTransport(agent.socket, agent.exit_reason), agent.secret, uuid.uuid4().hex[:8])
        try:
            link.connect()
        except BaseException:
            agent.stop()
            raise
        _current = cluster = Cluster(link, kind="embedded local", agent=agent)
        cluster.dashboard_url = cast("str | None", agent.ready.get("dashboard"))  # Ray's, where the box has room
        if agent.ready.get("gcs"):
            token = " RAY_AUTH_MODE=token" if agent.ready.get("auth") == "token" else ""
            cluster.ray_env = f"RAY_ADDRESS={agent.ready['gcs']}{token}"
    tell("current", cluster)
    return cluster
