"""Port forwards on the embedded cluster, and what driver cells start (listed, then stopped).

The SSH side of forwards (through the head's sshd, across a dropped connection) is in
``test_ssh.py``; Serve behind a forward on namespace hosts in ``test_launcher.py``.
"""

from __future__ import annotations

import http.client
import socket
import time
import urllib.error
import urllib.request
from typing import Any

import pytest
from IPython.core.error import UsageError

import jupyter_cluster as jc
from jupyter_cluster._forward import check_port, free_port

from .conftest import remote, run

pytestmark = pytest.mark.timeout(180)

#: A tiny HTTP server a driver cell starts on the cluster's loopback, answering its port.
SERVER = """
import http.server, threading
class Hello(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = f"hello from {self.server.server_address[1]}".encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        pass
httpd = http.server.ThreadingHTTPServer(("127.0.0.1", PORT), Hello)
threading.Thread(target=httpd.serve_forever, daemon=True).start()
"""


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as answer:
        return str(answer.read().decode())


#: Stops the server SERVER started (it would hold its port for the agent's lifetime).
STOP = "httpd.shutdown()\nhttpd.server_close()"


def _serve(cluster: jc.Cluster, port: int) -> None:
    cluster.run_cell(SERVER.replace("PORT", str(port)), mode="driver", out=[]).result(60)


def _stop(cluster: jc.Cluster) -> None:
    cluster.run_cell(STOP, mode="driver", out=[]).result(60)


def test_port_numbers_are_checked() -> None:
    assert check_port("8000") == 8000
    for bad in (0, 70000, -1, "http", None, 80.5):
        with pytest.raises(ValueError, match="must be a TCP port number, 1 to 65535"):
            check_port(bad)


def test_embedded_ports_are_reached_as_they_are_or_relayed_to_another(cluster: jc.Cluster) -> None:
    port = free_port()
    _serve(cluster, port)
    try:
        url = cluster.forward(port)
        assert url == f"http://127.0.0.1:{port}"  # the cluster runs here: no forward at all
        assert _get(url) == f"hello from {port}"
        assert cluster.forward(port) == url and len(cluster.forwards) == 1  # asked twice: the same
        other = free_port()
        relayed = cluster.forward(port, local=other)  # another local port: a relay
        assert relayed == f"http://127.0.0.1:{other}" and _get(relayed) == f"hello from {port}"
        lines = cluster.status().forwards
        assert any(f"127.0.0.1:{other} -> embedded cluster (this machine):{port}" in line for line in lines), lines
        assert "port forwards: 2" in str(cluster.status())
        assert cluster.close_forward(port) and not cluster.forwards and not cluster.close_forward(port)
        with pytest.raises(urllib.error.URLError):
            _get(relayed)  # closed: nothing listens there any more
    finally:
        cluster._close_forwards()
        _stop(cluster)


def test_a_local_port_in_use_is_refused_naming_a_free_one(cluster: jc.Cluster) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = taken.getsockname()[1]
        with pytest.raises(ValueError, match=rf"local port {busy} is already in use.*port (\d+) is free") as info:
            cluster.forward(free_port(), local=busy)
    free = int(info.value.args[0].split("port ")[2].split(" ")[0])
    assert free != busy and not cluster.forwards  # nothing half-open is left


def test_a_port_nothing_listens_on_fails_fast_and_says_why(cluster: jc.Cluster, caplog: Any) -> None:
    port, local = free_port(), free_port()
    try:
        url = cluster.forward(port, local=local)
        assert f"nothing listens on port {port}" in caplog.text  # said when opened
        started = time.monotonic()
        with pytest.raises((urllib.error.URLError, http.client.RemoteDisconnected, ConnectionError)):
            _get(url)
        assert time.monotonic() - started < 5, "a refused connection must not hang the client"
        (forward,) = cluster.forwards
        assert forward.last_error == f"nothing listens on port {port} of the embedded cluster (this machine) " + (
            "(connection refused)"
        )
        assert "last connection failed: nothing listens" in str(cluster.status())
        _serve(cluster, port)  # once something listens, the same forward reaches it
        assert _get(url) == f"hello from {port}" and forward.last_error is None
        _stop(cluster)
    finally:
        cluster._close_forwards()


