"""What the cluster's workers print, routed to the cell that started the work.

Ray's log monitor sends its driver every line a worker of the driver's job writes, with the
worker's pid and node and the task or actor the worker last named (Ray prints ``:task_name:``
into the worker's log as each task starts). The agent is the driver of every cell, so every
line reaches it. Which *cell* a line belongs to is settled with Ray's task ids:

- Every worker of the agent's job runs :func:`setup_worker` (Ray's ``worker_process_setup_hook``).
  It wraps the worker's ``sys.stdout`` and ``sys.stderr``: before the first thing a task writes,
  a marker line names the task's id (``:jc_task:<task id>``), in the same file, so the log
  monitor delivers it in order with the lines that follow, as it does Ray's own markers.
- Every task or actor call a process submits while a cell runs in it is noted with the cell's id:
  the agent notes those of a ``--driver`` cell itself; a worker that runs a task, ``--map`` or
  actor cell writes ``:jc_child:<cell id> <task id>`` into its log. A task started by a task the
  cell started is noted by its parent's task id (``:jc_child:@<parent task> <task id>``), so the
  whole tree of work a cell started is the cell's.
- An actor call belongs to the cell that called it, whichever cell made the actor.

A line whose task belongs to a running cell is that cell's output, prefixed as Ray prefixes it
(``(f pid=…, ip=…)``), stdout and stderr kept apart. Any other line (a task of a cell that has
ended, a background thread, the raylet's own words) goes to the cluster's log
(:class:`ClusterLog`, ``%cluster logs``), never to another cell, and a cell that prints faster
than :data:`LINES_PER_SECOND` shows what it can and says how many lines went to the log instead.

This module runs in the agent and in every worker: it imports only the standard library (and
Ray, lazily).
"""

from __future__ import annotations

import asyncio
import io
import logging
import os
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from ..watching import _raylog
from ..watching._deaths import EXIT_MARK
from ._progress import RAY_TQDM_MAGIC

log = logging.getLogger("jupyter_cluster.agent")

MARK_TASK = ":jc_task:"
MARK_CHILD = ":jc_child:"
#: The markers Ray's workers write themselves (a task's or actor's name, the job): no output of a task's.
RAY_MARKS = (":task_name:", ":actor_name:", ":job_id:")
#: The setup hook, as Ray's ``runtime_env`` names it.
SETUP_HOOK = "jupyter_cluster.agent.cells._logs.setup_worker"
#: Lines a second a cell shows of its workers' output, after a burst of :data:`BURST`; the rest go to the log.
LINES_PER_SECOND = 200
BURST = 2_000
#: Lines the cluster's log keeps (the latest).
LOG_LINES = 10_000
#: Lines a cell keeps of what Ray logged as errors while it ran (the latest), for the cause of its failure.
RAY_ERRORS_KEPT = 200
#: Tasks whose cell the agent remembers (the latest noted).
TASKS_KEPT = 200_000
#: How long a line of a task not yet known waits for the note that names its cell.
UNKNOWN_WAIT = 1.5
#: A cell that started work waits, as it ends, for its workers' last lines: until none came for a quarter of the
#: cell's time, QUIET to QUIET_MOST seconds, and SETTLE at most. Ray's log monitor reads the workers' files every
#: 0.1 s, but a worker started for the cell took up to 0.9 s to be heard from here (a cell that started workers
#: took seconds itself).
QUIET = 0.4
QUIET_MOST = 1.2
SETTLE = 3.0
#: How often the embedded cluster's log monitor looks for new workers' files (Ray's default, 0.5 s, held a new
#: worker's first lines back long enough to miss its cell's end).
LOG_SCAN = "0.1"

# ------------------------------------------------------------------ in every process that runs cells

#: The cell whose code runs on this thread (see :func:`cell`).
_local = threading.local()
#: In a worker, the cell running now, for the threads its code starts too.
_worker_cell: str | None = None
#: Where a noted task goes: the agent's :meth:`WorkerLines.note`, or a worker's log (:func:`_worker_note`).
_note: Callable[[str, str], None] | None = None
_patched = False
#: Tasks and actors noted as some cell's in this process (a cell's count tells its end to wait for their lines).
_spawned = 0


