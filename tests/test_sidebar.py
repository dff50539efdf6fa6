"""The sidebar's kernel side, through a real kernel on a real embedded cluster.

A client plays the JupyterLab panel: it opens the ``jupyter_cluster`` comm on the kernel
(or takes the one ``%load_ext`` opens), reads what the kernel pushes, and sends the
panel's commands. The agent also scrapes a simulated node with two GPUs (the metrics
text Ray's reporter agent writes for GPUs: no GPU is here), as in ``test_widgets``.

Checked: a kernel without the extension refuses the comm; ``%load_ext`` announces
itself; the link, cells (running, foreground, cancelled, recent), actors, node bars
(CPU, RAM, object store, GPUs) and forwards as the panel sees them; node bars only
while a panel is visible, at most once per its interval, and the agent's sampling
stopped when none is; every command, and every command given wrongly; a dropped link
seen as reconnecting, then connected; detach and down.
"""

from __future__ import annotations

import http.server
import json
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from jupyter_cluster._sidebar import run_state

from .kernel import Kernel
from .panel import Panel, ok

pytestmark = pytest.mark.timeout(600)

DATA = Path(__file__).parent / "data"


class _Metrics(http.server.BaseHTTPRequestHandler):
    body = (DATA / "ray_metrics_gpu.txt").read_bytes()

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def gpu_node() -> Iterator[int]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Metrics)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def kernel(gpu_node: int) -> Iterator[Kernel]:
    extra = [{"id": "sim-gpu", "address": "127.0.0.1", "port": gpu_node}]
    k = Kernel(env={"JUPYTER_CLUSTER_METRICS_NODES": json.dumps(extra)})
    yield k
    k.kc.stop_channels()
    k.km.shutdown_kernel(now=True)


@pytest.fixture(scope="module")
def panel(kernel: Kernel) -> Iterator[Panel]:
    p = Panel(kernel)
    yield p
    p.stop()


def test_a_kernel_without_the_extension_closes_the_comm(kernel: Kernel, panel: Panel) -> None:
    panel.open({"type": "watch", "visible": True, "interval": 1})
    assert panel.closed.wait(30), "the kernel kept a comm to a target nobody registered"
    assert not panel.seen


def test_load_ext_announces_the_kernel_with_no_cluster(kernel: Kernel, panel: Panel) -> None:
    ok(kernel, "%load_ext jupyter_cluster")
    assert panel.opened.wait(30), "%load_ext opened no comm to the page"
    hello = panel.wait("hello")
    assert hello["version"] == 1 and hello["package_version"]
    assert panel.wait("link")["link"] is None
    assert panel.wait("cells")["cells"] == []
    assert panel.wait("actors")["actors"] == []
    assert panel.wait("forwards")["forwards"] == []
    # Commands before any cluster: a clear answer, nothing else happens.
    reply = panel.request({"type": "cancel", "cell": "nope"})
    assert not reply["ok"] and "%cluster local" in reply["message"]
    # A second %load_ext keeps the one registration and comm.
    first = panel.comm_id
    ok(kernel, "%reload_ext jupyter_cluster")
    assert panel.comm_id == first