def test_the_magic_prints_the_url_and_refuses_bad_ports(shell: Any, capsys: Any) -> None:
    port = free_port()
    try:
        assert run(shell, f"%cluster forward {port}").success
        out = capsys.readouterr()
        assert f"http://127.0.0.1:{port} -> port {port} of the embedded cluster" in out.out
        assert f"nothing listens on port {port}" in out.err
        assert run(shell, f"%cluster forward {port} --close").success
        assert f"Closed the forward of port {port}." in capsys.readouterr().out
        for line, message in (
            ("%cluster forward http", "must be a TCP port number"),
            ("%cluster forward 99999", "must be a TCP port number"),
            (f"%cluster forward {port} --local x", "the local port must be a TCP port number"),
        ):
            with pytest.raises(UsageError, match=message):
                shell.run_line_magic("cluster", line.split(" ", 1)[1])
        assert run(shell, "x = 1").success  # the notebook goes on
    finally:
        jc.current()._close_forwards()  # type: ignore[union-attr]


DRIVER_STARTS = """
from ray.util import placement_group
@ray.remote
class Counter:
    def __init__(self):
        self.n = 0
    def add(self):
        self.n += 1
        return self.n
named = Counter.options(name="jc-test-counter").remote()
detached = Counter.options(name="jc-test-detached", lifetime="detached", namespace="elsewhere").remote()
unnamed = Counter.remote()
group = placement_group([{"CPU": 0.01}])
ray.get([named.add.remote(), detached.add.remote(), unnamed.add.remote(), group.ready()])
"""


def test_what_driver_cells_start_is_listed_and_reset_driver_stops_it(shell: Any, cluster: jc.Cluster) -> None:
    assert remote(shell, "class Keep:\n    pass\nkeep = 1", "--actor keeper --out keep").success
    assert remote(shell, DRIVER_STARTS, "--driver --no-out").success
    started = cluster.status().data["started"]  # type: ignore[index]
    by_name = {a["name"]: a for a in started["actors"]}
    assert {"jc-test-counter", "jc-test-detached", ""} <= set(by_name), by_name
    assert by_name["jc-test-detached"]["detached"] and by_name["jc-test-detached"]["namespace"] == "elsewhere"
    assert all(a["class"] == "Counter" for a in started["actors"]), "the agent's own actors are not listed"
    assert [g["state"] for g in started["placement_groups"]] == ["CREATED"]
    text = str(cluster.status())
    assert "started by cells" in text and "jc-test-detached (Counter, detached, ALIVE)" in text

    stopped = cluster.reset_driver()
    assert sorted(stopped["actors"]) == ["jc-test-counter", "jc-test-detached"]
    assert stopped["placement_groups"] == 1 and stopped["unnamed"] == 1 and stopped["errors"] == []
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # the unnamed actor goes with its last handle
        left = cluster.status().data["started"]  # type: ignore[index]
        if not left["actors"] and not left["placement_groups"]:
            break
        time.sleep(0.5)
    assert left == {"actors": [], "serve": {}, "placement_groups": []}, left
    assert "started by cells" not in str(cluster.status())
    # The driver's namespace is fresh, and the --actor namespace is kept.
    assert not remote(shell, "named", "--driver").success
    assert remote(shell, "print(keep)", "--actor keeper").success
    cluster.kill_actor("keeper")


def test_reset_driver_is_refused_while_cells_run(cluster: jc.Cluster) -> None:
    cell = cluster.run_cell("import time\ntime.sleep(30)", mode="driver", label="sleeper")
    try:
        time.sleep(1)
        with pytest.raises(jc.RequestError, match=r"cells are still running \(sleeper\)"):
            cluster.reset_driver()
    finally:
        cell.cancel()
    with pytest.raises(jc.CellInterrupted):
        cell.result(30)
    assert cluster.run_cell("y = 2", mode="driver").result(30).outputs["y"] == 2


def test_shutting_the_agent_down_can_stop_what_the_cells_started(cluster: jc.Cluster) -> None:
    """What ``down()`` asks of an agent whose cluster outlives it (SSH): detached actors and
    placement groups the cells made are stopped before the agent goes. (The embedded
    cluster's own ``down`` stops Ray itself.)"""
    made = "a = Counter.options(name='jc-test-outlives', lifetime='detached').remote()\nray.get(a.add.remote())"
    cluster.run_cell(DRIVER_STARTS.split("named =")[0] + made, mode="driver", out=[]).result(60)
    answer = cluster._link.call("shutdown", {"stop_started": True}, timeout=120)
    assert answer["actors"] == ["jc-test-outlives"] and answer["errors"] == [], answer
    cluster.down(force=True)  # the agent is gone already: down settles the rest
    assert jc.current() is None
