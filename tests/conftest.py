"""Shared fixtures: one embedded Ray cluster per test session, and a real IPython shell."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import jupyter_cluster as jc

CPUS = 2


def counting(lines: int) -> str:
    """A cell that prints ``0`` to ``lines - 1``, a line every 0.5 s, then sets ``n``: what a lost or repeated
    line of a link's outage shows in (:func:`check_exactly_once`)."""
    return f"import time\nfor i in range({lines}):\n    print(i, flush=True)\n    time.sleep(0.5)\nn = {lines}"


def check_exactly_once(cell: Any, lines: int) -> None:
    """``cell`` (a :func:`counting` one) ended, each of its lines shown once, in order, after its link was lost and
    then reconnected."""
    result = cell.result(120)
    assert result.outputs["n"] == lines
    assert cell.stdout.split() == [str(i) for i in range(lines)], "a line was lost or repeated"
    states = [data["state"] for event, data in cell._history if event == "link"]
    assert states[:1] == ["lost"] and states[-1:] == ["reconnected"], states


@contextlib.contextmanager
def attached(connect: Callable[[], jc.Cluster]) -> Iterator[jc.Cluster]:
    """The cluster ``connect`` attaches, for a test or a module's tests; then stopped (``down(force=True)``: the
    test's own, whoever else is on it), and the cluster attached before is current again."""
    previous = jc.current()
    cluster = connect()
    try:
        yield cluster
    finally:
        cluster.down(force=True)
        if previous is not None and previous.alive:
            jc._cluster.attach(previous)


@pytest.fixture(scope="session")
def _session_cluster() -> Iterator[None]:
    yield
    cluster = jc.current()
    if cluster is not None:
        cluster.down(force=True)


@pytest.fixture
def cluster(_session_cluster: None) -> jc.Cluster:
    """The session's embedded cluster (started again if a test stopped it)."""
    return jc.current() or jc.local(cpus=CPUS)


@pytest.fixture
def shell(cluster: jc.Cluster) -> Iterator[Any]:
    """A real InteractiveShell with the extension loaded and a clean namespace."""
    from IPython.core.interactiveshell import InteractiveShell

    ip = InteractiveShell.instance()
    ip.run_line_magic("load_ext", "jupyter_cluster")
    ip.reset(new_session=False)
    yield ip
    ip.reset(new_session=False)


def run(ip: Any, source: str) -> Any:
    """Run ``source`` as a cell; return its ExecutionResult."""
    return ip.run_cell(source, store_history=True)


def remote(ip: Any, body: str, options: str = "") -> Any:
    """Run ``body`` as a ``%%remote`` cell; return its ExecutionResult."""
    return ip.run_cell(f"%%remote {options}\n{body}", store_history=True)


@pytest.fixture
def without_ray() -> Iterator[None]:
    """Ray's modules set aside for the test: another test of this process may have imported Ray itself (as a
    notebook may, to pass Ray Tune objects to jc.tune), so that only what the test does is seen."""
    import sys

    saved = {k: m for k, m in sys.modules.items() if k == "ray" or k.startswith("ray.")}
    for name in saved:
        del sys.modules[name]
    try:
        yield
    finally:
        sys.modules.update(saved)


@pytest.fixture
def sent_ops(cluster: jc.Cluster, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The ops of the requests this test sends to the agent (releases of earlier tests' handles aside)."""
    ops: list[str] = []
    send = cluster._link.request

    def request(op: str, *args: Any, **kwargs: Any) -> Any:
        if op != "release":
            ops.append(op)
        return send(op, *args, **kwargs)

    monkeypatch.setattr(cluster._link, "request", request)
    return ops


@pytest.fixture
def tmp_marker(tmp_path: Any) -> str:
    """A file path the cluster's workers can write (same machine)."""
    path = tmp_path / "marker"
    os.chmod(tmp_path, 0o777)
    return str(path)


# ---------------------------------------------------------------------------------------------- the slow tier


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--runslow",
        action="store_true",
        default=bool(os.environ.get("JUPYTER_CLUSTER_SLOW_TESTS")),
        help="also run the tests marked slow (or set JUPYTER_CLUSTER_SLOW_TESTS=1)",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked ``slow`` run with ``--runslow`` only (dask's convention): each is a minute or more on two cores
    and repeats, at greater depth, a path a quicker test of the default run covers (CONTRIBUTING.md, "The tests")."""
    if config.getoption("--runslow"):
        return
    skip = pytest.mark.skip(reason="slow: run with --runslow (or JUPYTER_CLUSTER_SLOW_TESTS=1 bash scripts/test.sh)")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)
