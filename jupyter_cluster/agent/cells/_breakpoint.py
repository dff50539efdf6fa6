"""``breakpoint()`` in a ``%%remote`` cell: pdb stops the remote code, and the notebook drives it.

Python calls ``sys.breakpointhook`` at a ``breakpoint()``: in every process that runs cells (the
workers of the agent's job, the agent itself for ``--driver`` cells) this module's
:func:`stop_here` is that hook (it replaces Ray's, which would open a debugger listening on a
network port), and ``pdb.set_trace`` with it. It stops the code there in a :class:`NotebookPdb`:
an ordinary ``pdb.Pdb`` whose output is collected and whose input comes from the notebook.

At each prompt, what pdb printed since the last one and the prompt go to the notebook as an
``input`` event through the cell's output relay (the actor every cell's output already goes
through); the notebook prints the text and asks for a command with ``input()``, as a local
``breakpoint()`` does in Jupyter, and sends the answer back through the agent to the relay,
where the stopped code waits for it (:meth:`._remote.OutputRelay.ask`). Nothing listens on a port.

- An interrupt of the cell ends the stop (the wait is a Ray call the interrupt breaks) and the
  cell, as it ends any cell.
- A stop nobody answers for :data:`UNATTENDED` seconds ends the cell, saying so.
- In a ``--map`` cell the first item that reaches a ``breakpoint()`` stops there; the others go on
  past theirs, and the cell says once that they did.
- An ``--async`` cell, which has no foreground prompt, is answered ``c`` by the notebook: it
  goes on, and its output says so.

This module runs in the workers and the agent: it imports only the standard library (Ray,
lazily), and of this package's only ``._relays``.
"""

from __future__ import annotations

import io
import os
import pdb
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import IO, Any, cast

from . import _relays

#: Seconds a stop waits for a command before it gives up and ends its cell.
UNATTENDED = 900.0

#: The cell whose code runs on this thread: ``(relay name, cell id, claimant)`` (see :func:`running`).
_local = threading.local()
#: In a worker, the cells whose items were told that another item holds the debugger (said once each).
_told: set[str] = set()


@contextmanager
def running(relay: str, cell_id: str, claimant: str) -> Iterator[None]:
    """Within: the code on this thread is cell ``cell_id``'s (its run ``claimant``), whose output goes through relay
    ``relay``."""
    saved = getattr(_local, "cell", None)
    _local.cell = (relay, cell_id, claimant)
    try:
        yield
    finally:
        _local.cell = saved


class _Commands(io.TextIOBase):
    """pdb's stdin: each line asked for is a command from the notebook."""

    def __init__(self, debugger: NotebookPdb) -> None:
        self.debugger = debugger

    def readline(self, size: int | None = -1) -> str:  # type: ignore[override]
        return self.debugger.ask()


class NotebookPdb(pdb.Pdb):
    """pdb whose prompts and output go to the notebook, and whose commands come from it."""

    def __init__(self, relay: str, cell_id: str) -> None:
        self.relay_name = relay
        self.cell_id = cell_id
        self.said = io.StringIO()
        super().__init__(stdin=cast(IO[str], _Commands(self)), stdout=self.said, nosigint=True)
        self.use_rawinput = False
        self.prompt = "(Pdb) "
        self.asked = 0

    def _cmdloop(self) -> None:
        # pdb's own loop takes an interrupt at its prompt and asks again; here an interrupt ends the stop (and the
        # cell, as any interrupt of a cell does).
        try:
            self.allow_kbdint = True
            self.cmdloop()
        except KeyboardInterrupt:
            self.set_quit()
            raise
        finally:
            self.allow_kbdint = False

    def _relay(self) -> Any:
        return _relays.relay(self.relay_name)

    def ask(self) -> str:
        """Send what pdb said and its prompt to the notebook; wait for the command."""
        import ray

        text = self.said.getvalue()
        self.said.seek(0)
        self.said.truncate()
        if text.endswith(self.prompt):
            text = text[: -len(self.prompt)]
        self.asked += 1
        sys.stdout.flush()  # the cell's own output first
        relay = self._relay()
        event = {"text": text, "prompt": self.prompt, "number": self.asked, "pid": os.getpid()}
        with _quiet():
            ray.get(relay.push.remote(self.cell_id, 0, -1, [("input", event)]))
            try:
                answer = ray.get(relay.ask.remote(self.cell_id, UNATTENDED))
            except ray.exceptions.TaskCancelledError:
                # The cell was interrupted at the prompt: Ray cancels its task and, with it, this wait for a command,
                # which may fail here before the task's own interrupt arrives. Either way the stop ends as one.
                raise KeyboardInterrupt from None
        if answer is None:
            raise TimeoutError(
                f"breakpoint(): no command came from the notebook for {UNATTENDED / 60:.0f} minutes; the cell ended "
                "here"
            )
        return str(answer).rstrip("\n") + "\n"


def _claimed(relay_name: str, cell_id: str, claimant: str) -> bool:
    import ray

    with _quiet():
        return bool(ray.get(_relays.relay(relay_name).claim.remote(cell_id, claimant)))


def stop_here(*args: Any, **kwargs: Any) -> None:
    """``sys.breakpointhook``: stop the caller in a :class:`NotebookPdb` driven from the notebook. Outside a cell's
    own code (a thread the cell did not run on, a training worker, a library's actor) there is no notebook to
    drive it and no terminal either: it says so and goes on."""
    cell = getattr(_local, "cell", None)
    if cell is None:
        caller = sys._getframe().f_back
        where = f"{caller.f_code.co_filename}:{caller.f_lineno}" if caller is not None else "?"
        print(
            f"breakpoint() at {where}: not in a cell's own code, where the notebook could drive it; went on past it",
            file=sys.stderr,
        )
        return
    relay, cell_id, claimant = cell
    if not _claimed(relay, cell_id, claimant):
        if cell_id not in _told:
            _told.add(cell_id)
            print("breakpoint(): another item of this --map is stopped in the debugger; this one goes on past it")
        return
    NotebookPdb(relay, cell_id).set_trace(sys._getframe().f_back)


def set_trace(*, header: str | None = None) -> None:
    """``pdb.set_trace()`` in a cell: as ``breakpoint()``."""
    cell = getattr(_local, "cell", None)
    if cell is None:
        stop_here()
        return
    relay, cell_id, claimant = cell
    if _claimed(relay, cell_id, claimant):
        NotebookPdb(relay, cell_id).set_trace(sys._getframe().f_back)


#: What marks the debugger's own Ray calls as not the cell's work (``._logs.unnoted``, given by :func:`install`).
_quiet: Callable[[], AbstractContextManager[Any]] = nullcontext


def install(quiet: Callable[[], AbstractContextManager[Any]] = nullcontext) -> None:
    """Make :func:`stop_here` this process's ``breakpoint()`` (and ``pdb.set_trace``); ``quiet``: what marks the
    debugger's own Ray calls as not the cell's work."""
    global _quiet
    _quiet = quiet
    sys.breakpointhook = stop_here
    pdb.set_trace = set_trace


__all__ = ["UNATTENDED", "NotebookPdb", "install", "running", "set_trace", "stop_here"]
