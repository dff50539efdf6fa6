"""Running one cell's source in a namespace, wherever that namespace lives.

The same code runs a cell inside a Ray task, inside a named actor and in the agent's
own driver namespace: compile the source under a filename that names the cell, run
the body, evaluate a trailing expression, capture ``print`` and ``display`` as a
stream of chunks, render matplotlib figures, and describe each exported name as a
small inline value or a large one that stays on the cluster. A failure becomes a
:class:`RemoteFailure` whose frames are the user's own, without this module's or
Ray's. Only the standard library and cloudpickle are imported here.
"""

from __future__ import annotations

import ast
import builtins
import dataclasses
import functools
import hashlib
import io
import linecache
import os
import re
import sys
import threading
import time
import traceback
import types
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

try:
    import cloudpickle
except ImportError:  # a head without it: Ray carries its own copy
    from ray import cloudpickle  # type: ignore[no-redef,unused-ignore]

from .._protocol import Pickled
from . import _breakpoint, _logs, _snapshot
from ._snapshot import FrameSnapshot
from ._sources import ModuleSource

#: Where output goes: ``sink(index, batch)``, batches numbered from 0 (a relay may
#: reorder them); each item is ``(kind, data)`` with kind ``"stdout"``, ``"stderr"``
#: (data a str) or ``"display"`` (data a mime bundle).
Sink = Callable[[int, list[tuple[str, Any]]], None]

_HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # jupyter_cluster/agent: the agent's frames
#: The values a failing ``--map`` item's snapshot may hold (a cell's may hold :data:`_snapshot.TOTAL_BYTES`).
MAP_SNAPSHOT_BYTES = 2 << 20


def cell_filename(source: str) -> str:
    """The filename a cell's code objects carry: named by content, so tracebacks through
    functions an earlier cell defined still find their source, and the compiled code
    of a cell run again is reused."""
    return f"<remote-cell-{hashlib.blake2b(source.encode(), digest_size=6).hexdigest()}>"


@dataclass
class CellSpec:
    """What a cell asks for; built by the kernel, read by the agent and the worker."""

    cell_id: str
    source: str
    inputs: tuple[str, ...] = ()
    modules: dict[str, str] = field(default_factory=dict)
    outputs: tuple[str, ...] = ()
    display_last: bool = False
    threshold: int = 1 << 20
    map_name: str | None = None
    relay: str = ""  # the name of the agent's output relay actor
    label: str = ""  # how the notebook names the cell ("Cell In[5]")
    sources: tuple[ModuleSource, ...] = ()  # modules of the notebook's own, as source
    announce: bool = False  # say where and when it starts running (the notebook shows it)


@dataclass
class OutputInfo:
    """One exported name: inline (``data`` holds its pickle) or remote (``meta``)."""

    kind: str  # "inline" | "remote" | "module" | "unpicklable" | "missing"
    data: bytes = b""
    meta: dict[str, Any] = field(default_factory=dict)


@dataclass
class RemoteFailure:
    """An exception raised by a cell, with the user's frames only."""

    type_name: str
    module: str
    message: str
    frames: list[tuple[str, int, str, str]]
    exception: bytes | None
    interrupted: bool = False
    #: Where it was raised, when that is another cell than the one failing with it: an
    #: upstream whose output this cell read (its label and source), and that input's name.
    origin: str = ""
    origin_source: str = ""
    via: str = ""
    #: The user's frames as they were when it raised (what ``%debug`` opens), outermost first; None: not taken.
    snapshot: list[FrameSnapshot] | None = None
    #: Where it raised (the worker's node), for what ``%debug`` says.
    node: str = ""


@dataclass
class FailedValue:
    """What each output of a failed cell holds: a cell that reads one fails with
    the original error, before it runs (never with ``None`` in its place)."""

    failure: RemoteFailure


def failed_outputs(spec: CellSpec, failure: RemoteFailure) -> list[Any]:
    """The values a failed cell's outputs take: its failure, named after the cell that raised it."""
    if not failure.origin:
        failure = dataclasses.replace(failure, origin=spec.label or spec.cell_id, origin_source=spec.source, via="")
    marker = FailedValue(failure)
    return [marker] * len(spec.outputs)


