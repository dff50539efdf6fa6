"""examples/09-ssh.ipynb against a real sshd on loopback, as a reader with a head runs it.

test_examples.py runs it without a head (the Binder path: the SSH steps skipped). Here it attaches with
``--start-head`` to the sshd that ``scripts/run_example.py --commit`` starts for it, so it runs in the test
command's main process with the other tests that start heads.
"""

# ruff: noqa: F811

from __future__ import annotations

from pathlib import Path

import pytest

from .test_examples import EXAMPLES, _run_example, execute, python3_kernel  # noqa: F401 (fixture)

pytestmark = pytest.mark.timeout(600)


@pytest.mark.slow
def test_the_ssh_example_attaches_starts_a_head_and_stops_it(
    python3_kernel: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with _run_example().loopback_head() as env:
        if env is None:
            pytest.skip("needs root and OpenSSH's sshd")
        head = env["JC_EXAMPLE_HEAD"]
        for key, value in env.items():
            monkeypatch.setenv(key, value)
        _attach_and_run(head, python3_kernel, tmp_path)


def _attach_and_run(head: str, python3_kernel: str, tmp_path: Path) -> None:
    expected = [
        f"attaching to {head} over SSH",
        f"Attached to <Cluster ssh {head}",
        "running on ",
        "step 7 at ",  # the --async cell's last line, replayed into its own output after the detach
        "Detached from session ",
        "detached at ",
        "attached again at ",
        "the cell's output: 8 steps",
        "says: hello from the head",
        "Stopped the agent and the Ray it started",
    ]
    execute(EXAMPLES / "09-ssh.ipynb", python3_kernel, tmp_path, expected)
