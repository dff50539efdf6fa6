"""Bring the agent up on a head in one SSH exec.

The kernel runs this file's source with ``python3 -c`` on the head and writes a JSON
request to its stdin. In one go it probes the head (its Python, Ray and this
package's version, a running Ray's address), finds the session's agent if one
already serves, checks that the agent's modules are there, starts the agent as a
daemon and waits for it here, on the head, so that none of this costs the link a
round trip. It prints one JSON line: what it found, and the agent's ``ready`` state,
or ``need`` (``"ray"``: no Ray runs; ``"ship"``: the modules must be copied first).

Standard library only: it runs before anything is known of the head's Python. The
secret and a Ray token arrive on stdin and are kept in a 0600 file, never on a
command line.
"""

from __future__ import annotations

import json
import os
import platform
import socket
import subprocess
import sys
import tempfile
import time
from importlib import metadata
from typing import Any

AGENT_START_TIMEOUT = 120.0


def version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except Exception:
        return None


def answers(address: str) -> bool:
    """Whether something listens at a GCS address (a stale file outlives its cluster)."""
    try:
        host, port = address.rsplit(":", 1)
        socket.create_connection((host, int(port)), 2).close()
        return True
    except (OSError, ValueError):
        return False


def gcs_processes() -> list[tuple[str, list[str]]]:
    """``(pid, argv)`` of each GCS server process on this host."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                args = f.read().decode(errors="replace").split("\0")
        except OSError:
            continue
        if args and os.path.basename(args[0]) == "gcs_server":
            found.append((pid, args))
    return found


def local_gcs_ports() -> set[str]:
    """The ports this host's GCS processes serve: a recorded address is a cluster
    running here only if one of them serves its port."""
    prefix = "--gcs_server_port="
    return {a[len(prefix) :] for _, args in gcs_processes() for a in args if a.startswith(prefix)}


def cluster_files() -> list[str]:
    """Where ``ray start`` recorded the clusters it started: Ray's default temp folder,
    then the folders of clusters this project started (``--start-head``, ``up``),
    newest first (the user's own only). A cluster started by hand with another
    ``--temp-dir`` is not found: name it with ``--address``."""
    temp = tempfile.gettempdir()
    ours = [os.path.join(temp, d, "ray_current_cluster") for d in os.listdir(temp) if d.startswith("jc-")]
    # Another user's cluster on a shared head is not ours to join.
    ours = [p for p in ours if os.path.exists(p) and os.stat(p).st_uid == os.getuid()]
    ours.sort(key=os.path.getmtime, reverse=True)
    return [os.path.join(temp, "ray", "ray_current_cluster"), *ours]


def probe() -> dict[str, Any]:
    recorded = []
    for path in cluster_files():
        try:
            with open(path) as f:
                recorded.append(f.read().strip())
        except OSError:
            continue
    serving = local_gcs_ports()
    candidates = [a for a in dict.fromkeys(recorded) if a and a.rsplit(":", 1)[-1] in serving and answers(a)]
    return {
        "python": platform.python_version(),
        "executable": sys.executable,
        "home": os.path.expanduser("~"),
        "ray": version("ray"),
        "jupyter_cluster": version("jupyter_cluster"),
        "cloudpickle": version("cloudpickle"),
        "ray_address": candidates[0] if candidates else None,
        "ray_addresses": candidates,
    }


def read_json(path: str) -> Any:
    try:
        with open(path) as f:
            return json.loads(f.read() or "null")
    except (OSError, ValueError):
        return None


def tail(path: str, lines: int = 40) -> str:
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-lines:])
    except OSError:
        return ""


def running_agent(folder: str) -> dict[str, Any] | None:
    """The session's agent if its process lives and its socket is there."""
    ready = read_json(os.path.join(folder, "ready.json"))
    if not ready or not ready.get("ready") or not os.path.exists(os.path.join(folder, "agent.sock")):
        return None
    try:
        os.kill(int(ready["pid"]), 0)
        with open(os.path.join(folder, "secret")) as f:
            secret = f.readline().strip()
    except (OSError, KeyError, ValueError):
        return None
    return {**ready, "secret": secret}


def start_agent(request: dict[str, Any], folder: str, address: str, lib: str | None) -> dict[str, Any]:
    os.makedirs(folder, mode=0o700, exist_ok=True)
    os.chmod(folder, 0o700)
    for name in ("ready.json", "secret"):
        if os.path.exists(os.path.join(folder, name)):
            os.unlink(os.path.join(folder, name))
    secret_file = os.path.join(folder, "secret")
    fd = os.open(secret_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(request["secret"] + ("\n" + request["ray_token"] if request.get("ray_token") else ""))
    env = {**os.environ, **request.get("env", {})}
    if lib:
        env["PYTHONPATH"] = lib
    command = [
        sys.executable, "-m", "jupyter_cluster.agent",
        "--socket", os.path.join(folder, "agent.sock"),
        "--secret-file", secret_file,
        "--address", address,
        "--idle-timeout", str(request["idle_timeout"]),
    ] + (["--ship", lib] if lib else [])  # fmt: skip
    out_path = os.path.join(folder, "agent.out")
    with open(out_path, "ab") as out:
        process = subprocess.Popen(
            command, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
            env=env, cwd=folder, start_new_session=True,
        )  # fmt: skip
    timeout = float(request.get("timeout", AGENT_START_TIMEOUT))
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready = read_json(os.path.join(folder, "ready.json"))
        if ready is not None:
            return {"ready": ready, "log": "" if ready.get("ready") else tail(out_path)}
        if process.poll() is not None:
            return {"ready": {"ready": False, "error": f"exited with code {process.returncode}"}, "log": tail(out_path)}
        time.sleep(0.05)
    process.kill()
    return {"ready": {"ready": False, "error": f"did not start in {timeout:.0f} s"}, "log": tail(out_path)}


def boot(request: dict[str, Any]) -> dict[str, Any]:
    info = probe()
    answer: dict[str, Any] = {"info": info}
    if request.get("probe_only") or not info["ray"]:
        return answer
    folder = os.path.join(info["home"], ".jupyter_cluster", "sessions", request["session"])
    state = running_agent(folder) if request.get("resume") else None
    if state is not None:
        return {**answer, "ready": state, "resumed": True}
    address = request.get("address") or info["ray_address"]
    if not address:
        return {**answer, "need": "ray"}
    lib = None
    if request.get("ship") == "always" or info["jupyter_cluster"] != request["version"]:
        lib = os.path.join(info["home"], ".jupyter_cluster", "lib", request["version"] + "-" + request["fingerprint"])
        if not os.path.exists(os.path.join(lib, "jupyter_cluster", "agent", ".complete")):
            return {**answer, "need": "ship", "lib": lib}
    started = start_agent(request, folder, address, lib)
    return {**answer, **started, "lib": lib, "address": address}


if __name__ == "__main__":
    print(json.dumps(boot(json.loads(sys.stdin.read() or "{}"))), flush=True)
