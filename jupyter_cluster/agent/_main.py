"""Start the agent: connect to (or start) Ray, serve the socket, wire requests to cells.

``python -m jupyter_cluster.agent --socket PATH`` with the session secret in the
environment variable ``JUPYTER_CLUSTER_SECRET``. ``--local`` starts a Ray instance
of its own (the embedded cluster); otherwise it joins the running one
(``address="auto"``). When ready it prints one JSON line, ``{"ready": ...}``, on
stdout, which is how the process that started it knows the socket is served.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import faulthandler
import json
import logging
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

from ._importing import import_ray, lean_pythonpath
from ._reaper import Reaper, descendants, end, started_here
from ._shared import SegmentName

log = logging.getLogger("jupyter_cluster.agent")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m jupyter_cluster.agent")
    parser.add_argument("--socket", required=True, help="Unix socket path to serve")
    parser.add_argument("--local", action="store_true", help="start a Ray instance of our own")
    parser.add_argument("--address", default="auto", help="Ray address to join without --local")
    parser.add_argument("--num-cpus", type=float, default=None)
    parser.add_argument("--num-gpus", type=float, default=None)
    parser.add_argument("--object-store-memory", type=int, default=None)
    parser.add_argument("--parent-pid", type=int, default=None, help="exit when this process exits")
    parser.add_argument(
        "--idle-timeout", type=float, default=24 * 3600, help="seconds with no session attached before exiting"
    )
    parser.add_argument("--log", default=None, help="log file (default: next to the socket)")
    parser.add_argument("--secret-file", default=None, help="read the session secret from this file")
    parser.add_argument("--ship", default=None, help="a folder of shipped agent code, for the workers (py_modules)")
    return parser.parse_args(argv)


def _token_available() -> bool:
    """Whether a Ray token is where Ray looks for one: ``RAY_AUTH_TOKEN``, the file
    ``RAY_AUTH_TOKEN_PATH`` names, or ``~/.ray/auth_token``."""
    if os.environ.get("RAY_AUTH_TOKEN", "").strip():
        return True
    path = os.environ.get("RAY_AUTH_TOKEN_PATH") or os.path.join(os.path.expanduser("~"), ".ray", "auth_token")
    try:
        with open(path) as f:
            return bool(f.read().strip())
    except OSError:
        return False


def cluster_auth_mode(address: str) -> str | None:
    """The authentication mode of the GCS serving ``address`` on this host, read from
    its process's environment (``ray start`` puts ``RAY_AUTH_MODE`` there, also when it
    turned token authentication on by itself); None when no such process can be read."""
    from ._boot import gcs_processes

    port = f"--gcs_server_port={address.rsplit(':', 1)[-1]}"
    for pid, args in gcs_processes():
        if port not in args:
            continue
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = dict(v.split("=", 1) for v in f.read().decode(errors="replace").split("\0") if "=" in v)
        except OSError:
            continue
        return env.get("RAY_AUTH_MODE", "disabled").lower()
    return None


def use_token_auth(address: str) -> None:
    """Join a cluster in the authentication mode it runs with.

    Ray turns token authentication on for a driver only when it finds the local
    cluster itself; with an explicit address (what the agent passes) it stays off and
    a token-protected GCS refuses the driver. The reverse is no better: a driver in
    token mode on a cluster without authentication runs tasks, but its workers
    cannot look up named actors (measured on Ray 2.60). So the agent asks the GCS
    process on this head; where it cannot (another user's Ray, a GCS elsewhere), a
    token at hand decides, as in Ray's own discovery.
    """
    if "RAY_AUTH_MODE" in os.environ:
        return
    mode = cluster_auth_mode(address)
    if mode == "token" or (mode is None and _token_available()):
        os.environ["RAY_AUTH_MODE"] = "token"


def _count(value: float | None) -> float | int | None:
    """A whole number of CPUs or GPUs as an int: Ray derives the raylet's int flags from it (4.0 CPUs on a machine
    of more cores made ``--maximum_startup_concurrency=4.0``, which the raylet refuses, and the node never started)."""
    return int(value) if value is not None and float(value).is_integer() else value


#: How often the embedded cluster's Ray reports its metrics (node figures and its own), in ms.
METRICS_EVERY_MS = 2000


#: The Ray namespace of the embedded cluster's agent, where its cells' named actors live.
NAMESPACE = "jupyter_cluster"


def agent_namespace(args: argparse.Namespace) -> str:
    """The Ray namespace of this agent's driver: where the ``--actor`` cells' actors and the named actors its
    driver cells make live. The embedded cluster has one agent: ``jupyter_cluster``. On a cluster that other
    notebooks share, each session's agent has one of its own, ``jupyter_cluster-SESSION`` (its folder's name), as
    each plain ``ray.init()`` has: two notebooks' ``--actor counter`` or ``name='keeper'`` are two actors, and
    one notebook's *kill* cannot reach the other's. A session resumed later, by a new agent, finds its own."""
    if args.local:
        return NAMESPACE
    return f"{NAMESPACE}-{os.path.basename(os.path.dirname(os.path.abspath(args.socket)))}"


def init_ray(args: argparse.Namespace) -> None:
    if not args.local:
        use_token_auth(args.address)
    ray = import_ray()

    from .cells._logs import SETUP_HOOK

    # Workers' lines come to the agent, which routes each to the cell that started the work (see ._logs);
    # every worker of its job marks its output by task (Ray's worker_process_setup_hook).
    runtime_env: dict[str, Any] = {"worker_process_setup_hook": SETUP_HOOK}
    kwargs: dict[str, Any] = {
        "namespace": agent_namespace(args),
        "log_to_driver": True,
        "configure_logging": False,
        "runtime_env": runtime_env,
    }
    if args.local:
        from .cells._logs import LOG_SCAN

        os.environ.setdefault("LOG_NAME_UPDATE_INTERVAL_S", LOG_SCAN)  # Ray's log monitor, started by ray.init
        # Every Python process of the embedded cluster (its raylet is a child of this one) imports Ray without the
        # grammar import_ray leaves out here: its workers start 0.77 s sooner on a 2-core machine.
        os.environ["PYTHONPATH"] = lean_pythonpath(os.environ.get("PYTHONPATH"))
        hook_variable = getattr(ray._private.ray_constants, "WORKER_PROCESS_SETUP_HOOK_ENV_VAR", None)
        if hook_variable:
            # The embedded cluster's workers inherit this process's environment (its raylet is a child of it), and
            # a worker runs the hook its environment names (Ray's own variable, which the runtime_env field sets).
            # Set here, the job has no runtime_env, and Ray starts its workers ahead at ray.init: it starts none
            # ahead for a job with one, and a first cell waited some 2.5 s for them.
            os.environ[hook_variable] = SETUP_HOOK
            del runtime_env["worker_process_setup_hook"]
        # "local": a Ray of our own even where `ray start` left one running (plain
        # ray.init() would join that one, and refuse the CPU count).
        from ._sizing import dashboard_fits, memory_limit

        # Ray's own tools (its dashboard, the state API, `ray job`), as a plain ray.init() offers them, where the box
        # has room; on loopback only, behind Ray's token (ray.init turns token authentication on for a new cluster).
        dashboard = dashboard_fits(memory_limit())
        # None, not True: Ray starts its dashboard then, and goes on without it should it not come up in time (a
        # busy machine), where True fails the cluster's start.
        kwargs.update(
            address="local",
            num_cpus=_count(args.num_cpus),
            num_gpus=_count(args.num_gpus),
            include_dashboard=None if dashboard else False,
        )
        if dashboard:
            kwargs["dashboard_host"] = "127.0.0.1"
        temp = own_temp_dir(args.socket)
        if temp is not None:
            kwargs["_temp_dir"] = temp
        if args.object_store_memory:
            kwargs["object_store_memory"] = args.object_store_memory
        # Ray's figures every 2 s, not every 5 to 10: the status card and the dashboard then say what a cell just
        # did (its object store, the CPUs it held), not what was true seconds before.
        os.environ.setdefault("REPORTER_UPDATE_INTERVAL_MS", str(METRICS_EVERY_MS))
        # A task Ray's memory monitor killed fails at once, saying so: a retry would allocate as much again.
        kwargs["_system_config"] = {"metrics_report_interval_ms": METRICS_EVERY_MS, "task_oom_retries": 0}
        from ._sizing import memory_limit, shm_size, small_container

        for note in small_container(kwargs, memory_limit(), shm_size()):  # a Binder-sized container, say
            log.info("a small machine: %s", note)
    else:
        kwargs["address"] = args.address
        if os.environ.get("RAY_NODE_IP_ADDRESS"):  # set by `up` for hosts without a default route
            kwargs["_node_ip_address"] = os.environ["RAY_NODE_IP_ADDRESS"]
    if args.ship:
        # The agent's code was shipped to this head only: Ray carries it to every worker.
        runtime_env["py_modules"] = [os.path.join(args.ship, "jupyter_cluster")]
    if not runtime_env:
        kwargs["runtime_env"] = None
    started = time.monotonic()
    if not args.local:
        ray.init(**kwargs)
    else:
        _init_local(ray, kwargs)
    log.info("ray.init took %.2f s", time.monotonic() - started)
    node = ray._private.worker._global_node
    if args.local and node is not None and node.address_info.get("webui_url"):
        TOOLS["dashboard"] = f"http://{node.address_info['webui_url']}"
    TOOLS["gcs"] = ray.get_runtime_context().gcs_address
    # What in this process asks Ray for "auto" (the state API, a job client in a driver cell, `ray status` run
    # from one) finds this cluster, not whichever else runs on the machine.
    os.environ["RAY_ADDRESS"] = TOOLS["gcs"]
    if args.local and kwargs.get("_temp_dir"):
        # Where Ray's job supervisor looks for its cluster's address (it takes "auto": any GCS of the machine
        # otherwise, and another notebook's cluster's, if it came first, ran the job): as `ray start` records it.
        ray._private.utils.write_ray_address(TOOLS["gcs"], kwargs["_temp_dir"])
    TOOLS["auth"] = os.environ.get("RAY_AUTH_MODE", "disabled").lower()  # ray.init set "token" for a new cluster
    # Ray prints its workers' lines to the driver's stdout, which is the agent's announcement to the
    # kernel: the agent routes them itself (see ._logs), from before the first worker writes.
    from ray._private import worker

    worker.global_worker_stdstream_dispatcher.remove_handler("ray_print_logs")
    from ._sizing import small_machine
    from .cells._output import start_relay

    # A worker per CPU, on the embedded cluster (a small container's idle workers end at once), and the output
    # relay warm up while the agent starts serving; the first cell waits for them only if it comes first
    # (CellRunner.warm). The workers' tasks go first: they take the workers Ray started ahead at ray.init. The
    # relay, an actor, would take one of those if made first, and a task would wait for a new worker (the workers
    # were up 1.7 s after ray.init that way in a plain driver, 0.7 s this way; the relay 1.8 s and 1.4 s).
    workers = int(ray.available_resources().get("CPU", 0)) if args.local and not small_machine() else 0
    warming = start_workers(workers)
    relay = start_relay()  # a process of its own (a worker's push to it before it runs is held back; _remote.announce)
    threading.Thread(target=warm_up, args=(relay, warming), daemon=True, name="jupyter-cluster-warm-up").start()


#: Where Ray's own tools reach this cluster: ``gcs`` (its GCS address, for `ray status` and the state API) and, on
#: the embedded cluster when it runs one, ``dashboard`` (Ray's dashboard's URL); the agent's announcement says them.
TOOLS: dict[str, str] = {}

#: Set once :func:`warm_up` is done (the runner's ``warm``).
WARMED = threading.Event()

#: The longest the warm-up waits for the output relay.
RELAY_WAIT = 60.0


def warm_up(relay: Any, warming: list[Any]) -> None:
    """Until the worker processes of ``warming`` (:func:`start_workers`) and the output relay are up. A cell's tasks
    each tell the relay that they run, and a relay still starting held the first cell of a new cluster up to 2 s."""
    import ray

    started = time.monotonic()
    try:
        wait_for_workers(warming)
        ray.get(relay.__ray_ready__.remote(), timeout=RELAY_WAIT)
        log.info("the output relay is up, %.1f s after it was started", time.monotonic() - started)
    except Exception:
        log.warning("the output relay was not up within %.0f s", RELAY_WAIT, exc_info=True)
    finally:
        WARMED.set()


#: How often the embedded cluster's start is tried when Ray says it timed out starting.
LOCAL_START_ATTEMPTS = 3


def private_token() -> None:
    """Ray's token for the embedded cluster, where Ray's tools look for it (``~/.ray/auth_token``, or the file
    ``RAY_AUTH_TOKEN_PATH`` names), readable by its owner only.

    A new local ``ray.init()`` writes one there when there is none, with the process's umask: 0644 in a 0755
    ``~/.ray`` (Ray 2.60), which every user of a shared host (a JupyterHub's) can read, and with it join the
    cluster as a driver and run code as its owner. So it is made here first, 0600 in a 0700 folder, and an
    existing one is closed to others. Nothing is done where the token comes in ``RAY_AUTH_TOKEN`` or token
    authentication is turned off."""
    if os.environ.get("RAY_AUTH_MODE", "").lower() == "disabled" or os.environ.get("RAY_AUTH_TOKEN", "").strip():
        return
    path = os.environ.get("RAY_AUTH_TOKEN_PATH") or os.path.join(os.path.expanduser("~"), ".ray", "auth_token")
    folder = os.path.dirname(path)
    try:
        os.makedirs(folder, mode=0o700, exist_ok=True)
        if not os.environ.get("RAY_AUTH_TOKEN_PATH"):
            os.chmod(folder, 0o700)  # ~/.ray: this user's only
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            mode = os.stat(path).st_mode
            if mode & 0o077:
                os.chmod(path, 0o600)
                log.warning("Ray's token %s was readable by other users (%o); made it 0600", path, mode & 0o777)
        else:
            from ray._private.authentication.authentication_token_generator import (
                generate_new_authentication_token,
            )

            with os.fdopen(fd, "w") as f:
                f.write(generate_new_authentication_token())
    except (OSError, ImportError):
        log.warning("could not make Ray's token private at %s", path, exc_info=True)


def _init_local(ray: Any, kwargs: dict[str, Any]) -> None:
    """``ray.init`` of the embedded cluster, on a machine that may be busy (a small container, a laptop mid-build).

    Ray gives a starting node fixed windows of 30 s: its raylet waits that long for the node's dashboard agent (a
    Python process, slow to import on a loaded machine; raised here to 90 s), and ``ray.init`` as long for the
    raylet (and the raylet waits 15 s, a window Ray fixes, for the agent to say its ports). A start that timed
    out is tried again, three times in all, after what it left is killed (all this agent's children: nothing
    else is)."""
    os.environ.setdefault("RAY_agent_register_timeout_ms", "90000")
    # A runtime_env whose install fails (a misspelt --pip package) is tried once, not three times: each try
    # clones the Python environment anew (tens of seconds in a virtualenv), and pip has retried the network.
    os.environ.setdefault("RUNTIME_ENV_RETRY_TIMES", "1")
    private_token()
    for attempt in range(1, LOCAL_START_ATTEMPTS + 1):
        try:
            with _own_agent_port(kwargs.get("include_dashboard") is not False):
                ray.init(**kwargs)
            return
        except Exception as exc:
            if attempt == LOCAL_START_ATTEMPTS or "timed out during startup" not in str(exc):
                raise
            log.warning("Ray timed out starting the embedded cluster (%s); trying again", exc)
            for pid in descendants(os.getpid()):
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
            time.sleep(2)


#: The longest temp folder Ray's Unix sockets fit under (a socket's path holds 107 bytes; Ray adds a session's
#: folder, ``/session_2026-01-01_00-00-00_000000_1234567/sockets/plasma_store``, up to 64).
TEMP_DIR_LONGEST = 42


def own_temp_dir(socket_path: str) -> str | None:
    """The embedded cluster's own Ray temp folder, in the agent's 0700 folder (gone with it): its sessions, logs,
    sockets and spilled objects are its own, not in the ``/tmp/ray`` that every Ray of the machine shares. None
    where that folder's path is too long for Ray's sockets (Ray's default is kept)."""
    temp = os.path.join(os.path.dirname(os.path.abspath(socket_path)), "ray")
    return temp if len(temp) <= TEMP_DIR_LONGEST else None


@contextlib.contextmanager
def _own_agent_port(dashboard: bool | None) -> Iterator[None]:
    """A free port, not Ray's fixed 52365, for the node's dashboard agent's HTTP server, while ``ray.init`` starts.

    Ray's dashboard sends a submitted job to the agent at the port its node reports; two clusters on one machine
    (two notebooks) both reported 52365, which only one of their agents could bind, and a job sent to the other
    one's agent ran under a driver that the cluster did not accept (seen here: "Authentication token is missing
    or incorrect", for minutes). ``ray start`` takes ``--dashboard-agent-listen-port``; ``ray.init`` does not,
    so its node parameters get it here."""
    if not dashboard:
        yield
        return
    from ray._private import parameter

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    original = parameter.RayParams.__init__

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("dashboard_agent_listen_port", port)
        original(self, *args, **kwargs)

    parameter.RayParams.__init__ = __init__  # type: ignore[method-assign]
    try:
        yield
    finally:
        parameter.RayParams.__init__ = original  # type: ignore[method-assign]


def start_workers(count: int) -> list[Any]:
    """Tasks that need ``count`` worker processes up at once (see :func:`wait_for_workers`)."""
    import ray

    if count < 1:
        return []
    task = ray.remote(num_cpus=1)(_worker_pid)
    return [task.remote() for _ in range(count)]


def wait_for_workers(warming: list[Any], timeout: float = 60.0) -> None:
    """Return once the worker processes :func:`start_workers` asked for are up, as dask's LocalCluster does.

    Ray starts a worker per CPU for the first driver, but in the background: a cell run
    before they are up waits for them, and on a busy machine its tasks start one by one
    (four 1-second tasks took 4.5 s on a loaded 2-core machine). Tasks that each hold a CPU
    a moment need a worker per CPU at once. Past `timeout` the cluster is used as it is.
    """
    import ray

    if not warming:
        return
    started = time.monotonic()
    try:
        pids = ray.get(warming, timeout=timeout)
    except Exception:
        log.warning("the embedded cluster's workers were not all up in %.0f s", timeout, exc_info=True)
        return
    log.info("%d worker processes up in %.1f s", len(set(pids)), time.monotonic() - started)


def _worker_pid() -> int:
    time.sleep(0.2)  # long enough that no worker runs two of them
    return os.getpid()


def handlers(runner: Any, server: Any, sampler: Any) -> dict[str, Any]:
    table = runner.table

    async def run_cell(body: dict[str, Any], session: Any, emit: Any) -> None:
        await runner.synced.keep(session.name)
        runner.envs.apply(session.name, body.setdefault("options", {}), body.get("mode", "task"))
        body["session"] = session.name  # whose input names these are
        await runner.run_cell(body, emit)

    async def sync_plan(body: dict[str, Any], session: Any, emit: Any) -> None:
        emit("done", await runner.synced.plan(session.name, body["name"], body["manifest"]), final=True)

    async def sync_put(body: dict[str, Any], session: Any, emit: Any) -> None:
        emit("done", await runner.synced.put(session.name, body["files"]), final=True)

    async def sync_off(body: dict[str, Any], session: Any, emit: Any) -> None:
        emit("done", await runner.synced.off(session.name), final=True)

    async def sync_commit(body: dict[str, Any], session: Any, emit: Any) -> None:
        emit("done", await runner.synced.commit(session.name, body["manifest"]), final=True)

    async def runtime_env(body: dict[str, Any], session: Any, emit: Any) -> None:
        if "env" in body:
            runner.envs.set(session.name, body["env"])
        emit("done", runner.envs.of(session.name), final=True)

    async def cancel(body: dict[str, Any], session: Any, emit: Any) -> None:
        emit("done", runner.cancel(body["cell_id"]), final=True)

    async def timeline(body: dict[str, Any], session: Any, emit: Any) -> None:
        emit("done", await asyncio.to_thread(runner.timeline, body["cell_id"]), final=True)

    async def answer(body: dict[str, Any], session: Any, emit: Any) -> None:
        """A command for the debugger a cell's breakpoint() stopped in (see ._breakpoint)."""
        await runner.output.relay.answer.remote(body["cell_id"], str(body["command"]))
        emit("done", None, final=True)

    async def logs(body: dict[str, Any], session: Any, emit: Any) -> None:
        lines = runner.lines
        emit("done", lines.log.tail(body.get("tail")) if lines else {"lines": [], "total": 0, "kept": 0}, final=True)

    async def kill_actor(body: dict[str, Any], session: Any, emit: Any) -> None:
        emit("done", runner.kill_actor(body["name"]), final=True)

    async def reset_driver(body: dict[str, Any], session: Any, emit: Any) -> None:
        emit("done", await runner.reset_driver(), final=True)

    async def put(body: dict[str, Any], session: Any, emit: Any) -> None:
        emit("done", await table.put(body["value"]), final=True)

    async def get(body: dict[str, Any], session: Any, emit: Any) -> None:
        shared = bool(body.get("shared")) and session.shared
        into = SegmentName(*body["into"]) if shared and body.get("into") else None
        emit("done", await table.get(body["handle"], into, shared), final=True)

    async def wait(body: dict[str, Any], session: Any, emit: Any) -> None:
        if body.get("progress"):
            ready = await table.wait_progress(body["handles"], body["num_returns"], body.get("timeout"), emit)
        else:
            ready = await table.wait(body["handles"], body["num_returns"], body.get("timeout"))
        emit("done", ready, final=True)

    async def submit(body: dict[str, Any], session: Any, emit: Any) -> None:
        await runner.synced.keep(session.name)
        runner.envs.apply(session.name, body.setdefault("options", {}), "task")
        emit("done", await runner.submit(body), final=True)

    async def describe(body: dict[str, Any], session: Any, emit: Any) -> None:
        emit("done", await table.describe(body["handle"]), final=True)

    async def release(body: dict[str, Any], session: Any, emit: Any) -> None:
        table.release(body["handles"])
        emit("done", None, final=True)

    async def status(body: dict[str, Any], session: Any, emit: Any) -> None:
        data = await runner.status()
        try:  # each node's load now: one scrape (the nodes' endpoints answer in milliseconds)
            loads = await asyncio.wait_for(sampler.sample(), 3.0)
        except Exception:
            log.warning("no node metrics for the status", exc_info=True)
            loads = {}
        for node in data["nodes"]:
            node["load"] = loads.get(node.get("id"))
        # One instant: what is free is what the same read of the GCS found in use, not another read's.
        summed = sampler.gcs_resources
        if summed:
            data["available"] = {name: total - used for name, (used, total) in summed.items()}
        data["metrics_watchers"] = len(sampler.watchers)
        data["sessions"] = other_sessions(session)
        emit("done", data, final=True)

    def other_sessions(session: Any) -> dict[str, int]:
        """The other notebooks on this agent, each a session of its own (a second kernel attached to it, as
        ``%cluster connect --session`` from another notebook does), attached now or detached with their work going
        on. Notebooks with agents of their own on the cluster are Ray drivers of their own (``others``)."""
        others = [s for s in server.sessions.values() if s is not session]
        return {
            "attached": sum(1 for s in others if s.writer is not None),
            "detached": sum(1 for s in others if s.writer is None),
        }

    async def sharing(body: dict[str, Any], session: Any, emit: Any) -> None:
        """Who else uses the cluster, without the status's scrape: what ``down`` asks before it stops anything."""
        emit("done", {"sessions": other_sessions(session), "others": await runner.driver_cells.others()}, final=True)

    async def watch_metrics(body: dict[str, Any], session: Any, emit: Any) -> None:
        await sampler.watch(body["id"], session, emit)
        emit("done", None, final=True)

    async def unwatch_metrics(body: dict[str, Any], session: Any, emit: Any) -> None:
        emit("done", sampler.unwatch(body["watch"]), final=True)

    async def metrics_source(body: dict[str, Any], session: Any, emit: Any) -> None:
        from .watching._prometheus import PrometheusError

        try:
            emit("done", await sampler.use(body.get("prometheus")), final=True)
        except PrometheusError as exc:
            emit("error", {"message": str(exc)}, final=True)

    async def checkpoint_files(body: dict[str, Any], session: Any, emit: Any) -> None:
        from .runs._train import read_checkpoint

        loop = asyncio.get_running_loop()
        emit("done", await loop.run_in_executor(None, read_checkpoint, body["path"]), final=True)

    async def room(body: dict[str, Any], session: Any, emit: Any) -> None:
        """Whether values of ``nbytes`` in all may be sent here: None, or why not (asked before sending them)."""
        from ._sizing import refuse_value

        emit("done", refuse_value(int(body["nbytes"])), final=True)

    async def ping(body: dict[str, Any], session: Any, emit: Any) -> None:
        emit("done", body.get("data"), final=True)

    async def shutdown(body: dict[str, Any], session: Any, emit: Any) -> None:
        answer: Any = True
        if body.get("stop_started"):  # a cluster that outlives the agent: stop what the cells started
            from .cells._owned import stop_started

            loop = asyncio.get_running_loop()
            try:
                answer = await asyncio.wait_for(loop.run_in_executor(None, stop_started, runner.driver_ns), 90)
            except Exception:
                log.warning("could not stop what the cells started", exc_info=True)
        emit("done", answer, final=True)
        await asyncio.sleep(0.05)  # let the answer leave before the socket closes
        await server.stop()

    return {
        "answer": answer,
        "cancel": cancel,
        "checkpoint_files": checkpoint_files,
        "describe": describe,
        "get": get,
        "kill_actor": kill_actor,
        "logs": logs,
        "metrics_source": metrics_source,
        "ping": ping,
        "put": put,
        "release": release,
        "reset_driver": reset_driver,
        "room": room,
        "run_cell": run_cell,
        "runtime_env": runtime_env,
        "sharing": sharing,
        "shutdown": shutdown,
        "status": status,
        "submit": submit,
        "timeline": timeline,
        "sync_commit": sync_commit,
        "sync_off": sync_off,
        "sync_plan": sync_plan,
        "sync_put": sync_put,
        "unwatch_metrics": unwatch_metrics,
        "wait": wait,
        "watch_metrics": watch_metrics,
    }


async def watch(server: Any, args: argparse.Namespace) -> None:
    """Stop when the parent is gone, or after ``--idle-timeout`` with no session."""
    while not server.stopped.is_set():
        await asyncio.sleep(0.5)
        if args.parent_pid is not None:
            try:
                os.kill(args.parent_pid, 0)
            except ProcessLookupError:
                log.info("parent %d exited; stopping", args.parent_pid)
                await server.stop()
        idle = [s.detached_since for s in server.sessions.values() if s.writer is None]
        if not server.attached():
            since = min(idle) if idle else server.started
            if time.monotonic() - since > args.idle_timeout:
                log.info("no session attached for %.0f s; stopping", args.idle_timeout)
                await server.stop()


async def serve(args: argparse.Namespace, driver: Any, stop: list[Any]) -> None:
    """Serve the socket until told to stop. Driver cells go to ``driver`` (the main
    thread's); ``stop`` receives the callable that stops the server from any thread."""
    from .cells._cells import CellRunner
    from .link._server import AgentServer
    from .watching._sampler import MetricsSampler

    secret = os.environ.pop("JUPYTER_CLUSTER_SECRET", "")
    if args.secret_file:
        secret = read_secret_file(args.secret_file)
    if not secret:
        raise SystemExit("no session secret (JUPYTER_CLUSTER_SECRET or --secret-file): refusing to serve")
    loop = asyncio.get_running_loop()
    runner = CellRunner(loop, driver)
    runner.warm = WARMED
    from .cells import _logs, _progress
    from .cells._environment import Environments
    from .link._sync import SyncedFolders

    runner.envs = Environments([os.path.join(args.ship, "jupyter_cluster")] if args.ship else [])
    runner.synced = SyncedFolders(os.path.join(os.path.dirname(os.path.abspath(args.socket)), "synced"), runner.envs)

    _progress.install(loop, runner.driver_cell_emit)
    _logs.NOTEBOOK_ON_HEAD = args.local
    runner.lines = _logs.install(loop, runner.cell_emit)
    server = AgentServer(args.socket, secret, {})
    import ray

    # Other notebooks' and drivers' work (other Ray jobs) is counted apart from what this notebook's cells started.
    job = ray.get_runtime_context().get_job_id()
    sampler = MetricsSampler(loop, job=lambda: job)
    server.handlers.update(handlers(runner, server, sampler))
    server.started = time.monotonic()  # type: ignore[attr-defined]
    await server.start()
    stop.append(lambda: loop.call_soon_threadsafe(lambda: asyncio.ensure_future(server.stop())))

    log.info("serving on %s", args.socket)
    announce({"ready": True, "socket": args.socket, "pid": os.getpid(), "ray": ray.__version__, **TOOLS})
    from .cells._fdout import PROCESS_OUTPUT

    PROCESS_OUTPUT.install()  # from now on, what a driver cell's child processes print goes to the cell
    watcher = asyncio.ensure_future(watch(server, args))
    await server.stopped.wait()
    runner.close()
    watcher.cancel()
    sampler.close()


def run(args: argparse.Namespace, reaper: Reaper | None = None) -> None:
    """Serve on a thread of its own, and run driver cells on this (the main) thread,
    where an interrupt reaches them even inside a blocking call. ``reaper`` ends the
    agent when its graceful stop cannot (see :mod:`._reaper`)."""
    from .cells._interrupt import MainThreadCells

    driver = MainThreadCells()
    from .cells import _cellsource
    from .cells._raycode import ScriptDriver

    # Ray code pasted into a driver cell: ray.init joins, ray.shutdown ends the script's work (see ._raycode).
    hint = "`%cluster down` and `%cluster local --cpus N --gpus N` start a bigger one" if args.local else ""
    ScriptDriver(lambda: threading.get_ident() == driver.main_ident and driver.current is not None, hint).install()
    _cellsource.install()
    from .cells._owned import watch_serve

    watch_serve()  # the Serve applications the cells deploy are theirs to list and stop, not another notebook's
    stop: list[Any] = []
    failed: list[BaseException] = []
    reaper = reaper or Reaper()
    reaper.graceful = lambda: stop[0]() if stop else None

    def loop_thread() -> None:
        try:
            asyncio.run(serve(args, driver, stop))
        except BaseException as exc:
            failed.append(exc)
        finally:
            driver.close()
            # A driver cell that ignores its interrupt must not keep the agent alive.
            deadline = threading.Timer(10.0, os._exit, (0,))
            deadline.daemon = True
            deadline.start()

    def on_signal(signum: int, frame: Any) -> None:
        if stop:
            stop[0]()

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, reaper.on_sigterm)  # the graceful stop, then the kill if it does not come
    thread = threading.Thread(target=loop_thread, name="agent-loop", daemon=True)
    thread.start()
    driver.serve()
    thread.join()
    if failed:
        raise failed[0]


