"""Errors the notebook sees, and how a remote traceback is shown.

A cell that fails on the cluster raises a :class:`RemoteError` in the notebook. Its
class is made on the fly to also derive from the original exception's class (as Ray's
``RayTaskError`` does), so ``except ZeroDivisionError`` still works; IPython renders
it through ``_render_traceback_`` with the cell's own lines and numbers, and without
the frames of this package or of Ray.
"""

from __future__ import annotations

import builtins
import importlib
import linecache
import re
from typing import Any

from .agent._errors import ClusterError
from .agent.cells._execute import RemoteFailure, cell_filename

RED, GREEN, CYAN, BOLD, RESET = "\x1b[31m", "\x1b[32m", "\x1b[36m", "\x1b[1m", "\x1b[0m"


class ClusterConnectionError(ClusterError, ConnectionError):
    """The agent could not be reached, or refused the session."""


class AgentLostError(ClusterConnectionError):
    """The agent is gone (its process exited, or it could not be reached again)."""

    def __init__(self, reason: str, then: str | None = None) -> None:
        if then is None:
            then = (
                "The notebook's variables are intact; `%cluster local` (or `jc.local()`) starts a new embedded cluster."
            )
        super().__init__(f"the cluster's agent is gone: {reason}. {then}")
        self.reason = reason


class LinkLostError(ClusterConnectionError):
    """The link to a remote agent stayed down longer than ``reconnect_for``.

    The agent, the session and the work in flight live on on the head: connecting
    again with the session's name resumes them.
    """

    def __init__(self, message: str, session: str, resume: str | None = None) -> None:
        super().__init__(message)
        self.session = session
        self.resume = resume


class WaitTimeoutError(ClusterError, TimeoutError):
    """A wait with a timeout ran out: a handle not ready, or the agent silent."""


