"""Round trips over a slow link: cells over SSH side by side with Ray Client, through the same delay.

A real ``sshd`` on loopback (the test suite's helper, generated keys) is reached through
:class:`_delay.DelayProxy`, a userspace TCP proxy that delivers every chunk ``--delay`` seconds
late in each direction (25 ms: a 50 ms round trip, ``rtt``); Ray Client reaches the client
server that ``ray start --head`` runs at 10001 through a second proxy with the same delay.
``jc.connect(..., start_head=True)`` through the proxy starts Ray and the benchmark's agent
(timed, but that is Ray's own start). Then, in one run:

- **connect**: a second ``jc.connect`` that attaches to the running Ray and starts an agent of
  its own session, ``--connects`` times with the delay and as many without (alternating). The
  agent's own start is measured on the head from two files the connect writes: the session's
  ``secret`` is written just before the agent is launched and ``ready.json`` when it serves, so
  ``mtime(ready.json) - mtime(secret)`` is the agent's start (Python, Ray import, ``ray.init``).
  Round trips = ``(median(connect - agent start) delayed - the same undelayed) / rtt``:
  what the protocol costs beyond the agent's start, CPU time cancelling out. The connect is
  also timed step by step (while it connects, the benchmark wraps ``open_ssh``,
  ``RemoteHead.boot``, ``ship_agent`` and the link's handshake, and counts remote commands;
  nothing in the package is changed, and a step it no longer has is skipped).
- **resume**: after ``cluster._link.drop_connection()`` (the SSH channel aborted, the SSH
  connection kept), the time until ``cluster._link.call("ping", {"data": 1})`` answers; the same
  after :meth:`DelayProxy.reset` (the TCP connection reset under SSH: a new SSH connection);
  ``cluster.disconnect()`` (what ``%cluster disconnect`` runs) then the time for
  ``jc.connect(..., session=cluster.session)`` to return; and that resume from another process
  (a fresh Python running ``jc.connect(..., session=...)``, timed inside it: a new SSH
  connection, one exec that finds the session's agent, the handshake; then whether the new
  kernel's first request is answered). Round trips = ``(delayed - undelayed) / rtt``.
- **cells and calls** (before the resumes, on the connection ``jc.connect`` opened),
  ``--rounds`` each after a warm-up, delayed then undelayed: a task cell
  ``z = 1``, the same in actor ``bench`` and in the driver, ``cluster.put(1)`` and
  ``cluster.get(handle)``, and a task cell ``y = x.sum()`` reading a fresh 1 MiB numpy array
  (new content each round, so it is sent); against Ray Client's ``ray.get(f.remote())``,
  ``ray.get(actor.m.remote())``, ``ray.put(1)`` / ``ray.get(ref)`` and a task with the 1 MiB
  array as its argument, in a separate process (the benchmark's process holds
  ``jupyter_cluster``; as ``bench_ssh.py`` does, Ray Client runs in a fresh Python with Ray's
  token in its environment). Round trips = median time / rtt (the undelayed column shows the
  part that is not the network).
- **calibration**: the task and 1 MiB cells through a session straight to sshd, no proxy (the
  proxy runs in this process, so its own work shows in the undelayed column).

The proxy terminates TCP, so opening a TCP connection costs nothing here; on a real link each
new TCP connection adds one round trip (to the SSH connect and reconnect, and to Ray Client's
connect alike). It also acknowledges at once, on loopback, which hides Nagle's algorithm. sshd
sets ``TCP_NODELAY`` on a connection only when it runs a command there: ``jc.connect``'s boot
exec does, but a connection the link opens after a drop carries only the socket forward, so
sshd keeps Nagle on for it, and on a real link an answer that leaves sshd in two pieces (or just
after a window adjust) waits a round trip for the earlier piece's ACK. ``--nagle`` models that
(:attr:`DelayProxy.nagle`, a lower bound: the receiver's delayed ACK adds more) on every new
connection until the benchmark's own ``jc.connect`` returns, and for good on those the link
reopens (the resume rows, and three more rows measured after the resets); the resume from
another process is modelled with Nagle throughout, which overstates it a little. Ray Client's
gRPC sets ``TCP_NODELAY`` on both ends.

Run: ``python benchmarks/bench_link.py [--rounds 15] [--delay 0.025] [--connects 5] [--nagle]``
(root, ``openssh-server``, Ray with the client extra, no other Ray running on the machine: the
head's connect would join it). Every sample goes to stderr as JSON.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]

from _delay import DelayProxy  # noqa: E402

from tests.sshd import SSHKeys, SSHServer, free_port  # noqa: E402

MiB = 1 << 20
RAY_CLIENT_PORT = 10001

#: Ray Client in a fresh process: ``ray.init("ray://...")``, then ``rounds`` timed calls of each
#: kind after ``warmup``; prints JSON (seconds per call, lists).
CLIENT = r"""
import json, sys, time
import numpy as np
import ray

