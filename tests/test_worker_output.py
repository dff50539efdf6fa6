"""What the workers print reaches the cell that started the work, with Ray's prefix, on a real embedded cluster.

A driver cell's tasks and actors, a task cell's nested tasks, ``--map`` items' nested tasks; two cells at once
each get only their own lines; a line no running cell can take goes to the cluster's log (``%cluster logs``),
never to another cell; a task that floods is shown in part and the rest is counted, not dropped.
"""

from __future__ import annotations

import re
import threading
import time
from typing import Any

import pytest

import jupyter_cluster as jc
from jupyter_cluster.agent.cells import _logs

from .conftest import remote
from .kernel import attach_second, text

pytestmark = pytest.mark.timeout(300)

#: Ray's prefix: the embedded cluster's workers are on the notebook's machine, where Ray prints no ip (as here).
PREFIX = r"\((?P<name>[\w.]+) pid=(?P<pid>\d+)(?:, ip=(?P<ip>[\d.]+))?\) "


def lines_matching(out: str, pattern: str) -> list[re.Match[str]]:
    return [m for m in (re.fullmatch(PREFIX + pattern, line) for line in out.splitlines()) if m]


def test_a_driver_cells_tasks_and_actors_print_into_it(shell: Any, capsys: Any) -> None:
    source = (
        "import sys\n"
        "@ray.remote\n"
        "def shout(i):\n"
        "    print(f'hello from task {i}')\n"
        "    print(f'warning from task {i}', file=sys.stderr)\n"
        "    return i\n"
        "@ray.remote\n"
        "class Greeter:\n"
        "    def __init__(self):\n"
        "        print('greeter made')\n"
        "    def greet(self, who):\n"
        "        print(f'hi {who}')\n"
        "        return who\n"
        "g = Greeter.remote()\n"
        "print('the cell itself')\n"
        "got = ray.get([shout.remote(i) for i in range(4)] + [g.greet.remote('notebook')])"
    )
    assert remote(shell, source, "--driver").success
    captured = capsys.readouterr()
    assert "the cell itself" in captured.out
    hello = lines_matching(captured.out, r"hello from task (\d)")
    assert sorted(m.group(4) for m in hello) == ["0", "1", "2", "3"], captured.out
    assert {m.group("name") for m in hello} == {"shout"}
    warnings = lines_matching(captured.err, r"warning from task (\d)")
    assert len(warnings) == 4, captured.err  # stderr stays stderr
    assert not lines_matching(captured.out, r"warning from task \d")
    greeter = lines_matching(captured.out, r"hi notebook") + lines_matching(captured.out, r"greeter made")
    assert len(greeter) == 2 and {m.group("name") for m in greeter} == {"Greeter"}, captured.out


def test_a_task_cells_nested_tasks_print_into_it(shell: Any, capsys: Any) -> None:
    source = (
        "@ray.remote\n"
        "def inner(i):\n"
        "    print(f'inner {i}')\n"
        "    return i\n"
        "@ray.remote\n"
        "def middle(i):\n"
        "    print(f'middle {i}')\n"
        "    return ray.get(inner.remote(i))\n"
        "print('outer')\n"
        "total = sum(ray.get([middle.remote(i) for i in range(3)]))"
    )
    assert remote(shell, source).success
    assert shell.user_ns["total"] == 3
    out = capsys.readouterr().out
    assert "outer" in out
    assert sorted(m.group(4) for m in lines_matching(out, r"middle (\d)")) == ["0", "1", "2"], out
    # A task that a nested task started is the cell's too.
    assert sorted(m.group(4) for m in lines_matching(out, r"inner (\d)")) == ["0", "1", "2"], out


def test_map_items_nested_tasks_print_into_the_map(shell: Any, capsys: Any) -> None:
    source = "@ray.remote\ndef tell(i):\n    print(f'item {i} says hi')\n    return i\nback = ray.get(tell.remote(i))"
    assert remote(shell, source, "--map i in range(6)").success
    assert shell.user_ns["back"] == list(range(6))
    out = capsys.readouterr().out
    assert sorted(int(m.group(4)) for m in lines_matching(out, r"item (\d) says hi")) == list(range(6)), out


def test_an_actor_cells_nested_tasks_print_into_it(shell: Any, capsys: Any) -> None:
    source = "@ray.remote\ndef ping():\n    print('pong from a task')\nray.get(ping.remote())"
    assert remote(shell, source, "--actor printer").success
    assert len(lines_matching(capsys.readouterr().out, "pong from a task")) == 1


def _agent_of(cluster: jc.Cluster) -> tuple[str, str]:
    agent = cluster._agent
    assert agent is not None
    return agent.socket, agent.secret


