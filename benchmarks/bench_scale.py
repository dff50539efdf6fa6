"""Scaling curves through real kernels on the embedded cluster, side by side with raw Ray where Ray has an equivalent.

- ``map``: ``%%remote --map i in range(N)`` with ``sq = i * i``, N = 1e3 ... 1e6, against raw Ray's one task per
  item (``ray.get([f.remote(i) for i in range(N)])``) in the same kernel; time, and the agent's peak RSS while
  the cell runs (sampled every 50 ms from /proc).
- ``cells``: trivial task cells one after another in one session, 1 ... 10,000: the agent's and the kernel's RSS
  along the way, and the cells' median latency per decade.
- ``notebooks``: 1 ... 10 kernels attached to one agent (each a session of its own, as notebooks over SSH are),
  each running trivial cells in a loop at the same time: the latency of a cell, and the agent's RSS; and the
  latency of one notebook's cells while the others are attached and idle.
- ``values``: one value of 1 MB ... 2 GB (a numpy array) sent to a cell and the cell's copy fetched back
  (``%%remote`` then ``jc.get``), against ``ray.put`` / a task / ``ray.get`` in the same kernel.
- ``dashboard``: a live dashboard over 1 ... 1,000 nodes (the embedded cluster's one, the others simulated:
  127.0.0.2 and up, each serving a recorded Ray node's metrics, see ``tests/prometheus.py``), its figures
  scraped by the agent from each node, then read from a real Prometheus server (Debian's ``prometheus``,
  scraping every 5 s the embedded node, a static target since Ray writes its service discovery file from its
  dashboard, which the embedded cluster does not run, and the simulated nodes): the CPU of
  the agent and of the kernel as a share of one core, and the bytes a second on the link, over at least
  three of the agent's rounds. Each count starts a kernel and a cluster of its own.

Prints a table per section and ratios, writes ``benchmarks/scale.json``, and draws ``benchmarks/scale.png``
(``--plot-only`` redraws it from the JSON).

Run: ``python benchmarks/bench_scale.py [--only map,cells,notebooks,values,dashboard] [--max-map 1000000]
[--max-nodes 1000]``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import threading
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).parent
RESULTS = HERE / "scale.json"
PLOT = HERE / "scale.png"

RAW = """
import os
os.environ.setdefault("RAY_AUTH_MODE", "token")  # the embedded cluster keeps Ray's token authentication on
import ray, numpy as np
ray.init(address=_jc_address, log_to_driver=False, namespace="bench-scale")

@ray.remote
def square(i):
    return i * i

@ray.remote
def copy(x):
    return x.copy()

