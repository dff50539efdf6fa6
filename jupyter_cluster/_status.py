"""What ``%cluster status`` shows: the link, the nodes, what runs there."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from ._handles import format_size


def started_actor(actor: dict[str, Any]) -> str:
    """One actor a cell started, in words.

    >>> started_actor({"name": "counter", "class": "Counter", "detached": True, "state": "ALIVE"})
    'counter (Counter, detached, ALIVE)'
    """
    detail = ", ".join([actor["class"]] + (["detached"] if actor.get("detached") else []) + [actor["state"]])
    return f"{actor.get('name') or '(unnamed)'} ({detail})"


@dataclass
class ClusterStatus:
    """A snapshot of the cluster, as ``%cluster status`` shows it."""

    data: dict[str, Any] | None
    kind: str
    dashboard: str | None = None
    link: dict[str, Any] = field(default_factory=dict)
    #: The cluster's Python version (the agent's).
    python: str = ""
    #: Open port forwards, a line each.
    forwards: list[str] = field(default_factory=list)
    #: The cluster YAML of Ray's cluster launcher the cluster was started or found from, if any.
    launcher: str | None = None
    #: Whether this notebook ran ``ray up`` on it (``down`` then runs ``ray down``), or found it running.
    launched_here: bool = True

    def launcher_line(self) -> str | None:
        """Where the cluster came from, when it is one of Ray's cluster launcher."""
        if self.launcher is None:
            return None
        if self.launched_here:
            return f"started by Ray's cluster launcher from {self.launcher} (`%cluster down` runs `ray down`)"
        return (
            f"Ray's cluster launcher's cluster of {self.launcher}, found running (`%cluster down` detaches and "
            f"leaves it up; `ray down -y {self.launcher}` stops it)"
        )

    def _link_line(self) -> str:
        link = self.link
        state = link.get("state", "connected")
        if state == "reconnecting":
            since = time.strftime("%H:%M:%S", time.localtime(link["since"]))
            return (
                f"  link: reconnecting to {link['target']} since {since} "
                f"({time.time() - link['since']:.0f} s, {link['attempts']} attempt(s); last: {link['last_error']})"
            )
        if state == "lost":
            return f"  link: lost ({link.get('error')})"
        rtt = f", round trip {link['rtt'] * 1000:.1f} ms" if link.get("rtt") is not None else ""
        return f"  link: {state} to {link.get('target', '?')}, session {link.get('session', '?')}{rtt}"

    def __str__(self) -> str:
        data = self.data
        if data is None:
            return "\n".join(
                [
                    f"{self.kind} cluster",
                    *([f"  {self.launcher_line()}"] if self.launcher else []),
                    self._link_line(),
                    "  (nodes, cells and actors show once the link is back)",
                    *self._forward_lines(),
                ]
            )
        lines = [f"{self.kind} Ray {data['ray']} cluster, {len(data['nodes'])} node(s)"]
        if self.launcher:
            lines.append(f"  {self.launcher_line()}")
        if self.link:
            lines.append(self._link_line())
        if self.dashboard:
            lines.append(f"  Ray dashboard: {self.dashboard}")
        for node in data["nodes"]:
            res = node["resources"]
            load = node.get("load") or {}
            head = " (head)" if node["head"] else ""
            store = format_size(res.get("object_store_memory", 0))
            if "store_used" in load:
                store = f"{format_size(load['store_used'])} used of {store}"
            busy = f" ({load['cpu']:.0f} % busy)" if "cpu" in load else ""
            lines.append(
                f"  {node['address']}{head}: {res.get('CPU', 0):g} CPU{busy}, {res.get('GPU', 0):g} GPU, "
                f"memory {format_size(res.get('memory', 0))}, object store {store}"
            )
        avail = data["available"]
        lines.append(f"  available: {avail.get('CPU', 0):g} CPU, {avail.get('GPU', 0):g} GPU")
        lines.append(f"  objects held for this notebook: {data['objects']}")
        cells = data["cells"]
        lines.append(f"  running cells: {len(cells)}")
        for cell in cells:
            progress = f" {cell['done']}/{cell['total']}" if cell["mode"] == "map" else ""
            lines.append(f"    {cell['cell_id']} ({cell['mode']}{progress}, {cell['elapsed']:.1f} s)")
        lines.append(f"  actors: {len(data['actors'])}")
        for name, actor in data["actors"].items():
            names = ", ".join(actor.get("names", [])) or "-"
            if actor.get("running"):  # busy: it answers once its cell is done
                detail = f"running cell {actor['running']}; names before it: {names}"
            else:
                detail = actor.get("error") or f"on {actor.get('node')}, names: {names}"
            lines.append(f"    {name}: {detail}")
        lines += self._started_lines(data.get("started"))
        lines += self._forward_lines()
        return "\n".join(lines)

    @staticmethod
    def _started_lines(started: dict[str, Any] | None) -> list[str]:
        """What driver cells started: Serve applications, actors, placement groups."""
        if not started or not any(started.values()):
            return []
        lines = ["  started by cells (jc.current().reset_driver() stops them):"]
        for name, app in started["serve"].items():
            message = f": {app['message']}" if app.get("message") else ""
            lines.append(f"    Serve application {name}: {app['status']}{message}")
        for actor in started["actors"]:
            lines.append(f"    actor {started_actor(actor)}")
        groups = started["placement_groups"]
        if groups:
            lines.append(f"    placement groups: {len(groups)} ({', '.join(g['state'] for g in groups)})")
        return lines

    def _forward_lines(self) -> list[str]:
        if not self.forwards:
            return []
        return [f"  port forwards: {len(self.forwards)}", *(f"    {line}" for line in self.forwards)]

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        printer.text(str(self))

    def _repr_html_(self) -> str:
        from .widgets._card import status_html

        return status_html(self)

    def html(self, button: bool = False) -> str:
        """The card; ``button``: with "Open dashboard", for JupyterLab's sidebar extension."""
        from .widgets._card import status_html

        return status_html(self, button)