def test_two_cells_at_once_each_get_only_their_own_lines(shell: Any, cluster: jc.Cluster, capsys: Any) -> None:
    """A second notebook's cell and this one's run at the same time, on the same agent and the same workers."""
    second = attach_second(*_agent_of(cluster))
    try:
        body = (
            "import time\n"
            "@ray.remote(num_cpus=0)\n"
            "def say(who, i):\n"
            "    time.sleep(0.05)\n"
            "    print(f'{who} line {i}')\n"
            "for i in range(30):\n"
            "    ray.get(say.remote(WHO, i))\n"
        )
        other: dict[str, Any] = {}

        def run_second() -> None:
            other["messages"] = second.ok("%%remote --driver\n" + body.replace("WHO", "'B'"), timeout=120)

        thread = threading.Thread(target=run_second)
        thread.start()
        time.sleep(0.5)
        assert remote(shell, body.replace("WHO", "'A'").replace("num_cpus=0", "num_cpus=0.5"), "").success
        thread.join(120)
        out_a = capsys.readouterr().out
        out_b = text(other["messages"], "stdout")
        a_lines = lines_matching(out_a, r"(A|B) line (\d+)")
        b_lines = lines_matching(out_b, r"(A|B) line (\d+)")
        assert sorted(int(m.group(5)) for m in a_lines if m.group(4) == "A") == list(range(30)), out_a
        assert sorted(int(m.group(5)) for m in b_lines if m.group(4) == "B") == list(range(30)), out_b
        assert not [m.group(0) for m in a_lines if m.group(4) == "B"], "a line of the other notebook's cell came here"
        assert not [m.group(0) for m in b_lines if m.group(4) == "A"], "a line of this cell went to the other"
    finally:
        second.kc.stop_channels()
        second.km.shutdown_kernel(now=True)


def _logged(cluster: jc.Cluster, needle: str, timeout: float = 20) -> list[str]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = [text for _, _, text in cluster.logs(tail=None).lines if needle in text]
        if found:
            return found
        time.sleep(0.2)
    return []


def test_a_line_no_running_cell_can_take_goes_to_the_log(shell: Any, cluster: jc.Cluster, capsys: Any) -> None:
    # A thread the driver cell started submits work once the cell has ended: no cell's.
    source = (
        "import threading, time\n"
        "@ray.remote\n"
        "def orphan():\n"
        "    print('nobody asked for this line')\n"
        "threading.Thread(target=lambda: (time.sleep(0.5), ray.get(orphan.remote())), daemon=True).start()"
    )
    assert remote(shell, source, "--driver").success
    # Meanwhile another cell runs: the line must not land there.
    assert remote(shell, "import time\ntime.sleep(4)\nwaited = True").success
    out = capsys.readouterr().out
    assert "nobody asked for this line" not in out
    logged = _logged(cluster, "nobody asked for this line")
    assert logged and re.match(PREFIX, logged[0]), logged
    # And the magic shows it.
    shell.run_line_magic("cluster", "logs --tail 0")
    assert "nobody asked for this line" in capsys.readouterr().out


def test_a_line_after_its_cell_ended_goes_to_the_log_with_the_cell_named(
    shell: Any, cluster: jc.Cluster, capsys: Any
) -> None:
    source = (
        "import time\n"
        "@ray.remote\n"
        "def later():\n"
        "    time.sleep(3)\n"
        "    print('written after the cell ended')\n"
        "left_running = later.remote()"
    )
    res = remote(shell, source, "--driver")
    assert res.success  # an ObjectRef assigned by a driver cell comes back as a handle (it was "the agent failed")
    assert "written after the cell ended" not in capsys.readouterr().out
    logged = _logged(cluster, "written after the cell ended")
    assert logged and "after it ended" in logged[0], logged
    assert jc.get(shell.user_ns["left_running"]) is None  # the value the ref stands for


def test_a_flood_is_shown_in_part_and_counted_never_dropped(shell: Any, cluster: jc.Cluster, capsys: Any) -> None:
    n = 200_000
    before = cluster.logs(tail=0).total
    source = f"@ray.remote\ndef flood():\n    for i in range({n}):\n        print('flood', i)\nray.get(flood.remote())"
    started = time.monotonic()
    assert remote(shell, source, "--driver").success
    took = time.monotonic() - started
    captured = capsys.readouterr()
    shown = len(lines_matching(captured.out, r"flood \d+"))
    assert 0 < shown < 20_000, f"{shown} flood lines reached the notebook"
    # Every line is in the cell or counted into the log (which keeps the latest of them).
    deadline = time.monotonic() + 120
    logged = 0
    while time.monotonic() < deadline:
        logged = cluster.logs(tail=0).total - before
        if shown + logged >= n:
            break
        time.sleep(1)
    # Ray's log monitor can cut a line that is half written when it reads the file into two: a few more, never fewer.
    assert n <= shown + logged <= n * 1.05, f"{shown} shown + {logged} logged of {n}"
    assert "went to the cluster's log" in captured.err or "went to the cluster's log" in captured.out
    print(f"flood: {shown} lines shown, {logged} logged; the cell took {took:.1f} s")


def test_logs_refuses_a_bad_tail(cluster: jc.Cluster) -> None:
    with pytest.raises(jc.InputError, match="count of lines"):
        cluster.logs(tail=-1)
    with pytest.raises(jc.InputError, match="count of lines"):
        cluster.logs(tail="10")  # type: ignore[arg-type]


# ------------------------------------------------------------------ the router alone, without Ray