@contextmanager
def cell(cell_id: str) -> Iterator[None]:
    """Code run within is cell ``cell_id``'s: what it submits is noted as the cell's."""
    global _worker_cell
    saved = getattr(_local, "cell", None), _worker_cell
    _local.cell = cell_id
    if _note is _worker_note:
        _worker_cell = cell_id
    try:
        yield
    finally:
        _local.cell, _worker_cell = saved


@contextmanager
def unnoted() -> Iterator[None]:
    """What is submitted within is this project's own (a cell's output sent to the agent), not the cell's work."""
    saved = getattr(_local, "quiet", False)
    _local.quiet = True
    try:
        yield
    finally:
        _local.quiet = saved


def spawned() -> int:
    """How many tasks and actors the cells run in this process have started so far."""
    return _spawned


def _current_task() -> str | None:
    try:
        import ray

        return ray.get_runtime_context().get_task_id()
    except Exception:
        return None


def _task_of(submitted: Any) -> str | None:
    """The task id of what ``.remote()`` returned: a ref, refs, a generator, an actor."""
    import ray

    if isinstance(submitted, (list, tuple)):
        submitted = submitted[0] if submitted else None
    if isinstance(submitted, ray.ObjectRef):
        return submitted.task_id().hex()
    actor_id = getattr(submitted, "_ray_actor_id", None)
    if actor_id is not None:  # an actor: its creation task (what its __init__ prints)
        return ray.TaskID.for_actor_creation_task(actor_id).hex()
    ref = getattr(submitted, "_generator_ref", None)
    if isinstance(ref, ray.ObjectRef):
        return ref.task_id().hex()
    return None


def _noted(submitted: Any) -> None:
    note = _note
    if note is None or getattr(_local, "quiet", False):
        return
    try:
        # In the agent only the thread that runs a driver cell is the cell's (the agent submits its own
        # tasks from other threads); in a worker, threads that the cell's code started are the cell's too.
        owner = getattr(_local, "cell", None) or (_worker_cell if note is _worker_note else None)
        if owner is None and note is _worker_note:  # a task that a task of a cell started: its parent's cell
            parent = _current_task()
            owner = "@" + parent if parent is not None else None
        task = _task_of(submitted) if owner is not None else None
        if task is not None:
            assert owner is not None
            if not owner.startswith("@"):
                global _spawned
                _spawned += 1
            note(task, owner)
    except Exception:  # noting must never stop a submission
        log.debug("could not note a submitted task", exc_info=True)


def patch_submissions(note: Callable[[str, str], None]) -> None:
    """Note every task, actor call and actor this process submits (Ray's own ``_remote`` methods, wrapped)."""
    global _note, _patched
    _note = note
    if _patched:
        return
    from ray import actor, remote_function

    for owner in (remote_function.RemoteFunction, actor.ActorMethod, actor.ActorClass):
        original = owner._remote

        def _remote(self: Any, *args: Any, __original: Any = original, **kwargs: Any) -> Any:
            submitted = __original(self, *args, **kwargs)
            _noted(submitted)
            return submitted

        _remote.__wrapped__ = original  # type: ignore[attr-defined]
        owner._remote = _remote  # type: ignore[method-assign]
    _patched = True


# ------------------------------------------------------------------ in every worker


