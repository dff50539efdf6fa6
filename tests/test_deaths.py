"""A cell whose worker dies says what killed it: an exit code, a signal, memory; and the next cell runs.

Exit codes and signals on the shared cluster; memory in a box of its own (slow tier): a kernel and its embedded
cluster in a 3 GiB memory cgroup, a cell that allocates 5 GiB, and an actor cell that does, as a notebook would.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from .conftest import remote
from .test_binder import CGROUP_V1, _binder_kernel, boxed_kernel, remove_box, skip_without_boxes

pytestmark = [pytest.mark.ray, pytest.mark.timeout(300)]


def _error(shell: Any, body: str, options: str = "--retries 0") -> str:
    result = remote(shell, body, options)
    assert not result.success
    return str(result.error_in_exec)


def test_an_exit_code_and_a_fatal_signal_are_named_and_the_next_cell_runs(shell: Any) -> None:
    said = _error(shell, "import os\nos._exit(3)")
    assert "exited with code 3 (os._exit)" in said, said
    said = _error(shell, "import ctypes\nctypes.string_at(0)")
    assert "crashed with SIGSEGV (segmentation fault)" in said, said
    assert remote(shell, "after = 40 + 2").success and shell.user_ns["after"] == 42


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_cell_that_needs_more_memory_than_its_box_fails_within_a_minute_saying_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import nbformat
    from nbclient import NotebookClient
    from nbformat.v4 import new_code_cell, new_notebook

    skip_without_boxes()
    cgroup = CGROUP_V1 / f"jc-deaths-{os.getpid()}"
    cgroup.mkdir()
    nb = new_notebook(
        cells=[
            new_code_cell("%load_ext jupyter_cluster\n%cluster local --cpus 2\nimport time"),
            new_code_cell("started = time.time()"),
            new_code_cell("%%remote\nimport numpy as np\nbig = np.ones(5 * 2**30 // 8)\ntotal = float(big.sum())"),
            new_code_cell("print('failed after', round(time.time() - started), 's')"),
            new_code_cell("%%remote\nsmall = 40 + 2"),
            new_code_cell("print('next cell:', small)"),
            new_code_cell("%%remote --actor holder\nimport numpy as np\nbig = np.ones(5 * 2**30 // 8)"),
            new_code_cell("%%remote --actor holder\nsmall = 2"),
            new_code_cell(
                "import jupyter_cluster as jc\n"
                "def greedy(config):\n"
                "    import numpy as np\n"
                "    big = np.ones(5 * 2**30 // 8)\n"
                "result = jc.train_torch(greedy, num_workers=1)\n"
                "print('run error:', result.error)"
            ),
            new_code_cell("%%remote\nafter_the_run = 1"),
            new_code_cell(
                "def hog(config):\n"
                "    import numpy as np\n"
                "    from ray import tune\n"
                "    big = np.ones(config['size'])\n"
                "    tune.report({'loss': float(big.size)})\n"
                "sweep = jc.tune(hog, {'size': jc.grid_search([8, 5 * 2**30 // 8])}, metric='loss', mode='min')\n"
                "print('trial errors:', list(sweep.errors.values()))\n"
                "print('best:', sweep.best_result['loss'])"
            ),
            new_code_cell("%cluster down"),
        ]
    )
    try:
        (cgroup / "memory.limit_in_bytes").write_text(str(3 * 2**30))
        kernel = _binder_kernel(tmp_path, cgroup, monkeypatch)
        NotebookClient(nb, timeout=300, kernel_name=kernel, allow_errors=True).execute()
    finally:
        remove_box(cgroup)
    nbformat.write(nb, tmp_path / "deaths.ipynb")
    outputs = [c.get("outputs", []) for c in nb.cells]
    task_error = next(o for o in outputs[2] if o["output_type"] == "error")
    assert task_error["ename"] == "WorkerDiedError", json.dumps(outputs[2])[:2000]
    message = task_error["evalue"]
    assert "ran out of memory" in message and "node" in message and "GiB" in message and "--memory" in message, message
    assert "It was not retried" in message and len(message) < 500, message
    took = int("".join(o.get("text", "") for o in outputs[3]).split("after ")[1].split(" s")[0])
    assert took < 60, f"the memory death took {took} s to say"
    assert "next cell: 42" in "".join(o.get("text", "") for o in outputs[5])
    actor_error = next(o for o in outputs[6] if o["output_type"] == "error")
    assert "holder" in actor_error["evalue"] and "ran out of memory" in actor_error["evalue"], actor_error["evalue"]
    assert not [o for o in outputs[7] if o["output_type"] == "error"], "the next cell of the actor's name runs"
    # A run's failure is its result's error (as Ray Train's Result.error), and what its view says.
    printed = "".join(o.get("text", "") for o in outputs[8] if o["output_type"] == "stream")
    assert "run error: training failed: worker 0: it ran out of memory" in printed, [
        (o["output_type"], o.get("text", ""), o.get("evalue", ""), o.get("data", {}).get("text/plain", ""))
        for o in outputs[8]
    ]
    assert "resources_per_worker" in printed, "the advice names the run's own option"
    html = [o.get("data", {}).get("text/html", "") for o in outputs[8]]
    view = next(h for h in html if "jc-run-snapshot" in h)
    assert "ran out of memory" in view and "HealthCheck" not in view, view
    assert not [o for o in outputs[9] if o["output_type"] == "error"], "the cell after the run runs"
    # A sweep's trial that ran out of memory is a failed trial, named so; the sweep goes on with the others.
    assert not [o for o in outputs[10] if o["output_type"] == "error"], outputs[10]
    printed = "".join(o.get("text", "") for o in outputs[10] if o["output_type"] == "stream")
    assert "trial errors: ['it ran out of memory" in printed and "best: 8.0" in printed, printed


#: A kernel in a box as a container sees it: the memory cgroup $1 mounted over /sys/fs/cgroup/memory (so Ray's
#: memory monitor reads the box's limit and use, as in Docker), in a mount namespace of its own.
CONTAINER = """#!/bin/sh
echo $$ > "$1/cgroup.procs"
exec unshare -m sh -c 'mount --bind "$0" /sys/fs/cgroup/memory && exec "$1" -m ipykernel_launcher -f "$2"' \\
    "$1" {python} "$2"
