"""How fast a remote cell stops, and what an ``--async`` cell's output costs, through a real kernel.

A real ``ipykernel`` (``jupyter_client``) loads the extension and starts the embedded
cluster. Side by side in one run:

- **Interrupts.** A cell blocked in ``time.sleep(60)`` is interrupted (SIGINT to the
  kernel, as the notebook's stop button does) as soon as it prints; the figure is
  the time from the interrupt to the cell's reply. A plain local cell doing the same
  is the floor (the kernel's own interrupt); then a ``%%remote`` task, ``--actor``
  and ``--driver`` cell. Also ``--actor --timeout 1``: the reply's delay past 1 s.
- **Output traffic.** A cell printing N lines in the foreground sends them as stream
  messages; the same cell with ``--async`` sends display updates to its own area.
  The figure is bytes of messages, for both: once printed as fast as it goes, once
  trickling (N/20 lines, one every 10 ms), where each update carries a live tail.

Run: ``python benchmarks/bench_faults.py [--rounds 5] [--lines 20000]``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

SLEEPER = "import time\nprint('go', flush=True)\ntime.sleep(60)"
MODES = {
    "local cell (the kernel alone)": SLEEPER,
    "%%remote task": "%%remote\n" + SLEEPER,
    "%%remote --actor": "%%remote --actor bench\n" + SLEEPER,
    "%%remote --driver": "%%remote --driver\n" + SLEEPER,
}


class Client:
    def __init__(self) -> None:
        from jupyter_client.manager import start_new_kernel

        self.manager, self.client = start_new_kernel(kernel_name="python3")

    def run(self, code: str, interrupt_on_output: bool = False, timeout: float = 300) -> dict[str, Any]:
        """Run ``code``; its reply, seconds from request (or interrupt) to reply, and iopub messages."""
        msg_id = self.client.execute(code)
        start = time.perf_counter()
        messages: list[dict[str, Any]] = []
        idle = False
        while not idle:
            msg = self.client.get_iopub_msg(timeout=timeout)
            messages.append(msg)
            if interrupt_on_output and msg["msg_type"] == "stream" and msg["parent_header"].get("msg_id") == msg_id:
                interrupt_on_output = False
                start = time.perf_counter()
                self.manager.interrupt_kernel()
            idle = (
                msg["parent_header"].get("msg_id") == msg_id
                and msg["msg_type"] == "status"
                and msg["content"]["execution_state"] == "idle"
            )
        while True:  # past any kernel_info reply that start_new_kernel's wait left behind
            shell = self.client.get_shell_msg(timeout=timeout)
            if shell["parent_header"].get("msg_id") == msg_id:
                break
        reply = shell["content"]
        return {"reply": reply, "seconds": time.perf_counter() - start, "messages": messages}

    def ok(self, code: str, timeout: float = 300) -> list[dict[str, Any]]:
        done = self.run(code, timeout=timeout)
        if done["reply"]["status"] != "ok":
            raise RuntimeError(f"{code!r} failed: {done['reply'].get('ename')}: {done['reply'].get('evalue')}")
        return done["messages"]

    def drain_until(self, predicate: Any, timeout: float = 120) -> list[dict[str, Any]]:
        seen = []
        deadline = time.monotonic() + timeout
        while True:
            msg = self.client.get_iopub_msg(timeout=max(0.1, deadline - time.monotonic()))
            seen.append(msg)
            if predicate(msg):
                return seen

    def close(self) -> None:
        self.client.stop_channels()
        self.manager.shutdown_kernel(now=True)


def interrupts(kernel: Client, rounds: int) -> dict[str, float]:
    medians = {}
    for name, code in MODES.items():
        samples = []
        for _ in range(rounds):
            done = kernel.run(code, interrupt_on_output=True)
            assert done["reply"]["ename"] == "CellInterrupted", done["reply"]
            samples.append(done["seconds"])
        medians[name] = statistics.median(samples)
    samples = []
    for _ in range(rounds):
        done = kernel.run("%%remote --actor bench --timeout 1\nimport time\ntime.sleep(60)")
        assert done["reply"]["status"] == "error", done["reply"]
        samples.append(done["seconds"] - 1.0)
    medians["%%remote --actor --timeout 1 (past 1 s)"] = statistics.median(samples)
    return medians


def traffic(kernel: Client, lines: int, pause: float = 0.0) -> dict[str, float]:
    body = f"import time\nfor i in range({lines}):\n    print('line', i)\n    time.sleep({pause})\n"
    printed = sum(len(f"line {i}\n") for i in range(lines))
    foreground = kernel.ok("%%remote\n" + body)
    streamed = sum(len(json.dumps(m["content"])) for m in foreground if m["msg_type"] == "stream")
    first = kernel.ok("%%remote --async\n" + body + "finished = True")
    area = {m["content"]["transient"]["display_id"] for m in first if m["msg_type"] == "display_data"}
    updates = [m for m in first if m["msg_type"] == "update_display_data"]
    last = f"line {lines - 1}"
    if not any(last in m["content"]["data"]["text/plain"] for m in updates):
        updates += [
            m
            for m in kernel.drain_until(
                lambda m: m["msg_type"] == "update_display_data" and last in m["content"]["data"]["text/plain"]
            )
            if m["msg_type"] == "update_display_data"
        ]
    sent = sum(len(json.dumps(m["content"])) for m in updates if m["content"]["transient"]["display_id"] in area)
    return {"printed": printed, "foreground": streamed, "async": sent, "updates": len(updates)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--lines", type=int, default=20000)
    parser.add_argument("--cpus", type=int, default=2)
    args = parser.parse_args()

    kernel = Client()
    try:
        kernel.ok(f"%load_ext jupyter_cluster\n%cluster local --cpus {args.cpus}")
        kernel.ok("%%remote --actor bench\nready = 1")
        stop = interrupts(kernel, args.rounds)
        floor = stop["local cell (the kernel alone)"]
        print(f"{'interrupt to reply (median s)':44s} {'seconds':>8s} {'vs local':>9s}")
        for name, seconds in stop.items():
            print(f"{name:44s} {seconds:8.3f} {seconds / floor:9.1f}")
        for lines, pause in ((args.lines, 0.0), (args.lines // 20, 0.01)):
            sent = traffic(kernel, lines, pause)
            how = "at once" if not pause else f"one every {pause * 1000:.0f} ms"
            print(f"\n{lines:,} lines printed {how} ({sent['printed'] / 1e6:.3f} MB):")
            print(f"  foreground cell, stream messages: {sent['foreground'] / 1e6:.3f} MB")
            print(f"  --async cell, {sent['updates']} display updates: {sent['async'] / 1e6:.3f} MB")
            print(f"  ratio --async / foreground: {sent['async'] / sent['foreground']:.2f}")
        kernel.ok("%cluster down", timeout=120)
    finally:
        kernel.close()


if __name__ == "__main__":
    main()
