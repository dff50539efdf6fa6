"""Attaching to a head over SSH: ``jc.connect`` and ``jc.up``.

``connect`` finds (or, with ``start_head``, starts) Ray on the head, starts the agent
there as a daemon (shipping its modules first when the head lacks this version), and
opens a session through SSH; naming an existing ``session`` resumes it, with the
events that arrived while detached. ``up`` starts Ray on a head and its workers
(``ray start``, token authentication on, dashboard on the head's loopback), or runs
Ray's own cluster launcher on a cluster YAML (:mod:`._launcher`), then connects;
``Cluster.down`` stops exactly the Ray processes it started (or runs ``ray down``).
"""

from __future__ import annotations

import asyncio
import functools
import importlib.metadata
import ipaddress
import logging
import os
import re
import secrets
import shlex
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from . import _prompts as prompts
from ._cluster import Cluster, _detached, attach, with_session_env
from ._errors import ClusterConnectionError
from ._forward import open_forward
from ._kube import KubeSpec, exec_target, find_head, is_kube, replacement_check
from ._link import DEFAULT_KEEPALIVE, AgentLink, _LoopThread
from ._ssh import HeadError, NoRayError, RemoteHead, SSHTarget, SSHTransport, open_ssh
from ._via import CommandHead, CommandTransport, ViaTarget

DEFAULT_IDLE_TIMEOUT = 24 * 3600.0
log = logging.getLogger("jupyter_cluster")

DASHBOARD_PORT = 8265
#: What ``ray start`` says when its node did not come up in the windows Ray gives it: the raylet waits 15 s for
#: its dashboard agent (a Python process, slow to start on a busy host) to say its ports, and dies past that;
#: ``ray start`` waits 30 s for the raylet. A busy host's start, which another try usually gets through.
STARTUP_TIMED_OUT = "timed out during startup"
#: How many times a ``ray start`` that timed out so is tried, on the head and on each worker.
START_ATTEMPTS = 3
#: Between two tries, the host is given up to this long to be less busy than it has cores.
CALM_WAIT = 30.0


async def _calmer(host: Any) -> None:
    """Wait a moment, and up to :data:`CALM_WAIT`, for ``host`` (a :class:`RemoteHead`) to be less busy: a start
    that timed out met a busy host, and another at once meets the same (a build, or pip, for a minute)."""
    deadline = time.monotonic() + CALM_WAIT
    await asyncio.sleep(3)
    while time.monotonic() < deadline:
        done = await host.run("cat /proc/loadavg; nproc", timeout=10)
        words = str(done.stdout).split()
        try:
            if float(words[0]) < int(words[-1]):
                return
        except (ValueError, IndexError):
            return  # no /proc here: nothing to wait for
        await asyncio.sleep(3)


@dataclass
class StartedRay:
    """Ray processes one ``up`` or ``--start-head`` started, to stop exactly those."""

    address: str
    session_name: str
    token: str
    hosts: list[SSHTarget | ViaTarget] = field(default_factory=list)

    @property
    def patterns(self) -> tuple[str, str]:
        """``pkill -f`` patterns for this cluster's processes: each carries its session's
        name or its GCS address. The brackets keep the shell running pkill from
        matching itself."""
        return "[s]" + self.session_name[1:], "[=:]" + re.escape(self.address)


def _run(coro: Any, timeout: float | None = None) -> Any:
    """Run ``coro`` on the link's loop; the questions a login asks meanwhile are asked here (:mod:`._prompts`)."""
    return prompts.wait(_LoopThread.get().run(coro), timeout)


def _token_env(token: str) -> dict[str, str]:
    return {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token}


def _node_ip(target: SSHTarget | ViaTarget) -> str:
    """``--node-ip-address`` for a host named by a (non-loopback) IP: Ray's own guess
    needs a default route, which a private network may not have."""
    if isinstance(target, ViaTarget):
        return ""  # Ray's own guess, made where it runs
    try:
        address = ipaddress.ip_address(target.host)
    except ValueError:
        return ""
    return "" if address.is_loopback else f"--node-ip-address {address}"


