"""The nine cell semantics of DESIGN.md, through a real shell and a real local Ray."""

from __future__ import annotations

import os
import sys
import threading
import time
import types
from typing import Any

import numpy as np
import pytest

import jupyter_cluster as jc
from jupyter_cluster._errors import plain

from .conftest import remote, run


# 1. Inputs ------------------------------------------------------------------------
def test_only_names_read_before_assignment_are_shipped(shell: Any, cluster: jc.Cluster) -> None:
    run(shell, "import threading\nlock = threading.Lock()\na = 20\nb = 'unused'")
    # `lock` cannot be pickled; the cell does not read it, so nothing complains.
    res = remote(shell, "b = 1\nc = a + b")
    assert res.success
    assert shell.user_ns["c"] == 21
    cell = cluster.run_cell("b = 1\nc = a + b", namespace=shell.user_ns)
    assert cell.spec.inputs == ("a",)


def test_modules_travel_by_name_and_functions_by_value(shell: Any) -> None:
    run(shell, "import math as m\ndef hyp(x, y):\n    return m.sqrt(x * x + y * y)\nclass P:\n    k = 3")
    assert remote(shell, "r = hyp(3, 4) * P.k").success
    assert shell.user_ns["r"] == 15.0


def test_unchanged_input_is_not_sent_again(shell: Any, cluster: jc.Cluster) -> None:
    ns = {"big": np.ones(300_000)}
    first = cluster.run_cell("s = big.sum()", namespace=ns)
    first.result(60)
    second = cluster.run_cell("t = big.mean()", namespace=ns)
    assert second.result(60).outputs["t"] == 1.0
    assert first.sent_bytes > 2_000_000
    assert second.sent_bytes == 0
    ns["big"] = ns["big"] * 2  # changed content: sent again
    third = cluster.run_cell("u = big.mean()", namespace=ns)
    assert third.result(60).outputs["u"] == 2.0
    assert third.sent_bytes > 2_000_000


def test_unserialisable_input_is_refused_before_sending(shell: Any, sent_ops: list[str]) -> None:
    run(shell, "import threading\nlock = threading.Lock()\nkeep = 7")
    res = remote(shell, "with lock:\n    x = 1")
    assert isinstance(res.error_in_exec, jc.InputError)
    message = str(res.error_in_exec)
    assert "`lock`" in message and "lock" in message and "Nothing was sent" in message
    assert shell.user_ns["keep"] == 7 and "x" not in shell.user_ns
    assert sent_ops == []


# 2. Outputs -----------------------------------------------------------------------
def test_small_outputs_come_back_large_ones_stay_remote(shell: Any, cluster: jc.Cluster) -> None:
    assert remote(shell, "import numpy as np\nsmall = list(range(5))\nbig = np.zeros((500, 1000))").success
    assert shell.user_ns["small"] == [0, 1, 2, 3, 4]
    big = shell.user_ns["big"]
    assert isinstance(big, jc.ObjectHandle)
    text = repr(big)
    assert "ndarray" in text and "float64" in text and "(500, 1000)" in text and "MiB" in text
    # A later cell reads it from the object store: nothing big crosses the link.
    cell = cluster.run_cell("total = big.shape[0] * big.shape[1] + big.sum()", namespace=shell.user_ns)
    assert cell.result(60).outputs["total"] == 500_000
    assert cell.sent_bytes == 0
    fetched = jc.get(big)
    assert fetched.shape == (500, 1000)


def test_output_that_cannot_leave_the_cluster_is_named(shell: Any, capsys: Any) -> None:
    res = remote(shell, "import threading\nn = 3\nlk = threading.Lock()")
    assert res.success
    assert shell.user_ns["n"] == 3 and "lk" not in shell.user_ns
    assert "`lk`" in capsys.readouterr().err


def test_out_and_no_out_choose_what_comes_back(shell: Any) -> None:
    assert remote(shell, "p = 1\nq = 2", "--out q").success
    assert "p" not in shell.user_ns and shell.user_ns["q"] == 2
    assert remote(shell, "r = 3", "--no-out").success
    assert "r" not in shell.user_ns


# 3. Last expression ---------------------------------------------------------------
def test_last_expression_is_the_cells_result(shell: Any) -> None:
    run(shell, "x = 20")
    assert remote(shell, "y = x + 1\ny * 2").result == 42
    assert remote(shell, "x * 2;").result is None


