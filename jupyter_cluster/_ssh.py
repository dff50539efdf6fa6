"""Reaching a head node over SSH, as the user's own ``ssh`` would.

asyncssh reads ``~/.ssh/config`` (Host aliases, User, Port, IdentityFile, ProxyJump),
uses ssh-agent keys and checks ``~/.ssh/known_hosts`` unless told otherwise.
:class:`RemoteHead` runs what the kernel needs there: probing the head's Python and
Ray, shipping the agent's modules when the head lacks this version of them, starting
the agent as a daemon that outlives the connection, and starting or stopping Ray.
:class:`SSHTransport` reaches the agent's Unix socket through the connection
(``open_unix_connection``), reconnecting SSH itself when the link drops; no TCP port
is opened on the head.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import json
import os
import posixpath
import re
import secrets
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ._crash import CRASH_FILE, how_it_ended
from ._errors import ClusterConnectionError
from ._prompts import Asking
from ._version import __version__

CONNECT_TIMEOUT = 15.0
AGENT_START_TIMEOUT = 120.0
_AGENT_DIR = Path(__file__).parent / "agent"


class HostKeyError(ClusterConnectionError):
    """The head's host key is not known, or has changed."""


class SSHAuthError(ClusterConnectionError):
    """The head refused every key offered."""


class HeadError(ClusterConnectionError):
    """The head cannot run the agent as it is (no Ray, no such Python, no Ray running)."""


class NoRayError(HeadError):
    """The head answers, and no Ray cluster is running there."""


class RayAuthError(HeadError):
    """Ray on the head refused the agent: token authentication, and no right token."""


_AUTH_SIGNS = ("InvalidAuthToken", "Unauthenticated", "no authentication token was found", "AuthenticationError")


def _start_failure(host: str, address: str, error: str, log: str, token_given: str | None) -> HeadError:
    """Why the agent could not join Ray on ``host``, said so that the user can act on it."""
    if any(sign in error or sign in log for sign in _AUTH_SIGNS):
        offered = (
            "the token this notebook passed on was not the cluster's"
            if token_given
            else "no token, or not the cluster's, was found on the head (~/.ray/auth_token, RAY_AUTH_TOKEN)"
        )
        return RayAuthError(
            f"Ray at {address} on {host} refused the agent: token authentication is on there and {offered}. "
            "Give the cluster's token: `--ray-token-file FILE` (jc.connect(..., ray_token_file=FILE)) with a file "
            "holding it (the head's ~/.ray/auth_token is where `ray start` keeps it; `ray get-auth-token` prints it), "
            "or set RAY_AUTH_TOKEN in this kernel's environment."
        )
    lines = [line for line in log.strip().splitlines() if line.strip()][-5:]
    detail = "\n".join(lines)
    if "Could not find any running Ray" in error or "ConnectionError" in error:
        return HeadError(
            f"the agent on {host} could not join Ray at {address}: {error}. If no Ray is running there, start "
            f"one (`ray start --head`) or connect with --start-head.\n{detail}"
        )
    return HeadError(f"the agent on {host} could not start: {error}.\n{detail}")


@dataclass
class SSHTarget:
    """Where and how to log in: ``[user@]host[:port]`` plus options.

    >>> SSHTarget.parse("alice@head.example:2222").describe()
    'alice@head.example:2222'
    """

    host: str
    port: int | None = None
    user: str | None = None
    identity: str | None = None
    known_hosts: str | None = None  # a file, "none" (no check), or None (~/.ssh/known_hosts)
    python: str = "python3"
    #: Seconds of silence after which the connection counts as dead (SSH keepalives).
    keepalive: float = 15.0

    @classmethod
    def parse(cls, spec: str, **options: Any) -> SSHTarget:
        match = re.fullmatch(r"(?:([^@\s]+)@)?(\[[^\]]+\]|[^:@\s]+)(?::(\d+))?", spec.strip())
        if match is None:
            raise ValueError(f"{spec!r} is not [user@]host[:port]")
        user, host, port = match.groups()
        target = cls(host=host.strip("[]"), port=int(port) if port else None, user=user)
        for key, value in options.items():
            if value is not None:
                setattr(target, key, value)
        return target

    def describe(self) -> str:
        user = f"{self.user}@" if self.user else ""
        port = f":{self.port}" if self.port else ""
        return f"{user}{self.host}{port}"

    def connect_options(self) -> dict[str, Any]:
        options: dict[str, Any] = {
            # asyncssh drops the connection after count_max + 1 unanswered intervals.
            "keepalive_interval": self.keepalive / 3,
            "keepalive_count_max": 2,
            "encryption_algs": _encryption_algs(),
        }
        if self.port:
            options["port"] = self.port
        if self.user:
            options["username"] = self.user
        if self.identity:
            options["client_keys"] = [os.path.expanduser(self.identity)]
        if self.known_hosts == "none":
            options["known_hosts"] = None
        elif self.known_hosts:
            options["known_hosts"] = os.path.expanduser(self.known_hosts)
        return options