async def _head_token(head: RemoteHead) -> str:
    """The token Ray's own tools on the head use, ``~/.ray/auth_token``; made there
    when the head has none, and readable by its owner only (Ray 2.60 itself leaves it
    0644). Keeping it there lets the user's other notebooks, ``ray status`` and
    ``ray job submit`` reach the cluster we start."""
    path = shlex.quote(f"{head.info['home']}/.ray/auth_token")
    done = await head.run(
        f"umask 077 && mkdir -p {shlex.quote(head.info['home'] + '/.ray')} && "
        f"{{ [ -s {path} ] || cat > {path}; }} && chmod 600 {path} && cat {path}",
        stdin=secrets.token_hex(32),
    )
    token = str(done.stdout).strip()
    if done.exit_status != 0 or not token:
        raise HeadError(f"could not read or write ~/.ray/auth_token on {head.target.host}: {str(done.stderr).strip()}")
    return token


async def _start_head(head: RemoteHead, port: int) -> StartedRay:
    token = await _head_token(head)
    for attempt in range(1, START_ATTEMPTS + 1):
        temp = f"/tmp/jc-{secrets.token_hex(4)}"
        done = await head.start_ray(
            f"start --head --port {port} --dashboard-host 127.0.0.1 --temp-dir {temp} --disable-usage-stats "
            f"{_node_ip(head.target)}",
            {"RAY_AUTH_MODE": "token"},
        )
        match = re.search(r"--address='([^']+)'", str(done.stdout))
        if done.exit_status == 0 and match is not None:
            break
        if attempt < START_ATTEMPTS and STARTUP_TIMED_OUT in str(done.stderr):
            log.warning("`ray start --head` on %s timed out during startup (a busy head); again", head.target.host)
            await head.stop_ray("[" + temp[0] + "]" + re.escape(temp[1:]))  # what this try left running
            await _calmer(head)
            continue
        raise HeadError(f"`ray start --head` failed on {head.target.host}:\n{str(done.stderr)[-1500:]}")
    assert match is not None
    link = await head.run(f"readlink {temp}/session_latest")
    session_name = str(link.stdout).strip().rsplit("/", 1)[-1]
    if not session_name.startswith("session_"):
        raise HeadError(f"Ray started on {head.target.host} but its session folder is missing in {temp}")
    return StartedRay(match.group(1), session_name, token, [head.target])


async def _open_head(target: SSHTarget | ViaTarget) -> tuple[RemoteHead, Any]:
    """Commands on ``target``: over a new SSH connection (returned, to close), or through its command (None)."""
    if isinstance(target, ViaTarget):
        return CommandHead(target), None
    conn = await open_ssh(target)
    return RemoteHead(target, conn), conn


async def _stop_started(started: StartedRay) -> None:
    for target in started.hosts:
        try:
            head, conn = await _open_head(target)
        except ClusterConnectionError:
            continue  # unreachable now; nothing more can be done from here
        try:
            await head.stop_ray(*started.patterns)
        except ClusterConnectionError:
            continue
        finally:
            if conn is not None:
                conn.close()


def _kernel_ray() -> str | None:
    try:
        return importlib.metadata.version("ray")
    except importlib.metadata.PackageNotFoundError:
        return None


def ray_note(mine: str | None, head_ray: str) -> str | None:
    """Explain a Ray version that differs between the kernel's environment and the head.

    >>> ray_note(None, "2.60.0") is None  # no Ray beside the kernel: nothing to compare
    True
    >>> "Ray 2.50.0" in ray_note("2.50.0", "2.60.0")
    True
    """
    if mine is None or mine == head_ray:
        return None
    return (
        f"this kernel's environment has Ray {mine} and the head Ray {head_ray}. Cells work (the notebook never "
        "imports Ray); Ray objects are kept on the cluster either way. Match the versions to use Ray Client or "
        "ray job tools from here."
    )


