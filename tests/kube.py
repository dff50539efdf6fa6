"""A stand-in Kubernetes API server for the real ``kubectl``: what ``%cluster connect k8s:...`` asks of one.

No Kubernetes runs here, so this speaks the API server's own protocol, over plain HTTP on loopback, to the ``kubectl``
on this machine: legacy discovery (``/version``, ``/api``, ``/apis``, the resource lists), pods listed and got
(label selectors), events (field selectors), secrets, KubeRay's ``rayclusters``, and ``pods/exec`` in both protocols
``kubectl`` speaks: over WebSocket, ``v5.channel.k8s.io`` (a binary frame per message, its first byte the channel: 0
stdin, 1 stdout, 2 stderr, 3 the exit status as a ``Status``, 255 a closed stream); and over SPDY/3.1,
``v4.channel.k8s.io``, which ``kubectl`` falls back to where an API server before 1.30 refuses the WebSocket upgrade
(a stream per channel, :class:`SpdyExec`). A pod's exec runs the command where the test says its container is (a
network-namespace host: ``ip netns exec NS``), so ``kubectl exec`` reaches a real Ray head. Faults are the test's to
make: a pod pending with events, ``pods/exec`` forbidden, the server stopped and started again (every exec stream
cut), a pod replaced under a new name and address.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import struct
import threading
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tornado.httpserver
import tornado.iostream
import tornado.web
import tornado.websocket

VERSION = {"major": "1", "minor": "32", "gitVersion": "v1.32.0", "platform": "linux/amd64"}
#: The channels of the exec protocol.
STDIN, STDOUT, STDERR, ERROR, CLOSE = 0, 1, 2, 3, 255


@dataclass
class Pod:
    """A pod: its manifest's parts the product reads, and where its containers' commands run."""

    name: str
    namespace: str
    labels: dict[str, str]
    containers: list[str]
    phase: str = "Running"
    ip: str = "10.213.0.2"
    #: What an exec's command is run under here (``["ip", "netns", "exec", "jc-head"]``): the pod's "container".
    runs_in: list[str] = field(default_factory=list)
    #: Which images its containers run (``ray.io`` labels aside, the product only names them).
    image: str = "rayproject/ray:2.60.0"
    #: Its containers' environment beyond the host's (KubeRay's ``authOptions``: ``RAY_AUTH_TOKEN`` from a Secret).
    env: dict[str, str] = field(default_factory=dict)

    def manifest(self) -> dict[str, Any]:
        ready = self.phase == "Running"
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": self.name, "namespace": self.namespace, "labels": self.labels, "uid": self.name},
            "spec": {"containers": [{"name": c, "image": self.image} for c in self.containers]},
            "status": {
                "phase": self.phase,
                "podIP": self.ip if ready else "",
                "containerStatuses": [{"name": c, "ready": ready} for c in self.containers],
            },
        }


def _status(code: int, reason: str, message: str) -> dict[str, Any]:
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": message,
            "reason": reason, "code": code}  # fmt: skip


def _matches(labels: dict[str, str], selector: str) -> bool:
    """Equality-based label selectors (``a=b,c!=d,e``): what the product and ``kubectl -l`` send."""
    for term in filter(None, selector.split(",")):
        if "!=" in term:
            key, value = term.split("!=", 1)
            if labels.get(key) == value:
                return False
        elif "=" in term:
            key, value = term.split("=", 1)
            if labels.get(key.rstrip("=")) != value.lstrip("="):
                return False
        elif term not in labels:
            return False
    return True


class KubeState:
    """What the stand-in serves: pods, events, secrets, RayClusters, and who may exec."""

    def __init__(self) -> None:
        self.pods: dict[tuple[str, str], Pod] = {}
        self.rayclusters: dict[tuple[str, str], dict[str, Any]] = {}
        self.events: dict[str, list[dict[str, Any]]] = {}
        self.secrets: dict[tuple[str, str], dict[str, str]] = {}
        #: ``pods/exec`` refused (403) for these namespaces.
        self.exec_forbidden: set[str] = set()
        self.user = "alice"
        #: Every request, as ``METHOD path`` (for the tests to check what kubectl asked).
        self.requests: list[str] = []
        #: The exec protocols the server speaks, preferred first (an older API server: v4 only), the protocol of
        #: each exec, and the containers named.
        self.exec_protocols: tuple[str, ...] = ("v5.channel.k8s.io", "v4.channel.k8s.io")
        #: The exec sessions over SPDY under way.
        self.spdy: list[SpdyExec] = []
        self.protocols: list[str] = []
        #: What kubectl offered, each exec.
        self.offered: list[list[str]] = []
        self.containers: set[str] = set()
        self.execs: list[ExecHandler] = []


class _Base(tornado.web.RequestHandler):
    state: KubeState

    def initialize(self, state: KubeState) -> None:
        self.state = state

    def prepare(self) -> None:
        self.state.requests.append(f"{self.request.method} {self.request.path}")

    def answer(self, body: dict[str, Any], code: int = 200) -> None:
        self.set_status(code)
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps(body))


class Discovery(_Base):
    def get(self, path: str) -> None:
        port = self.request.host.rsplit(":", 1)[-1]
        if path == "version":
            return self.answer(VERSION)
        if path == "api":
            cidr = [{"clientCIDR": "0.0.0.0/0", "serverAddress": f"127.0.0.1:{port}"}]
            return self.answer({"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": cidr})
        if path == "apis":
            version = {"groupVersion": "ray.io/v1", "version": "v1"}
            group = {"name": "ray.io", "versions": [version], "preferredVersion": version}
            return self.answer({"kind": "APIGroupList", "apiVersion": "v1", "groups": [group]})
        if path == "api/v1":

            def resource(name: str, kind: str, verbs: list[str], singular: str = "") -> dict[str, Any]:
                return {"name": name, "singularName": singular, "namespaced": True, "kind": kind, "verbs": verbs}

            resources = [
                resource("pods", "Pod", ["get", "list"], "pod"),
                resource("pods/exec", "PodExecOptions", ["create", "get"]),
                resource("events", "Event", ["get", "list"], "event"),
                resource("secrets", "Secret", ["get", "list"], "secret"),
            ]
            return self.answer({"kind": "APIResourceList", "groupVersion": "v1", "resources": resources})
        if path == "apis/ray.io/v1":
            raycluster = {"name": "rayclusters", "singularName": "raycluster", "namespaced": True,
                          "kind": "RayCluster", "verbs": ["get", "list"]}  # fmt: skip
            return self.answer(
                {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": "ray.io/v1", "resources": [raycluster]}
            )
        self.answer(_status(404, "NotFound", "the server could not find the requested resource"), 404)


class Pods(_Base):
    def get(self, namespace: str, name: str | None = None) -> None:
        if name:
            pod = self.state.pods.get((namespace, name))
            if pod is None:
                return self.answer(_status(404, "NotFound", f'pods "{name}" not found'), 404)
            return self.answer(pod.manifest())
        selector = self.get_argument("labelSelector", "")
        items = [
            p.manifest()
            for (ns, _), p in sorted(self.state.pods.items())
            if ns == namespace and _matches(p.labels, selector)
        ]
        self.answer({"kind": "PodList", "apiVersion": "v1", "metadata": {"resourceVersion": "1"}, "items": items})


class Events(_Base):
    def get(self, namespace: str) -> None:
        wanted = self.get_argument("fieldSelector", "")
        name = wanted.split("involvedObject.name=", 1)[1].split(",")[0] if "involvedObject.name=" in wanted else None
        items = [
            {"apiVersion": "v1", "metadata": {"name": f"{key}.{i}", "namespace": namespace}, **e}
            for key, events in self.state.events.items()
            if name in (None, key)
            for i, e in enumerate(events)
        ]
        self.answer({"kind": "EventList", "apiVersion": "v1", "metadata": {"resourceVersion": "1"}, "items": items})


class Secrets(_Base):
    def get(self, namespace: str, name: str) -> None:
        import base64

        data = self.state.secrets.get((namespace, name))
        if data is None:
            return self.answer(_status(404, "NotFound", f'secrets "{name}" not found'), 404)
        encoded = {k: base64.b64encode(v.encode()).decode() for k, v in data.items()}
        self.answer({"kind": "Secret", "apiVersion": "v1", "metadata": {"name": name, "namespace": namespace},
                     "data": encoded, "type": "Opaque"})  # fmt: skip


class RayClusters(_Base):
    def get(self, namespace: str, name: str) -> None:
        found = self.state.rayclusters.get((namespace, name))
        if found is None:
            message = f'rayclusters.ray.io "{name}" not found'
            return self.answer(_status(404, "NotFound", message), 404)
        self.answer(found)


async def _run_in_pod(pod: Pod, command: list[str]) -> asyncio.subprocess.Process:
    """An exec's command, run where the pod's container is, with its environment, its streams piped."""
    return await asyncio.create_subprocess_exec(
        *pod.runs_in, *command,
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        start_new_session=True, env={**os.environ, **pod.env},
    )  # fmt: skip


def _kill_group(proc: asyncio.subprocess.Process | None) -> None:
    """End an exec's command and what it started (it leads a session of its own)."""
    if proc is not None and proc.returncode is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


