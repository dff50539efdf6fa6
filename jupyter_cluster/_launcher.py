"""Ray's own cluster launcher behind ``jc.up(config=...)`` and ``%cluster up --config``.

``ray up`` runs on this machine as a subprocess (the kernel never imports Ray), with
the cluster YAML the user would give it; then the notebook attaches to the head it
started (``ray get-head-ip``) with :func:`._connect.connect`, as the YAML's
``auth.ssh_user`` with its ``auth.ssh_private_key``. ``Cluster.down`` runs
``ray down``. What Ray validates (providers, the schema) stays Ray's: its error comes
back trimmed to the lines that say what went wrong.
"""

from __future__ import annotations

import concurrent.futures
import functools
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ._errors import ClusterConnectionError, ClusterError

if TYPE_CHECKING:
    from ._cluster import Cluster

#: How the launcher attaches to a head: :func:`._connect.connect`.
Connect = Callable[..., "Cluster"]

#: Seconds ``ray down`` may take in all; and without a step forward (a line of output it has not said before: its
#: teardown loop says "2 nodes remaining" over again while nodes do not go), after which it is stopped and the
#: nodes it could not stop are named.
DOWN_TIMEOUT = 600.0
DOWN_STALL = 20.0
#: How long naming the nodes a stopped ``ray down`` left may take (two Ray CLI starts, at once).
NODES_LEFT_TIMEOUT = 12.0
#: Seconds ``ray get-head-ip`` and ``ray get-worker-ips`` may take (``ray up`` runs until done or interrupted).
HEAD_IP_TIMEOUT = 120.0
#: The longest error message made from Ray's output.
MESSAGE_CHARS = 1200

_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b[()][A-Z0-9]")
#: Ray's log prefix: ``2026-11-24 18:10:34,195<TAB>ERR updater.py:177 -- ``.
_PREFIX = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+\s+([A-Z]+)\s+\S+:\d+ -- ")
_NOISE = re.compile(
    r"^(Shared connection to \S+ closed\.|Warning: Permanently added .*|!!!|Full traceback:.*|"
    r"Exception details:.*|Traceback \(most recent call last\):|\s*\^+\s*)$"
)
_FAILED = re.compile(r"error|fail|panic|exception|denied|refused|no such|not found|cannot|unable", re.IGNORECASE)
_STEP = re.compile(r"^\[\d+/\d+\] ")
_FRAME = re.compile(r'^\s+File "([^"]+)", line (\d+)')
_ERROR_LEVELS = ("ERR", "ERROR", "PANIC", "CRITICAL")
#: What ``ray down`` logs when its ``ray stop`` on the head failed (it then goes on, and may exit 0).
_STOP_FAILED = "Exception occurred when stopping the cluster Ray runtime"
_NO_HEAD = re.compile(r"Head node of cluster .* not found")


class LauncherError(ClusterError):
    """Ray's cluster launcher (``ray up``, ``ray down``) failed, or is not installed here."""


class LauncherConfigError(LauncherError, ValueError):
    """The cluster YAML cannot be used: missing, not a mapping, no ``auth.ssh_user``, no key file."""


@dataclass(frozen=True)
class LaunchConfig:
    """What this package reads in a cluster YAML; Ray reads the rest."""

    #: The YAML's absolute path (``ray down`` needs it, from any working directory).
    path: str
    ssh_user: str
    #: ``auth.ssh_private_key``, expanded; None: ssh-agent and the user's own keys.
    ssh_private_key: str | None
    provider: str | None
    #: Where ``ray up`` ran: ``ray down`` runs there too (Ray reads relative paths in the YAML from there).
    cwd: str


