"""``ray start --head`` as a user types it, for the tests that start Ray by hand, on a machine busy with the rest of
the suite.

Ray gives a starting node fixed 30 s windows (the raylet waits for its dashboard agent, a Python process, then
``ray start`` waits for the raylet); on two cores busy with the other test process's clusters they can pass. That
is not what these tests are about: the agent's window is raised to 90 s, and a start that still timed out is
stopped (all that names its port) and tried again once the machine had a moment."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from .sshd import free_port

RAY = os.path.join(os.path.dirname(sys.executable), "ray")

#: How many times a ``ray start --head`` that timed out during startup is tried.
START_ATTEMPTS = 4


def quieter(load: float = 1.5, most: float = 20.0) -> None:
    """Wait, 10 s at least and ``most`` at the most, for the machine's load to fall below ``load``."""
    time.sleep(10)
    deadline = time.monotonic() + most
    while os.getloadavg()[0] > load and time.monotonic() < deadline:
        time.sleep(3)


def kill_ray_of_port(port: int) -> None:
    """Kill the processes of a ``ray start --head --port PORT`` that failed: its GCS, and all that name its address."""
    for entry in os.listdir("/proc"):
        try:
            line = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        ours = f"--gcs_server_port={port}" in line or re.search(rf"--gcs[-_]address=\S+:{port}\b", line)
        if entry.isdigit() and ours:
            with contextlib.suppress(OSError):
                os.kill(int(entry), signal.SIGKILL)


def start_head(args: list[str], env: dict[str, str]) -> tuple[subprocess.CompletedProcess[str], str | None]:
    """Run ``ray start --head --port PORT ARGS...`` (a free port) with ``env``; returns the last try and the address
    it printed (None if it failed)."""
    env = {**env, "RAY_agent_register_timeout_ms": env.get("RAY_agent_register_timeout_ms", "90000")}
    for attempt in range(1, START_ATTEMPTS + 1):
        port = free_port()
        command = [RAY, "start", "--head", "--port", str(port), *args]
        done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=180)
        if attempt < START_ATTEMPTS and "timed out during startup" in done.stderr:
            kill_ray_of_port(port)
            quieter()
            continue
        break
    match = re.search(r"--address='([^']+)'", done.stdout + done.stderr)
    return done, match.group(1) if match and done.returncode == 0 else None