async def _bring_up(
    target: SSHTarget | ViaTarget,
    *,
    session: str | None,
    start_head: bool,
    ship: str,
    port: int,
    idle_timeout: float,
    started: StartedRay | None,
    ray_token: str | None = None,
    address: str | None = None,
) -> tuple[Any, dict[str, Any], StartedRay | None]:
    """Log in, find or start the session's agent (one exec in the usual case), and
    return the connection (None through a command), the agent's state and the Ray this call started."""
    head, conn = await _open_head(target)
    try:
        resume = session is not None
        session = session or secrets.token_hex(4)
        while True:
            env = {}
            if started is not None and _node_ip(target):  # the address we gave `ray start`
                env["RAY_NODE_IP_ADDRESS"] = target.host
            state = await head.start_agent(
                session,
                resume=resume,
                address=started.address if started else address,
                ship=ship,
                env=env,
                idle_timeout=idle_timeout,
                ray_token=started.token if started else ray_token,
            )
            if state.get("need") != "ray":
                break
            if not start_head or started is not None:
                raise NoRayError(
                    f"no Ray is running on {target.host}: start it there (`ray start --head`), "
                    "or connect with --start-head (or use `%cluster up`)."
                )
            started = await _start_head(head, port)
        state["session"] = session
        state["info"] = head.info
        return conn, state, started
    except BaseException:
        if conn is not None:
            conn.close()
        if started is not None and start_head:
            await _stop_started(started)
        raise


async def _forward_dashboard(conn: Any) -> str | None:
    try:
        listener = await conn.forward_local_port("127.0.0.1", 0, "127.0.0.1", DASHBOARD_PORT)
    except Exception:  # no dashboard, or forwarding refused: status just omits the link
        return None
    return f"http://127.0.0.1:{listener.get_port()}"


def _ray_token(ray_token_file: str | None) -> str | None:
    """The Ray token this kernel passes on to the agent: ``ray_token_file``'s content,
    else this kernel's ``RAY_AUTH_TOKEN``; None leaves the head's own to Ray."""
    if ray_token_file:
        path = os.path.expanduser(ray_token_file)
        try:
            with open(path) as f:
                token = f.read().strip()
        except OSError as exc:
            raise ValueError(f"--ray-token-file {ray_token_file}: cannot read it ({exc.strerror})") from None
        if not token or len(token.split()) != 1:
            raise ValueError(f"--ray-token-file {ray_token_file}: expected one token on one line, found none")
        return token
    return os.environ.get("RAY_AUTH_TOKEN", "").strip() or None