"""


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_worker_rays_memory_monitor_kills_is_named_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Ray's memory monitor, not the kernel, kills a worker that grows slowly past Ray's threshold (here 60% of a
    3 GiB box that Ray sees as a container's): the cell fails at once saying so, with what the node had and used."""
    import sys

    from nbclient import NotebookClient
    from nbformat.v4 import new_code_cell, new_notebook

    skip_without_boxes()
    cgroup = CGROUP_V1 / f"jc-monitor-{os.getpid()}"
    cgroup.mkdir()
    wrapper = CONTAINER.format(python=sys.executable)
    kernel = boxed_kernel(tmp_path, cgroup, monkeypatch, wrapper, "python3-container", "container")
    monkeypatch.setenv("RAY_memory_usage_threshold", "0.6")
    grow = (
        "%%remote\nimport time\nimport numpy as np\nheld = []\n"
        "for _ in range(40):\n    held.append(np.ones(64 * 2**20 // 8))\n    time.sleep(0.1)"
    )
    nb = new_notebook(
        cells=[
            new_code_cell("%load_ext jupyter_cluster\n%cluster local --cpus 2 --object-store 200MiB"),
            new_code_cell(grow),
            new_code_cell("%%remote\nsmall = 40 + 2"),
            new_code_cell("%cluster down"),
        ]
    )
    try:
        (cgroup / "memory.limit_in_bytes").write_text(str(3 * 2**30))
        NotebookClient(nb, timeout=300, kernel_name=kernel, allow_errors=True).execute()
    finally:
        remove_box(cgroup)
    outputs = [c.get("outputs", []) for c in nb.cells]
    assert not [o for o in outputs[0] if o["output_type"] == "error"], outputs[0]
    error = next((o for o in outputs[1] if o["output_type"] == "error"), None)
    assert error is not None, f"the growing cell did not fail: {outputs[1]}"
    message = error["evalue"]
    assert "ran out of memory: Ray's memory monitor killed its worker on node" in message, message
    assert "GB were in use" in message and "--memory" in message, message
    assert not [o for o in outputs[2] if o["output_type"] == "error"], "the next cell runs"
