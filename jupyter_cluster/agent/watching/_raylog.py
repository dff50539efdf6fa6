"""Ray's own words: what Ray logs is kept out of the cells, in the cluster's log.

A cell shows the user's work. Ray's libraries log as they work (Train's controller asks for
resources, Serve's proxy starts, RLlib warns about its API stack), Ray's C++ core writes lines of
its own, and Ray's code raises warnings. Left alone, all of that lands in whichever cell started
the work. Here it goes to the cluster's log instead (``%cluster logs``, the sidebar), and a cell
says in one line how many warnings Ray logged while it ran.

A line is Ray's when it is
- a record of a logger named ``ray`` or ``ray.…``, or logged by code inside Ray's package,
  written by a console handler (Ray's files keep their copies);
- a line of Ray's C++ core (``[2026-11-26 03:42:53,382 E 31794 31835] core_worker.cc:2465: …``);
- a warning whose code is inside Ray's package;
- anything one of Ray's libraries' own actors writes (:data:`RAY_ACTORS`: Train's controller,
  Serve's proxy; not the actors that run the user's code);
- what Ray's driver says of errors elsewhere (``(raylet) Task … failed``).

In a worker, such a record or warning is written to the worker's stderr with :data:`MARK_RAY` and its
level before each line: the agent, which gets every line of every worker through Ray's log monitor,
knows it for Ray's. In the agent (the driver of every cell) it goes to the cluster's log at once.

The names of Ray's libraries' actors, and of this project's own tasks and actors, also tell the
dashboard which tasks and actors are the user's and which are the system's (:func:`is_system`).

This module runs in the agent and in every worker: it imports only the standard library.
"""

from __future__ import annotations

import logging
import os
import re
import sys
import threading
import warnings
from collections.abc import Callable
from typing import Any

#: Before each line of one of Ray's records in a worker's output: ``:jc_ray:W text``.
MARK_RAY = ":jc_ray:"
#: A line of Ray's C++ core (glog's format): the level letter is group 1.
CORE_LINE = re.compile(r"^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ ([DIWEF]) \d+ \d+\] ")
#: A terminal escape (Ray colours its prefixes): never kept in what the notebook saves.
ESCAPE = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")

#: The actors of Ray's libraries that run no code of the user's: what they write is Ray's.
RAY_ACTORS = frozenset(
    {
        # Ray Train (v2)
        "TrainController",
        "SynchronizationActor",
        "PreemptionWatcher",
        "PlacementGroupCleaner",
        "TrainStateActor",
        "DatasetManager",
        # Ray Data
        "_AutoscalingCoordinatorActor",
        "SplitCoordinator",
        "_StatsActor",
        "_StatsSummaryActor",
        "_UsageCollectionActor",
        # Ray Serve
        "ServeController",
        "ProxyActor",
    }
)
#: This project's own tasks and actors (the output relay, the interrupts, the joins of a map's lists...).
OWN_TASKS = frozenset(
    {
        "OutputRelay",
        "interrupt_actor_cell",
        "assemble",
        "assemble_tuple",
        "join_lists",
        "_worker_pid",
    }
)

#: The tasks and actors that run the cells themselves: a cell's task, a map's chunks, ``jc.map``'s calls, an actor
#: cell's namespace. The cells' progress counts them exactly, as they start and end; Ray's gauges, seconds behind,
#: count them apart from the tasks and actors the cells' code starts on its own.
CELL_TASKS = frozenset({"run_cell_task", "run_map_chunk", "run_function", "CellNamespace"})

#: What a Ray record says of its level, as a letter (glog's).
LEVELS = ((logging.ERROR, "E"), (logging.WARNING, "W"), (logging.INFO, "I"))
#: The letters counted as warnings in a cell's note.
WARNING_LEVELS = frozenset("WEF")


def level_letter(levelno: int) -> str:
    return next((letter for floor, letter in LEVELS if levelno >= floor), "D")


def is_system(name: str) -> bool:
    """Whether a task or actor named ``name`` (Ray's ``Name`` label: ``Class``, ``Class.method``, a named actor's
    ``actor-name:Class.method``, or a function's name) is Ray's libraries' machinery or this project's own, not the
    user's work."""
    head = name.rsplit(":", 1)[-1].split(".", 1)[0]
    return head in RAY_ACTORS or head in OWN_TASKS


