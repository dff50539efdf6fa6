"""Questions a login asks (a password, a passphrase, a second factor), asked in the notebook.

Two kinds of login ask them. The SSH link's asyncssh asks for a password or a keyboard-interactive answer (a
one-time code) when the server wants one. A command that ``--via`` runs (OpenSSH's ``ssh``, ``kubectl`` with an
exec credential plugin, ``gcloud``, ``srun``...) asks on its controlling terminal, ``/dev/tty``, never on its stdin
and stdout (those carry the session): each such command gets a pseudo-terminal of its own as that terminal
(:class:`Terminal`), and a line it leaves open there, a prompt, is a question; one asked with echo off (OpenSSH's
``readpassphrase`` turns it off) is a secret.

Both ask from the link's event loop, which cannot ask the user itself. The notebook's main thread asks, as
``input()`` or ``getpass()`` do in a cell (a secret is never echoed or kept), whenever it waits on the cluster:
a connect, a running cell, a call (:func:`wait`, :func:`answer_questions`). A question raised while the notebook
waits on nothing (a reconnect between cells) is asked by the next cell that does. A frontend that takes no input
(nbclient, papermill) answers none: the login then fails with the question in its error.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import fcntl
import getpass
import os
import pty
import queue
import termios
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

T = TypeVar("T")

#: Seconds between looks at the question queue while the main thread waits.
POLL = 0.1
#: Seconds a terminal stays quiet, a line left open, before that line counts as a prompt.
QUIET = 0.25


@dataclass
class Question:
    text: str
    secret: bool
    who: str
    answer: concurrent.futures.Future[str | None] = field(default_factory=concurrent.futures.Future)


_questions: queue.Queue[Question] = queue.Queue()


def ask(text: str, *, secret: bool, who: str) -> concurrent.futures.Future[str | None]:
    """Queue a question for the notebook (from any thread): its answer, or None where none can be given."""
    question = Question(text, secret, who)
    _questions.put(question)
    return question.answer


async def ask_async(text: str, *, secret: bool, who: str) -> str | None:
    return await asyncio.wrap_future(ask(text, secret=secret, who=who))


def answer_questions() -> None:
    """Ask the queued questions here, if this is the notebook's main thread (elsewhere: nothing)."""
    if threading.current_thread() is not threading.main_thread():
        return
    from IPython.core.error import StdinNotImplementedError

    while True:
        try:
            question = _questions.get_nowait()
        except queue.Empty:
            return
        if question.answer.done():  # its login ended meanwhile
            continue
        said: str | None
        try:
            said = getpass.getpass(question.text) if question.secret else input(question.text)
        except (StdinNotImplementedError, EOFError, OSError):
            said = None
        except BaseException:  # an interrupt: the login gets no answer, and the interrupt goes on
            _settle(question, None)
            raise
        _settle(question, said)


def _settle(question: Question, said: str | None) -> None:
    with contextlib.suppress(concurrent.futures.InvalidStateError):
        question.answer.set_result(said)


def wait(future: concurrent.futures.Future[T], timeout: float | None = None) -> T:
    """``future.result(timeout)``, asking the questions that come meanwhile (on the main thread)."""
    if threading.current_thread() is not threading.main_thread():
        return future.result(timeout)
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        answer_questions()
        left = POLL if deadline is None else min(POLL, deadline - time.monotonic())
        try:
            return future.result(max(left, 0.0))
        except concurrent.futures.TimeoutError:
            # The future's own error may be a TimeoutError too (a cell's CellTimeoutError): it ended, then.
            if future.done() or (deadline is not None and time.monotonic() >= deadline):
                raise


class Asking:
    """One login's questions: asked in the notebook, and time spent on them counted against no timeout."""

    def __init__(self, who: str, *, interactive: bool = True) -> None:
        self.who = who
        #: Whether a question is asked in the notebook; else it is refused at once (nobody waits on the login).
        self.interactive = interactive
        #: The questions nobody answered (a frontend without input): the login's failure says them.
        self.unanswered: list[str] = []
        #: A question waits for the notebook (:meth:`within`).
        self.asking = False
        self.answered_at = 0.0

    async def ask(self, text: str, *, secret: bool) -> str | None:
        """The notebook's answer to ``text``, or None (none given, or not :attr:`interactive`)."""
        said = None
        if self.interactive:
            self.asking = True
            try:
                said = await ask_async(text, secret=secret, who=self.who)
            finally:
                self.asking = False
                self.answered_at = time.monotonic()
        if said is None:
            self.unanswered.append(text.strip())
        return said

    async def within(self, awaitable: Awaitable[T], timeout: float) -> T:
        """``asyncio.wait_for(awaitable, timeout)``, where time spent on a question does not count."""
        task = asyncio.ensure_future(awaitable)
        deadline = time.monotonic() + timeout
        while True:
            deadline = max(deadline, self.answered_at + timeout)
            left = 1.0 if self.asking else deadline - time.monotonic()
            if left <= 0:
                task.cancel()
                raise asyncio.TimeoutError
            done, _ = await asyncio.wait({task}, timeout=left)
            if done:
                return task.result()

    def refused(self) -> str:
        """What to add to the login's failure: the questions nobody answered, and what to do."""
        if not self.unanswered:
            return ""
        asked = "; ".join(repr(text) for text in self.unanswered)
        return (
            f"It asked {asked}, and got no answer: this frontend takes no input, or none was given. Run the notebook "
            "where it can answer, or give the command a way in that asks nothing (a key in ssh-agent, a token)."
        )

    def kbdint(self, instructions: str, prompts: Any) -> Any:
        """The answers to an SSH server's keyboard-interactive ``prompts`` ``[(text, echo), ...]``: a coroutine."""

        async def responses() -> list[str] | None:
            answers = []
            for number, (text, echo) in enumerate(prompts):
                heading = instructions.strip() + "\n" if instructions.strip() and not number else ""
                said = await self.ask(heading + text, secret=not echo)
                if said is None:
                    return None
                answers.append(said)
            return answers

        return responses()


