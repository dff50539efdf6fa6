"""What killed a cell's worker, named: out of memory, a signal, an exit code, a lost node.

Ray tells a driver only that a worker "died unexpectedly". Which death it was is read here from
what each side can see:

- every worker of the agent's job writes a line before it dies where it can: its exit code when
  its code calls ``os._exit(n)`` (:data:`EXIT_MARK`), and, through Python's ``faulthandler``, the
  fatal signal that crashed it (``Fatal Python error: Segmentation fault``): the agent gets both
  through Ray's log monitor, by node and pid (:class:`Deaths`);
- Ray's task events name each attempt's worker (pid, node) and Ray's own verdict
  (``OUT_OF_MEMORY`` when Ray's memory monitor killed it, ``NODE_DIED``);
- the agent's cgroup counts the kernel's OOM kills in its container (the agent's node: the
  embedded cluster's whole machine, or the head).

A worker killed for memory is not left to Ray's retries: each retry would allocate as much and be
killed again. The agent cancels the cell at the first such death it sees (:meth:`Deaths.watch`),
and the cell fails saying it ran out of memory, on which node, what that node had and used, and
what to do.

This module runs in the agent (and its markers in every worker): standard library only (Ray,
lazily).
"""

from __future__ import annotations

import os
import re
import threading
import time
from collections import OrderedDict
from typing import Any, NoReturn

#: A worker's line before ``os._exit(n)``: ``:jc_exit: n``.
EXIT_MARK = ":jc_exit:"
#: What ``faulthandler`` writes when a signal crashes a worker.
FATAL = re.compile(r"^Fatal Python error: (Segmentation fault|Bus error|Floating point exception|Aborted|Illegal)")
SIGNALS = {
    "Segmentation fault": "SIGSEGV",
    "Bus error": "SIGBUS",
    "Floating point exception": "SIGFPE",
    "Aborted": "SIGABRT",
    "Illegal": "SIGILL",
}
#: Ray's memory monitor's words, in an ``OutOfMemoryError``.
RAY_OOM = re.compile(r"Memory on the node \(IP: ([\d.]+)[^)]*\) (?:[^.]*?)was ([\d.]+) ?GB used / ([\d.]+) ?GB limit")
#: What to do, after a memory death.
MEMORY_ADVICE = (
    "Give each task less data (smaller batches, more items), or reserve what it needs with --memory SIZE "
    "(Ray then runs it only where that much is free)"
)
#: Ray's errors for a worker that died (or stopped answering) under a run or a trial.
RAY_DEATHS = ("ActorDiedError", "RayActorError", "WorkerCrashedError", "WorkerHealthCheckFailedError")
#: What to do, after a run's worker died for memory.
RUN_MEMORY_ADVICE = (
    "Give each worker less data (smaller batches, a smaller model), or reserve what each needs with "
    'resources_per_worker={"CPU": 1, "memory": BYTES} (Ray then starts it only where that much is free)'
)
#: Deaths remembered, the latest.
KEPT = 1_000
#: How long naming a death waits for the dead worker's last line; how recent a memory kill names one.
SAID_WAIT = 4.0
RECENT_KILL = 60.0


def install_markers() -> None:
    """In a worker: say how it died where it can (an exit code, a fatal signal) before it does."""
    import faulthandler

    try:
        faulthandler.enable(file=2, all_threads=False)  # the worker's own stderr file, which Ray's log monitor reads
    except Exception:
        pass
    if getattr(os._exit, "marked", False):
        return
    exit_now = os._exit

    def _exit(status: int) -> NoReturn:
        try:
            os.write(2, f"\n{EXIT_MARK} {int(status)}\n".encode())
        finally:
            exit_now(status)

    _exit.marked = True  # type: ignore[attr-defined]
    os._exit = _exit


#: Where the agent's faulthandler writes, beside its socket (the kernel reads it once the agent is gone).
CRASH_FILE = "crash.txt"


