"""Three notebooks on one head reached over SSH (a real sshd on loopback), two of them with work running: each
sees and stops only its own work, and ``down`` refuses to stop a cluster others use, or one it did not start.

Notebook A is this process: it started the head (``--start-head``). Notebooks B and C are real kernels that attach
to that head, each with an agent (a Ray job, a Ray namespace) of its own; B's sidebar is read as its JupyterLab
panel reads it. All three have an ``--actor counter``; A and B each deployed a Serve application and a detached
actor from a driver cell (Serve is one per cluster). While B's task cell and C's actor cell run:

- each one's status and sidebar list its own cells, actors and what its cells started, and count the others';
- B's sidebar and A's dashboard feed count the other notebooks' running work apart (Ray's ``JobId``);
- A's *cancel all*, *reset driver* and ``kill_actor("counter")`` leave B's and C's cells running, B's Serve
  application serving and B's actors as they were;
- A's ``down`` refuses (others use the cluster), B's refuses (B did not start it); B's ``down --force`` stops B's
  agent and what B's cells started, and C's cell runs on.
"""

# Test parameters named after the imported fixtures redefine them, as pytest intends.
# ruff: noqa: F811

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import jupyter_cluster as jc
from jupyter_cluster._feed import MetricsFeed, other_jobs_said

from .conftest import attached
from .kernel import Kernel, error_text, text
from .panel import Panel, ok, run, value
from .sshd import SSHServer, free_port, sshd_server  # noqa: F401 (fixtures)

pytestmark = pytest.mark.timeout(900)

#: Long enough to outlast the test; each notebook's own cancel ends it.
BUSY = "import time\nfor _ in range(6000):\n    time.sleep(0.1)"


def _serve_app(name: str) -> str:
    """A driver cell deploying Serve application ``name`` (a replica of no CPU) and a detached actor ``NAME-keeper``."""
    return (
        "%%remote --driver\n"
        "from ray import serve\n\n"
        "@serve.deployment(ray_actor_options={'num_cpus': 0})\n"
        "def hello(request):\n"
        f"    return {name!r}\n\n"
        f"serve.run(hello.bind(), name={name!r}, route_prefix='/{name}')\n\n"
        "@ray.remote(num_cpus=0)\n"
        "class Keeper:\n"
        "    def ping(self):\n"
        "        return 'kept'\n\n"
        f"keeper = Keeper.options(name='{name}-keeper', lifetime='detached').remote()\n"
        "assert ray.get(keeper.ping.remote()) == 'kept'"
    )


def _target(server: SSHServer) -> str:
    return f"{server.user}@{server.host}:{server.port}"


def _connect_line(server: SSHServer, address: str) -> str:
    return (
        "%load_ext jupyter_cluster\nimport jupyter_cluster as jc\n"
        f"%cluster connect {_target(server)} --identity {server.identity} --known-hosts {server.known_hosts} "
        f"--address {address}"
    )


def _until(check: Callable[[], Any], what: str, seen: Callable[[], Any] | None = None, timeout: float = 120) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        found = check()
        if found:
            return found
        assert time.monotonic() < deadline, f"not within {timeout} s: {what} (seen: {seen() if seen else found!r})"
        time.sleep(1)


@pytest.fixture(scope="module")
def notebook_a(sshd_server: SSHServer) -> Iterator[jc.Cluster]:
    with attached(
        lambda: jc.connect(
            _target(sshd_server),
            identity=str(sshd_server.identity),
            known_hosts=str(sshd_server.known_hosts),
            start_head=True,
            port=free_port(),
        )
    ) as cluster:
        yield cluster


