"""``%cluster`` and ``%%remote``: thin magics over the Python API.

Options are parsed with IPython's ``magic_arguments`` (unknown options are a
``UsageError``); everything else is :mod:`jupyter_cluster._cluster`. A foreground
cell's output is written from the notebook's own thread as it arrives, so it lands
in that cell in order; an ``--async`` cell gets a display area of its own that its
later output updates, whichever cell runs then.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import shlex
import sys
import time
from typing import Any

import cloudpickle
from IPython.core.error import UsageError
from IPython.core.magic import Magics, cell_magic, line_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring

from . import _cluster, _environment
from ._cell import CellResult, RemoteCell
from ._errors import CellInterrupted, CellSourceError, ClusterError, InputError, RemoteError, plain
from ._handles import parse_size
from .widgets._progress import in_current_cell

_MAP = re.compile(r"--map\s+([A-Za-z_]\w*)\s+in\s+(.+?)(?=\s+--[a-z]|\s*$)")


def _display(obj: Any, **kwargs: Any) -> Any:
    from IPython.display import display

    return display(obj, **kwargs)


class _Later:
    """A redraw scheduled from another thread: it runs once anyway (an extra redraw at most)."""

    def cancel(self) -> None:
        pass


class _CellArea:
    """The display area of an ``--async`` cell: a status line and its output.

    While the cell runs, the area shows the last lines of its output, redrawn at most
    every :attr:`EVERY` seconds, so each update costs at most that tail; when the cell
    ends it shows the whole output once (its last :attr:`FINAL_CHARS` characters at
    most). What the area sends thus grows with the output, not with its square.
    """

    TAIL_LINES = 30
    TAIL_CHARS = 4000
    FINAL_CHARS = 1 << 20
    EVERY = 0.25

    def __init__(self, cell: RemoteCell) -> None:
        from .widgets._progress import ProgressBar, RemoteBars

        self.cell = cell
        self.parts: list[str] = []
        self.size = 0
        self.state = f"queued ({cell.where})"
        self.final = False
        self.bar = ProgressBar(cell.progress[1], "--map", show=False) if cell.mode == "map" else None
        #: Progress bars the cell's own code drew (tqdm, tqdm_ray), shown above its output.
        self.bars = RemoteBars(show=False)
        self._sent = 0.0
        self._timer: Any = None
        self.handle = _display(self, display_id=True)

    def add(self, kind: str, text: str) -> None:
        text = self.bars.feed(kind, text)
        if not text:
            return
        self.parts.append(text)
        self.size += len(text)

    def _tail(self, chars: int, lines: int | None) -> str:
        kept: list[str] = []
        size = 0
        for part in reversed(self.parts):
            kept.append(part)
            size += len(part)
            if size >= chars:
                break
        text = "".join(reversed(kept))[-chars:]
        if lines is not None:
            text = "".join(text.splitlines(keepends=True)[-lines:])
        if len(text) < self.size:
            return f"[… {self.size - len(text):,} characters above not shown]\n{text}"
        return text

    def text(self) -> str:
        if self.final:
            return self._tail(self.FINAL_CHARS, None)
        return self._tail(self.TAIL_CHARS, self.TAIL_LINES)

    def __repr__(self) -> str:
        head = f"[{self.cell.label} on the cluster: {self.status()}]"
        head += "".join(f"\n{bar.text()}" for bar in self.bars.bars.values())
        body = self.text()
        return head + ("\n" + body if body else "")

    def status(self) -> str:
        if self.bar is not None and not self.final and self.cell.status == "running":
            return self.bar.text()
        return self.state

    def _repr_html_(self) -> str:
        import html

        cell = self.cell
        color = {"failed": "#c62828", "cancelled": "#757575"}.get(cell.status, "#2e7d32" if cell.done() else "#1565c0")
        status = self.status().split("\n", 1)
        label = f"<b>{html.escape(cell.label)}</b>"
        line = f'{label} on the cluster: <span style="color:{color}">{html.escape(status[0])}</span>'
        if self.bar is not None and not self.final and cell.status == "running":
            line = f"{label} " + self.bar.bundle()["text/html"]
        body = "\n".join(status[1:]) + self.text()
        pre = f'<pre style="margin:2px 0">{html.escape(body)}</pre>' if body else ""
        bars = "".join(bar.bundle()["text/html"] for bar in self.bars.bars.values())
        return f'<div class="jc-cell-status jc-{cell.status}">{line}{bars}{pre}</div>'

    def update(self, now: bool = False) -> None:
        """Redraw, at once or within :attr:`EVERY` s (called on the link's event loop)."""
        if self.handle is None:
            return
        wait = self.EVERY - (time.monotonic() - self._sent)
        if now or wait <= 0:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            self._sent = time.monotonic()
            in_current_cell(self.handle.update, self)
        elif self._timer is None:
            try:
                self._timer = asyncio.get_running_loop().call_later(wait, self._redraw)
            except RuntimeError:  # not on the link's loop: a listener given the events so far, at subscribe
                from .widgets._progress import _later

                self._timer = _Later()
                _later(wait, self._redraw)

    def _redraw(self) -> None:
        self._timer = None
        self.update(now=True)


def preparing_text(data: dict[str, Any]) -> str:
    """A cell's status while Ray prepares its runtime_env: what, for how long, and Ray's last line of it."""
    line = f": {data['line']}" if data.get("line") else ""
    return f"preparing the environment ({data['what']}), {data['elapsed']:.0f} s{line}"


class _PreparingLine:
    """A foreground cell's status line while Ray prepares its runtime_env, redrawn in place."""

    def __init__(self, label: str) -> None:
        self.label = label
        self.text = ""
        self.handle: Any = None

    def __repr__(self) -> str:
        return f"[{self.label} on the cluster: {self.text}]"

    def show(self, data: dict[str, Any]) -> None:
        self.text = preparing_text(data)
        if self.handle is None:
            self.handle = _display(self, display_id=True)
        else:
            self.handle.update(self)

    def ready(self, elapsed: float) -> None:
        if self.handle is not None and not self.text.startswith("environment ready"):
            self.text = f"environment ready after {elapsed:.0f} s; running"
            self.handle.update(self)


def _cluster_parser() -> argparse.ArgumentParser:
    class Parser(argparse.ArgumentParser):
        def error(self, message: str) -> Any:
            raise UsageError(f"%cluster: {message}\n{self.format_usage()}")

    parser = Parser(prog="%cluster", add_help=False)
    commands = parser.add_subparsers(dest="command", parser_class=Parser)
    local = commands.add_parser("local", help="start the embedded local cluster and attach to it")
    local.add_argument("--cpus", type=float)
    local.add_argument("--gpus", type=float)
    local.add_argument("--object-store", type=str, help="e.g. 2GiB")
    connect = commands.add_parser("connect", help="attach to a Ray head over SSH")
    connect.add_argument(
        "target", nargs="?", help="[user@]host[:port], or k8s:[CONTEXT/]NAMESPACE/RAYCLUSTER (KubeRay, over kubectl)"
    )
    connect.add_argument("--config", help="a cluster YAML: attach to the running cluster Ray's launcher started")
    connect.add_argument(
        "--via",
        help="a command that runs a program on the head, stdin and stdout joined to ours, instead of a head to "
        "reach over SSH: 'kubectl exec -i -n ray POD -c ray-head --', 'docker exec -i CONTAINER', 'ssh -p 2222 host'",
    )
    up = commands.add_parser("up", help="start Ray on a head and workers over SSH (or with `ray up`), and attach")
    up.add_argument("head", nargs="?", help="[user@]host[:port]")
    up.add_argument("workers", nargs="*", help="[user@]host[:port] of each worker")
    up.add_argument("--config", help="a cluster YAML: Ray's own cluster launcher (`ray up`) starts the cluster")
    up.add_argument(
        "--restart", action="store_true", help="with --config: `ray up` even if Ray runs there (stops what runs)"
    )
    for sub in (local, connect, up):
        sub.add_argument(
            "--runtime-env",
            metavar="JSON",
            help="Ray's runtime_env for this session's cells, e.g. '{\"pip\": [\"pyjokes\"]}'",
        )
    for sub in (connect, up):
        sub.add_argument("--identity", help="private key file")
        sub.add_argument("--python", help="the head's Python (default: python3)")
        sub.add_argument("--known-hosts", help="known_hosts file, or `none` to skip the host key check")
        sub.add_argument("--keepalive", type=float, help="seconds of silence before the link counts as lost")
        sub.add_argument("--reconnect-for", type=float, help="seconds to keep reconnecting a lost link")
    connect.add_argument("--start-head", action="store_true", help="run `ray start --head` if no Ray runs there")
    connect.add_argument("--port", type=int, help="with --start-head: the port Ray's head listens on (default 6379)")
    connect.add_argument("--session", help="resume this session (its agent and running work)")
    connect.add_argument("--address", help="the Ray address (GCS host:port) to join, if the head runs several")
    connect.add_argument("--ray-token-file", help="a file holding the Ray cluster's token (token authentication)")
    commands.add_parser("disconnect", help="detach; the agent and its work keep running")
    commands.add_parser("status", help="nodes, resources, cells and actors")
    logs = commands.add_parser("logs", help="what Ray logged, and what the workers printed that no running cell took")
    logs.add_argument("--tail", type=int, default=200, help="how many of the latest lines (0: all the agent keeps)")
    dash = commands.add_parser("dashboard", help="a live dashboard of the cluster")
    dash.add_argument("--window", type=float, default=300.0, help="seconds of history in the time series")
    dash.add_argument(
        "--prometheus",
        metavar="URL|off",
        help="read the figures from this Prometheus server (its URL on the head), or scrape the nodes (off)",
    )
    sync = commands.add_parser("sync", help="send a folder (default: the notebook's) to run later cells in")
    sync.add_argument("path", nargs="?", help="the folder (default: the notebook's)")
    sync.add_argument("--exclude", action="append", default=[], metavar="GLOB", help="leave these out (repeatable)")
    sync.add_argument("--max-size", default="100MiB", help="refuse a folder larger than this (default 100MiB)")
    sync.add_argument("--off", action="store_true", help="stop running cells in the synced folder")
    timeline = commands.add_parser("timeline", help="the tasks and actor calls a %%%%remote cell ran, as a Gantt")
    timeline.add_argument("cell", nargs="?", type=int, help="the cell's number, N of In[N] (default: the last cell)")
    down = commands.add_parser("down", help="stop what `local` or `up` started")
    down.add_argument(
        "--force",
        action="store_true",
        help="even where other notebooks or Ray drivers use it (their work stops too), or where this notebook did "
        "not start it (its agent and what its cells started stop; the cluster stays up)",
    )
    forward = commands.add_parser("forward", help="reach a port of the head from here (Serve, TensorBoard)")
    forward.add_argument("port", help="the port on the head's loopback")
    forward.add_argument("--local", help="the port on this machine (default: any free one)")
    forward.add_argument("--close", action="store_true", help="close the forwards of PORT")
    return parser


@magics_class
class ClusterMagics(Magics):
    """The magics; ``%load_ext jupyter_cluster`` registers them."""

    @line_magic
    def cluster(self, line: str) -> Any:
        """Attach to, inspect or stop a cluster: ``%cluster local|status|down``."""
        args = _cluster_parser().parse_args(shlex.split(line))
        if args.command == "local":
            existing = _cluster.current()
            try:
                store = parse_size(args.object_store) if args.object_store else None
            except ValueError as exc:
                raise UsageError(f"%cluster local --object-store: {exc}") from None
            env = self._runtime_env(args)
            cluster = _cluster.local(cpus=args.cpus, gpus=args.gpus, object_store=store, runtime_env=env)
            if existing is cluster:
                print(f"Already attached: {cluster!r}. `%cluster down` first to start another.")
            else:
                print(f"Attached to {cluster!r}.")
                if cluster.mismatch:
                    print(f"Warning: {cluster.mismatch}", file=sys.stderr)
        elif args.command in ("connect", "up"):
            self._connect(args)
        elif args.command == "disconnect":
            attached = self._attached()
            attached.disconnect()
            print(
                f"Detached from session {attached.session}; its work goes on. "
                f"`%cluster connect {attached.kind.split(' ', 1)[-1]} --session {attached.session}` resumes it."
            )
        elif args.command == "status":
            _display(self._attached().status())
        elif args.command == "logs":
            if args.tail < 0:
                raise UsageError(f"%cluster logs --tail: a count of lines, 0 for all; got {args.tail}")
            print(self._attached().logs(tail=args.tail or None))
        elif args.command == "dashboard":
            from .widgets import Dashboard

            attached = self._attached()
            if args.prometheus is not None:
                attached.metrics_source(False if args.prometheus.lower() == "off" else args.prometheus)
            return Dashboard(attached, window=args.window)
        elif args.command == "timeline":
            from .widgets import Timeline

            try:
                return Timeline(self._attached().timeline(args.cell))
            except InputError as exc:
                raise UsageError(f"%cluster timeline: {exc}") from None
        elif args.command == "down":
            stopping = _cluster.current()
            if stopping is None:
                print("No cluster is attached.")
                return
            if stopping.kind.startswith("embedded"):
                message = "Stopped the embedded cluster."
            elif stopping.stoppers:
                message = "Stopped the agent and the Ray it started; detached."
            else:
                message = "Stopped this notebook's agent and what its cells started; detached. The cluster stays up."
            try:
                stopping.down(force=args.force)
            except ClusterError as exc:
                raise UsageError(f"%cluster down: {exc}") from None
            print(message)
        elif args.command == "forward":
            self._forward(args)
        elif args.command == "sync" and args.off:
            stopped = self._attached().unsync()
            print(
                "Later cells run in Ray's default working directory"
                + (" (the synced copy was removed)." if stopped else "; no folder was synced.")
            )
        elif args.command == "sync":
            try:
                result = self._attached().sync(args.path, args.exclude, args.max_size)
            except ValueError as exc:
                raise UsageError(f"%cluster sync: {exc}") from None
            print(repr(result)[1:-1])
        else:
            commands = "local, connect, up, disconnect, status, logs, dashboard, timeline, forward, sync or down"
            raise UsageError(f"%cluster needs a command: {commands}\n{_cluster_parser().format_usage()}")

    def _forward(self, args: argparse.Namespace) -> None:
        attached = self._attached()
        try:
            if args.close:
                closed = attached.close_forward(args.port)
                print(f"Closed the forward of port {args.port}." if closed else f"No port {args.port} is forwarded.")
                return
            forward = attached._open_forward(args.port, args.local)
        except ValueError as exc:
            raise UsageError(f"%cluster forward: {exc}") from None
        print(f"{forward.link} -> port {forward.remote_port} of the {forward.where}")
        if forward.link != forward.url:
            print(f"(code in this kernel reaches it at {forward.url})")
        if forward.note:
            print(f"Note: {forward.note} yet; the forward reaches it once something listens there.", file=sys.stderr)

    def _connect(self, args: argparse.Namespace) -> None:
        from ._connect import connect, up

        options: dict[str, Any] = {"identity": args.identity, "python": args.python, "known_hosts": args.known_hosts}
        options["runtime_env"] = self._runtime_env(args)
        for name in ("keepalive", "reconnect_for"):
            if getattr(args, name) is not None:
                options[name] = getattr(args, name)
        if args.command == "up" and (args.head is None) == (args.config is None):
            given = "both a head and --config" if args.head else "neither a head nor --config"
            raise UsageError(
                f"%cluster up: {given}: give HEAD [WORKER ...] to start Ray there over SSH, or --config "
                f"cluster.yaml for Ray's cluster launcher\n{_cluster_parser().format_usage()}"
            )
        if args.command == "connect" and [args.target, args.config, args.via].count(None) != 2:
            ways = (("a head", args.target), ("--config", args.config), ("--via", args.via))
            named = [what for what, value in ways if value]
            said = ("both " + " and ".join(named)) if named else "neither a head, --config nor --via"
            raise UsageError(
                f"%cluster connect: {said}: give [user@]host[:port], --via COMMAND (a command that runs a program "
                "on the head), or --config cluster.yaml for the running cluster of Ray's cluster launcher\n"
                f"{_cluster_parser().format_usage()}"
            )
        if args.command == "connect" and args.port is not None and not args.start_head:
            raise UsageError("%cluster connect: --port goes with --start-head (the port of the Ray it starts)")
        if args.command == "up" and args.restart and args.config is None:
            raise UsageError("%cluster up: --restart goes with --config (Ray's cluster launcher)")
        try:
            if args.command == "up" and args.config is not None:
                cluster = up(config=args.config, restart=args.restart, **options)
            elif args.command == "up":
                cluster = up(args.head, args.workers, **options)
            elif args.config is not None:
                cluster = connect(config=args.config, ray_token_file=args.ray_token_file, **options)
            else:
                cluster = connect(
                    args.target,
                    via=args.via,
                    start_head=args.start_head,
                    session=args.session,
                    ray_token_file=args.ray_token_file,
                    address=args.address,
                    **({"port": args.port} if args.port is not None else {}),
                    **options,
                )
        except ValueError as exc:
            raise UsageError(f"%cluster {args.command}: {exc}") from None
        print(f"Attached to {cluster!r}, session {cluster.session}.")
        for note in (cluster.mismatch, cluster.ray_note):
            if note:
                print(f"Note: {note}", file=sys.stderr)
        if cluster.shipped:
            print(f"(The agent's modules were copied to {cluster.shipped} on the head.)")
        if args.command == "connect" and args.session:
            self._report_missed(cluster)

    def _report_missed(self, cluster: _cluster.Cluster) -> None:
        """Bind what cells of an earlier kernel of this session produced while detached."""
        # The agent replays the session's events right after the handshake, in order:
        # once a ping sent now is answered, every replayed event has arrived.
        cluster._link.call("ping", timeout=60)
        assert self.shell is not None
        bound: list[str] = []
        for event, data in cluster.missed:
            outcome = data.get("outcome") if event == "done" and isinstance(data, dict) else None
            if outcome is None or outcome.failure is not None:
                continue
            for name, info in outcome.outputs.items():
                if info.kind != "inline":
                    continue
                try:
                    self.shell.user_ns[name] = cloudpickle.loads(info.data)
                except Exception as exc:  # its class lives only on the cluster, say
                    print(f"Warning: `{name}` cannot be loaded in the notebook ({exc})", file=sys.stderr)
                else:
                    bound.append(name)
        if cluster.missed:
            names = ", ".join(bound) or "nothing"
            print(f"{len(cluster.missed)} request(s) finished while detached; bound {names}.")

    @staticmethod
    def _runtime_env(args: argparse.Namespace) -> dict[str, Any] | None:
        if args.runtime_env is None:
            return None
        try:
            return _environment.parse_json(args.runtime_env)
        except ValueError as exc:
            raise UsageError(f"%cluster {args.command}: {exc}") from None

    @staticmethod
    def _attached() -> _cluster.Cluster:
        cluster = _cluster.current()
        if cluster is None:
            resumable = [c._link.transport.resume_hint(s) for s, c in _cluster._detached.items()]
            hints = "".join(f"\n  `{hint}`" for hint in resumable if hint)
            extra = f"; or resume a detached session:{hints}" if hints else ""
            raise UsageError(f"no cluster is attached: run `%cluster local` first{extra}")
        return cluster

    @magic_arguments()
    @argument("--cpus", type=float, help="CPUs for the task or actor")
    @argument("--gpus", type=float, help="GPUs for the task or actor")
    @argument("--memory", type=str, help="memory to reserve, e.g. 4GiB")
    @argument("--resources", type=str, help="custom resources as JSON, e.g. '{\"accelerator\": 1}'")
    @argument("--actor", type=str, help="run inside the named actor (a persistent remote namespace)")
    @argument("--driver", action="store_true", help="run in the agent's own namespace on the head")
    @argument("--async", dest="run_async", action="store_true", help="return at once; outputs become pending handles")
    @argument("--out", type=str, help="comma-separated names to bring back")
    @argument("--no-out", action="store_true", help="bring nothing back")
    @argument("--pip", type=str, help="packages Ray installs for this cell, e.g. pyjokes,requests==2.31.0")
    @argument("--env", action="append", metavar="KEY=VAL", help="an environment variable for this cell (repeatable)")
    @argument("--runtime-env", type=str, metavar="JSON", help="Ray's runtime_env for this cell, as JSON")
    @argument("--retries", type=int, help="Ray task retries")
    @argument("--timeout", type=float, help="cancel the cell after this many seconds")
    @cell_magic
    def remote(self, line: str, cell: str) -> Any:
        """Run the cell on the cluster. ``--map NAME in EXPR`` runs it once per item."""
        map_match = _MAP.search(line)
        if map_match:
            line = line[: map_match.start()] + line[map_match.end() :]
        elif "--map" in line.split():
            raise UsageError("--map needs the form `--map NAME in EXPR`, e.g. `--map x in range(10)`")
        args = parse_argstring(self.remote, line)
        mode = "task"
        if sum(bool(x) for x in (args.actor, args.driver, map_match)) > 1:
            raise UsageError("choose one of --actor, --driver and --map")
        if args.actor:
            mode = "actor"
        elif args.driver:
            mode = "driver"
        elif map_match:
            mode = "map"
        if args.out and args.no_out:
            raise UsageError("--out and --no-out contradict each other")
        out: list[str] | None = None
        if args.no_out:
            out = []
        elif args.out:
            out = [name.strip() for name in args.out.split(",") if name.strip()]
            bad = [name for name in out if not name.isidentifier()]
            if bad:
                raise UsageError(f"--out takes Python names separated by commas; not names: {', '.join(bad)}")
        resources = None
        if args.resources:
            try:
                resources = json.loads(_unquote(args.resources))
            except ValueError as exc:
                raise UsageError(f"--resources is not JSON ({exc}); write e.g. '{{\"accelerator\": 1}}'") from None
        try:
            runtime_env = _environment.build(args.pip, args.env, args.runtime_env)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        shell = self.shell
        assert shell is not None
        ns = shell.user_ns
        map_over = None
        if map_match:
            name, expr = map_match.group(1), map_match.group(2)
            try:
                items = eval(expr, ns)
                map_over = (name, list(items))
            except Exception as exc:
                raise UsageError(f"--map {name} in {expr}: {type(exc).__name__}: {exc}") from None
        cluster = _cluster.current()
        if cluster is None and (failed := _cluster.failed_succession()) is not None:
            raise UsageError(
                f"the notebook could not attach to the head that replaced its own ({failed}); its cells are not sent "
                "to an embedded cluster instead: `%cluster connect` again, or `%cluster local`"
            )
        if cluster is None:
            cluster = _cluster.local()
            print(f"Started an embedded local Ray cluster for this notebook ({cluster!r}); `%cluster down` stops it.")
        try:
            remote = cluster.run_cell(
                cell,
                namespace=ns,
                hidden=shell.user_ns_hidden,
                mode=mode,
                actor=args.actor,
                map_over=map_over,
                out=out,
                cpus=args.cpus,
                gpus=args.gpus,
                memory=args.memory,
                resources=resources,
                retries=args.retries,
                timeout=args.timeout,
                runtime_env=runtime_env,
                pending_handles=args.run_async,
                label=f"Cell In[{_cell_number(shell)}]",
            )
        except SyntaxError as exc:
            raise CellSourceError(exc) from None
        except ValueError as exc:
            if isinstance(exc, ClusterError):
                raise
            raise UsageError(str(exc)) from None
        if args.run_async:
            self._run_in_background(remote, ns)
            return None
        return self._run_in_foreground(remote, ns)

    def _run_in_foreground(self, cell: RemoteCell, ns: dict[str, Any]) -> Any:
        from .widgets._progress import ProgressBar, RemoteBars, write_output

        bar = ProgressBar(cell.progress[1], f"{cell.label} --map") if cell.mode == "map" else None
        bars = RemoteBars()
        preparing = _PreparingLine(cell.label)
        try:
            for event, data in cell.events():
                if event == "stream":
                    write_output(data, bars)
                elif event == "input":  # a breakpoint() stopped the remote code: its pdb asks for a command
                    _debugger_prompt(cell, data)
                elif event == "preparing":
                    preparing.show(data)
                elif event == "link":
                    print(_link_message(data), file=sys.stderr, flush=True)
                elif event in ("progress", "running", "chunk_ended"):
                    if event == "running" and cell.preparing is not None:
                        preparing.ready(cell.preparing["elapsed"])
                    if bar is not None:
                        bar.update(done=cell.progress[0], running=cell.running_items, tasks=cell.running_tasks)
        except KeyboardInterrupt:
            if bar is not None:
                bar.finish("cancelled", "interrupted")
            link = cell.cluster._link
            if link.state != "connected":
                self._interrupted_while_down(cell, ns)
            cell.cancel()
            try:  # until it stops, or until the link is found down (a silent link is found so late)
                for event, data in cell.events(until=lambda: link.state != "connected"):
                    if event == "stream":
                        write_output(data, bars)
            except KeyboardInterrupt:
                pass
            if not cell.done() and link.state != "connected":
                raise CellInterrupted(
                    f"stopped waiting: the link to {link.target} went down as {cell.label} was being cancelled; "
                    f"the cancel goes through when the link is back (session {cell.cluster.session})"
                ) from None
            error = cell.exception(0) if cell.done() else None
            if isinstance(error, CellInterrupted | RemoteError):
                raise error from None  # says how it stopped (or why it could not)
            raise CellInterrupted(f"cancelled the remote cell ({cell.label}, {cell.where})") from None
        try:
            result = cell.result()
        except BaseException as exc:
            if bar is not None:
                outcome = "cancelled" if isinstance(exc, KeyboardInterrupt) else "failed"
                bar.update(failed=1 if outcome == "failed" else 0)
                bar.finish(outcome, _first_line(exc), took=_took(cell))
            raise
        bars.close()
        if bar is not None:
            bar.finish("done", took=result.elapsed)
        return self._bind(result, ns)

    @staticmethod
    def _interrupted_while_down(cell: RemoteCell, ns: dict[str, Any]) -> None:
        """Stop waiting at once: the link is down, so nothing can be asked of the agent now."""
        cluster = cell.cluster
        target, session = cluster._link.target, cluster.session
        if cluster.on_interrupt == "keep":

            def bind(done: RemoteCell) -> None:
                if done.exception() is None:
                    ns.update(done.result().outputs)

            cell.add_done_callback(bind)
            raise CellInterrupted(
                f"stopped waiting: the link to {target} is down; {cell.label} goes on running on the cluster, "
                f"and its outputs are bound when the link is back (jc.current().cells[{cell.cell_id!r}])"
            ) from None
        cell.cancel()
        raise CellInterrupted(
            f"stopped waiting: the link to {target} is down, and {cell.label} is cancelled as soon as it is back "
            f"(session {session})"
        ) from None

    @staticmethod
    def _bind(result: CellResult, ns: dict[str, Any]) -> Any:
        ns.update(result.outputs)
        for warning in result.warnings:
            print(f"Warning: {warning}", file=sys.stderr)
        return result.value if result.has_value else None

    def _run_in_background(self, cell: RemoteCell, ns: dict[str, Any]) -> None:
        previous = {name: ns[name] for name in cell.handles if name in ns}
        ns.update(cell.handles)
        area = _CellArea(cell)
        cell.on_settle(lambda done: _bind_in_place(done, ns, previous))

        def listen(event: str, data: Any) -> None:
            if event == "input":  # no prompt can answer an --async cell's breakpoint(): it goes on
                area.add("stdout", data.get("text", ""))
                area.add("stderr", "breakpoint() in an --async cell: no prompt here to drive it; it went on (c)\n")
                cell.answer("c")
            elif event == "stream":
                for kind, item in data:
                    if kind == "display":
                        _display(item, raw=True)
                    else:
                        area.add(kind, item)
            elif event in ("progress", "running", "chunk_ended") and area.bar is not None:
                area.bar.update(done=cell.progress[0], running=cell.running_items, tasks=cell.running_tasks)
            elif event == "running":
                area.state = _running(cell)
            elif event == "preparing":
                area.state = preparing_text(data)
            elif event == "link":
                area.state = _link_message(data) if data["state"] == "lost" else _running(cell)
            elif cell.done():
                area.state = self._finished(cell)
                area.final = True
            area.update(now=event not in ("stream", "progress", "running") or cell.mode != "map")

        cell.subscribe(listen)

    @staticmethod
    def _finished(cell: RemoteCell) -> str:
        error = cell.exception()
        if error is not None:
            if isinstance(error, RemoteError):
                return "failed\n" + plain(error._render_traceback_())
            if isinstance(error, KeyboardInterrupt):
                return f"cancelled: {error}"
            return f"failed: {type(error).__name__}: {error}"
        result = cell.result()
        names = ", ".join(result.outputs) or "nothing"
        warnings = "".join(f"\nWarning: {w}" for w in result.warnings)
        if cell.mode == "map":
            total = cell.progress[1]
            rate = f", {total / result.elapsed:,.1f} items/s" if result.elapsed > 0 else ""
            return f"{total}/{total} items done in {result.elapsed:.2f} s{rate}; bound {names}{warnings}"
        where = f" on {cell.node}" if cell.node else ""
        return f"done in {result.elapsed:.2f} s{where}; bound {names}{warnings}"


def _took(cell: RemoteCell) -> float | None:
    """How long the cell ran, by its own clock (what its result and the sidebar say), once it has ended."""
    return cell.finished - cell.submitted if cell.finished is not None else None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


def _running(cell: RemoteCell) -> str:
    if cell.status != "running":
        return f"queued ({cell.where})"
    where = f" in {cell.where}" if cell.mode == "actor" else (" (driver)" if cell.mode == "driver" else "")
    return f"running on {cell.node or '?'}{where}"


def _bind_in_place(cell: RemoteCell, ns: dict[str, Any], previous: dict[str, Any]) -> None:
    """Resolve an ``--async`` cell's names in the notebook, unless rebound meanwhile. A
    cell that failed binds nothing over what the names held before it ran; a name it
    introduced keeps its failed handle, which tells a later reader what failed."""
    outputs = cell.final.outputs if cell.final is not None else {}
    for name, handle in cell.handles.items():
        if ns.get(name) is not handle:
            continue
        if name in outputs:
            ns[name] = outputs[name]
        elif name in previous:
            ns[name] = previous[name]


def _cell_number(shell: Any) -> int:
    """The ``In[n]`` of the cell running now. IPython 9 counts it before running the cell and
    IPython 8 after, but both store its input in the history first."""
    history = getattr(shell, "history_manager", None)
    if history is not None and history.input_hist_raw:
        return len(history.input_hist_raw) - 1
    return int(shell.execution_count)


def _link_message(data: dict[str, Any]) -> str:
    """What a running cell says about its link: once when it drops, once when it is back."""
    if data["state"] == "lost":
        at = time.strftime("%H:%M:%S", time.localtime(data["at"]))
        return f"[link to {data['target']} lost at {at} ({data['reason']}); reconnecting…]"
    return f"[reconnected after {data['after']:.0f} s; no output lost]"


def _unquote(text: str) -> str:
    """magic_arguments keeps the quotes around an argument; JSON wants them gone."""
    if len(text) > 1 and text[0] == text[-1] and text[0] in "'\"":
        return text[1:-1]
    return text


def _debugger_prompt(cell: RemoteCell, data: dict[str, Any]) -> None:
    """What pdb printed on the cluster, then its prompt, answered here as a local ``breakpoint()``'s is."""
    from IPython.core.error import StdinNotImplementedError

    sys.stdout.write(data.get("text", ""))
    sys.stdout.flush()
    try:
        command = input(data.get("prompt", "(Pdb) "))
    except (StdinNotImplementedError, EOFError):
        print(f"breakpoint() in {cell.label}: this frontend takes no input, so nothing can drive it; it went on (c)")
        command = "c"
    cell.answer(command)


def install_debug(shell: Any) -> None:
    """``%debug`` after a failed ``%%remote`` cell opens pdb on the remote frames (:mod:`._postmortem`); after any
    other error, and with arguments, it is IPython's own ``%debug``, as it always was."""
    original = shell.find_line_magic("debug")
    if original is None or getattr(original, "remote_frames", False):
        return

    def debug(line: str = "", cell: str | None = None) -> Any:
        from ._postmortem import debug_remote

        error = getattr(sys, "last_value", None)
        if cell is None and not line.strip() and isinstance(error, RemoteError) and debug_remote(shell, error):
            return None
        return original(line) if cell is None else original(line, cell)

    debug.__doc__ = original.__doc__
    debug.remote_frames = True  # type: ignore[attr-defined]
    shell.register_magic_function(debug, "line_cell", "debug")
