"""Ray code pasted into ``--driver`` cells runs as it does under ``python script.py``, through a real kernel.

``ray.init`` in its common forms joins the attached cluster (one line on stderr for what the cluster lacks);
``ray.shutdown()`` stops what the driver cells started and every kind of cell works after it; ``sys.exit(0)`` is
a success; tracebacks that remote code prints show their source lines wherever the code runs; and nothing of Ray
is left after ``%cluster down``. A crash in a driver cell (a segfault, a kill, the out-of-memory killer) is named:
how the agent died, in which cell and line, and what went with it; the next cell starts a new cluster.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from jupyter_cluster.agent._reaper import descendants

from .kernel import Kernel, error_text, text
from .test_lifetime import SESSION, _alive, _cmdline, _of_session

pytestmark = pytest.mark.timeout(300)

#: A traceback line for a cell's code, then the line of source a traceback shows under it.
CELL_FRAME = re.compile(r'File "<remote-cell-[0-9a-f]+>", line \d+, in \S+\n(.*)\n')
#: Ray's prefix of what a worker prints: "(task pid=8684) " (on the notebook's machine), "(task pid=8684, ip=…) ".
RAY_PREFIX = re.compile(r"^\(\S+ pid=\d+(, ip=[^)]*)?\) ", re.MULTILINE)


def source_lines(shown: str) -> set[str]:
    """The source lines the printed tracebacks in ``shown`` show under their cells' frames."""
    return {line.strip() for line in CELL_FRAME.findall(RAY_PREFIX.sub("", shown))}


@pytest.fixture(scope="module")
def kernel() -> Iterator[Kernel]:
    kernel = Kernel()
    kernel.ok("%load_ext jupyter_cluster\n%cluster local --cpus 1")
    try:
        yield kernel
    finally:
        kernel.stop()


def driver(kernel: Kernel, body: str, timeout: float = 120) -> tuple[dict[str, object], list[object]]:
    return kernel.execute(f"%%remote --driver\n{body}", timeout)


def ok(kernel: Kernel, cell: str, timeout: float = 120) -> list[object]:
    messages = kernel.ok(cell, timeout)
    assert not error_text(messages), error_text(messages)  # type: ignore[arg-type]
    return messages


def test_ray_init_in_its_common_forms_joins_the_attached_cluster(kernel: Kernel) -> None:
    messages = ok(
        kernel,
        "%%remote --driver\nimport ray\nctx = ray.init()\n"
        "print(ray.is_initialized(), ctx.address_info['gcs_address'] == ray.get_runtime_context().gcs_address)",
    )
    assert text(messages, "stdout") == "True True\n" and not text(messages, "stderr")
    for quiet in (
        'ray.init(address="auto")',
        'ray.init("auto", ignore_reinit_error=True, logging_level="ERROR", log_to_driver=True)',
        "ray.init(include_dashboard=False, configure_logging=False)",
        "ray.init(num_cpus=1)",
    ):
        messages = ok(kernel, f"%%remote --driver\n{quiet}\nprint(ray.get(ray.put(7)))")
        assert text(messages, "stdout") == "7\n" and not text(messages, "stderr"), (quiet, messages)
    # What the cluster does not have: one line, saying what was asked, what it has, and how to get more.
    messages = ok(kernel, "%%remote --driver\nray.init(num_cpus=8, num_gpus=1)\nprint('on')")
    said = text(messages, "stderr")
    assert said.count("\n") == 1 and said.startswith("ray.init: "), said
    assert "num_cpus=8, but the attached cluster has 1 CPU" in said and "num_gpus=1, but" in said, said
    assert "%cluster local --cpus N" in said and text(messages, "stdout") == "on\n"
    messages = ok(kernel, "%%remote --driver\nray.init(namespace='shop')")
    said = text(messages, "stderr")
    assert said.count("\n") == 1 and "namespace='shop'" in said and "'jupyter_cluster'" in said, said
    # Wrong calls fail as Ray's own would.
    reply, messages = driver(kernel, "ray.init(bogus=1)")
    assert reply["status"] == "error" and "Unknown keyword argument(s): bogus" in error_text(messages)  # type: ignore[arg-type]
    reply, messages = driver(kernel, "ray.init(local_mode=True)")
    assert reply["status"] == "error" and "`local_mode` is no longer supported" in error_text(messages)  # type: ignore[arg-type]