class ExecHandler(tornado.websocket.WebSocketHandler):
    """``pods/exec``: the command, run where the pod's container is, its streams as the exec protocol's channels."""

    state: KubeState

    def initialize(self, state: KubeState) -> None:
        self.state = state
        self.proc: asyncio.subprocess.Process | None = None
        self.protocol = ""
        self._tasks: set[asyncio.Future[None]] = set()

    async def post(self, namespace: str, name: str) -> None:
        """SPDY/3.1, which kubectl falls back to where the WebSocket upgrade failed (an API server before 1.30):
        the older exec protocol, ``v4.channel.k8s.io``, a SPDY stream per channel (:class:`SpdyExec`)."""
        self.state.requests.append(f"EXEC-SPDY {namespace}/{name}")
        if self._refused(namespace, name):
            return
        versions = self.request.headers.get_list("X-Stream-Protocol-Version")
        offered = [v.strip() for line in versions for v in line.split(",")]
        if self.request.headers.get("Upgrade", "").lower() != "spdy/3.1" or SPDY_PROTOCOL not in offered:
            self._refuse(400, "BadRequest", f"pods/exec over SPDY speaks {SPDY_PROTOCOL} only, not {offered}")
            return
        self.protocol = f"spdy/{SPDY_PROTOCOL}"
        self.state.protocols.append(self.protocol)
        self.state.containers.add(self.get_argument("container", ""))
        self._auto_finish = False  # the connection is the SPDY session's from here
        stream = self.request.connection.detach()
        stream.write(
            b"HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: SPDY/3.1\r\n"
            + f"X-Stream-Protocol-Version: {SPDY_PROTOCOL}\r\n\r\n".encode()
        )
        wanted = {"error"} | {kind for kind in ("stdin", "stdout", "stderr") if self.get_argument(kind, "") == "true"}
        session = SpdyExec(stream, self.state.pods[(namespace, name)], self.get_arguments("command"), wanted)
        self.state.spdy.append(session)
        try:
            await session.run()
        finally:
            self.state.spdy.remove(session)

    async def get(self, namespace: str, name: str) -> None:
        self.state.requests.append(f"EXEC {namespace}/{name}")
        offered = [v.strip() for v in self.request.headers.get("Sec-WebSocket-Protocol", "").split(",")]
        if not self._refused(namespace, name):
            if not set(offered) & set(self.state.exec_protocols):  # an older server: kubectl then tries SPDY
                self._refuse(400, "BadRequest", f"unable to upgrade: none of the protocols {offered} is spoken here")
                return
            await super().get(namespace, name)

    def _refused(self, namespace: str, name: str) -> bool:
        """Refuse an exec that RBAC forbids, or of a pod that is not there (as the API server does, before any
        upgrade); whether it did."""
        pod = self.state.pods.get((namespace, name))
        if namespace in self.state.exec_forbidden:
            message = (
                f'pods "{name}" is forbidden: User "{self.state.user}" cannot create resource "pods/exec" in API group'
                f' "" in the namespace "{namespace}"'
            )
            self._refuse(403, "Forbidden", message)
            return True
        if pod is None:
            self._refuse(404, "NotFound", f'pods "{name}" not found')
            return True
        return False

    def _refuse(self, code: int, reason: str, message: str) -> None:
        self.set_status(code)
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps(_status(code, reason, message)))

    def select_subprotocol(self, subprotocols: list[str]) -> str | None:
        self.state.offered.append(list(subprotocols))
        for wanted in self.state.exec_protocols:
            if wanted in subprotocols:
                self.protocol = wanted
                return wanted
        return None

    async def open(self, namespace: str, name: str) -> None:
        pod = self.state.pods[(namespace, name)]
        command = self.get_arguments("command")
        self.state.execs.append(self)
        self.state.protocols.append(self.protocol)
        self.state.containers.add(self.get_argument("container", ""))
        try:
            self.proc = await _run_in_pod(pod, command)
        except OSError as exc:
            self._end({"status": "Failure", "message": str(exc), "reason": "InternalError"})
            return
        self._tasks.add(asyncio.ensure_future(self._pump()))

    async def _pump(self) -> None:
        proc = self.proc
        assert proc is not None and proc.stdout is not None and proc.stderr is not None

        async def carry(stream: asyncio.StreamReader, channel: int) -> None:
            while data := await stream.read(1 << 16):
                await self.write_message(bytes([channel]) + data, binary=True)

        try:
            await asyncio.gather(carry(proc.stdout, STDOUT), carry(proc.stderr, STDERR))
            code = await proc.wait()
        except (tornado.websocket.WebSocketClosedError, tornado.iostream.StreamClosedError):
            self._kill()
            return
        if code == 0:
            self._end({"status": "Success"})
        else:
            cause = {"reason": "ExitCode", "message": str(code)}
            self._end({"status": "Failure", "reason": "NonZeroExitCode", "details": {"causes": [cause]},
                       "message": f"command terminated with non-zero exit code: exit status {code}"})  # fmt: skip

    def _end(self, status: dict[str, Any]) -> None:
        self._tasks.add(asyncio.ensure_future(self._send_end(status)))

    async def _send_end(self, status: dict[str, Any]) -> None:
        body = json.dumps({"kind": "Status", "apiVersion": "v1", "metadata": {}, **status}).encode()
        try:
            await self.write_message(bytes([ERROR]) + body, binary=True)
            self.close(1000)
        except tornado.websocket.WebSocketClosedError:
            pass

    def on_message(self, message: str | bytes) -> None:
        if not isinstance(message, bytes) or not message or self.proc is None or self.proc.stdin is None:
            return
        channel, data = message[0], message[1:]
        if channel == STDIN and data:
            self.proc.stdin.write(data)
        elif channel == CLOSE and data[:1] == bytes([STDIN]) and self.protocol == "v5.channel.k8s.io":
            self.proc.stdin.close()

    def on_close(self) -> None:
        self._kill()
        if self in self.state.execs:
            self.state.execs.remove(self)

    def _kill(self) -> None:
        _kill_group(self.proc)