def upstream_failure(spec: CellSpec, values: tuple[Any, ...]) -> RemoteFailure | None:
    """The failure of an upstream cell that one of these input values carries, if any."""
    for name, value in zip(spec.inputs, values, strict=False):
        found = value if isinstance(value, FailedValue) else None
        if found is None and isinstance(value, (list, tuple)):
            found = next((v for v in value if isinstance(v, FailedValue)), None)
        if found is not None:
            return dataclasses.replace(found.failure, via=name)
    return None


@dataclass
class CellOutcome:
    """What a finished cell sends back (values themselves travel beside it)."""

    outputs: dict[str, OutputInfo] = field(default_factory=dict)
    value: OutputInfo | None = None
    failure: RemoteFailure | None = None
    chunks_sent: int = 0
    node: str = ""
    elapsed: float = 0.0
    #: Tasks and actors the cell's code started (its end waits for what they print: see ._logs).
    spawned: int = 0


@dataclass
class MapOutput:
    """One exported name (or the last expression's value) over the items of a ``--map`` chunk.

    Flat on purpose: a million items are a million small pickles in one list, not a million
    :class:`OutputInfo` objects, so that a chunk costs the agent (which only passes it on)
    and the notebook (which reads it) one pickle each."""

    #: Per item: its value's pickle where it came back inline, else None.
    inline: list[bytes | None] = field(default_factory=list)
    #: The items that did not come back inline (remote, module, missing, ...), by index in the chunk.
    other: dict[int, OutputInfo] = field(default_factory=dict)

    def add(self, info: OutputInfo | None) -> None:
        if info is not None and info.kind == "inline":
            self.inline.append(info.data)
            return
        if info is not None:
            self.other[len(self.inline)] = info
        self.inline.append(None)

    def info(self, index: int) -> OutputInfo | None:
        """Item ``index``'s output as a cell's own would be (None: the item had none)."""
        data = self.inline[index]
        return OutputInfo("inline", data) if data is not None else self.other.get(index)

    def kinds(self) -> set[str]:
        """The kinds of the items that did not come back inline."""
        return {info.kind for info in self.other.values()}


@dataclass
class MapChunk:
    """What one chunk of a ``--map`` sends back: a summary and, per output, its items' values.

    The values themselves (for later cells) travel beside it, as one list per output; values too
    large to come back stay in the object store, and ``refs`` holds them (by output name and
    index in the chunk) until the agent takes them out: the notebook never sees an ObjectRef."""

    start: int
    count: int = 0
    outputs: dict[str, MapOutput] = field(default_factory=dict)
    values: MapOutput = field(default_factory=MapOutput)
    #: The first item that failed (the chunk stops there), and its index in the chunk.
    failure: RemoteFailure | None = None
    failed_at: int = -1
    chunks_sent: int = 0
    node: str = ""
    elapsed: float = 0.0
    spawned: int = 0
    refs: dict[str, dict[int, Any]] = field(default_factory=dict)

    def add(self, spec: CellSpec, outcome: CellOutcome) -> None:
        """Item number ``self.count``'s outcome."""
        for name in spec.outputs:
            self.outputs.setdefault(name, MapOutput()).add(outcome.outputs.get(name))
        self.values.add(outcome.value)
        if outcome.failure is not None and self.failure is None:
            self.failure, self.failed_at = outcome.failure, self.count
        self.count += 1
        self.chunks_sent = outcome.chunks_sent  # the items share one output: the last counts every batch
        self.node = outcome.node
        self.elapsed += outcome.elapsed
        self.spawned += outcome.spawned


