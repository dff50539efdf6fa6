"""The live views, through a real kernel on a real embedded cluster.

The kernel's agent scrapes its real node and four simulated ones, served here over
HTTP: a node with two GPUs (a metrics text written with the names and labels Ray's
reporter agent emits for GPUs, ``data/ray_metrics_gpu.txt``: no GPU is here), a node
that goes away during the test (refused connections), one that accepts and never
answers, and one that answers HTTP 500. A second raylet joins the cluster and leaves
it again, as a real node would.

Checked: the dashboard's plots change only by ``stream`` and ``patch``; a 100 MB
``jc.put`` shows in the object store; nodes join, leave and go stale; several
dashboards share one watch, which ends with the last; ``close()`` leaves a snapshot;
``--map`` bars, ``--async`` status lines, ``jc.map``/``jc.wait`` bars, ``tqdm`` and
``tqdm_ray`` bars; the status card.
"""

from __future__ import annotations

import contextlib
import http.server
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from jupyter_cluster.agent._main import _token_available

from .kernel import Kernel, error_text, result, text
from .ray_start import START_ATTEMPTS, quieter

pytestmark = pytest.mark.timeout(600)

DATA = Path(__file__).parent / "data"


class _Metrics(http.server.BaseHTTPRequestHandler):
    body = b""
    status = 200

    def do_GET(self) -> None:
        self.send_response(self.status)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, *args: Any) -> None:
        pass


def _serve(body: bytes, status: int = 200) -> http.server.ThreadingHTTPServer:
    handler = type("Handler", (_Metrics,), {"body": body, "status": status})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@pytest.fixture(scope="module")
def nodes() -> Iterator[dict[str, Any]]:
    """The simulated nodes' endpoints: id -> server (or listening socket)."""
    gpu = _serve((DATA / "ray_metrics_gpu.txt").read_bytes())
    gone = _serve((DATA / "ray_metrics_idle.txt").read_bytes())
    error = _serve(b"boom", status=500)
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(64)  # connections queue; nothing ever answers
    made = {"sim-gpu": gpu, "sim-gone": gone, "sim-error": error, "sim-silent": silent}
    yield made
    for server in (gpu, gone, error):
        server.shutdown()
        server.server_close()
    silent.close()


def _port(endpoint: Any) -> int:
    return int(endpoint.server_address[1] if hasattr(endpoint, "server_address") else endpoint.getsockname()[1])


@pytest.fixture(scope="module")
def kernel(nodes: dict[str, Any]) -> Iterator[Kernel]:
    extra = [{"id": node_id, "address": "127.0.0.1", "port": _port(e)} for node_id, e in nodes.items()]
    k = Kernel(env={"JUPYTER_CLUSTER_METRICS_NODES": json.dumps(extra)})
    k.ok("%load_ext jupyter_cluster\n%cluster local --cpus 2\nimport jupyter_cluster as jc, time", timeout=180)
    yield k
    k.stop()


def _value(kernel: Kernel, expr: str) -> Any:
    out = result(kernel.ok(expr))
    assert out is not None, expr
    return eval(out)


def _poll(kernel: Kernel, expr: str, until: Any, timeout: float = 40.0) -> Any:
    """``expr`` evaluated in the kernel every half second until ``until(value)``."""
    deadline = time.monotonic() + timeout
    while True:
        value = _value(kernel, expr)
        if until(value) or time.monotonic() > deadline:
            return value
        time.sleep(0.5)


def _displays(messages: list[Any], mime: str = "text/plain") -> list[str]:
    return [
        str(m["content"]["data"].get(mime, ""))
        for m in messages
        if m["msg_type"] in ("display_data", "update_display_data", "execute_result")
    ]


def _watchers(kernel: Kernel) -> int:
    return int(_value(kernel, "jc.current().status().data['metrics_watchers']"))