def read_config(config: str | os.PathLike[str]) -> LaunchConfig:
    """Read and check the cluster YAML ``config`` before anything starts.

    Raises :class:`LauncherConfigError` when the file is missing or unreadable, is not
    a YAML mapping, lacks ``auth.ssh_user``, or names an ``auth.ssh_private_key`` that
    does not exist.
    """
    path = os.path.abspath(os.path.expanduser(os.fspath(config)))
    try:
        import yaml
    except ImportError:
        raise LauncherError(
            'reading a cluster YAML needs PyYAML, which comes with Ray: pip install "ray[default]" here'
        ) from None
    try:
        with open(path) as f:
            data = yaml.safe_load(f)
    except FileNotFoundError:
        raise LauncherConfigError(f"cluster config {path}: no such file") from None
    except OSError as exc:
        raise LauncherConfigError(f"cluster config {path}: cannot read it ({exc.strerror})") from None
    except yaml.YAMLError as exc:
        raise LauncherConfigError(f"cluster config {path} is not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        found = "an empty file" if data is None else f"a {type(data).__name__}"
        raise LauncherConfigError(
            f"cluster config {path}: expected a mapping of Ray cluster launcher fields "
            f"(cluster_name, provider, auth, ...), found {found}"
        )
    auth: dict[str, Any] = data["auth"] if isinstance(data.get("auth"), dict) else {}
    user = auth.get("ssh_user")
    if not isinstance(user, str) or not user.strip():
        raise LauncherConfigError(
            f"cluster config {path}: auth.ssh_user is missing. Ray's launcher and the notebook log in to the "
            "head as that user: add `auth: {ssh_user: USER}`."
        )
    key = auth.get("ssh_private_key")
    if key is not None:
        key = os.path.expanduser(str(key))
        if not os.path.isabs(key):  # Ray reads it relative to where `ray up` runs; so do we
            key = os.path.abspath(key)
        if not os.path.isfile(key):
            raise LauncherConfigError(
                f"cluster config {path}: auth.ssh_private_key is {auth['ssh_private_key']!r}, and there is no "
                f"such file ({key}). Fix the path, or leave the key out to use ssh-agent and your ~/.ssh keys."
            )
    provider = data.get("provider")
    kind = provider.get("type") if isinstance(provider, dict) else None
    return LaunchConfig(path, user.strip(), key, kind if isinstance(kind, str) else None, os.getcwd())


def ray_executable() -> str:
    """The ``ray`` command: beside this kernel's Python first, else on PATH."""
    beside = os.path.join(os.path.dirname(sys.executable), "ray")
    if os.path.isfile(beside) and os.access(beside, os.X_OK):
        return beside
    found = shutil.which("ray")
    if found is None:
        raise LauncherError(
            f"Ray's cluster launcher (`ray up`) runs on this machine, and there is no `ray` command here (none "
            f'beside {sys.executable}, none on PATH): pip install "ray[default]" in this kernel\'s environment'
        )
    return found


def launcher_env(config: LaunchConfig) -> dict[str, str]:
    """The environment ``ray up`` and ``ray down`` run with.

    Ray 2.60's autoscaler v2 (``ray up``'s default) never starts the workers of a
    ``local`` provider: the head has the same node type as they do and counts towards
    their ``min_workers``. For that provider the launcher runs with
    ``RAY_UP_enable_autoscaler_v2=0`` (v1, which starts them) unless it is set here.
    """
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    if config.provider == "local":
        env.setdefault("RAY_UP_enable_autoscaler_v2", "0")
    return env


def plain_lines(lines: list[str]) -> list[tuple[str, str]]:
    """Ray's output as ``(level, text)``: colour codes, log prefixes, noise and
    traceback frames gone (a traceback leaves its exception's line); ``level`` is Ray's
    (``INFO``, ``ERR``, ``PANIC``...), or ``""`` for what a command printed itself.

    >>> plain_lines(["2026-01-02 03:04:05,678\tPANIC commands.py:308 -- \x1b[1mUnknown provider\x1b[0m"])
    [('PANIC', 'Unknown provider')]
    >>> plain_lines(["Traceback (most recent call last):", '  File "x.py", line 1, in f', "    f()", "KeyError: 'x'"])
    [('', "KeyError: 'x'"), ('', '(raised at x.py:1: f())')]
    """
    kept: list[tuple[str, str]] = []
    frame: list[str] | None = None  # in a traceback: its last frame, and that frame's code
    detail = False  # after a traceback: the rest of its exception's message (a schema dump, say)
    for raw in lines:
        line = _ANSI.sub("", raw).rstrip()
        if line.endswith("Traceback (most recent call last):"):
            frame, detail = [], False
            continue
        if detail and not _PREFIX.match(line):
            continue
        detail = False
        if frame is not None:
            match = _FRAME.match(line)
            if match:
                frame = [f"{match.group(1).rsplit('site-packages/', 1)[-1]}:{match.group(2)}"]
            elif line.strip() and not set(line.strip()) <= set("^~") and len(frame) == 1:
                frame.append(line.strip())
            if line.startswith(" ") or not line:
                continue
            kept.append(("", line.strip()))  # the exception's own line ends it
            if len(frame) == 2 and not frame[1].startswith("raise "):
                kept.append(("", f"(raised at {frame[0]}: {frame[1]})"))
            frame, detail = None, True
            continue
        level = ""
        match = _PREFIX.match(line)
        if match:
            level, line = match.group(1), line[match.end() :]
        line = line.strip()
        if line and not level.startswith("VV") and not _NOISE.match(line):  # VV: Ray's full ssh command lines
            kept.append((level, line))
    return kept


def trimmed(lines: list[str], chars: int = MESSAGE_CHARS) -> str:
    """The lines of Ray's output that say what failed: from the last step Ray began
    (``[7/7] Starting the Ray runtime``), the ones Ray logged as errors or that name
    one, and what commands printed themselves; else its last lines. At most ``chars``.

    >>> print(trimmed(["[7/7] Starting the Ray runtime", "2026-01-02 03:04:05,678\tINFO x.py:1 -- fine",
    ...                "bash: /no/ray: No such file or directory", "Error: Failed to setup head node."]))
    [7/7] Starting the Ray runtime
    bash: /no/ray: No such file or directory
    Error: Failed to setup head node.
    """
    plain = plain_lines(lines)
    steps = [i for i, (_, text) in enumerate(plain) if _STEP.match(text)]
    start = steps[-1] if steps else 0
    picked: list[str] = [plain[start][1]] if steps else []
    seen = {text.removeprefix("Error: ") for text in picked}
    for level, text in plain[start + 1 if steps else 0 :]:
        wanted = level in _ERROR_LEVELS or not level or _FAILED.search(text)
        if wanted and text.removeprefix("Error: ") not in seen:
            picked.append(text)
            seen.add(text.removeprefix("Error: "))
    if len(picked) <= len(steps[-1:]):
        picked = [text for _, text in plain[-8:]]
    text = "\n".join(picked)
    if len(text) > chars:
        text = "…" + text[-chars:].split("\n", 1)[-1]
    return text


@dataclass
class _Run:
    """How one launcher command ended: its exit status and output lines, and why it was stopped, if it was."""

    code: int
    lines: list[str]
    stopped: str | None = None


def _stream(
    argv: list[str], config: LaunchConfig, *, echo: bool, timeout: float | None = None, stall: float | None = None
) -> _Run:
    """Run ``argv``; return how it ended, with its output lines (stdout and stderr), echoed
    here as they come when ``echo``. Interrupting stops it; so does ``timeout`` (seconds in
    all), and ``stall``: seconds without a step forward (a line not said before: Ray's
    teardown loop, waiting on nodes that do not go, says the same lines over again)."""
    proc = subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        errors="replace",
        env=launcher_env(config),
        cwd=config.cwd,
    )
    started = last_step = time.monotonic()
    stopped: list[str] = []
    done = threading.Event()

    def watch() -> None:  # a thread of its own: the reading below blocks on the pipe
        while not done.wait(0.5):
            now = time.monotonic()
            if timeout is not None and now - started > timeout:
                stopped.append(f"no end after {timeout:.0f} s")
            elif stall is not None and now - last_step > stall:
                stopped.append(f"no step forward in {stall:.0f} s")
            else:
                continue
            proc.kill()
            return

    watcher = threading.Thread(target=watch, name="jupyter_cluster-launcher-watch", daemon=True)
    watcher.start()
    lines: list[str] = []
    seen: set[str] = set()  # each line as said before, less its time stamp: a loop repeats them
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line.rstrip("\n"))
            said = _PREFIX.sub("", _ANSI.sub("", line)).strip()
            if said not in seen:
                seen.add(said)
                last_step = time.monotonic()
            if echo:
                sys.stdout.write(line)
                sys.stdout.flush()
        code = proc.wait()
    except BaseException:  # an interrupted kernel: stop the launcher too
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
        raise
    finally:
        done.set()
    return _Run(code, lines, stopped[0] if stopped else None)


