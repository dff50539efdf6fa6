"""The test kernel pairs each request with its own reply, even for a kernel slow to start.

``jupyter_client``'s ``wait_for_ready`` sends a ``kernel_info_request`` each second until
one is answered; a kernel that takes longer than that to start (a loaded machine) answers
all of them, and the spare replies wait in the shell channel. Read blindly, each cell
would then get the previous request's reply, and a failed cell would pass as ``ok``.
"""

from __future__ import annotations

from pathlib import Path

from .kernel import Kernel


def test_a_kernel_slow_to_start_gets_each_reply_to_its_own_request(tmp_path: Path) -> None:
    startup = tmp_path / "profile_default" / "startup"
    startup.mkdir(parents=True)
    (startup / "00-slow.py").write_text("import time\ntime.sleep(3)\n")  # IPython runs it before serving
    kernel = Kernel(env={"IPYTHONDIR": str(tmp_path)})
    try:
        first, _ = kernel.execute("x = 41")
        failed, messages = kernel.execute("1 / 0")
        last, _ = kernel.execute("x + 1")
    finally:
        kernel.kc.stop_channels()
        kernel.km.shutdown_kernel(now=True)
    assert first["status"] == "ok"
    assert failed["status"] == "error" and failed["ename"] == "ZeroDivisionError", failed
    assert any(m["msg_type"] == "error" for m in messages)
    assert last["status"] == "ok" and last["execution_count"] == failed["execution_count"] + 1, last
