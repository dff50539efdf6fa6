"""Cells that never lie, never hang and never lose a variable, through a real kernel.

Each test is one way a user's cell can go wrong: an upstream that failed, a module
the kernel has not loaded, an output the notebook cannot load, a typo in ``--out``,
a handle whose cluster is gone, work that will not stop, a worker that dies, a deep
recursion, a module from the notebook's own folder, a bad option, and an ``--async``
cell that prints a lot. Each checks what the user sees (at most ~15 lines of our
own words, never this package's or Ray's frames) and that nothing is lost.
"""

from __future__ import annotations

import json
import shutil
import sysconfig
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from .kernel import Kernel, error_text, result, text

pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def folder(tmp_path_factory: Any) -> Path:
    """The notebook's folder: the kernel's working directory."""
    return Path(tmp_path_factory.mktemp("notebook"))


@pytest.fixture(scope="module")
def kernel(folder: Path) -> Iterator[Kernel]:
    k = Kernel(cwd=str(folder))
    k.ok("%load_ext jupyter_cluster\n%cluster local --cpus 2\nimport jupyter_cluster as jc", timeout=180)
    yield k
    k.stop()


def _short(message: str, limit: int = 15) -> None:
    lines = message.strip().splitlines()
    assert len(lines) <= limit, f"{len(lines)} lines:\n{message}"
    assert "jupyter_cluster/" not in message and "/ray/" not in message, message


# 1. An upstream that failed ---------------------------------------------------------
def test_a_cell_reading_a_failed_upstream_fails_with_its_error(kernel: Kernel) -> None:
    reply, _ = kernel.execute("%%remote --async\nimport time\ntime.sleep(2)\nup_b = 1 / 0")
    upstream = f"Cell In[{reply['execution_count']}]"
    # Submitted while the upstream still runs: Ray waits for it, then this must not run.
    reply, messages = kernel.execute("%%remote\ndown = up_b + 1")
    assert reply["status"] == "error" and reply["ename"] == "ZeroDivisionError", reply
    shown = error_text(messages)
    assert upstream in shown and "up_b = 1 / 0" in shown and "`up_b`" in shown, shown
    assert "NoneType" not in shown and "no longer holds" not in shown
    _short(shown)
    # Submitted after the failure: refused in the notebook, with the same error.
    reply, messages = kernel.execute("%%remote\ndown = up_b * 2")
    assert reply["ename"] == "ZeroDivisionError", reply
    assert upstream in error_text(messages) and "no longer holds" not in error_text(messages)
    # An --async reader of a pending upstream fails the same way; so does its own reader.
    reply, _ = kernel.execute("%%remote --async\nimport time\ntime.sleep(2)\nup_c = [][1]")
    upstream = f"Cell In[{reply['execution_count']}]"
    kernel.ok("%%remote --async\nmid = up_c + 1")
    kernel.ok("%%remote --async\nlast = mid + 1")
    reply, messages = kernel.execute("jc.get(last)")
    assert reply["ename"] == "IndexError", reply
    assert upstream in error_text(messages) and "up_c = [][1]" in error_text(messages)
    assert "down" not in kernel_names(kernel)


def kernel_names(kernel: Kernel) -> list[str]:
    messages = kernel.ok("print(sorted(k for k in globals() if not k.startswith('_')))")
    return list(eval(text(messages)))


# 2. A failed cell binds nothing over existing names ------------------------------------
def test_a_failed_async_cell_leaves_existing_names_alone(kernel: Kernel) -> None:
    kernel.ok("import json\nkeep = 'old'")
    kernel.ok("%%remote --async\nimport json, time\ntime.sleep(1)\nkeep = 'new'\nfresh = 1\nraise ValueError('boom')")
    kernel.ok("pending = fresh\ntry:\n    pending.wait(60)\nexcept ValueError:\n    pass")
    messages = kernel.ok("print(json.dumps([keep]), type(json).__name__)")
    assert text(messages).strip() == '["old"] module'
    # A name the cell introduced keeps its failed handle: reading it says what failed.
    reply, messages = kernel.execute("%%remote\nfresh + 1")
    assert reply["ename"] == "ValueError" and "boom" in error_text(messages)