def ray_up(config: LaunchConfig, ray: str) -> None:
    """``ray up -y --no-config-cache`` the YAML; its output is echoed as it comes."""
    run = _stream([ray, "up", "-y", "--no-config-cache", config.path], config, echo=True)
    if run.code != 0:
        raise LauncherError(f"`ray up {config.path}` failed (exit status {run.code}):\n{trimmed(run.lines)}")


def _ask(
    config: LaunchConfig, ray: str, command: str, timeout: float | None = None
) -> subprocess.CompletedProcess[str]:
    """Run ``ray COMMAND`` on the YAML here (a question to the launcher, answered from its state or the cloud)."""
    timeout = HEAD_IP_TIMEOUT if timeout is None else timeout
    try:
        return subprocess.run(
            [ray, command, config.path],
            capture_output=True,
            text=True,
            errors="replace",
            env=launcher_env(config),
            cwd=config.cwd,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired:
        raise LauncherError(f"`ray {command} {config.path}` gave no answer in {timeout:.0f} s") from None


def head_ip(config: LaunchConfig, ray: str) -> str:
    """The head's address as Ray's launcher knows it (``ray get-head-ip``)."""
    done = _ask(config, ray, "get-head-ip")
    answer = done.stdout.strip().splitlines()
    address = answer[-1].strip() if answer else ""
    if done.returncode != 0 or not address or " " in address:
        output = (done.stdout + "\n" + done.stderr).splitlines()
        raise LauncherError(f"`ray get-head-ip {config.path}` found no head:\n{trimmed(output)}")
    return address


def _nodes_left(config: LaunchConfig, ray: str) -> list[str]:
    """The nodes Ray's launcher still counts as up (``ray get-head-ip``, ``ray get-worker-ips``), named for a
    message; empty when it says none or cannot tell."""

    def ask(command: str, kind: str) -> list[str]:
        try:
            done = _ask(config, ray, command, NODES_LEFT_TIMEOUT)
        except LauncherError:  # no answer soon: the message says "every node" instead
            return []
        if done.returncode != 0:
            return []
        return [f"{kind} {line.strip()}" for line in done.stdout.splitlines() if re.fullmatch(r"[\w.:-]+", line)]

    # Both at once: each is a Ray CLI start (seconds), and this runs when a `ray down` has already taken long.
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        head, workers = pool.map(ask, ("get-head-ip", "get-worker-ips"), ("head", "worker"))
    return head + workers


def _stop_failure(lines: list[str]) -> str | None:
    """Why ``ray down``'s own ``ray stop`` on the head failed, from its output (what the shell said just before
    Ray's warning), or None when it did not fail."""
    plain = [text for _, text in plain_lines(lines)]
    for i, text in enumerate(plain):
        if text.startswith(_STOP_FAILED):
            said = [t for t in plain[max(0, i - 4) : i] if _FAILED.search(t) and not t.startswith("Ignoring")]
            if said and _NO_HEAD.search(said[-1]):
                return None  # the launcher knows no running head: there was no `ray stop` to run
            return said[-1] if said else "(Ray's launcher gave no reason)"
    return None


def ray_down(config: LaunchConfig, ray: str, head: str | None = None) -> None:
    """``ray down -y`` the YAML (``Cluster.down`` runs it); its output is echoed as it comes.

    It never waits in silence: stopped once it goes :data:`DOWN_STALL` seconds without a
    step forward (Ray's teardown loop waiting on nodes that do not go), with an error
    naming the nodes left and what to run. A ``ray stop`` on the head that failed (Ray
    only warns, and goes on) is an error too: Ray may still run there. ``head``: the
    head's ``user@host``, for the ``ssh`` line of the message.
    """
    run = _stream([ray, "down", "-y", config.path], config, echo=True, timeout=DOWN_TIMEOUT, stall=DOWN_STALL)
    stop_failed = _stop_failure(run.lines)
    login = head or "USER@HEAD"
    again = f"ray down -y {config.path}"
    if run.stopped is not None:
        left = _nodes_left(config, ray)
        raise LauncherError(
            f"`ray down {config.path}` was stopped ({run.stopped}): it could not shut down "
            f"{', '.join(left) if left else 'every node'}."
            + (f" Its `ray stop` on the head failed: {stop_failed}." if stop_failed else "")
            + f" The cluster may be half-stopped: run `ray stop` on each node named (`ssh {login} ray stop` for the "
            f"head), then `{again}` here. Ray's last lines:\n{trimmed(run.lines)}"
        )
    if run.code != 0:
        raise LauncherError(f"`ray down {config.path}` failed (exit status {run.code}):\n{trimmed(run.lines)}")
    if stop_failed is not None:
        raise LauncherError(
            f"`ray down {config.path}` marked the nodes down, but its `ray stop` on the head failed ({stop_failed}): "
            f"Ray may still run there. Run it yourself: `ssh {login} ray stop` (Ray's launcher runs it in the head's "
            "login shell, `bash --login -i`, where `ray` must be on PATH)."
        )


def _found_running(conf: LaunchConfig, ray: str, connect: Connect, attach: dict[str, Any]) -> Cluster | None:
    """Attach to the head of ``conf`` if Ray runs there; None when the launcher knows no head, or when it answers
    and runs no Ray, or cannot be reached (``ray up`` then has a cluster to start). A head that refuses the login
    or whose host key is unknown is an error: ``ray up`` would start or restart it blind."""
    from ._ssh import HostKeyError, NoRayError, SSHAuthError

    try:
        address = head_ip(conf, ray)
    except LauncherError:
        return None
    target = f"{conf.ssh_user}@{address}"
    try:
        return connect(target, **attach)
    except NoRayError:
        return None
    except (HostKeyError, SSHAuthError) as exc:
        raise LauncherError(
            f"the head of {conf.path}, {target}, may already run Ray, and it could not be checked: {exc}\n"
            f"Nothing was started or restarted. Fix that and run this again."
        ) from exc
    except ClusterConnectionError as exc:
        if isinstance(exc, LauncherError) or "cannot reach" not in str(exc):
            raise
        return None


def _attach(conf: LaunchConfig, ray: str, connect: Connect, attach: dict[str, Any], *, started: bool) -> Cluster:
    address = head_ip(conf, ray)
    target = f"{conf.ssh_user}@{address}"
    try:
        cluster = connect(target, **attach)
    except ClusterError as exc:
        if started:
            raise LauncherError(
                f"Ray's cluster launcher started the cluster of {conf.path}, and attaching to its head {target} "
                f"failed: {exc}\nThe cluster keeps running: attach again once that is fixed "
                f"(jc.connect(config={conf.path!r}, ...)), or stop it: ray down -y {conf.path}"
            ) from exc
        raise LauncherError(f"attaching to the head of {conf.path}, {target}, failed: {exc}") from exc
    return cluster


def _options(attach: dict[str, Any], conf: LaunchConfig) -> dict[str, Any]:
    if attach.get("keepalive", 0) < 0 or attach.get("reconnect_for", 0) < 0:
        raise ValueError("keepalive and reconnect_for are seconds, not negative")
    if attach.get("identity") is None:
        attach = {**attach, "identity": conf.ssh_private_key}
    return attach


def attach_config(config: str | os.PathLike[str], connect: Connect, **attach: Any) -> Cluster:
    """Attach to the running cluster of the cluster YAML ``config``: its head from ``ray get-head-ip``, as the
    YAML's ``auth.ssh_user`` with its key; no ``ray up`` (see :func:`._connect.connect`). ``down`` detaches and
    leaves the cluster up. ``connect``: :func:`._connect.connect`, which calls this (passed in: the launcher sits
    below the API that uses it)."""
    from ._ssh import NoRayError

    conf = read_config(config)
    ray = ray_executable()
    options = _options(attach, conf)
    try:
        cluster = _attach(conf, ray, connect, options, started=False)
    except LauncherError as exc:
        if isinstance(exc.__cause__, NoRayError):
            raise LauncherError(
                f"no Ray runs on the head of {conf.path} ({exc.__cause__}): start the cluster with "
                f"`%cluster up --config {conf.path}` (jc.up(config=...))"
            ) from exc.__cause__
        raise
    cluster.launcher, cluster.launched_here = conf.path, False
    return cluster


def launch(config: str | os.PathLike[str], connect: Connect, *, restart: bool = False, **attach: Any) -> Cluster:
    """``ray up`` the cluster YAML ``config`` here, then attach to its head (see :func:`._connect.up`).

    A cluster whose head already runs Ray is attached to as it is, without ``ray up``
    (which would restart Ray on every node and stop everything running there), and this
    is said; ``restart`` runs ``ray up`` anyway, saying what that stops.

    ``connect``: :func:`._connect.connect`; ``attach``: its options (``identity`` defaults
    to the YAML's ``auth.ssh_private_key``).
    """
    conf = read_config(config)
    ray = ray_executable()
    options = _options(attach, conf)
    if not restart:
        found = _found_running(conf, ray, connect, options)
        if found is not None:
            print(
                f"Ray already runs on the head of {conf.path} ({found.kind.removeprefix('ssh ')}): attached to it as "
                "it is, without `ray up`, which would restart Ray on every node and stop the jobs, actors, Serve "
                f"applications and Tune runs on it. To restart it: %cluster up --config {conf.path} --restart",
                file=sys.stderr,
            )
            found.launcher, found.launched_here = conf.path, False
            return found
    else:
        print(
            f"Restarting the cluster of {conf.path}: `ray up` restarts Ray on every node, which stops every job, "
            "actor, Serve application and Tune run on it, and every other notebook's cells there.",
            file=sys.stderr,
        )
    ray_up(conf, ray)
    cluster = _attach(conf, ray, connect, options, started=True)
    cluster.launcher = conf.path
    cluster.stoppers.append(functools.partial(ray_down, conf, ray, cluster.kind.removeprefix("ssh ")))
    return cluster


__all__ = ["LaunchConfig", "LauncherConfigError", "LauncherError", "attach_config", "launch", "read_config"]