def connect(
    target: str | None = None,
    *,
    via: str | Sequence[str] | None = None,
    config: str | os.PathLike[str] | None = None,
    identity: str | None = None,
    python: str | None = None,
    known_hosts: str | None = None,
    start_head: bool = False,
    session: str | None = None,
    port: int = 6379,
    address: str | None = None,
    reconnect_for: float = 600.0,
    keepalive: float = DEFAULT_KEEPALIVE,
    idle_timeout: float = DEFAULT_IDLE_TIMEOUT,
    ray_token_file: str | None = None,
    on_interrupt: str = "cancel",
    ship: str = "auto",
    runtime_env: dict[str, Any] | None = None,
    _started: StartedRay | None = None,
) -> Cluster:
    """Attach the notebook to the Ray cluster whose head is ``target``: ``[user@]host[:port]`` over SSH, or
    ``k8s:[CONTEXT/]NAMESPACE/RAYCLUSTER``, a RayCluster of KubeRay, through ``kubectl exec`` into its head pod.

    Parameters
    ----------
    via
        A command that runs a program on the head with its stdin and stdout joined to this kernel's, instead of
        ``target``: ``"kubectl exec -i -n ray POD -c ray-head --"``, ``"docker exec -i CONTAINER"``,
        ``"ssh -p 2222 user@host"`` (OpenSSH's client: a jump host, Kerberos, a hardware key). The session is
        the same as over SSH: the agent started or found there, shipped where the head lacks this package, and
        a dropped stream resumed by running the command again.
    config
        A cluster YAML of Ray's cluster launcher, instead of ``target``: attach to that
        cluster's running head (``ray get-head-ip`` on this machine) as the YAML's
        ``auth.ssh_user``, with its ``auth.ssh_private_key`` unless ``identity`` is given.
        Nothing is started: no ``ray up``; ``down`` detaches and leaves the cluster up.
    identity, known_hosts
        A private key file; a known_hosts file, or ``"none"`` to skip the host key check.
    python
        The head's Python (``python3`` on its PATH by default).
    start_head
        Run ``ray start --head`` there if no Ray is running.
    address
        The Ray cluster's address (``host:port`` of its GCS) to join, for a head
        that runs more than one; by default the one ``ray start`` last started there
        or one this project started there (a cluster started by hand with another
        ``--temp-dir`` needs its address here).
    session
        Resume this session (its agent and work), from this kernel or another.
    runtime_env
        Ray's ``runtime_env`` for this session's cells (``{"pip": [...]}``): see
        :meth:`Cluster.set_runtime_env`.
    reconnect_for
        Seconds the kernel keeps reconnecting after the link drops.
    keepalive
        Seconds of silence after which the link counts as lost and is reconnected
        (a laptop that slept, a Wi-Fi that roamed).
    ray_token_file
        A file on this machine holding the Ray cluster's token, for a cluster with
        token authentication whose head does not keep it in ``~/.ray/auth_token``
        (``RAY_AUTH_TOKEN`` in this kernel's environment does the same).
    on_interrupt
        What interrupting a cell does while the link is down: ``"cancel"`` the
        remote work as soon as the link is back, or ``"keep"`` it running.
    ship
        ``"auto"``: copy the agent's modules to the head unless this version is
        installed there; ``"always"``: copy them anyway.

    Examples
    --------
    >>> cluster = jc.connect("alice@head.example", start_head=True)  # doctest: +SKIP
    >>> cluster = jc.connect(config="cluster.yaml")  # doctest: +SKIP
    >>> cluster = jc.connect("k8s:ray/raycluster-kuberay")  # doctest: +SKIP
    """
    if via is not None and (target is not None or config is not None):
        raise ValueError("give a head ([user@]host[:port]), a command that reaches it (via=), or config=: one of them")
    if config is not None:
        if target is not None:
            raise ValueError("give a head to connect to, or a cluster YAML as config=, not both")
        if start_head or session or address:
            raise ValueError(
                "config= attaches to the launcher's running head: start_head, session and address "
                "are for a head named directly"
            )
        from ._launcher import attach_config

        return with_session_env(
            runtime_env,
            attach_config,
            config,
            connect,
            identity=identity,
            python=python,
            known_hosts=known_hosts,
            reconnect_for=reconnect_for,
            keepalive=keepalive,
            idle_timeout=idle_timeout,
            ray_token_file=ray_token_file,
            on_interrupt=on_interrupt,
            ship=ship,
        )
    if target is None and via is None:
        raise ValueError(
            "connect needs a head ([user@]host[:port]), a command that reaches it (via=), or a cluster YAML of "
            "Ray's launcher: config="
        )
    if ship not in ("auto", "always"):
        raise ValueError("ship must be 'auto' or 'always'")
    if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
        raise ValueError(f"port must be a TCP port number (1 to 65535), not {port!r}")
    if on_interrupt not in ("cancel", "keep"):
        raise ValueError("on_interrupt must be 'cancel' or 'keep'")
    if keepalive < 0 or reconnect_for < 0:
        raise ValueError("keepalive and reconnect_for are seconds, not negative")
    if session and session in _detached and not _started:
        cluster = _detached[session]
        cluster._link.reopen()
        return with_session_env(runtime_env, attach, cluster)
    token = _ray_token(ray_token_file)
    head_target: SSHTarget | ViaTarget
    kind = ""
    if (via is not None or is_kube(target)) and (identity or known_hosts):
        raise ValueError("identity and known_hosts are for SSH: a command (via=, k8s:) logs in its own way")
    if via is not None:
        head_target = ViaTarget.parse(via, python)
    elif is_kube(target):
        assert target is not None
        spec = KubeSpec.parse(target)
        if start_head:
            raise ValueError("start_head is for a head without Ray: KubeRay starts Ray in a RayCluster's head pod")
        pod = _run(find_head(spec), timeout=None)
        head_target = exec_target(spec, pod, python)
        head_target.replaced = replacement_check(spec, pod)
        kind = f"{spec.describe()} (pod {pod['metadata']['name']})"
    else:
        assert target is not None
        head_target = SSHTarget.parse(
            target, identity=identity, known_hosts=known_hosts, python=python, keepalive=float(keepalive)
        )
    conn, state, started = _run(
        _bring_up(
            head_target,
            session=session,
            start_head=start_head,
            ship=ship,
            port=port,
            idle_timeout=idle_timeout,
            started=_started,
            ray_token=token,
            address=address,
        ),
        timeout=None,
    )
    transport: SSHTransport | CommandTransport
    if isinstance(head_target, ViaTarget):
        transport = CommandTransport(head_target, state["socket"])
    else:
        transport = SSHTransport(head_target, state["socket"], conn)
    link = AgentLink(transport, state["secret"], state["session"], reconnect_for=reconnect_for, keepalive=keepalive)
    try:
        link.connect()
    except BaseException:
        if conn is not None:
            conn.close()
        transport.discard()
        raise
    transport.agent_pid = int(link.welcome["pid"])
    if not kind:
        how = "via" if isinstance(head_target, ViaTarget) else "ssh"
        kind = f"{how} {head_target.describe()}"
    cluster = Cluster(link, kind=kind)
    cluster.on_interrupt = on_interrupt
    cluster.head = state["info"]
    cluster.shipped = state.get("shipped")
    cluster.ray_note = ray_note(_kernel_ray(), state["info"].get("ray", ""))
    if isinstance(transport, CommandTransport):
        # Ray's dashboard, on the head's loopback: a forward whose connections are relays the command runs.
        dashboard = open_forward(DASHBOARD_PORT, None, f"head {transport.describe()}", transport.open_port)
        cluster.forwards.append(dashboard)
        cluster.dashboard_url = dashboard.url
    else:
        cluster.dashboard_url = _run(_forward_dashboard(conn), timeout=30)
    cluster.started = started
    if target is not None and is_kube(target):
        cluster.successor = functools.partial(
            _succeed,
            target,
            reconnect_for,
            python=python,
            reconnect_for=reconnect_for,
            keepalive=keepalive,
            idle_timeout=idle_timeout,
            ray_token_file=ray_token_file,
            on_interrupt=on_interrupt,
            ship=ship,
            runtime_env=runtime_env,
        )
    if started is not None:
        cluster.stoppers.append(lambda: _run(_stop_started(started), timeout=120))
    return with_session_env(runtime_env, attach, cluster)


