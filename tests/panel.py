"""What a JupyterLab sidebar panel sees of a kernel: its ``jupyter_cluster`` comm, read as the panel reads it."""

from __future__ import annotations

import queue
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from jupyter_cluster._sidebar import COMM_TARGET

from .kernel import Kernel, error_text


class Panel:
    """What a sidebar sees of one kernel: every comm message, read on a thread of its own."""

    def __init__(self, kernel: Kernel, client: Any = None) -> None:
        self.kernel = kernel
        #: The kernel client whose iopub this panel reads (another page has a client of its own).
        self.kc = client or kernel.kc
        self.comm_id: str | None = None
        self.messages: queue.Queue[dict[str, Any]] = queue.Queue()
        self.seen: list[dict[str, Any]] = []
        self.closed = threading.Event()
        self.opened = threading.Event()
        self._requests = iter(range(1, 1_000_000))
        self._stop = False
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        kc = self.kc
        while not self._stop:
            try:
                msg = kc.get_iopub_msg(timeout=0.2)
            except queue.Empty:
                continue
            kind, content = msg["msg_type"], msg["content"]
            if kind == "comm_open" and content.get("target_name") == COMM_TARGET:
                self.comm_id = content["comm_id"]
                self.opened.set()
                self._take(content.get("data") or {})
            elif kind == "comm_msg" and content.get("comm_id") == self.comm_id:
                self._take(content["data"])
            elif kind == "comm_close" and content.get("comm_id") == self.comm_id:
                self.closed.set()

    def _take(self, data: dict[str, Any]) -> None:
        data = {**data, "_at": time.monotonic()}
        self.seen.append(data)
        self.messages.put(data)

    def open(self, data: dict[str, Any] | None = None) -> None:
        """Open a comm from the panel's side (as a panel does for a kernel it finds)."""
        self.comm_id = uuid.uuid4().hex
        self.closed.clear()
        kc = self.kc
        kc.shell_channel.send(
            kc.session.msg("comm_open", {"comm_id": self.comm_id, "target_name": COMM_TARGET, "data": data or {}})
        )

    def send(self, data: dict[str, Any]) -> None:
        kc = self.kc
        kc.shell_channel.send(kc.session.msg("comm_msg", {"comm_id": self.comm_id, "data": data}))

    def request(self, data: dict[str, Any], timeout: float = 60) -> dict[str, Any]:
        number = next(self._requests)
        self.send({**data, "request": number})
        return self.wait("reply", lambda m: m["request"] == number, timeout)

    def wait(self, kind: str, until: Callable[[dict[str, Any]], bool] = lambda m: True, timeout: float = 60) -> Any:
        """The next message of ``kind`` that ``until`` accepts (earlier ones are passed over)."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                kinds = [m["type"] for m in self.seen[-20:]]
                raise AssertionError(f"no {kind} message as expected within {timeout} s (last seen: {kinds})")
            try:
                msg = self.messages.get(timeout=min(left, 0.5))
            except queue.Empty:
                continue
            if msg["type"] == kind and until(msg):
                return msg

    def drain(self) -> None:
        while not self.messages.empty():
            self.messages.get()

    def stop(self) -> None:
        self._stop = True
        self._reader.join(5)


def run(kernel: Kernel, code: str, timeout: float = 120) -> dict[str, Any]:
    """Run ``code`` (the panel's reader takes the iopub messages); its execute_reply."""
    msg_id = kernel.kc.execute(code)
    deadline = time.monotonic() + timeout
    while True:
        reply = kernel.kc.get_shell_msg(timeout=max(0.1, deadline - time.monotonic()))
        if reply["parent_header"].get("msg_id") == msg_id:
            return dict(reply["content"])


def ok(kernel: Kernel, code: str, timeout: float = 120) -> None:
    reply = run(kernel, code, timeout)
    assert reply["status"] == "ok", f"{reply.get('ename')}: {reply.get('evalue')}\n" + error_text([])


def value(kernel: Kernel, expression: str, timeout: float = 120) -> str:
    """``expression`` evaluated in the kernel, as text (from the shell reply: the panel's reader takes iopub)."""
    msg_id = kernel.kc.execute("", silent=True, user_expressions={"v": expression})
    deadline = time.monotonic() + timeout
    while True:
        reply = kernel.kc.get_shell_msg(timeout=max(0.1, deadline - time.monotonic()))
        if reply["parent_header"].get("msg_id") == msg_id:
            found = reply["content"]["user_expressions"]["v"]
            assert found["status"] == "ok", f"{expression}: {found.get('ename')}: {found.get('evalue')}"
            return str(found["data"]["text/plain"])
