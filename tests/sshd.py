"""Real SSH servers for tests: an sshd on loopback, two sshd "hosts" in network namespaces, and a cuttable TCP link.

Import the fixtures you use into a test module; pytest picks up fixtures found in a module's namespace::

    from .sshd import link_cutter, ssh_hosts, sshd_server  # noqa: F401

Fixtures never request each other by name (shared state lives in ``config.stash``), so importing any subset works.

- ``ssh_keys`` (session): :class:`SSHKeys`, an ed25519 host key and user key plus an ``authorized_keys`` file.
- ``sshd_server`` (session): :class:`SSHServer`, ``/usr/sbin/sshd`` on 127.0.0.1 at a free port.
- ``link_cutter`` (function): :class:`CuttableLink`, a TCP proxy in front of ``sshd_server``, cut and restored at will.
- ``ssh_hosts`` (module): :class:`SSHHosts`, ``.head`` (10.213.0.2) and ``.worker`` (10.213.0.3), each a network
  namespace bridged to the root namespace and running its own sshd on port 22, in a mount namespace of its own whose
  login files put this test run's Python first on PATH (Ray's cluster launcher runs its commands in login shells).
- ``ssh_hosts_own_pids`` (module): the same, each host also in a PID namespace of its own.

Everything needs root, ``openssh-server`` (``/usr/sbin/sshd``, ``ssh``, ``ssh-keygen``) and ``iproute2`` (``ip``);
when something is missing the fixtures fail (they never skip). Only loopback and the namespaces made here carry traffic.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import ipaddress
import os
import secrets
import shlex
import shutil
import signal
import socket
import struct
import subprocess
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from jupyter_cluster.agent._reaper import descendants

__all__ = [
    "CuttableLink",
    "SSHEndpoint",
    "SSHHosts",
    "SSHKeys",
    "SSHServer",
    "link_cutter",
    "ssh_hosts",
    "ssh_hosts_own_pids",
    "ssh_keys",
    "sshd_server",
]

SSHD = "/usr/sbin/sshd"
START_TIMEOUT = 10.0
SUBNET = "10.213.0.0/24"
BRIDGE_ADDR = "10.213.0.1"
HEAD_ADDR = "10.213.0.2"
WORKER_ADDR = "10.213.0.3"
PREFIX_LEN = 24
# Serialises ``ssh_hosts`` across processes: every run uses the same fixed subnet.
NETNS_LOCK = Path("/tmp/jupyter_cluster-ssh_hosts.lock")
NETNS_LOCK_TIMEOUT = 60.0


# --------------------------------------------------------------------------- helpers


def _require_tools(*tools: str) -> None:
    """Fail (not skip) when a needed executable is missing."""
    missing = [t for t in tools if shutil.which(t) is None and not os.access(t, os.X_OK)]
    if missing:
        pytest.fail(
            f"SSH test fixtures need {', '.join(missing)}, which is not installed: "
            "apt-get install -y --no-install-recommends openssh-server iproute2",
            pytrace=False,
        )


def _run(argv: Sequence[str], what: str, timeout: float = 30.0) -> subprocess.CompletedProcess[str]:
    """Run ``argv``; fail the test with ``what`` and the command's output when it does not succeed."""
    try:
        proc = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as exc:
        pytest.fail(f"{what}: {' '.join(argv)}: {exc}", pytrace=False)
    if proc.returncode != 0:
        pytest.fail(
            f"{what}: `{' '.join(argv)}` exited {proc.returncode}: {(proc.stderr or proc.stdout).strip()}",
            pytrace=False,
        )
    return proc


def _quiet(argv: Sequence[str]) -> None:
    """Run a teardown command, ignoring failure (the thing may already be gone)."""
    with contextlib.suppress(OSError, subprocess.TimeoutExpired):
        subprocess.run(list(argv), capture_output=True, timeout=15)


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on ``host`` right now (bound, then released)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _answers_ssh(host: str, port: int) -> bool:
    """Whether an SSH server at ``host:port`` accepts a connection and sends its banner."""
    try:
        with socket.create_connection((host, port), timeout=1.0) as s:
            s.settimeout(2.0)
            return s.recv(64).startswith(b"SSH-")
    except OSError:
        return False


