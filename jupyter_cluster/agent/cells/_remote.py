"""The Ray side of a cell: the task, the map chunk, the namespace actor, the relay.

Each is a thin Ray wrapper around :func:`run_in_namespace`. A cell's outputs are
separate Ray return values, owned by the agent that submitted the cell, so a later
cell can depend on one of them before it exists (a pending handle is an ObjectRef).
Printed output goes to the :class:`OutputRelay` actor on the head as it is written;
the agent pulls it from there and counts the batches so nothing arrives after the
cell's result.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import os
import pickle
import threading
import time
from collections.abc import Iterator
from typing import Any

import ray

from . import _relays
from ._execute import (
    CellOutcome,
    CellOutput,
    CellSpec,
    FailedValue,
    MapChunk,
    OutputInfo,
    failed_outputs,
    failure_from,
    fresh_namespace,
    run_in_namespace,
    unwrap,
    upstream_failure,
)
from ._interrupt import MainThreadCells, interrupt_process
from ._logs import unnoted
from ._sources import ModuleSource, install_sources

_node_ip: str | None = None


def node_ip() -> str:
    global _node_ip
    if _node_ip is None:
        _node_ip = ray.util.get_node_ip_address()
    return _node_ip


def bind_inputs(spec: CellSpec, ns: dict[str, Any], values: tuple[Any, ...]) -> None:
    """Put a cell's inputs into ``ns``: the notebook's own modules first (values may be
    made of their classes), then modules by name, then the values as given."""
    install_sources(spec.sources)
    ns.setdefault("ray", ray)
    for name, module in spec.modules.items():
        ns[name] = importlib.import_module(module)
    for name, value in zip(spec.inputs, values, strict=True):
        ns[name] = unwrap(value)


def run_cell_in(
    spec: CellSpec, ns: dict[str, Any], values: tuple[Any, ...], output: CellOutput
) -> tuple[CellOutcome, list[Any]]:
    """Bind the inputs and run the cell in ``ns``. A cell that reads the output of a
    failed cell does not run: it fails with that cell's error. The outputs of a failed
    cell carry its failure to the cells that read them."""
    failure = upstream_failure(spec, values)
    if failure is not None:
        outcome = CellOutcome(failure=failure, node=node_ip())
    else:
        bind_inputs(spec, ns, values)
        outcome, exported = run_in_namespace(spec, ns, output, node_ip())
    if outcome.failure is not None:
        exported = failed_outputs(spec, outcome.failure)
    return outcome, exported


#: The cell an actor runs now (set around each actor cell): what a run's own code
#: (``jc.train_torch``, ``jc.tune``) reads to send its events to that cell.
current_spec: CellSpec | None = None


def set_current(spec: CellSpec | None) -> None:
    """Set :data:`current_spec` (a module function: an actor's methods travel by value,
    with globals of their own, so a ``global`` statement there would not reach this module)."""
    global current_spec
    current_spec = spec


def _relay_sink(spec: CellSpec, stream: int = 0) -> Any:
    actor = _relays.relay(spec.relay)  # looked up by name once per worker (see ._relays)

    def push(index: int, batch: list[tuple[str, Any]]) -> Any:
        with unnoted():
            return actor.push.remote(spec.cell_id, stream, index, batch)

    return push


#: How long a worker waits, at most, for the agent's relay to take a cell's "running" marker. Not waited for, a
#: lone marker was seen to stay in the worker until its next push (an async cell without output was shown
#: queued to its end); a relay still starting (seconds, just after the agent started) is not waited for longer.
ANNOUNCE_WAIT = 2.0


def announce(spec: CellSpec, stream: int = 0, items: int = 1, event: str = "running") -> None:
    """Tell the notebook that the cell (or a ``--map`` chunk of ``items``) runs now, and where; with ``event``
    ``"chunk_ended"``, that the chunk's task is over.

    A batch with index -1 on the relay: the agent routes it as an event of that name. The relay takes one
    worker's calls in order, so a chunk's end reaches the notebook before the next chunk that worker starts: its
    count of running tasks never has both."""
    ref = _relay_sink(spec, stream)(-1, [(event, {"node": node_ip(), "items": items, "pid": os.getpid()})])
    try:
        ray.get(ref, timeout=ANNOUNCE_WAIT)
    except ray.exceptions.GetTimeoutError:  # the relay is slow: the cell need not wait for it
        pass


#: A cell that did not ask to be announced at once says it runs once it has run this long (seconds): its views
#: then say "running", not "queued", for as long as it runs; a shorter cell ends before any view could tell.
ANNOUNCE_AFTER = 0.25


class _Announcer:
    """One thread per worker process that announces the cells still running :data:`ANNOUNCE_AFTER` s after they
    began (a thread per cell, started and stopped, cost a trivial cell 1.5 ms)."""

    def __init__(self) -> None:
        self._due: dict[int, tuple[float, CellSpec]] = {}
        self._changed = threading.Condition()
        self._thread: threading.Thread | None = None

    def add(self, key: int, spec: CellSpec) -> None:
        with self._changed:
            self._due[key] = (time.monotonic() + ANNOUNCE_AFTER, spec)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="jupyter-cluster-announce", daemon=True)
                self._thread.start()
            elif len(self._due) == 1:
                self._changed.notify()  # it waits for a first cell

    def discard(self, key: int) -> None:
        with self._changed:
            self._due.pop(key, None)

    def _run(self) -> None:
        while True:
            with self._changed:
                now = time.monotonic()
                ready = [key for key, (due, _) in self._due.items() if due <= now]
                specs = [self._due.pop(key)[1] for key in ready]
                if not specs:
                    first = min((due for due, _ in self._due.values()), default=None)
                    self._changed.wait(None if first is None else first - now)
                    continue
            for spec in specs:
                try:
                    announce(spec)
                except Exception:  # the relay is gone (the agent stops): the cell goes on without its marker
                    pass


_announcer = _Announcer()


@contextlib.contextmanager
def announced(spec: CellSpec) -> Iterator[None]:
    """Tell the notebook the cell runs: at once where it asked (an ``--async`` cell, whose line says so), else
    once it has run :data:`ANNOUNCE_AFTER` s. A trivial cell is spared the relay's round trip (it doubled its
    time); a long one is not shown queued while it runs."""
    if spec.announce:
        announce(spec)
        yield
        return
    key = id(spec)
    _announcer.add(key, spec)
    try:
        yield
    finally:
        _announcer.discard(key)


def _returns(outcome: CellOutcome, values: list[Any]) -> Any:
    # The outcome travels as plain pickle bytes: Ray moves bytes faster than objects.
    envelope = pickle.dumps(outcome, protocol=5)
    return (envelope, *values) if values else envelope


@ray.remote
def run_cell_task(spec_bytes: bytes, *values: Any) -> Any:
    """One cell as one Ray task; returns ``(outcome bytes, *exported values)``."""
    spec: CellSpec = pickle.loads(spec_bytes)
    with announced(spec):
        outcome, exported = run_cell_in(spec, fresh_namespace(), values, CellOutput(_relay_sink(spec)))
    return _returns(outcome, exported)


@ray.remote
def run_map_chunk(spec_bytes: bytes, chunk: int, start: int, items: list[Any], *values: Any) -> Any:
    """Items ``start``... of a ``--map`` cell, each in its own fresh namespace; returns
    ``(MapChunk, *one list per output)``.

    The inputs are bound once for the chunk, not once per item. Each output's list holds
    the items' values for later cells; a value too large to come back is put in the object
    store here and its ref stands in the list (and in the chunk's ``refs``), so nothing
    large is copied to the agent.
    """
    spec: CellSpec = pickle.loads(spec_bytes)
    announce(spec, chunk, len(items))
    output = CellOutput(_relay_sink(spec, chunk))
    assert spec.map_name is not None
    result = MapChunk(start)
    lists: list[list[Any]] = [[] for _ in spec.outputs]
    failure = upstream_failure(spec, values)
    bound: dict[str, Any] = {}
    if failure is None:
        bind_inputs(spec, bound, values)
    for item in items:
        if failure is not None:
            result.add(spec, CellOutcome(failure=failure, node=node_ip()))
            break
        ns = fresh_namespace()
        ns.update(bound)
        ns[spec.map_name] = item
        outcome, exported = run_in_namespace(spec, ns, output, node_ip())
        result.add(spec, outcome)
        if outcome.failure is not None:
            break
        for name, value, kept in zip(spec.outputs, exported, lists, strict=True):
            info = outcome.outputs.get(name)
            if info is not None and info.kind == "remote":
                value = result.refs.setdefault(name, {})[result.count - 1] = ray.put(value)
            elif info is None or info.kind != "inline":
                value = None
            kept.append(value)
    announce(spec, chunk, len(items), "chunk_ended")
    return (result, *lists) if lists else result


@ray.remote
def run_function(label: str, sources: tuple[ModuleSource, ...], fn: Any, *args: Any) -> tuple[bool, Any]:
    """``jc.submit``: call a notebook function on the cluster; ``(ok, result)``, two Ray
    returns, so that whoever only needs to know how it went reads the tiny first one.

    An argument from a failed cell is passed on as it is, and a raise becomes this
    call's :class:`FailedValue`: whatever reads the result fails with the error, and its
    frames, not Ray's."""
    install_sources(sources)
    values = [unwrap(a) for a in args]
    failed = next((v for v in values if isinstance(v, FailedValue)), None)
    if failed is not None:
        return False, failed
    try:
        return True, unwrap(fn)(*values)
    except Exception as exc:
        failure = failure_from(exc, "", "")
        failure.origin = label
        return False, FailedValue(failure)


@ray.remote
class CellNamespace:
    """A named actor holding a persistent namespace; cells run in it one at a time.

    A plain (single-threaded) actor on purpose: its cells run on the actor process's
    main thread, where a signal interrupts even a blocking call (see
    :mod:`._interrupt`). Ray's own cancel only sets a flag for a running actor task.
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self.ns = fresh_namespace()
        self.cells = MainThreadCells()

    def where(self) -> dict[str, Any]:
        """Where to send an interrupt: the process, its node, its flag file."""
        node_id = ray.get_runtime_context().get_node_id()
        return {"pid": os.getpid(), "node_id": node_id, "flag": self.cells.flag, "node": node_ip()}

    def run(self, spec_bytes: bytes, *values: Any) -> Any:
        spec: CellSpec = pickle.loads(spec_bytes)
        output = CellOutput(_relay_sink(spec))
        set_current(spec)
        try:
            with self.cells.running(spec.cell_id), announced(spec):
                outcome, exported = run_cell_in(spec, self.ns, values, output)
        except KeyboardInterrupt as exc:  # an interrupt that landed just outside the cell's code
            failure = failure_from(exc, spec.source, spec.cell_id)
            outcome, exported = CellOutcome(failure=failure, node=node_ip()), failed_outputs(spec, failure)
        finally:
            set_current(None)
        return _returns(outcome, exported)

    def warm(self, modules: tuple[str, ...]) -> None:
        """Import ``modules`` now (those missing here are left out), so a cell that needs them starts at once."""
        for module in modules:
            try:
                importlib.import_module(module)
            except Exception:
                pass

    def describe(self) -> dict[str, Any]:
        names = sorted(k for k in self.ns if not k.startswith("__") and k != "display")
        return {"name": self.name, "node": node_ip(), "names": names}


@ray.remote(num_cpus=0)
def interrupt_actor_cell(pid: int, flag: str, cell_id: str) -> bool:
    """Interrupt ``cell_id`` in the actor process ``pid`` (run on that actor's node)."""
    return interrupt_process(pid, flag, cell_id)


@ray.remote(num_cpus=0)
class OutputRelay:
    """Carries printed output from workers to the agent while cells run."""

    def __init__(self) -> None:
        self._batches: list[tuple[str, int, int, list[tuple[str, Any]]]] = []
        self._ready: asyncio.Event | None = None
        #: A cell stopped at a breakpoint() (see ._breakpoint): who holds its debugger, and its commands.
        self._debugging: dict[str, str] = {}
        self._commands: dict[str, asyncio.Queue[str]] = {}

    def _event(self) -> asyncio.Event:
        if self._ready is None:
            self._ready = asyncio.Event()
        return self._ready

    async def push(self, cell_id: str, stream: int, index: int, batch: list[tuple[str, Any]]) -> None:
        # An async actor may run calls out of order: ``index`` lets the agent sort them
        # (per ``stream``: each chunk task of a --map cell numbers its own batches).
        self._batches.append((cell_id, stream, index, batch))
        self._event().set()

    async def pull(self) -> list[tuple[str, int, int, list[tuple[str, Any]]]]:
        await self._event().wait()
        self._event().clear()
        batches, self._batches = self._batches, []
        return batches

    async def claim(self, cell_id: str, claimant: str) -> bool:
        """Whether ``claimant`` (an item of the cell) may stop in the debugger: the first to ask, only."""
        return self._debugging.setdefault(cell_id, claimant) == claimant

    async def ask(self, cell_id: str, timeout: float) -> str | None:
        """The next command for cell ``cell_id``'s debugger, once the notebook sends it (None past ``timeout``)."""
        commands = self._commands.setdefault(cell_id, asyncio.Queue())
        try:
            return await asyncio.wait_for(commands.get(), timeout)
        except asyncio.TimeoutError:
            return None

    async def answer(self, cell_id: str, command: str) -> None:
        self._commands.setdefault(cell_id, asyncio.Queue()).put_nowait(command)

    async def forget(self, cell_ids: list[str]) -> None:
        """The cells ended: their debuggers' state goes."""
        for cell_id in cell_ids:
            self._debugging.pop(cell_id, None)
            self._commands.pop(cell_id, None)


__all__ = [
    "CellNamespace",
    "OutputInfo",
    "OutputRelay",
    "bind_inputs",
    "interrupt_actor_cell",
    "node_ip",
    "run_cell_in",
    "run_cell_task",
    "run_function",
    "run_map_chunk",
]