def test_link_and_nodes_once_attached(kernel: Kernel, panel: Panel) -> None:
    panel.drain()
    ok(kernel, "%cluster local --cpus 2\nimport jupyter_cluster as jc, time", timeout=180)
    link = panel.wait("link", lambda m: m["link"] is not None)["link"]
    assert link["state"] == "connected" and link["kind"] == "embedded local"
    assert link["session"] and link["ray"].startswith("2.") and link["python"].startswith("3.")
    # Ray's dashboard, which the embedded cluster runs where the box has room (its button opens it).
    from jupyter_cluster.agent._sizing import dashboard_fits, memory_limit

    dashboard = link["ray_dashboard"]
    if dashboard_fits(memory_limit()):
        assert dashboard is not None and dashboard.startswith("http://127.0.0.1:"), link
    else:
        assert dashboard is None, link
    # Hidden: no node bars, and the agent samples nothing.
    time.sleep(3)
    assert not [m for m in panel.seen if m["type"] == "nodes"]
    assert _watchers(kernel, panel) == 0
    # Visible, every second: bars for the real node and the GPU one, about once a second.
    panel.send({"type": "watch", "visible": True, "interval": 1})
    nodes = panel.wait("nodes", lambda m: len(m["nodes"]) == 2 and all(n["ram"]["total"] for n in m["nodes"]))
    by_id = {n["id"]: n for n in nodes["nodes"]}
    gpu = by_id.pop("sim-gpu")
    (real,) = by_id.values()
    assert real["head"] and real["alive"] and real["cpu"]["total"] == 2
    assert 0 <= real["cpu"]["used"] <= 2 and 0 < real["ram"]["used"] < real["ram"]["total"]
    assert real["store"]["total"] > 0 and real["gpu"] is None and real["gram"] is None
    assert gpu["gpu"]["total"] == 2 and gpu["gram"]["total"] > gpu["gram"]["used"] > 0
    first = panel.wait("nodes")
    later = [panel.wait("nodes") for _ in range(3)]
    gaps = [b["_at"] - a["_at"] for a, b in zip([first, *later], later)]
    assert all(gap > 0.8 for gap in gaps), f"node bars came faster than the 1 s asked for: {gaps}"
    assert _watchers(kernel, panel) == 1
    # Hidden again: the sampling stops, and so do the bars.
    panel.send({"type": "watch", "visible": False, "interval": 1})
    assert _wait_for(lambda: _watchers(kernel, panel) == 0), "the agent still samples for a hidden panel"
    panel.drain()
    time.sleep(3)
    assert not [m for m in list(panel.messages.queue) if m["type"] == "nodes"]


def test_an_async_cell_is_listed_and_cancelled_from_the_panel(kernel: Kernel, panel: Panel) -> None:
    ok(kernel, "%%remote --async\nstarted = time.time()\ntime.sleep(60)\nnever = 1")
    running = panel.wait("cells", lambda m: any(c["status"] == "running" for c in m["cells"]))["cells"][0]
    assert running["mode"] == "task" and running["node"] and not running["foreground"]
    assert running["label"] and running["finished"] is None and running["submitted"] <= time.time()
    reply = panel.request({"type": "cancel", "cell": running["id"]})
    assert reply["ok"], reply
    ended = panel.wait(
        "cells", lambda m: any(c["id"] == running["id"] and c["status"] == "cancelled" for c in m["cells"])
    )
    cell = next(c for c in ended["cells"] if c["id"] == running["id"])
    assert cell["finished"] is not None and cell["finished"] - cell["submitted"] < 30
    # The notebook is intact and the cluster runs the next cell.
    ok(kernel, "%%remote\nafter = 6 * 7")
    ok(kernel, "assert after == 42")
    # Cancelling it again, or a cell that never was: a reply saying so.
    for cell_id in (running["id"], "no-such-cell"):
        reply = panel.request({"type": "cancel", "cell": cell_id})
        assert not reply["ok"] and "not running" in reply["message"]


def test_a_foreground_cell_is_marked_so(kernel: Kernel, panel: Panel) -> None:
    panel.drain()
    ok(kernel, "%%remote\ntime.sleep(2)")
    # A trivial cell says nothing until it ends (the agent spares it a "started" message).
    seen = panel.wait("cells", lambda m: any(c["foreground"] for c in m["cells"]))
    assert seen["cells"][0]["status"] in ("queued", "running") and seen["cells"][0]["finished"] is None
    done = panel.wait("cells", lambda m: m["cells"] and m["cells"][0]["status"] == "done")
    assert not done["cells"][0]["foreground"]  # done: nothing to interrupt any more


def test_a_map_cell_shows_its_progress(kernel: Kernel, panel: Panel) -> None:
    panel.drain()
    ok(kernel, "%%remote --map i in range(6) --async\ntime.sleep(0.3)\nj = i")
    progress = panel.wait("cells", lambda m: m["cells"] and m["cells"][0]["mode"] == "map")["cells"][0]["progress"]
    assert progress[1] == 6
    done = panel.wait("cells", lambda m: m["cells"][0]["status"] == "done")["cells"][0]
    assert done["progress"] == [6, 6]