# ------------------------------------------------------------------------ dashboard
def test_the_dashboard_draws_by_stream_and_patch_only(kernel: Kernel) -> None:
    messages = kernel.ok(
        "import jupyter_cluster.widgets._dashboard as dashboard_module\n"
        "dashboard_module.LIVE_FALLBACK = 600  # no frontend here: nothing counts views but this test\n"
        "events = []\n"
        "dash = jc.dashboard()\n"
        "dash.plots._document.on_change(lambda e: events.append((type(e).__name__, getattr(e, 'attr', ''))))\n"
        "sent = []\n"
        "_send = dash.plots.send\n"
        "dash.plots.send = lambda content, buffers=None: (sent.append(content.get('msg')), _send(content, buffers))\n"
        "dash"
    )
    bundle = next(
        m["content"]["data"]
        for m in messages
        if m["msg_type"] == "display_data" and "text/html" in m["content"]["data"]
    )
    assert "application/vnd.jupyter.widget-view+json" in bundle
    assert "jc-dashboard-snapshot" in bundle["text/html"] and "(head)" in bundle["text/html"], bundle["text/html"]
    # Samples keep coming: the time series grows, row by row, and no view is drawn again whole.
    kernel.ok("resent = []\ndash.plots.observe(lambda change: resent.append(1), names='render_bundle')")
    first = _value(kernel, "len(dash.series.data['t'])")
    grown = _poll(kernel, "len(dash.series.data['t'])", lambda n: n >= first + 2)
    assert grown >= first + 2, (first, grown)
    # No view has been shown yet: no change went out (a view made halfway through one
    # would read the rest out of step). Once the frontend counts a view, it gets the whole
    # document once, and changes flow.
    assert _value(kernel, "(dash.plots.live, sent.count('patch'), len(resent))") == (False, 0, 0)
    kernel.ok("dash.plots._view_count = 1  # what the frontend sets once it displays a view")
    assert _value(kernel, "(dash.plots.live, len(resent))") == (True, 1)
    grown = _poll(kernel, "sent.count('patch')", lambda n: n >= 3)
    assert grown >= 3, grown
    rows = _value(kernel, "sorted(set(m for _, m in dash.bars.data['y']))")
    assert {"CPU", "RAM", "object store", "GPU 0", "GPU 1", "GPU 1 memory"} <= set(rows), rows
    states = _value(kernel, "dict(zip(dash.states.data['y'], dash.states.data['count']))")
    assert states[("Ray actors", "alive")] >= 1 and states[("Ray tasks", "running")] >= 0, states  # simulated nodes'
    assert states[("cells", "running")] == 0 and states[("map items", "running")] == 0, states
    kinds = _value(kernel, "sorted(set(events))")
    data_events = [k for k in kinds if k[0] in ("ColumnsStreamedEvent", "ColumnsPatchedEvent")]
    assert data_events, kinds
    assert ("ModelChangedEvent", "data") not in kinds and not any(k[0] == "ColumnDataChangedEvent" for k in kinds)
    assert _value(kernel, "len(resent)") == 1  # only for the view: samples stream and patch


def test_the_dashboard_counts_the_cells_work_as_their_progress_bars_do(kernel: Kernel) -> None:
    """The dashboard's work rows come from the same cells the progress bars and the sidebar read, at the tick
    that draws the nodes: a running map's items, by what they are (done, in a running chunk, waiting), add up to
    its items, and the map's own count agrees; within a refresh of its end, the rows say nothing runs."""
    kernel.ok(
        "dash3 = jc.dashboard()\n"
        "job = jc.current().run_cell('import time\\ntime.sleep(0.4)\\ny = i', mode='map', map_over=('i', range(24)),"
        " pending_handles=True, label='work')"
    )
    read = "(dict(zip(dash3.states.data['y'], dash3.states.data['count'])), job.progress[0], job.done())"
    seen_running = False
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        states, done, finished = _value(kernel, read)
        items = [states["map items", g] for g in ("done", "running", "waiting")]
        if finished:
            break
        if states["cells", "running"] == 1:
            seen_running = True
            assert sum(items) == 24, states  # every item counted once, by what it is
            # The same cell's own count, read a moment later: never behind the dashboard's.
            assert done >= states["map items", "done"], (states, done)
        time.sleep(0.3)
    assert seen_running, "the dashboard never showed the map running"
    kernel.ok("job.result()")
    states = _poll(
        kernel,
        "dict(zip(dash3.states.data['y'], dash3.states.data['count']))",
        lambda st: st["cells", "running"] == 0,
        timeout=3,
    )
    assert states["map items", "running"] == 0 and states["map items", "waiting"] == 0, states
    assert states["map items", "done"] == 24, states  # the last map's items as it ended, as its result says
    snapshot = _value(kernel, "dash3.snapshot()")
    assert "cells: 0 running, 0 queued" in snapshot, snapshot
    kernel.ok("dash3.close()")
    # A dashboard opened after the map ended shows it as it ended too.
    kernel.ok("dash4 = jc.dashboard()\nlater = dash4.snapshot()\ndash4.close()")
    assert "map items: 24 done, 0 running, 0 waiting" in _value(kernel, "later")