def test_a_scripts_runtime_env_goes_to_its_tasks_and_actors_until_it_ends(kernel: Kernel) -> None:
    """``ray.init(runtime_env=...)`` is the script's job's runtime_env, as under ``python``: merged under each task's
    and actor's own (``env_vars`` name by name), its setup hook run in their workers (after the session's own,
    which routes their output here), until the next ``ray.init`` or ``ray.shutdown()``; never for other cells."""
    messages = ok(
        kernel,
        "%%remote --driver\n"
        "import logging, os\n"
        "def quiet_setup():\n"
        "    logging.basicConfig(level=logging.INFO)\n"
        "env = {'env_vars': {'SHOP': 'open', 'DOOR': 'front'}, 'worker_process_setup_hook': quiet_setup}\n"
        "ray.init(runtime_env=env)\n"
        "@ray.remote\n"
        "def env():\n"
        "    logging.info('logged in the task')\n"
        "    return os.environ.get('SHOP'), os.environ.get('DOOR')\n"
        "@ray.remote\n"
        "class Till:\n"
        "    def env(self):\n"
        "        return os.environ.get('SHOP'), os.environ.get('DOOR')\n"
        "print(ray.get(env.remote()), ray.get(env.options(runtime_env={'env_vars': {'DOOR': 'back'}}).remote()))\n"
        "print(ray.get(Till.remote().env.remote()))",
    )
    assert text(messages, "stdout").splitlines()[:2] == ["('open', 'front') ('open', 'back')", "('open', 'front')"]
    assert "INFO:root:logged in the task" in text(messages, "stderr") and "ray.init" not in text(messages)
    # Not a task cell's, and not after the script's end: the next ray.init() without one, or ray.shutdown().
    assert text(ok(kernel, "%%remote\nimport os\nprint(os.environ.get('SHOP'))")) == "None\n"
    ok(kernel, "%%remote --driver\nray.init(runtime_env={'env_vars': {'SHOP': 'open'}})\nray.shutdown()")
    shown = ok(
        kernel,
        "%%remote --driver\n@ray.remote\ndef shop():\n    return os.environ.get('SHOP')\nprint(ray.get(shop.remote()))",
    )
    assert text(shown) == "None\n"


def test_ray_shutdown_stops_what_driver_cells_started_and_every_kind_of_cell_works_after(kernel: Kernel) -> None:
    ok(
        kernel,
        "%%remote --driver\n"
        "@ray.remote(num_cpus=0)\n"
        "class Box:\n"
        "    def get(self):\n"
        "        return 1\n"
        "named = Box.options(name='pasted-named').remote()\n"
        "kept = Box.options(name='pasted-detached', lifetime='detached').remote()\n"
        "unnamed = Box.remote()\n"
        "group = ray.util.placement_group([{'CPU': 1}])\n"
        "ray.get([named.get.remote(), kept.get.remote(), unnamed.get.remote(), group.ready()])\n"
        "ray.shutdown()",
    )
    messages = ok(
        kernel,
        "%%remote --driver\n"
        "import time\n"
        "names = {a['name'] for a in ray.util.list_named_actors(all_namespaces=True)}\n"
        "deadline = time.time() + 30\n"
        "while time.time() < deadline:\n"
        "    try:\n"
        "        ray.get(unnamed.get.remote(), timeout=1)\n"
        "    except ray.exceptions.RayActorError:\n"
        "        break\n"
        "    except ray.exceptions.GetTimeoutError:\n"
        "        pass\n"
        "else:\n"
        "    raise AssertionError('the unnamed actor outlived ray.shutdown()')\n"
        "print(sorted(n for n in names if n.startswith('pasted')), ray.util.placement_group_table(group)['state'])\n"
        "ray.init()\n"
        "print(ray.get(kept.get.remote()))",
    )
    assert text(messages, "stdout") == "['pasted-detached'] REMOVED\n1\n", messages
    # The placement group held the cluster's one CPU: every kind of cell needs it back.
    assert text(ok(kernel, "%%remote\nprint('task', 1 + 1)")) == "task 2\n"
    assert text(ok(kernel, "%%remote --actor pasted\nprint('actor', 2 + 1)")) == "actor 3\n"
    ok(kernel, "%%remote --map i in range(3)\nsquare = i * i")
    assert text(ok(kernel, "print(square)")) == "[0, 1, 4]\n"
    assert text(ok(kernel, "%%remote --driver\nprint('driver', ray.get(ray.put(4)))")) == "driver 4\n"
    ok(kernel, "%%remote --driver\nray.kill(kept)\nimport jupyter_cluster as jc")
    ok(kernel, "import jupyter_cluster as jc\njc.current().kill_actor('pasted')")


