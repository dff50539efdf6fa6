"""What ``%cluster status`` shows: the link, the nodes, what runs there, as text and as a card.

The card (a cluster's HTML repr, and the sidebar's) is one compact HTML table: the link
(target, session, state, round trip), versions, each node's resources and load, running
cells, actors, and the Ray dashboard's local link. Static HTML, so it reads the same in a
saved notebook; the plain-text twin is ``str(status)``.
"""

from __future__ import annotations

import html
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
    """A snapshot of the cluster, as ``%cluster status`` shows it.

    What the cluster holds, summed over its nodes, for code that sizes its work to it (None while
    the link is down): ``cpus`` and ``gpus`` (Ray's logical ones), ``memory_total`` and
    ``memory_used`` (bytes of RAM, as each node's Ray reports it: a container's limit where there
    is one), and ``memory_available``, the difference.

    >>> status = jc.current().status()                                    # doctest: +SKIP
    >>> workers = 2 if status.memory_available > 3 * 2**30 else 0         # doctest: +SKIP
    """

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
    #: What a terminal on this machine sets for Ray's own CLI to reach the cluster (the embedded one).
    ray_env: str | None = None

    def _summed(self, key: str) -> float | None:
        if self.data is None:
            return None
        return float(sum(((node.get("load") or {}).get(key) or 0.0) for node in self.data["nodes"]))

    @property
    def cpus(self) -> float | None:
        return None if self.data is None else float(sum(n["resources"].get("CPU", 0) for n in self.data["nodes"]))

    @property
    def gpus(self) -> float | None:
        return None if self.data is None else float(sum(n["resources"].get("GPU", 0) for n in self.data["nodes"]))

    @property
    def memory_total(self) -> int | None:
        total = self._summed("mem_total")
        return None if total is None else int(total)

    @property
    def memory_used(self) -> int | None:
        used = self._summed("mem_used")
        return None if used is None else int(used)

    @property
    def memory_available(self) -> int | None:
        total, used = self.memory_total, self.memory_used
        return None if total is None or used is None else max(0, total - used)

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
            lines.append(f"  Ray dashboard: {self.dashboard}{_TOKEN_HINT if self.ray_env else ''}")
        if self.ray_env:
            lines.append(
                f"  Ray's CLI in a terminal here: export {self.ray_env} (then ray status, ray list actors, ...)"
            )
        for node in data["nodes"]:
            res = node["resources"]
            load = node.get("load") or {}
            head = " (head)" if node["head"] else ""
            store = format_size(res.get("object_store_memory", 0))
            if "store_used" in load:
                store = f"{format_size(load['store_used'])} used of {store}"
            lines.append(
                f"  {node['address']}{head}: {res.get('CPU', 0):g} CPU{_cpu_use(load)}, {res.get('GPU', 0):g} GPU, "
                f"RAM {_ram(res, load)}, object store {store}"
            )
        avail = data["available"]
        lines.append(f"  available: {avail.get('CPU', 0):g} CPU, {avail.get('GPU', 0):g} GPU")
        lines.append(f"  objects held for this notebook: {data['objects']}")
        cells = data["cells"]
        lines.append(f"  running cells: {len(cells)}")
        for cell in cells:
            progress = f" {cell['done']}/{cell['total']}" if cell["mode"] == "map" else ""
            name = cell.get("label") or cell["cell_id"]
            lines.append(f"    {name} ({cell['mode']}{progress}, {cell['elapsed']:.1f} s)")
        lines.append(f"  actors: {len(data['actors'])}")
        for name, actor in data["actors"].items():
            names = ", ".join(actor.get("names", [])) or "-"
            if actor.get("running"):  # busy: it answers once its cell is done
                detail = f"running cell {actor['running']}; names before it: {names}"
            else:
                detail = actor.get("error") or f"on {actor.get('node')}, names: {names}"
            lines.append(f"    {name}: {detail}")
        lines += self._started_lines(data.get("started"))
        others = others_said(data.get("others"), data.get("sessions"))
        if others:
            lines.append(f"  also on this cluster: {others} (their cells and actors are theirs: not listed here)")
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
        return status_html(self)

    def html(self, button: bool = False) -> str:
        """The card; ``button``: with "Open dashboard", for JupyterLab's sidebar extension."""
        return status_html(self, button)


