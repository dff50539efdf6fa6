"""The embedded cluster: the agent as a child process of the kernel, with its own Ray.

The child serves its socket in a fresh 0700 temporary folder, gets the session
secret through its environment (never its command line), and exits when the kernel
does. Its first line on stdout says it is ready; the rest goes to its log file.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import threading

from ._crash import CRASH_FILE, how_it_ended
from ._errors import ClusterConnectionError
from .agent.watching._deaths import oom_kills  # the kernel's and its agent's cgroup: the same reading

START_TIMEOUT = 180.0


class EmbeddedAgent:
    """A running local agent process."""

    def __init__(self, cpus: float | None = None, gpus: float | None = None, object_store: int | None = None) -> None:
        self.folder = tempfile.mkdtemp(prefix="jupyter-cluster-")
        os.chmod(self.folder, 0o700)
        self.socket = os.path.join(self.folder, "agent.sock")
        self.log = os.path.join(self.folder, "agent.log")
        self.secret = secrets.token_hex(32)
        self._oom_kills = oom_kills()  # to tell, should it die of SIGKILL, whether the out-of-memory killer did it
        command = [
            sys.executable,
            "-m",
            "jupyter_cluster.agent",
            "--socket",
            self.socket,
            "--local",
            "--parent-pid",
            str(os.getpid()),
            "--log",
            self.log,
        ]
        if cpus is not None:
            command += ["--num-cpus", str(cpus)]
        if gpus is not None:
            command += ["--num-gpus", str(gpus)]
        if object_store is not None:
            command += ["--object-store-memory", str(object_store)]
        env = {**os.environ, "JUPYTER_CLUSTER_SECRET": self.secret}
        # The kernel's inline matplotlib backend means nothing to a headless worker.
        env.pop("MPLBACKEND", None)
        with open(self.log, "ab") as stderr:
            self.process = subprocess.Popen(
                command,
                stdout=subprocess.PIPE,
                stderr=stderr,
                stdin=subprocess.DEVNULL,
                env=env,
                start_new_session=True,
            )
        self.ready = self._wait_ready()
        threading.Thread(target=self._drain, daemon=True, name="jupyter-cluster-agent-stdout").start()

    def _wait_ready(self) -> dict[str, object]:
        """The agent's announcement: the first line of its stdout that is one (any other goes to its log)."""
        result: dict[str, object] = {}

        def read() -> None:
            assert self.process.stdout is not None
            for line in self.process.stdout:
                try:
                    answer = json.loads(line)
                except ValueError:
                    answer = None
                if isinstance(answer, dict) and ("ready" in answer or "error" in answer):
                    result.update(answer)
                    return
                with open(self.log, "ab") as log:
                    log.write(line)

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        reader.join(START_TIMEOUT)
        if not result.get("ready"):
            detail = result.get("error") or self.tail_log()  # before stop(), which removes the log
            self.stop()
            raise ClusterConnectionError(f"the embedded cluster did not start: {detail}")
        return result

    def _drain(self) -> None:
        assert self.process.stdout is not None
        with open(self.log, "ab") as log:
            for line in self.process.stdout:
                log.write(line)

    def tail_log(self, lines: int = 20) -> str:
        try:
            with open(self.log, errors="replace") as log:
                return "".join(log.readlines()[-lines:]).strip() or "(its log is empty)"
        except OSError:
            return "(no log)"

    def exit_reason(self) -> str | None:
        """Why the agent is gone, or None while its process runs."""
        code = self.process.poll()
        if code is None:
            return None
        kills = oom_kills()
        oom = kills is not None and self._oom_kills is not None and kills > self._oom_kills
        return f"the embedded agent died: {how_it_ended(code, self.crash_text(), oom)}"

    def crash_text(self) -> str:
        """What the agent's faulthandler wrote, should a fatal signal have ended it (see :mod:`._crash`)."""
        try:
            with open(os.path.join(self.folder, CRASH_FILE), errors="replace") as f:
                return f.read(64 << 10)
        except OSError:
            return ""

    def stop(self, timeout: float = 30.0) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        shutil.rmtree(self.folder, ignore_errors=True)
