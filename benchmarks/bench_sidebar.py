"""What the JupyterLab sidebar costs the kernel on an idle cluster: CPU and bytes sent.

A real kernel (ipykernel through jupyter_client) loads the extension and starts the
embedded cluster (2 CPUs, nothing running). A client plays the panel: it opens the
``jupyter_cluster`` comm and reads what the kernel pushes. Side by side, for
``--seconds`` each and in this order:

- **no panel**: the extension loaded, no comm open (the baseline);
- **panel hidden**: a comm open, the panel not visible (``watch`` visible=false);
- **panel visible**: the panel visible, node bars at the default interval (2 s);
- **panel visible, fastest**: node bars at the shortest interval a panel may ask (0.5 s).

For each: the kernel process's CPU time (user + system, from ``/proc``) over wall time,
as a share of one core, and the bytes of the comm messages it sent (their JSON on the
wire: header, parent header, metadata and content), per second.

Run: ``python benchmarks/bench_sidebar.py [--seconds 60]``.
Targets: visible on an idle cluster <= 1 % of a core and <= 2 KB/s; hidden: no bytes,
and CPU as with no panel.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import threading
import time
import uuid
from typing import Any

from jupyter_client.manager import KernelManager

TARGET = "jupyter_cluster"


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of process ``pid`` (its threads included), in seconds."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Counter:
    """Counts the comm messages the kernel sends, on a thread of its own."""

    def __init__(self, kc: Any) -> None:
        self.kc = kc
        self.bytes = 0
        self.messages = 0
        self.kinds: dict[str, int] = {}
        self.comm_id: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        while not self._stop.is_set():
            try:
                msg = self.kc.get_iopub_msg(timeout=0.2)
            except queue.Empty:
                continue
            if msg["msg_type"] == "comm_msg" and msg["content"].get("comm_id") == self.comm_id:
                wire = {k: msg[k] for k in ("header", "parent_header", "metadata", "content")}
                self.bytes += len(json.dumps(wire, default=str))
                self.messages += 1
                kind = msg["content"]["data"].get("type", "?")
                self.kinds[kind] = self.kinds.get(kind, 0) + 1

    def reset(self) -> None:
        self.bytes = self.messages = 0
        self.kinds = {}

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)


def execute(kc: Any, code: str, timeout: float = 180) -> None:
    msg_id = kc.execute(code)
    deadline = time.monotonic() + timeout
    while True:
        reply = kc.get_shell_msg(timeout=max(0.1, deadline - time.monotonic()))
        if reply["parent_header"].get("msg_id") == msg_id:
            assert reply["content"]["status"] == "ok", reply["content"]
            return


def send(kc: Any, msg_type: str, content: dict[str, Any]) -> None:
    kc.shell_channel.send(kc.session.msg(msg_type, content))


def measure(pid: int, counter: Counter, seconds: float) -> dict[str, float]:
    counter.reset()
    cpu, wall = cpu_seconds(pid), time.monotonic()
    time.sleep(seconds)
    cpu, wall = cpu_seconds(pid) - cpu, time.monotonic() - wall
    return {
        "cpu_percent": 100 * cpu / wall,
        "bytes_per_s": counter.bytes / wall,
        "messages": counter.messages,
        "kinds": dict(counter.kinds),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=60.0, help="length of each phase")
    args = parser.parse_args()

    km = KernelManager(kernel_name="python3")
    km.start_kernel()
    kc = km.blocking_client()
    kc.start_channels()
    kc.wait_for_ready(timeout=60)
    counter = Counter(kc)
    try:
        execute(kc, "%load_ext jupyter_cluster\n%cluster local --cpus 2")
        pid = km.provisioner.process.pid  # type: ignore[union-attr]
        time.sleep(5)  # the cluster settles
        results = {"no panel": measure(pid, counter, args.seconds)}

        comm_id = uuid.uuid4().hex
        counter.comm_id = comm_id
        send(kc, "comm_open", {"comm_id": comm_id, "target_name": TARGET, "data": {}})
        send(kc, "comm_msg", {"comm_id": comm_id, "data": {"type": "watch", "visible": False, "interval": 2}})
        time.sleep(3)  # the first state, whole
        results["panel hidden"] = measure(pid, counter, args.seconds)

        send(kc, "comm_msg", {"comm_id": comm_id, "data": {"type": "watch", "visible": True, "interval": 2}})
        time.sleep(3)
        results["panel visible (2 s)"] = measure(pid, counter, args.seconds)

        send(kc, "comm_msg", {"comm_id": comm_id, "data": {"type": "watch", "visible": True, "interval": 0.5}})
        time.sleep(3)
        results["panel visible (0.5 s)"] = measure(pid, counter, args.seconds)
    finally:
        counter.stop()
        try:
            execute(kc, "%cluster down", timeout=60)
        finally:
            kc.stop_channels()
            km.shutdown_kernel(now=True)

    base = results["no panel"]["cpu_percent"]
    print(f"\nkernel on an idle embedded cluster, {args.seconds:.0f} s per phase")
    print(f"{'phase':<24} {'CPU % of a core':>16} {'minus no panel':>15} {'bytes/s':>9} {'messages':>9}  kinds")
    for name, r in results.items():
        print(
            f"{name:<24} {r['cpu_percent']:>16.2f} {r['cpu_percent'] - base:>15.2f} {r['bytes_per_s']:>9.0f} "
            f"{r['messages']:>9.0f}  {r['kinds']}"
        )
    visible = results["panel visible (2 s)"]
    print(
        f"\nvisible (2 s): {visible['cpu_percent'] - base:.2f} % of a core over no panel (target <= 1 %), "
        f"{visible['bytes_per_s']:.0f} B/s (target <= 2048); hidden: {results['panel hidden']['bytes_per_s']:.0f} B/s"
    )


if __name__ == "__main__":
    main()