class RequestError(ClusterError):
    """The agent refused or failed a request; the message says why."""

    def __init__(self, message: str, detail: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.detail = detail or {}


class CellSourceError(ClusterError):
    """A ``%%remote`` cell's source cannot run on the cluster (a syntax error, say).

    Raised by the magic in place of the :class:`SyntaxError` that
    :meth:`Cluster.run_cell` raises, so the notebook shows the cell's line and not
    the frames of IPython's magic machinery.
    """

    def __init__(self, error: SyntaxError) -> None:
        super().__init__(error.msg)
        self.lineno, self.offset, self.text = error.lineno, error.offset, error.text

    def _render_traceback_(self) -> list[str]:
        lines = [f"{RED}SyntaxError{RESET}: {self}"]
        if self.text and self.lineno:
            lines.append(f"  {self.lineno:>4} {self.text.rstrip()}")
            if self.offset:
                lines.append(" " * (7 + self.offset - 1) + "^")
        return lines


class InputError(ClusterError, ValueError):
    """A cell's input cannot be sent to the cluster."""


class MissingOutputError(ClusterError, NameError):
    """A name an ``--async`` cell was to bind (``--out``) that it did not assign."""


# What a notebook reports as the error's name (the reply's ``ename``) is the builtin's.
MissingOutputError.__name__ = "NameError"


class WorkerDiedError(ClusterError):
    """The process running a cell died (it exited, crashed, ran out of memory), or its actor did."""


class CellInterrupted(KeyboardInterrupt):
    """A remote cell stopped by an interrupt (a ``KeyboardInterrupt``, which ``except KeyboardInterrupt``
    catches): what the notebook shows is this one line, under its own name, ``jc.CellInterrupted``."""

    def _render_traceback_(self) -> list[str]:
        return [f"{RED}CellInterrupted{RESET}: {self}"]


class RemoteError(ClusterError):
    """An exception raised by a cell on the cluster.

    Attributes
    ----------
    failure
        The remote exception's type, message and frames.
    label
        How the cell is named in the traceback (``"Cell In[5]"``).
    where
        Where it ran (``"task on 10.0.0.2"``).
    """

    failure: RemoteFailure
    label: str
    where: str
    source: str
    cell_id: str
    #: A last line saying how this cell met the error (an input from a failed cell).
    note: str = ""

    def __str__(self) -> str:
        return self.failure.message + (f" ({self.note})" if self.note else "")

    def _render_traceback_(self) -> list[str]:
        return render_traceback(self)


class CellTimeoutError(RemoteError, TimeoutError):
    """A cell ran past its ``--timeout`` and was cancelled."""


_classes: dict[type, type] = {}


def _original_class(failure: RemoteFailure) -> type[BaseException] | None:
    try:
        module = builtins if failure.module == "builtins" else importlib.import_module(failure.module)
        cls = module
        for part in failure.type_name.split("."):
            cls = getattr(cls, part)
    except Exception:  # not importable here: a plain RemoteError will do
        return None
    return cls if isinstance(cls, type) and issubclass(cls, Exception) else None


#: Packages whose import name differs from what pip installs.
_PIP_NAMES = {
    "sklearn": "scikit-learn",
    "yaml": "pyyaml",
    "cv2": "opencv-python",
    "PIL": "pillow",
    "gymnasium": "gymnasium",
    "ale_py": "ale-py",
}
#: What to say besides, for some of them.
_PIP_NOTES = {
    "gymnasium": " (for RLlib: pip install 'ray[rllib]')",
    "ale_py": " (Atari environments: pip install 'gymnasium[atari]')",
}
_MISSING_MODULE = re.compile(r"No module named '([^']+)'")
_GYM_NOT_FOUND = ("NamespaceNotFound", "NameNotFound", "DependencyNotInstalled")
#: How to get a gymnasium environment that is not registered on the cluster.
_GYM_HOW = "(Atari: pip install 'gymnasium[atari]'; a custom environment: register it where it is made)"


def missing_package(failure: RemoteFailure, where: str) -> str:
    """A note for an error that says a package is missing on the cluster, else "".

    >>> f = RemoteFailure("ModuleNotFoundError", "builtins", "No module named 'sklearn.svm'", [], None)
    >>> print(missing_package(f, "task"))  # doctest: +ELLIPSIS
    `sklearn` is not installed on the cluster (the task could not import it): run the cell with --pip scikit-learn ...
    """
    if failure.type_name == "ModuleNotFoundError":
        match = _MISSING_MODULE.search(failure.message)
        if match:
            top = match.group(1).split(".")[0]
            place = f" (the {where} could not import it)" if where else ""
            pip = _PIP_NAMES.get(top, top)
            if where == "driver":  # the agent's own Python: Ray's runtime_env does not reach it
                how = f"install it in the head's Python (pip install {pip})"
            else:
                how = (
                    f"run the cell with --pip {pip} (`%%remote --pip {pip}`; Ray installs it on the nodes that run "
                    f"the cell), give it to every cell with jc.current().set_runtime_env({{'pip': [{pip!r}]}}), "
                    f"or install it in the cluster's Python (pip install {pip})"
                )
            return f"`{top}` is not installed on the cluster{place}: {how}{_PIP_NOTES.get(top, '')}"
    if failure.type_name in _GYM_NOT_FOUND and failure.module.startswith("gymnasium"):
        return f"the environment is not registered on the cluster: its package is missing or not imported {_GYM_HOW}"
    return ""


#: An environment error gymnasium raised in one of RLlib's env runners: RLlib logs it,
#: takes the runner out of service and then fails with an error of its own.
_GYM_LOGGED = re.compile(r"gymnasium\.error\.(?:NamespaceNotFound|NameNotFound|DependencyNotInstalled): ([^\n)]+)")


def cause_in_output(stderr: str) -> str:
    """A note for a cell whose real cause Ray only logged (into the cell's stderr), else "".

    >>> cause_in_output("...gymnasium.error.NamespaceNotFound: Namespace ALE not found. Have you...?), taking")
    "the environment could not be made on the cluster: Namespace ALE not found. Have you...?; its package is ..."
    """
    match = _GYM_LOGGED.search(stderr)
    if match is None:
        return ""
    return (
        f"the environment could not be made on the cluster: {match.group(1).strip()}; its package is missing "
        f"there or not imported {_GYM_HOW}"
    )


def remote_error(failure: RemoteFailure, source: str, cell_id: str, label: str, where: str) -> RemoteError:
    """The exception to raise in the notebook for ``failure``.

    A failure that came from an upstream cell (one whose output this cell read) is
    shown as that cell's error, with its label and source, and a note saying so.
    """
    note = ""
    if failure.origin:
        reader = label
        source, label, where = failure.origin_source, failure.origin, ""
        if failure.via:
            note = f"{reader} did not run: its input `{failure.via}` comes from {label}, which failed"
    base: type[RemoteError] = RemoteError
    if "--timeout" in failure.message and failure.interrupted:
        base = CellTimeoutError
    original = _original_class(failure)
    cls: type[RemoteError] = base
    if original is not None and not issubclass(base, original):
        cls = _classes.get(original)  # type: ignore[assignment]
        if cls is None:
            try:
                cls = type(original.__name__, (base, original), {"__module__": original.__module__})
            except TypeError:  # an incompatible layout (some C exceptions)
                cls = base
            _classes[original] = cls
    error = cls.__new__(cls)
    Exception.__init__(error, failure.message)
    error.failure, error.source, error.cell_id, error.label, error.where = failure, source, cell_id, label, where
    error.note = note or missing_package(failure, where)
    return error


def failed_input(name: str, error: BaseException, reader: str) -> ClusterError:
    """The error of a cell that reads ``name``, a handle whose cell failed: that cell's
    own error (with a note), so the cell does not run with nothing in its place."""
    if isinstance(error, RemoteError):
        copy = remote_error(error.failure, error.source, error.cell_id, error.label, error.where)
        copy.note = f"{reader} did not run: its input `{name}` comes from {error.label}, which failed"
        return copy
    if isinstance(error, KeyboardInterrupt):
        why = f"the cell that computes it was cancelled ({error})"
    else:
        why = f"the cell that computes it failed: {error}"
    return InputError(f"`{name}` has no value: {why}. {reader} did not run.")


def _frame_label(filename: str, error: RemoteError) -> tuple[str, list[str]]:
    if filename == cell_filename(error.source):
        where = f" ({error.where})" if error.where else ""
        return f"{error.label} on the cluster{where}", error.source.splitlines()
    if filename.startswith("<remote-cell-"):
        return "an earlier remote cell", [line.rstrip("\n") for line in linecache.getlines(filename)]
    try:
        from IPython import get_ipython

        shell = get_ipython()
        if shell is not None:
            kind, name = shell.compile.format_code_name(filename) or (None, None)
            if kind:
                return f"{kind} {name}", linecache.getlines(filename)
    except Exception:
        pass
    return f"File {filename}", linecache.getlines(filename)


Frame = tuple[str, int, str, str]


def collapse_repeats(frames: list[Frame], least: int = 3) -> list[Frame | tuple[list[Frame], int]]:
    """Frames with each run of a repeated stretch (a recursion) kept once, as IPython does.

    A run is a stretch of up to 8 frames repeated at least ``least`` times in a row;
    it becomes ``(stretch, times it repeats after the first)``.
    """
    out: list[Frame | tuple[list[Frame], int]] = []
    i = 0
    while i < len(frames):
        for period in range(1, 9):
            stretch = frames[i : i + period]
            repeats = 1
            while frames[i + repeats * period : i + (repeats + 1) * period] == stretch:
                repeats += 1
            if repeats >= least:
                out.extend(stretch)
                out.append((stretch, repeats - 1))
                i += repeats * period
                break
        else:
            out.append(frames[i])
            i += 1
    return out


def render_traceback(error: RemoteError, context: int = 2) -> list[str]:
    """IPython-style traceback lines for a remote failure (ANSI colours included).

    A failure without frames of the user's (a worker that died, a cancel) is one line.
    """
    failure = error.failure
    title = "CellTimeoutError" if isinstance(error, CellTimeoutError) else failure.type_name
    note = [f"({error.note}.)"] if error.note else []
    if not failure.frames:
        return [f"{RED}{title}{RESET}: {failure.message}", *note]
    lines = [
        f"{RED}{'-' * 75}{RESET}",
        f"{RED}{title}{RESET}".ljust(len(RED) + len(RESET) + 42) + "Traceback (most recent call last)",
    ]
    for frame in collapse_repeats(failure.frames):
        if isinstance(frame[0], list):
            stretch, times = frame
            names = ", ".join(f"{name} at line {lineno}" for _, lineno, name, _ in stretch)
            lines.append(f"    [... skipping similar frames: {names} ({times} times)]\n")
            continue
        filename, lineno, name, text = frame
        label, source = _frame_label(filename, error)
        where = f"{CYAN}{label}{RESET}, line {lineno}" + (f", in {name}" if name != "<module>" else "")
        block = [where]
        if source and 0 < lineno <= len(source):
            for number in range(max(1, lineno - context), min(len(source), lineno + context) + 1):
                code = source[number - 1].rstrip("\n")
                if number == lineno:
                    block.append(f"{GREEN}----> {number:<3}{RESET}{code}")
                else:
                    block.append(f"      {number:<3}{code}")
        elif text:
            block.append(f"{GREEN}----> {lineno:<3}{RESET}{text}")
        lines.append("\n".join(block) + "\n")
    lines.append(f"{RED}{title}{RESET}: {failure.message}")
    return lines + note


def plain(lines: list[str]) -> str:
    """Traceback lines without ANSI colours (for logs and tests)."""
    text = "\n".join(lines)
    for code in (RED, GREEN, CYAN, BOLD, RESET):
        text = text.replace(code, "")
    return text