def test_gpus_from_the_reporter_agents_metric_names(kernel: Kernel) -> None:
    gpu = _value(
        kernel,
        "[(t, round(f, 3)) for (_, m), f, t, n in zip(*(dash.bars.data[c] for c in ('y', 'frac', 'text', 'node')))"
        " if n == 'sim-gpu' and m.startswith('GPU')]",
    )
    texts = [t for t, _ in gpu]
    assert "87 % NVIDIA H100 80GB HBM3" in texts and "40.0 GiB / 80.0 GiB" in texts, gpu
    assert (0.5 in [f for _, f in gpu]) and (0.87 in [f for _, f in gpu]), gpu
    # The cluster's GPU line is the mean over GPUs: (87 + 13) / 2.
    assert _value(kernel, "dash.series.data['gpu'][-1]") == 50.0


def test_a_big_put_shows_in_the_object_store(kernel: Kernel) -> None:
    head = "[n for n, v in dash.feed.nodes.items() if v.get('head')][0]"
    before = _value(kernel, f"dash.feed.nodes[{head}]['store_used']")
    kernel.ok("big = jc.put(b'x' * 100_000_000)")
    after = _poll(kernel, f"dash.feed.nodes[{head}]['store_used']", lambda v: v >= before + 99e6, timeout=40)
    assert after >= before + 99e6, (before, after)
    text_row = _value(
        kernel,
        "[t for (n, m), t in zip(dash.bars.data['y'], dash.bars.data['text'])"
        f" if m == 'object store' and n == dash.labels[{head}]][0]",
    )
    assert text_row.startswith("9") and "MiB" in text_row, text_row
    kernel.ok("del big")


def test_unreachable_endpoints_mark_their_nodes_stale(kernel: Kernel, nodes: dict[str, Any]) -> None:
    stale = "{n: v.get('stale') for n, v in dash.feed.nodes.items() if n.startswith('sim-')}"
    seen = _poll(kernel, stale, lambda s: s.get("sim-gone") is None and s.get("sim-silent") and s.get("sim-error"))
    assert seen["sim-gone"] is None and seen["sim-gpu"] is None, seen
    assert "did not answer in time" in seen["sim-silent"], seen
    assert "HTTP 500" in seen["sim-error"], seen
    nodes["sim-gone"].shutdown()
    nodes["sim-gone"].server_close()  # now refused
    seen = _poll(kernel, stale, lambda s: bool(s.get("sim-gone")))
    assert seen["sim-gone"] and "failed" in seen["sim-gone"], seen
    # A stale node keeps its last values, greyed, and is named in the header.
    assert _value(kernel, "dash.feed.nodes['sim-gone']['mem_total']") > 0
    header = _value(kernel, "dash.header.value")
    assert "stale" in header and "127.0.0.1 sim-go" in header, header
    greys = _value(kernel, "[c for c, n in zip(dash.bars.data['color'], dash.bars.data['node']) if n == 'sim-gone']")
    assert set(greys) == {"#c8c8c8"}, greys


def test_a_dashboard_without_new_samples_says_how_old_its_figures_are(kernel: Kernel) -> None:
    kernel.ok("dash2 = jc.dashboard()\nfresh = dash2.header.value")
    assert "s old" not in _value(kernel, "fresh")
    kernel.ok("dash2.feed.unsubscribe(dash2._token)  # no sample reaches it from now on, as over a stalled link")
    said = _poll(kernel, "dash2.header.value", lambda v: "s old" in v, timeout=10)
    assert re.search(r"figures [2-9] s old", said), said
    later = _poll(kernel, "dash2.header.value", lambda v: v != said, timeout=10)  # said again each second
    assert re.search(r"figures \d+ s old", later), later
    kernel.ok("dash2._token = None\ndash2.close()")


def test_the_dashboard_goes_on_after_a_dropped_link(kernel: Kernel) -> None:
    before = _value(kernel, "(dash.feed.deltas, len(dash.series.data['t']))")
    kernel.ok("jc.current()._link.drop_connection()")
    after = _poll(kernel, "(dash.feed.deltas, len(dash.series.data['t']))", lambda v: v[0] >= before[0] + 2, timeout=40)
    assert after[0] >= before[0] + 2 and after[1] > before[1], (before, after)
    assert _value(kernel, "dash.feed.watching and 'stopped' not in dash.header.value")