class _Loop:
    def call_soon_threadsafe(self, fn: Any, *args: Any) -> None:
        fn(*args)


def _router(running: set[str]) -> tuple[_logs.WorkerLines, dict[str, list[tuple[str, str]]]]:
    got: dict[str, list[tuple[str, str]]] = {}

    def emitter(cell_id: str) -> Any:
        if cell_id not in running:
            return None
        return lambda event, batch: got.setdefault(cell_id, []).extend(batch)

    return _logs.WorkerLines(_Loop(), emitter), got  # type: ignore[arg-type]


def _data(pid: int, lines: list[str], err: bool = False, name: str = "f") -> dict[str, Any]:
    return {"ip": "10.0.0.2", "pid": pid, "job": "01000000", "is_err": err, "lines": lines, "task_name": name}


def test_the_router_follows_markers_chains_and_streams() -> None:
    lines, got = _router({"c1", "c2"})
    lines.note("t-root", "c1", started=False)
    lines.on_logs(_data(7, [f"{_logs.MARK_TASK}t-root", f"{_logs.MARK_CHILD}c1 t-a", "root says"]))
    lines.on_logs(_data(8, [f"{_logs.MARK_TASK}t-a", f"{_logs.MARK_CHILD}@t-a t-b", "a says"]))
    lines.on_logs(_data(8, ["a warns"], err=True))  # stderr has no marker of its own yet: no task known
    lines.on_logs(_data(9, [f"{_logs.MARK_TASK}t-b", "b says"]))
    lines.on_logs(_data(9, [f"{_logs.MARK_TASK}t-other", "other says"]))  # unknown: waits
    lines.note("t-other", "c2")
    lines.on_logs(_data(9, []))  # any later batch routes the waiting lines
    assert got["c1"] == [
        ("stdout", "(f pid=7, ip=10.0.0.2) root says\n"),
        ("stdout", "(f pid=8, ip=10.0.0.2) a says\n"),
        ("stdout", "(f pid=9, ip=10.0.0.2) b says\n"),
    ]
    assert got["c2"] == [("stdout", "(f pid=9, ip=10.0.0.2) other says\n")]
    assert [text for _, _, text in lines.log.lines] == ["(f pid=8, ip=10.0.0.2) a warns"]
    assert "c1" in lines.started and "c2" in lines.started


def test_the_router_sends_a_line_whose_task_stays_unknown_to_the_log(monkeypatch: pytest.MonkeyPatch) -> None:
    lines, got = _router({"c1"})
    monkeypatch.setattr(_logs, "UNKNOWN_WAIT", 0.0)
    lines.on_logs(_data(5, [f"{_logs.MARK_TASK}t-x", "who am I"]))
    lines.on_logs(_data(5, []))
    assert not got
    assert [text for _, _, text in lines.log.lines] == ["(f pid=5, ip=10.0.0.2) who am I"]


def test_the_router_limits_a_flood_and_counts_the_rest() -> None:
    lines, got = _router({"c1"})
    lines.note("t", "c1")
    lines.on_logs(_data(3, [f"{_logs.MARK_TASK}t"] + [str(i) for i in range(_logs.BURST + 500)]))
    shown = [text for stream, text in got["c1"] if stream == "stdout"]
    assert _logs.BURST <= len(shown) < _logs.BURST + 100  # the burst, and what the rate let in meanwhile
    over = _logs.BURST + 500 - len(shown)
    assert len(lines.log.lines) == lines.log.total == over
    told = [text for stream, text in got["c1"] if stream == "stderr"]
    assert told and f"{over} more lines" in told[0]


def test_the_cluster_log_keeps_the_latest_and_counts_all() -> None:
    log = _logs.ClusterLog(limit=3)
    log.add([(0.0, "stdout", str(i)) for i in range(5)])
    tail = log.tail(2)
    assert [t for _, _, t in tail["lines"]] == ["3", "4"] and tail["total"] == 5 and tail["kept"] == 3
    assert log.tail(0)["lines"] == [] and len(log.tail(None)["lines"]) == 3


def test_a_childs_whole_lines_never_land_inside_the_cells_partial_line() -> None:
    """``print("spawn", pool.map(...))`` writes ``spawn``, then the rest; the children's lines, read from the
    driver's descriptor a moment late, come between those writes (seen in a full run: ``spawn child squares 2``).
    They go before the partial line, which stays whole; a later partial line of the cell's own is kept as written."""
    from jupyter_cluster.agent.cells._execute import CellOutput

    sent: list[list[tuple[str, Any]]] = []
    output = CellOutput(lambda index, batch: sent.append(batch), interval=60.0)
    output.add("stdout", "before\n")
    output.add("stdout", "spawn")
    output.add_open("stdout", "child squares 2\n")  # a child's lines, from the descriptor
    output.add_open("stdout", "child squares 3\n")
    output.add("stdout", " [4, 9]\n")
    output.add("stdout", "no")
    output.add("stdout", "t split\n")
    output.close()
    text = "".join(data for batch in sent for kind, data in batch if kind == "stdout")
    assert text.splitlines() == ["before", "child squares 2", "child squares 3", "spawn [4, 9]", "not split"], text