def announce(state: dict[str, Any], socket_path: str | None = None) -> None:
    """Say whether the agent is serving: a line on stdout (for a parent process) and
    ``ready.json`` beside the socket (for a kernel that started it over SSH)."""
    line = json.dumps(state)
    print(line, flush=True)
    path = state.get("socket") or socket_path
    if path:
        ready = os.path.join(os.path.dirname(str(path)), "ready.json")
        with open(ready + ".tmp", "w") as f:
            f.write(line)
        os.replace(ready + ".tmp", ready)


def read_secret_file(path: str) -> str:
    """The session secret: the file's first line. A second line, when there, is the
    Ray cluster's token, which the kernel passed on (``--ray-token-file`` or its own
    ``RAY_AUTH_TOKEN``); it goes where Ray reads it, this process's environment."""
    with open(path) as f:
        secret, _, token = f.read().partition("\n")
    if token.strip():
        os.environ["RAY_AUTH_TOKEN"] = token.strip()
    return secret.strip()


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    # matplotlib draws off-screen in the agent and the workers of the cluster it starts (set here, not when a module
    # is imported: a kernel that imports one must keep its inline backend).
    os.environ.setdefault("MPLBACKEND", "Agg")
    if args.secret_file:  # before Ray starts: the file may carry the cluster's token
        os.environ["JUPYTER_CLUSTER_SECRET"] = read_secret_file(args.secret_file)
        args.secret_file = None
    log_file = args.log or os.path.join(os.path.dirname(args.socket), "agent.log")
    os.makedirs(os.path.dirname(log_file), mode=0o700, exist_ok=True)
    # A fatal signal (a C extension's segfault in a driver cell) leaves the stacks of the agent's threads beside
    # its socket, where the kernel reads where it hit (Ray enables faulthandler only where it is not already).
    from .watching._deaths import CRASH_FILE

    crash = open(os.path.join(os.path.dirname(args.socket), CRASH_FILE), "w")  # noqa: SIM115 - for the process's life
    faulthandler.enable(crash, all_threads=True)
    logging.basicConfig(
        filename=log_file,
        level=logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    log.info("agent process up: Python and the agent's modules imported")
    reaper = Reaper()
    if args.parent_pid is not None:  # from before Ray starts: a kernel gone meanwhile takes its Ray along
        reaper.watch_parent(args.parent_pid)
    try:
        init_ray(args)
    except Exception as exc:
        announce({"ready": False, "error": f"{type(exc).__name__}: {exc}"}, args.socket)
        raise SystemExit(1) from exc
    try:
        run(args, reaper)
    finally:
        from .cells._raycode import original_shutdown

        original_shutdown()()
        # What Ray's stop left (a module process of its dashboard, started anew while it stopped) goes too.
        left = started_here()
        if left:
            log.info("ending %d process(es) Ray's shutdown left: %s", len(left), left)
            end(left)
    sys.exit(0)