# ------------------------------------------------------------------ the card
_STATE_COLORS = {"connected": "#2e7d32", "reconnecting": "#ef6c00", "lost": "#c62828", "detached": "#757575"}
_STYLE = (
    "<style>.jc-card{font-size:12px;border:1px solid #ddd;border-radius:4px;padding:6px 10px;display:inline-block}"
    ".jc-card table{border-collapse:collapse;margin:4px 0;font-size:inherit}"
    ".jc-card th,.jc-card td{padding:1px 8px;text-align:left;border-bottom:1px solid #eee}"
    ".jc-card .jc-muted{color:#777}</style>"
)


class ClusterLogs:
    """The cluster's log (``Cluster.logs``, ``%cluster logs``): the workers' lines that no running cell took.

    ``lines``: ``(time, stream, text)`` oldest first; ``total``: how many came in all (the agent keeps the latest
    ``kept``). Printed, the lines in order, stderr's marked, after a line saying how many are not kept.
    """

    def __init__(self, lines: list[Any], total: int, kept: int) -> None:
        self.lines = [(float(when), str(stream), str(text)) for when, stream, text in lines]
        self.total = total
        self.kept = kept

    def __len__(self) -> int:
        return len(self.lines)

    def __str__(self) -> str:
        if not self.total:
            return "The cluster's log is empty: every line the workers printed went to the cell that started the work."
        head = []
        if self.total > len(self.lines):
            shown = f"the last {len(self.lines):,}" if self.lines else "none"
            head.append(f"[{self.total:,} lines in the cluster's log; {shown} shown]")
        body = [f"{text}" if stream == "stdout" else f"{text}  [stderr]" for _, stream, text in self.lines]
        return "\n".join(head + body)

    def __repr__(self) -> str:
        return str(self)


def _e(value: Any) -> str:
    return html.escape(str(value))


def _link(status: ClusterStatus) -> str:
    link = status.link
    state = link.get("state", "connected")
    color = _STATE_COLORS.get(state, "#333")
    parts = [f'<b style="color:{color}">{_e(state)}</b>']
    if link.get("target"):
        parts.append(f"to {_e(link['target'])}")
    if link.get("session"):
        parts.append(f"session <code>{_e(link['session'])}</code>")
    if state == "connected" and link.get("rtt") is not None:
        parts.append(f"round trip {link['rtt'] * 1000:.1f} ms")
    elif state == "reconnecting":
        since = time.time() - link.get("since", time.time())
        parts.append(f"for {since:.0f} s, {link.get('attempts', 0)} attempt(s): {_e(link.get('last_error', ''))}")
    elif state == "lost":
        parts.append(_e(link.get("error", "")))
    return " ".join(parts)


def others_said(others: list[dict[str, Any]] | None, sessions: dict[str, int] | None = None) -> str:
    """The cluster's other users in words, or '' where there are none: the other notebooks on this agent
    (``sessions``: attached, detached), other agents' notebooks and other Ray drivers (``others``, from Ray's job
    table).

    >>> others_said([{"notebook": True}, {"notebook": False}], {"attached": 2, "detached": 1})
    '3 other notebooks on this agent (1 detached), 1 notebook of another agent, 1 other Ray driver'
    """
    parts = []
    attached, detached = (sessions or {}).get("attached", 0), (sessions or {}).get("detached", 0)
    if attached + detached:
        count = attached + detached
        said = f" ({detached} detached)" if detached else ""
        parts.append(f"{count} other notebook{'s' * (count != 1)} on this agent{said}")
    notebooks = sum(1 for other in others or [] if other.get("notebook"))
    drivers = len(others or []) - notebooks
    if notebooks:
        parts.append(f"{notebooks} notebook{'s' * (notebooks != 1)} of another agent")
    if drivers:
        parts.append(f"{drivers} other Ray driver{'s' * (drivers != 1)}")
    return ", ".join(parts)


