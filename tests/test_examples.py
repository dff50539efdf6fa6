"""Every notebook in examples/ runs top to bottom in a real kernel, without an error.

Each notebook starts its own embedded cluster in its own kernel (through nbclient), so
this module does not use the shared test cluster. Besides "no cell raised", the
quickstart's own checks are looked for in its output: the parallel timing checks,
the counter actors and the map-reduce.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.timeout(900)

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def _run_example() -> Any:
    """scripts/run_example.py as a module (it is a script, not part of the package)."""
    spec = importlib.util.spec_from_file_location("run_example", EXAMPLES.parent / "scripts" / "run_example.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


#: The example notebooks, as scripts/run_example.py --all finds them.
NOTEBOOKS: list[Path] = _run_example().examples()

#: Text each notebook must print (in stdout or a displayed value), besides running cleanly.
EXPECTED: dict[str, list[str]] = {
    "01-quickstart.ipynb": [
        "Attached to <Cluster embedded local",
        "parallel tasks: OK",
        "parallel ray.remote tasks: OK",
        "499999500000",
        "a 1.2 s task finished; 0 still running",
        "<remote ndarray float64 (500, 500)",
        "counter actor: 4",
        "ray actor counter: 4",
        "both ways agree",
        "Cell In[",  # the --map bar's summary: "Cell In[n] --map: 200/200 items done in ..."
        "200/200 items done in",
        "jc.map(work): 8/8 calls done in",
        "8 calls finished",
        "remote loop: 100% 20/20",
        "dashboard: 1 node(s)",
        "Stopped the embedded cluster.",
    ],
    "02-data-and-objects.ipynb": [
        "<remote ndarray float64 (8000000,)",  # the handle of the array that stayed on the cluster
        "over 8,000,000 samples",
        "8 partial sums; together",
        "product trace: 6000000.0",
        "[0, 1, 4, 9, 16, 25, 36, 49, 64, 81, 100, 121]",
        "Stopped the embedded cluster.",
    ],
    "03-train-torch.ipynb": [
        "<TrainingView jc.train_torch(train_func): done>",  # the live widget, in its final state
        "(rank 0) epoch 1: loss",  # each worker's prints, with its rank
        "(rank 1) epoch 6: loss",
        "<TrainResult done in",
        "checkpoint files: ['model.pt']",
        "test accuracy of the fetched checkpoint:",
        "<TrainingView jc.train_torch(creators): done>",
        "creator-style final val accuracy:",
        "<remote Dataset",  # a handle, not a copy
        "<TrainingView jc.train_torch(train_from_dataset): done>",
        "rows per worker in an epoch:",
        "Ray Data training accuracy:",
        "Stopped the embedded cluster.",
    ],
    "04-tune-asha.ipynb": [
        "<TrialsView jc.tune(train_digits): done>",
        "<TuneResult 8 trials in",
        "best config: {'lr':",
        "stopped early by ASHA",
        "Stopped the embedded cluster.",
    ],
    "05-tune-pbt.ipynb": [
        "<TrialsView jc.tune(train_pbt): done>",
        "<TuneResult 4 trials in",
        "the best checkpoint, evaluated here:",
        "Stopped the embedded cluster.",
    ],
    "07-serve.ipynb": [
        "deployed: ApplicationStatus.RUNNING",
        "Serve is at http://127.0.0.1:8000",
        "agree with the notebook's model",
        "Serve application digits: RUNNING",  # %cluster status lists what the driver started
        "port forwards: 1",
        "left behind: [] {}",
        "Stopped the embedded cluster.",
    ],
    "08-rllib-ppo.ipynb": [
        "iteration | episode return | episodes | seconds",  # the live table's head, then a row per iteration
        "        8 |",
        "at the first iteration,",
        "Stopped the embedded cluster.",
    ],
    "09-ssh.ipynb": [  # without JC_EXAMPLE_HEAD, as on Binder: the SSH steps skipped, the cells on the embedded cluster
        "No SSH head is set (JC_EXAMPLE_HEAD)",
        "Attached to <Cluster embedded local",
        "running on ",
        "step 7",
        "the cell's output: 8 steps",
        "says: hello from the head",
        "Stopped the embedded cluster.",
    ],
    "10-watching.ipynb": [
        "<Dashboard of embedded local",
        "<remote ndarray float64 (25000000,) 190.7 MiB",  # the block kept in the object store
        "60/60 items done in",
        ") hello from task 2",  # a task's prints, with Ray's prefix, in the driver cell that started it
        "(Greeter pid=",
        ", after it ended] (late pid=",  # %cluster logs: the line no running cell could take
        "object store 190.7 MiB used",  # the status card
        "task running>]",
        "after cancel(): cancelled",
        "reading its output: KeyboardInterrupt: cancelled the remote cell",
        "dashboard: 1 node(s)",
        "Stopped the embedded cluster.",
    ],
    "06-ddp-port.ipynb": [
        "<TrainingView jc.train_torch(train): done>",
        "<TrainResult done in",
        "rank 0's last checkpoint: test accuracy",
        "Stopped the embedded cluster.",
    ],
}


@pytest.fixture(scope="session")
def python3_kernel() -> str:
    """The ``python3`` kernel nbclient runs; installed into this environment if missing."""
    from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel

    try:
        KernelSpecManager().get_kernel_spec("python3")
    except NoSuchKernel:
        subprocess.run([sys.executable, "-m", "ipykernel", "install", "--sys-prefix"], check=True)
        KernelSpecManager().get_kernel_spec("python3")
    return "python3"


def _texts(cell: Any) -> list[str]:
    texts = []
    for output in cell.get("outputs", []):
        if output.get("output_type") == "stream":
            texts.append(output.get("text", ""))
        elif "data" in output:
            texts.append(str(output["data"].get("text/plain", "")))
    return texts


def test_there_are_examples() -> None:
    assert any(p.name == "01-quickstart.ipynb" for p in NOTEBOOKS)


#: The most a committed example may weigh: its outputs without the BokehJS bundle (an executed quickstart with it
#: is 8 MB).
COMMITTED_SIZE = 1024 * 1024


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_the_committed_outputs_are_of_the_current_code(path: Path) -> None:
    """Each example is committed with the outputs of a clean run of its current code (no kernel needed: the digest
    of its code cells, kept in its metadata by ``scripts/run_example.py --commit``), small enough for a code host."""
    runner = _run_example()
    nb = json.loads(path.read_text())
    fix = f"run `python scripts/run_example.py --commit {path.relative_to(EXAMPLES.parent)}` and commit the result"
    ran = nb["metadata"].get("jupyter_cluster", {})
    assert ran.get("code") == runner.code_digest(nb), f"{path.name}: its outputs are not of its current code: {fix}"
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    assert all(c.get("execution_count") for c in code), f"{path.name}: a code cell has no output of a run: {fix}"
    outputs = [o for c in code for o in c.get("outputs", [])]
    assert not [o for o in outputs if o["output_type"] == "error"], f"{path.name}: an error was committed"
    live = {kind for o in outputs for kind in o.get("data", {}) if kind in runner.LIVE_ONLY}
    assert not live and "widgets" not in nb["metadata"], f"{path.name}: live-only outputs were committed: {live}"
    assert path.stat().st_size < COMMITTED_SIZE, f"{path.name}: {path.stat().st_size} bytes"


def test_commit_writes_a_clean_run_without_live_only_outputs_and_leaves_a_failing_one(
    python3_kernel: str, tmp_path: Path
) -> None:
    """``run_example.py --commit``: a clean notebook gets its outputs (live-only kinds dropped, a display of only
    those dropped whole) and its code's digest; a failing one is left as it was, its error in NAME.out.ipynb."""
    import nbformat
    from nbformat.v4 import new_code_cell, new_notebook

    runner = _run_example()
    live = "{'application/javascript': 'alert(1)', 'text/plain': 'kept'}"
    good, bad = tmp_path / "good.ipynb", tmp_path / "bad.ipynb"
    nbformat.write(
        new_notebook(
            cells=[
                new_code_cell("x = 6 * 7\nx"),
                new_code_cell(f"display({live}, raw=True)"),
                new_code_cell("display({'application/javascript': 'alert(2)'}, raw=True)"),
            ]
        ),
        good,
    )
    nbformat.write(new_notebook(cells=[new_code_cell("y = 1"), new_code_cell("1 / 0")]), bad)
    before = bad.read_bytes()

    assert runner.main([str(good), str(bad), "--commit"]) == 1, "a failing notebook fails the run"

    assert bad.read_bytes() == before, "a failing notebook is not committed"
    failed = nbformat.read(tmp_path / "bad.out.ipynb", as_version=4)
    assert failed.cells[1].outputs[0]["ename"] == "ZeroDivisionError"
    ran = nbformat.read(good, as_version=4)
    assert ran.metadata["jupyter_cluster"]["code"] == runner.code_digest(ran)
    assert ran.cells[0].outputs[0]["data"] == {"text/plain": "42"}
    assert [o["data"] for o in ran.cells[1].outputs] == [{"text/plain": "kept"}]
    assert ran.cells[2].outputs == [], "a display of only live-only kinds is dropped"


