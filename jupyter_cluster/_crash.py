"""Why an agent died, in words: its exit status or signal, and where a crash hit.

A ``--driver`` cell runs in the agent, the session's Ray driver. Code that ends that process (a C extension's
segfault, a ``kill -9``, the kernel's out-of-memory killer) takes the session with it: nothing in the process
can catch it. What can be done is to say so, plainly. The agent has Python's :mod:`faulthandler` write to
``crash.txt`` beside its socket, so a fatal signal leaves the stacks of its threads, the cell's line among
them; its exit status says the rest. The kernel reads both once the agent is gone.
"""

from __future__ import annotations

import re
import signal

from .agent.watching._deaths import CRASH_FILE

#: What Python's faulthandler writes first: "Fatal Python error: Segmentation fault".
_FATAL = re.compile(r"Fatal Python error: (.+)")
#: A frame of a remote cell in a faulthandler dump: ``  File "<remote-cell-…>", line 3 in <module>``.
_CELL_FRAME = re.compile(r'File "(<remote-cell-[0-9a-f]+>)", line (\d+) in ')


def how_it_ended(code: int | None, crash: str = "", oom_killed: bool = False) -> str:
    """``segmentation fault (SIGSEGV)``, ``killed by the out-of-memory killer (SIGKILL)``, ``exit status 3``."""
    fatal = _FATAL.search(crash)
    if code is not None and code < 0:
        number = -code
        try:
            name = signal.Signals(number).name
        except ValueError:
            name = f"signal {number}"
        if number == signal.SIGKILL:
            return f"killed by the out-of-memory killer ({name})" if oom_killed else f"killed ({name})"
        words = (fatal.group(1) if fatal else signal.strsignal(number) or name).strip().rstrip(".")
        return f"{words[:1].lower()}{words[1:]} ({name})"
    if fatal:
        return fatal.group(1).strip().rstrip(".")
    if code is None:
        return "its process ended"
    return f"exit status {code}"


def crash_site(crash: str) -> tuple[str, int] | None:
    """The innermost cell frame of the thread that crashed (faulthandler names it first): filename and line."""
    current = crash.find("Current thread")
    found = _CELL_FRAME.search(crash, current if current >= 0 else 0)
    return (found.group(1), int(found.group(2))) if found else None


__all__ = ["CRASH_FILE", "crash_site", "how_it_ended"]