def test_a_node_that_joins_and_leaves(kernel: Kernel, tmp_path: Path) -> None:
    address = result(kernel.ok("%%remote --driver\nray.get_runtime_context().gcs_address"))
    assert address is not None
    gcs = eval(address)
    count = "len([n for n in dash.feed.nodes if not n.startswith('sim-')])"
    assert _value(kernel, count) == 1
    worker = None
    for attempt in range(1, START_ATTEMPTS + 1):
        log = tmp_path / f"ray-start-{attempt}.log"
        worker = subprocess.Popen(
            [sys.executable, "-m", "ray.scripts.scripts", "start", f"--address={gcs}", "--num-cpus=1", "--block",
             "--disable-usage-stats"],
            stdout=log.open("wb"), stderr=subprocess.STDOUT, start_new_session=True,
            # Ray turns token authentication on for a local cluster when a token exists; so does the worker. Its
            # dashboard agent gets 90 s to register, not 30: the machine is busy with the other test process.
            env={**os.environ, "RAY_AUTH_MODE": "token" if _token_available() else "disabled",
                 "RAY_agent_register_timeout_ms": "90000"},
        )  # fmt: skip
        joined = _poll(kernel, count, lambda n, w=worker: n == 2 or w.poll() is not None, timeout=150)
        # Ray gives a starting node a fixed 30 s to register; on two busy cores that can pass (ray_start.py).
        if joined != 2 and "timed out during startup" in log.read_text() and attempt < START_ATTEMPTS:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(worker.pid, signal.SIGKILL)
            worker.wait(60)
            quieter()
            continue
        break
    assert worker is not None
    try:
        assert joined == 2, f"the node did not join; `ray start` said:\n{log.read_text()[-3000:]}"
        factors = _value(kernel, "len(dash.node_plot.y_range.factors)")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(worker.pid, signal.SIGTERM)
        worker.wait(60)
    left = _poll(kernel, count, lambda n: n == 1, timeout=90)
    assert left == 1
    assert _value(kernel, "len(dash.node_plot.y_range.factors)") < factors  # off the axis


def test_dashboards_share_one_watch_that_ends_with_the_last(kernel: Kernel) -> None:
    assert _watchers(kernel) == 1
    kernel.ok("second = jc.dashboard()")
    assert _watchers(kernel) == 1  # one per kernel, however many dashboards
    assert _value(kernel, "len(second.series.data['t']) > 0 and second.feed is dash.feed")
    kernel.updates.clear()
    messages = kernel.ok("second.close()")
    assert _watchers(kernel) == 1 and not _value(kernel, "dash.closed")
    messages = kernel.ok("dash.close()")
    assert _poll(kernel, "jc.current().status().data['metrics_watchers']", lambda n: n == 0, timeout=10) == 0
    # Closing leaves a static snapshot in place of the live widget.
    update = kernel.wait_for_update(lambda m: "closed" in m["content"]["data"].get("text/plain", ""))
    data = update["content"]["data"]
    assert "application/vnd.jupyter.widget-view+json" not in data and "jc-dashboard-snapshot" in data["text/html"]
    assert "NVIDIA H100" not in data["text/html"] or "87 %" in data["text/html"]
    del messages


def test_dashboard_magic(kernel: Kernel) -> None:
    messages = kernel.ok("%cluster dashboard --window 60")
    bundles = [m["content"]["data"] for m in messages if m["msg_type"] == "display_data"]
    assert any("application/vnd.jupyter.widget-view+json" in b for b in bundles), bundles
    reply, messages = kernel.execute("%cluster dashboard --window soon")
    assert reply["status"] == "error" and "--window" in error_text(messages) + reply["evalue"]
    kernel.ok("_.close() if hasattr(_, 'close') else None")


# ------------------------------------------------------------------------- progress
def test_a_map_cell_shows_a_bar_to_the_end(kernel: Kernel) -> None:
    messages = kernel.ok("%%remote --map i in range(40)\nimport time\ntime.sleep(0.05)\ny = i")
    shown = _displays(messages)
    assert "0/40 items done" in shown[0], shown
    # What runs is named for what it counts: the chunks' Ray tasks (two CPUs: two, or for the moment between a
    # chunk's end reaching the agent and the next one's start, three), not the items of the chunks started.
    running = [int(m.group(1)) for m in (re.search(r"/40 items done, (\d+) tasks? running", s) for s in shown) if m]
    assert running and max(running) <= 3 and min(running) <= 2, shown
    assert "40/40 items done in" in shown[-1] and "items/s" in shown[-1], shown
    html = _displays(messages, "text/html")
    assert 'class="jc-progress jc-done"' in html[-1]


