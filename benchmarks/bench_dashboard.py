"""What a live dashboard costs: CPU of the kernel and the agent, bytes on the link, map throughput.

A real ``ipykernel`` starts the embedded cluster with ten more nodes simulated: ten
HTTP endpoints here serve a whole recorded scrape of a Ray 2.60 node
(``tests/data/ray_metrics_full.txt.gz``, ~350 KB) whose CPU, memory and object-store
values change every ``--change-every`` seconds (5 by default, as Ray refreshes node
stats; 1 is the worst case, new values at every scrape). The agent scrapes all eleven
nodes at 1 Hz while a dashboard is open. Side by side in one run:

- CPU of the kernel process and of the agent process (``psutil``), as a share of one core,
  over ``--seconds`` with no dashboard, then with one shown; the difference is its cost;
- bytes the kernel received from the agent per second, with and without;
- a ``%%remote --map`` of 2,000 tiny items, timed with the dashboard off and on, interleaved
  (six of each per round). Single maps vary from 0.12 to 2 s on this 2-core machine
  whichever way (a stall of about a second now and then, with or without a dashboard), so
  both the median and the mean of the faster half (the steady state) are given.

Run: ``python benchmarks/bench_dashboard.py [--seconds 20] [--nodes 10] [--rounds 3] [--change-every 5]``.
Targets: kernel <= 2 % of a core, agent <= 3 %, <= 20 KB/s, map throughput >= 0.95x.
"""

from __future__ import annotations

import argparse
import gzip
import http.server
import json
import random
import re
import statistics
import threading
import time
from pathlib import Path
from typing import Any, ClassVar

DATA = Path(__file__).resolve().parent.parent / "tests" / "data"
#: One idle node's whole scrape, as Ray 2.60 served it (~350 KB, 112 families).
FULL = gzip.decompress((DATA / "ray_metrics_full.txt.gz").read_bytes()).decode()
CHANGE_EVERY = 5.0


def _varied(text: str, seed: int) -> bytes:
    rng = random.Random(seed)
    text = re.sub(r"^(ray_node_cpu_utilization\{[^}]*\}) \S+", rf"\1 {rng.uniform(5, 95):.1f}", text, flags=re.M)
    text = re.sub(r"^(ray_node_mem_used\{[^}]*\}) \S+", rf"\1 {rng.uniform(1e9, 8e9):.0f}", text, flags=re.M)
    text = re.sub(
        r'^(ray_object_store_memory\{[^}]*Location="MMAP_SHM"[^}]*\}) \S+',
        rf"\1 {rng.uniform(0, 4e9):.0f}",
        text,
        flags=re.M,
    )
    return text.encode()


class _Node(http.server.BaseHTTPRequestHandler):
    """A node whose load changes every ``CHANGE_EVERY`` s (Ray refreshes node stats every 5 s)."""

    index = 0
    cache: ClassVar[dict[int, bytes]] = {}

    def do_GET(self) -> None:
        epoch = int(time.time() / CHANGE_EVERY + self.index / 10)  # the nodes change at different moments
        body = self.cache.get(epoch)
        if body is None:
            self.cache.clear()
            body = self.cache[epoch] = _varied(FULL, epoch * 100 + self.index)
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


def _nodes_process(count: int, change_every: float) -> tuple[Any, list[int]]:
    """The simulated nodes, served by a process of their own at the lowest priority: on a
    real cluster they are other machines, and their serving should not weigh here."""
    import multiprocessing

    context = multiprocessing.get_context("fork")
    parent, child = context.Pipe()
    process = context.Process(target=_serve_forever, args=(count, change_every, child), daemon=True)
    process.start()
    return process, parent.recv()


def _serve_forever(count: int, change_every: float, pipe: Any) -> None:
    import os

    global CHANGE_EVERY
    CHANGE_EVERY = change_every
    os.nice(19)
    servers = _serve_nodes(count)
    pipe.send([s.server_address[1] for s in servers])
    threading.Event().wait()


def _serve_nodes(count: int) -> list[http.server.ThreadingHTTPServer]:
    servers = []
    for index in range(count):
        handler = type(f"Node{index}", (_Node,), {"index": index, "cache": {}})
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
    return servers


class Kernel:
    def __init__(self, env: dict[str, str]) -> None:
        import os

        from jupyter_client.manager import KernelManager

        self.km = KernelManager(kernel_name="python3")
        self.km.start_kernel(env={**os.environ, **env})
        self.kc = self.km.blocking_client()
        self.kc.start_channels()
        self.kc.wait_for_ready(timeout=60)
        self._drain = threading.Thread(target=self._drain_iopub, daemon=True)  # what a browser would read
        self._stop = False
        self._drain.start()

    def _drain_iopub(self) -> None:
        while not self._stop:
            try:
                self.kc.get_iopub_msg(timeout=0.2)
            except Exception:
                pass

    def run(self, code: str, timeout: float = 300) -> Any:
        msg_id = self.kc.execute(code, user_expressions={"out": "_bench_out"})
        while True:
            reply = self.kc.get_shell_msg(timeout=timeout)
            if reply["parent_header"].get("msg_id") == msg_id:
                break
        content = reply["content"]
        if content["status"] != "ok":
            raise RuntimeError(f"{code!r}: {content.get('ename')}: {content.get('evalue')}")
        out = content["user_expressions"]["out"]
        return eval(out["data"]["text/plain"]) if out.get("status") == "ok" else None

    def stop(self) -> None:
        self._stop = True
        try:
            self.run("%cluster down", timeout=60)
        finally:
            self.kc.stop_channels()
            self.km.shutdown_kernel(now=True)


