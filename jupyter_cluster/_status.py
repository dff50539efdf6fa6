"""What ``%cluster status`` shows: the link, the nodes, what runs there."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from ._handles import format_size


@dataclass
class ClusterStatus:
    """A snapshot of the cluster, as ``%cluster status`` shows it."""

    data: dict[str, Any] | None
    kind: str
    dashboard: str | None = None
    link: dict[str, Any] = field(default_factory=dict)
    #: The cluster's Python version (the agent's).
    python: str = ""

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
                [f"{self.kind} cluster", self._link_line(), "  (nodes, cells and actors show once the link is back)"]
            )
        lines = [f"{self.kind} Ray {data['ray']} cluster, {len(data['nodes'])} node(s)"]
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
        return "\n".join(lines)

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        printer.text(str(self))

    def _repr_html_(self) -> str:
        from .widgets._card import status_html

        return status_html(self)

    def html(self, button: bool = False) -> str:
        """The card; ``button``: with "Open dashboard", for JupyterLab's sidebar extension."""
        from .widgets._card import status_html

        return status_html(self, button)