def test_a_failing_or_interrupted_map_ends_its_bar_so(kernel: Kernel) -> None:
    reply, messages = kernel.execute("%%remote --map i in range(8)\nif i == 5:\n    raise ValueError(i)\ny = i")
    assert reply["status"] == "error"
    final = _displays(messages)[-1]
    assert "failed after" in final and "1 failed" in final and "ValueError" in final, final
    code = "%%remote --map i in range(4)\nimport time\ntime.sleep(30)"
    msg_id = kernel.kc.execute(code)
    time.sleep(4)
    kernel.km.interrupt_kernel()
    deadline = time.monotonic() + 30
    finals = []
    while time.monotonic() < deadline:
        msg = kernel.kc.get_iopub_msg(timeout=30)
        if msg["msg_type"] == "update_display_data":
            finals.append(msg["content"]["data"]["text/plain"])
        if msg["parent_header"].get("msg_id") == msg_id and msg["content"].get("execution_state") == "idle":
            break
    kernel.reply_to(msg_id, timeout=30)
    assert finals and "cancelled after" in finals[-1] and "interrupted" in finals[-1], finals


def test_an_async_cell_shows_where_it_runs_and_how_it_ended(kernel: Kernel) -> None:
    kernel.updates.clear()
    kernel.ok("%%remote --async\nimport time\ntime.sleep(2)\nz = 1")
    running = kernel.wait_for_update(lambda m: "running on" in m["content"]["data"]["text/plain"], timeout=30)
    assert "running on 1" in running["content"]["data"]["text/plain"]  # an address: 192..., 10..., 127...
    done = kernel.wait_for_update(lambda m: "done in" in m["content"]["data"]["text/plain"], timeout=30)
    assert "bound time, z" in done["content"]["data"]["text/plain"]
    kernel.updates.clear()
    kernel.ok("%%remote --async\nimport time\ntime.sleep(30)\nzz = 1")
    kernel.ok("jc.current().cells[list(jc.current().cells)[-1]].cancel()")
    cancelled = kernel.wait_for_update(lambda m: "cancelled" in m["content"]["data"]["text/plain"], timeout=30)
    assert "jc-cancelled" in cancelled["content"]["data"]["text/html"]
    kernel.updates.clear()
    kernel.ok("%%remote --async\nfail = 1 / 0")
    failed = kernel.wait_for_update(lambda m: "failed" in m["content"]["data"]["text/plain"], timeout=30)
    assert "ZeroDivisionError" in failed["content"]["data"]["text/plain"]


def test_jc_map_and_wait_show_bars_unless_told_not_to(kernel: Kernel) -> None:
    kernel.updates.clear()
    kernel.ok(
        "def slow(x):\n    time.sleep(0.2)\n    if x == 3:\n        raise ValueError(x)\n    return x\n"
        "hs = jc.map(slow, range(8))"
    )
    final = kernel.wait_for_update(lambda m: "jc.map(slow): 8/8 calls done" in m["content"]["data"]["text/plain"])
    assert "1 failed" in final["content"]["data"]["text/plain"]
    messages = kernel.ok(
        "hs2 = jc.map(slow, range(4, 8), progress=False)\nready, _ = jc.wait(hs2, num_returns=4, progress=False)"
    )
    assert not _displays(messages)
    messages = kernel.ok(
        "hs3 = jc.map(slow, range(4, 10), progress=False)\n"
        "ready, rest = jc.wait(hs3, num_returns=6, progress=True)\nlen(ready)"
    )
    assert result(messages) == "6"
    shown = _displays(messages)
    assert shown and "jc.wait" in shown[0] and "6/6 handles done" in shown[-2], shown


