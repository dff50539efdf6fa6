"""examples/09-ssh.ipynb against a real sshd on loopback, as a reader with a head runs it.

test_examples.py runs it without a head (the Binder path: the SSH steps skipped). Here it attaches with
``--start-head``, so it runs in the test command's main process with the other tests that start heads.
"""

# ruff: noqa: F811

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from .sshd import SSHServer, free_port, sshd_server  # noqa: F401 (fixture)
from .test_examples import EXAMPLES, execute, python3_kernel  # noqa: F401 (fixture)

pytestmark = pytest.mark.timeout(600)


@pytest.mark.slow
def test_the_ssh_example_attaches_starts_a_head_and_stops_it(
    sshd_server: SSHServer, python3_kernel: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    head = f"{sshd_server.user}@{sshd_server.host}:{sshd_server.port}"
    monkeypatch.setenv("JC_EXAMPLE_HEAD", head)
    monkeypatch.setenv(
        "JC_EXAMPLE_OPTIONS",
        f"--identity {sshd_server.identity} --known-hosts {sshd_server.known_hosts} --python {sys.executable} "
        f"--port {free_port()}",
    )
    expected = [
        f"attaching to {head} over SSH",
        f"Attached to <Cluster ssh {head}",
        "running on ",
        "step 7",
        "the cell's output: 8 steps",
        "says: hello from the head",
        "Stopped the agent and the Ray it started",
    ]
    execute(EXAMPLES / "09-ssh.ipynb", python3_kernel, tmp_path, expected)
