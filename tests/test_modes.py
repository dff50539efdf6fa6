"""The ways a cell runs: task, actor, driver, map, and the resource and retry options."""

from __future__ import annotations

import os
import sys
import time
from typing import Any

import pytest

import jupyter_cluster as jc

from .conftest import remote, run


def test_actor_keeps_its_namespace_and_exports_only_out(shell: Any) -> None:
    assert remote(shell, "count = 0\nclass Counter:\n    n = 0", "--actor tally").success
    assert "count" not in shell.user_ns and "Counter" not in shell.user_ns
    assert remote(shell, "count += 5", "--actor tally").success
    assert remote(shell, "count += 1\nsnapshot = count", "--actor tally --out snapshot").success
    assert shell.user_ns["snapshot"] == 6
    assert remote(shell, "count", "--actor tally").result == 6
    # Another actor is another namespace.
    res = remote(shell, "count", "--actor other")
    assert isinstance(res.error_in_exec, NameError)


def test_actor_input_from_the_notebook_overrides(shell: Any) -> None:
    run(shell, "offset = 100")
    assert remote(shell, "base = 1", "--actor adder").success
    assert remote(shell, "base + offset", "--actor adder").result == 101


def test_actor_shows_in_status(shell: Any, cluster: jc.Cluster) -> None:
    assert remote(shell, "kept = 1", "--actor visible").success
    actors = cluster.status().data["actors"]
    assert "kept" in actors["visible"]["names"]


def test_driver_cells_have_the_ray_api_and_a_persistent_namespace(shell: Any) -> None:
    source = "@ray.remote\ndef square(x):\n    return x * x\nsquares = ray.get([square.remote(i) for i in range(4)])\n"
    assert remote(shell, source, "--driver").success
    assert shell.user_ns["squares"] == [0, 1, 4, 9]
    assert remote(shell, "ray.get(square.remote(7))", "--driver").result == 49


def test_map_runs_each_item_and_keeps_input_order(shell: Any) -> None:
    run(shell, "scale = 10")
    source = "import time, os\ntime.sleep(0.01 * (5 - x % 5))\ny = x * scale\npid = os.getpid()\nx + 1"
    res = remote(shell, source, "--map x in range(20)")
    assert res.success
    assert shell.user_ns["y"] == [x * 10 for x in range(20)]
    assert res.result == list(range(1, 21))
    assert len(set(shell.user_ns["pid"])) >= 1


def test_map_runs_in_parallel(shell: Any, tmp_marker: str) -> None:
    """The two items run at the same time: each says it started, then waits for the other to have started
    too (up to 60 s: how long a worker takes to start on a busy machine is not the point). Run one after the
    other, the first would wait in vain."""
    run(shell, f"folder = {tmp_marker!r} + '.d'")
    body = (
        "import os, time\nos.makedirs(folder, exist_ok=True)\nopen(f'{folder}/{i}', 'w').close()\n"
        "deadline = time.time() + 60\n"
        "while len(os.listdir(folder)) < 2 and time.time() < deadline:\n    time.sleep(0.05)\n"
        "saw_both = len(os.listdir(folder)) == 2"
    )
    assert remote(shell, body, "--map i in range(2)").success
    assert shell.user_ns["saw_both"] == [True, True], "the items ran one after the other"


def test_map_failure_names_the_item(shell: Any) -> None:
    res = remote(shell, "y = 10 / (x - 3)", "--map x in range(6)")
    assert isinstance(res.error_in_exec, ZeroDivisionError)
    assert "item 3" in str(res.error_in_exec)
    assert "y" not in shell.user_ns


def test_map_large_item_outputs_stay_remote(shell: Any) -> None:
    assert remote(shell, "import numpy as np\narr = np.full(200_000, k)", "--map k in [1, 2]").success
    arrs = shell.user_ns["arr"]
    assert all(isinstance(a, jc.ObjectHandle) for a in arrs)
    assert remote(shell, "sums = [float(a.sum()) for a in arr]").success
    assert shell.user_ns["sums"] == [200_000.0, 400_000.0]


def test_async_map_resolves_to_lists(shell: Any) -> None:
    assert remote(shell, "import time\ntime.sleep(1)\ny = x * 2", "--async --map x in range(5)").success
    pending = shell.user_ns["y"]
    assert isinstance(pending, jc.ObjectHandle) and pending.pending
    pending.wait(60)
    assert jc.get(pending) == [0, 2, 4, 6, 8]
    assert remote(shell, "total = sum(y)").success
    assert shell.user_ns["total"] == 20