def oom_kills() -> int | None:
    """The kernel's OOM kills in this process's cgroup so far (v1 ``memory.oom_control``, v2 ``memory.events``)."""
    from .._sizing import cgroup_files

    for limit_file in cgroup_files():
        folder = os.path.dirname(limit_file)
        name = "memory.oom_control" if limit_file.endswith("memory.limit_in_bytes") else "memory.events"
        try:
            with open(os.path.join(folder, name)) as f:
                for line in f:
                    key, _, value = line.partition(" ")
                    if key == "oom_kill":
                        return int(value)
        except (OSError, ValueError):
            continue
    return None


def _gib(nbytes: float) -> str:
    return f"{nbytes / 2**30:.1f} GiB"


class Deaths:
    """The deaths the agent has heard of, by worker (node, pid)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.said: OrderedDict[tuple[str, int], str] = OrderedDict()
        self.said_of_cell: OrderedDict[str, str] = OrderedDict()
        self.kills = oom_kills()
        self.killed_at = float("-inf")  # when the kernel last killed a process for memory here

    # ------------------------------------------------------------ what workers said
    def heard(self, ip: str, pid: Any, line: str, cell: str | None = None) -> None:
        """A line of a worker's output (``cell``: the cell whose code it was running): remember how it says it
        died, if it does."""
        how = None
        if line.startswith(EXIT_MARK):
            how = f"exited with code {line[len(EXIT_MARK) :].strip()} (os._exit)"
        else:
            match = FATAL.match(line)
            if match:
                how = f"crashed with {SIGNALS[match.group(1)]} ({match.group(1).lower()})"
        if how is None:
            return
        try:
            key = (str(ip), int(pid))
        except (TypeError, ValueError):
            return
        with self.lock:
            self.said[key] = how
            if cell is not None:
                self.said_of_cell[cell] = f"the worker process running it (pid {key[1]} on {key[0]}) {how}"
            while len(self.said) > KEPT:
                self.said.popitem(last=False)
            while len(self.said_of_cell) > KEPT:
                self.said_of_cell.popitem(last=False)

    # ------------------------------------------------------------ naming a death
    def why(
        self, exc: BaseException, tasks: set[str], cell_id: str = "", cell_of: Any = lambda ip, pid: None
    ) -> str | None:
        """Why the worker of cell ``cell_id`` (its ``tasks``) died, in words, or None when nothing more is known than
        Ray says. ``cell_of(ip, pid)``: the cell whose task a worker said it ran last."""
        import ray

        if isinstance(exc, ray.exceptions.OutOfMemoryError):
            return memory_death(str(exc))
        # A worker's last words come through Ray's log monitor, and Ray's events of its task a second apart: both a
        # moment after the death Ray reported.
        deadline = time.monotonic() + SAID_WAIT
        attempts: list[dict[str, Any]] = []
        while True:
            attempts = worker_attempts(tasks) or attempts
            with self.lock:
                if cell_id in self.said_of_cell:
                    return self.said_of_cell[cell_id]
                said = list(self.said.items())
            for (ip, pid), last_words in reversed(said):  # a worker's last words may come before its task's name
                if cell_of(ip, pid) == cell_id:
                    return f"the worker process running it (pid {pid} on {ip}) {last_words}"
            with self.lock:
                for attempt in attempts:
                    found = self.said.get((attempt["ip"], attempt["pid"]))
                    if found is not None:
                        return f"the worker process running it (pid {attempt['pid']} on {attempt['ip']}) {found}"
            if time.monotonic() >= deadline:
                break
            time.sleep(0.3)
        self.memory_killed()
        here = _here()
        if time.monotonic() - self.killed_at < RECENT_KILL:  # the kernel killed one of this node's workers just now
            for attempt in attempts:
                if attempt["ip"] == here and not os.path.exists(f"/proc/{attempt['pid']}"):
                    return memory_death(ip=here)
        for attempt in attempts:
            if attempt["error"] == "OUT_OF_MEMORY":
                return memory_death("", attempt["ip"])
            if attempt["error"] == "NODE_DIED":
                return f"the node it ran on, {attempt['ip']}, was lost (it died, or left the cluster)"
        if isinstance(exc, ray.exceptions.NodeDiedError):
            node = attempts[0]["ip"] if attempts else "its node"
            return f"the node it ran on, {node}, was lost (it died, or left the cluster)"
        return None

    def memory_killed(self) -> bool:
        """Whether the kernel killed a process for memory in the agent's cgroup since last asked."""
        now = oom_kills()
        if now is None:
            return False
        with self.lock:
            before, self.kills = self.kills, now
            killed = before is not None and now > before
            if killed:
                self.killed_at = time.monotonic()
        return killed