def test_remote_progress_bars_become_bars(kernel: Kernel) -> None:
    messages = kernel.ok(
        "%%remote\nfrom tqdm import tqdm\nimport time\n"
        "for i in tqdm(range(20), desc='loop', mininterval=0):\n    time.sleep(0.02)\nprint('after')"
    )
    printed = text(messages)
    assert "after" in printed and "it/s" not in printed and "\r" not in printed, printed
    bars = _displays(messages, "text/html")
    assert any("jc-remote-bar" in b for b in bars) and "loop: 100% 20/20" in _displays(messages)[-1]
    messages = kernel.ok(
        "%%remote --driver\nfrom ray.experimental.tqdm_ray import tqdm as rtqdm\n"
        "for i in rtqdm(range(5), desc='driver', flush_interval_s=0):\n    time.sleep(0.05)\n"
        "@ray.remote\ndef work():\n    from ray.experimental.tqdm_ray import tqdm as rtqdm\n"
        "    for i in rtqdm(range(6), desc='task', flush_interval_s=0):\n        time.sleep(0.05)\n"
        "ray.get(work.remote())\ntime.sleep(1.5)"  # the task's lines come through Ray's log stream
    )
    shown = _displays(messages)
    assert "__ray_tqdm_magic_token__" not in text(messages)
    assert any(s.startswith("driver: 100% 5/5") for s in shown), shown
    assert any(s.startswith("task: 100% 6/6") for s in shown), shown
    kernel.updates.clear()
    kernel.ok("%%remote --async\nfrom tqdm import tqdm\nfor i in tqdm(range(10), desc='bg', mininterval=0):\n    pass")
    done = kernel.wait_for_update(lambda m: "done in" in m["content"]["data"]["text/plain"], timeout=30)
    assert "bg: 100% 10/10" in done["content"]["data"]["text/plain"]
    assert "jc-remote-bar" in done["content"]["data"]["text/html"]


# ----------------------------------------------------------------------- status card
def _one_instant(card: str) -> tuple[float, float, int, float]:
    """From a status card's text: the CPUs in use, those free (the node's line and the "available" line must
    agree), the running cells, and the object store's bytes used."""
    node = re.search(r"(\d+) CPU \(([\d.]+) in use, ([\d.]+) free;", card)
    assert node is not None, card
    total, used, free = (float(x) for x in node.groups())
    assert used + free == total, f"{used} in use and {free} free of {total} CPUs, in one card:\n{card}"
    available = re.search(r"available: ([\d.]+) CPU", card)
    assert available is not None and float(available.group(1)) == free, card
    running = re.search(r"running cells: (\d+)", card)
    store = re.search(r"object store ([\d.]+) (B|KiB|MiB|GiB) used of", card)
    assert running is not None and store is not None, card
    scale = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30}[store.group(2)]
    return used, free, int(running.group(1)), float(store.group(1)) * scale


def test_one_status_card_is_one_instant(kernel: Kernel) -> None:
    """The CPUs a card says are in use and those it says are free add up to the cluster's, while work runs and
    after it ends; within 5 s of the end the card says nothing runs; the store's figure covers a value the
    notebook put there (all from one read of Ray's resource view, not from gauges exported seconds apart)."""
    kernel.ok("import numpy as np\nheld = jc.put(np.ones(8_000_000))")  # 61 MiB in the object store
    kernel.ok(
        "busy = jc.current().run_cell('import time\\ntime.sleep(6)', pending_handles=True, label='busy')\n"
        "while busy.status != 'running':\n    time.sleep(0.1)"
    )
    used, _, running, store = _one_instant(_value(kernel, "str(jc.current().status())"))
    assert (used, running) == (1.0, 1) and store >= 61 * 2**20, (used, running, store)
    kernel.ok("busy.result()")
    ended = time.monotonic()
    while True:
        used, _, running, store = _one_instant(_value(kernel, "str(jc.current().status())"))
        if used == 0 and running == 0:
            break
        assert time.monotonic() - ended < 5, f"5 s after the cell's end: {used} CPU in use, {running} cells running"
        time.sleep(0.5)
    assert store >= 61 * 2**20
    kernel.ok("del held")


def test_the_status_card(kernel: Kernel) -> None:
    messages = kernel.ok("%cluster status")
    bundle = next(m["content"]["data"] for m in messages if m["msg_type"] == "display_data")
    card, plain = bundle["text/html"], bundle["text/plain"]
    assert 'class="jc-card jc-status"' in card and ">connected<" in card and "Ray 2." in card, card
    assert "(head)" in card and "used of" in card and "running cells: 0" in card, card
    assert "node(s)" in plain and "link: connected" in plain, plain
    # The CPUs Ray's work holds, then the host's load, named as the host's.
    assert re.search(r"2 CPU \([\d.]+ in use, [\d.]+ free; host \d+ % busy\)", plain), plain
    repr_html = _value(kernel, "'jc-status' in jc.current()._repr_html_()")
    assert repr_html is True