# 3. A module the kernel has not loaded ------------------------------------------------
def test_a_module_imported_remotely_stays_a_module(kernel: Kernel) -> None:
    kernel.ok("import sys\nassert 'graphlib' not in sys.modules")
    kernel.ok("%%remote --async\nimport graphlib as gl\nready = 1")
    kernel.ok("jc.get(ready)")
    messages = kernel.ok("%%remote\ntuple(gl.TopologicalSorter({'b': {'a'}}).static_order())")
    assert result(messages) == "('a', 'b')"
    messages = kernel.ok("print(type(gl).__name__, 'graphlib' in sys.modules)")
    assert text(messages).split() == ["LazyModule", "False"], "the kernel must not load it until it is used"
    assert result(kernel.ok("gl.TopologicalSorter({'y': {'x'}}).static_order().__next__()")) == "'x'"
    kernel.ok("%%remote\nimport wave")
    messages = kernel.ok("%%remote\nn = wave.WAVE_FORMAT_PCM\nn")
    assert result(messages) == "1"


# 4. An output the notebook cannot load ---------------------------------------------
def test_outputs_the_notebook_cannot_load_stay_remote_and_are_named(kernel: Kernel, tmp_path: Path) -> None:
    (tmp_path / "only_on_cluster.py").write_text("class Thing:\n    def __init__(self, v):\n        self.value = v\n")
    tmp_path.chmod(0o755)
    source = (
        f"import sys\nsys.path.insert(0, {str(tmp_path)!r})\nimport only_on_cluster\n"
        "good = 5\nbad = only_on_cluster.Thing(3)\nalso_good = 'yes'"
    )
    reply, messages = kernel.execute("%%remote\n" + source)
    assert reply["status"] == "ok", error_text(messages)
    warning = text(messages, "stderr")
    assert "`bad`" in warning and "only_on_cluster" in warning, warning
    _short(warning)
    messages = kernel.ok("print(good, also_good, type(bad).__name__)")
    assert text(messages).split() == ["5", "yes", "ObjectHandle"]
    assert result(kernel.ok("%%remote\nbad.value + good")) == "8"


# 5. A typo in --out ---------------------------------------------------------------
def test_out_naming_a_name_the_cell_did_not_assign_says_so(kernel: Kernel) -> None:
    reply, messages = kernel.execute("%%remote --out totl\ntotal = 1 + 2")
    warning = text(messages, "stderr")
    assert "`totl`" in warning and "`total`" in warning, (reply, warning)
    assert "totl" not in kernel_names(kernel)
    kernel.ok("%%remote --async --out totl2\ntotal2 = 1 + 2")
    reply, messages = kernel.execute("jc.get(totl2)")
    assert reply["ename"] == "NameError" and "`total2`" in error_text(messages)


# 7. Actor cells stop on --timeout and interrupt --------------------------------------
def test_timeout_and_interrupt_stop_an_actor_cell(kernel: Kernel) -> None:
    # The actor first: this is about a running cell (on a loaded machine the actor's process can take longer to
    # start than the --timeout, and a cell cancelled before it ran has set nothing to survive).
    kernel.ok("%%remote --actor sleeper\npass")
    start = time.monotonic()
    reply, messages = kernel.execute("%%remote --actor sleeper --timeout 3\nimport time\nkept = 'yes'\ntime.sleep(40)")
    assert reply["status"] == "error" and "--timeout 3" in error_text(messages), reply
    assert time.monotonic() - start < 10
    assert result(kernel.ok("%%remote --actor sleeper\nkept")) == "'yes'", "the actor's namespace survives"
    elapsed = _interrupt(kernel, "%%remote --actor sleeper\nimport time\nprint('sleeping', flush=True)\ntime.sleep(40)")
    assert elapsed < 5
    assert result(kernel.ok("%%remote --actor sleeper\nkept")) == "'yes'"