def _encryption_algs() -> list[str]:
    """asyncssh's ciphers, AES-GCM first: with AES-NI it moves arrays through asyncssh
    about 1.4 times as fast as its default ChaCha20-Poly1305, which it assembles from
    several calls per packet."""
    from asyncssh.encryption import get_default_encryption_algs

    algs = [a.decode() for a in get_default_encryption_algs()]
    first = [a for a in ("aes128-gcm@openssh.com", "aes256-gcm@openssh.com") if a in algs]
    return first + [a for a in algs if a not in first]


@functools.cache
def _quick_login_client() -> Any:
    """An ``asyncssh.SSHClient`` that logs in two round trips sooner than asyncssh does alone.

    asyncssh begins with a ``none`` request, only to learn which methods the server
    takes, then asks whether the server would take a key before it sends the key's
    signed request. Here the first request is a key's signed request. A refusal of it
    names the server's methods, and the login goes on from there as asyncssh's does.
    A security key (``sk-``) is still asked about first, so that it is not touched for
    a server that would refuse it. On a 50 ms link, connecting and resuming after a
    reset are 100 ms sooner. Where this version of asyncssh lacks what this relies
    on, the login is asyncssh's own.
    """
    import asyncssh
    from asyncssh import auth
    from asyncssh.packet import Boolean, String

    class Asks(asyncssh.SSHClient):
        """A server's password and keyboard-interactive questions (a one-time code), asked in the notebook."""

        def __init__(self, asking: Asking | None = None) -> None:
            self._asking = asking or Asking("ssh", interactive=False)  # asyncssh's own factory call: none asked

        def password_auth_requested(self) -> Any:
            return self._asking.ask(f"{self._asking.who}'s password: ", secret=True)

        def kbdint_auth_requested(self) -> str:
            return ""  # the server's own choice of devices

        def kbdint_challenge_received(self, name: str, instructions: str, lang: str, prompts: Any) -> Any:
            return self._asking.kbdint(instructions, prompts) if prompts else []

    base = getattr(auth, "_ClientPublicKeyAuth", None)
    if base is None or not all(hasattr(base, name) for name in ("_send_signed_request", "send_request")):
        return Asks

    class SignedAtOnce(base):  # type: ignore[misc,valid-type]
        async def _start(self) -> None:
            self._keypair = keypair = await self._conn.public_key_auth_requested()
            if keypair is None:
                self._conn.try_next_auth(next_method=True)
            elif keypair.algorithm.startswith(b"sk-"):
                await self.send_request(Boolean(False), String(keypair.algorithm), String(keypair.public_data))
            else:
                await self._send_signed_request()

    class QuickLogin(Asks):
        def connection_made(self, conn: Any) -> None:
            self._conn = conn

        def begin_auth(self, username: str) -> None:
            conn = self._conn
            preferred = getattr(conn, "_preferred_auth", None) or []
            if getattr(conn, "_auth_methods", None) != [b"none"] or b"publickey" not in preferred:
                return
            plain = conn.try_next_auth

            def try_next_auth(*, next_method: bool = False) -> None:
                plain(next_method=next_method)
                chosen = conn._auth
                if type(chosen) is base:  # asyncssh's own, made this moment: its start has not run yet
                    chosen.cancel()
                    conn._auth = SignedAtOnce(conn, b"publickey")

            conn.try_next_auth = try_next_auth
            # "none" stays behind the key: with no key to offer, it learns the server's methods as before.
            conn._auth_methods = [b"publickey", b"none"]

    return QuickLogin


