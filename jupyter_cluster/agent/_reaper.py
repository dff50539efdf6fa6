"""The agent's last resort: a thread that ends the agent, and every process it started, without its event loop.

The graceful stop (close the sessions, end the cells, ``ray.shutdown()``) runs on the
agent's event loop, which may be busy for a long while (submitting a large map,
pickling a large value). An embedded agent must still die with its kernel, and any
agent must still answer SIGTERM. So a thread of its own watches the parent process;
once the parent is gone, or a SIGTERM came, it asks for the graceful stop, and if the
agent has not exited after a grace period it kills every process the agent started
(for the embedded cluster: Ray's GCS, raylet, dashboard agent, runtime-env agent,
log monitor and workers, all its descendants) and exits. Standard library only: this
runs on the head too.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from collections.abc import Callable

log = logging.getLogger("jupyter_cluster.agent")

#: Seconds between looks at the parent process.
POLL = 0.25
#: Seconds the graceful stop gets once the parent is gone (the kernel died), and once a SIGTERM came.
PARENT_GRACE = 3.0
SIGTERM_GRACE = 8.0


def _processes() -> dict[int, tuple[int, int]]:
    """Every process's parent and session id, read from /proc in one pass; empty where there is no /proc."""
    found: dict[int, tuple[int, int]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return found
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        # The command name (2nd field) is in parentheses and may hold spaces: the fields after its last ")".
        fields = stat[stat.rfind(b")") + 2 :].split()
        if len(fields) > 3:
            found[int(entry)] = (int(fields[1]), int(fields[3]))
    return found


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (children, their children...), read from /proc in one pass; empty where
    there is no /proc. Taken whole before anything is killed: a killed parent's children move to init."""
    children: dict[int, list[int]] = {}
    for child, (parent, _) in _processes().items():
        children.setdefault(parent, []).append(child)
    found: list[int] = []
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def started_here() -> list[int]:
    """The processes this one started that live: its descendants, and, where it leads a session of its own (the
    kernel and the SSH boot start the agent so), the rest of that session: a child whose parent died meanwhile
    (a forkserver that Ray's dashboard started anew while it stopped) is init's then, but still of the session."""
    me = os.getpid()
    found = set(descendants(me))
    if os.getsid(0) == me:
        found.update(pid for pid, (_, session) in _processes().items() if session == me and pid != me)
    return sorted(found)


def end(pids: list[int]) -> None:
    """Stop every process of ``pids`` (none can fork after), then kill them."""
    for sig in (signal.SIGSTOP, signal.SIGKILL):
        for pid in pids:
            try:
                os.kill(pid, sig)
            except OSError:
                pass


class Reaper:
    """Ends this process and its descendants when the graceful stop does not, from a thread of its own."""

    def __init__(self) -> None:
        #: The graceful stop, callable from any thread; set once the server runs.
        self.graceful: Callable[[], None] | None = None
        self._lock = threading.Lock()
        self._reason: str | None = None

    def watch_parent(self, pid: int) -> None:
        """Stop once process ``pid`` (the kernel) is gone: it exited, or this process was handed to another."""
        parent = os.getppid()

        def watch() -> None:
            event = threading.Event()
            while not event.wait(POLL):
                try:
                    os.kill(pid, 0)
                    gone = parent == pid and os.getppid() != pid
                except ProcessLookupError:
                    gone = True
                except PermissionError:
                    gone = False
                if gone:
                    self.stop(f"the parent process {pid} exited", PARENT_GRACE)
                    return

        threading.Thread(target=watch, name="agent-parent-watch", daemon=True).start()

    def on_sigterm(self, signum: int, frame: object) -> None:
        """A signal handler: the graceful stop, and the kill after :data:`SIGTERM_GRACE` seconds."""
        self.stop(f"signal {signal.Signals(signum).name}", SIGTERM_GRACE)

    def stop(self, reason: str, grace: float) -> None:
        """Ask for the graceful stop; past ``grace`` seconds, kill every descendant and exit."""
        with self._lock:
            if self._reason is not None:
                return
            self._reason = reason
        log.info(
            "%s: stopping (everything this agent started is killed if it has not stopped in %.0f s)", reason, grace
        )
        if self.graceful is not None:
            try:
                self.graceful()
            except Exception:  # a loop already closed: the kill below settles it
                log.exception("the graceful stop could not be asked for")
        timer = threading.Timer(grace, self.kill)
        timer.daemon = True
        timer.start()

    def kill(self) -> None:
        """SIGKILL every descendant (taken whole first), then exit at once."""
        pids = started_here()
        log.warning(
            "%s, and the agent did not stop in time: killing %d process(es) it started", self._reason, len(pids)
        )
        end(pids)
        logging.shutdown()
        os._exit(0)