class MarkedStream(io.TextIOBase):
    """A worker's stdout or stderr: a marker line names the task before the first thing each task writes."""

    def __init__(self, raw: Any) -> None:
        self.raw = raw
        self.lock = threading.RLock()
        self.task: str | None = None
        self.at_line_start = True

    def write(self, text: str) -> int:
        with self.lock:
            task = _current_task() if text and not text.startswith(RAY_MARKS) else None
            if task is not None and task != self.task:
                self._mark(f"{MARK_TASK}{task}")
                self.task = task
            written = self.raw.write(text)
            if text:
                self.at_line_start = text.endswith("\n")
            return written if isinstance(written, int) else len(text)

    def _mark(self, line: str) -> None:
        self.raw.write(("" if self.at_line_start else "\n") + line + "\n")
        self.at_line_start = True

    def mark_task(self) -> None:
        """Name the task running now, before it writes anything (a worker that dies without a word is then known to
        have been running it: see ._deaths)."""
        with self.lock:
            task = _current_task()
            if task is not None and task != self.task:
                self._mark(f"{MARK_TASK}{task}")
                self.task = task
                self.raw.flush()

    def mark(self, line: str) -> None:
        """Write a marker line of this module's own, after the task's marker."""
        with self.lock:
            self.write("")
            self._mark(line)
            self.raw.flush()

    def flush(self) -> None:
        self.raw.flush()

    def writable(self) -> bool:
        return True

    def isatty(self) -> bool:
        return False

    def fileno(self) -> int:
        return int(self.raw.fileno())

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return str(getattr(self.raw, "encoding", "utf-8"))

    def __getattr__(self, name: str) -> Any:
        return getattr(self.raw, name)


_stdout: MarkedStream | None = None


def mark_task() -> None:
    """In a worker: name the task that starts running now, in its output (see :meth:`MarkedStream.mark_task`)."""
    if _stdout is not None:
        _stdout.mark_task()


def _worker_note(task: str, owner: str) -> None:
    if _stdout is not None:
        _stdout.mark(f"{MARK_CHILD}{owner} {task}")


def setup_worker() -> None:
    """Ray's ``worker_process_setup_hook`` for the agent's job: mark each task's output, note what cells submit."""
    global _stdout
    import sys

    try:
        from ray._private import worker

        if worker.global_worker.mode != worker.WORKER_MODE:  # Ray runs the hook in the driver (the agent) too
            return
        os.environ.setdefault("MPLBACKEND", "Agg")  # a worker of a cluster the agent did not start: off-screen
        if not isinstance(sys.stdout, MarkedStream):
            sys.stdout = _stdout = MarkedStream(sys.stdout)
            sys.stderr = MarkedStream(sys.stderr)
            # Ray's own log records and warnings: marked as Ray's in the worker's stderr (whatever a run's
            # code later makes of sys.stderr), so that the agent keeps them out of the cells.
            _raylog.install(_raylog.marking_sink(sys.stderr))
        from ..watching import _deaths
        from . import _breakpoint, _cellsource

        _cellsource.install()  # a traceback the user's code prints shows the lines of the cell that defined it
        _breakpoint.install(unnoted)  # breakpoint() in a cell stops it for the notebook (not Ray's debugger on a port)
        _deaths.install_markers()  # an exit code, a fatal signal: said before the worker dies
        patch_submissions(_worker_note)
    except Exception:  # a worker must start whatever happens here
        log.warning("could not mark this worker's output by task", exc_info=True)


# ------------------------------------------------------------------ in the agent


class ClusterLog:
    """The lines no running cell could take: the latest :data:`LOG_LINES`, and how many there were in all."""

    def __init__(self, limit: int = LOG_LINES) -> None:
        self.lines: deque[tuple[float, str, str]] = deque(maxlen=limit)
        self.total = 0
        self.lock = threading.Lock()

    def add(self, entries: list[tuple[float, str, str]]) -> None:
        if not entries:
            return
        with self.lock:
            self.lines.extend(entries)
            self.total += len(entries)

    def tail(self, count: int | None = None) -> dict[str, Any]:
        with self.lock:
            lines = list(self.lines)
            total = self.total
        if count is not None:
            lines = lines[-count:] if count > 0 else []
        return {"lines": lines, "total": total, "kept": len(self.lines)}


class _Flood:
    """A cell's budget of worker lines: :data:`LINES_PER_SECOND`, after a burst of :data:`BURST`."""

    def __init__(self) -> None:
        self.tokens = float(BURST)
        self.when = time.monotonic()
        self.over = 0  # lines sent to the log since the cell was last told
        self.told = 0.0

    def take(self) -> bool:
        now = time.monotonic()
        self.tokens = min(BURST, self.tokens + (now - self.when) * LINES_PER_SECOND)
        self.when = now
        if self.tokens >= 1:
            self.tokens -= 1
            return True
        self.over += 1
        return False


