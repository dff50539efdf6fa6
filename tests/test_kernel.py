"""Through a real Jupyter kernel: interrupts, rich output, tracebacks, late output routing."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest

from .kernel import Kernel, result

pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def kernel() -> Iterator[Kernel]:
    k = Kernel()
    reply, _ = k.execute("%load_ext jupyter_cluster\n%cluster local --cpus 2", timeout=180)
    assert reply["status"] == "ok"
    yield k
    k.stop()


def _text(messages: list[Any], kind: str = "stream") -> str:
    return "".join(m["content"].get("text", "") for m in messages if m["msg_type"] == kind)


def test_interrupting_the_kernel_cancels_the_remote_cell(kernel: Kernel, tmp_path: Any) -> None:
    marker = tmp_path / "ticks"
    code = (
        f"%%remote\nimport time\nfor i in range(600):\n"
        f"    open({str(marker)!r}, 'a').write('.')\n    print('tick', i, flush=True)\n    time.sleep(0.05)\n"
    )
    interrupted = []

    def interrupt_on_first_tick(msg: Any) -> None:
        if not interrupted and msg["msg_type"] == "stream" and "tick" in msg["content"]["text"]:
            interrupted.append(time.monotonic())
            kernel.km.interrupt_kernel()

    reply, messages = kernel.execute(code, on_message=interrupt_on_first_tick)
    assert interrupted, "no live output arrived before the cell ended"
    assert reply["status"] == "error" and reply["ename"] == "CellInterrupted"
    assert time.monotonic() - interrupted[0] < 10
    size = marker.stat().st_size
    time.sleep(0.5)
    assert marker.stat().st_size == size, "the remote loop kept running"
    # The kernel and the cluster are fine afterwards.
    reply, messages = kernel.execute("%%remote\n6 * 7")
    assert reply["status"] == "ok"
    assert any(m["msg_type"] == "execute_result" and m["content"]["data"]["text/plain"] == "42" for m in messages)


def test_rich_output_and_figures_reach_the_notebook(kernel: Kernel) -> None:
    code = (
        "%%remote\nimport matplotlib.pyplot as plt\n"
        "class Card:\n    def _repr_html_(self):\n        return '<i>card</i>'\n"
        "display(Card())\nplt.plot([3, 1, 2])\nprint('after')\n"
    )
    reply, messages = kernel.execute(code)
    assert reply["status"] == "ok"
    displays = [m["content"]["data"] for m in messages if m["msg_type"] == "display_data"]
    assert any(d.get("text/html") == "<i>card</i>" for d in displays)
    assert any("image/png" in d for d in displays)
    assert "after" in _text(messages)


def test_the_kernel_keeps_its_inline_figures_and_the_workers_draw_off_screen(kernel: Kernel) -> None:
    """The agent and its workers draw off-screen; importing the agent's modules (a test process that then starts
    kernels, a notebook poking at them) changes no environment a kernel inherits."""
    probe = (
        "import importlib, os, pkgutil, jupyter_cluster.agent as agent\n"
        "for m in pkgutil.iter_modules(agent.__path__):\n"
        "    if m.name != '__main__':\n"
        "        importlib.import_module('jupyter_cluster.agent.' + m.name)\n"
        "print(os.environ.get('MPLBACKEND'))"
    )
    env = {k: v for k, v in os.environ.items() if k != "MPLBACKEND"}
    done = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "None", "importing the agent's modules set MPLBACKEND"
    reply, messages = kernel.execute("import matplotlib.pyplot as plt\nplt.plot([1, 2])\nplt.show()")
    assert reply["status"] == "ok"
    assert any("image/png" in m["content"]["data"] for m in messages if m["msg_type"] == "display_data")
    reply, messages = kernel.execute("%%remote\nimport matplotlib\nmatplotlib.get_backend().lower()")
    assert reply["status"] == "ok"
    assert any(m["content"]["data"]["text/plain"] == "'agg'" for m in messages if m["msg_type"] == "execute_result")


def test_remote_traceback_in_the_error_message(kernel: Kernel) -> None:
    reply, messages = kernel.execute("%%remote\na = 1\nb = a / 0\n")
    assert reply["status"] == "error" and reply["ename"] == "ZeroDivisionError"
    error = next(m for m in messages if m["msg_type"] == "error")
    text = "\n".join(error["content"]["traceback"])
    assert "b = a / 0" in text and "----> 2" in text
    assert "run_cell_magic" not in text


def test_late_output_goes_to_its_own_cell(kernel: Kernel) -> None:
    reply, first = kernel.execute(
        "%%remote --async\nimport time\ntime.sleep(1)\nprint('late output', flush=True)\nlate = 1"
    )
    assert reply["status"] == "ok"
    display_ids = {
        m["content"].get("transient", {}).get("display_id") for m in first if m["msg_type"] == "display_data"
    }
    display_ids.discard(None)
    assert display_ids, "an --async cell opens a display area of its own"
    # The next cell runs while the first one ends: it waits for it, then a moment for its area's last update.
    reply, second = kernel.execute(
        "import time, jupyter_cluster as jc\njc.get(late)\ntime.sleep(0.5)\nprint('second cell')"
    )
    assert reply["status"] == "ok"
    assert "late output" not in _text(second), "late output leaked into the running cell"
    updates = [m for m in second if m["msg_type"] == "update_display_data"]
    assert any(
        "late output" in m["content"]["data"]["text/plain"] and m["content"]["transient"]["display_id"] in display_ids
        for m in updates
    )
    reply, messages = kernel.execute("late")
    assert any(m["msg_type"] == "execute_result" and m["content"]["data"]["text/plain"] == "1" for m in messages)


def test_sync_shows_a_progress_bar_and_the_cells_run_in_the_folder(kernel: Kernel, tmp_path: Any) -> None:
    folder = tmp_path / "project"
    folder.mkdir()
    for i in range(3):
        (folder / f"part{i}.txt").write_text(f"part {i}\n" * 20_000)
    messages = kernel.ok(f"%cluster sync {folder}")
    shown = [
        m["content"]["data"].get("text/plain", "")
        for m in [*messages, *kernel.updates]
        if m["msg_type"] in ("display_data", "update_display_data")
    ]
    assert any("jc.sync(project)" in text and "KiB" in text for text in shown), shown
    assert f"synced {folder} (3 files" in _text(messages)
    messages = kernel.ok("%%remote\nparts = sorted(open(f'part{i}.txt').readline() for i in range(3))\nparts")
    assert "part 2" in (result(messages) or "")
    kernel.ok("%cluster sync --off")