class Terminal(Asking):
    """A pseudo-terminal that a command gets as its controlling terminal; its prompts are asked in the notebook.

    ``preexec`` runs in the child, after ``setsid`` (``start_new_session=True``) made it a session leader with no
    terminal: the terminal's other end becomes its controlling one. Call :meth:`start` from the event loop once the
    command runs."""

    def __init__(self, who: str, *, interactive: bool = True) -> None:
        super().__init__(who, interactive=interactive)
        self.master, self.slave = pty.openpty()
        os.set_blocking(self.master, False)
        #: What the command wrote there since its last answer (lines it ended, then an open one).
        self.said = ""
        self._loop: asyncio.AbstractEventLoop | None = None
        self._quiet: asyncio.TimerHandle | None = None
        self._asked: asyncio.Future[None] | None = None
        #: Ends the command (:meth:`start`): a question nobody answers ends it, rather than being asked again.
        self.end: Callable[[], None] = lambda: None
        self._closer: asyncio.Future[None] | None = None

    def preexec(self) -> None:
        """In the child: take the terminal as the controlling one (C calls only: the child of a threaded kernel)."""
        fcntl.ioctl(self.slave, termios.TIOCSCTTY, 0)

    def start(self, ended: Awaitable[Any], end: Callable[[], None]) -> None:
        """Read the terminal (from the event loop) until ``ended``, the command's end, closes it; ``end()`` ends
        the command, where a question of its gets no answer."""
        self._loop = asyncio.get_running_loop()
        self._loop.add_reader(self.master, self._readable)
        self.end = end
        self._closer = asyncio.ensure_future(self._close_after(ended))

    async def _close_after(self, ended: Awaitable[Any]) -> None:
        try:
            await ended
        finally:
            self.close()

    def _readable(self) -> None:
        try:
            data = os.read(self.master, 4096)
        except BlockingIOError:
            return
        except OSError:  # EIO: nothing holds the other end
            data = b""
        if not data:
            self._stop_reading()
            return
        self.said += data.decode(errors="replace").replace("\r\n", "\n").replace("\r", "")
        if self._quiet is not None:
            self._quiet.cancel()
        assert self._loop is not None
        self._quiet = self._loop.call_later(QUIET, self._maybe_asking)

    def _echo_off(self) -> bool:
        try:
            return not termios.tcgetattr(self.slave)[3] & termios.ECHO
        except termios.error:
            return False

    def _maybe_asking(self) -> None:
        self._quiet = None
        if self.asking or not self.said.strip() or self.said.endswith("\n"):
            return  # lines it ended are said with its next question, or its failure
        text, self.said = self.said, ""
        self.asking = True  # at once: the next read must not ask it again
        self._asked = asyncio.ensure_future(self._answer(text.lstrip("\n"), self._echo_off()))

    async def _answer(self, text: str, secret: bool) -> None:
        said = await self.ask(text, secret=secret)
        if said is None:
            self.end()  # rather than asked again
            return
        with contextlib.suppress(OSError):
            os.write(self.master, said.encode() + b"\n")

    def _stop_reading(self) -> None:
        if self._loop is not None:
            with contextlib.suppress(ValueError, OSError):
                self._loop.remove_reader(self.master)

    def close(self) -> None:
        self._stop_reading()
        if self._quiet is not None:
            self._quiet.cancel()
        if self._asked is not None:
            self._asked.cancel()  # its question, unasked yet, is passed over (its future is cancelled)
        for fd in (self.master, self.slave):
            with contextlib.suppress(OSError):
                os.close(fd)


__all__ = ["Asking", "Terminal", "answer_questions", "ask", "ask_async", "wait"]
