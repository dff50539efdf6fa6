"""A cell's timeline: the tasks and actor calls it ran, from Ray's task events, on the shared cluster."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import jupyter_cluster as jc

from .conftest import remote, run

pytestmark = [pytest.mark.ray, pytest.mark.timeout(300)]


def test_a_map_cells_spans_add_up_to_its_work_and_make_a_chrome_trace(shell: Any, tmp_path: Path) -> None:
    run(shell, "import time")
    assert remote(shell, "time.sleep(0.2)\nsquare = i * i", "--map i in range(20)").success
    timeline = jc.timeline()
    spans = timeline.spans
    assert list(spans.columns) == ["name", "node", "worker", "state", "start", "end"]
    assert set(spans["state"]) == {"FINISHED"} and set(spans["name"]) == {"--map items"}, spans
    busy = float((spans["end"] - spans["start"]).sum())
    assert 20 * 0.2 <= busy < 20 * 0.2 + 30, f"{busy:.1f} s busy for 4 s of work"  # the work, and its chunks' start
    assert (spans["start"] >= 0).all() and (spans["end"] >= spans["start"]).all()
    trace = json.loads(timeline.to_chrome_trace(tmp_path / "cell.json").read_text())
    spans_in_trace = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert len(spans_in_trace) == len(spans) and all(e["dur"] > 0 for e in spans_in_trace)
    assert {e["name"] for e in trace["traceEvents"] if e["ph"] == "M"} == {"process_name", "thread_name"}
    svg = timeline.picture()
    assert svg.startswith("<svg") and svg.count("<rect x=") == len(spans), "a bar a span"


def test_a_driver_cells_four_tasks_are_on_its_timeline_and_an_earlier_cell_is_named_by_number(shell: Any) -> None:
    result = remote(
        shell,
        "import time\n@ray.remote\ndef four(i):\n    time.sleep(0.3)\n    return i\n"
        "ray.get([four.remote(i) for i in range(4)])",
        "--driver",
    )
    assert result.success
    number = shell.execution_count - 1
    assert remote(shell, "x = 1").success  # a later cell
    timeline = jc.timeline(number)
    spans = timeline.spans
    assert list(spans["name"]) == ["four"] * 4 and set(spans["state"]) == {"FINISHED"}, spans
    assert ((spans["end"] - spans["start"]) >= 0.3).all()
    assert "4 tasks and actor calls" in repr(timeline)
    with pytest.raises(jc.InputError, match="no %%remote cell In"):
        jc.timeline(10_000)


def test_nested_tasks_and_actor_calls_of_a_task_cell(shell: Any) -> None:
    body = (
        "import ray\n@ray.remote\ndef leaf(i):\n    return i\n@ray.remote\nclass Counter:\n"
        "    def add(self, n):\n        return n\ncounter = Counter.remote()\n"
        "total = sum(ray.get([leaf.remote(i) for i in range(3)])) + ray.get(counter.add.remote(2))"
    )
    assert remote(shell, body).success
    names = list(jc.timeline().spans["name"])
    assert names.count("leaf") == 3 and "Counter.add" in names and "the cell" in names, names