def test_printed_tracebacks_show_their_source_lines_wherever_the_code_runs(kernel: Kernel) -> None:
    ok(
        kernel,
        "%%remote\n"
        "import traceback\n"
        "def report():\n"
        "    try:\n"
        "        {}['missing key']\n"
        "    except KeyError:\n"
        "        traceback.print_exc()",
    )
    pasted = (
        "import logging\n"
        "@ray.remote\n"
        "def task():\n"
        "    try:\n"
        "        1 / 0  # in a task\n"
        "    except ZeroDivisionError:\n"
        "        traceback.print_exc()\n"
        "@ray.remote\n"
        "class Actor:\n"
        "    def method(self):\n"
        "        try:\n"
        "            int('x')  # in an actor\n"
        "        except ValueError:\n"
        "            logging.exception('the actor failed')\n"
        "actor = Actor.remote()\n"
        "ray.get([task.remote(), actor.method.remote()])\n"
        "try:\n"
        "    [][1]  # in the driver\n"
        "except IndexError:\n"
        "    traceback.print_exc()"
    )
    messages = ok(kernel, f"%%remote --driver\nimport traceback\n{pasted}")
    shown = text(messages)
    lines = source_lines(shown)
    assert {"1 / 0  # in a task", "int('x')  # in an actor", "[][1]  # in the driver"} <= lines, shown
    # A function an earlier task cell defined, called in a task, an actor and a map item.
    for options in ("", "--actor pasted-tracebacks", "--map i in range(2)"):
        shown = text(ok(kernel, f"%%remote {options}\nreport()"))
        assert "{}['missing key']" in source_lines(shown), (options, shown)
    ok(kernel, "import jupyter_cluster as jc\njc.current().kill_actor('pasted-tracebacks')")


def test_a_script_ends_as_under_python(kernel: Kernel) -> None:
    messages = ok(kernel, "%%remote --driver\nimport sys\nprint('done')\nsys.exit(0)\nprint('not reached')")
    assert text(messages) == "done\n"
    ok(kernel, "%%remote --driver\nexit()")
    reply, messages = driver(kernel, "import sys\nsys.exit(2)")
    assert reply["status"] == "error" and "SystemExit: 2" in error_text(messages)  # type: ignore[arg-type]
    # os._exit in a driver cell ends the cell, not the agent.
    reply, messages = driver(kernel, "import os\nsurvivor = 5\nos._exit(3)")
    assert reply["status"] == "error" and "exit status 3" in error_text(messages)  # type: ignore[arg-type]
    assert text(ok(kernel, "%%remote --driver\nprint(survivor)")) == "5\n"
    # A __main__ block runs; a generator the script keeps stays in the driver without a word.
    messages = ok(
        kernel,
        "%%remote --driver\ndef numbers():\n    yield from range(3)\nstream = numbers()\n"
        "if __name__ == '__main__':\n    print('main', next(stream))",
    )
    assert text(messages) == "main 0\n", messages
    assert text(ok(kernel, "%%remote --driver\nprint(next(stream))")) == "1\n"


def test_child_processes_of_a_script_run_and_print_as_under_python(kernel: Kernel) -> None:
    """A pool spawned by multiprocessing runs the script's file again (its functions are found by name in
    ``__main__``); what the children and ``subprocess`` print shows in the cell. (Not a forked pool: forking a
    Ray driver, whose threads hold locks, is what Ray's documentation warns against, and it hangs now and then
    under ``python`` as here.) After ``reset_driver()`` too, which empties the module's namespace."""
    ok(kernel, "import jupyter_cluster as jc\njc.current().reset_driver()")
    messages = ok(
        kernel,
        "%%remote --driver\n"
        "import multiprocessing, subprocess, sys\n"
        "def square(x):\n"
        "    print('child squares', x, flush=True)\n"
        "    return x * x\n"
        "def main():\n"
        "    with multiprocessing.get_context('spawn').Pool(2) as pool:\n"
        "        print('spawn', pool.map(square, [2, 3]))\n"
        "    subprocess.run([sys.executable, '-c', 'print(\"from a subprocess\")'], check=True)\n"
        "if __name__ == '__main__':\n"
        "    main()",
        timeout=180,
    )
    shown = text(messages, "stdout").splitlines()
    assert "spawn [4, 9]" in shown and "from a subprocess" in shown, shown
    assert shown.count("child squares 2") == 1 and shown.count("child squares 3") == 1, shown


