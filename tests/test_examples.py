"""Every notebook in examples/ runs top to bottom in a real kernel, without an error.

Each notebook starts its own embedded cluster in its own kernel (through nbclient), so
this module does not use the shared test cluster. Besides "no cell raised", what each
notebook's prose says is looked for in its outputs (the notebooks hold no asserts of their
own): the texts of EXPECTED, the claims :func:`_claims` reads numbers for, and the static
views :func:`_static_views` looks for in the HTML a reader without a kernel sees.
"""

from __future__ import annotations

import importlib.util
import json
import re
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

#: Text each notebook must print (in stdout or a displayed value), besides running cleanly: what its prose says.
EXPECTED: dict[str, list[str]] = {
    "01-quickstart.ipynb": [
        "Attached to <Cluster embedded local",
        "--map: 4/4 items done in",  # the --map bar's summary: "Cell In[n] --map: 4/4 items done in ..."
        "squares: [0, 1, 4, 9]",
        "of the 4 tasks were running at the same moment",  # how many: _claims
        "<remote ndarray int64 (1000000,) 7.6 MiB on ",
        "the four partial sums add up to 499999500000; the array fetched here sums to 499999500000",
        "the 0.2 s task finished; 2 still running",  # in the order they finish, not the order submitted
        "the 0.7 s task finished; 1 still running",
        "the 1.2 s task finished; 0 still running",
        "(<pending remote value `a` of cell",  # the --async cells returned before their matrices existed
        "; bound a]",  # ... and their lines say when they were done
        "<remote ndarray float64 (500, 500) 1.9 MiB on ",
        "the sum of the product: 250,000,000",
        "[1, 1, 1, 1]",  # Ray's quickstart in a driver cell: its four actors' counts
        "counter: on ",  # the status card lists the --actor namespace
        "Stopped the embedded cluster.",
    ],
    "02-data-and-objects.ipynb": [
        "<pending remote value `samples` of cell",  # the --async cell returned at once
        "over 8,000,000 samples",
        "<remote ndarray float64 (8000000,) 61.0 MiB on ",  # the handle of the array that stayed on the cluster
        "--map: 8/8 items done in",
        "the mean from 8 partial sums: 2.999",
        "ndarray (8000000,) 61.0 MiB",  # fetched on purpose
        "objects held for this notebook:",
        "Stopped the embedded cluster.",
    ],
    "03-train-torch.ipynb": [
        "GiB free",  # what the cluster holds, and the run's choice: two workers, or local mode (in a small box)
        "<remote Dataset",  # a handle, not a copy
        "<TrainingView jc.train_torch(train_from_dataset): done>",  # the live widget, in its final state
        "[a picture of jc.train_torch(train_from_dataset)'s curves]",  # the static picture it leaves
        "<TrainResult done in",
        "checkpoint files: ['model.pt']",
        "test accuracy of the checkpoint, on 450 held-out digits:",  # how good: _claims
        "Stopped the embedded cluster.",
    ],
    "04-tune-asha.ipynb": [
        "<TrialsView jc.tune(train_digits): done>",
        "[a picture of jc.tune(train_digits)'s curves]",  # the static picture the view leaves when it ends
        "<TuneResult 8 trials in",
        "best config: {'lr':",
        "stopped early by ASHA",  # how many: _claims
        "Stopped the embedded cluster.",
    ],
    "05-tune-pbt.ipynb": [
        "<TrialsView jc.tune(train_pbt): done>",
        "[a picture of jc.tune(train_pbt)'s curves]",
        "<TuneResult 4 trials in",
        "trial  config/lr  config/momentum",
        "the best checkpoint, evaluated here:",
        "Stopped the embedded cluster.",
    ],
    "07-serve.ipynb": [
        "deployed: ApplicationStatus.RUNNING",
        "Serve is at http://127.0.0.1:8000",
        "agree with the notebook's model",
        "Serve application digits: RUNNING",  # %cluster status lists what the driver started
        "port forwards: 1",
        "Serve's actors left: []",
        "Stopped the embedded cluster.",
    ],
    "08-rllib-ppo.ipynb": [
        "iteration | episode return | episodes | seconds",  # the live table's head, then a row per iteration
        "        8 |",
        "mean episode return: ",
        "at the first iteration,",
        "Stopped the embedded cluster.",
    ],
    "09-ssh.ipynb": [  # without JC_EXAMPLE_HEAD, as on Binder: the cells on the embedded cluster
        "No SSH head is set (JC_EXAMPLE_HEAD)",
        "Attached to <Cluster embedded local",
        "running on ",
        "step 7 at ",  # the --async cell's last line, in its own output though the notebook detached
        "Detached from session ",
        "detached at ",
        "attached again at ",
        "the cell's output: 8 steps",
        "says: hello from the head",
        "Stopped the embedded cluster.",
    ],
    "10-watching.ipynb": [
        "<Dashboard of embedded local: 1 node(s), closed>",  # closed at the end: its snapshot, and a picture
        "[a picture of the dashboard of embedded local]",
        "<remote ndarray float64 (25000000,) 190.7 MiB",  # the block kept in the object store
        "--map: 24/24 items done in",
        "24 items, 6.0 CPU-seconds in all",
        "remote loop: 100% 20/20",  # a tqdm bar drawn on the cluster, in its last state
        ") hello from task 2",  # a task's prints, with Ray's prefix, in the driver cell that started it
        "(Greeter pid=",
        ", after it ended] (late pid=",  # %cluster logs: the line no running cell could take
        "<RemoteCell the long job task",
        "object store 190.7 MiB used",  # the status card
        "running cells: 1",
        "after cancel(): cancelled; CellInterrupted: cancelled the remote cell (the long job, task)",
        "Stopped the embedded cluster.",
    ],
    "06-ddp-port.ipynb": [
        "GiB free: DDP over",  # two ranks, or one in a small box
        "<TrainingView jc.train_torch(train): done>",
        "[a picture of jc.train_torch(train)'s curves]",
        "<TrainResult done in",
        "rank 0's last checkpoint: test accuracy",  # how good: _claims
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
    _claims(printed, path.name)
    _static_views(nb, path.name)
    return nb


def _claims(printed: str, name: str) -> None:
    """The claims of a notebook's prose that take a number read from its output."""
    if name == "01-quickstart.ipynb":  # "whether the tasks ran in parallel": more than one at once
        at_once = re.search(r"(\d) of the 4 tasks were running at the same moment", printed)
        assert at_once and int(at_once.group(1)) >= 2, f"the quickstart's tasks did not overlap:\n{printed}"
    if name == "04-tune-asha.ipynb":  # "the trials ASHA stopped early"
        stopped = re.search(r"(\d+) stopped early by ASHA", printed)
        assert stopped and int(stopped.group(1)) >= 1, f"ASHA stopped no trial:\n{printed}"
    if name in ("03-train-torch.ipynb", "06-ddp-port.ipynb"):  # "it classifies the held-out digits"
        accuracy = re.search(r"test accuracy (?:of the checkpoint, on 450 held-out digits: )?(0\.\d+)", printed)
        assert accuracy and float(accuracy.group(1)) >= 0.8, f"{name}: the checkpoint does not classify:\n{printed}"
        two = "training on 2 workers" in printed or "DDP over 2 ranks" in printed
        one = "local mode" in printed or "DDP over 1 rank" in printed
        assert two != one, f"{name}: says neither (or both) of the run's choices:\n{printed}"
    if name == "05-tune-pbt.ipynb":  # "after iterations 2 and 4, the two weaker trials go on with another lr"
        rows = {int(m.group(1)): m.group(2).split() for m in re.finditer(r"^(\d)\s+([\d. ]+)$", printed, re.M)}
        for before in (2, 4):
            changed = sum(a != b for a, b in zip(rows.get(before, []), rows.get(before + 1, [])))
            assert changed == 2, f"PBT changed {changed} trials' lr after iteration {before}, not 2:\n{printed}"


def _static_views(nb: Any, name: str) -> None:
    """Read without a kernel (converted to HTML), every widget shows what it last showed: no
    live-only output is left where a snapshot belongs."""
    from nbconvert import HTMLExporter

    page, _ = HTMLExporter().from_notebook_node(nb)
    if name == "01-quickstart.ipynb":  # its two --map bars, ended as summaries; the status card
        assert page.count('class="jc-progress jc-done"') >= 2, "the progress bars did not end as summaries"
        assert 'class="jc-card jc-status"' in page
    if name == "10-watching.ipynb":  # the closed dashboard's snapshot, the --map and tqdm bars, the status card
        assert 'class="jc-dashboard-snapshot"' in page and "(head)" in page, "no dashboard snapshot in the HTML"
        assert 'class="jc-progress jc-done"' in page, "the --map bar did not end as a summary"
        assert 'class="jc-remote-bar"' in page and 'class="jc-card jc-status"' in page
    # A live view that ended leaves a picture (SVG) for readers without a kernel; a matplotlib figure, a PNG.
    kinds = {kind for c in nb.cells for o in c.get("outputs", []) for kind in o.get("data", {})}
    if name.startswith(("04-", "05-", "10-")):
        assert "image/svg+xml" in kinds, f"{name}: its live view left no picture"
    if name.startswith(("02-", "08-")):
        assert "image/png" in kinds, f"{name}: its figure was not drawn"
    # A run's widget keeps its last state beside the widget view (the bundle's text/html: what a
    # reader without widgets shows; nbconvert draws the widget itself from the saved state).
    snapshots = "\n".join(
        o["data"]["text/html"]
        for c in nb.cells
        for o in c.get("outputs", [])
        if "jc-run-snapshot" in o.get("data", {}).get("text/html", "")
    )
    if name.startswith(("03-", "06-")):  # the training widget's final table: every worker's last report
        assert 'class="jc-train-table"' in snapshots and "done" in snapshots, snapshots
        printed = "\n".join(text for cell in nb.cells if cell.cell_type == "code" for text in _texts(cell))
        if "training on 2 workers" in printed or "DDP over 2 ranks" in printed:
            assert "rank 1" in snapshots, snapshots
    if name.startswith(("03-", "06-")):
        assert "image/svg+xml" in kinds, f"{name}: its training view left no picture"
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