address, rounds, warmup = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
t = time.perf_counter()
ray.init(address=address, log_to_driver=False)
out = {"connect": [time.perf_counter() - t]}


@ray.remote
def f():
    return 1


@ray.remote
def total(x):
    return int(x.sum())


@ray.remote
class Bench:
    def m(self):
        return 1


actor = Bench.remote()
rng = np.random.default_rng(0)


def timed(name, prepare, call, check=None):
    samples = []
    for i in range(warmup + rounds):
        arg = prepare()
        t = time.perf_counter()
        value = call(arg)
        if i >= warmup:
            samples.append(time.perf_counter() - t)
        if check is not None:
            assert check(arg, value), (name, value)
    out[name] = samples


timed("task", lambda: None, lambda _: ray.get(f.remote()))
timed("actor", lambda: None, lambda _: ray.get(actor.m.remote()))
timed("put", lambda: None, lambda _: ray.put(1))
timed("get", lambda: ray.put(1), ray.get, lambda _, v: v == 1)
timed(
    "array",
    lambda: rng.integers(0, 255, 1 << 20, dtype=np.uint8),
    lambda x: ray.get(total.remote(x)),
    lambda x, v: v == int(x.sum()),
)
ray.shutdown()
print(json.dumps(out))
"""

#: Resume a session from a fresh process (as a new kernel would), timed inside it; prints JSON.
RESUME = r"""
import json, sys, time
import jupyter_cluster as jc

target, identity, known_hosts, session = sys.argv[1:5]
t = time.perf_counter()
cluster = jc.connect(target, identity=identity, known_hosts=known_hosts, session=session)
out = {"resume": time.perf_counter() - t}
try:  # does a request of this new kernel get an answer?
    out["ping"] = cluster._link.call("ping", {"data": 1}, timeout=float(sys.argv[5])) == 1
except TimeoutError:
    out["ping"] = False
