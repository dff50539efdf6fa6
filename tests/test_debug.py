"""``%debug`` after a failed ``%%remote`` cell, through a real kernel answering pdb's prompts on stdin.

The kernel is attached to the session's shared cluster (as a second notebook is); each test fails a cell of one
mode, then answers ``%debug``'s prompts as a user types them, and reads what pdb printed.
"""

from __future__ import annotations

import queue
import re
import time
from collections.abc import Iterator

import pytest

import jupyter_cluster as jc

from .kernel import Kernel, attach_second
from .test_worker_output import _agent_of

pytestmark = [pytest.mark.ray, pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def kernel(_session_cluster: None) -> Iterator[Kernel]:
    cluster = jc.current() or jc.local(cpus=2)
    second = attach_second(*_agent_of(cluster), name="debug")
    try:
        yield second
    finally:
        second.kc.stop_channels()
        second.km.shutdown_kernel(now=True)


def debug(kernel: Kernel, commands: list[str], timeout: float = 60) -> str:
    """Run ``%debug``, answering each of pdb's prompts with the next command; what it printed, colours aside."""
    kc = kernel.kc
    msg_id = kc.execute("%debug", allow_stdin=True)
    answers = list(commands)
    printed: list[str] = []
    deadline = time.monotonic() + timeout
    while True:
        assert time.monotonic() < deadline, "%debug did not end:\n" + "".join(printed)
        try:
            kc.get_stdin_msg(timeout=0.05)  # pdb's prompt: the next command
            kc.input(answers.pop(0) if answers else "q")
        except queue.Empty:
            pass
        try:
            msg = kc.get_iopub_msg(timeout=0.05)
        except queue.Empty:
            continue
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        if msg["msg_type"] == "stream":
            printed.append(msg["content"]["text"])
        elif msg["msg_type"] == "error":
            printed.append("\n".join(msg["content"]["traceback"]))
        elif msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
            break
    kernel.reply_to(msg_id)
    assert not answers, f"pdb ended before these commands: {answers}"
    return "\n" + re.sub(r"\x1b\[[0-9;]*m", "", "".join(printed))


def fails(kernel: Kernel, code: str) -> None:
    reply, _ = kernel.execute(code)
    assert reply["status"] == "error", f"the cell was meant to fail: {reply}"


def test_a_task_cells_frames_their_locals_source_and_caller(kernel: Kernel) -> None:
    kernel.ok("scale = 3\ndef inner(values, divisor):\n    total = sum(values) * scale\n    return total / divisor\n")
    fails(kernel, '%%remote\ndata = list(range(5))\nlabel = "first"\nresult = inner(data, 0)\n')
    out = debug(kernel, ["p total", "pp sorted(locals())", "ll", "a", "w", "up", "p label", "p data", "l", "down", "q"])
    assert "Post-mortem of Cell In[" in out, out
    assert "inner()" in out and "----> 4     return total / divisor" in out, out  # the remote line, in its source
    assert "\n30\n" in out, "the remote local, not a re-run" + out
    assert "['divisor', 'total', 'values']" in out, out
    assert "values = [0, 1, 2, 3, 4]\ndivisor = 0" in out, out  # a: the function's arguments
    assert "result = inner(data, 0)" in out and "'first'" in out and "[0, 1, 2, 3, 4]" in out, out  # up, the caller
    assert "_postmortem" not in out, "a frame of this package's own in the stack"


def test_the_failing_items_loop_variable(kernel: Kernel) -> None:
    fails(kernel, "%%remote --map i in range(6)\nroot = 10 / (i - 4)\n")
    out = debug(kernel, ["p i", "p 10 - i", "q"])
    assert "\n4\n" in out and "\n6\n" in out, out


def test_an_actor_cells_local(kernel: Kernel) -> None:
    kernel.ok("%%remote --actor debugged\nkept = {'a': 1}\n")
    fails(kernel, "%%remote --actor debugged\nkey = 'missing'\nvalue = kept[key]\n")
    out = debug(kernel, ["p key", "p kept", "q"])
    assert "'missing'" in out and "{'a': 1}" in out, out
    kernel.ok("jc.current().kill_actor('debugged')")


def test_a_driver_cells_frames_and_a_value_that_cannot_travel(kernel: Kernel) -> None:
    fails(kernel, "%%remote --driver\nimport threading\nlock = threading.Lock()\ncount = 7\ncount / 0\n")
    out = debug(kernel, ["p count", "p lock", "q"])
    assert "\n7\n" in out, out
    assert "<unlocked _thread.lock object at" in out and "could not be pickled" in out, out


def test_a_local_error_is_ipythons_own_debug(kernel: Kernel) -> None:
    fails(kernel, "here = 'local'\nundefined_name\n")
    out = debug(kernel, ["p here", "q"])
    assert "'local'" in out and "Post-mortem" not in out, out


# ------------------------------------------------------------------ breakpoint()


def stopped(kernel: Kernel, code: str, commands: list[str], interrupt_at: int | None = None) -> tuple[str, str]:
    """Run ``code`` (which stops at a ``breakpoint()``), answering pdb's prompts with ``commands`` (interrupting the
    kernel at prompt number ``interrupt_at`` instead); the reply's status and what the cell showed."""
    kc = kernel.kc
    msg_id = kc.execute(code, allow_stdin=True)
    answers = list(commands)
    printed: list[str] = []
    prompts = 0
    status = ""
    deadline = time.monotonic() + 120
    while True:
        assert time.monotonic() < deadline, "the cell did not end:\n" + "".join(printed)
        try:
            kc.get_stdin_msg(timeout=0.05)
            prompts += 1
            if prompts == interrupt_at:
                kernel.km.interrupt_kernel()
            else:
                kc.input(answers.pop(0) if answers else "c")
        except queue.Empty:
            pass
        try:
            msg = kc.get_iopub_msg(timeout=0.05)
        except queue.Empty:
            continue
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        if msg["msg_type"] == "stream":
            printed.append(msg["content"]["text"])
        elif msg["msg_type"] == "error":
            printed.append("\n".join(msg["content"]["traceback"]))
        elif msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
            status = kernel.reply_to(msg_id)["status"]
            break
    return status, "\n" + re.sub(r"\x1b\[[0-9;]*m", "", "".join(printed))


def test_breakpoint_in_a_task_cell_stops_there_and_the_notebook_drives_it(kernel: Kernel) -> None:
    status, out = stopped(
        kernel,
        "%%remote\nimport psutil\n"
        "listening = lambda: sorted(c.laddr.port for c in psutil.Process().net_connections('inet') "
        "if c.status == 'LISTEN')\n"
        "before = listening()\nx = 41\nbreakpoint()\ny = x + 1\nprint('after the stop', y)\n",
        ["p x", "l", "print('same ports:', listening() == before)", "n", "p y", "c"],
    )
    assert status == "ok", out
    assert "-> y = x + 1" in out and "\n41\n" in out and "\n42\n" in out, out
    assert "same ports: True" in out, "the stopped worker listens on a port it did not before (a debugger's)" + out
    assert "after the stop 42" in out, out
    assert "42" in _printed(kernel, "print(y)")


def _printed(kernel: Kernel, code: str) -> str:
    from .kernel import text

    return text(kernel.ok(code))


def test_an_interrupt_at_the_prompt_ends_the_stop_and_the_cell(kernel: Kernel) -> None:
    status, out = stopped(kernel, "%%remote\nbreakpoint()\nnever = True\n", [], interrupt_at=1)
    assert status == "error" and "cancelled the remote cell" in out, out
    assert "never" not in _printed(kernel, "print(sorted(n for n in dir() if n == 'never'))")


def test_a_maps_first_item_stops_and_the_others_go_on(kernel: Kernel) -> None:
    status, out = stopped(kernel, "%%remote --map i in range(4)\nbreakpoint()\nsquare = i * i\n", ["p i", "c"])
    assert status == "ok", out
    assert "another item of this --map is stopped in the debugger" in out, out
    assert "[0, 1, 4, 9]" in _printed(kernel, "print(square)")


def test_breakpoint_in_driver_and_actor_cells_and_quitting(kernel: Kernel) -> None:
    status, out = stopped(kernel, "%%remote --driver\nw = 'driver'\nbreakpoint()\nw2 = w * 2\n", ["p w", "c"])
    assert status == "ok" and "'driver'" in out, out
    assert "driverdriver" in _printed(kernel, "print(w2)")
    status, out = stopped(kernel, "%%remote --actor stops\nk = 5\nbreakpoint()\nk2 = k\n", ["p k", "q"])
    assert status == "error" and "\n5\n" in out, out  # q: the cell ends with pdb's BdbQuit, as a local one does
    kernel.ok("jc.current().kill_actor('stops')")


def test_an_async_cells_breakpoint_goes_on_and_says_so(kernel: Kernel) -> None:
    kernel.ok("%%remote --async\nbreakpoint()\nlater = 'went on'\n")
    deadline = time.monotonic() + 60
    while "went on" not in _printed(kernel, "print(later if isinstance(later, str) else 'pending')"):
        assert time.monotonic() < deadline, "the --async cell stayed stopped"
        time.sleep(0.5)


def test_cluster_timeline_displays_a_cells_gantt_and_its_picture(kernel: Kernel) -> None:
    kernel.ok("import time")
    kernel.ok("%%remote --map i in range(6)\ntime.sleep(0.1)\nsquare = i * i\n")
    messages = kernel.ok("%cluster timeline")
    bundles = [m["content"]["data"] for m in messages if m["msg_type"] == "display_data"]
    assert any(b.get("text/plain", "").startswith("<Timeline Cell In[") for b in bundles), bundles
    assert any("application/vnd.jupyter.widget-view+json" in b for b in bundles), "no Gantt"
    pictures = [b for b in bundles if "image/svg+xml" in b]
    assert pictures and "<rect x=" in pictures[0]["image/svg+xml"], "no picture a saved notebook keeps"