def test_an_actor_that_ignores_interrupts_is_reported_at_once(kernel: Kernel) -> None:
    source = (
        "import signal, time\nsignal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR2})\n"
        "print('deaf', flush=True)\ntime.sleep(40)"
    )
    # The actor first: a --timeout that ends before its process has started cancels a cell
    # still queued, which stops as it should (seen on a cold machine); this is about one running.
    kernel.ok("%%remote --actor deaf\npass")
    start = time.monotonic()
    reply, messages = kernel.execute("%%remote --actor deaf --timeout 2\n" + source)
    assert time.monotonic() - start < 12
    shown = error_text(messages)
    assert reply["status"] == "error" and "kill_actor('deaf')" in shown, shown
    _short(shown)
    kernel.ok("jc.current().kill_actor('deaf')")
    assert result(kernel.ok("%%remote --actor deaf\n'signal' in dir()")) == "False"


def _interrupt(kernel: Kernel, code: str) -> float:
    """Run ``code``, interrupt the kernel at its first output; seconds until the cell ended."""
    interrupted: list[float] = []

    def on_message(msg: Any) -> None:
        if not interrupted and msg["msg_type"] == "stream":
            interrupted.append(time.monotonic())
            kernel.km.interrupt_kernel()

    reply, messages = kernel.execute(code, on_message=on_message)
    assert interrupted, "the cell printed nothing"
    assert reply["status"] == "error" and reply["ename"] == "CellInterrupted", reply
    # 11. What the user sees is one line, not the magic's frames.
    shown = error_text(messages)
    assert shown.startswith("CellInterrupted: cancelled the remote cell"), shown
    _short(shown, 2)
    return time.monotonic() - interrupted[0]


# 8. and 11. Driver cells stop at once; interrupts say one line ----------------------
def test_interrupting_a_driver_cell_stops_it_at_once(kernel: Kernel) -> None:
    assert _interrupt(kernel, "%%remote --driver\nimport time\nprint('sleeping', flush=True)\ntime.sleep(40)") < 3
    assert result(kernel.ok("%%remote --driver\n6 * 7")) == "42"
    assert _interrupt(kernel, "%%remote\nimport time\nprint('sleeping', flush=True)\ntime.sleep(40)") < 5


# 9. A worker that dies ------------------------------------------------------------
def _died(shown: str, code: int) -> bool:
    named = "worker process running it (pid " in shown and f"exited with code {code} (os._exit)" in shown
    return "died" in shown or named


def test_a_map_item_that_kills_its_worker_is_named(kernel: Kernel) -> None:
    source = "import os\nif i == 2:\n    os._exit(1)\ny = i"
    reply, messages = kernel.execute(f"%%remote --map i in range(4) --retries 1\n{source}")
    shown = error_text(messages)
    assert reply["status"] == "error" and reply["ename"] not in ("CellInterrupted", "KeyboardInterrupt"), shown
    # The worker's last words (its exit code) name the death when they arrive in time; else Ray's "died" does.
    assert "item 2" in shown and _died(shown, 1) and "retried it 1 time" in shown, shown
    assert "cancelled" not in shown
    _short(shown)
    reply, messages = kernel.execute("%%remote --retries 0\nimport os\nos._exit(3)")
    shown = error_text(messages)
    assert reply["status"] == "error" and _died(shown, 3) and "Cell In[" in shown, shown
    _short(shown)
    assert "y" not in kernel_names(kernel)


# 10. Deep recursion ---------------------------------------------------------------
def test_a_recursion_error_collapses_repeated_frames(kernel: Kernel) -> None:
    reply, messages = kernel.execute("%%remote\ndef down(n):\n    return down(n + 1)\n\ndown(0)")
    assert reply["ename"] == "RecursionError"
    shown = error_text(messages)
    assert "return down(n + 1)" in shown and "similar frames" in shown, shown[:3000]
    assert len(shown.splitlines()) < 40 and len(shown) < 4000