class CellStream(io.TextIOBase):
    """A text stream that batches writes into chunks for a :data:`Sink`.

    Writes within ``interval`` seconds of the last send are held and sent together
    (by the next write, a timer, or :meth:`CellOutput.close`), so a loop of a
    million prints costs a few dozen messages, not a million.
    """

    def __init__(self, output: CellOutput, name: str) -> None:
        self._output = output
        self.name = name
        self._pid = os.getpid()
        self._forked = ""  # a forked child's partial line

    def write(self, text: str) -> int:
        if text and os.getpid() != self._pid:
            # A forked child (a multiprocessing pool) has this stream but not the thread that sends its batches:
            # its lines go to its descriptor, which the agent reads for the running driver cell (._fdout), a line
            # a write, as a buffered stream writes them (children writing at once must not mix their lines).
            self._forked += text
            cut = self._forked.rfind("\n") + 1
            if cut:
                line, self._forked = self._forked[:cut], self._forked[cut:]
                os.write(1 if self.name == "stdout" else 2, line.encode(errors="replace"))
        elif text:
            self._output.add(self.name, text)
        return len(text)

    def writable(self) -> bool:
        return True

    def flush(self) -> None:
        if os.getpid() != self._pid:
            if self._forked:
                line, self._forked = self._forked, ""
                os.write(1 if self.name == "stdout" else 2, line.encode(errors="replace"))
            return
        self._output.flush()

    def isatty(self) -> bool:
        return False


class CellOutput:
    """Collects a cell's stdout, stderr and displays, and sends them in batches."""

    def __init__(self, sink: Sink, interval: float = 0.05, before_close: Callable[[], None] | None = None) -> None:
        self._sink = sink
        self._interval = interval
        #: Called as the output closes, before its last batch (the driver's descriptors read to their end).
        self._before_close = before_close
        self.closed = False
        self._lock = threading.Lock()
        self._pending: list[tuple[str, Any]] = []
        self._last_send = 0.0
        self._timer: threading.Timer | None = None
        self.sends = 0

    def add(self, kind: str, data: Any, lines: bool = False) -> None:
        """Take ``data`` of ``kind`` (``stdout``, ``stderr``: text; ``display``: a bundle). ``lines``: whole lines
        of another writer (the driver's descriptors, where its child processes write), which go before a partial
        line of the cell's own still waiting for its end: ``print("spawn", pool.map(...))`` writes ``spawn``, then
        the rest, and the children's lines, read from their pipe a moment late, must not land in between."""
        with self._lock:
            last = self._pending[-1] if self._pending else None
            if kind != "display" and last is not None and last[0] == kind:
                text = last[1]
                cut = text.rfind("\n") + 1 if lines else len(text)
                self._pending[-1] = (kind, text[:cut] + data + text[cut:])
            else:
                self._pending.append((kind, data))
            # A partial line waits for the rest of it (print writes text, then "\n").
            due = time.monotonic() - self._last_send >= self._interval and (kind == "display" or "\n" in data)
            if not due and self._timer is None:
                self._timer = threading.Timer(self._interval, self.flush)
                self._timer.daemon = True
                self._timer.start()
        if due:
            self.flush(whole=False)

    def flush(self, whole: bool = True) -> None:
        """Send what is pending; ``whole=False``: all but a last partial line, which waits for its end (or the
        timer): a worker's line, which reaches the notebook by another way, must not land inside it."""
        with self._lock:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            batch, self._pending = self._pending, []
            if not whole and batch and batch[-1][0] != "display" and not batch[-1][1].endswith("\n"):
                kind, text = batch.pop()
                cut = text.rfind("\n") + 1
                if cut:
                    batch.append((kind, text[:cut]))
                self._pending = [(kind, text[cut:])]
                self._timer = threading.Timer(self._interval, self.flush)
                self._timer.daemon = True
                self._timer.start()
            if not batch:
                return
            self._last_send = time.monotonic()
            self._sink(self.sends, batch)
            self.sends += 1

    def add_open(self, kind: str, data: Any) -> bool:
        """:meth:`add` of whole ``lines`` (another writer's), unless the output is closed (its batches are
        counted): then False."""
        with self._lock:
            if self.closed:
                return False
        self.add(kind, data, lines=True)
        return True

    def close(self) -> None:
        if self._before_close is not None:
            self._before_close()
        self.flush()
        with self._lock:
            self.closed = True