async def open_ssh(target: SSHTarget) -> Any:
    """An asyncssh connection to ``target``, or an error that says what to do. The server's questions (a password,
    a one-time code) and a key's passphrase are asked in the notebook (:mod:`._prompts`), and the time they take
    counts against no timeout."""
    import asyncssh

    where = target.describe()
    asking = Asking(where)
    client = _quick_login_client()
    options = target.connect_options()
    options["passphrase"] = functools.partial(_passphrase, asking)
    try:
        connecting = asyncssh.connect(target.host, client_factory=lambda: client(asking), **options)
        return await asking.within(connecting, CONNECT_TIMEOUT)  # not asyncssh's: a question's time is left out
    except asyncssh.HostKeyNotVerifiable as exc:
        port = target.port or 22
        raise HostKeyError(
            f"the host key of {target.host}:{port} is unknown or has changed ({exc}). If you trust it, add it: "
            f"`ssh-keyscan -p {port} {target.host} >> ~/.ssh/known_hosts` (or pass --known-hosts FILE; "
            "--known-hosts none skips the check)."
        ) from None
    except asyncssh.PermissionDenied as exc:
        refused = asking.refused()
        raise SSHAuthError(
            f"{where} refused the login ({exc.reason}): pass --identity FILE with a key it accepts, "
            "or load one into ssh-agent." + (f" {refused}" if refused else "")
        ) from None
    except (OSError, asyncio.TimeoutError, asyncssh.Error) as exc:
        port = target.port or 22
        detail = str(exc) or type(exc).__name__
        raise ClusterConnectionError(
            f"cannot reach {target.host} port {port} over SSH ({detail}); check the address and that sshd runs there."
        ) from None


async def _passphrase(asking: Asking, filename: str) -> str | None:
    """A key's passphrase, asked for keys under one only (asyncssh asks of every key it is given)."""
    import asyncssh

    try:
        asyncssh.read_private_key(filename)
        return None
    except asyncssh.KeyImportError as exc:
        if "passphrase" not in str(exc).lower():
            return None
    except OSError:
        return None
    return await asking.ask(f"Enter passphrase for key '{filename}': ", secret=True)


#: Run on the head by ``python -c``: probes it and starts the agent in one exec.
BOOT = (_AGENT_DIR / "_boot.py").read_text()


def agent_modules() -> list[str]:
    """The agent's modules, as paths inside ``jupyter_cluster/agent`` (``cells/_execute.py``): what is shipped to a
    head that lacks this version (the embedded cluster's ``_site`` stays here)."""
    return sorted(
        path.relative_to(_AGENT_DIR).as_posix()
        for path in _AGENT_DIR.rglob("*.py")
        if path.parent.name not in ("_site", "__pycache__")
    )


def agent_fingerprint() -> str:
    """Content hash of the agent's modules: a shipped copy is reused only if identical."""
    digest = hashlib.blake2b(digest_size=6)
    for name in agent_modules():
        digest.update(name.encode() + (_AGENT_DIR / name).read_bytes())
    return digest.hexdigest()