def test_actors_listed_and_killed_from_the_panel(kernel: Kernel, panel: Panel) -> None:
    ok(kernel, "%%remote --actor sidebar_counter\ncount = 1")
    # Once its cell is done, the actor says where it lives (while busy it only says what it runs).
    actors = panel.wait("actors", lambda m: any(a["name"] == "sidebar_counter" and a["node"] for a in m["actors"]))
    actor = next(a for a in actors["actors"] if a["name"] == "sidebar_counter")
    assert actor["error"] is None and actor["running"] is None
    reply = panel.request({"type": "kill_actor", "name": "sidebar_counter"})
    assert reply["ok"], reply
    panel.wait("actors", lambda m: not any(a["name"] == "sidebar_counter" for a in m["actors"]))
    reply = panel.request({"type": "kill_actor", "name": "sidebar_counter"})
    assert not reply["ok"] and "no actor named 'sidebar_counter'" in reply["message"]
    # The next cell with that name starts a fresh actor.
    ok(kernel, "%%remote --actor sidebar_counter --out fresh\nfresh = 'count' not in dir()")
    ok(kernel, "assert fresh")


def test_port_forwards_are_listed_as_they_open_and_close(kernel: Kernel, panel: Panel) -> None:
    panel.drain()
    ok(kernel, "from jupyter_cluster._forward import free_port\nport, local = free_port(), free_port()")
    ok(kernel, "url = jc.forward(port, local=local)")
    (entry,) = panel.wait("forwards", lambda m: bool(m["forwards"]))["forwards"]
    assert entry["name"].startswith("port ") and entry["local"].startswith("http://127.0.0.1:")
    assert entry["remote"].startswith("embedded cluster (this machine):")
    ok(kernel, "assert jc.current().close_forward(port)")
    assert panel.wait("forwards", lambda m: not m["forwards"])["forwards"] == []


def test_malformed_commands_get_clear_replies(kernel: Kernel, panel: Panel) -> None:
    reply = panel.request({"type": "reboot_everything"})
    assert not reply["ok"] and "unknown command 'reboot_everything'" in reply["message"]
    reply = panel.request({"type": "kill_actor"})  # no name
    assert not reply["ok"] and "kill_actor needs the actor's name in 'name' (got None)" in reply["message"]
    reply = panel.request({"type": "kill_actor", "name": ["a"]})
    assert not reply["ok"] and "got ['a']" in reply["message"]
    panel.send({"type": "watch", "visible": "yes", "interval": "soon"})  # wrong types: ignored, said in the log
    panel.send("not even a dict")  # type: ignore[arg-type]
    ok(kernel, "%%remote\nstill = 1")  # the kernel and the session are fine
    reply = panel.request({"type": "cancel", "cell": None})
    assert not reply["ok"] and "cancel needs the cell's id" in reply["message"]


def test_dashboard_command_gives_bokeh_and_the_widget(kernel: Kernel, panel: Panel) -> None:
    reply = panel.request({"type": "dashboard"})
    assert reply["ok"], reply
    mimes = [set(o["data"]) for o in reply["outputs"]]
    assert any("application/vnd.bokehjs_load.v0+json" in m for m in mimes)
    view = reply["outputs"][-1]["data"]
    assert "application/vnd.jupyter.widget-view+json" in view and "Dashboard of embedded local" in view["text/plain"]
    # Asked again: the same live widget, not a second sampler.
    again = panel.request({"type": "dashboard"})
    model = view["application/vnd.jupyter.widget-view+json"]["model_id"]
    assert again["outputs"][-1]["data"]["application/vnd.jupyter.widget-view+json"]["model_id"] == model


def test_a_dropped_link_shows_reconnecting_then_connected(kernel: Kernel, panel: Panel) -> None:
    panel.drain()
    ok(kernel, "jc.current()._link.drop_connection()")
    states = []
    while "connected" not in states[1:]:
        states.append(panel.wait("link", timeout=60)["link"]["state"])
    assert "reconnecting" in states, states


def test_a_second_panel_and_a_closed_one(kernel: Kernel, panel: Panel) -> None:
    # A panel opening later gets the whole state on its own comm.
    client = kernel.km.blocking_client()
    client.start_channels()
    second = Panel(kernel, client)
    try:
        second.open()
        assert second.wait("hello")["version"] == 1
        assert second.wait("link")["link"]["state"] == "connected"
        assert second.wait("cells")["cells"]
    finally:
        client.shell_channel.send(client.session.msg("comm_close", {"comm_id": second.comm_id, "data": {}}))
        second.stop()
        client.stop_channels()
    ok(kernel, "%%remote\nx = 1")  # the kernel is fine after a comm closed