def mime_bundle(obj: Any) -> dict[str, Any]:
    """The rich representations of ``obj``, as IPython's ``display`` would build them.

    Built without IPython (a worker may not have it): the ``_repr_*_`` protocol,
    matplotlib figures as PNG, and ``repr`` as ``text/plain``.
    """
    bundle: dict[str, Any] = {}
    method = getattr(obj, "_repr_mimebundle_", None)
    if callable(method):
        try:
            found = method()
            data = found[0] if isinstance(found, tuple) else found
            if isinstance(data, dict):
                bundle.update(data)
        except Exception:  # a broken repr must not fail the cell
            pass
    for mime, name in (
        ("text/html", "_repr_html_"),
        ("text/markdown", "_repr_markdown_"),
        ("image/svg+xml", "_repr_svg_"),
        ("image/png", "_repr_png_"),
        ("image/jpeg", "_repr_jpeg_"),
        ("text/latex", "_repr_latex_"),
        ("application/json", "_repr_json_"),
    ):
        method = getattr(obj, name, None)
        if mime not in bundle and callable(method):
            try:
                data = method()
            except Exception:
                data = None
            if data is not None:
                bundle[mime] = data
    if "image/png" not in bundle and type(obj).__module__.startswith("matplotlib.figure"):
        bundle["image/png"] = _figure_png(obj)
    bundle.setdefault("text/plain", _safe_repr(obj))
    return bundle


def _figure_png(figure: Any) -> bytes:
    buf = io.BytesIO()
    figure.savefig(buf, format="png", bbox_inches="tight")
    return buf.getvalue()


def _safe_repr(obj: Any, limit: int = 10_000) -> str:
    try:
        text = repr(obj)
    except Exception as exc:
        text = f"<{type(obj).__name__} object; repr failed: {exc!r}>"
    return text if len(text) <= limit else text[:limit] + "…"


def type_name(value: Any) -> str:
    """``numpy.ndarray``, ``dict``: a value's type as a handle's repr shows it."""
    cls = type(value)
    return cls.__qualname__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__qualname__}"


def describe(value: Any) -> dict[str, Any]:
    """Type, shape, dtype and size of a value, for a handle's repr."""
    meta: dict[str, Any] = {"type": type_name(value)}
    shape = getattr(value, "shape", None)
    if isinstance(shape, tuple) and all(isinstance(n, int) for n in shape):
        meta["shape"] = list(shape)
    elif hasattr(value, "__len__"):
        try:
            meta["len"] = len(value)
        except Exception:
            pass
    dtype = getattr(value, "dtype", None)
    if dtype is not None:
        meta["dtype"] = str(dtype)
    return meta


def _nbytes(value: Any) -> int | None:
    size = getattr(value, "nbytes", None)
    if isinstance(size, int):
        return size
    if isinstance(value, (bytes, bytearray, memoryview)):
        return len(value)
    return None


def package_value(value: Any, threshold: int) -> tuple[OutputInfo, Any]:
    """Describe ``value`` and choose what travels as its Ray return value.

    Returns the :class:`OutputInfo` for the envelope and the object to return.
    Arrays above the threshold are returned as they are (Ray stores them without a
    copy); other large values are pickled once and returned as :class:`Pickled`, their
    own large buffers (arrays inside a dict, say) kept out of band.
    """
    if isinstance(value, types.ModuleType):
        return OutputInfo("module", meta={"module": value.__name__}), value.__name__
    nbytes = _nbytes(value)
    if nbytes is not None and nbytes > threshold:
        return OutputInfo("remote", meta={**describe(value), "nbytes": nbytes}), value
    try:
        blob = Pickled.of(value, cloudpickle.dumps)
    except Exception as exc:
        meta = {**describe(value), "error": f"{type(exc).__name__}: {exc}"}
        return OutputInfo("unpicklable", meta=meta), None
    if blob.nbytes > threshold:
        meta = {**describe(value), "nbytes": nbytes if nbytes is not None else blob.nbytes}
        return OutputInfo("remote", meta=meta), blob
    data = blob.data if not blob.buffers else cloudpickle.dumps(value)  # small: all in band
    if _NEEDS_RAY.search(data):
        # Ray objects (ObjectRefs, remote functions, actor handles) mean nothing without
        # Ray, and the kernel never imports it: they stay on the cluster behind a handle.
        return OutputInfo("remote", meta={**describe(value), "nbytes": len(data)}), value
    # The type travels too: if the notebook cannot load the value, its handle says what it is.
    return OutputInfo("inline", data=data, meta={"type": type_name(value)}), value