def test_three_notebooks_on_one_head_each_see_and_stop_only_their_own_work(
    notebook_a: jc.Cluster, sshd_server: SSHServer
) -> None:
    a = notebook_a
    assert a.started is not None and a.started_here
    address = a.started.address
    b, c = Kernel(), Kernel()
    panel = Panel(b)  # B's sidebar: it reads B's iopub from here on (B's cells go through panel.ok / value)
    try:
        # ------------------------------------------------------------ three notebooks, their work
        ok(b, _connect_line(sshd_server, address), timeout=300)
        c.ok(_connect_line(sshd_server, address), timeout=300)
        a.run_cell("n = 'a'", mode="actor", actor="counter").result(120)
        ok(b, "%%remote --actor counter\nn = 'b'")
        c.ok("%%remote --actor counter\nn = 'c'")
        c.ok("%%remote --actor c_only\nm = 0")
        a.run_cell(_serve_app("a-app").split("\n", 1)[1], mode="driver").result(300)
        ok(b, _serve_app("b-app"), timeout=300)
        ok(b, f"running_b = jc.current().run_cell({BUSY!r})")
        c.ok(f"running_c = jc.current().run_cell({BUSY!r}, mode='actor', actor='counter')")
        mine = a.run_cell(BUSY)
        statuses = lambda: (value(b, "running_b.status"), value(c, "running_c.status"), mine.status)  # noqa: E731
        _until(lambda: statuses() == ("'running'", "'running'", "running"), "B's, C's and A's cells run", statuses)

        # ------------------------------------------------------------ each sees its own
        data = a.status().data or {}
        assert [cell["cell_id"] for cell in data["cells"]] == [mine.cell_id], data["cells"]
        assert sorted(data["actors"]) == ["counter"], data["actors"]
        assert sorted(data["started"]["serve"]) == ["a-app"], data["started"]
        assert [actor["name"] for actor in data["started"]["actors"]] == ["a-app-keeper"], data["started"]
        assert "2 notebooks of another agent" in str(a.status()), str(a.status())

        panel.send({"type": "watch", "visible": True, "interval": 1})
        actors = panel.wait("actors", lambda m: bool(m["actors"]))
        assert [actor["name"] for actor in actors["actors"]] == ["counter"], actors  # not C's c_only
        running = ("task", "running")
        cells = panel.wait("cells", lambda m: running in [(c["mode"], c["status"]) for c in m["cells"]])["cells"]
        # B's three cells (its counter's, its driver cell, its running task), not A's or C's.
        assert sorted((cell["mode"], cell["status"]) for cell in cells) == [
            ("actor", "done"),
            ("driver", "done"),
            ("task", "running"),
        ], cells
        # The others' running work (A's task cell, C's actor cell, their actors), counted apart by Ray's JobId
        # once Ray's metrics say it (they are exported every few seconds).
        nodes = panel.wait("nodes", lambda m: "task" in m.get("others", "") and "running" in m["others"], 120)
        assert nodes["others"].startswith("other notebooks and drivers: "), nodes["others"]
        feed = MetricsFeed.of(a)
        token = feed.subscribe(lambda kind, data: None)
        try:
            said = _until(lambda: other_jobs_said(feed.totals()), "A's dashboard counts the others' work")
            assert "running" in said and "alive" in said, said  # B's task, C's actor call; their actors
        finally:
            feed.unsubscribe(token)

        # ------------------------------------------------------------ A stops only its own
        a.cancel_all()
        with pytest.raises(KeyboardInterrupt):
            mine.result(60)
        stopped = a.reset_driver()
        assert stopped["serve"] == ["a-app"] and stopped["actors"] == ["a-app-keeper"], stopped
        assert not stopped["errors"], stopped
        a.kill_actor("counter")
        fresh = a.run_cell("'n' in dir()", mode="actor", actor="counter").result(120).value
        assert fresh is False, "A's counter was killed: the next cell starts a fresh one"
        assert value(b, "running_b.status") == "'running'" and value(c, "running_c.status") == "'running'"
        ok(b, "%%remote --actor counter --out seen_b\nseen_b = n")  # B's counter kept its namespace
        assert value(b, "seen_b") == "'b'"
        ok(
            b,
            "%%remote --driver --out b_status\n"
            "b_status = str(serve.status().applications['b-app'].status)\n"
            "assert ray.get(ray.get_actor('b-app-keeper').ping.remote()) == 'kept'",
        )
        assert "RUNNING" in value(b, "b_status")

        # ------------------------------------------------------------ down
        with pytest.raises(jc.ClusterError, match=r"others use this cluster \(2 notebooks of another agent"):
            a.down()
        assert a.alive
        refused = run(b, "%cluster down")
        assert refused["status"] == "error", refused
        assert "did not start this cluster" in refused["evalue"] and "--force" in refused["evalue"], refused
        assert value(b, "running_b.status") == "'running'", "a refused down stops nothing"
        ok(b, "%cluster down --force", timeout=180)
        assert value(b, "running_b.status") != "'running'"
        # B's Serve application and detached actor went with B's agent; C's cell runs on.
        named = a.run_cell(
            "names = sorted(a['name'] for a in ray.util.list_named_actors(all_namespaces=True))", mode="driver"
        ).result(120)
        left = named.outputs["names"]
        assert not [n for n in left if "b-app" in n], left
        assert text(c.ok("print(running_c.status)")).strip() == "running"
        c.ok("running_c.cancel()")
    finally:
        panel.stop()
        for kernel in (b, c):
            try:
                kernel.execute("%cluster down --force", timeout=120)
            except Exception as exc:  # the kernel's cleanup: say it, but the next one still runs
                print("cleanup:", exc, error_text([]))
            kernel.kc.stop_channels()
            kernel.km.shutdown_kernel(now=True)
