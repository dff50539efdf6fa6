"""The training and trial widgets, fed the events a run sends (no cluster needed).

The events are those the agent's runner and workers emit (see ``agent/runs/_train.py`` and
``agent/runs/_tune.py``); the widgets' Bokeh documents are watched for how they change:
rows are streamed and patched, never replaced, at the view's tick (``redraw``), with its
table.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from jupyter_cluster.agent.cells._execute import RemoteFailure
from jupyter_cluster.widgets._training import TrainingView
from jupyter_cluster.widgets._trials import TrialsView


class Changes:
    """The document events of a Bokeh layout, by kind."""

    def __init__(self, view: Any) -> None:
        self.kinds: list[str] = []
        document = view.layout_root.document
        assert document is not None
        document.on_change(lambda event: self.kinds.append(type(event).__name__))


def report(rank: int, number: int, **metrics: float) -> dict[str, Any]:
    return {
        "type": "report",
        "rank": rank,
        "world": 2,
        "report": number,
        "time": time.time(),
        "metrics": metrics,
        "checkpoint": False,
    }


def test_training_view_draws_one_line_until_the_workers_differ() -> None:
    view = TrainingView("jc.train_torch(f)", 2)
    view.on_event("train", {"type": "start", "time": time.time(), "num_workers": 2, "name": "x"}, None)
    view.on_event("train", report(0, 1, epoch=1, loss=0.9, accuracy=0.5), None)
    changes = Changes(view)  # the figures exist: from here on, only data changes
    view.on_event("train", report(1, 1, epoch=1, loss=0.9, accuracy=0.5), None)
    view.redraw(now=True)
    assert view.sources["loss"].data["worker"] == ["all workers"]  # the same values: one line
    view.on_event("train", report(0, 2, epoch=2, loss=0.5, accuracy=0.7), None)
    view.on_event("train", report(1, 2, epoch=2, loss=0.6, accuracy=0.7), None)  # now loss differs
    view.redraw(now=True)
    loss = view.sources["loss"].data
    assert loss["worker"] == ["rank 0", "rank 1"]
    assert loss["xs"] == [[1.0, 2.0], [1.0, 2.0]] and loss["ys"] == [[0.9, 0.5], [0.9, 0.6]]
    assert view.sources["accuracy"].data["worker"] == ["all workers"]  # accuracy still agrees
    assert "epoch" not in view.sources  # a counter is the x axis, not a curve
    assert set(changes.kinds) <= {"ColumnsPatchedEvent", "ColumnsStreamedEvent"}, changes.kinds
    html = view.snapshot()
    assert "rank 0" in html and "rank 1" in html and "report 2" in html
    assert len(view.latency) == 4 and all(drawn >= sent for sent, drawn in view.latency)


def test_training_view_shows_a_worker_error_and_the_end() -> None:
    view = TrainingView("jc.train_torch(f)", 2)
    view.on_event("train", report(0, 1, loss=1.0), None)
    failure = RemoteFailure("ValueError", "builtins", "rank 1 gave up", [], None)
    view.on_event("train", {"type": "error", "rank": 1, "time": time.time(), "failure": failure}, None)
    view.finish("failed", None)
    html = view.snapshot()
    assert "failed" in html and "ValueError: rank 1 gave up" in html and "1 worker(s) failed" in html
    assert view.sources["loss"].data["xs"] == [[1.0]]  # no epoch reported: the report's number


def trial(trial_id: str, state: str, **extra: Any) -> dict[str, Any]:
    return {
        "type": "trial",
        "trial": trial_id,
        "name": trial_id,
        "config": {"lr": 0.1, "net": {"width": 8}},
        "state": state,
        "time": time.time(),
        **extra,
    }


def result(trial_id: str, iteration: int, score: float, stopped: bool = False) -> dict[str, Any]:
    return {
        "type": "result",
        "trial": trial_id,
        "iteration": iteration,
        "metrics": {"score": score},
        "time": time.time(),
        "stopped": stopped,
    }


def test_trials_view_streams_trials_and_marks_early_stops_and_errors() -> None:
    view = TrialsView("jc.tune(f)", "score", "max")
    changes = Changes(view)
    view.on_event("tune", {"type": "start", "time": time.time(), "metric": "score", "mode": "max"}, None)
    for name in ("a", "b", "c"):
        view.on_event("tune", trial(name, "RUNNING"), None)
    view.on_event("tune", result("a", 1, 0.2), None)
    view.on_event("tune", result("b", 1, 0.5), None)
    view.on_event("tune", result("c", 1, 0.4), None)
    view.on_event("tune", result("a", 2, 0.3, stopped=True), None)  # ASHA stops a
    view.on_event("tune", trial("a", "TERMINATED"), None)
    failure = RemoteFailure("ArithmeticError", "builtins", "diverged", [], None)
    view.on_event("tune", {"type": "error", "trial": "c", "time": time.time(), "failure": failure}, None)
    view.on_event("tune", trial("c", "ERROR", error="ArithmeticError: diverged"), None)
    view.on_event("tune", result("b", 2, 0.9), None)
    view.on_event("tune", trial("b", "TERMINATED"), None)
    view.redraw(now=True)

    curves = view.curves.data
    assert curves["trial"] == ["a", "b", "c"]
    assert curves["xs"][1] == [1.0, 2.0] and curves["ys"][1] == [0.5, 0.9]
    assert curves["color"][0] == "#9e9e9e" and curves["color"][2] == "#c62828"  # stopped grey, errored red
    assert view.ends.data["marker"] == ["x", "circle"]
    assert set(changes.kinds) <= {"ColumnsPatchedEvent", "ColumnsStreamedEvent"}, changes.kinds
    assert view.trials["a"]["state"] == "STOPPED"  # a later TERMINATED does not undo it
    html = view.table_html()
    assert html.index(">b<") < html.index(">c<") < html.index(">a<") or html.index(">b<") < html.index(">a<")
    assert "stopped early" in html and "ArithmeticError: diverged" in html and "net/width=8" in html
    assert "best score 0.9" in view.summary()


@pytest.mark.parametrize("mode,best", [("min", 0.2), ("max", 0.5)])
def test_trials_view_best_follows_the_mode(mode: str, best: float) -> None:
    view = TrialsView("jc.tune(f)", "score", mode)
    view.on_event("tune", result("a", 1, 0.2), None)
    view.on_event("tune", result("b", 1, 0.5), None)
    found = view.best()
    assert found is not None and found[1]["last"] == best


def test_a_run_leaves_a_picture_of_its_curves() -> None:
    """What a saved notebook shows where no widgets run: the final curves, as an SVG."""
    view = TrainingView("jc.train_torch(f)", 2)
    for number in (1, 2, 3):
        for rank in (0, 1):
            metrics = {"epoch": number, "loss": 1.0 / number + rank, "lr": 0.1}
            view.on_event(
                "train",
                {"type": "report", "rank": rank, "report": number, "metrics": metrics, "time": time.time()},
                None,
            )
    svg = view.picture()
    assert svg.startswith("<svg") and svg.endswith("</svg>")
    assert svg.count("<polyline") == 3, "loss per worker (they differ), lr once (they agree)"
    assert ">loss<" in svg and ">lr<" in svg and ">rank 1<" in svg and ">epoch<" in svg

    trials = TrialsView("jc.tune(f)", "score", "max")
    trials.on_event("tune", result("a", 1, 0.2), None)
    trials.on_event("tune", result("a", 2, 0.3, stopped=True), None)
    trials.on_event("tune", result("b", 1, 0.5), None)
    trials.on_event("tune", trial("c", "RUNNING"), None)
    trials.on_event("tune", result("c", 1, 0.1), None)
    trials.on_event("tune", trial("c", "ERROR", error="ArithmeticError: diverged"), None)
    svg = trials.picture()
    assert svg.count("<polyline") == 3 and 'stroke-opacity="0.55"' in svg  # a stopped trial is faded
    assert "<path d=" in svg and 'r="4" fill="none"' in svg  # its x, and the failed trial's circle
    assert TrialsView("jc.tune(g)", "score", "max").picture() == ""


def test_a_runs_error_is_the_first_its_users_code_raised_not_the_clean_ups() -> None:
    """Rank 1 raised; Ray Train stopped rank 0 at a collective call, which raised Ray's ActorDiedError of the
    synchronisation actor the clean-up killed. Whichever came in first, and whatever the ranks, the run's error is
    rank 1's own."""
    from types import SimpleNamespace

    from jupyter_cluster._runs import Run, _cause

    def failure(type_name: str, module: str) -> RemoteFailure:
        return RemoteFailure(type_name, module, f"{type_name} happened", [], None)

    for ray_first in (True, False):
        cell = SimpleNamespace(cell_id="c-1", label="jc.train_torch(f)", subscribe=lambda listener: None)
        run = Run("train", cell, None, lambda run, summary: None)  # type: ignore[arg-type]
        events = [
            {
                "type": "error",
                "rank": 0,
                "time": 1.0 if ray_first else 3.0,
                "failure": failure("ActorDiedError", "ray.exceptions"),
            },
            {"type": "error", "rank": 1, "time": 2.0, "failure": failure("ValueError", "builtins")},
        ]
        for event in events:
            run._on_event("train", event)
        cause = _cause(run)
        assert isinstance(cause, ValueError) and "ValueError happened" in str(cause), (ray_first, cause)