class WorkerLines:
    """The agent's side: each line Ray's log monitor sends goes to its cell, or to the cluster's log.

    ``on_logs`` runs on Ray's log thread; a cell's lines reach it through the event loop in one call a batch.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, emitter: Callable[[str], Callable[..., None] | None]) -> None:
        self.loop = loop
        self.emitter = emitter  # the emit of a running cell, by id; None once it ended
        self.owners: OrderedDict[str, str] = OrderedDict()  # task id -> cell id, or "@parent task id"
        self.current: dict[tuple[Any, Any, bool], str] = {}  # (ip, pid, stderr) -> the task writing there
        self.waiting: deque[tuple[float, dict[str, Any], str | None, str]] = deque()
        self.log = ClusterLog()
        self.floods: dict[str, _Flood] = {}
        self.last_line: dict[str, float] = {}  # cell id -> when its workers last wrote
        self.started: set[str] = set()  # cells that started work (their end waits for its last lines)
        self.ray_warnings: dict[str, int] = {}  # cell id -> Ray's warnings while it ran (its note at the end)
        #: Cell id -> the last lines Ray logged as errors while it ran: a failing cell's real cause may be only there
        #: (an RLlib env runner that could not make its environment logs why, then RLlib fails with one of its own).
        self.ray_errors: dict[str, deque[str]] = {}
        #: Cell id -> how the notebook names it ("Cell In[5]"), for the log's lines (the latest TASKS_KEPT // 100).
        self.labels: OrderedDict[str, str] = OrderedDict()
        from ..watching._deaths import Deaths

        self.deaths = Deaths()  # how workers said they died (an exit code, a fatal signal)
        self.lock = threading.RLock()  # (re-entered where Ray logs while a line is routed)
        self.timer: threading.Timer | None = None

    # ----------------------------------------------------------- what cells start
    def note_submitted(self, submitted: Any, cell_id: str) -> None:
        """A cell's own task (what it writes outside the cell's code, a subprocess say, is the cell's too)."""
        task = _task_of(submitted)
        if task is not None:
            self.note(task, cell_id, started=False)

    def note(self, task: str, owner: str, started: bool = True) -> None:
        """``task`` is ``owner``'s (a cell id, or ``@`` and the task that started it); ``started``: work the cell's
        code started (its end waits for that work's last lines)."""
        with self.lock:
            self._own(task, owner, started)

    def cell_of_worker(self, ip: str, pid: int) -> str | None:
        """The cell whose task the worker ``pid`` on ``ip`` last said it ran (in either of its streams)."""
        with self.lock:
            for is_err in (False, True):
                for key in ((ip, pid, is_err), (ip, str(pid), is_err)):
                    cell = self._cell_of(self.current.get(key))
                    if cell is not None:
                        return cell
        return None

    def name(self, cell_id: str, label: str) -> None:
        """How the notebook names cell ``cell_id``: the log names its lines so."""
        if label:
            with self.lock:
                self.labels[cell_id] = label
                while len(self.labels) > TASKS_KEPT // 100:
                    self.labels.popitem(last=False)

    def tasks_of(self, cell_id: str) -> set[str]:
        """Every task the agent knows for cell ``cell_id``'s: its own, and all its work started, nested ones too (off
        the event loop: it reads every task the agent remembers)."""
        with self.lock:
            owners = list(self.owners)
        return {task for task in owners if self._cell_of(task) == cell_id}

    def mark_started(self, cell_id: str) -> None:
        """The cell's code started work (its workers said so): its end waits for that work's last lines."""
        with self.lock:
            self.started.add(cell_id)

    def _own(self, task: str, owner: str, started: bool = True) -> None:
        self.owners[task] = owner
        self.owners.move_to_end(task)
        while len(self.owners) > TASKS_KEPT:
            self.owners.popitem(last=False)
        if started:
            cell = self._cell_of(task)
            if cell is not None:
                self.started.add(cell)

    def _cell_of(self, task: str | None) -> str | None:
        for _ in range(32):  # a chain of tasks started by tasks, up to the cell
            if task is None:
                return None
            owner = self.owners.get(task)
            if owner is None or not owner.startswith("@"):
                return owner
            task = owner[1:]
        return None

    # ----------------------------------------------------------- Ray's log thread
    def on_logs(self, data: dict[str, Any]) -> None:
        try:
            self._on_logs(data)
        except Exception:
            log.warning("could not route a worker's output", exc_info=True)

    def _on_logs(self, data: dict[str, Any]) -> None:
        if data.get("pid") in ("autoscaler", "raylet"):  # Ray's own words: the log, as Ray's driver filters them
            self._ray_lines(data)
            return
        key = (data.get("ip"), data.get("pid"), bool(data.get("is_err")))
        stream = "stderr" if key[2] else "stdout"
        prefix = _prefix(data)
        rays_actor = (data.get("actor_name") or "").split("(", 1)[0] in _raylog.RAY_ACTORS
        now = time.time()
        out: dict[str, list[tuple[str, Any]]] = {}
        logged: list[tuple[float, str, str]] = []
        with self.lock:
            task = self.current.get(key)
            for line in data.get("lines", ()):
                if line.startswith(MARK_TASK):
                    task = self.current[key] = line[len(MARK_TASK) :].strip()
                    continue
                if line.startswith(MARK_CHILD):
                    owner, _, child = line[len(MARK_CHILD) :].strip().partition(" ")
                    if child:
                        self._own(child, owner)
                    continue
                if RAY_TQDM_MAGIC in line:  # Ray's progress bars: the driver cell's (see ._progress)
                    continue
                if line.startswith((EXIT_MARK, "Fatal Python error")):  # how the worker died (see ._deaths)
                    running = task or self.current.get((key[0], key[1], not key[2]))
                    self.deaths.heard(str(key[0]), key[1], line, self._cell_of(running))
                    if line.startswith(EXIT_MARK):
                        continue
                rays = _raylog.marked(line)
                if rays is not None or rays_actor:  # Ray's own words: the log, and a count for the cell
                    letter, text = rays if rays is not None else ("I", line)
                    self._ray_said(self._cell_of(task), letter, prefix + _raylog.plain(text), stream, now, logged)
                    continue
                cell = self._cell_of(task)
                if cell is None and task is not None and task not in self.owners:
                    # Its note may still be on its way (it comes from the parent's log): wait a moment.
                    where = {"stream": stream, "prefix": prefix, "came": now}
                    self.waiting.append((now + UNKNOWN_WAIT, where, task, line))
                    self._arm()
                    continue
                self._route(now, cell, stream, prefix + line, out, logged)
            # Waiting lines whose task this batch named (its notes come from the parent's log), or whose wait is over.
            self._expire(now, out, logged)
        self._send(out, logged)

    def _ray_lines(self, data: dict[str, Any]) -> None:
        lines = data.get("lines", [])
        if data.get("pid") == "autoscaler":  # its events only, not its status every few seconds
            from ray._private.worker import filter_autoscaler_events

            lines = list(filter_autoscaler_events(lines))
        prefix, now = _prefix(data), time.time()
        stream = "stderr" if data.get("is_err") else "stdout"
        self.log.add([(now, stream, prefix + _raylog.plain(line)) for line in lines])

    def ray_stdstream(self, data: dict[str, Any], ignore_prefix: bool = False) -> None:
        """What Ray's driver would print of errors elsewhere (``(raylet) Task … failed``): the log."""
        try:
            self._ray_lines(data)
        except Exception:
            log.warning("could not keep a line of Ray's", exc_info=True)

    def ray_logged(self, letter: str, text: str) -> None:
        """One of Ray's log records or warnings in the agent: the log, and a count for the driver cell whose thread
        made it."""
        logged: list[tuple[float, str, str]] = []
        with self.lock:
            self._ray_said(getattr(_local, "cell", None), letter, "(driver) " + text, "stderr", time.time(), logged)
        self.log.add(logged)

    def _ray_said(
        self, cell: str | None, letter: str, text: str, stream: str, now: float, logged: list[tuple[float, str, str]]
    ) -> None:
        if cell is not None and letter in _raylog.WARNING_LEVELS and self.emitter(cell) is not None:
            self.ray_warnings[cell] = self.ray_warnings.get(cell, 0) + 1
            if letter in "EF":
                self.ray_errors.setdefault(cell, deque(maxlen=RAY_ERRORS_KEPT)).extend(text.splitlines())
        logged.extend((now, stream, line) for line in text.splitlines())

    def _arm(self) -> None:
        """Route the waiting lines once their wait is over, should no later line come to do it (a timer thread:
        their number grows with the output, so not the event loop)."""
        if self.timer is None:
            self.timer = threading.Timer(UNKNOWN_WAIT + 0.1, self._waited)
            self.timer.daemon = True
            self.timer.start()

    def _waited(self) -> None:
        out: dict[str, list[tuple[str, Any]]] = {}
        logged: list[tuple[float, str, str]] = []
        with self.lock:
            self.timer = None
            self._expire(time.time(), out, logged)
            if self.waiting:
                self._arm()
        self._send(out, logged)

    def _expire(self, now: float, out: dict[str, list[tuple[str, Any]]], logged: list[tuple[float, str, str]]) -> None:
        """Route the waiting lines whose task is known now, or whose wait is over (to the log)."""
        kept: deque[tuple[float, dict[str, Any], str | None, str]] = deque()
        while self.waiting:
            deadline, where, task, line = self.waiting.popleft()
            cell = self._cell_of(task)
            if cell is not None or deadline <= now:
                self._route(where["came"], cell, where["stream"], where["prefix"] + line, out, logged)
            else:
                kept.append((deadline, where, task, line))
        self.waiting = kept

    def _route(
        self,
        now: float,
        cell: str | None,
        stream: str,
        text: str,
        out: dict[str, list[tuple[str, Any]]],
        logged: list[tuple[float, str, str]],
    ) -> None:
        if cell is not None and self.emitter(cell) is not None:
            self.last_line[cell] = time.monotonic()
            flood = self.floods.setdefault(cell, _Flood())
            if flood.take():
                out.setdefault(cell, []).append((stream, text + "\n"))
                return
            logged.append((now, stream, f"[{self.labels.get(cell, cell)}] {text}"))
            return
        shown = text if cell is None else f"[{self.labels.get(cell, cell)}, after it ended] {text}"
        logged.append((now, stream, shown))

    def _send(self, out: dict[str, list[tuple[str, Any]]], logged: list[tuple[float, str, str]]) -> None:
        for cell, batch in out.items():
            emit = self.emitter(cell)
            if emit is not None:
                self.loop.call_soon_threadsafe(emit, "stream", batch)
        now = time.monotonic()
        for cell, flood in list(self.floods.items()):
            if flood.over and now - flood.told >= 1.0:
                emit = self.emitter(cell)
                if emit is not None:
                    self.loop.call_soon_threadsafe(emit, "stream", [("stderr", self._over(flood.over))])
                flood.over, flood.told = 0, now
        self.log.add(logged)

    # ----------------------------------------------------------- a cell's end
    async def settle(self, cell_id: str, took: float = 0.0) -> str:
        """Before a cell that started work ends (``took`` seconds after it started): wait for its workers' last
        lines, which Ray's log monitor sends a moment after they are written (see :data:`QUIET`). Then say how many
        lines went to the log for want of room. Returns the last lines Ray logged as errors while it ran."""
        if cell_id in self.started:
            began = time.monotonic()
            quiet = min(QUIET_MOST, max(QUIET, took / 4))
            while time.monotonic() - began < SETTLE:
                if time.monotonic() - max(self.last_line.get(cell_id, began), began) >= quiet:
                    break
                await asyncio.sleep(0.05)
        flood = self.floods.get(cell_id)
        emit = self.emitter(cell_id)
        if flood is not None and flood.over and emit is not None:
            emit("stream", [("stderr", self._over(flood.over))])
            flood.over = 0
        with self.lock:
            warned = self.ray_warnings.pop(cell_id, 0)
            errors = self.ray_errors.pop(cell_id, ())
        if warned and emit is not None:
            emit("stream", [("display", ray_note(warned))])
        return "\n".join(errors)

    def forget(self, cell_id: str) -> None:
        """The cell ended: later lines of its work go to the log."""
        with self.lock:
            self.started.discard(cell_id)
            self.last_line.pop(cell_id, None)
            self.floods.pop(cell_id, None)
            self.ray_warnings.pop(cell_id, None)
            self.ray_errors.pop(cell_id, None)

    @staticmethod
    def _over(count: int) -> str:
        return (
            f"[{count:,} more lines of this cell's workers went to the cluster's log (over {LINES_PER_SECOND} a "
            f"second): %cluster logs shows the last {LOG_LINES:,}]\n"
        )