# 4. Live output ------------------------------------------------------------------
def test_print_and_stderr_stream_live_and_in_order(shell: Any, cluster: jc.Cluster, capsys: Any) -> None:
    source = (
        "import sys, time\n"
        "print('one')\nprint('two', file=sys.stderr)\nsys.stdout.flush()\n"
        "time.sleep(1.5)\nprint('three')"
    )
    arrivals: list[tuple[float, str]] = []
    cell = cluster.run_cell(source)
    cell.subscribe(lambda event, data: arrivals.append((time.monotonic(), event)))
    cell.result(60)
    done_at = next(t for t, e in arrivals if e == "done")
    first_stream = next(t for t, e in arrivals if e == "stream")
    assert done_at - first_stream > 1.0, "output must arrive while the cell still runs"
    assert cell.stdout == "one\nthree\n" and cell.stderr == "two\n"
    assert remote(shell, source).success
    captured = capsys.readouterr()
    assert captured.out.index("one") < captured.out.index("three")
    assert "two" in captured.err


def test_display_and_matplotlib_figures_are_rich_output(cluster: jc.Cluster) -> None:
    source = (
        "class Rich:\n    def _repr_html_(self):\n        return '<b>rich</b>'\n"
        "display(Rich())\n"
        "import matplotlib.pyplot as plt\nplt.plot([1, 2, 3])\n"
    )
    bundles: list[dict[str, Any]] = []
    cell = cluster.run_cell(source)
    cell.subscribe(lambda e, d: bundles.extend(b for k, b in d if k == "display") if e == "stream" else None)
    cell.result(120)
    assert any(b.get("text/html") == "<b>rich</b>" for b in bundles)
    png = [b["image/png"] for b in bundles if "image/png" in b]
    assert png and png[0][:8] == b"\x89PNG\r\n\x1a\n"


# 5. Tracebacks --------------------------------------------------------------------
def test_traceback_points_into_the_cell(shell: Any) -> None:
    run(shell, "def ratio(a, b):\n    return a / b")
    res = remote(shell, "x = 1\ny = 2\nz = ratio(x, 0)\nw = 3")
    error = res.error_in_exec
    assert isinstance(error, jc.RemoteError) and isinstance(error, ZeroDivisionError)
    text = plain(error._render_traceback_())
    assert "----> 3  z = ratio(x, 0)" in text
    assert "return a / b" in text
    assert "on the cluster (task" in text
    assert "_execute" not in text and "ray" not in text.lower().replace("ratio", "")
    assert text.rstrip().endswith("ZeroDivisionError: division by zero")
    assert "w" not in shell.user_ns


def test_failing_cell_stops_run_all(shell: Any) -> None:
    res = remote(shell, "raise ValueError('bad value')")
    assert not res.success and isinstance(res.error_in_exec, ValueError)
    with pytest.raises(ValueError, match="bad value"):
        jc.current().run_cell("raise ValueError('bad value')").result(60)  # type: ignore[union-attr]


# 6. Interrupt and timeout ---------------------------------------------------------
LOOP = "import time\nfor i in range(600):\n    open({path!r}, 'a').write('.')\n    time.sleep(0.05)\n"


@pytest.mark.parametrize("mode", ["task", "actor", "driver"])
def test_cancel_stops_the_remote_work(cluster: jc.Cluster, tmp_marker: str, mode: str) -> None:
    cell = cluster.run_cell(LOOP.format(path=tmp_marker), mode=mode, actor="looper" if mode == "actor" else None)
    deadline = time.monotonic() + 60
    while not _size(tmp_marker) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _size(tmp_marker), "the cell never started"
    cancelled_at = time.monotonic()
    cell.cancel()
    with pytest.raises(KeyboardInterrupt):
        cell.result(30)
    assert time.monotonic() - cancelled_at < 5
    size = _size(tmp_marker)
    time.sleep(0.5)
    assert _size(tmp_marker) == size, "the remote loop kept running after the cancel"
    assert cell.status == "cancelled"


def test_timeout_cancels(shell: Any) -> None:
    start = time.monotonic()
    res = remote(shell, "import time\ntime.sleep(30)", "--timeout 1")
    assert isinstance(res.error_in_exec, jc.CellTimeoutError)
    assert "--timeout 1" in str(res.error_in_exec)
    assert time.monotonic() - start < 10


def test_keyboard_interrupt_in_the_magic_cancels(shell: Any, cluster: jc.Cluster, tmp_marker: str) -> None:
    # Deliver a KeyboardInterrupt to the thread running the magic, as SIGINT does in a kernel.
    from .kernel import interrupt_thread

    main = threading.get_ident()

    def interrupt_when_started() -> None:
        while not _size(tmp_marker):
            time.sleep(0.05)
        interrupt_thread(main)

    threading.Thread(target=interrupt_when_started, daemon=True).start()
    res = remote(shell, LOOP.format(path=tmp_marker))
    assert isinstance(res.error_in_exec, KeyboardInterrupt)
    size = _size(tmp_marker)
    time.sleep(0.5)
    assert _size(tmp_marker) == size
    assert not cluster.status().data["cells"]