def _spdy_dictionary() -> bytes:
    """SPDY/3's zlib dictionary for header blocks: taken from the ``kubectl`` this stand-in talks to (its SPDY
    client holds it, byte for byte), so that the two agree by construction."""
    kubectl = shutil.which("kubectl")
    assert kubectl, "no kubectl on PATH"
    data = Path(kubectl).read_bytes()
    start = data.find(b"\x00\x00\x00\x07options\x00\x00\x00\x04head")
    dictionary = data[start : start + 1423]  # SPDY/3's dictionary is 1423 bytes, ending ",enq=0."
    assert start >= 0 and dictionary.endswith(b",enq=0."), "kubectl holds no SPDY/3 header dictionary"
    return dictionary


SPDY_PROTOCOL = "v4.channel.k8s.io"
#: SPDY/3 frame types this session reads or writes.
SYN_STREAM, SYN_REPLY, RST_STREAM, SETTINGS, PING, GOAWAY = 1, 2, 3, 4, 6, 7
FLAG_FIN = 0x01


class SpdyExec:
    """One ``pods/exec`` over SPDY/3.1: kubectl opens a stream per channel (``streamType``: error, stdin, stdout,
    stderr), each answered with a SYN_REPLY; the command's output goes out as data frames on its stream, a FIN on
    stdin closes its input (which the WebSocket ``v4`` cannot say), and the exit status goes as a ``Status`` on the
    error stream, after which every stream is finished and the connection closed."""

    def __init__(self, stream: Any, pod: Pod, command: list[str], wanted: set[str]) -> None:
        self.stream = stream
        self.pod = pod
        self.command = command
        self.wanted = wanted
        dictionary = _spdy_dictionary()
        self.inflate = zlib.decompressobj(zdict=dictionary)
        self.deflate = zlib.compressobj(zdict=dictionary)
        self.streams: dict[str, int] = {}
        self.proc: asyncio.subprocess.Process | None = None

    def _control(self, kind: int, flags: int, data: bytes) -> None:
        self.stream.write(struct.pack(">HHI", 0x8000 | 3, kind, (flags << 24) | len(data)) + data)

    def _data(self, kind: str, data: bytes, flags: int = 0) -> None:
        self.stream.write(struct.pack(">II", self.streams[kind], (flags << 24) | len(data)) + data)

    def _headers(self, block: bytes) -> dict[str, str]:
        raw = self.inflate.decompress(block)
        count, at, headers = struct.unpack(">I", raw[:4])[0], 4, {}
        for _ in range(count):
            (size,) = struct.unpack(">I", raw[at : at + 4])
            key = raw[at + 4 : at + 4 + size].decode().lower()
            at += 4 + size
            (size,) = struct.unpack(">I", raw[at : at + 4])
            headers[key] = raw[at + 4 : at + 4 + size].decode()
            at += 4 + size
        return headers

    async def run(self) -> None:
        try:
            while True:
                head = await self.stream.read_bytes(8)
                length = int.from_bytes(head[5:8], "big")
                flags = head[4]
                data = await self.stream.read_bytes(length) if length else b""
                if head[0] & 0x80:
                    await self._on_control(int.from_bytes(head[2:4], "big"), flags, data)
                else:
                    self._on_data(int.from_bytes(head[:4], "big") & 0x7FFFFFFF, flags, data)
        except tornado.iostream.StreamClosedError:
            pass
        finally:
            self.kill()

    async def _on_control(self, kind: int, flags: int, data: bytes) -> None:
        if kind == SYN_STREAM:
            stream_id = struct.unpack(">I", data[:4])[0] & 0x7FFFFFFF
            headers = self._headers(data[10:])
            self.streams[headers.get("streamtype", "")] = stream_id
            block = self.deflate.compress(struct.pack(">I", 0)) + self.deflate.flush(zlib.Z_SYNC_FLUSH)
            self._control(SYN_REPLY, 0, struct.pack(">I", stream_id) + block)
            if self.proc is None and self.wanted <= set(self.streams):
                await self._start()
        elif kind == PING:
            self._control(PING, 0, data)
        elif kind == GOAWAY:
            self.stream.close()
        elif kind == RST_STREAM and self.streams.get("stdin") == struct.unpack(">I", data[:4])[0] & 0x7FFFFFFF:
            self._close_stdin()

    def _on_data(self, stream_id: int, flags: int, data: bytes) -> None:
        if stream_id != self.streams.get("stdin") or self.proc is None or self.proc.stdin is None:
            return
        if data:
            self.proc.stdin.write(data)
        if flags & FLAG_FIN:
            self._close_stdin()

    def _close_stdin(self) -> None:
        if self.proc is not None and self.proc.stdin is not None and not self.proc.stdin.is_closing():
            self.proc.stdin.close()

    async def _start(self) -> None:
        self.proc = await _run_in_pod(self.pod, self.command)
        self._pump = asyncio.ensure_future(self._carry_out())

    async def _carry_out(self) -> None:
        proc = self.proc
        assert proc is not None and proc.stdout is not None and proc.stderr is not None

        async def carry(source: asyncio.StreamReader, kind: str) -> None:
            while data := await source.read(1 << 16):
                if kind in self.streams:
                    self._data(kind, data)
            if kind in self.streams:
                self._data(kind, b"", FLAG_FIN)

        try:
            await asyncio.gather(carry(proc.stdout, "stdout"), carry(proc.stderr, "stderr"))
            code = await proc.wait()
            if code == 0:
                status: dict[str, Any] = {"status": "Success"}
            else:
                cause = {"reason": "ExitCode", "message": str(code)}
                status = {"status": "Failure", "reason": "NonZeroExitCode", "details": {"causes": [cause]},
                          "message": f"command terminated with non-zero exit code: exit status {code}"}  # fmt: skip
            body = json.dumps({"kind": "Status", "apiVersion": "v1", "metadata": {}, **status}).encode()
            self._data("error", body, FLAG_FIN)
            await self.stream.write(b"")
            self._control(GOAWAY, 0, struct.pack(">II", 0, 0))
            await asyncio.sleep(0.1)
        except tornado.iostream.StreamClosedError:
            pass
        finally:
            self.stream.close()

    def kill(self) -> None:
        _kill_group(self.proc)
        self.stream.close()