def test_resource_options_reach_ray(shell: Any) -> None:
    source = "import ray\nctx = ray.get_runtime_context()\nres = ctx.get_assigned_resources()"
    assert remote(shell, source, "--cpus 2 --memory 64MiB").success
    assert shell.user_ns["res"]["CPU"] == 2.0
    assert remote(shell, source, "--cpus 0.5").success
    assert shell.user_ns["res"]["CPU"] == 0.5


def test_retries_rerun_a_task_whose_worker_died(shell: Any, tmp_marker: str) -> None:
    run(shell, f"marker = {tmp_marker!r}")
    source = (
        "import os\nif not os.path.exists(marker):\n    open(marker, 'w').close()\n    os._exit(1)\nsurvived = True\n"
    )
    assert remote(shell, source, "--retries 1").success
    assert shell.user_ns["survived"] is True
    os.remove(tmp_marker)
    res = remote(shell, source, "--retries 0")
    assert isinstance(res.error_in_exec, jc.WorkerDiedError)
    said = str(res.error_in_exec)  # the worker's exit code when its last words came in time, else Ray's "died"
    assert ("died" in said or "exited with code 1 (os._exit)" in said) and "did not retry" in said, said


def test_submit_put_get_wait(cluster: jc.Cluster, tmp_marker: str) -> None:
    """``jc.wait`` returns what is ready: two calls wait for a file made only once the first wait has returned (not
    on how soon a worker starts: a fresh one took over a second beside the browser tests)."""

    def slow(marker: str, value: int) -> int:
        import os
        import time

        while marker and not os.path.exists(marker):
            time.sleep(0.05)
        return value

    handles = [jc.submit(slow, m, v) for m, v in [(tmp_marker, 1), ("", 2), (tmp_marker, 3)]]
    ready, not_ready = jc.wait(handles, num_returns=1, timeout=30)
    assert [jc.get(h) for h in ready] == [2] and len(not_ready) == 2
    open(tmp_marker, "w").close()
    ready, not_ready = jc.wait(handles, num_returns=3, timeout=30)
    assert not not_ready and sorted(jc.get(ready)) == [1, 2, 3]
    stored = jc.put({"k": list(range(10))})
    assert jc.get(jc.submit(lambda d: sum(d["k"]), stored)) == 45
    assert jc.get(jc.map(lambda x: x + 1, [1, 2, 3])) == [2, 3, 4]


def test_put_handle_reads_as_a_value_in_a_cell(shell: Any) -> None:
    run(shell, "import jupyter_cluster as jc\nh = jc.put(list(range(100)))")
    assert remote(shell, "s = sum(h)").success
    assert shell.user_ns["s"] == 4950


@pytest.mark.parametrize("options", ["--cpus 1 --gpus 0", "--out a,b", "--retries 2 --timeout 30"])
def test_options_combine(shell: Any, options: str) -> None:
    assert remote(shell, "a = 1\nb = 2", options).success
    assert shell.user_ns["b"] == 2


def test_ray_objects_stay_on_the_cluster(shell: Any, without_ray: None) -> None:
    source = "@ray.remote\ndef twice(x):\n    return 2 * x\nrefs = [twice.remote(i) for i in range(3)]"
    assert remote(shell, source, "--driver").success
    assert isinstance(shell.user_ns["twice"], jc.ObjectHandle)
    assert isinstance(shell.user_ns["refs"], jc.ObjectHandle)
    assert remote(shell, "ray.get(refs) + [ray.get(twice.remote(5))]", "--driver").result == [0, 2, 4, 10]
    assert "ray" not in sys.modules


def test_imports_in_a_map_cell_do_not_become_lists(shell: Any) -> None:
    run(shell, "import math")
    assert remote(shell, "import math\nr = math.sqrt(v)", "--map v in [4, 9]").success
    assert shell.user_ns["r"] == [2.0, 3.0]
    assert shell.user_ns["math"].sqrt(16) == 4.0


def test_status_answers_at_once_while_an_actor_is_busy(cluster: jc.Cluster) -> None:
    assert cluster.run_cell("ready = 1", mode="actor", actor="busy").result(60)
    assert "names: ray, ready" in str(cluster.status())  # what it held, asked while it was idle
    cell = cluster.run_cell("import time\ntime.sleep(30)", mode="actor", actor="busy")
    deadline = time.monotonic() + 30
    while cell.cell_id not in str(cluster.status()) and time.monotonic() < deadline:
        time.sleep(0.1)
    start = time.monotonic()
    status = cluster.status()
    assert time.monotonic() - start < 3, "status waited for the busy actor"
    assert status.data is not None and status.data["actors"]["busy"]["running"] == cell.cell_id
    assert f"running cell {cell.cell_id}; names before it: ray, ready" in str(status)
    cell.cancel()
    with pytest.raises(KeyboardInterrupt):
        cell.result(30)