def test_an_interrupt_while_the_cell_is_handed_over_cancels_it(cluster: jc.Cluster, tmp_marker: str) -> None:
    """The cell is sent, then the watchers (the sidebar) hear of it: an interrupt there stops the cell, which
    nobody would otherwise wait for."""
    from jupyter_cluster import _cluster

    sent: list[Any] = []

    def interrupting(kind: str, data: Any) -> None:
        if kind == "cell":
            sent.append(data)
            raise KeyboardInterrupt

    _cluster.watchers.append(interrupting)
    try:
        with pytest.raises(KeyboardInterrupt):
            cluster.run_cell(LOOP.format(path=tmp_marker))
    finally:
        _cluster.watchers.remove(interrupting)
    (cell,) = sent
    with pytest.raises(KeyboardInterrupt):
        cell.result(30)
    assert cell.status == "cancelled" and not cluster.status().data["cells"]
    size = _size(tmp_marker)
    time.sleep(0.5)
    assert _size(tmp_marker) == size, "the remote loop kept running after the cancel"


@pytest.mark.parametrize("mode", ["task", "actor", "driver"])
def test_a_cell_cancelled_while_it_waits_for_its_input_never_runs(
    cluster: jc.Cluster, tmp_marker: str, mode: str
) -> None:
    """A driver cell's outputs exist only once it ends, so a cell reading one waits on the agent, before
    anything is submitted; cancelled then, it must not start when the input comes."""
    upstream = cluster.run_cell("import time\ntime.sleep(3)\nx = 1", mode="driver", pending_handles=True)
    reader = cluster.run_cell(
        f"open({tmp_marker!r}, 'w').write('ran')\ny = x + 1",
        namespace={"x": upstream.handles["x"]},
        mode=mode,
        actor="waiter" if mode == "actor" else None,
    )
    time.sleep(0.5)
    assert not upstream.done()
    reader.cancel()
    with pytest.raises(KeyboardInterrupt):
        reader.result(30)
    assert upstream.result(30).outputs["x"] == 1
    time.sleep(1)
    assert not _size(tmp_marker), "the cancelled cell ran once its input came"


def _size(path: str) -> int:
    try:
        with open(path) as f:
            return len(f.read())
    except FileNotFoundError:
        return 0


# 7. Infeasible requests ---------------------------------------------------------------
def test_infeasible_request_fails_at_once_naming_the_cluster(shell: Any) -> None:
    start = time.monotonic()
    res = remote(shell, "x = 1", "--gpus 1")
    assert isinstance(res.error_in_exec, jc.RequestError)
    message = str(res.error_in_exec)
    assert "GPU 1" in message and "CPU 2" in message
    assert time.monotonic() - start < 5
    res = remote(shell, "x = 1", "--resources '{\"TPU\": 4}'")
    assert "TPU 4" in str(res.error_in_exec)


# 8. Pending handles chain -----------------------------------------------------------
def test_async_outputs_chain_as_ray_dependencies(shell: Any, tmp_path: Any) -> None:
    """Two --async cells run at once (each waits for a file the test makes only once both are running), and a
    third reads both their outputs while they are pending: Ray orders it after them."""
    import os

    os.chmod(tmp_path, 0o777)
    go, started = tmp_path / "go", tmp_path / "started"
    wait = (
        f"import os, time\nopen({str(started)!r} + '-' + {{name!r}}, 'w').close()\n"
        f"while not os.path.exists({str(go)!r}):\n    time.sleep(0.05)\n"
    )
    assert remote(shell, wait.format(name="a") + "a = 20", "--async").success
    assert remote(shell, wait.format(name="b") + "b = 22", "--async").success
    pending = shell.user_ns["a"]
    assert isinstance(pending, jc.ObjectHandle) and pending.pending, "--async must not wait for the cell"
    assert "pending" in repr(pending)
    assert remote(shell, "c = a + b", "--async").success
    deadline = time.monotonic() + 60
    while not all(os.path.exists(f"{started}-{n}") for n in "ab") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert all(os.path.exists(f"{started}-{n}") for n in "ab"), "the two cells never ran at the same time"
    assert shell.user_ns["c"].pending, "the reader ran before its inputs were made"
    go.touch()
    assert jc.get(shell.user_ns["c"]) == 42
    pending.wait(10)
    deadline = time.monotonic() + 5
    while isinstance(shell.user_ns["a"], jc.ObjectHandle) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert shell.user_ns["a"] == 20, "a finished --async output resolves in place"