def test_the_curves_and_the_table_show_the_same_results_at_every_tick() -> None:
    """Results that come between two ticks wait for the next one, curve and table alike: a picture of the widget
    never shows a trial's curve at an iteration its row has not reached."""
    view = TrialsView("jc.tune(f)", "score", "max")
    view.on_event("tune", trial("a", "RUNNING"), None)
    view.on_event("tune", result("a", 1, 0.2), None)
    view.redraw(now=True)
    assert view.curves.data["xs"] == [[1.0]] and "<td>1</td>" in view.table.value
    view.on_event("tune", result("a", 2, 0.3), None)  # within the tick's quarter second: drawn at the next
    if view._scheduled:  # on a slow machine the quarter second may have passed already, and it drew both
        assert view.curves.data["xs"] == [[1.0]] and "<td>1</td>" in view.table.value
    view.redraw(now=True)
    assert view.curves.data["xs"] == [[1.0, 2.0]] and "<td>2</td>" in view.table.value
    assert all(drawn >= made for made, drawn in view.latency) and len(view.latency) == 2


def test_a_running_run_s_header_says_its_run_time_each_second() -> None:
    """Between two reports the header's run time goes on, as the sidebar's clock does; it stops at the end."""
    from types import SimpleNamespace

    view = TrialsView("jc.tune(f)", "score", "max")
    view.started(SimpleNamespace(started=time.time() - 5.0))
    first = view.header.value
    assert "run time 5." in first, first
    time.sleep(2.3)
    assert "run time 7." in view.header.value, view.header.value  # with no event in between
    view.finish("done", SimpleNamespace(ended=time.time()))
    ended = view.header.value
    time.sleep(1.5)
    assert view.header.value == ended
