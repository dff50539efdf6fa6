"""A head whose Python differs from the kernel's: detected at connect, explained, and what still works works.

The head is this machine's sshd with another CPython (3.12, 3.10 or 3.13, whichever is
installed) in a virtual environment holding only Ray, numpy and cloudpickle: the agent is shipped to
it over SFTP and runs there under that Python, against a Ray it starts.
"""

# Test parameters named after the imported fixtures redefine them, as pytest intends.
# ruff: noqa: F811

from __future__ import annotations

import glob
import os
import platform
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import jupyter_cluster as jc
from jupyter_cluster._cluster import python_mismatch
from jupyter_cluster._connect import ray_note

from .conftest import attached, run
from .sshd import SSHServer, free_port, sshd_server  # noqa: F401 (fixtures)

pytestmark = pytest.mark.timeout(600)

KERNEL_MINOR = ".".join(platform.python_version_tuple()[:2])
#: Where the other Python's environment is built, once per machine (kept between runs).
VENV = Path(
    os.environ.get("JC_TEST_OTHER_PYTHON_ENV", Path.home() / ".cache" / "jupyter_cluster-tests" / "other-python")
)


def _other_python() -> str | None:
    """A CPython of another minor version for which Ray publishes wheels, if this machine has one."""
    for minor in ("3.12", "3.10", "3.13"):
        if minor == KERNEL_MINOR:
            continue
        pyenv = sorted(glob.glob(str(Path.home() / ".pyenv" / "versions" / f"{minor}.*" / "bin" / "python3")))
        for candidate in [*pyenv, shutil.which(f"python{minor}")]:
            # (a pyenv shim is on PATH even where it refuses to run)
            if candidate and subprocess.run([candidate, "-c", "import venv"], capture_output=True).returncode == 0:
                return candidate
    return None


def _head_python() -> str:
    """The other Python's venv, with this kernel's Ray version (numpy, cloudpickle), built if missing."""
    from importlib.metadata import version

    python = VENV / "bin" / "python"
    ray_version = version("ray")
    ready = VENV / f"ray-{ray_version}-cloudpickle.ok"
    if ready.exists():
        return str(python)
    base = _other_python()
    if base is None:
        pytest.skip(f"no CPython other than {KERNEL_MINOR} on this machine to run a mismatched head with")
    shutil.rmtree(VENV, ignore_errors=True)
    subprocess.run([base, "-m", "venv", str(VENV)], check=True)
    subprocess.run(
        [str(python), "-m", "pip", "install", "-q", f"ray[default]=={ray_version}", "numpy", "cloudpickle"],
        check=True,
        env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"},
    )
    ready.write_text("")
    return str(python)


@pytest.fixture(scope="module")
def other_head(sshd_server: SSHServer) -> Iterator[jc.Cluster]:
    """Attached over SSH to a head running another Python, Ray started there by --start-head."""
    with attached(
        lambda: jc.connect(
            f"{sshd_server.user}@{sshd_server.host}:{sshd_server.port}",
            python=_head_python(),
            start_head=True,
            port=free_port(),
            identity=str(sshd_server.identity),
            known_hosts=str(sshd_server.known_hosts),
        )
    ) as cluster:
        yield cluster


def test_the_messages_say_what_works_and_how_to_fix() -> None:
    assert python_mismatch("3.11.7", "3.11.1") is None
    text = python_mismatch("3.11.7", "3.12.1")
    assert text is not None
    assert "3.11.7" in text and "3.12.1" in text  # what differs
    assert "cannot travel" in text  # what does not work
    assert "data inputs and outputs" in text  # what does
    assert "Python 3.12" in text and "--python" in text  # how to fix it, either side
    assert ray_note(None, "2.60.0") is None and ray_note("2.60.0", "2.60.0") is None
    note = ray_note("2.50.0", "2.60.0")
    assert note is not None and "2.50.0" in note and "2.60.0" in note and "Cells work" in note


def test_the_magic_says_so_at_connect(
    other_head: jc.Cluster, sshd_server: SSHServer, shell: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """A second notebook's agent on the module's head (the other Python's Ray, already started)."""
    assert other_head.started is not None
    previous = jc.current()
    run(
        shell,
        f"%cluster connect {sshd_server.user}@{sshd_server.host}:{sshd_server.port} "
        f"--address {other_head.started.address} --python {_head_python()} "
        f"--identity {sshd_server.identity} --known-hosts {sshd_server.known_hosts}",
    ).raise_error()
    attached = jc.current()
    try:
        assert attached is not None and attached is not previous and attached is not other_head and attached.mismatch
        err = capsys.readouterr().err
        assert "Note: the notebook runs Python" in err and "--python" in err
        run(shell, "x = [1, 2]").raise_error()
        run(shell, "%%remote\nimport sys\nminor = sys.version_info[1]\ny = [v + 1 for v in x]").raise_error()
        assert shell.user_ns["y"] == [2, 3] and shell.user_ns["minor"] != sys.version_info[1]
    finally:
        run(shell, "%cluster down --force").raise_error()
        if previous is not None and previous.alive:
            jc._cluster.attach(previous)


def test_mismatch_is_detected_at_connect(other_head: jc.Cluster) -> None:
    assert not other_head.python.startswith(KERNEL_MINOR + ".")
    assert other_head.shipped, "the head has no jupyter_cluster: the agent was copied over"
    assert other_head.mismatch is not None
    assert platform.python_version() in other_head.mismatch and other_head.python in other_head.mismatch


def test_data_cells_work_across_versions(other_head: jc.Cluster) -> None:
    import numpy as np

    namespace: dict[str, Any] = {"x": [1, 2, 3], "a": np.arange(6.0).reshape(2, 3)}
    result = other_head.run_cell(
        "import sys\nversion = sys.version_info[:2]\ny = [v * 2 for v in x]\nb = a.T @ a\n"
        "def square(v):\n    return v * v\nz = [square(v) for v in x]",
        namespace=namespace,
    ).result(120)
    assert tuple(result.outputs["version"]) != sys.version_info[:2]  # it really ran on the other Python
    assert result.outputs["y"] == [2, 4, 6] and result.outputs["z"] == [1, 4, 9]
    assert np.array_equal(result.outputs["b"], namespace["a"].T @ namespace["a"])
    # The function the cell defined is code from the other Python: it stays there, behind a handle
    square = result.outputs["square"]
    assert isinstance(square, jc.ObjectHandle) and repr(square).startswith("<remote Python code")
    assert any("`square` carries Python code" in w for w in result.warnings)
    again = other_head.run_cell("w = square(4)", namespace={"square": square}).result(60)
    assert again.outputs["w"] == 16


def test_a_notebook_function_is_refused_and_nothing_is_lost(other_head: jc.Cluster) -> None:
    def square(v: int) -> int:
        return v * v

    namespace: dict[str, Any] = {"square": square, "x": 3}
    with pytest.raises(jc.InputError) as caught:
        other_head.run_cell("y = square(x)", namespace=namespace)
    message = str(caught.value)
    assert "`square`" in message and other_head.python in message and "inside the remote cell" in message
    assert namespace["square"] is square  # the notebook keeps its function
    assert other_head.run_cell("y = x + 1", namespace=namespace).result(60).outputs["y"] == 4