class RemoteHead:
    """Commands the kernel runs on a head node over one SSH connection."""

    def __init__(self, target: SSHTarget, conn: Any) -> None:
        self.target = target
        self.conn = conn
        self.info: dict[str, Any] = {}

    async def run(self, command: str, *, stdin: str | None = None, timeout: float = 120.0) -> Any:
        return await asyncio.wait_for(self.conn.run(command, input=stdin, check=False), timeout)

    @property
    def python(self) -> str:
        return shlex.quote(self.target.python)

    async def boot(self, request: dict[str, Any]) -> dict[str, Any]:
        """Run the boot script on the head with ``request``; return its answer.

        Raises :class:`HeadError` when the head has no such Python, or no Ray.
        """
        timeout = AGENT_START_TIMEOUT + 30
        done = await self.run(f"{self.python} -c {shlex.quote(BOOT)}", stdin=json.dumps(request), timeout=timeout)
        if done.exit_status != 0:
            if done.exit_status == 127 or "No such file" in str(done.stderr):
                raise HeadError(
                    f"there is no Python at {self.target.python!r} on {self.target.host}: "
                    "pass --python with the path of one that has Ray."
                )
            raise HeadError(f"the Python on {self.target.host} failed: {str(done.stderr).strip()[-500:]}")
        answer: dict[str, Any] = json.loads(str(done.stdout).strip().splitlines()[-1])
        self.info = answer["info"]
        if not self.info.get("ray"):
            raise HeadError(
                f"the Python at {self.info['executable']} on {self.target.host} has no Ray: install it there "
                "(`pip install 'ray[default]'`), or pass --python with one that has it."
            )
        return answer

    async def agent_death(self, pid: int | None, socket_path: str, timeout: float = 15.0) -> str | None:
        """Where the agent (process ``pid``, serving ``socket_path``) is known to be gone: what its
        faulthandler left (see :mod:`._crash`; empty where nothing was). None where it may still run (unsure)."""
        if pid is None:
            return None
        try:
            done = await asyncio.wait_for(self.run(f"kill -0 {int(pid)}"), timeout)
        except Exception:
            return None
        if not (done.exit_status == 1 and "No such process" in str(done.stderr)):
            return None
        path = posixpath.join(posixpath.dirname(socket_path), CRASH_FILE)
        try:
            done = await asyncio.wait_for(self.run(f"tail -c 65536 {shlex.quote(path)}"), timeout)
        except Exception:
            return ""
        return str(done.stdout or "")

    async def probe(self) -> dict[str, Any]:
        """The head's Python, Ray, this package's version, and a running Ray's address."""
        return (await self.boot({"probe_only": True}))["info"]

    async def ship_agent(self, lib: str, version: str) -> None:
        """Copy the agent's modules into ``lib`` (a per-version folder) over SFTP."""
        marker = f"{lib}/jupyter_cluster/agent/.complete"
        stub = f'"""The agent\'s modules, shipped to this head."""\n\n__version__ = "{version}"\n'
        modules = agent_modules()
        async with self.conn.start_sftp_client() as sftp:
            for folder in sorted({posixpath.dirname(name) for name in modules}):
                await sftp.makedirs(posixpath.join(f"{lib}/jupyter_cluster/agent", folder), exist_ok=True)
            async with sftp.open(f"{lib}/jupyter_cluster/__init__.py", "w") as f:
                await f.write(stub)
            for folder in sorted({posixpath.dirname(name) for name in modules}):
                paths = [str(_AGENT_DIR / name) for name in modules if posixpath.dirname(name) == folder]
                await sftp.put(paths, posixpath.join(f"{lib}/jupyter_cluster/agent", folder) + "/")
            async with sftp.open(marker, "w") as f:
                await f.write(agent_fingerprint())

    async def start_agent(
        self,
        session: str,
        *,
        resume: bool,
        address: str | None,
        ship: str,
        env: dict[str, str],
        idle_timeout: float,
        ray_token: str | None = None,
    ) -> dict[str, Any]:
        """The session's agent: found running (``resume``), or started as a daemon that
        outlives this connection, in one exec (a second when the modules must be
        shipped first). Returns its ready state with ``secret``, ``shipped`` and
        ``resumed``; ``{"need": "ray"}`` when no Ray runs there to join.

        The secret, and the Ray token when the kernel has one, reach the agent on
        stdin, into a 0600 file: never on a command line.
        """
        request = {
            "session": session,
            "resume": resume,
            "secret": secrets.token_hex(32),
            "ray_token": ray_token,
            "address": address,
            "version": __version__,
            "fingerprint": agent_fingerprint(),
            "ship": ship,
            "env": env,
            "idle_timeout": idle_timeout,
            "timeout": AGENT_START_TIMEOUT,
        }
        answer = await self.boot(request)
        if answer.get("need") == "ship":
            await self.ship_agent(answer["lib"], __version__)
            answer = await self.boot(request)
        if answer.get("need"):
            return {"need": answer["need"]}
        ready = answer["ready"]
        if answer.get("resumed"):
            return {**ready, "resumed": True, "shipped": None}
        if not ready.get("ready"):
            raise _start_failure(self.target.host, answer["address"], ready.get("error", ""), answer["log"], ray_token)
        return {**ready, "secret": request["secret"], "resumed": False, "shipped": answer.get("lib")}

    def ray_cli(self, arguments: str) -> str:
        """A ``ray`` command run by the head's chosen Python (its PATH may lack ``ray``)."""
        entry = "import sys; from ray.scripts.scripts import main; sys.argv[0] = 'ray'; main()"
        return f"{self.python} -c {shlex.quote(entry)} {arguments}"

    async def start_ray(self, arguments: str, env: dict[str, str], timeout: float = 180.0) -> Any:
        # Ray's log monitor looks for new workers' files every 0.1 s, not 0.5 s: a worker's first lines then reach
        # the cell that started the work before the cell ends (see agent/cells/_logs.py).
        env = {"LOG_NAME_UPDATE_INTERVAL_S": "0.1", **env}
        env_words = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
        return await self.run(f"{env_words} {self.ray_cli(arguments)}", timeout=timeout)

    async def stop_ray(self, *patterns: str) -> None:
        """Stop the processes whose command lines match any of ``patterns`` (``pkill -f``
        syntax), and their descendants (some of Ray's rename themselves): SIGTERM, then
        SIGKILL for what is left after 3 s (Ray's GCS and raylet often take over 10 s to
        heed SIGTERM; a cluster being torn down needs no orderly exit).

        The descendants are looked for again while the processes exit: Ray's dashboard
        restarts a module that died, and starts a new forkserver for it if the old one died
        too; that forkserver is then a child nothing matched, and outlives the dashboard
        until its imports end. Before SIGKILL everything left is stopped (SIGSTOP), so
        nothing forks between the last look and the kill, and the call returns once the killed are
        gone (up to 5 s more)."""
        q = shlex.quote("|".join(f"({p})" for p in patterns))
        await self.run(
            'tree() { n="$*"; while [ -n "$n" ]; do printf "%s\\n" $n; '
            "n=$(for p in $n; do pgrep -P $p; done); done; }; "
            f"all=$(tree $(pgrep -f {q}) | sort -un); "
            '[ -n "$all" ] || exit 0; kill -TERM $all 2>/dev/null; '
            "for i in $(seq 15); do sleep 0.2; alive=$(for p in $all; do kill -0 $p 2>/dev/null && echo $p; done); "
            '[ -z "$alive" ] && exit 0; all=$(tree $alive | sort -un); done; '
            "kill -STOP $all 2>/dev/null; all=$(tree $all | sort -un); kill -STOP $all 2>/dev/null; "
            "kill -KILL $all 2>/dev/null; "
            # SIGKILL is delivered, not done: a process in the kernel (disk I/O on a loaded host) dies a moment
            # later. Return once each is gone or a zombie its parent has yet to reap.
            "for i in $(seq 50); do alive=$(for p in $all; do s=$(sed 's/.*) //' /proc/$p/stat 2>/dev/null | "
            'cut -c1); [ -n "$s" ] && [ "$s" != Z ] && echo $p; done); [ -z "$alive" ] && break; sleep 0.1; done; '
            "true"
        )