def _succeed(target: str, wait: float, **options: Any) -> Cluster:
    """``connect(target)`` again for the head that replaced a RayCluster's (KubeRay starts a new head pod): tried
    until it works or ``wait`` seconds passed, while the new pod is made, scheduled and started."""
    deadline = time.monotonic() + wait
    while True:
        try:
            return connect(target, **options)
        except ClusterConnectionError:
            if time.monotonic() >= deadline:
                raise
            time.sleep(min(5.0, max(0.0, deadline - time.monotonic())))


def up(
    head: str | None = None,
    workers: Sequence[str] = (),
    *,
    config: str | os.PathLike[str] | None = None,
    identity: str | None = None,
    python: str | None = None,
    known_hosts: str | None = None,
    port: int = 6379,
    reconnect_for: float = 600.0,
    keepalive: float = DEFAULT_KEEPALIVE,
    restart: bool = False,
    runtime_env: dict[str, Any] | None = None,
) -> Cluster:
    """Start Ray on ``head`` and each of ``workers`` over SSH, or with Ray's own cluster
    launcher from the cluster YAML ``config``; then attach to it.

    ``Cluster.down()`` (``%cluster down``) stops exactly the Ray processes started here;
    for ``config``, it runs ``ray down`` on that YAML.

    Parameters
    ----------
    head, workers
        ``[user@]host[:port]`` of each host: Ray is started there with ``ray start``.
    config
        A cluster YAML, as ``ray up`` takes (instead of ``head`` and ``workers``).
        ``ray up -y --no-config-cache`` runs on this machine (so Ray's launcher must be
        installed here: ``pip install "ray[default]"``), its output shown as it comes;
        a failure raises :class:`._launcher.LauncherError` with Ray's own message.
        Then the notebook attaches to the head (``ray get-head-ip``) as the YAML's
        ``auth.ssh_user``, with its ``auth.ssh_private_key`` unless ``identity`` is
        given. Workers join as Ray's autoscaler starts them (``%cluster status``
        shows them). Ray's launcher checks no host keys; this attach does, as every
        connect does (``~/.ssh/known_hosts``): pass ``known_hosts`` (a file, or
        ``"none"`` to skip the check as ``ray up`` does, for throwaway machines). If the
        attach fails, the cluster keeps running; the error says how to stop it.
        A cluster whose head already runs Ray (another notebook's, or this one's before
        a kernel restart) is attached to as it is, without ``ray up`` (which restarts
        Ray on every node, stopping all that runs there), and this is said; ``down``
        then detaches and leaves it up.
    restart
        With ``config``: run ``ray up`` even when the head already runs Ray, restarting
        Ray on every node (what runs there stops; this is said first).
    identity, python, known_hosts, reconnect_for, keepalive, runtime_env
        As for :func:`connect`.
    port
        The GCS port ``ray start --head`` is given (not with ``config``: the YAML's
        start commands say it).

    Raises
    ------
    ValueError
        Both or neither of ``head`` and ``config``; or a cluster YAML that is missing,
        not a mapping, without ``auth.ssh_user``, or naming a key file that is not there
        (checked before anything starts).

    Examples
    --------
    >>> cluster = jc.up("head.example", ["w1.example", "w2.example"])  # doctest: +SKIP
    >>> cluster = jc.up(config="cluster.yaml")  # doctest: +SKIP
    """
    if config is not None:
        if head is not None or workers:
            raise ValueError("give a head (and workers), or a cluster YAML as config=, not both")
        from ._launcher import launch

        return with_session_env(
            runtime_env,
            launch,
            config,
            connect,
            restart=restart,
            identity=identity,
            python=python,
            known_hosts=known_hosts,
            reconnect_for=reconnect_for,
            keepalive=keepalive,
        )
    if restart:
        raise ValueError("restart= is for a cluster YAML (config=): `ray up` restarts a running cluster only there")
    if head is None:
        raise ValueError("up needs a head to start Ray on (and workers), or a cluster YAML for Ray's launcher: config=")
    options = {"identity": identity, "known_hosts": known_hosts, "python": python}
    head_target = SSHTarget.parse(head, **options)
    worker_targets = [SSHTarget.parse(w, **options) for w in workers]
    started = _run(_up(head_target, worker_targets, port), timeout=None)
    try:
        return connect(
            head,
            identity=identity,
            python=python,
            known_hosts=known_hosts,
            port=port,
            reconnect_for=reconnect_for,
            keepalive=keepalive,
            runtime_env=runtime_env,
            _started=started,
        )
    except BaseException:
        _run(_stop_started(started), timeout=120)
        raise