def ray_note(count: int) -> dict[str, str]:
    """A cell's one quiet line on what Ray logged while it ran."""
    text = f"Ray logged {count} warning{'s' if count != 1 else ''} while this cell ran: %cluster logs shows them."
    return {"text/plain": text, "text/html": f'<div class="jc-ray-note" style="color:#888;font-size:85%">{text}</div>'}


#: Whether the notebook runs on the driver's machine (the embedded cluster): then, as Ray prints them to a
#: driver, the lines of the workers on that machine have no ip in their prefix.
NOTEBOOK_ON_HEAD = False


def _prefix(data: dict[str, Any]) -> str:
    """Ray's prefix of a worker's line: ``(name pid=…, ip=…)``; ``(name pid=…)`` for a worker of the driver's own
    machine where the notebook runs there too, as Ray prints it (on an SSH head the notebook is elsewhere: the ip
    always)."""
    pid = data.get("pid")
    ip = data.get("ip")
    if NOTEBOOK_ON_HEAD and ip is not None and ip == data.get("localhost"):
        ip = None
    if pid in ("raylet", "autoscaler"):
        return f"({pid}, ip={ip}) " if ip else f"({pid}) "
    name = data.get("actor_name") or data.get("task_name") or ""
    where = f", ip={ip}" if ip else ""
    return f"({name + ' ' if name else ''}pid={pid}{where}) "