def kind_of(name: str) -> str:
    """Whose a task or actor named ``name`` (Ray's ``Name`` label) is: ``"system_"`` (see :func:`is_system`),
    ``"cell_"`` (a cell's own: :data:`CELL_TASKS`) or ``""`` (what the user's code started), as the prefix of the
    sample's field that counts it."""
    if is_system(name):
        return "system_"
    return "cell_" if name.rsplit(":", 1)[-1].split(".", 1)[0] in CELL_TASKS else ""


def marked(line: str) -> tuple[str, str] | None:
    """``(level letter, text)`` when ``line`` of a worker's output is Ray's (marked, or of Ray's core)."""
    if line.startswith(MARK_RAY):
        rest = line[len(MARK_RAY) :]
        return rest[:1] or "I", rest[2:]
    core = CORE_LINE.match(line)
    if core is not None:
        return core.group(1), line
    return None


def plain(text: str) -> str:
    """``text`` without terminal escapes."""
    return ESCAPE.sub("", text)


# ------------------------------------------------------------------ which records and warnings are Ray's

_ray_dir: str | None = None


def _inside_ray(path: str | None) -> bool:
    global _ray_dir
    if not path:
        return False
    if _ray_dir is None:
        ray = sys.modules.get("ray")
        where = getattr(ray, "__file__", None)
        if not where:
            return False
        _ray_dir = os.path.dirname(where) + os.sep
    return path.startswith(_ray_dir)


def is_rays(record: logging.LogRecord) -> bool:
    """Whether a log record is Ray's: of Ray's loggers, or logged by Ray's code."""
    name = record.name
    return name == "ray" or name.startswith("ray.") or _inside_ray(record.pathname)


#: Where Ray's words go in this process: ``sink(level letter, text)``; None: where they went before.
Sink = Callable[[str, str], None]
_sink: Sink | None = None
_installed = False
_busy = threading.local()  # a sink that logs must not come back here


def install(sink: Sink) -> None:
    """From now on, Ray's console log records and Ray's warnings in this process go to ``sink``."""
    global _sink, _installed
    _sink = sink
    if _installed:
        return
    _installed = True
    emit = logging.StreamHandler.emit

    def emit_unless_rays(self: logging.Handler, record: logging.LogRecord) -> None:
        console = _sink is not None and not isinstance(self, logging.FileHandler)
        if console and is_rays(record) and _to_sink(level_letter(record.levelno), self, record):
            return
        emit(self, record)

    logging.StreamHandler.emit = emit_unless_rays  # type: ignore[method-assign]
    show = warnings.showwarning

    def show_unless_rays(
        message: Warning | str,
        category: type[Warning],
        filename: str,
        lineno: int,
        file: Any = None,
        line: str | None = None,
    ) -> None:
        if _sink is not None and file is None and _inside_ray(filename):
            text = warnings.formatwarning(message, category, filename, lineno, line).rstrip("\n")
            if _deliver("W", text):
                return
        show(message, category, filename, lineno, file, line)

    warnings.showwarning = show_unless_rays


def _to_sink(letter: str, handler: logging.Handler, record: logging.LogRecord) -> bool:
    try:
        text = handler.format(record)
    except Exception:
        return False
    return _deliver(letter, text)


def _deliver(letter: str, text: str) -> bool:
    sink = _sink
    if sink is None or getattr(_busy, "on", False):
        return False
    _busy.on = True
    try:
        sink(letter, plain(text))
        return True
    except Exception:
        return False
    finally:
        _busy.on = False


def marking_sink(stream: Any) -> Sink:
    """A worker's sink: each line written to ``stream`` (the worker's own stderr) with :data:`MARK_RAY`."""

    def sink(letter: str, text: str) -> None:
        stream.write("".join(f"{MARK_RAY}{letter} {line}\n" for line in text.splitlines() or [""]))
        stream.flush()

    return sink


__all__ = [
    "CELL_TASKS",
    "CORE_LINE",
    "MARK_RAY",
    "OWN_TASKS",
    "RAY_ACTORS",
    "WARNING_LEVELS",
    "install",
    "is_rays",
    "is_system",
    "kind_of",
    "level_letter",
    "marked",
    "marking_sink",
    "plain",
]
