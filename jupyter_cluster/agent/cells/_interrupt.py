"""Stopping a cell that runs on a process's main thread, wherever it is blocked.

An exception raised into a thread (``PyThreadState_SetAsyncExc``) waits until that
thread runs Python again: a cell blocked in ``time.sleep(40)`` or ``ray.get`` would
notice it 40 s later. A signal is different: it interrupts the blocking call on the
main thread, and the handler's ``KeyboardInterrupt`` surfaces there at once (this is
how Ctrl-C stops a Python script, and ``ray.get`` checks for it). So driver cells run
on the agent's main thread and actor cells on the actor's, and an interrupt is the
signal :data:`SIGNAL` aimed at one cell: the handler raises only if that cell is the
one running, so a late signal never hits the next cell.

Within a process the target is an attribute; across processes (the agent stopping a
cell in an actor, possibly on another node) it is a small file named by the actor's
pid, written before the signal is sent.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import os
import queue
import signal
import tempfile
import threading
from collections.abc import Callable, Iterator
from typing import Any

#: The signal that carries an interrupt to a cell (SIGINT stays the process's own).
SIGNAL = signal.SIGUSR2


def flag_path(pid: int) -> str:
    """The file that names the cell to interrupt in process ``pid``."""
    return os.path.join(tempfile.gettempdir(), f"jupyter-cluster-interrupt-{pid}")


def interrupt_process(pid: int, path: str, cell_id: str) -> bool:
    """Ask process ``pid`` to interrupt ``cell_id`` (if that is the cell it runs)."""
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        f.write(cell_id)
    os.replace(tmp, path)
    try:
        os.kill(pid, SIGNAL)
    except ProcessLookupError:
        return False
    return True


class MainThreadCells:
    """Cells run on this process's main thread, each interruptible by :data:`SIGNAL`.

    Make one on the main thread (it installs the signal handler there). The agent
    hands it driver cells with :meth:`submit` and runs :meth:`serve` on the main
    thread; an actor calls :meth:`running` around each cell it runs itself.
    """

    def __init__(self) -> None:
        self.main_ident = threading.get_ident()
        self.current: str | None = None
        self.flag = flag_path(os.getpid())
        self._target: str | None = None
        self._jobs: queue.SimpleQueue[tuple[str, Callable[[], Any], concurrent.futures.Future[Any]] | None]
        self._jobs = queue.SimpleQueue()
        signal.signal(SIGNAL, self._on_signal)

    def _on_signal(self, signum: int, frame: Any) -> None:
        target = self._target
        if target is None:
            with contextlib.suppress(OSError), open(self.flag) as f:
                target = f.read()
        if target and target == self.current:
            self._target = None
            with contextlib.suppress(OSError):
                os.unlink(self.flag)
            raise KeyboardInterrupt(f"interrupted cell {target}")

    @contextlib.contextmanager
    def running(self, cell_id: str) -> Iterator[None]:
        """Mark ``cell_id`` as the cell the main thread runs (an interrupt may hit it)."""
        self.current = cell_id
        try:
            yield
        finally:
            self.current = None

    def interrupt(self, cell_id: str) -> bool:
        """Interrupt ``cell_id`` if it is running here now."""
        if self.current != cell_id:
            return False
        self._target = cell_id
        signal.pthread_kill(self.main_ident, SIGNAL)
        return True

    # ------------------------------------------------ the agent's driver cells
    def submit(self, cell_id: str, job: Callable[[], Any]) -> concurrent.futures.Future[Any]:
        """Run ``job()`` on the main thread (after those before it); its future."""
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        self._jobs.put((cell_id, job, future))
        return future

    def serve(self) -> None:
        """Run submitted jobs on the calling (main) thread until :meth:`close`."""
        while True:
            item = self._jobs.get()
            if item is None:
                return
            cell_id, job, future = item
            if not future.set_running_or_notify_cancel():
                continue
            try:
                with self.running(cell_id):
                    value = job()
            except BaseException as exc:  # the job's failure is its caller's to handle
                future.set_exception(exc)
            else:
                future.set_result(value)

    def close(self) -> None:
        """Stop :meth:`serve` once the job running now (if any) has ended."""
        self._jobs.put(None)
        if self.current is not None:
            self.interrupt(self.current)


__all__ = ["SIGNAL", "MainThreadCells", "flag_path", "interrupt_process"]