ray.get(square.remote(1))
"""


class Kernel:
    """A real ``python3`` kernel: ``run(code)`` returns the seconds from request to reply, and its stdout."""

    def __init__(self) -> None:
        from jupyter_client.manager import start_new_kernel

        self.manager, self.client = start_new_kernel(kernel_name="python3")
        self.pid = int(self.run("import os\nprint(os.getpid())")[1])

    def run(self, code: str, timeout: float = 3600.0) -> tuple[float, str]:
        start = time.perf_counter()
        msg_id = self.client.execute(code, store_history=False)
        out: list[str] = []
        while True:
            msg = self.client.get_iopub_msg(timeout=timeout)
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            if msg["msg_type"] == "stream" and msg["content"]["name"] == "stdout":
                out.append(msg["content"]["text"])
            if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
                break
        elapsed = time.perf_counter() - start
        reply = self.client.get_shell_msg(timeout=timeout)
        while reply["parent_header"].get("msg_id") != msg_id:
            reply = self.client.get_shell_msg(timeout=timeout)
        if reply["content"]["status"] != "ok":
            content = reply["content"]
            raise RuntimeError(f"{code[:80]!r} failed: {content.get('ename')}: {content.get('evalue')}")
        return elapsed, "".join(out).strip()

    def stop(self) -> None:
        self.client.stop_channels()
        self.manager.shutdown_kernel(now=True)


def rss(pid: int) -> int:
    """Resident bytes of process ``pid`` (0 once it is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


class PeakRSS:
    """The peak RSS of ``pid`` while the ``with`` block runs, sampled every 50 ms on a thread."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.peak = 0
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._done.wait(0.05):
            self.peak = max(self.peak, rss(self.pid))

    def __enter__(self) -> PeakRSS:
        self.peak = rss(self.pid)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join()
        self.peak = max(self.peak, rss(self.pid))


def mb(n: float) -> str:
    return f"{n / 2**20:,.0f} MB"


def start(cpus: int, options: str = "") -> tuple[Kernel, int, str, str]:
    """A kernel on a fresh embedded cluster (``%cluster local --cpus CPUS OPTIONS``), with a raw Ray driver of its
    own on the same cluster."""
    kernel = Kernel()
    kernel.run(f"%load_ext jupyter_cluster\n%cluster local --cpus {cpus} {options}", timeout=300)
    _, where = kernel.run(
        "import jupyter_cluster as jc\nagent = jc.current()._agent\n"
        "print(agent.process.pid, agent.socket, agent.secret)"
    )
    agent_pid, socket, secret = where.split()
    kernel.run("%%remote --driver --out _jc_address\n_jc_address = ray.get_runtime_context().gcs_address")
    kernel.run(RAW, timeout=300)
    return kernel, int(agent_pid), socket, secret


def attach(socket: str, secret: str, name: str) -> Kernel:
    """Another notebook on the same agent: a session of its own on the agent's socket."""
    kernel = Kernel()
    kernel.run(
        "%load_ext jupyter_cluster\nfrom jupyter_cluster import _cluster\n"
        "from jupyter_cluster._link import AgentLink, UnixTransport\n"
        f"link = AgentLink(UnixTransport({socket!r}), {secret!r}, {name!r})\nlink.connect()\n"
        "_cluster.attach(_cluster.Cluster(link, kind='embedded local'))",
        timeout=120,
    )
    return kernel


# --------------------------------------------------------------------------- map


def bench_map(kernel: Kernel, agent: int, sizes: list[int], max_raw: int) -> list[dict[str, Any]]:
    rows = []
    print(f"\n{'--map items':>12s} {'ours':>9s} {'raw Ray':>9s} {'speed-up':>9s} {'agent peak RSS':>15s}", end="")
    print("  target: speed-up >= 1.5, agent peak <= 1 GB")
    for n in sizes:
        with PeakRSS(agent) as peak:
            ours, _ = kernel.run(f"%%remote --map i in range({n})\nsq = i * i")
        _, check = kernel.run(f"print(len(sq) == {n} and sq[-1] == {n - 1} ** 2)")
        assert check == "True", check
        raw = None
        if n <= max_raw:
            raw, _ = kernel.run(f"sq_raw = ray.get([square.remote(i) for i in range({n})])")
            kernel.run("del sq_raw")
        kernel.run("del sq")
        ratio = f"{raw / ours:9.2f}" if raw else f"{'-':>9s}"
        print(f"{n:12,d} {ours:8.2f}s {raw or 0:8.2f}s {ratio} {mb(peak.peak):>15s}")
        rows.append({"items": n, "ours_s": ours, "raw_s": raw, "agent_peak_rss": peak.peak})
    return rows


# ------------------------------------------------------------------------- cells


def bench_cells(kernel: Kernel, agent: int, total: int) -> list[dict[str, Any]]:
    rows = []
    marks = [m for m in (1, 10, 100, 1_000, 10_000, 100_000) if m <= total]
    done = 0
    latencies: list[float] = []
    print(f"\n{'cells':>8s} {'agent RSS':>11s} {'kernel RSS':>11s} {'median latency':>15s}")
    for mark in marks:
        while done < mark:
            latencies.append(kernel.run("%%remote\nz = 1")[0])
            done += 1
        recent = statistics.median(latencies[-max(1, mark // 10) :])
        row = {"cells": done, "agent_rss": rss(agent), "kernel_rss": rss(kernel.pid), "latency_s": recent}
        print(f"{done:8,d} {mb(row['agent_rss']):>11s} {mb(row['kernel_rss']):>11s} {recent * 1e3:13.1f}ms")
        rows.append(row)
    return rows


# --------------------------------------------------------------------- notebooks


def _loop(kernel: Kernel, seconds: float, out: list[float]) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        out.append(kernel.run("%%remote\nz = 1")[0])


def bench_notebooks(
    first: Kernel, agent: int, socket: str, secret: str, counts: list[int], seconds: float
) -> list[dict[str, Any]]:
    rows = []
    others: list[Kernel] = []
    print(f"\n{'notebooks':>10s} {'idle others':>12s} {'all busy':>10s} {'cells/s':>8s} {'agent RSS':>10s}", end="")
    print("  target: a trivial cell <= 2x its latency alone")
    try:
        for count in counts:
            while len(others) < count - 1:
                others.append(attach(socket, secret, f"bench-{len(others)}"))
                others[-1].run("%%remote\nz = 1")
            idle = statistics.median(first.run("%%remote\nz = 1")[0] for _ in range(50))
            results: list[list[float]] = [[] for _ in range(count)]
            threads = [
                threading.Thread(target=_loop, args=(k, seconds, results[i])) for i, k in enumerate([first, *others])
            ]
            for t in threads:
                t.start()
            with PeakRSS(agent) as peak:
                for t in threads:
                    t.join()
            busy = statistics.median(x for r in results for x in r)
            rate = sum(len(r) for r in results) / seconds
            row = {
                "notebooks": count,
                "idle_others_s": idle,
                "all_busy_s": busy,
                "cells_per_s": rate,
                "agent_peak_rss": peak.peak,
            }
            print(f"{count:10d} {idle * 1e3:10.1f}ms {busy * 1e3:8.1f}ms {rate:8.0f} {mb(peak.peak):>10s}")
            rows.append(row)
    finally:
        for k in others:
            k.stop()
    return rows


# ------------------------------------------------------------------------ values


def bench_values(kernel: Kernel, agent: int, sizes: list[int]) -> list[dict[str, Any]]:
    rows = []
    print(f"\n{'value':>8s} {'ours there':>11s} {'back':>8s} {'raw there':>10s} {'back':>8s}", end="")
    print(f" {'ratio':>6s} {'agent peak':>11s}")
    for size in sizes:
        kernel.run(f"import numpy as np\nx = np.ones({size // 8}, dtype=np.float64)")
        with PeakRSS(agent) as peak:
            there, _ = kernel.run("%%remote\ny = x.copy()")
            back, _ = kernel.run("z = jc.get(y)\nassert z.nbytes == x.nbytes\ndel z, y")
        raw_there, _ = kernel.run("ref = copy.remote(ray.put(x))\nray.wait([ref], fetch_local=False)")
        raw_back, _ = kernel.run("z = ray.get(ref)\nassert z.nbytes == x.nbytes\ndel z, ref")
        kernel.run("del x")
        ours, raw = there + back, raw_there + raw_back
        print(
            f"{mb(size):>8s} {there:10.2f}s {back:7.2f}s {raw_there:9.2f}s {raw_back:7.2f}s {ours / raw:6.2f} "
            f"{mb(peak.peak):>11s}"
        )
        rows.append(
            {
                "bytes": size,
                "ours_there_s": there,
                "ours_back_s": back,
                "raw_there_s": raw_there,
                "raw_back_s": raw_back,
                "agent_peak_rss": peak.peak,
            }
        )
    return rows


# --------------------------------------------------------------------- dashboard


def _cpu_seconds(pid: int) -> float:
    """User and system CPU seconds of ``pid`` so far (from /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _dashboard_cost(kernel: Kernel, agent: int, least: float) -> dict[str, float]:
    """CPU shares and link bytes a second while the dashboard ``dash`` is open, over at least three rounds."""
    _, every = kernel.run("import time\ntime.sleep(3)\nprint(dash.feed.source.get('every', 1.0))")
    seconds = max(least, min(200.0, 3 * float(every)))
    _, before = kernel.run("print(jc.current()._link.bytes_received, dash.feed.deltas)")
    k0, a0, t0 = _cpu_seconds(kernel.pid), _cpu_seconds(agent), time.monotonic()
    time.sleep(seconds)
    k1, a1, t1 = _cpu_seconds(kernel.pid), _cpu_seconds(agent), time.monotonic()
    _, after = kernel.run("print(jc.current()._link.bytes_received, dash.feed.deltas)")
    wall = t1 - t0
    (before, rounds0), (after, rounds1) = before.split(), after.split()
    return {
        # The rounds that reached the dashboard while measured (its events), not the pace announced.
        "every_s": wall / max(1, int(rounds1) - int(rounds0)),
        "announced_every_s": float(every),
        "seconds": wall,
        "agent_cpu": 100 * (a1 - a0) / wall,
        "kernel_cpu": 100 * (k1 - k0) / wall,
        "link_bytes_per_s": (int(after) - int(before)) / wall,
    }


def bench_dashboard(counts: list[int], cpus: int, seconds: float) -> list[dict[str, Any]]:
    import sys
    import tempfile

    sys.path.insert(0, str(HERE.parent))
    from tests.prometheus import PrometheusServer, SimulatedNodes

    rows = []
    print(f"\n{'nodes':>6s} {'source':>11s} {'every':>7s} {'agent CPU':>10s} {'kernel CPU':>11s} {'link':>10s}", end="")
    print("  target (Prometheus, 1,000 nodes): agent <= 3 %, kernel <= 2 %, link <= 20 KB/s")
    for count in counts:
        simulated = SimulatedNodes(count - 1, "pending")
        os.environ["JUPYTER_CLUSTER_METRICS_NODES"] = simulated.endpoints_env()
        kernel, agent, _, _ = start(cpus)
        server = None
        try:
            _, where = kernel.run(
                "%%remote --driver --out _where\nnode = ray._private.worker.global_worker.node\n"
                "n = ray.nodes()[0]\n"
                "_where = f\"{node.session_name} {n['NodeManagerAddress']}:{n['MetricsExportPort']}\"\n"
                "print(_where)"
            )
            session, head = where.split()[-2:]
            simulated.rename(session)
            kernel.run("jc.current().metrics_source(False)\ndash = jc.dashboard()")
            cost = _dashboard_cost(kernel, agent, seconds)
            rows.append({"nodes": count, "source": "scrape", **cost})
            print(_dashboard_row(rows[-1]))
            folder = Path(tempfile.mkdtemp(prefix="bench-prometheus-"))
            server = PrometheusServer(folder, None, [head, *simulated.targets], interval="5s")
            server.wait_for(f'count(ray_node_cpu_utilization{{SessionName="{session}"}})', count, timeout=120)
            kernel.run(f"jc.current().metrics_source({server.url!r})")
            cost = _dashboard_cost(kernel, agent, seconds)
            rows.append({"nodes": count, "source": "prometheus", **cost})
            print(_dashboard_row(rows[-1]))
            kernel.run("dash.close()\nray.shutdown()\n%cluster down", timeout=120)
        finally:
            kernel.stop()
            if server is not None:
                server.stop()
            simulated.close()
            os.environ.pop("JUPYTER_CLUSTER_METRICS_NODES", None)
    return rows


def _dashboard_row(row: dict[str, Any]) -> str:
    return (
        f"{row['nodes']:6,d} {row['source']:>11s} {row['every_s']:6.1f}s {row['agent_cpu']:9.2f}% "
        f"{row['kernel_cpu']:10.2f}% {row['link_bytes_per_s'] / 1024:7.1f}KB/s"
    )


# -------------------------------------------------------------------------- plot


def plot(results: dict[str, Any]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(3, 2, figsize=(11, 12))
    if results.get("map"):
        ax = axes[0][0]
        rows = results["map"]
        ax.loglog([r["items"] for r in rows], [r["ours_s"] for r in rows], "o-", label="%%remote --map")
        raw = [r for r in rows if r["raw_s"]]
        ax.loglog([r["items"] for r in raw], [r["raw_s"] for r in raw], "s--", label="raw Ray, a task per item")
        ax.set(title="--map: time", xlabel="items", ylabel="seconds")
        ax.legend()
        twin = ax.twinx()
        twin.semilogx([r["items"] for r in rows], [r["agent_peak_rss"] / 2**20 for r in rows], "^:", color="gray")
        twin.set_ylabel("agent peak RSS (MB, dotted)")
    if results.get("cells"):
        ax = axes[0][1]
        rows = results["cells"]
        ax.semilogx([r["cells"] for r in rows], [r["agent_rss"] / 2**20 for r in rows], "o-", label="agent")
        ax.semilogx([r["cells"] for r in rows], [r["kernel_rss"] / 2**20 for r in rows], "s-", label="kernel")
        ax.set(title="cells in one session: memory", xlabel="cells", ylabel="RSS (MB)", ylim=(0, None))
        ax.legend()
    if results.get("notebooks"):
        ax = axes[1][0]
        rows = results["notebooks"]
        n = [r["notebooks"] for r in rows]
        ax.plot(n, [r["idle_others_s"] * 1e3 for r in rows], "o-", label="one notebook, the others idle")
        ax.plot(n, [r["all_busy_s"] * 1e3 for r in rows], "s-", label="all running cells at once")
        ax.set(title="notebooks on one cluster: a trivial cell", xlabel="notebooks", ylabel="latency (ms)")
        ax.legend()
    if results.get("values"):
        ax = axes[1][1]
        rows = results["values"]
        size = [r["bytes"] / 2**20 for r in rows]
        ax.loglog(size, [r["ours_there_s"] + r["ours_back_s"] for r in rows], "o-", label="%%remote, then jc.get")
        ax.loglog(size, [r["raw_there_s"] + r["raw_back_s"] for r in rows], "s--", label="ray.put, task, ray.get")
        ax.set(title="one value there and back", xlabel="MB", ylabel="seconds")
        ax.legend()
    if results.get("dashboard"):
        rows = results["dashboard"]
        for ax, key, title in (
            (axes[2][0], "agent_cpu", "dashboard: the agent's CPU (% of a core)"),
            (axes[2][1], "link_bytes_per_s", "dashboard: bytes a second on the link"),
        ):
            for source, style in (("scrape", "o-"), ("prometheus", "s--")):
                picked = [r for r in rows if r["source"] == source]
                label = "each node scraped by the agent" if source == "scrape" else "through Prometheus"
                ax.semilogx([r["nodes"] for r in picked], [r[key] for r in picked], style, label=label)
            ax.set(title=title, xlabel="nodes", ylim=(0, None))
            ax.legend()
    for ax in axes.flat:
        ax.grid(True, which="both", alpha=0.3)
    fig.suptitle("jupyter_cluster at scale: embedded cluster, 2 CPUs (benchmarks/bench_scale.py)")
    fig.tight_layout()
    fig.savefig(PLOT, dpi=90)
    print(f"\nplot: {PLOT}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", default="map,cells,notebooks,values,dashboard")
    parser.add_argument("--cpus", type=int, default=2)
    parser.add_argument("--max-map", type=int, default=1_000_000)
    parser.add_argument("--max-raw", type=int, default=1_000_000, help="the largest map raw Ray runs too")
    parser.add_argument("--cells", type=int, default=10_000)
    parser.add_argument("--notebooks", type=int, default=10)
    parser.add_argument("--seconds", type=float, default=10.0, help="how long each notebook count runs cells")
    parser.add_argument("--max-value", type=int, default=2 * 2**30)
    parser.add_argument("--max-nodes", type=int, default=1000, help="the most nodes a dashboard watches")
    parser.add_argument("--node-counts", default="1,10,100,1000", help="the node counts a dashboard watches")
    parser.add_argument("--dashboard-seconds", type=float, default=30.0, help="the shortest dashboard measurement")
    parser.add_argument("--plot-only", action="store_true")
    args = parser.parse_args()
    results: dict[str, Any] = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    if not args.plot_only:
        only = set(args.only.split(","))
        if "dashboard" in only:
            counts = [int(c) for c in args.node_counts.split(",") if int(c) <= args.max_nodes]
            rows = bench_dashboard(counts, args.cpus, args.dashboard_seconds)
            kept = [r for r in results.get("dashboard", []) if r["nodes"] not in counts]  # counts not run now
            results["dashboard"] = sorted(kept + rows, key=lambda r: (r["nodes"], r["source"] != "scrape"))
            only.discard("dashboard")
        if only:
            kernel, agent, socket, secret = start(args.cpus)
            try:
                if "map" in only:
                    sizes = [n for n in (1_000, 10_000, 100_000, 1_000_000) if n <= args.max_map]
                    results["map"] = bench_map(kernel, agent, sizes, args.max_raw)
                if "cells" in only:
                    results["cells"] = bench_cells(kernel, agent, args.cells)
                if "notebooks" in only:
                    counts = [c for c in (1, 2, 5, 10) if c <= args.notebooks]
                    results["notebooks"] = bench_notebooks(kernel, agent, socket, secret, counts, args.seconds)
                if "values" in only:
                    sizes = [s for s in (2**20, 16 * 2**20, 256 * 2**20, 2**30, 2 * 2**30) if s <= args.max_value]
                    results["values"] = bench_values(kernel, agent, sizes)
                kernel.run("ray.shutdown()\n%cluster down", timeout=120)
            finally:
                kernel.stop()
        results["machine"] = f"{os.cpu_count()} cores, embedded cluster with {args.cpus} CPUs"
        RESULTS.write_text(json.dumps(results, indent=1))
    plot(results)


if __name__ == "__main__":
    main()
