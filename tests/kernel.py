"""A real Jupyter kernel (ipykernel through jupyter_client) for tests that need one."""

from __future__ import annotations

import os
import queue
import time
from collections.abc import Callable
from typing import Any

from jupyter_client.manager import KernelManager


class Kernel:
    """A ``python3`` kernel; :meth:`execute` runs code and returns what it published."""

    def __init__(self, cwd: str | None = None, env: dict[str, str] | None = None, kernel_name: str = "python3") -> None:
        self.km = KernelManager(kernel_name=kernel_name)
        self.km.start_kernel(env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}, cwd=cwd)
        self.kc = self.km.blocking_client()
        self.kc.start_channels()
        self.kc.wait_for_ready(timeout=60)
        #: ``update_display_data`` messages that arrived between executions.
        self.updates: list[dict[str, Any]] = []

    def execute(
        self, code: str, timeout: float = 120, on_message: Callable[[Any], None] | None = None
    ) -> tuple[dict[str, Any], list[Any]]:
        """Run ``code``; return its execute_reply content and the iopub messages it caused
        (display updates included, whichever cell they belong to)."""
        msg_id = self.kc.execute(code)
        messages = []
        deadline = time.monotonic() + timeout
        while True:
            msg = self.kc.get_iopub_msg(timeout=max(0.1, deadline - time.monotonic()))
            if msg["msg_type"] == "update_display_data":
                self.updates.append(msg)
            if msg["parent_header"].get("msg_id") == msg_id or msg["msg_type"] == "update_display_data":
                messages.append(msg)
                if on_message is not None:
                    on_message(msg)
            if (
                msg["parent_header"].get("msg_id") == msg_id
                and msg["msg_type"] == "status"
                and msg["content"]["execution_state"] == "idle"
            ):
                break
        return self.reply_to(msg_id, timeout), messages

    def reply_to(self, msg_id: str, timeout: float = 120) -> dict[str, Any]:
        """The content of the shell reply to request ``msg_id``. Other replies are passed
        over: ``wait_for_ready`` sends a ``kernel_info_request`` each second until one is
        answered, so a kernel slow to start leaves extra replies in the shell channel."""
        deadline = time.monotonic() + timeout
        while True:
            reply = self.kc.get_shell_msg(timeout=max(0.1, deadline - time.monotonic()))
            if reply["parent_header"].get("msg_id") == msg_id:
                return dict(reply["content"])

    def ok(self, code: str, timeout: float = 120) -> list[Any]:
        """Run ``code``, which must succeed; return its messages."""
        reply, messages = self.execute(code, timeout)
        assert reply["status"] == "ok", f"{reply.get('ename')}: {reply.get('evalue')}\n" + error_text(messages)
        return messages

    def asking(self, code: str, answer: str | None, timeout: float = 240) -> tuple[str, list[dict[str, Any]]]:
        """Run ``code``, answering each question it asks (``input()``, ``getpass()``) with ``answer`` (None: a
        frontend that takes no input, as nbclient's); what it printed (its error's name and message too), and the
        questions (``input_request`` contents)."""
        msg_id = self.kc.execute(code, allow_stdin=answer is not None)
        asked: list[dict[str, Any]] = []
        printed: list[str] = []
        deadline = time.monotonic() + timeout
        while True:
            assert time.monotonic() < deadline, "the cell did not end:\n" + "".join(printed)
            try:
                request = self.kc.get_stdin_msg(timeout=0.05)
                asked.append(request["content"])
                self.kc.input(answer or "")
            except queue.Empty:
                pass
            try:
                msg = self.kc.get_iopub_msg(timeout=0.05)
            except queue.Empty:
                continue
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            if msg["msg_type"] == "stream":
                printed.append(msg["content"]["text"])
            elif msg["msg_type"] == "error":
                printed.append(f"{msg['content']['ename']}: {msg['content']['evalue']}")
            elif msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
                break
        self.reply_to(msg_id)
        return "".join(printed), asked

    def wait_for_update(self, predicate: Callable[[dict[str, Any]], bool], timeout: float = 60) -> dict[str, Any]:
        """The first display update (seen already, or arriving within ``timeout``) that ``predicate`` accepts."""
        for msg in self.updates:
            if predicate(msg):
                return msg
        deadline = time.monotonic() + timeout
        while True:
            msg = self.kc.get_iopub_msg(timeout=max(0.1, deadline - time.monotonic()))
            if msg["msg_type"] == "update_display_data":
                self.updates.append(msg)
                if predicate(msg):
                    return msg

    def stop(self) -> None:
        try:
            self.execute("%cluster down --force", timeout=60)  # whatever it is attached to
        finally:
            self.kc.stop_channels()
            self.km.shutdown_kernel(now=True)


def attach_second(socket: str, secret: str, name: str = "second") -> Kernel:
    """Another notebook on the agent at ``socket``: a kernel whose link (a session of its own) reaches the same
    agent, as a second notebook's does over SSH, the link's transport aside."""
    second = Kernel()
    second.ok(
        "%load_ext jupyter_cluster\n"
        "import jupyter_cluster as jc\n"
        "from jupyter_cluster import _cluster\n"
        "from jupyter_cluster._link import AgentLink, UnixTransport\n"
        f"link = AgentLink(UnixTransport({socket!r}), {secret!r}, {name!r})\n"
        "link.connect()\n"
        "_cluster.attach(_cluster.Cluster(link, kind='embedded local'))"
    )
    return second


def text(messages: list[Any], name: str | None = None) -> str:
    """What the messages printed (``name``: only ``stdout`` or ``stderr``)."""
    return "".join(
        m["content"]["text"]
        for m in messages
        if m["msg_type"] == "stream" and (name is None or m["content"]["name"] == name)
    )


def error_text(messages: list[Any]) -> str:
    """The traceback the notebook shows for a failed cell, without ANSI colours."""
    import re

    lines = [line for m in messages if m["msg_type"] == "error" for line in m["content"]["traceback"]]
    return re.sub(r"\x1b\[[0-9;]*m", "", "\n".join(lines))


def result(messages: list[Any]) -> str | None:
    """The cell's ``Out[n]`` as text, if it had one."""
    for m in messages:
        if m["msg_type"] == "execute_result":
            return str(m["content"]["data"]["text/plain"])
    return None


def interrupt_thread(ident: int) -> bool:
    """Raise KeyboardInterrupt in thread ``ident`` at its next Python instruction (as
    SIGINT does in a kernel's main thread)."""
    import ctypes

    done = ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(ident), ctypes.py_object(KeyboardInterrupt))
    return bool(done == 1)