def test_detach_then_down(kernel: Kernel, panel: Panel) -> None:
    ok(kernel, "session = jc.current().session")
    reply = panel.request({"type": "detach"})
    assert reply["ok"] and "detached" in reply["message"]
    assert panel.wait("link", lambda m: m["link"] is None)
    ok(kernel, "assert jc.current() is None")
    ok(kernel, "%cluster local --cpus 2", timeout=180)  # a new one is attached
    assert panel.wait("link", lambda m: m["link"] is not None)["link"]["state"] == "connected"
    reply = panel.request({"type": "down"})
    assert reply["ok"], reply
    assert panel.wait("link", lambda m: m["link"] is None)
    ok(kernel, "assert jc.current() is None")


def test_run_state_from_recorded_events() -> None:
    """A sweep's and a training run's line, from the events the agent sends (recorded)."""

    cell = SimpleNamespace(cell_id="s-c9", status="running", finished=None, done=lambda: False)
    events = [
        {"type": "trial", "trial": "a", "state": "RUNNING"},
        {"type": "result", "trial": "a", "iteration": 1, "metrics": {"loss": 0.5}},
        {"type": "trial", "trial": "b", "state": "RUNNING"},
        {"type": "result", "trial": "b", "iteration": 1, "metrics": {"loss": 0.3}},
        {"type": "result", "trial": "a", "iteration": 2, "metrics": {"loss": 0.4}, "stopped": True},
        {"type": "trial", "trial": "c", "state": "ERROR"},
    ]
    sweep = SimpleNamespace(kind="tune", label="jc.tune(f)", metric="loss", mode="min", started=1.0, cell=cell)
    sweep.events = events
    line = run_state(sweep)  # type: ignore[arg-type]
    # The best trial by its last result: b's 0.3 (a peaked at 0.5 in max mode, but its last is 0.4)
    assert line["best"] == 0.3 and line["counts"] == {"stopped": 1, "running": 1, "error": 1}
    assert line["best_text"] == "0.3"  # as the run's widget writes it
    assert line["status"] == "running" and line["cell"] == "s-c9" and line["finished"] is None
    sweep.mode = "max"
    assert run_state(sweep)["best"] == 0.4  # type: ignore[arg-type]
    training = SimpleNamespace(kind="train", label="jc.train_torch(f)", metric=None, mode=None, started=1.0, cell=cell)
    training.events = [
        {"type": "report", "rank": 0, "report": 1, "metrics": {"epoch": 0, "loss": 0.9, "acc": 0.1}},
        {"type": "report", "rank": 1, "report": 1, "metrics": {"epoch": 0, "loss": 0.7, "acc": 0.2}},
        {"type": "report", "rank": 0, "report": 2, "metrics": {"epoch": 1, "loss": 0.6, "acc": 0.4}},
        {"type": "error", "rank": 1},
    ]
    line = run_state(training)  # type: ignore[arg-type]
    assert line["metric"] == "loss" and line["best"] == 0.6  # the first metric rank 0 reports, its last value
    assert line["counts"] == {"running": 1, "error": 1}
    cell.done = lambda: True  # the run ended: nothing of it runs any more
    assert run_state(training)["counts"] == {"finished": 1, "error": 1}  # type: ignore[arg-type]


def _watchers(kernel: Kernel, panel: Panel) -> int:
    return int(_eval(kernel, "jc.current().status().data['metrics_watchers']"))


def _eval(kernel: Kernel, expr: str) -> str:
    """``expr``'s value, through a user expression (the panel's reader has the iopub)."""
    msg_id = kernel.kc.execute("", user_expressions={"v": expr})
    while True:
        reply = kernel.kc.get_shell_msg(timeout=60)
        if reply["parent_header"].get("msg_id") == msg_id:
            return str(reply["content"]["user_expressions"]["v"]["data"]["text/plain"])


def _wait_for(check: Callable[[], bool], timeout: float = 20) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.5)
    return False
