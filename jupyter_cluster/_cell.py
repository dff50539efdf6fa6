"""A cell running on the cluster, as a future.

:class:`RemoteCell` is what :meth:`Cluster.run_cell` returns: ``result()``,
``cancel()``, ``done()``, ``status``, and the cell's output as it arrives. Events
from the agent reach it on the link's thread; the notebook's thread either waits
on :meth:`RemoteCell.events` (a cell that runs in the foreground, whose output then
lands in the running cell) or lets callbacks route it (``--async``, whose output
goes to the cell's own display area).
"""

from __future__ import annotations

import concurrent.futures
import difflib
import logging
import queue
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import cloudpickle

from ._analysis import analyse_cell
from ._errors import (
    AgentLostError,
    CellInterrupted,
    MissingOutputError,
    RemoteError,
    RequestError,
    cause_in_output,
    remote_error,
)
from ._handles import HandleOwner, ObjectHandle
from ._inputs import InputLedger, ShippedInputs
from ._modules import LazyModule
from ._prompts import answer_questions, wait
from .agent.cells._execute import CellOutcome, CellSpec, MapChunk, MapOutput, OutputInfo

if TYPE_CHECKING:
    from ._link import AgentLink


class CellOwner(HandleOwner, Protocol):
    """What a cell needs of its cluster (a :class:`._cluster.Cluster`, which sits above)."""

    _ledger: InputLedger
    _link: AgentLink
    python: str
    on_interrupt: str

    def _release_many(self, handle_ids: Iterable[str]) -> None: ...


log = logging.getLogger("jupyter_cluster")
#: What an output that does not come back (or was not assigned) reads as, before it becomes None in a list.
_ABSENT = object()


@dataclass
class RemoteRepr:
    """The display of a last-expression value too large to bring back."""

    bundle: dict[str, Any]

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, Any]:
        return self.bundle

    def __repr__(self) -> str:
        return str(self.bundle.get("text/plain", "<remote value>"))


@dataclass
class CellResult:
    """What a finished cell produced.

    ``outputs`` maps each exported name to its value, or to an :class:`ObjectHandle`
    for a value that stayed on the cluster; for a ``--map`` cell each is a list in
    input order. ``value`` is the last expression's value (``has_value`` tells
    whether there was one). ``warnings`` name outputs that could not come back.
    """

    outputs: dict[str, Any] = field(default_factory=dict)
    value: Any = None
    has_value: bool = False
    warnings: list[str] = field(default_factory=list)
    elapsed: float = 0.0
    node: str = ""