class StandInAPIServer:
    """The stand-in, on its own loop thread; ``stop()`` and ``start()`` again on the same port (an API server
    restarted: every exec stream cut)."""

    def __init__(self, directory: Path, port: int = 0) -> None:
        self.state = KubeState()
        self.directory = directory
        self.port = port
        self.loop: asyncio.AbstractEventLoop | None = None
        self._server: tornado.httpserver.HTTPServer | None = None
        self._thread: threading.Thread | None = None

    def app(self) -> tornado.web.Application:
        kw = {"state": self.state}
        ns = r"/api/v1/namespaces/([^/]+)"
        return tornado.web.Application(
            [
                (r"/(version|api|apis|api/v1|apis/ray\.io/v1)", Discovery, kw),
                (ns + r"/pods", Pods, kw),
                (ns + r"/pods/([^/]+)", Pods, kw),
                (ns + r"/pods/([^/]+)/exec", ExecHandler, kw),
                (ns + r"/events", Events, kw),
                (ns + r"/secrets/([^/]+)", Secrets, kw),
                (r"/apis/ray\.io/v1/namespaces/([^/]+)/rayclusters/([^/]+)", RayClusters, kw),
            ]
        )

    def start(self) -> StandInAPIServer:
        ready = threading.Event()

        def run() -> None:
            self.loop = asyncio.new_event_loop()
            asyncio.set_event_loop(self.loop)
            server = tornado.httpserver.HTTPServer(self.app())
            sockets = tornado.netutil.bind_sockets(self.port, "127.0.0.1")
            self.port = sockets[0].getsockname()[1]
            server.add_sockets(sockets)
            self._server = server
            ready.set()
            self.loop.run_forever()

        self._thread = threading.Thread(target=run, name="kube-stand-in", daemon=True)
        self._thread.start()
        ready.wait(10)
        return self

    def stop(self) -> None:
        """Stop listening and cut every exec stream (their commands killed), as a restarted API server does."""
        loop = self.loop
        if loop is None:
            return

        async def shut() -> None:
            for handler in list(self.state.execs):
                handler._kill()
                handler.close()
            for session in list(self.state.spdy):
                session.kill()
            if self._server is not None:
                self._server.stop()
                await self._server.close_all_connections()

        asyncio.run_coroutine_threadsafe(shut(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        if self._thread is not None:
            self._thread.join(10)
        self.loop = None

    def kubeconfig(self, context: str = "stand-in", namespace: str = "ray") -> Path:
        """A kubeconfig for this server (plain HTTP, a bearer token), its context ``context``."""
        path = self.directory / "kubeconfig"
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "stand-in", "cluster": {"server": f"http://127.0.0.1:{self.port}"}}],
            "contexts": [
                {"name": context, "context": {"cluster": "stand-in", "user": "alice", "namespace": namespace}}
            ],
            "current-context": context,
            "users": [{"name": "alice", "user": {"token": "alice-token"}}],
        }
        path.write_text(json.dumps(config))
        return path


__all__ = ["KubeState", "Pod", "StandInAPIServer"]