# 12. Modules from the notebook's own folder -------------------------------------------
def test_modules_from_the_notebook_folder_travel_with_the_cell(kernel: Kernel, folder: Path) -> None:
    (folder / "helpers_here.py").write_text(
        textwrap.dedent(
            """
            FACTOR = 2

            def double(x):
                return FACTOR * x

            class Point:
                def __init__(self, x, y):
                    self.x, self.y = x, y
            """
        )
    )
    package = folder / "localpkg"
    package.mkdir()
    (package / "__init__.py").write_text("from .sub import triple\n")
    (package / "sub.py").write_text("def triple(x):\n    return 3 * x\n")
    kernel.ok("import helpers_here, localpkg\nfrom helpers_here import double\np = helpers_here.Point(1, 2)")
    kernel.ok("def quad(x):\n    return helpers_here.double(helpers_here.double(x))\nr = None")
    source = (
        "r = helpers_here.double(21)\nq = helpers_here.Point(p.x + 1, 5)\n"
        "t = localpkg.triple(3)\nd = double(4)\nf = quad(1)"
    )
    kernel.ok("%%remote\n" + source)
    messages = kernel.ok("print(r, t, d, f, isinstance(q, helpers_here.Point), q.x)")
    assert text(messages).split() == ["42", "9", "8", "4", "True", "2"]
    # A cell that imports it itself; and a changed file, reloaded in the notebook.
    assert result(kernel.ok("%%remote\nimport helpers_here as h\nh.double(5)")) == "10"
    (folder / "helpers_here.py").write_text("def double(x):\n    return 3 * x\n")
    kernel.ok("import importlib\nhelpers_here = importlib.reload(helpers_here)")
    assert result(kernel.ok("%%remote\nhelpers_here.double(21)")) == "63"
    assert result(kernel.ok("%%remote --driver\nhelpers_here.double(2)")) == "6"
    assert result(kernel.ok("%%remote --actor helper\nhelpers_here.double(3)")) == "9"


def test_a_compiled_module_from_the_notebook_folder_is_refused_by_name(kernel: Kernel, folder: Path) -> None:
    import _bisect

    package = folder / "fastbits"
    package.mkdir()
    shutil.copy(_bisect.__file__, package / Path(_bisect.__file__).name)
    (package / "__init__.py").write_text("from ._bisect import bisect_left\n")
    assert sysconfig.get_config_var("EXT_SUFFIX") in Path(_bisect.__file__).name
    kernel.ok("import fastbits\nkeep = 1")
    reply, messages = kernel.execute("%%remote\nfastbits.bisect_left([1, 2, 3], 2)")
    shown = error_text(messages)
    assert reply["status"] == "error" and "`fastbits`" in shown and "compiled" in shown, shown
    _short(shown, 3)
    assert "keep" in kernel_names(kernel)


# 13. Bad %cluster options ---------------------------------------------------------
def test_a_bad_object_store_size_is_a_usage_error(kernel: Kernel) -> None:
    reply, messages = kernel.execute("%cluster local --object-store lots")
    assert reply["ename"] == "UsageError"
    shown = text(messages, "stderr") + error_text(messages)
    assert "--object-store" in shown and "not a size" in shown, shown
    _short(shown, 3)


# 14. Output of an --async cell costs what it weighs ------------------------------------
def test_async_output_traffic_grows_with_the_output_not_its_square(kernel: Kernel) -> None:
    kernel.updates.clear()
    first = kernel.ok("%%remote --async\nfor i in range(20000):\n    print('line', i)\nfinished = True")
    area = {m["content"]["transient"]["display_id"] for m in first if m["msg_type"] == "display_data"}
    kernel.ok("jc.get(finished)")
    kernel.wait_for_update(lambda m: "line 19999" in m["content"]["data"]["text/plain"])
    sent = sum(len(json.dumps(m["content"])) for m in kernel.updates if m["content"]["transient"]["display_id"] in area)
    printed = sum(len(f"line {i}\n") for i in range(20000))
    assert sent < 3 * printed, f"{sent} bytes of display updates for {printed} bytes printed"