class SSHTransport:
    """The agent's socket on the head, through SSH; reconnects SSH when it drops.

    A channel that cannot be opened while SSH itself works means the agent is gone
    only if its process is: a socket that does not answer for a while (the agent
    busy, a file system hiccup) is retried like any other outage.
    """

    def __init__(self, target: SSHTarget, socket_path: str, conn: Any = None) -> None:
        self.target = target
        self.socket_path = socket_path
        self.conn = conn
        #: The agent's process id on the head (from its welcome), to tell "gone" from "busy".
        self.agent_pid: int | None = None
        self._gone: str | None = None
        self._nodelay: asyncio.Future[None] | None = None

    async def connection(self) -> Any:
        if self.conn is None or self.conn.is_closed():
            self.conn = await open_ssh(self.target)
            # OpenSSH's sshd turns Nagle's algorithm off for a connection only once a
            # command runs on it; without that, an answer sshd relays in two reads can
            # wait a round trip. A no-op command does it, beside the socket's channel.
            self._nodelay = asyncio.ensure_future(self._run_quietly(self.conn, "true"))
        return self.conn

    @staticmethod
    async def _run_quietly(conn: Any, command: str) -> None:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(conn.run(command, check=False), 30)

    async def open(self) -> tuple[Any, Any]:
        import asyncssh

        conn = await self.connection()
        try:
            return await conn.open_unix_connection(self.socket_path)
        except asyncssh.ChannelOpenError as exc:
            crash = await RemoteHead(self.target, conn).agent_death(self.agent_pid, self.socket_path)
            if crash is not None:
                self._gone = f"the agent on {self.target.host} died: {how_it_ended(None, crash)} ({exc.reason})"
                raise ClusterConnectionError(self._gone) from None
            error = ClusterConnectionError(f"the agent's socket on {self.target.host} did not answer ({exc.reason})")
            error.carrier_ok = True  # type: ignore[attr-defined]  # SSH works: keep the connection
            raise error from None
        except asyncssh.Error as exc:  # the connection died under us: start afresh next time
            self.discard()
            raise ClusterConnectionError(f"the SSH connection to {self.target.host} failed ({exc.reason})") from None

    def lost_reason(self) -> str | None:
        return self._gone

    def discard(self) -> None:
        if self.conn is not None:
            self.conn.abort()
            self.conn = None

    def describe(self) -> str:
        return self.target.describe()

    def resume_hint(self, session: str) -> str:
        words = ["%cluster connect", self.target.describe(), "--session", session]
        if self.target.identity:
            words += ["--identity", shlex.quote(self.target.identity)]
        if self.target.known_hosts:
            words += ["--known-hosts", shlex.quote(self.target.known_hosts)]
        if self.target.python != "python3":
            words += ["--python", shlex.quote(self.target.python)]
        return " ".join(words)