#: A pickle that imports a module of Ray's: SHORT_BINUNICODE "ray" or "ray.…", memoized.
_NEEDS_RAY = re.compile(rb"\x8c[\x03-\xff]ray[.\x94]")


def unwrap(value: Any) -> Any:
    """The value a cell sees for an input that may arrive still pickled."""
    return value.load() if isinstance(value, Pickled) else value


def compile_cell(spec: CellSpec) -> tuple[types.CodeType, types.CodeType | None]:
    """Compile the body, and the trailing expression separately if it is displayed."""
    return _compile(spec.source, spec.display_last)


@functools.lru_cache(maxsize=256)
def _compile(source: str, display_last: bool) -> tuple[types.CodeType, types.CodeType | None]:
    filename = cell_filename(source)
    tree = ast.parse(source, filename)
    # The cell's lines, where this process's tracebacks and a breakpoint()'s pdb look for them.
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    last: types.CodeType | None = None
    if display_last and tree.body and isinstance(tree.body[-1], ast.Expr):
        expr = ast.Expression(tree.body.pop().value)  # type: ignore[attr-defined]
        last = compile(expr, filename, "eval", dont_inherit=True)
    # dont_inherit: a cell's code gets this module's `from __future__ import annotations`
    # otherwise, and its annotations turn into strings (FastAPI, pydantic and dataclasses
    # then cannot resolve them on the workers).
    return compile(tree, filename, "exec", dont_inherit=True), last


def fresh_namespace() -> dict[str, Any]:
    return {"__name__": "__main__", "__builtins__": builtins, "display": _no_display}


def _no_display(*objs: Any) -> None:  # replaced while a cell runs
    for obj in objs:
        print(_safe_repr(obj))


class _Capture:
    """Redirects stdout/stderr (and ``display``) of a running cell into a CellOutput."""

    def __init__(self, output: CellOutput, ns: dict[str, Any]) -> None:
        self.output = output
        self.ns = ns

    def display(self, *objs: Any, **_: Any) -> None:
        for obj in objs:
            self.output.add("display", mime_bundle(obj))

    def __enter__(self) -> _Capture:
        self._saved = sys.stdout, sys.stderr, self.ns.get("display")
        sys.stdout = CellStream(self.output, "stdout")
        sys.stderr = CellStream(self.output, "stderr")
        self.ns["display"] = self.display
        warnings.filterwarnings("ignore", message=".*non-interactive.*cannot be shown")
        return self

    def __exit__(self, *exc: object) -> None:
        sys.stdout, sys.stderr, shown = self._saved
        self.ns["display"] = shown


def _show_figures(output: CellOutput) -> None:
    pyplot = sys.modules.get("matplotlib.pyplot")
    if pyplot is None:
        return
    for number in pyplot.get_fignums():
        figure = pyplot.figure(number)
        output.add("display", {"image/png": _figure_png(figure), "text/plain": repr(figure)})
    pyplot.close("all")


_SERVE_FAILED = re.compile(r"Deploying application (\S+) failed")


def _serve_detail(message: str) -> str:
    """Why a Serve application failed to deploy, from Serve's status: ``serve.run`` says
    only which deployments failed; their replicas' own errors are in Serve's status."""
    match = _SERVE_FAILED.search(message)
    if match is None or "ray.serve" not in sys.modules:
        return ""
    try:
        from ray import serve

        app = serve.status().applications.get(match.group(1))
        if app is None:
            return ""
        reasons = []
        for name, deployment in app.deployments.items():
            if deployment.message:
                lines = [line for line in deployment.message.strip().splitlines() if line.strip()]
                reasons.append(f"\n{name}: " + "\n".join(lines[-12:]))
        return "".join(reasons)
    except Exception:  # Serve is gone meanwhile: its own message is all there is
        return ""


def _users(filename: str) -> bool:
    """Whether a frame of this file is the user's code (not this package's, not Ray's)."""
    return not filename.startswith(_HERE) and f"{os.sep}ray{os.sep}" not in filename