def _cpu_use(load: dict[str, Any]) -> str:
    """`` (1.5 in use, 0.5 free; host 57 % busy)``: the CPUs Ray's tasks and actors hold and those left (one read
    of Ray's resource view: they add up to the node's), then the host's load, named so (it counts everything the
    machine runs)."""
    parts = []
    if "CPU" in load.get("resources", {}):
        used, total = load["resources"]["CPU"]
        parts.append(f"{used:g} in use, {max(0.0, total - used):g} free")
    if "cpu" in load:
        parts.append(f"host {load['cpu']:.0f} % busy")
    return f" ({'; '.join(parts)})" if parts else ""


def _ram(res: dict[str, Any], load: dict[str, Any]) -> str:
    """The node's RAM, the same in the card's text and HTML: the host's use where Ray's metrics have it, else
    what Ray lets tasks ask for (its ``memory`` resource)."""
    if "mem_used" in load:
        return f"{format_size(load['mem_used'])} used of {format_size(load.get('mem_total', 0))}"
    return f"{format_size(res.get('memory', 0))} for tasks"


def _node_row(node: dict[str, Any]) -> str:
    res = node.get("resources", {})
    load = node.get("load") or {}
    name = _e(node.get("address")) + (' <span class="jc-muted">(head)</span>' if node.get("head") else "")
    if load.get("stale"):
        name += f' <span class="jc-muted">(metrics stale: {_e(load["stale"])})</span>'
    cpu = f"{res.get('CPU', 0):g}"
    if "CPU" in load.get("resources", {}):
        used, total = load["resources"]["CPU"]
        cpu += f" · {used:g} in use, {max(0.0, total - used):g} free"
    if "cpu" in load:
        cpu += f' <span class="jc-muted">(host {load["cpu"]:.0f} % busy)</span>'

    gpus = f"{res.get('GPU', 0):g}"
    if load.get("gpus"):
        gpus += " · " + ", ".join(f"{g.get('utilization', 0):.0f} %" for _, g in sorted(load["gpus"].items()))
    store_total = res.get("object_store_memory", 0)
    store = format_size(store_total)
    if "store_used" in load:
        store = f"{format_size(load['store_used'])} / {store}"
    cells = (name, cpu, gpus, _ram(res, load), store)
    return "<tr>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>"


def _list(items: list[str]) -> str:
    return f"<ul>{''.join(items)}</ul>" if items else ""


#: Where Ray's dashboard's token comes from, when Ray runs with token authentication (its page asks for it).
_TOKEN_HINT = " (it asks for Ray's token: `ray get-auth-token`)"

#: Opens the live dashboard in a JupyterLab tab: the sidebar extension shows the button
#: (it is ``hidden`` elsewhere, where nothing would answer it) and handles its clicks.
DASHBOARD_BUTTON = (
    '<button data-jupyter-cluster-dashboard hidden class="jc-dashboard-button" '
    'title="Open the live dashboard in a JupyterLab tab">Open dashboard</button>'
)


