"""A real Prometheus server (Debian's ``prometheus``) and simulated Ray nodes for it to scrape.

:class:`SimulatedNodes` is one HTTP server on ``0.0.0.0``: each of ``127.0.0.2``,
``127.0.0.3``, ... (all of 127/8 is this machine's loopback) is a node of its own to a
scraper, serving a recorded Ray 2.60 node's drawn metrics with this session's
``SessionName``, its CPU set to a figure of its own (:meth:`SimulatedNodes.cpu`). A node can
be made to fail (HTTP 500). :class:`PrometheusServer` runs ``prometheus`` on a free loopback
port with Ray's file service discovery (``prom_metrics_service_discovery.json`` of the
session, as Ray documents) and a second file listing the simulated nodes, scraping every
second.
"""

from __future__ import annotations

import http.server
import json
import re
import shutil
import socket
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from jupyter_cluster.agent.watching._metrics import keep_drawn

DATA = Path(__file__).resolve().parent / "data"
PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def address(index: int) -> str:
    """The loopback address of simulated node ``index`` (0 -> 127.0.0.2)."""
    n = index + 2
    return f"127.0.{n // 256}.{n % 256}"


class SimulatedNodes:
    """``count`` Ray nodes on 127.0.0.2 and up, all served by one HTTP server."""

    def __init__(self, count: int, session: str, text: str | None = None) -> None:
        recorded = text if text is not None else (DATA / "ray_metrics_idle.txt").read_text()
        self.text = keep_drawn(recorded)
        self._bodies: dict[str, bytes] = {}
        self.rename(session)
        self.count = count
        self.failing: set[str] = set()
        self.hits = 0
        nodes = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                host = self.connection.getsockname()[0]
                nodes.hits += 1
                if host in nodes.failing:
                    self.send_response(500)
                    self.end_headers()
                    return
                body = nodes.body(host)
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("0.0.0.0", 0), Handler)
        self.server.daemon_threads = True
        self.port = int(self.server.server_address[1])
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def rename(self, session: str) -> None:
        """Serve ``session``'s name from now on (Ray's ``SessionName`` label)."""
        self.text = re.sub(r'SessionName="[^"]*"', f'SessionName="{session}"', self.text)
        self._bodies = {}

    @staticmethod
    def cpu(host: str) -> float:
        """The CPU % node ``host`` reports: its address's last two numbers (127.0.0.7 -> 7.0)."""
        _, _, high, low = host.split(".")
        return float((int(high) * 256 + int(low)) % 100)

    def body(self, host: str) -> bytes:
        body = self._bodies.get(host)
        if body is None:
            text = re.sub(
                r"^(ray_node_cpu_utilization\{[^}]*\}) \S+", rf"\g<1> {self.cpu(host)}", self.text, flags=re.M
            )
            body = self._bodies[host] = text.encode()
        return body

    @property
    def hosts(self) -> list[str]:
        return [address(i) for i in range(self.count)]

    @property
    def targets(self) -> list[str]:
        return [f"{host}:{self.port}" for host in self.hosts]

    def endpoints_env(self) -> str:
        """The agent's ``JUPYTER_CLUSTER_METRICS_NODES`` for these nodes (scraped by the agent itself)."""
        return json.dumps([{"id": host, "address": host, "port": self.port} for host in self.hosts])

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class PrometheusServer:
    """``prometheus`` scraping Ray's discovered nodes and ``targets``, every ``interval`` s."""

    def __init__(self, folder: Path, discovery: str | None, targets: list[str], interval: str = "1s") -> None:
        self.folder = folder
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        folder.mkdir(parents=True, exist_ok=True)
        simulated = folder / "simulated.json"
        simulated.write_text(json.dumps([{"targets": targets, "labels": {}}]))
        jobs = [{"job_name": "simulated", "file_sd_configs": [{"files": [str(simulated)], "refresh_interval": "1s"}]}]
        if discovery:
            jobs.insert(0, {"job_name": "ray", "file_sd_configs": [{"files": [discovery], "refresh_interval": "1s"}]})
        config = {"global": {"scrape_interval": interval, "evaluation_interval": interval}, "scrape_configs": jobs}
        self.config = folder / "prometheus.yml"
        self.config.write_text(json.dumps(config))  # JSON is YAML
        self.process: subprocess.Popen[bytes] | None = None
        self.start()

    def start(self) -> None:
        log = (self.folder / "prometheus.log").open("ab")
        self.process = subprocess.Popen(
            [
                PROMETHEUS,
                f"--config.file={self.config}",
                f"--storage.tsdb.path={self.folder / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--storage.tsdb.retention.time=1h",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as answer:
                    if answer.status == 200:
                        return
            except OSError:
                pass
            if self.process.poll() is not None:
                break
            time.sleep(0.3)
        raise RuntimeError(f"prometheus did not start: {(self.folder / 'prometheus.log').read_text()[-2000:]}")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None

    def query(self, expr: str) -> list[dict[str, Any]]:
        url = f"{self.url}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
        with urllib.request.urlopen(url, timeout=5) as answer:
            return list(json.loads(answer.read())["data"]["result"])

    def wait_for(self, expr: str, value: float, timeout: float = 60.0) -> None:
        """Until ``expr``'s (single) value is ``value``."""
        deadline = time.monotonic() + timeout
        seen: Any = None
        while time.monotonic() < deadline:
            result = self.query(expr)
            seen = float(result[0]["value"][1]) if result else None
            if seen == value:
                return
            time.sleep(0.5)
        raise AssertionError(f"{expr} stayed {seen}, not {value}, for {timeout} s")


__all__ = ["PROMETHEUS", "PrometheusServer", "SimulatedNodes", "address", "free_port"]