def _here() -> str:
    import ray

    return str(ray.util.get_node_ip_address())


def memory_death(ray_said: str = "", ip: str = "", advice: str = MEMORY_ADVICE) -> str:
    """A memory death in words: which node, what it had and used, what to do (``advice``)."""
    match = RAY_OOM.search(ray_said)
    if match:
        ip = match.group(1)
        held = f"{match.group(2)} GB of its {match.group(3)} GB were in use"
        by = "Ray's memory monitor"
    else:
        held = _own_memory_said()
        by = "the kernel's OOM killer" if not ray_said else "Ray's memory monitor"
    where = f"node {ip}" if ip else "its node"
    return f"it ran out of memory: {by} killed its worker on {where} ({held}). {advice}."


def memory_failure(error: BaseException | str, kills_before: int | None) -> str | None:
    """Whether ``error`` (of a worker of a training run, of a trial; or its text) was its worker's death for memory:
    Ray's memory monitor's words in it, or one of Ray's errors of a dead worker after a kill by the kernel in this
    node's cgroup since ``kills_before`` (:func:`oom_kills` when the work started). Its words (:func:`memory_death`,
    with a run's advice), or None. A ``MemoryError`` the user's code raised is its own error: not this."""
    text = error if isinstance(error, str) else f"{type(error).__name__}: {error}"
    if RAY_OOM.search(text):
        return memory_death(text, advice=RUN_MEMORY_ADVICE)
    if not isinstance(error, str) and not type(error).__module__.startswith("ray."):
        return None
    if not any(name in text for name in RAY_DEATHS):
        return None
    now = oom_kills()
    if kills_before is not None and now is not None and now > kills_before:
        return memory_death(ip=_here(), advice=RUN_MEMORY_ADVICE)
    return None


def _own_memory_said() -> str:
    from .._sizing import memory_limit, memory_used

    limit, used = memory_limit(), memory_used()
    if limit is None:
        return "its memory was full"
    if used is None:
        return f"it has {_gib(limit)}"
    return f"it has {_gib(limit)}, {_gib(used)} in use just after"


def worker_attempts(tasks: set[str]) -> list[dict[str, Any]]:
    """The failed attempts of ``tasks`` by Ray's task events: each one's worker (node ip, pid) and Ray's error."""
    from ray.core.generated import common_pb2

    from ._timeline import _events, _node_ips

    if not tasks:
        return []
    ips = _node_ips()
    found = []
    for event in _events():
        if event.task_id.hex() not in tasks:
            continue
        updates = event.state_updates
        if not updates.worker_pid:
            continue
        error = ""
        if updates.HasField("error_info"):
            error = common_pb2.ErrorType.Name(updates.error_info.error_type)  # type: ignore[attr-defined]
        found.append({"ip": ips.get(updates.node_id.hex(), ""), "pid": int(updates.worker_pid), "error": error})
    return found


def dead_on_this_node(tasks: set[str]) -> list[dict[str, Any]]:
    """Attempts of ``tasks`` whose worker ran on this node and is gone (the kernel killed it, say)."""
    here = _here()
    return [a for a in worker_attempts(tasks) if a["ip"] == here and not os.path.exists(f"/proc/{a['pid']}")]


__all__ = [
    "EXIT_MARK",
    "MEMORY_ADVICE",
    "Deaths",
    "dead_on_this_node",
    "install_markers",
    "memory_death",
    "oom_kills",
    "worker_attempts",
]