class DriverCellLogs(logging.Handler):
    """In the agent: what a driver cell's own code logs shows in the cell, as Python shows a log record where
    nothing was set up (warnings and up, the message alone). The agent's own records and Ray's are not the cell's."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)

    def emit(self, record: logging.LogRecord) -> None:
        import sys

        if (
            getattr(_local, "cell", None) is None
            or record.name.startswith("jupyter_cluster")
            or _raylog.is_rays(record)
        ):
            return
        try:
            sys.stderr.write(self.format(record) + "\n")  # the cell's stderr while it runs (see ._execute)
        except Exception:
            self.handleError(record)


def install(loop: asyncio.AbstractEventLoop, emitter: Callable[[str], Callable[..., None] | None]) -> WorkerLines:
    """Route Ray's worker lines in this (the agent's) process, and note what its driver cells submit."""
    from ray._private import worker

    lines = WorkerLines(loop, emitter)
    patch_submissions(lines.note)
    worker.global_worker_stdstream_dispatcher.add_handler("jupyter_cluster_lines", lines.on_logs)
    # Ray's words in the agent itself: its libraries' log records and warnings, and what its driver prints of
    # errors elsewhere (a module function its error thread calls by name).
    _raylog.install(lines.ray_logged)
    worker.print_to_stdstream = lines.ray_stdstream
    from . import _breakpoint

    _breakpoint.install(unnoted)  # a --driver cell's breakpoint()
    logging.getLogger().addHandler(DriverCellLogs())
    return lines


__all__ = [
    "MARK_CHILD",
    "MARK_TASK",
    "SETUP_HOOK",
    "ClusterLog",
    "DriverCellLogs",
    "MarkedStream",
    "WorkerLines",
    "cell",
    "install",
    "patch_submissions",
    "setup_worker",
    "spawned",
    "unnoted",
]