def status_html(status: ClusterStatus, button: bool = False) -> str:
    """The card as HTML; ``button``: with the "Open dashboard" button (a cluster's repr)."""
    data = status.data
    rows = [f"<tr><th>link</th><td>{_link(status)}</td></tr>"]
    if status.launcher and status.launched_here:
        rows.append(
            f"<tr><th>started by</th><td>Ray's cluster launcher from <code>{_e(status.launcher)}</code> "
            "(<code>%cluster down</code> runs <code>ray down</code>)</td></tr>"
        )
    elif status.launcher:
        rows.append(
            f"<tr><th>launcher</th><td>found running: Ray's cluster launcher's cluster of "
            f"<code>{_e(status.launcher)}</code> (<code>%cluster down</code> detaches and leaves it up)</td></tr>"
        )
    versions = []
    if data is not None:
        versions.append(f"Ray {_e(data['ray'])}")
    if status.python:
        versions.append(f"Python {_e(status.python)} on the cluster")
    if versions:
        rows.append(f"<tr><th>versions</th><td>{', '.join(versions)}</td></tr>")
    if status.dashboard:
        url = _e(status.dashboard)
        hint = _e(_TOKEN_HINT) if status.ray_env else ""
        rows.append(f'<tr><th>Ray dashboard</th><td><a href="{url}" target="_blank">{url}</a>{hint}</td></tr>')
    if status.ray_env:
        rows.append(
            f"<tr><th>Ray's CLI</th><td>in a terminal here: <code>export {_e(status.ray_env)}</code>, then "
            "<code>ray status</code>, <code>ray list actors</code>, <code>ray job submit</code></td></tr>"
        )
    head = f"<b>{_e(status.kind)}</b>"
    if data is None:
        body = "<table>" + "".join(rows) + "</table>"
        note = '<div class="jc-muted">Nodes, cells and actors show once the link is back.</div>'
        return f'{_STYLE}<div class="jc-card jc-status">{head}{body}{note}</div>'
    avail = data["available"]
    rows.append(
        f"<tr><th>available</th><td>{avail.get('CPU', 0):g} CPU, {avail.get('GPU', 0):g} GPU; "
        f"{data['objects']} object(s) held for this notebook</td></tr>"
    )
    nodes = (
        "<table><thead><tr><th>node</th><th>CPU</th><th>GPU</th><th>RAM</th><th>object store</th></tr></thead>"
        "<tbody>" + "".join(_node_row(n) for n in data["nodes"]) + "</tbody></table>"
    )
    cells = data["cells"]
    cell_items = []
    for cell in cells:
        progress = f" {cell['done']}/{cell['total']}" if cell["mode"] == "map" else ""
        label = cell.get("label") or cell["cell_id"]
        cell_items.append(f"<li>{_e(label)} ({_e(cell['mode'])}{progress}, {cell['elapsed']:.1f} s)</li>")
    actor_items = []
    for name, actor in data["actors"].items():
        if actor.get("running"):
            detail = f"running {actor['running']}"
        else:
            detail = actor.get("error") or f"on {actor.get('node')}: {', '.join(actor.get('names', [])) or '-'}"
        actor_items.append(f"<li><code>{_e(name)}</code> {_e(detail)}</li>")
    lists = (
        f"<div>running cells: {len(cells)}{_list(cell_items)}</div>"
        f"<div>actors: {len(actor_items)}{_list(actor_items)}</div>"
    )
    started = data.get("started") or {}
    started_items = [
        f"<li>Serve application <code>{_e(name)}</code> {_e(app['status'])}</li>"
        for name, app in started.get("serve", {}).items()
    ]
    started_items += [f"<li>actor {_e(started_actor(a))}</li>" for a in started.get("actors", [])]
    if started.get("placement_groups"):
        started_items.append(f"<li>placement groups: {len(started['placement_groups'])}</li>")
    if started_items:
        lists += (
            f'<div>started by cells: {len(started_items)} <span class="jc-muted">'
            f"(<code>jc.current().reset_driver()</code> stops them)</span>{_list(started_items)}</div>"
        )
    others = others_said(data.get("others"), data.get("sessions"))
    if others:
        lists += f'<div>also on this cluster: {_e(others)} <span class="jc-muted">(their work: not listed)</span></div>'
    if status.forwards:
        forward_items = [f"<li>{_e(line)}</li>" for line in status.forwards]
        lists += f"<div>port forwards: {len(forward_items)}{_list(forward_items)}</div>"
    title = f"{head}: {len(data['nodes'])} node(s)" + (f" {DASHBOARD_BUTTON}" if button else "")
    return f'{_STYLE}<div class="jc-card jc-status">{title}<table>{"".join(rows)}</table>{nodes}{lists}</div>'


__all__ = ["DASHBOARD_BUTTON", "ClusterLogs", "ClusterStatus", "others_said", "started_actor", "status_html"]