cluster.disconnect()
time.sleep(0.1)  # let the detach leave before the process ends
print(json.dumps(out))
"""


def run_json(argv: list[str], env: dict[str, str] | None = None, timeout: float = 300) -> dict[str, Any]:
    """Run a Python snippet's argv; the JSON it printed last."""
    done = subprocess.run(
        [sys.executable, *argv], capture_output=True, text=True, env={**os.environ, **(env or {})}, timeout=timeout
    )
    if done.returncode:
        raise RuntimeError(f"{argv[1][:40]!r}... failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def running_rays() -> list[str]:
    """GCS addresses of Ray clusters running on this machine, as the agent's boot script finds
    them (``connect --start-head`` joins one of those rather than starting its own)."""
    from jupyter_cluster.agent import _boot

    return list(_boot.probe()["ray_addresses"])


def port_free(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0


# --------------------------------------------------------------------------- connect, phase by phase


@contextlib.contextmanager
def phases(sink: dict[str, float]) -> Iterator[None]:
    """Time the steps of ``jc.connect`` (seconds, summed per step) and count its remote commands,
    by wrapping them while the block runs; steps the package no longer has are skipped."""
    from jupyter_cluster import _connect, _link, _ssh

    undo: list[tuple[Any, str, Any]] = []

    def wrap(owner: Any, name: str, key: str, count: bool = False) -> None:
        original = getattr(owner, name, None)
        if original is None:
            return

        async def wrapper(*args: Any, **kwargs: Any) -> Any:
            t = time.perf_counter()
            try:
                return await original(*args, **kwargs)
            finally:
                sink[key] = sink.get(key, 0.0) + (1 if count else time.perf_counter() - t)

        undo.append((owner, name, original))
        setattr(owner, name, wrapper)

    wrap(_connect, "open_ssh", "ssh connection")
    wrap(_ssh.RemoteHead, "boot", "boot exec")  # probe, find or start the agent, wait: on the head
    wrap(_ssh.RemoteHead, "ship_agent", "ship agent")
    wrap(_link.AgentLink, "_connect", "handshake")
    wrap(_connect, "_forward_dashboard", "dashboard forward")
    wrap(_ssh.RemoteHead, "run", "commands", count=True)
    try:
        yield
    finally:
        for owner, name, original in reversed(undo):
            setattr(owner, name, original)


def session_folder(cluster: Any) -> Path:
    """The session's folder on the head (this machine)."""
    return Path(cluster.head["home"]) / ".jupyter_cluster" / "sessions" / cluster.session


def agent_start(cluster: Any) -> float:
    """The agent's own start: ``secret`` is written just before it is launched, ``ready.json`` once it serves."""
    folder = session_folder(cluster)
    return (folder / "ready.json").stat().st_mtime - (folder / "secret").stat().st_mtime


def down(cluster: Any, keep_ray: bool = False) -> None:
    """Stop the cluster's agent (and, unless ``keep_ray``, the Ray it started); remove its session folder."""
    if keep_ray:
        cluster.stoppers.clear()  # a connect given ``_started`` would stop the head's Ray
        cluster.started = None
    try:
        cluster.down()
    finally:
        shutil.rmtree(session_folder(cluster), ignore_errors=True)


def connect_once(target: str, opts: dict[str, Any], started: Any, proxy: DelayProxy) -> dict[str, float]:
    """One ``jc.connect`` to the running head (a new session and agent): total, agent start, phases."""
    import jupyter_cluster as jc

    sink: dict[str, float] = {}
    extra = {"_started": started} if started is not None else {}
    with phases(sink):
        t = time.perf_counter()
        cluster = jc.connect(target, **opts, **extra)
        total = time.perf_counter() - t
    proxy.nodelay()  # its boot exec made sshd set TCP_NODELAY on the connection
    try:
        assert cluster._link.call("ping", {"data": 1}) == 1
        sink.update(total=total, agent=agent_start(cluster))
    finally:
        down(cluster, keep_ray=True)
    return sink


# --------------------------------------------------------------------------- resume


def settle(cluster: Any) -> None:
    """Let acknowledgements and releases of the last step leave."""
    assert cluster._link.call("ping", {"data": 0}, timeout=60) == 0
    time.sleep(0.15)


#: Reconnect attempts the link needed, per resume after a drop or reset (1: the first worked).
ATTEMPTS: list[int] = []


def resume_after_drop(cluster: Any) -> float:
    settle(cluster)
    t = time.perf_counter()
    cluster._link.drop_connection()
    assert cluster._link.call("ping", {"data": 1}, timeout=60) == 1
    took = time.perf_counter() - t
    ATTEMPTS.append(int(getattr(cluster._link, "attempts", 0)))
    return took


def resume_after_reset(cluster: Any, proxy: DelayProxy) -> float:
    settle(cluster)
    t = time.perf_counter()
    proxy.reset()
    assert cluster._link.call("ping", {"data": 1}, timeout=60) == 1
    took = time.perf_counter() - t
    ATTEMPTS.append(int(getattr(cluster._link, "attempts", 0)))
    return took


def resume_after_disconnect(cluster: Any, target: str, opts: dict[str, Any]) -> float:
    import jupyter_cluster as jc

    settle(cluster)
    cluster.disconnect()
    t = time.perf_counter()
    again = jc.connect(target, **opts, session=cluster.session)
    took = time.perf_counter() - t
    assert again is cluster
    return took


def resume_elsewhere(cluster: Any, target: str, opts: dict[str, Any]) -> dict[str, Any]:
    """Detach, resume from a fresh process (timed there; whether its first request is answered
    within 5 s), then come back here."""
    import jupyter_cluster as jc

    settle(cluster)
    cluster.disconnect()
    try:
        argv = ["-c", RESUME, target, opts["identity"], opts["known_hosts"], cluster.session, "5"]
        return run_json(argv, timeout=120)
    finally:
        assert jc.connect(target, **opts, session=cluster.session) is cluster


# --------------------------------------------------------------------------- cells


def cell_measures(cluster: Any) -> dict[str, Callable[[], float]]:
    """Each returns the seconds of one round (preparation untimed)."""
    import numpy as np

    rng = np.random.default_rng(0)

    def run(source: str, **kwargs: Any) -> Callable[[], float]:
        def once() -> float:
            t = time.perf_counter()
            cluster.run_cell(source, **kwargs).result()
            return time.perf_counter() - t

        return once

    def put() -> float:
        t = time.perf_counter()
        cluster.put(1)
        return time.perf_counter() - t

    def get() -> float:
        handle = cluster.put(1)
        t = time.perf_counter()
        value = cluster.get(handle)
        took = time.perf_counter() - t
        assert value == 1
        return took

    def array() -> float:
        x = rng.integers(0, 255, MiB, dtype=np.uint8)  # new content: the agent has not seen it
        t = time.perf_counter()
        result = cluster.run_cell("y = x.sum()", namespace={"x": x}).result()
        took = time.perf_counter() - t
        assert result.outputs["y"] == x.sum()
        return took

    return {
        "task": run("z = 1"),
        "actor": run("z = 1", mode="actor", actor="bench"),
        "driver": run("z = 1", mode="driver"),
        "put": put,
        "get": get,
        "array": array,
    }


def direct(server: SSHServer, started: Any, rounds: int, warmup: int) -> dict[str, list[float]]:
    """The task and 1 MiB cells through a session straight to sshd (no proxy): how much of the
    undelayed column is the proxy's own work, done in this process."""
    import jupyter_cluster as jc

    extra = {"_started": started} if started is not None else {}
    target = f"{server.user}@{server.host}:{server.port}"
    cluster = jc.connect(target, identity=str(server.identity), known_hosts=str(server.known_hosts), **extra)
    try:
        out: dict[str, list[float]] = {}
        measures = cell_measures(cluster)
        for key in ("task", "array"):
            for _ in range(warmup):
                measures[key]()
            out[key] = [measures[key]() for _ in range(rounds)]
        return out
    finally:
        down(cluster, keep_ray=True)


# --------------------------------------------------------------------------- report


def med(values: list[float] | None) -> float | None:
    return statistics.median(values) if values else None


ROWS = [
    ("connect", "connect (attach; new agent)", "ray.init('ray://')"),
    ("drop", "resume: channel dropped", ""),
    ("reset", "resume: TCP reset, new SSH conn.", ""),
    ("disconnect", "resume: disconnect + connect", ""),
    ("elsewhere", "resume from another process", ""),
    ("task", "task cell z = 1", "ray.get(f.remote())"),
    ("actor", "actor cell", "ray.get(a.m.remote())"),
    ("driver", "driver cell", ""),
    ("put", "cluster.put(1)", "ray.put(1)"),
    ("get", "cluster.get(handle)", "ray.get(ref)"),
    ("array", "task cell, 1 MiB array input", "task with 1 MiB array arg"),
    ("task after reset", "task cell, after a reset (Nagle)", ""),
    ("get after reset", "cluster.get, after a reset (Nagle)", ""),
    ("array after reset", "1 MiB cell, after a reset (Nagle)", ""),
]
#: Rows whose round trips are (delayed - undelayed) / rtt; the others are time / rtt.
DIFF_ROWS = {"connect", "drop", "reset", "disconnect", "elsewhere"}


def report(ours: dict[str, dict[str, list[float]]], client: dict[str, dict[str, list[float]]], rtt: float) -> None:
    def cell(d: list[float] | None, u: list[float] | None, key: str, rt: float | None = None) -> tuple[str, str, str]:
        md, mu = med(d), med(u)
        if md is None:
            return "", "", ""
        if rt is None:
            rt = (md - (mu or 0.0)) / rtt if key in DIFF_ROWS else md / rtt
        return f"{md * 1e3:.0f}", f"{rt:.1f}", "" if mu is None else f"{mu * 1e3:.1f}"

    def ratio(c: list[float] | None, o: list[float] | None) -> str:
        mc, mo = med(c), med(o)
        return f"{mc / mo:.2f}" if mc and mo else ""

    head = (
        f"{'measure (ours / Ray Client)':34s} {'ours ms':>8s} {'RT':>5s} {'@0 ms':>7s}   "
        f"{'Ray Client ms':>13s} {'RT':>5s} {'@0 ms':>7s}  {'RC/ours':>7s}"
    )
    print(head)
    print("-" * len(head))
    for key, label, other in ROWS:
        if key not in ours and key not in client:
            continue
        o = ours.get(key, {})
        c = client.get(key, {})
        rt = None
        if key == "connect" and o.get("protocol_d") and o.get("protocol_u"):
            # The agent's own start is not the protocol's: compare the connects less it.
            rt = ((med(o["protocol_d"]) or 0.0) - (med(o["protocol_u"]) or 0.0)) / rtt
        ms, rt_text, ms0 = cell(o.get("d"), o.get("u"), key, rt)
        cms, crt, cms0 = cell(c.get("d"), c.get("u"), key)
        times = ratio(c.get("d"), o.get("d"))
        print(f"{label:34s} {ms:>8s} {rt_text:>5s} {ms0:>7s}   {cms:>13s} {crt:>5s} {cms0:>7s}  {times:>7s}")
        if other:
            print(f"{'  Ray Client: ' + other:34s}")


def report_phases(samples: dict[str, dict[str, list[float]]], rtt: float) -> None:
    keys = [k for k in samples if k not in ("total", "agent", "commands")]
    print(f"{'connect, step by step':34s} {'delayed ms':>10s} {'undelayed ms':>12s} {'RT':>6s}")
    for key in ["total", "agent", *keys]:
        d, u = med(samples[key].get("d")), med(samples[key].get("u"))
        if d is None or u is None:
            continue
        label = "agent's own start" if key == "agent" else key
        print(f"{label:34s} {d * 1e3:>10.0f} {u * 1e3:>12.0f} {(d - u) / rtt:>6.1f}")
    d, u = med(samples.get("commands", {}).get("d")), med(samples.get("commands", {}).get("u"))
    if d is not None and u is not None:
        print(f"{'remote commands (count)':34s} {d:>10.0f} {u:>12.0f}")


# --------------------------------------------------------------------------- main


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=15, help="timed rounds per cell measure (medians)")
    parser.add_argument("--delay", type=float, default=0.025, help="seconds each way (the round trip is twice)")
    parser.add_argument("--connects", type=int, default=5, help="connects (and Ray Client runs) per delay")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument(
        "--nagle",
        action="store_true",
        help="model sshd's Nagle algorithm on what it sends (a lower bound of a real link's; gRPC sets TCP_NODELAY)",
    )
    args = parser.parse_args()
    delay, rtt = args.delay, 2 * args.delay

    import jupyter_cluster as jc

    logging.getLogger("jupyter_cluster").setLevel(logging.ERROR)  # a reconnect per resume round: no warnings
    ours: dict[str, dict[str, list[float]]] = {}
    client: dict[str, dict[str, list[float]]] = {}
    steps: dict[str, dict[str, list[float]]] = {}
    notes: list[str] = []

    def note(text: str) -> None:
        notes.append(text)
        print(text, file=sys.stderr)

    def add(table: dict[str, dict[str, list[float]]], key: str, which: str, value: float) -> None:
        table.setdefault(key, {}).setdefault(which, []).append(value)

    with tempfile.TemporaryDirectory(prefix="jc-bench-link-") as tmp_dir, contextlib.ExitStack() as stack:
        tmp = Path(tmp_dir)
        keys = SSHKeys.generate(tmp / "keys")
        server = SSHServer(keys, tmp / "sshd").start()
        stack.callback(server.stop)
        proxy = stack.enter_context(DelayProxy(server.port, delay, nagle=args.nagle))
        known_hosts = keys.write_known_hosts(tmp / "known_hosts", [(proxy.host, proxy.port)])
        target = f"{server.user}@{proxy.host}:{proxy.port}"
        opts: dict[str, Any] = {"identity": str(server.identity), "known_hosts": str(known_hosts)}
        print(f"sshd at {server.host}:{server.port}, through {proxy!r}: round trip {rtt * 1e3:g} ms", file=sys.stderr)

        if running_rays():
            raise SystemExit(
                f"Ray already runs on this machine ({', '.join(running_rays())}): `connect --start-head` "
                "would join it instead of starting the benchmark's own; stop it first"
            )
        if not port_free(RAY_CLIENT_PORT):
            raise SystemExit(
                f"port {RAY_CLIENT_PORT} is taken (another Ray on this machine?): Ray Client would reach "
                "the wrong cluster; stop it first"
            )
        t = time.perf_counter()
        cluster = jc.connect(target, **opts, start_head=True, port=free_port())
        start_head = time.perf_counter() - t
        proxy.nodelay()  # the connect's boot exec made sshd set TCP_NODELAY on the connection

        def teardown() -> None:
            proxy.delay = 0.0  # at loopback speed
            down(cluster)

        stack.callback(teardown)
        started = cluster.started
        assert started is not None
        token_env = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": started.token}
        print(f"connect --start-head: {start_head:.1f} s", file=sys.stderr)

        # -- connect. First as a user would, with no help: does it find the running Ray?
        proxy.delay = 0.0
        try:
            connect_once(target, opts, None, proxy)
            attach_with: Any = None
        except Exception as exc:
            note(
                "A plain `jc.connect(target)` to this head (Ray started by --start-head) failed: "
                f"{type(exc).__name__}: {str(exc).splitlines()[0]} -- so the connects below pass the "
                "head's address and token as `jc.up` does (`_started=`), which takes the same steps."
            )
            attach_with = started
        for i in range(2 * args.connects):
            which = "d" if i % 2 == 0 else "u"
            proxy.delay = delay if which == "d" else 0.0
            sample = connect_once(target, opts, attach_with, proxy)
            add(ours, "connect", which, sample["total"])
            # The protocol's part: the connect less the agent's own start, sample by sample.
            add(ours, "connect", "protocol_" + which, sample["total"] - sample["agent"])
            if "boot exec" in sample:
                sample["boot exec less the agent's start"] = sample["boot exec"] - sample["agent"]
            for key, value in sample.items():
                add(steps, key, which, value)
            print(f"connect ({which}): {json.dumps(sample)}", file=sys.stderr)

        # -- cells and calls, on the connection jc.connect opened
        for key, once in cell_measures(cluster).items():
            for which, d in (("d", delay), ("u", 0.0)):
                proxy.delay = d
                settle(cluster)
                for _ in range(args.warmup):
                    once()
                for _ in range(args.rounds):
                    add(ours, key, which, once())

        # -- resume
        for key, measure in (
            ("drop", lambda: resume_after_drop(cluster)),
            ("reset", lambda: resume_after_reset(cluster, proxy)),
            ("disconnect", lambda: resume_after_disconnect(cluster, target, opts)),
        ):
            for which, d in (("d", delay), ("u", 0.0)):
                proxy.delay = d
                measure()  # warm
                for _ in range(args.rounds):
                    add(ours, key, which, measure())
        unanswered = 0
        for _ in range(args.connects):
            for which, d in (("d", delay), ("u", 0.0)):
                proxy.delay = d
                out = resume_elsewhere(cluster, target, opts)
                add(ours, "elsewhere", which, out["resume"])
                unanswered += not out["ping"]
        if unanswered:
            note(
                f"Resumed from another process, the new kernel's first request (a ping) got no answer within "
                f"5 s in {unanswered} of {2 * args.connects} resumes: its request ids start again at "
                "`<session>-1`, which the agent has seen from the first kernel and drops as a re-sent request."
            )

        if args.nagle:
            # The link's connection is now one it opened after a reset, with no exec on it: sshd
            # left Nagle on there. The same calls again.
            measures = cell_measures(cluster)
            for key in ("task", "get", "array"):
                for which, d in (("d", delay), ("u", 0.0)):
                    proxy.delay = d
                    settle(cluster)
                    for _ in range(args.warmup):
                        measures[key]()
                    for _ in range(args.rounds):
                        add(ours, key + " after reset", which, measures[key]())

        calibration = direct(server, attach_with, args.rounds, args.warmup)
        if max(ATTEMPTS, default=1) > 1:
            note(f"Some resumes needed more than one reconnect attempt (attempts per resume: {ATTEMPTS}).")

        # -- Ray Client, through a proxy of its own with the same delay
        with DelayProxy(RAY_CLIENT_PORT, delay) as client_proxy:
            address = f"ray://{client_proxy.host}:{client_proxy.port}"
            for i in range(2 * args.connects):
                which = "d" if i % 2 == 0 else "u"
                client_proxy.delay = delay if which == "d" else 0.0
                argv = ["-c", CLIENT, address, str(args.rounds), str(args.warmup)]
                for attempt in range(3):  # Ray Client's server side flakes now and then
                    try:
                        out = run_json(argv, env=token_env)
                        break
                    except RuntimeError as exc:
                        error = str(exc).strip().splitlines()[-1]
                        print(f"Ray Client run failed (attempt {attempt + 1}): {error}", file=sys.stderr)
                else:
                    note(f"A Ray Client run failed three times; its figures are left out (last: {error}).")
                    continue
                for key, values in out.items():
                    for value in values:
                        add(client, key, which, value)

    samples = {"ours": ours, "ray_client": client, "connect_steps": steps, "direct": calibration}
    print(json.dumps(samples), file=sys.stderr)
    print(
        f"Round trip {rtt * 1e3:g} ms ({delay * 1e3:g} ms each way, userspace proxy"
        f"{'; sshd modelled with Nagle on' if args.nagle else ''}); "
        f"medians: cells and calls of {args.rounds} rounds, connects of {args.connects}."
    )
    print(
        "RT: connect and resume rows (delayed - undelayed) / rtt (connect: less the agent's own start); "
        "the others median / rtt. @0 ms: the same through the proxy with no delay."
    )
    print()
    report(ours, client, rtt)
    print()
    agent = med(steps.get("agent", {}).get("d")) or 0.0
    print(f"connect --start-head (runs `ray start`): {start_head:.1f} s; agent's own start: {agent:.2f} s")
    report_phases(steps, rtt)
    task, array = med(calibration["task"]) or 0.0, med(calibration["array"]) or 0.0
    print(
        f"Straight to sshd (no proxy): task cell {task * 1e3:.1f} ms, 1 MiB array cell {array * 1e3:.1f} ms "
        "(the @0 column's excess over these is the proxy's own work, in this process)."
    )
    for text in notes:
        print()
        print(text)


if __name__ == "__main__":
    main()