def test_a_quick_async_cell_binds_its_names_even_if_it_ends_before_its_area_is_shown(
    shell: Any, monkeypatch: Any
) -> None:
    """The cell is submitted before its output area is drawn; on a busy kernel it can end first. Its names
    must still become their values (a module stays a module), not handles left standing."""
    from jupyter_cluster import _magics

    drawn = _magics._CellArea.__init__

    def slow_area(self: Any, cell: Any) -> None:
        cell.result(30)  # the cell has ended before its area exists
        drawn(self, cell)

    monkeypatch.setattr(_magics._CellArea, "__init__", slow_area)
    assert remote(shell, "import graphlib as gl_quick\nready_quick = 1", "--async").success
    assert shell.user_ns["ready_quick"] == 1
    assert isinstance(shell.user_ns["gl_quick"], types.ModuleType)
    result = remote(shell, "tuple(gl_quick.TopologicalSorter({'b': {'a'}}).static_order())")
    assert result.success and result.result == ("a", "b"), result.error_in_exec


def test_async_failure_marks_its_handles(shell: Any) -> None:
    assert remote(shell, "v = 1 / 0", "--async").success
    handle = shell.user_ns["v"]
    with pytest.raises(ZeroDivisionError):
        handle.wait(30)
    assert "failed" in repr(handle)


# 9. Python versions ---------------------------------------------------------------
def test_python_mismatch_is_explained() -> None:
    from jupyter_cluster._cluster import python_mismatch

    assert python_mismatch("3.11.7", "3.11.1") is None
    text = python_mismatch("3.11.7", "3.12.0")
    assert text is not None and "3.11.7" in text and "3.12.0" in text


def test_code_refused_but_data_shipped_across_python_versions() -> None:
    from jupyter_cluster._inputs import InputLedger

    ledger = InputLedger()
    ledger.code_ok, ledger.code_reason = False, "the versions differ."

    def f() -> int:
        return 1

    shipped = ledger.prepare(["data"], {"data": {"a": [1, 2.5, "x"]}})
    assert shipped.entries[0][1] == "value"
    with pytest.raises(jc.InputError, match="carries Python code"):
        ledger.prepare(["f"], {"f": f})


def test_the_kernel_never_imports_ray(shell: Any, without_ray: None) -> None:
    assert remote(shell, "import ray\nn = len(ray.nodes())").success
    assert shell.user_ns["n"] == 1
    assert "ray" not in sys.modules


def test_annotations_in_a_cell_are_objects_as_in_the_notebook(cluster: jc.Cluster) -> None:
    """A cell's code is compiled as the notebook compiles it: no postponed annotations
    inherited from the agent's own modules (FastAPI's ``request: Request`` in a Serve
    deployment, pydantic models and dataclasses need the objects)."""
    source = "def f(x: int) -> int:\n    return x\nkind = f.__annotations__['x'].__name__"
    for mode in ("task", "driver"):
        assert cluster.run_cell(source, mode=mode).result(60).outputs["kind"] == "int"


@pytest.mark.ray
def test_the_status_says_what_the_cluster_holds(cluster: jc.Cluster) -> None:
    """What code sizes its work to (examples 03 and 06 choose their workers by it): CPUs, RAM used and available."""
    from jupyter_cluster.agent._sizing import memory_limit

    status = cluster.status()
    assert status.cpus == 2 and status.gpus == 0
    total, used, available = status.memory_total, status.memory_used, status.memory_available
    assert total is not None and used is not None and available is not None
    limit = memory_limit()
    assert limit is not None and 0.5 * limit < total <= 1.01 * limit, (total, limit)  # this machine's, as Ray sees it
    assert 0 < used < total and available == total - used
    down = jc.ClusterStatus(None, "embedded local")
    assert down.cpus is None and down.memory_available is None  # the link down: not known


def _private_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        lines = status.read().splitlines()
    for line in lines:
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no RssAnon for process {pid}")


def test_a_value_in_the_object_store_is_not_held_by_the_agent_too(cluster: jc.Cluster, tmp_marker: str) -> None:
    """The bytes of a 256 MiB input are let go once the value is in the object store: the agent does not hold a
    second copy while its cell runs (it did, in the request that brought it, until the cell ended)."""
    agent = cluster._agent.process.pid
    x = np.full(32 * 2**20, 7.0)  # 256 MiB
    base = _private_bytes(agent)
    cell = cluster.run_cell(
        f"import pathlib, time\npathlib.Path({tmp_marker!r}).write_text('running')\ntime.sleep(3)\ny = float(x[-1])",
        namespace={"x": x},
    )
    deadline = time.monotonic() + 60
    while not os.path.exists(tmp_marker):
        assert time.monotonic() < deadline, "the cell never started"
        time.sleep(0.05)
    held = _private_bytes(agent) - base
    assert cell.result(timeout=60).outputs["y"] == 7.0
    # Half the value: the agent's other work moves its memory by tens of MiB on a busy machine (78 MiB seen in CI,
    # beside the other test process); holding the value shows as all 256 MiB of it (257 MiB before the change).
    assert held < 128 * 2**20, f"the agent holds {held / 2**20:.0f} MiB more while the cell runs"