class RemoteCell:
    """A ``%%remote`` cell submitted to the cluster."""

    def __init__(
        self,
        cluster: CellOwner,
        spec: CellSpec,
        mode: str,
        shipped: ShippedInputs,
        label: str,
        where: str,
        pending_handles: bool,
        out_given: bool = False,
    ) -> None:
        self.cluster = cluster
        self.spec = spec
        self.mode = mode
        self.label = label
        self.where = where
        self.status = "queued"
        self.submitted = time.time()
        self.progress = (0, 0)
        #: Where it runs (a node's address), once it has started (``--async`` and ``--map`` cells say).
        self.node: str | None = None
        #: While Ray prepares the cell's runtime_env: what, for how long, its last log line.
        self.preparing: dict[str, Any] | None = None
        #: ``--map``: items whose chunk has started (done ones included), the chunks (Ray tasks) that have started,
        #: and those that have ended.
        self.started_items = 0
        self.started_tasks = 0
        self.done_tasks = 0
        self.stdout = ""
        self.stderr = ""
        #: The notebook's thread waits on it (:meth:`events`): the kernel is busy until it ends.
        self.foreground = False
        #: When it ended (``time.time()``), once it has.
        self.finished: float | None = None
        self._shipped = shipped
        self._future: concurrent.futures.Future[CellResult] = concurrent.futures.Future()
        self._events: queue.Queue[tuple[str, Any]] = queue.Queue()
        self._listeners: list[Callable[[str, Any], None]] = []
        self._done_callbacks: list[Callable[[RemoteCell], None]] = []
        self._history: list[tuple[str, Any]] = []
        self._lock = threading.Lock()
        self._settle_callbacks: list[Callable[[RemoteCell], None]] = []
        self._settled = False
        #: How the cell ended, once it has: its failure, or its result.
        self.error: BaseException | None = None
        self.final: CellResult | None = None
        #: Whether the outputs were named (``--out``): a name the cell did not assign is then worth a word.
        self.out_given = out_given
        self.handles: dict[str, ObjectHandle] = {}
        if pending_handles:
            for name in spec.outputs:
                self.handles[name] = ObjectHandle(
                    f"{spec.cell_id}/{name}", cluster=cluster, name=name, pending=True, label=label
                )

    @property
    def running_items(self) -> int:
        """``--map``: items started and not done yet."""
        return self.started_items - self.progress[0]

    @property
    def running_tasks(self) -> int:
        """``--map``: the Ray tasks running its items now (a task runs a chunk of items, one after another)."""
        return max(0, self.started_tasks - self.done_tasks)

    @property
    def cell_id(self) -> str:
        return self.spec.cell_id

    @property
    def sent_bytes(self) -> int:
        """Bytes of input values this cell sent (0 when every input was already held)."""
        return self._shipped.sent_bytes

    # ------------------------------------------------------------ future API
    def result(self, timeout: float | None = None) -> CellResult:
        """Wait for the cell; return its :class:`CellResult` or raise its error. A login's questions while the link
        reconnects meanwhile are asked here (:mod:`._prompts`)."""
        return wait(self._future, timeout)

    def done(self) -> bool:
        return self._future.done()

    def cancel(self) -> bool:
        """Ask the cluster to stop the cell (interrupt, then kill a task that ignores it)."""
        if self.done():
            return False
        self.cluster._link.request("cancel", {"cell_id": self.cell_id})
        return True

    def answer(self, command: str) -> None:
        """Send ``command`` to the debugger a ``breakpoint()`` in the cell stopped in (what the notebook's prompt
        does when the cell runs in the foreground)."""
        if not self.done():
            self.cluster._link.request("answer", {"cell_id": self.cell_id, "command": command})

    def exception(self, timeout: float | None = None) -> BaseException | None:
        return self._future.exception(timeout)

    def add_done_callback(self, fn: Callable[[RemoteCell], None]) -> None:
        with self._lock:
            if not self._future.done():
                self._done_callbacks.append(fn)
                return
        fn(self)

    def on_settle(self, callback: Callable[[RemoteCell], None]) -> None:
        """Call ``callback(cell)`` when the cell ends, before its pending handles resolve
        (or fail) and before ``result()`` returns: whoever waits on them sees what it did.
        A cell that has ended already (a quick one) calls it at once."""
        with self._lock:
            if not self._settled:
                self._settle_callbacks.append(callback)
                return
        self._call_settle(callback)

    def _settle(self) -> None:
        with self._lock:
            self._settled = True
            callbacks, self._settle_callbacks = self._settle_callbacks, []
        for callback in callbacks:
            self._call_settle(callback)

    def _call_settle(self, callback: Callable[[RemoteCell], None]) -> None:
        try:
            callback(self)
        except Exception:
            log.exception("a settle callback of %s failed", self.label)

    def subscribe(self, listener: Callable[[str, Any], None]) -> None:
        """Call ``listener(event, data)`` for every event, those already past first."""
        with self._lock:
            for event, data in self._history:
                listener(event, data)
            if not self._future.done():
                self._listeners.append(listener)

    def events(self, poll: float = 0.1, until: Callable[[], bool] | None = None) -> Iterator[tuple[str, Any]]:
        """Yield ``(event, data)`` in the calling thread until the cell is finished (or,
        checked while no event comes, until ``until()`` is true)."""
        self.foreground = True
        while True:
            try:
                event = self._events.get(timeout=poll)
            except queue.Empty:
                answer_questions()  # a login's, while the link reconnects (:mod:`._prompts`)
                if self._future.done() and self._events.empty():
                    return
                if until is not None and until():
                    return
                continue
            if event[0] == "finished":
                return
            yield event
            if self._future.done() and event[0] in ("done", "error", "lost"):
                return

    def __repr__(self) -> str:
        return f"<RemoteCell {self.label} {self.mode} {self.status}>"

    # ---------------------------------------------------------------- events
    def _on_event(self, event: str, data: Any) -> None:
        if event == "started":
            if not self.spec.announce:  # else "running" says when it really starts
                self.status = "running"
            self.cluster._ledger.accepted(self._shipped)
        elif event == "stream":
            for kind, text in data:
                if kind == "stdout":
                    self.stdout += text
                elif kind == "stderr":
                    self.stderr += text
        elif event == "preparing":
            if self.started_items == 0 and not self.done():  # ("started" may have said running)
                self.status = "preparing"
            self.preparing = data
        elif event == "running":
            if not self.done():  # (a long cell's marker, sent as it ended, may come after its end)
                self.status = "running"
            self.node = data.get("node")
            self.started_items += int(data.get("items", 1))
            self.started_tasks += 1
        elif event == "progress":
            self.progress = (data["done"], data["total"])
        elif event == "chunk_ended":  # a --map chunk's task is over (its worker says so before starting another)
            self.done_tasks += 1
        elif event == "done":
            self.cluster._ledger.accepted(self._shipped)
            self._finish(data)
        elif event in ("error", "lost"):
            error = data if isinstance(data, BaseException) else RequestError(data.get("message", "failed"), data)
            self._fail(error)
        if event != "started" and (event != "running" or self.mode == "map" or self.preparing is not None):
            # (a plain "running" need not wake a waiting notebook: one that showed a preparing line does)
            self._events.put((event, data))
        with self._lock:
            self._history.append((event, data))
            for listener in self._listeners:
                listener(event, data)
            if self.done():
                # Those who listen to it keep it, not the other way round: a cell that ended is freed with the
                # last reference to it, and the outputs it holds (handles of objects in the cluster's store)
                # with it, not at the garbage collector's next full pass.
                self._listeners.clear()
        if self.done():
            self._events.put(("finished", None))

    def _call_done_callbacks(self) -> None:
        with self._lock:
            callbacks, self._done_callbacks = self._done_callbacks, []
        for callback in callbacks:
            try:
                callback(self)
            except Exception:
                log.exception("a done callback of %s failed", self.label)

    def _fail(self, error: BaseException) -> None:
        if self._future.done():
            return
        self.status = "cancelled" if isinstance(error, KeyboardInterrupt) else "failed"
        self.error = error
        self._settle()
        for handle in self.handles.values():
            handle._fail(error)
        self.finished = time.time()
        self._future.set_exception(error)
        self._call_done_callbacks()

    def _finish(self, data: dict[str, Any]) -> None:
        # One end time for every view: the result's elapsed, the bar's last line, the sidebar's row.
        ended = time.time()
        handles: dict[str, str] = data.get("handles", {})
        if "map" in data:
            chunks: list[MapChunk] = data["map"].load()
            failure = next((c.failure for c in chunks if c.failure is not None), None)
        else:
            outcome: CellOutcome = data["outcome"]
            failure = outcome.failure
        if failure is not None:
            self.cluster._release_many(handles.values())
            if failure.interrupted and not failure.origin and "--timeout" not in failure.message:
                self._fail(CellInterrupted(_interrupt_message(failure.message, self.label, self.where)))
            else:
                error = remote_error(failure, self.spec.source, self.cell_id, self.label, self.where)
                # Its real cause may be only in what Ray logged as errors while it ran (an RLlib env runner's).
                error.note = error.note or cause_in_output(self.stderr + "\n" + data.get("ray_errors", ""))
                self._fail(error)
            return
        if "map" in data:
            result = self._map_result(chunks, ended)
            absent = {n for c in chunks for n, out in c.outputs.items() if "missing" in out.kinds()}
        else:
            result = CellResult(elapsed=ended - self.submitted, node=outcome.node)
            unloadable: dict[str, str] = {}
            for name, info in outcome.outputs.items():
                value = self._output(name, info, outcome.node, result, unloadable)
                if value is not _ABSENT:
                    result.outputs[name] = value
            self._warn_unloadable(result, unloadable)
            result.value = self._value(outcome.value)
            result.has_value = outcome.value is not None
            absent = {n for n, info in outcome.outputs.items() if info.kind == "missing"}
        missing = self._missing(absent)
        result.warnings.extend(missing.values())
        self.final = result
        self._settle()
        for name, handle in self.handles.items():
            if name not in result.outputs:
                handle._fail(MissingOutputError(missing.get(name) or f"the cell did not assign `{name}`"))
            elif isinstance(result.outputs[name], ObjectHandle):
                handle._resolve(result.outputs[name].meta)
            else:
                handle._resolve(value=result.outputs[name], has_value=True)
        # The agent holds every output for cells that depend on it; let go of those
        # that came back and that no pending handle still names.
        keep = {h.id for h in self.handles.values()}
        for value in result.outputs.values():
            items = value if isinstance(value, list) and self.spec.map_name else [value]
            keep.update(v.id for v in items if isinstance(v, ObjectHandle))
        self.cluster._release_many(h for h in handles.values() if h not in keep)
        self.status = "done"
        self.finished = ended
        self._future.set_result(result)
        self._call_done_callbacks()

    def _map_result(self, chunks: list[MapChunk], ended: float) -> CellResult:
        """A ``--map`` cell's result: each output a list in item order (read chunk by chunk, item by item:
        this runs once per item, so it stays plain)."""
        result = CellResult(elapsed=ended - self.submitted, node=chunks[0].node if chunks else "")
        unloadable: dict[str, str] = {}
        count = sum(c.count for c in chunks)
        for name in self.spec.outputs:
            outputs = [(c, c.outputs.get(name) or MapOutput()) for c in chunks]
            if any("module" in out.kinds() for _, out in outputs):  # an `import` must not become a list
                chunk, out = next((c, o) for c, o in outputs if "module" in o.kinds())
                module = next(i for i in out.other.values() if i.kind == "module")
                result.outputs[name] = self._output(name, module, chunk.node, result, unloadable)
                continue
            values: list[Any] = []
            present = False
            for chunk, out in outputs:
                for index in range(len(out.inline)):
                    item = out.info(index)
                    value = _ABSENT if item is None else self._output(name, item, chunk.node, result, unloadable, True)
                    present = present or value is not _ABSENT
                    values.append(None if value is _ABSENT else value)
            if name in unloadable:  # the list stays whole on the cluster
                meta = {"type": "list", "len": count, "node": result.node}
                result.outputs[name] = ObjectHandle(f"{self.cell_id}/{name}", meta, cluster=self.cluster, name=name)
            elif present:
                result.outputs[name] = values
        self._warn_unloadable(result, unloadable)
        shown = [self._value(c.values.info(i)) for c in chunks for i in range(len(c.values.inline))]
        result.has_value = self.spec.display_last and any(v is not None for v in shown)
        result.value = shown if result.has_value else None
        return result

    @staticmethod
    def _warn_unloadable(result: CellResult, unloadable: dict[str, str]) -> None:
        for name, reason in unloadable.items():
            result.warnings.append(
                f"`{name}` cannot be loaded in the notebook ({reason}); it stays on the cluster as a handle, "
                f"which later remote cells read as the value."
            )

    def _missing(self, absent: set[str]) -> dict[str, str]:
        """What to say of each ``--out`` name the cell did not assign (``absent``: the names it did not)."""
        if not self.out_given:
            return {}
        assigned = analyse_cell(self.spec.source).outputs
        said = {}
        for name in (n for n in self.spec.outputs if n in absent):
            close = difflib.get_close_matches(name, assigned, n=1)
            hint = f" (did you mean `{close[0]}`?)" if close else ""
            said[name] = f"--out names `{name}`, which the cell did not assign{hint}; nothing was bound to it."
        return said

    def _output(
        self,
        name: str,
        info: OutputInfo,
        node: str,
        result: CellResult,
        unloadable: dict[str, str],
        item: bool = False,
    ) -> Any:
        """The notebook's value of one exported name (of one ``--map`` item where ``item``), or
        :data:`_ABSENT`; what cannot come back is said in ``result.warnings`` (once) or ``unloadable``."""
        if info.kind == "inline" and not self.cluster._ledger.accepts_code(info.data):
            # Code pickled by another Python (a function or class the cell defined) could
            # load here and then misbehave: it stays on the cluster, usable by later cells.
            warning = (
                f"`{name}` carries Python code made by the cluster's Python {self.cluster.python}; "
                "it stays on the cluster (later remote cells can use it)."
            )
            if warning not in result.warnings:
                result.warnings.append(warning)
            return _ABSENT if item else self._remote_handle(name, {"type": "Python code", "node": node})
        if info.kind == "inline":
            try:
                return cloudpickle.loads(info.data)
            except Exception as exc:  # its class lives in a module only the cluster has, say
                unloadable.setdefault(name, f"{info.meta.get('type', 'its type')}: {type(exc).__name__}: {exc}")
                return _ABSENT if item else self._remote_handle(name, {**info.meta, "node": node})
        if info.kind == "remote":
            pending = None if item else self.handles.get(name)
            if pending is not None:  # the same handle the notebook already holds
                pending.meta.update(info.meta)
                return pending
            handle_id = info.meta.get("handle") or f"{self.cell_id}/{name}"
            return ObjectHandle(handle_id, info.meta, cluster=self.cluster, name=name)
        if info.kind == "module":
            # The kernel's own module if it has one; else a stand-in that later cells read by
            # name: a cell's `import torch` must not load torch (or ray) into the notebook.
            module = info.meta["module"]
            return sys.modules.get(module) or LazyModule(module)
        if info.kind == "unpicklable" and (self.out_given or self.mode != "driver"):
            # A driver cell's value stays where it is, in the driver's namespace, for later driver cells: a pasted
            # script that assigns a generator or a lock did not ask for it here, and hears nothing of it.
            warning = (
                f"`{name}` ({info.meta.get('type')}) cannot leave the cluster ({info.meta.get('error')}); "
                "it was not brought back. Keep it remote with `%%remote --actor NAME`."
            )
            if warning not in result.warnings:
                result.warnings.append(warning)
        return _ABSENT

    def _remote_handle(self, name: str, meta: dict[str, Any]) -> ObjectHandle:
        """A handle to an output the agent holds as ``<cell>/<name>`` (every task output)."""
        pending = self.handles.get(name)
        if pending is not None:
            pending.meta.update(meta)
            return pending
        return ObjectHandle(f"{self.cell_id}/{name}", meta, cluster=self.cluster, name=name)

    @staticmethod
    def _value(info: OutputInfo | None) -> Any:
        if info is None:
            return None
        if info.kind == "inline":
            try:
                return cloudpickle.loads(info.data)
            except Exception as exc:
                kind = info.meta.get("type", "value")
                return RemoteRepr({"text/plain": f"<a {kind} the notebook cannot load: {type(exc).__name__}: {exc}>"})
        if info.kind == "repr":
            return RemoteRepr(info.meta["bundle"])
        return None


def _interrupt_message(message: str, label: str, where: str) -> str:
    """What an interrupted cell says: which cell was cancelled, and why it may still run, if it does."""
    _, _, rest = message.partition("), but ")
    return f"cancelled the remote cell ({label}, {where})" + (f", but {rest}" if rest else "")


__all__ = ["AgentLostError", "CellResult", "RemoteCell", "RemoteError", "RemoteRepr"]