def _kill_pids(pids: Sequence[int]) -> None:
    """SIGKILL each pid that still exists."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


def _stop_process(proc: subprocess.Popen[bytes], timeout: float = 5.0) -> None:
    """Terminate ``proc`` and every process it started (sshd's per-connection children included)."""
    family = descendants(proc.pid)
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout)
    _kill_pids(family + descendants(proc.pid))


# --------------------------------------------------------------------------- keys


@dataclass(frozen=True)
class SSHKeys:
    """An ed25519 host key and user key (no passphrase) and an ``authorized_keys`` file trusting the user key."""

    dir: Path
    host_key: Path
    host_key_pub: str
    user_key: Path
    user_key_pub: str
    authorized_keys: Path

    @classmethod
    def generate(cls, directory: Path) -> SSHKeys:
        """Make fresh keys in ``directory`` with ``ssh-keygen``."""
        _require_tools("ssh-keygen")
        directory.mkdir(parents=True, exist_ok=True)
        host_key, user_key = directory / "ssh_host_ed25519_key", directory / "id_ed25519"
        for path, comment in ((host_key, "jc-test-host"), (user_key, "jc-test-user")):
            _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)], "ssh-keygen failed")
        user_pub = user_key.with_suffix(".pub").read_text().strip()
        authorized = directory / "authorized_keys"
        authorized.write_text(user_pub + "\n")
        authorized.chmod(0o600)
        return cls(
            dir=directory,
            host_key=host_key,
            host_key_pub=Path(f"{host_key}.pub").read_text().strip(),
            user_key=user_key,
            user_key_pub=user_pub,
            authorized_keys=authorized,
        )

    def known_hosts_line(self, host: str, port: int = 22) -> str:
        """One ``known_hosts`` line for this host key at ``host:port`` (``[host]:port`` unless port is 22)."""
        key_type, key_b64 = self.host_key_pub.split()[:2]
        name = host if port == 22 else f"[{host}]:{port}"
        return f"{name} {key_type} {key_b64}"

    def known_hosts_text(self, addresses: Sequence[tuple[str, int]]) -> str:
        """``known_hosts`` content trusting this host key at each ``(host, port)``."""
        return "".join(self.known_hosts_line(h, p) + "\n" for h, p in addresses)

    def write_known_hosts(self, path: Path, addresses: Sequence[tuple[str, int]]) -> Path:
        """Write :meth:`known_hosts_text` to ``path``; return ``path``."""
        path.write_text(self.known_hosts_text(addresses))
        return path


def _sshd_config(keys: SSHKeys, directory: Path, listen: str, port: int) -> Path:
    """Write an sshd config for one server into ``directory``; return its path.

    Sessions see the test run's own interpreter first on PATH, so ``python3`` over SSH is the one running the tests
    (a virtualenv's, with Ray) rather than the system's. ``SHLVL=1`` keeps bash, the login shell, from sourcing
    ``~/.bashrc`` for commands run by sshd (bash does that only at shell level 1), so a ``~/.bashrc`` that puts
    something else first on PATH (pyenv shims, conda) cannot undo it.
    """
    import sys

    # This interpreter's folder (not resolved: a venv's bin/python3 is a symlink), then sshd's own PATH for root.
    path = f"{os.path.dirname(sys.executable)}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    lines = [
        f"ListenAddress {listen}",
        f"Port {port}",
        f"HostKey {keys.host_key}",
        f"AuthorizedKeysFile {keys.authorized_keys}",
        f"PidFile {directory / 'sshd.pid'}",
        "PubkeyAuthentication yes",
        "PasswordAuthentication no",
        "KbdInteractiveAuthentication no",
        "PermitRootLogin prohibit-password",
        "StrictModes no",
        "UsePAM no",
        "UseDNS no",
        "PrintMotd no",
        "AllowTcpForwarding yes",
        "AllowStreamLocalForwarding yes",
        "StreamLocalBindUnlink yes",
        "MaxSessions 50",
        "MaxStartups 50",
        "LogLevel VERBOSE",
        f'SetEnv "PATH={path}" SHLVL=1',
    ]
    sftp = Path("/usr/lib/openssh/sftp-server")
    if sftp.exists():
        lines.append(f"Subsystem sftp {sftp}")
    config = directory / "sshd_config"
    config.write_text("\n".join(lines) + "\n")
    return config