# The Python API and --map --async meet the same faults -----------------------------------
def test_the_python_api_reports_failures_as_cells_do(kernel: Kernel) -> None:
    kernel.ok("def boom(x):\n    return x / 0\n\ndef inc(x):\n    return x + 1")
    reply, messages = kernel.execute("jc.get(jc.submit(boom, 1))")
    shown = error_text(messages)
    assert reply["ename"] == "ZeroDivisionError" and "return x / 0" in shown, shown
    _short(shown)
    # A failed result passed on fails the next call with the same error, before it runs.
    reply, messages = kernel.execute("bad = jc.submit(boom, 2)\nchained = jc.submit(inc, bad)\njc.get(chained)")
    assert reply["ename"] == "ZeroDivisionError" and "return x / 0" in error_text(messages)
    # One failing item of jc.map: the others still come back; ray.wait counts it ready.
    kernel.ok("hs = jc.map(lambda x: 10 // (x - 2), range(4))")
    assert kernel.execute("jc.get(hs)")[0]["ename"] == "ZeroDivisionError"
    assert result(kernel.ok("jc.get(hs[3])")) == "10"
    assert result(kernel.ok("ready, rest = jc.wait(hs, num_returns=4, timeout=60)\nlen(ready)")) == "4"
    reply, messages = kernel.execute("def die():\n    import os\n    os._exit(1)\n\njc.get(jc.submit(die))")
    shown = error_text(messages)
    assert reply["status"] == "error" and _died(shown, 1), shown
    _short(shown)
    # --map --async: a failing item fails the pending names, naming the item; so does their reader.
    kernel.ok("%%remote --async --map i in range(4)\nimport time\ntime.sleep(0.5)\nsq = 10 // (i - 1)")
    reply, messages = kernel.execute("jc.get(sq)")
    assert reply["ename"] == "ZeroDivisionError" and "item 1" in error_text(messages), error_text(messages)
    reply, messages = kernel.execute("%%remote\ntotal = sum(sq)")
    assert reply["ename"] == "ZeroDivisionError" and "`sq`" in error_text(messages)


def test_wrong_arguments_to_the_python_api_are_one_line_errors(kernel: Kernel) -> None:
    assert result(kernel.ok("jc.wait([])")) == "([], [])"
    kernel.ok("%%remote --async\nimport time\ntime.sleep(30)\nlate = 1")
    for code, ename, words in (
        ("jc.wait([jc.put(1), 7])", "InputError", "item 1 is a int"),
        ("jc.get(late, timeout=0.2)", "WaitTimeoutError", "not ready within 0.2 s"),
        ("jc.current().kill_actor('nobody')", "RequestError", "no actor named 'nobody'"),
    ):
        reply, messages = kernel.execute(code)
        shown = error_text(messages)
        assert reply["ename"] == ename and words in shown, (code, reply, shown)
        _short(shown, 1)
    kernel.ok("jc.current().cells[late.id.split('/')[0]].cancel()")


# 6. Waits on a handle whose cluster is gone --------------------------------------------
def test_waiting_on_a_handle_of_a_stopped_cluster_ends_at_once(kernel: Kernel) -> None:
    kernel.ok("%%remote --async\nimport time\ntime.sleep(120)\nslow = 1")
    # A handle whose value already came back (what a name bound to an --async output holds).
    kernel.ok("kept = jc.current().run_cell('small = 5', pending_handles=True).handles['small']\njc.get(kept)")
    assert text(kernel.ok("print(type(kept).__name__)")).strip() == "ObjectHandle"
    kernel.ok("%cluster down\n%cluster local --cpus 2", timeout=180)
    assert result(kernel.ok("%%remote\nkept + 1")) == "6", "a value already in the notebook travels as a value"
    for code in ("jc.get(slow)", "slow.wait()", "jc.wait([slow])"):
        start = time.monotonic()
        reply, messages = kernel.execute(code, timeout=60)
        assert reply["status"] == "error" and "shut down" in error_text(messages), (code, reply)
        assert time.monotonic() - start < 5, code
        _short(error_text(messages), 3)
    reply, messages = kernel.execute("%%remote\nslow + 1")
    assert reply["status"] == "error" and "shut down" in error_text(messages), reply
    assert result(kernel.ok("%%remote\n1 + 1")) == "2"