def _cpu(process: Any) -> float:
    times = process.cpu_times()
    return float(times.user + times.system)


def measure(kernel: Kernel, kernel_proc: Any, agent_proc: Any, seconds: float) -> dict[str, float]:
    """Share of one core used by the kernel and the agent, and link bytes per second, over ``seconds``."""
    start_bytes = kernel.run("_bench_out = jc.current()._link.bytes_received")
    k0, a0, t0 = _cpu(kernel_proc), _cpu(agent_proc), time.monotonic()
    time.sleep(seconds)
    k1, a1, t1 = _cpu(kernel_proc), _cpu(agent_proc), time.monotonic()
    end_bytes = kernel.run("_bench_out = jc.current()._link.bytes_received")
    wall = t1 - t0
    return {
        "kernel": 100 * (k1 - k0) / wall,
        "agent": 100 * (a1 - a0) / wall,
        "bytes": (end_bytes - start_bytes) / wall,
    }


MAP = "%%remote --map i in range(2000)\ny = i"


def time_map(kernel: Kernel) -> float:
    start = time.perf_counter()
    kernel.run(MAP)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=20.0, help="seconds of each CPU measurement")
    parser.add_argument("--nodes", type=int, default=10, help="simulated nodes besides the real one")
    parser.add_argument("--rounds", type=int, default=8, help="rounds of six maps with and six without")
    parser.add_argument("--change-every", type=float, default=5.0, help="seconds between a node's new values")
    args = parser.parse_args()
    global CHANGE_EVERY
    CHANGE_EVERY = args.change_every

    import psutil

    nodes_process, ports = _nodes_process(args.nodes, args.change_every)
    extra = [{"id": f"sim-{i}", "address": "127.0.0.1", "port": port} for i, port in enumerate(ports)]
    kernel = Kernel({"JUPYTER_CLUSTER_METRICS_NODES": json.dumps(extra)})
    try:
        kernel.run("%load_ext jupyter_cluster\n%cluster local --cpus 2\nimport jupyter_cluster as jc, os")
        kernel_proc = psutil.Process(kernel.run("_bench_out = os.getpid()"))
        agent_proc = psutil.Process(kernel.run("_bench_out = jc.current()._agent.process.pid"))
        for _ in range(2):  # warm-up: workers started, code loaded
            time_map(kernel)
        time.sleep(3)
        off = measure(kernel, kernel_proc, agent_proc, args.seconds)
        kernel.run("dash = jc.dashboard()\ndisplay(dash)")
        time.sleep(3)
        nodes = kernel.run("_bench_out = len(dash.feed.nodes)")
        on = measure(kernel, kernel_proc, agent_proc, args.seconds)
        deltas = kernel.run("_bench_out = dash.feed.deltas")

        maps: dict[str, list[float]] = {"off": [], "on": []}
        for _ in range(args.rounds):  # interleaved: on, off, on, off...
            for _ in range(6):
                maps["on"].append(time_map(kernel))
            kernel.run("dash.close()")
            time.sleep(3)
            for _ in range(6):
                maps["off"].append(time_map(kernel))
            kernel.run("dash = jc.dashboard()\ndisplay(dash)")
            time.sleep(3)  # its first, whole picture drawn
        kernel.run("dash.close()")
    finally:
        kernel.stop()
        nodes_process.terminate()

    print(
        f"dashboard over {nodes} nodes ({args.nodes} simulated from a whole recorded scrape, new values every "
        f"{args.change_every:g} s), {deltas} deltas"
    )
    print(f"{'':34s} {'off':>8s} {'on':>8s} {'cost':>8s}  target")
    for key, label, target in (
        ("kernel", "kernel CPU (% of a core)", "<= 2"),
        ("agent", "agent CPU (% of a core)", "<= 3"),
    ):
        print(f"{label:34s} {off[key]:8.2f} {on[key]:8.2f} {on[key] - off[key]:8.2f}  {target}")
    kb_off, kb_on = off["bytes"] / 1000, on["bytes"] / 1000
    print(f"{'link, kernel <- agent (KB/s)':34s} {kb_off:8.2f} {kb_on:8.2f} {kb_on - kb_off:8.2f}  <= 20")
    m_off, m_on = statistics.median(maps["off"]), statistics.median(maps["on"])
    f_off, f_on = (statistics.mean(sorted(maps[k])[: len(maps[k]) // 2]) for k in ("off", "on"))
    for key in ("off", "on"):
        q1, _, q3 = statistics.quantiles(maps[key], n=4)
        print(
            f"  map times, dashboard {key}: median {statistics.median(maps[key]):.3f} s, quartiles {q1:.3f}-{q3:.3f} s"
        )
    print(
        f"{'--map of 2,000 tiny items, median (s)':34s} {m_off:8.3f} {m_on:8.3f}  throughput on/off {m_off / m_on:.3f}"
        "  >= 0.95"
    )
    print(
        f"{'  the faster half, mean (s)':34s} {f_off:8.3f} {f_on:8.3f}  throughput on/off {f_off / f_on:.3f}  >= 0.95"
    )


if __name__ == "__main__":
    main()
