"""``%debug`` after a failed ``%%remote`` cell: pdb on the frames where the remote code raised.

The worker sent a snapshot of the user's frames with the failure (:mod:`.agent.cells._snapshot`). Here
those frames are made again as real Python frames: for each, a function of the same name and
arguments, compiled under the remote file's name so that its line numbers are the remote ones,
holding the remote values as its locals and the globals its code names, each calling the next
on the line where the remote frame did, the innermost raising the remote exception on the line
where it was raised. What pdb then walks is an ordinary traceback: ``p``, ``pp``, ``l``, ``ll``,
``w``, ``u``, ``d`` and ``a`` work as they do on local frames. Nothing runs again: no line of the
user's code is executed here. The source the notebook has (its cells, its functions) is in
``linecache`` already; a file only the cluster has came with the snapshot.

A value that could not travel (too large, or not picklable) is a :class:`Unavailable`, whose repr is
the remote repr and a note.
"""

from __future__ import annotations

import builtins
import keyword
import linecache
import os
import pickle
import types
from typing import Any

from ._errors import RemoteError
from .agent.cells._snapshot import FrameSnapshot, Value


class _Raised(Exception):
    """What the innermost made frame raises (the remote error itself keeps its own traceback)."""


class Unavailable:
    """A remote value that did not travel: its repr there, and why."""

    def __init__(self, text: str, note: str) -> None:
        self.text = text
        self.note = note

    def __repr__(self) -> str:
        return f"{self.text}  # (on the cluster; {self.note})"


def _load(value: Value) -> Any:
    if value.pickled is None:
        return Unavailable(value.text, value.note or "it did not travel")
    try:
        return pickle.loads(value.pickled)
    except Exception as exc:  # a type this kernel cannot import (torch on a laptop without it)
        return Unavailable(value.text, f"cannot be loaded here: {type(exc).__name__}: {exc}")


def _identifier(name: str) -> bool:
    return name.isidentifier() and not keyword.iskeyword(name)


def _known_file(frame: FrameSnapshot) -> None:
    """Let linecache show the frame's source: the notebook's own files it has; a file only the cluster has came
    with the snapshot."""
    if frame.lines is not None and not os.path.exists(frame.filename) and not linecache.getlines(frame.filename):
        linecache.cache[frame.filename] = (sum(map(len, frame.lines)), None, list(frame.lines), frame.filename)


def _make(frame: FrameSnapshot, call: Any, call_args: list[Any], exc: BaseException) -> tuple[Any, list[Any]]:
    """Frame ``frame`` made again: what to call, and with what, to enter a frame like the remote one, which from
    its line calls ``call(*call_args)`` (the next frame), or raises ``exc`` (the innermost). The call is to the made
    function itself (or to ``exec``, which adds no frame of its own), so that no frame of this module's stands
    between two remote ones."""
    values = {name: _load(v) for name, v in frame.locals.items()}
    helpers = {"__jc_next": call, "__jc_args": call_args, "__jc_exc": exc, "__jc_values": values}
    # The helpers are builtins of this frame only: neither its locals nor its globals show them.
    frame_builtins = {**builtins.__dict__, **helpers}
    action = "raise __jc_exc" if call is None else "return __jc_next(*__jc_args)"
    if frame.name == "<module>" or (not frame.args and frame.firstlineno >= frame.lineno):
        namespace = dict(values)
        namespace.update({name: _load(v) for name, v in frame.globals.items()})
        namespace["__builtins__"] = frame_builtins
        namespace.setdefault("__name__", "__main__")
        statement = action.replace("return ", "")
        code = compile("\n" * (frame.lineno - 1) + statement + "\n", frame.filename, "exec")
        if frame.name != "<module>":
            code = code.replace(co_name=frame.name)
        return exec, [code, namespace]
    namespace = {name: _load(v) for name, v in frame.globals.items()}
    namespace["__builtins__"] = frame_builtins
    namespace.setdefault("__name__", "__main__")
    args = [a for a in frame.args if _identifier(a)]
    others = [n for n in values if n not in args and _identifier(n)]
    assign = "".join(f"{n} = __jc_values[{n!r}]; " for n in others)
    body_line = max(frame.lineno, frame.firstlineno + 1)
    source = (
        "\n" * (frame.firstlineno - 1)
        + f"def __jc_frame({', '.join(args)}):"
        + "\n" * (body_line - frame.firstlineno)
        + f"    {assign}{action}\n"
    )
    compiled = compile(source, frame.filename, "exec")
    exec(compiled, namespace)
    function = namespace.pop("__jc_frame")
    function.__code__ = function.__code__.replace(co_name=frame.name, co_qualname=frame.name)
    return function, [values.get(a, Unavailable("?", "not in the snapshot")) for a in args]


def remote_traceback(error: RemoteError) -> types.TracebackType | None:
    """The remote frames of ``error`` made again (see the module's doc), innermost last; None without a snapshot."""
    frames = getattr(error.failure, "snapshot", None)
    if not frames:
        return None
    exc: BaseException = _Raised(str(error))
    call: Any = None
    call_args: list[Any] = []
    for frame in reversed(frames):
        _known_file(frame)
        call, call_args = _make(frame, call, call_args, exc)
    try:
        call(*call_args)
    except BaseException as raised:
        if raised is not exc:
            raise
        tb = raised.__traceback__
        # The first frames are this module's own (the call into the made frames): pdb starts at the remote ones.
        while tb is not None and tb.tb_frame.f_code.co_filename == __file__:
            tb = tb.tb_next
        return tb
    return None


def debug_remote(shell: Any, error: RemoteError) -> bool:
    """Open pdb in the notebook on ``error``'s remote frames; False when it carries no snapshot."""
    tb = remote_traceback(error)
    if tb is None:
        return False
    where = f" on {error.failure.node}" if getattr(error.failure, "node", "") else ""
    print(
        f"Post-mortem of {error.label} ({error.where}): the frames where it raised{where}, as a snapshot taken "
        "then. The values are copies; one that could not travel shows as its repr, with a note."
    )
    debugger = shell.debugger_cls()
    debugger.reset()
    debugger.interaction(None, tb)
    return True


__all__ = ["Unavailable", "debug_remote", "remote_traceback"]