async def _up(head_target: SSHTarget, worker_targets: list[SSHTarget], port: int) -> StartedRay:
    conn = await open_ssh(head_target)
    async with conn:
        head = RemoteHead(head_target, conn)
        await head.probe()
        started = await _start_head(head, port)
    try:
        for target in worker_targets:
            await _start_worker(target, started)
            started.hosts.append(target)
    except BaseException:
        await _stop_started(started)
        raise
    return started


async def _start_worker(target: SSHTarget, started: StartedRay, timeout: float = 90.0) -> None:
    conn = await open_ssh(target)
    async with conn:
        worker = RemoteHead(target, conn)
        await worker.probe()
        # Ask the worker to reach the head first: `ray start` retries for minutes.
        host, port = started.address.rsplit(":", 1)
        reach = f"import socket; socket.create_connection(({host!r}, {port}), 5).close()"
        check = await worker.run(f"{worker.python} -c {shlex.quote(reach)}", timeout=30)
        if check.exit_status != 0:
            reason = str(check.stderr).strip().splitlines()[-1:] or ["no answer"]
            raise HeadError(
                f"worker {target.host} could not join the head at {started.address}: it cannot reach that "
                f"address ({reason[0]}). Check the network between them (routes, firewalls)."
            )
        for attempt in range(1, START_ATTEMPTS + 1):
            try:
                done = await worker.start_ray(
                    f"start --address {shlex.quote(started.address)} --disable-usage-stats {_node_ip(target)}",
                    _token_env(started.token),
                    timeout=timeout,
                )
            except asyncio.TimeoutError:
                done = None
            if done is not None and done.exit_status == 0:
                return
            await worker.stop_ray(*started.patterns)
            # A busy host can miss the windows Ray gives a starting node: again.
            if done is None or STARTUP_TIMED_OUT not in str(done.stderr) or attempt == START_ATTEMPTS:
                break
            log.warning("worker %s: its node timed out during startup (a busy host); starting it again", target.host)
            await _calmer(worker)
        detail = "it did not join in time" if done is None else str(done.stderr).strip()[-800:]
        raise HeadError(
            f"worker {target.host} could not join the head at {started.address}: {detail}. "
            "Check that the worker can reach the head's address and port."
        )


__all__ = ["connect", "up"]