def failure_from(
    exc: BaseException, source: str, cell_id: str, snapshot_bytes: int = _snapshot.TOTAL_BYTES
) -> RemoteFailure:
    """Describe ``exc`` with only the frames of user code (cell, notebook functions), and a snapshot of those frames
    (``snapshot_bytes`` of values at most; none for an interrupt)."""
    cell_file = cell_filename(source)
    lines = source.splitlines()
    frames: list[tuple[str, int, str, str]] = []
    for summary in traceback.extract_tb(exc.__traceback__):
        name = summary.filename
        if not _users(name):
            continue
        lineno = summary.lineno or 0
        text = lines[lineno - 1] if name == cell_file and 0 < lineno <= len(lines) else ""
        frames.append((name, lineno, summary.name, text or summary.line or ""))
    if isinstance(exc, SyntaxError) and exc.filename == cell_file and exc.lineno:
        frames.append((cell_file, exc.lineno, "<module>", exc.text or ""))
    try:
        pickled: bytes | None = cloudpickle.dumps(exc)
    except Exception:
        pickled = None
    cls = type(exc)
    interrupted = isinstance(exc, KeyboardInterrupt)
    taken = None
    if not interrupted and snapshot_bytes > 0:
        try:
            taken = _snapshot.snapshot(exc.__traceback__, _users, snapshot_bytes, (cell_file, _used_names(source)))
        except Exception:  # a snapshot must never cost the error itself
            taken = None
    return RemoteFailure(
        type_name=cls.__qualname__,
        module=cls.__module__,
        message=str(exc) + _serve_detail(str(exc)),
        frames=frames,
        exception=pickled,
        interrupted=interrupted,
        snapshot=taken,
        node=_node(),
    )


def _used_names(source: str) -> set[str]:
    try:
        return {node.id for node in ast.walk(ast.parse(source)) if isinstance(node, ast.Name)}
    except SyntaxError:
        return set()


def _node() -> str:
    try:
        import ray

        return str(ray.util.get_node_ip_address())
    except Exception:
        return ""


def run_in_namespace(
    spec: CellSpec, ns: dict[str, Any], output: CellOutput, node: str = ""
) -> tuple[CellOutcome, list[Any]]:
    """Run ``spec`` in ``ns``; return the outcome and the exported values in order.

    The namespace must already hold the inputs. Exported names that the cell did not
    bind come back as ``"missing"``.
    """
    start = time.perf_counter()
    spawned = _logs.spawned()
    outcome = CellOutcome(node=node)
    values: list[Any] = []
    result: Any = None
    try:
        body, last = compile_cell(spec)
        _logs.mark_task()  # the worker names the task it runs, should it die without a word
        claimant = f"{os.getpid()}-{id(ns)}"  # this run of it (a --map item's, each its own)
        with _Capture(output, ns), _logs.cell(spec.cell_id), _breakpoint.running(spec.relay, spec.cell_id, claimant):
            try:
                exec(body, ns)
                if last is not None:
                    result = eval(last, ns)
            except SystemExit as exc:
                if exc.code not in (None, 0):
                    raise
                # sys.exit(0) ends a script that succeeded, as under `python script.py`: the cell succeeds too,
                # with the names it bound by then.
            _show_figures(output)
    except BaseException as exc:  # KeyboardInterrupt too: it is how cancel arrives
        # A --map item's snapshot is smaller: many items may fail at once, each in a chunk of its own.
        room = MAP_SNAPSHOT_BYTES if spec.map_name else _snapshot.TOTAL_BYTES
        outcome.failure = failure_from(exc, spec.source, spec.cell_id, room)
    else:
        if result is not None:
            info, _ = package_value(result, spec.threshold)
            if info.kind != "inline":
                info = OutputInfo("repr", meta={"bundle": mime_bundle(result)})
            outcome.value = info
        for name in spec.outputs:
            if name not in ns:
                outcome.outputs[name] = OutputInfo("missing")
                values.append(None)
                continue
            info, value = package_value(ns[name], spec.threshold)
            if info.kind == "remote":
                info.meta["node"] = node
            outcome.outputs[name] = info
            values.append(value)
    output.close()
    outcome.chunks_sent = output.sends
    outcome.elapsed = time.perf_counter() - start
    outcome.spawned = _logs.spawned() - spawned
    return outcome, values