def _start_sshd(argv: list[str], log: Path, host: str, port: int) -> subprocess.Popen[bytes]:
    """Start sshd (``argv``), logging to ``log``; wait (bounded) until ``host:port`` answers SSH.

    Under ``setpriv --pdeathsig TERM`` (util-linux) when available, so a test process that dies without its teardown
    takes the listener with it. The signal follows the *thread* that started sshd: start servers from a thread that
    outlives them (fixtures run on the main thread).
    """
    Path("/run/sshd").mkdir(mode=0o755, parents=True, exist_ok=True)  # sshd's privilege separation dir
    setpriv = shutil.which("setpriv")
    if setpriv is not None:
        argv = [setpriv, "--pdeathsig", "TERM", *argv]
    with log.open("ab") as out:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            break
        if _answers_ssh(host, port):
            return proc
        time.sleep(0.05)
    _stop_process(proc)
    pytest.fail(
        f"sshd did not come up on {host}:{port} within {START_TIMEOUT:.0f}s "
        f"(exit code {proc.returncode}); `{' '.join(argv)}` logged:\n{log.read_text(errors='replace')[-3000:]}",
        pytrace=False,
    )


# --------------------------------------------------------------------------- endpoints


@dataclass
class SSHEndpoint:
    """Where and how to log in to one real sshd."""

    host: str
    port: int
    user: str
    identity: Path
    known_hosts: Path
    host_key_pub: str

    def ssh_argv(self, cmd: str) -> list[str]:
        """The real ``ssh`` client's argv running ``cmd`` here (strict host key checking, no agent, no config)."""
        return [
            "ssh",
            "-F",
            "/dev/null",
            "-i",
            str(self.identity),
            "-p",
            str(self.port),
            "-o",
            f"UserKnownHostsFile={self.known_hosts}",
            "-o",
            "GlobalKnownHostsFile=/dev/null",
            "-o",
            "StrictHostKeyChecking=yes",
            "-o",
            "BatchMode=yes",
            "-o",
            "IdentitiesOnly=yes",
            "-o",
            "ConnectTimeout=10",
            f"{self.user}@{self.host}",
            cmd,
        ]

    def ssh(self, cmd: str, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
        """Run ``cmd`` here through the real ``ssh`` client (text output, not checked)."""
        return subprocess.run(self.ssh_argv(cmd), capture_output=True, text=True, timeout=timeout)

    def connect_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for ``asyncssh.connect`` (no ~/.ssh/config, no agent)."""
        return {
            "host": self.host,
            "port": self.port,
            "username": self.user,
            "client_keys": [str(self.identity)],
            "known_hosts": str(self.known_hosts),
            "agent_path": None,
            "config": [],
        }


class SSHServer(SSHEndpoint):
    """A real ``/usr/sbin/sshd -D -e`` on 127.0.0.1 at a free port, logging in as root with ``identity``."""

    def __init__(self, keys: SSHKeys, directory: Path, host: str = "127.0.0.1") -> None:
        _require_tools(SSHD, "ssh")
        directory.mkdir(parents=True, exist_ok=True)
        self.dir = directory
        self.log = directory / "sshd.log"
        self.proc: subprocess.Popen[bytes] | None = None
        super().__init__(host, 0, "root", keys.user_key, directory / "known_hosts", keys.host_key_pub)
        self._keys = keys

    def start(self, port: int | None = None) -> SSHServer:
        """Start sshd and wait until it answers; a port lost to a race is retried with another.

        With ``port``, start on that port (to bring a stopped server back where clients knew it).
        """
        if port is not None:
            self.port = port
            config = _sshd_config(self._keys, self.dir, self.host, self.port)
            self.proc = _start_sshd([SSHD, "-D", "-e", "-f", str(config)], self.log, self.host, self.port)
            return self
        for attempt in range(3):
            self.port = free_port(self.host)
            config = _sshd_config(self._keys, self.dir, self.host, self.port)
            self._keys.write_known_hosts(self.known_hosts, [(self.host, self.port)])
            try:
                self.proc = _start_sshd([SSHD, "-D", "-e", "-f", str(config)], self.log, self.host, self.port)
                return self
            except pytest.fail.Exception:
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")

    def stop(self) -> None:
        """Terminate sshd and its per-connection children."""
        if self.proc is not None:
            _stop_process(self.proc)
            self.proc = None

    def stop_cleanly(self, timeout: float = 5.0) -> None:
        """Stop sshd as an administrator would: SIGTERM to the listener and to each per-connection process, which
        close their sockets, so clients see a clean close (FIN), not a reset."""
        if self.proc is None:
            return
        family = [self.proc.pid, *descendants(self.proc.pid)]
        for pid in family:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and any(Path(f"/proc/{pid}").exists() for pid in family[1:]):
            time.sleep(0.05)
        _stop_process(self.proc, timeout)  # reaps the listener; kills whatever ignored SIGTERM
        self.proc = None

    def __enter__(self) -> SSHServer:
        return self.start() if self.proc is None else self

    def __exit__(self, *exc: object) -> None:
        self.stop()


# --------------------------------------------------------------------------- cuttable link


def _abort(writer: asyncio.StreamWriter) -> None:
    """Close a stream abruptly: linger 0 so the peer sees a reset, not a clean FIN."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


class CuttableLink:
    """A TCP proxy on 127.0.0.1 to ``(target_host, target_port)``, run by an asyncio loop in a background thread.

    ``cut()`` aborts every proxied connection (both sides) and closes the listening socket, so new connections are
    refused; ``restore()`` listens again on the same port. ``known_hosts`` is set by the ``link_cutter`` fixture to a
    file that trusts the target's host key when reached through this link.
    """

    OP_TIMEOUT = 10.0

    def __init__(self, target_host: str, target_port: int, *, known_hosts: Path | None = None) -> None:
        addr = ipaddress.ip_address(socket.gethostbyname(target_host))
        if not (addr.is_loopback or addr in ipaddress.ip_network(SUBNET)):
            raise ValueError(f"CuttableLink only forwards to loopback or {SUBNET}, not {target_host}")
        self.host = "127.0.0.1"
        self.port = 0
        self.target = (target_host, target_port)
        self.known_hosts = known_hosts
        self._server: asyncio.Server | None = None
        self._conns: set[tuple[asyncio.StreamWriter, ...]] = set()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._loop = asyncio.new_event_loop()
        self._flowing = asyncio.Event()
        self._flowing.set()
        self._thread = threading.Thread(target=self._loop.run_forever, name="CuttableLink", daemon=True)
        self._thread.start()
        try:
            self.restore()
        except BaseException:
            self._stop_loop()
            raise

    # -- public API (called from any thread but the link's own)

    @property
    def listening(self) -> bool:
        """Whether the link accepts new connections."""
        return self._server is not None

    @property
    def connections(self) -> int:
        """How many client connections are proxied right now."""
        return len(self._conns)

    def cut(self) -> None:
        """Abort all proxied connections and stop listening (new connections are refused)."""
        self._call(self._cut())

    def restore(self) -> None:
        """Listen again, on the same port as before (a fresh free port the first time)."""
        self._call(self._listen())

    def freeze(self) -> None:
        """Go silent: stop forwarding bytes either way, closing nothing (a laptop asleep, a Wi-Fi gone). New
        connections are accepted and go silent too."""
        self._loop.call_soon_threadsafe(self._flowing.clear)

    def thaw(self) -> None:
        """Forward bytes again (what was held is delivered; peers that gave up meanwhile see it fail)."""
        self._loop.call_soon_threadsafe(self._flowing.set)

    def close(self) -> None:
        """Cut the link and stop its thread."""
        if self._thread.is_alive():
            try:
                self.cut()
            finally:
                self._stop_loop()

    def __enter__(self) -> CuttableLink:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "listening" if self.listening else "cut"
        return f"<CuttableLink {self.host}:{self.port} -> {self.target[0]}:{self.target[1]} {state}>"

    # -- internals (run on the link's loop)

    def _call(self, coro: Any) -> Any:
        if threading.current_thread() is self._thread:
            raise RuntimeError("CuttableLink methods must not be called from its own loop")
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(self.OP_TIMEOUT)

    def _stop_loop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(self.OP_TIMEOUT)
        if not self._thread.is_alive():
            self._loop.close()

    async def _listen(self) -> None:
        if self._server is not None:
            return
        self._server = await asyncio.start_server(self._handle, self.host, self.port, reuse_address=True)
        self.port = int(self._server.sockets[0].getsockname()[1])

    async def _cut(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.close()
        for pair in list(self._conns):
            for writer in pair:
                _abort(writer)
        self._conns.clear()
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=self.OP_TIMEOUT)

    async def _handle(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        pair: tuple[asyncio.StreamWriter, ...] = (client_w,)
        self._conns.add(pair)
        try:
            try:
                up_r, up_w = await asyncio.wait_for(asyncio.open_connection(*self.target), self.OP_TIMEOUT)
            except (OSError, asyncio.TimeoutError):
                _abort(client_w)
                return
            self._conns.discard(pair)
            pair = (client_w, up_w)
            self._conns.add(pair)
            await asyncio.gather(self._pump(client_r, up_w), self._pump(up_r, client_w))
        except asyncio.CancelledError:
            pass
        finally:
            if pair in self._conns:  # ended by a peer, not by cut(): close politely
                self._conns.discard(pair)
                for writer in pair:
                    writer.close()
            self._tasks.discard(task)

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                await self._flowing.wait()
                writer.write(data)
                await writer.drain()
            if writer.can_write_eof():
                writer.write_eof()
        except (OSError, RuntimeError):
            _abort(writer)


# --------------------------------------------------------------------------- network namespaces


@dataclass
class SSHHost(SSHEndpoint):
    """One namespace "host" with its own sshd on port 22."""

    netns: str = ""
    veth: str = ""
    proc: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    #: The stand-ins for the login files this host's shells read (see :func:`_login_files`).
    login_files: list[Path] = field(default_factory=list, repr=False)

    @contextlib.contextmanager
    def login_path(self, path: str) -> Iterator[None]:
        """While in the block, this host's login shells end with PATH set to ``path``: a host whose login shell
        does not find this run's Python and Ray (a virtualenv it does not activate)."""
        saved = {login: login.read_text() for login in self.login_files}
        try:
            for login, text in saved.items():  # in place: the host's bind mount shows this very file
                login.write_text(f"{text}PATH={shlex.quote(path)}; export PATH\n")
            yield
        finally:
            for login, text in saved.items():
                login.write_text(text)

    def netns_exec(self, argv: Sequence[str], timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` inside this host's namespace directly (no SSH)."""
        return subprocess.run(
            ["ip", "netns", "exec", self.netns, *argv], capture_output=True, text=True, timeout=timeout
        )


@dataclass
class SSHHosts:
    """Two namespace hosts on one bridge: ``head`` (10.213.0.2) and ``worker`` (10.213.0.3)."""

    head: SSHHost
    worker: SSHHost
    bridge: str
    bridge_addr: str = BRIDGE_ADDR

    def __iter__(self) -> Iterator[SSHHost]:
        return iter((self.head, self.worker))


@contextlib.contextmanager
def _netns_lock() -> Iterator[None]:
    """Hold an exclusive lock on the fixed subnet across processes (bounded wait)."""
    with NETNS_LOCK.open("a") as fh:
        deadline = time.monotonic() + NETNS_LOCK_TIMEOUT
        while True:
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    pytest.fail(
                        f"ssh_hosts: another test run held {NETNS_LOCK} (subnet {SUBNET}) for "
                        f"{NETNS_LOCK_TIMEOUT:.0f}s",
                        pytrace=False,
                    )
                time.sleep(0.2)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _netns_names() -> list[str]:
    proc = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=15)
    return [line.split()[0] for line in proc.stdout.splitlines() if line.strip()]


def _delete_netns(name: str) -> None:
    """Kill everything left inside namespace ``name``, then delete it."""
    for _ in range(3):
        proc = subprocess.run(["ip", "netns", "pids", name], capture_output=True, text=True, timeout=15)
        pids = [int(p) for p in proc.stdout.split() if p.isdigit()]
        if not pids:
            break
        _kill_pids(pids)
        time.sleep(0.1)
    _quiet(["ip", "netns", "del", name])


def _remove_stale() -> None:
    """Remove namespaces and links left by an earlier run that died (we hold the lock, so none is in use)."""
    for name in _netns_names():
        if name.startswith(("jc-head-", "jc-worker-")):
            _delete_netns(name)
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True, timeout=15).stdout
    for line in links.splitlines():
        name = line.split(":")[1].strip().split("@")[0] if ":" in line else ""
        if name.startswith(("jcbr-", "jch-", "jcw-")):
            _quiet(["ip", "link", "del", name])


#: The files a login shell reads (bash --login reads /etc/profile, then the first of the three in ~ it finds), and
#: ~/.bashrc, which Ray's cluster launcher sources itself (``bash --login -c -i 'source ~/.bashrc; ...'``).
LOGIN_FILES = ("/etc/profile", "~/.bash_profile", "~/.bash_login", "~/.profile", "~/.bashrc")


def _login_files(directory: Path) -> list[tuple[Path, Path]]:
    """For each of :data:`LOGIN_FILES` that exists here, a stand-in written into ``directory``: the file's own lines
    (from a copy), then this test run's interpreter folder put first on PATH. Returns ``(file, stand-in)`` pairs, for
    a host to bind-mount in a mount namespace of its own: this machine's own files are never changed.

    The hosts share this filesystem, and their login shells would otherwise find another Python (a ``~/.bashrc``
    that puts pyenv's shims first; Debian's ``/etc/profile``, which sets PATH anew), without this run's Ray when it
    lives in a virtualenv: ``ray stop`` in ``ray down`` then answers ``ray: command not found``.
    """
    import sys

    directory.mkdir(parents=True, exist_ok=True)
    first = shlex.quote(os.path.dirname(sys.executable))  # not resolved: a venv's bin/python3 is a symlink
    pairs = []
    for name in LOGIN_FILES:
        login = Path(os.path.expanduser(name))
        if not login.is_file():
            continue
        copy = directory / f"{login.name.lstrip('.')}.orig"
        shutil.copyfile(login, copy)
        made = directory / login.name.lstrip(".")
        made.write_text(
            f"# {login} on a test host: its own lines, then the test run's Python first on PATH\n"
            f". {shlex.quote(str(copy))}\n"
            f'PATH={first}:"$PATH"; export PATH\n'
        )
        pairs.append((login, made))
    return pairs


def _add_host(
    keys: SSHKeys,
    directory: Path,
    bridge: str,
    netns: str,
    veth: str,
    addr: str,
    known_hosts: Path,
    own_pids: bool = False,
) -> SSHHost:
    """Create namespace ``netns`` wired to ``bridge`` with ``addr``, and start its sshd on port 22.

    ``own_pids``: sshd runs as the first process of a PID namespace of its own (``unshare --pid --mount-proc``), so
    what its sessions start sees only this host's processes (``ray stop`` stops this host's Ray only), and every
    process of the host dies with sshd.
    """
    peer = veth + "p"
    _run(["ip", "netns", "add", netns], f"ssh_hosts: cannot create network namespace {netns} (need root/CAP_SYS_ADMIN)")
    _run(["ip", "link", "add", veth, "type", "veth", "peer", "name", peer], f"ssh_hosts: cannot create veth {veth}")
    _run(["ip", "link", "set", veth, "master", bridge], f"ssh_hosts: cannot attach {veth} to bridge {bridge}")
    _run(["ip", "link", "set", veth, "up"], f"ssh_hosts: cannot bring up {veth}")
    _run(["ip", "link", "set", peer, "netns", netns], f"ssh_hosts: cannot move {peer} into {netns}")
    ns = ["ip", "netns", "exec", netns]
    _run([*ns, "ip", "link", "set", "lo", "up"], f"ssh_hosts: cannot bring up lo in {netns}")
    _run([*ns, "ip", "link", "set", peer, "name", "eth0"], f"ssh_hosts: cannot rename {peer} in {netns}")
    _run([*ns, "ip", "addr", "add", f"{addr}/{PREFIX_LEN}", "dev", "eth0"], f"ssh_hosts: cannot address {netns}")
    _run([*ns, "ip", "link", "set", "eth0", "up"], f"ssh_hosts: cannot bring up eth0 in {netns}")
    hostdir = directory / netns
    hostdir.mkdir()
    config = _sshd_config(keys, hostdir, addr, 22)
    # A mount namespace of the host's own, where its login files put this test run's Python first (see
    # _login_files); with own_pids, a PID namespace too (--mount-proc implies --mount).
    own = ["unshare", "--pid", "--fork", "--kill-child", "--mount-proc"] if own_pids else ["unshare", "--mount"]
    logins = _login_files(hostdir / "login")
    mounts = " && ".join(f"mount --bind {shlex.quote(str(made))} {shlex.quote(str(login))}" for login, made in logins)
    boot = ["sh", "-c", f'{mounts} && exec "$@"', "sh"] if mounts else []
    proc = _start_sshd([*ns, *own, *boot, SSHD, "-D", "-e", "-f", str(config)], hostdir / "sshd.log", addr, 22)
    return SSHHost(
        addr,
        22,
        "root",
        keys.user_key,
        known_hosts,
        keys.host_key_pub,
        netns=netns,
        veth=veth,
        proc=proc,
        login_files=[made for _, made in logins],
    )


@contextlib.contextmanager
def make_ssh_hosts(keys: SSHKeys, directory: Path, own_pids: bool = False) -> Iterator[SSHHosts]:
    """Build the head/worker namespaces, bridge and sshds; tear all of it down afterwards.

    ``own_pids``: each host also gets a PID namespace of its own (see :func:`_add_host`).
    """
    _require_tools(SSHD, "ssh", "ip", *(["unshare"] if own_pids else []))
    suffix = secrets.token_hex(3)
    bridge, head_ns, worker_ns = f"jcbr-{suffix}", f"jc-head-{suffix}", f"jc-worker-{suffix}"
    known_hosts = keys.write_known_hosts(directory / "known_hosts", [(HEAD_ADDR, 22), (WORKER_ADDR, 22)])
    hosts: list[SSHHost] = []
    with _netns_lock():
        try:
            _remove_stale()
            _run(["ip", "link", "add", bridge, "type", "bridge"], f"ssh_hosts: cannot create bridge {bridge}")
            _run(
                ["ip", "addr", "add", f"{BRIDGE_ADDR}/{PREFIX_LEN}", "dev", bridge],
                f"ssh_hosts: cannot give {bridge} {BRIDGE_ADDR}",
            )
            _run(["ip", "link", "set", bridge, "up"], f"ssh_hosts: cannot bring up {bridge}")
            for ns, veth, addr in ((head_ns, f"jch-{suffix}", HEAD_ADDR), (worker_ns, f"jcw-{suffix}", WORKER_ADDR)):
                try:
                    hosts.append(_add_host(keys, directory, bridge, ns, veth, addr, known_hosts, own_pids))
                except BaseException:
                    hosts.append(SSHHost(addr, 22, "root", keys.user_key, known_hosts, "", netns=ns, veth=veth))
                    raise
            yield SSHHosts(hosts[0], hosts[1], bridge)
        finally:
            for host in hosts:
                if host.proc is not None:
                    if own_pids:  # unshare ignores SIGTERM; SIGKILL ends it, and its PID namespace with it
                        host.proc.kill()
                    _stop_process(host.proc)
            for ns in (head_ns, worker_ns):
                if ns in _netns_names():
                    _delete_netns(ns)
            for host in hosts:
                _quiet(["ip", "link", "del", host.veth])
            _quiet(["ip", "link", "del", bridge])


# --------------------------------------------------------------------------- fixtures

_KEYS = pytest.StashKey[SSHKeys]()
_SERVER = pytest.StashKey[SSHServer]()


def _session_keys(request: pytest.FixtureRequest, factory: pytest.TempPathFactory) -> SSHKeys:
    """The session's keys, made once (kept in ``config.stash`` so fixtures need not request each other)."""
    stash = request.config.stash
    if _KEYS not in stash:
        stash[_KEYS] = SSHKeys.generate(factory.mktemp("ssh-keys"))
    return stash[_KEYS]


def _session_server(request: pytest.FixtureRequest, factory: pytest.TempPathFactory) -> SSHServer:
    """The session's loopback sshd, started once and stopped when the session ends."""
    stash = request.config.stash
    if _SERVER not in stash:
        server = SSHServer(_session_keys(request, factory), factory.mktemp("sshd")).start()
        stash[_SERVER] = server

        def stop() -> None:
            server.stop()
            del stash[_SERVER]

        request.session.addfinalizer(stop)
    return stash[_SERVER]


@pytest.fixture(scope="session")
def ssh_keys(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> SSHKeys:
    """ed25519 host and user keys, and an authorized_keys file trusting the user key."""
    return _session_keys(request, tmp_path_factory)


@pytest.fixture(scope="session")
def sshd_server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> SSHServer:
    """A real sshd on 127.0.0.1 (root login with ``identity``; ``known_hosts`` trusts it)."""
    return _session_server(request, tmp_path_factory)


@pytest.fixture
def link_cutter(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[CuttableLink]:
    """A :class:`CuttableLink` in front of ``sshd_server``; its ``known_hosts`` trusts sshd at the link's port."""
    server = _session_server(request, tmp_path_factory)
    with CuttableLink(server.host, server.port) as link:
        keys = _session_keys(request, tmp_path_factory)
        link.known_hosts = keys.write_known_hosts(
            tmp_path_factory.mktemp("link") / "known_hosts", [(link.host, link.port), (server.host, server.port)]
        )
        yield link


@pytest.fixture(scope="module")
def ssh_hosts(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SSHHosts]:
    """Two namespace hosts, ``head`` 10.213.0.2 and ``worker`` 10.213.0.3, each with sshd on port 22."""
    keys = _session_keys(request, tmp_path_factory)
    with make_ssh_hosts(keys, tmp_path_factory.mktemp("ssh-hosts")) as hosts:
        yield hosts


@pytest.fixture(scope="module")
def ssh_hosts_own_pids(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SSHHosts]:
    """``ssh_hosts`` whose hosts also have a PID namespace each: a host sees only its own processes, as a real one
    does, so ``ray stop`` run there (Ray's cluster launcher runs it) cannot stop Ray elsewhere on this machine."""
    keys = _session_keys(request, tmp_path_factory)
    with make_ssh_hosts(keys, tmp_path_factory.mktemp("ssh-hosts"), own_pids=True) as hosts:
        yield hosts
