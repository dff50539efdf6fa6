"""The base of this package's own errors.

It lives with the agent, which imports only the standard library, so that an error both sides raise (a search
space's :class:`~._space.SpaceError`, checked in the notebook and again on the cluster) is one of them too.
"""

from __future__ import annotations

RED, RESET = "\x1b[31m", "\x1b[0m"


class ClusterError(Exception):
    """Base of this package's own errors."""

    def _render_traceback_(self) -> list[str]:
        # What went wrong and what to do; the frames inside this package help no one.
        return [f"{RED}{type(self).__name__}{RESET}: {self}"]


__all__ = ["ClusterError"]