#: The notebooks of the slow tier (--runslow): minutes each on two cores, of training and sweeps whose paths the
#: default run covers through test_runs.py (jc.train_torch, jc.tune) and test_browser.py (their widgets); 09
#: without a head (its SSH steps skipped; test_example_ssh.py runs every step with one); and 10, whose views
#: test_widgets.py, test_worker_output.py and test_sidebar.py check one by one.
SLOW = {"03-train-torch", "04-tune-asha", "05-tune-pbt", "06-ddp-port", "09-ssh", "10-watching"}


@pytest.mark.parametrize(
    "path", [pytest.param(p, id=p.stem, marks=[pytest.mark.slow] if p.stem in SLOW else []) for p in NOTEBOOKS]
)
def test_example_runs(path: Path, python3_kernel: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("JC_EXAMPLE_HEAD", raising=False)  # 09 over SSH: tests/test_example_ssh.py
    execute(path, python3_kernel, tmp_path, EXPECTED.get(path.name, []))


def execute(path: Path, kernel: str, tmp_path: Path, expected: list[str]) -> Any:
    """Run the notebook at ``path`` in a fresh ``kernel``: no cell may fail, each must run, and each of ``expected``
    must be printed. Returns the executed notebook."""
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(nb, timeout=600, kernel_name=kernel, resources={"metadata": {"path": str(EXAMPLES)}})
    try:
        client.execute()
    except CellExecutionError as exc:
        nbformat.write(nb, tmp_path / path.name)
        pytest.fail(f"{path.name}: a cell failed (executed copy in {tmp_path / path.name}):\n{exc}")

    errors = [o for c in nb.cells for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert not errors, f"{path.name}: error outputs: {errors}"
    unrun = [i for i, c in enumerate(nb.cells) if c.cell_type == "code" and c.get("execution_count") is None]
    assert not unrun, f"{path.name}: code cells that did not run: {unrun}"

    printed = "\n".join(text for cell in nb.cells if cell.cell_type == "code" for text in _texts(cell))
    missing = [text for text in expected if text not in printed]
    assert not missing, f"{path.name}: expected output not found: {missing}\n--- output ---\n{printed}"
    _static_views(nb, path.name)
    return nb


def _static_views(nb: Any, name: str) -> None:
    """Read without a kernel (converted to HTML), every widget shows what it last showed: no
    live-only output is left where a snapshot belongs."""
    from nbconvert import HTMLExporter

    page, _ = HTMLExporter().from_notebook_node(nb)
    if name == "01-quickstart.ipynb":
        assert 'class="jc-dashboard-snapshot"' in page and "(head)" in page, "no dashboard snapshot in the HTML"
        assert page.count('class="jc-progress jc-done"') >= 2, "the progress bars did not end as summaries"
        assert 'class="jc-remote-bar"' in page and 'class="jc-card jc-status"' in page
    # A run's widget keeps its last state beside the widget view (the bundle's text/html: what a
    # reader without widgets shows; nbconvert draws the widget itself from the saved state).
    snapshots = "\n".join(
        o["data"]["text/html"]
        for c in nb.cells
        for o in c.get("outputs", [])
        if "jc-run-snapshot" in o.get("data", {}).get("text/html", "")
    )
    if name.startswith(("03-", "06-")):  # the training widget's final table: every worker's last report
        assert 'class="jc-train-table"' in snapshots and "rank 1" in snapshots and "done" in snapshots, snapshots
    if name.startswith(("04-", "05-")):  # the trials widget's final table
        assert 'class="jc-trials-table"' in snapshots and "terminated" in snapshots, snapshots
    if name.startswith("04-"):
        assert "stopped early" in snapshots, "ASHA's early stops are not marked"
    views = [
        o
        for c in nb.cells
        for o in c.get("outputs", [])
        if "application/vnd.jupyter.widget-view+json" in o.get("data", {})
    ]
    assert all("text/html" in o["data"] for o in views), "a widget output without a static snapshot"