def test_nothing_of_ray_or_the_agent_is_left_after_down(kernel: Kernel) -> None:
    ok(kernel, "%%remote --driver\nray.shutdown()\nray.init()\nprint(ray.get(ray.put(1)))")
    agent = int(text(ok(kernel, "import jupyter_cluster as jc\nprint(jc.current()._agent.process.pid)")))
    ray_processes = [int(p) for p in os.listdir("/proc") if p.isdigit() and SESSION.search(_cmdline(int(p)))]
    sessions = {m.group(0) for pid in ray_processes if (m := SESSION.search(_cmdline(pid))) and _below(pid, agent)}
    assert len(sessions) == 1, sessions
    (session,) = sessions
    started = descendants(agent)  # Ray's GCS, raylet, dashboard and its module processes, agents, workers
    assert len(started) > 5, started
    ok(kernel, "%cluster down")
    assert not _alive(agent)
    assert not _of_session(session), "\n".join(_of_session(session))
    left = [f"{pid}: {_cmdline(pid)[:120]}" for pid in started if _alive(pid)]
    assert not left, "\n".join(left)
    ok(kernel, "%cluster local --cpus 1")


def _below(pid: int, ancestor: int) -> bool:
    """Whether process ``pid`` descends from ``ancestor``."""
    for _ in range(20):
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            return False
        pid = int(stat[stat.rfind(")") + 2 :].split()[1])
        if pid == ancestor:
            return True
        if pid <= 1:
            return False
    return False


# ---------------------------------------------------------------------------------------------- crashes


CRASHES = {
    "segfault": ("import ctypes\nctypes.string_at(0)", "segmentation fault (SIGSEGV)", True),
    "signal": ("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)", "killed (SIGKILL)", False),
}


@pytest.mark.parametrize("how", sorted(CRASHES))
def test_a_crash_in_a_driver_cell_is_named_and_the_next_cell_starts_afresh(how: str) -> None:
    crash, said, located = CRASHES[how]
    kernel = Kernel()
    try:
        kernel.ok("%load_ext jupyter_cluster\n%cluster local --cpus 1\nkept = 'the notebook keeps this'")
        reply, messages = kernel.execute(f"%%remote --driver\nx = 1\n{crash}", timeout=120)
        shown = error_text(messages)  # type: ignore[arg-type]
        assert reply["status"] == "error" and "AgentLostError" in shown, shown
        assert f"the embedded agent died: {said}" in shown, shown
        if located:
            assert "in Cell In[2] (driver), line 3:" in shown, shown
        assert "ran in the agent (--driver)" in shown and "With it went the embedded cluster" in shown, shown
        assert text(kernel.ok("%%remote\nprint(kept)")).endswith("the notebook keeps this\n")
    finally:
        kernel.stop()


def test_a_driver_cell_killed_for_memory_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The kernel, its agent and Ray in a 1.5 GiB memory cgroup (v1); a driver cell fills 3 GiB."""
    from .test_binder import CGROUP_V1, boxed_kernel, remove_box, skip_without_boxes

    skip_without_boxes()
    cgroup = CGROUP_V1 / f"jc-oom-{os.getpid()}"
    cgroup.mkdir()
    kernel = None
    try:
        (cgroup / "memory.limit_in_bytes").write_text(str(3 * 2**29))
        wrapper = f'#!/bin/sh\necho $$ > "$1/cgroup.procs"\nexec {sys.executable} -m ipykernel_launcher -f "$2"\n'
        name = boxed_kernel(tmp_path, cgroup, monkeypatch, wrapper, "python3-oom", "1.5 GiB")
        kernel = Kernel(kernel_name=name)
        kernel.ok("%load_ext jupyter_cluster\n%cluster local --cpus 1")
        reply, messages = kernel.execute("%%remote --driver\nfilled = b'x' * (3 << 30)", timeout=180)
        shown = error_text(messages)  # type: ignore[arg-type]
        assert reply["status"] == "error" and "killed by the out-of-memory killer (SIGKILL)" in shown, shown
        assert int((cgroup / "memory.oom_control").read_text().split("oom_kill ")[1]) >= 1
    finally:
        if kernel is not None:
            kernel.stop()
        remove_box(cgroup)
