"""A million ``--map`` items through real kernels on a real embedded cluster, while another notebook works.

The agent's event loop must never run work that grows with the items: a second notebook attached to the same
agent (as a second notebook over SSH is, the link's transport aside) is answered in under a second throughout,
the map's own kernel never hears of a lost link, and an interrupt stops the map within 2 s.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from .kernel import Kernel, attach_second, error_text, text

pytestmark = pytest.mark.timeout(900)

N = 1_000_000
MAP = f"%%remote --map i in range({N:_})\nsq = i * i"
#: What a second notebook's cells take while the map runs: nearly all within the issue's figure (1 s), and not one
#: anywhere near what an agent loop that ran the map's own work would hold them for (the whole map takes ~15 s here).
#: Both leave room for the scheduling noise of a loaded two-core machine (CI saw one answer in 1.03 s of 301).
ANSWER_WITHIN = 1.0
MOSTLY = 0.95
NEVER_OVER = 3.0


def _attached_second(first: Kernel) -> Kernel:
    """A second notebook on the first one's agent."""
    where = text(first.ok("agent = __import__('jupyter_cluster').current()._agent\nprint(agent.socket, agent.secret)"))
    socket, secret = where.split()
    return attach_second(socket, secret)


class Running:
    """A cell of ``kernel`` executing on a thread of the test's: its reply and messages once it ends."""

    def __init__(self, kernel: Kernel, code: str, timeout: float) -> None:
        self.reply: dict[str, Any] | None = None
        self.messages: list[Any] = []
        self.ended: float | None = None
        self._thread = threading.Thread(target=self._run, args=(kernel, code, timeout), daemon=True)
        self._thread.start()

    def _run(self, kernel: Kernel, code: str, timeout: float) -> None:
        try:
            self.reply, self.messages = kernel.execute(code, timeout)
        finally:
            self.ended = time.monotonic()

    def running(self) -> bool:
        return self._thread.is_alive()

    def join(self, timeout: float) -> None:
        self._thread.join(timeout)
        assert not self._thread.is_alive(), f"the cell did not end within {timeout:.0f} s"


@pytest.fixture(scope="module")
def kernels() -> Any:
    first = Kernel()
    second = None
    try:
        first.ok("%load_ext jupyter_cluster\n%cluster local --cpus 2")
        second = _attached_second(first)
        yield first, second
    finally:
        if second is not None:
            second.kc.stop_channels()
            second.km.shutdown_kernel(now=True)
        first.stop()


def _timed(kernel: Kernel, code: str) -> float:
    started = time.monotonic()
    kernel.ok(code, timeout=60)
    return time.monotonic() - started


def test_a_million_item_map_completes_while_another_notebook_is_answered(kernels: tuple[Kernel, Kernel]) -> None:
    first, second = kernels
    assert _timed(second, "%%remote --driver\nanswer = 6 * 7\nanswer") < 5  # warm
    cell = Running(first, MAP, timeout=800)
    latencies: list[float] = []
    while cell.running():
        # A driver cell needs no CPU of the cluster (the map's chunks hold both): it times the agent, not Ray's queue.
        latencies.append(_timed(second, "%%remote --driver\nanswer = 6 * 7\nanswer"))
        time.sleep(0.2)
    cell.join(0)
    assert cell.reply is not None and cell.reply["status"] == "ok", error_text(cell.messages)
    shown = text(cell.messages) + "".join(str(m["content"]) for m in cell.messages if m["msg_type"] != "stream")
    assert "lost" not in shown.lower(), shown[-2000:]
    check = text(first.ok(f"print(len(sq), sq[0], sq[-1] == {N - 1} ** 2, sum(sq) == sum(i * i for i in range({N})))"))
    assert check.split() == [str(N), "0", "True", "True"], check
    assert len(latencies) >= 10, f"the map was over too soon to tell ({len(latencies)} answers)"
    slow = [f"{t:.2f}" for t in latencies if t > ANSWER_WITHIN]
    print(f"{len(latencies)} cells of a second notebook during the map; slowest {max(latencies):.2f} s")
    assert len(slow) <= (1 - MOSTLY) * len(latencies), (
        f"cells of the second notebook took over {ANSWER_WITHIN} s: {slow} (of {len(latencies)})"
    )
    assert max(latencies) < NEVER_OVER, f"a cell of the second notebook waited {max(latencies):.2f} s: {slow}"


def test_a_later_cell_reads_a_large_async_map_from_the_cluster(kernels: tuple[Kernel, Kernel]) -> None:
    """``--async --map``: the output is a handle to the list on the cluster, joined from one list per chunk (not
    from a million Ray arguments); a later cell reads it there, whole and in order."""
    first, _ = kernels
    n = N // 5  # a fifth: the join is the same for any size (one list per chunk); the suite's CPU is shared
    first.ok(f"%%remote --async --map i in range({n:_})\nnext_ = i + 1")
    check = text(first.ok("%%remote\nprint(len(next_), next_[0], next_[-1], next_ == list(range(1, len(next_) + 1)))"))
    assert check.split() == [str(n), "1", str(n), "True"], check


def test_an_interrupt_stops_a_million_item_map_at_once(kernels: tuple[Kernel, Kernel]) -> None:
    first, second = kernels
    cell = Running(first, MAP.replace("sq = ", "cube = i * "), timeout=800)
    time.sleep(8)  # well under way: chunks running on both CPUs, more queued
    assert cell.running()
    first.km.interrupt_kernel()
    interrupted = time.monotonic()
    cell.join(30)
    assert cell.ended is not None
    took = cell.ended - interrupted
    assert cell.reply is not None and cell.reply["status"] == "error", cell.reply
    assert "cancelled the remote cell" in error_text(cell.messages), error_text(cell.messages)
    print(f"the map stopped {took:.2f} s after the interrupt")
    # About 1 to 2 s on two cores (more beside the other test process): how fast is the benchmarks' to measure
    # (bench_faults.py); here, that it stops at once, not after the chunks it queued, minutes of work.
    assert took < 10.0, f"the map took {took:.1f} s to stop"
    # Nothing of it goes on: both CPUs are free again at once, and the namespace has no half a result.
    free = text(
        second.ok(
            "%%remote --driver\nimport time\nfor _ in range(20):\n"
            "    if ray.available_resources().get('CPU', 0) == 2: break\n    time.sleep(0.1)\n"
            "print(ray.available_resources().get('CPU', 0))"
        )
    )
    assert free.strip() == "2.0", free
    assert "False" in text(first.ok("print('cube' in dir())"))
