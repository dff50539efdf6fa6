"""The frames where a cell's code raised, as they were: what ``%debug`` in the notebook opens.

When a cell's code raises on the cluster, the worker takes a snapshot of each frame of the
user's code in the traceback (the cell's own, the notebook's functions): its file, line,
function, arguments, its locals and the globals its code names, and the source lines of a file
the notebook may not have. Values travel pickled (cloudpickle) when they can and are small
enough; otherwise as their ``repr``, with a note saying why. No worker waits for a debugger:
the snapshot is taken as the exception passes, and the worker goes on.

Limits keep a failure small: :data:`VALUE_BYTES` a value, :data:`FRAME_BYTES` a frame,
:data:`TOTAL_BYTES` a snapshot, :data:`REPR_CHARS` a repr.

This module runs in the workers and the agent: it imports only the standard library and
cloudpickle.
"""

from __future__ import annotations

import inspect
import linecache
import reprlib
import types
from dataclasses import dataclass, field
from typing import Any

try:
    import cloudpickle
except ImportError:  # a head without it: Ray carries its own copy
    from ray import cloudpickle  # type: ignore[no-redef,unused-ignore]

#: The most a value may weigh pickled to travel as itself (larger ones travel as their repr).
VALUE_BYTES = 1 << 20
#: The most one frame's values, and one snapshot's, may weigh.
FRAME_BYTES = 8 << 20
TOTAL_BYTES = 16 << 20
#: The longest repr kept.
REPR_CHARS = 2_000
#: The longest source file whose lines travel with a frame.
SOURCE_LINES = 5_000

_repr = reprlib.Repr()
_repr.maxstring = REPR_CHARS
_repr.maxother = REPR_CHARS
_repr.maxlong = REPR_CHARS


@dataclass
class Value:
    """One local or global: pickled when it could travel, its repr always, and why it is only a repr."""

    text: str
    pickled: bytes | None = None
    note: str = ""


@dataclass
class FrameSnapshot:
    """One frame of the user's code, as it was when the exception passed through it."""

    filename: str
    lineno: int
    name: str
    firstlineno: int
    args: list[str]
    locals: dict[str, Value] = field(default_factory=dict)
    globals: dict[str, Value] = field(default_factory=dict)
    #: The file's lines, when it is not one the notebook has (None: the notebook's own, or unread).
    lines: list[str] | None = None


def _value(value: Any, budget: list[int]) -> Value:
    try:
        text = repr(value)
        if len(text) > REPR_CHARS:
            text = _repr.repr(value)
    except Exception as exc:
        text = f"<{type(value).__qualname__} whose repr failed: {type(exc).__name__}: {exc}>"
    if isinstance(value, types.ModuleType):
        return Value(text, cloudpickle.dumps(value))  # by name
    try:
        pickled = cloudpickle.dumps(value)
    except Exception as exc:
        return Value(text, None, f"could not be pickled ({type(exc).__name__}: {exc})"[:300])
    if len(pickled) > VALUE_BYTES:
        return Value(text, None, f"{len(pickled) / 2**20:.1f} MiB pickled: only its repr travelled")
    if len(pickled) > budget[0]:
        return Value(text, None, "the snapshot's room was spent: only its repr travelled")
    budget[0] -= len(pickled)
    return Value(text, pickled)


def _names(code: types.CodeType) -> set[str]:
    """The global names ``code`` (and the code nested in it) reads."""
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _names(const)
    return names


def _args(code: types.CodeType) -> list[str]:
    count = code.co_argcount + code.co_kwonlyargcount
    count += bool(code.co_flags & inspect.CO_VARARGS) + bool(code.co_flags & inspect.CO_VARKEYWORDS)
    return list(code.co_varnames[:count])


def snapshot(
    tb: types.TracebackType | None, keep: Any, room: int = TOTAL_BYTES, cell: tuple[str, set[str]] | None = None
) -> list[FrameSnapshot]:
    """A snapshot of the frames of ``tb`` that ``keep(filename)`` says are the user's, outermost first, their values
    ``room`` bytes at most. ``cell``: the cell's file and every name its source uses (its top level runs as more
    than one code object: the last expression apart), which its module-level frames show."""
    frames: list[FrameSnapshot] = []
    total = [room]
    while tb is not None:
        frame, lineno = tb.tb_frame, tb.tb_lineno
        code = frame.f_code
        tb = tb.tb_next
        if not keep(code.co_filename):
            continue
        budget = [min(FRAME_BYTES, total[0])]
        module_level = frame.f_locals is frame.f_globals
        shown = _names(code) if module_level else set(frame.f_locals)
        if module_level and cell is not None and code.co_filename == cell[0]:
            shown |= cell[1]
        local_values = {
            name: _value(value, budget)
            for name, value in list(frame.f_locals.items())
            if name in shown and not name.startswith("__")
        }
        global_values = {}
        if not module_level:
            builtins = frame.f_builtins
            for name in sorted(_names(code)):
                if name in frame.f_globals and name not in builtins and not name.startswith("__"):
                    global_values[name] = _value(frame.f_globals[name], budget)
        total[0] -= min(FRAME_BYTES, total[0]) - budget[0]
        lines = None
        if not code.co_filename.startswith("<"):  # a file: its lines, should the notebook lack it
            found = linecache.getlines(code.co_filename, frame.f_globals)
            lines = found if 0 < len(found) <= SOURCE_LINES else None
        frames.append(
            FrameSnapshot(
                filename=code.co_filename,
                lineno=lineno,
                name=code.co_name,
                firstlineno=code.co_firstlineno,
                args=[] if module_level else _args(code),
                locals=local_values,
                globals=global_values,
                lines=lines,
            )
        )
    return frames


__all__ = ["FRAME_BYTES", "TOTAL_BYTES", "VALUE_BYTES", "FrameSnapshot", "Value", "snapshot"]
