"""Every way a link to a remote agent dies, mid-cell, each held down for 45 s or more.

A link can end with a reset (RST), a clean close (FIN: sshd stopped), silence (a
laptop asleep: nothing arrives, nothing closes), or with only the agent's channel
closed while SSH stays up; and it can stay down longer than ``reconnect_for``. In
each case every line the cell prints and its result must arrive exactly once, in
order, and the notebook must be told what happened.

One Ray head (started by hand, token authentication on) serves the module; each test
attaches its own session through its own way of failing, with ``address=`` naming
that head (other Ray clusters run on this machine during the tests).
"""

# Test parameters named after the imported fixtures redefine them, as pytest intends.
# ruff: noqa: F811

from __future__ import annotations

import _thread
import asyncio
import os
import secrets
import shlex
import shutil
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import jupyter_cluster as jc
from jupyter_cluster._cluster import _detached
from jupyter_cluster._connect import StartedRay, _stop_started
from jupyter_cluster._ssh import SSHTarget
from jupyter_cluster.agent._protocol import Frame, read_frame, write_frame

from .conftest import check_exactly_once, counting
from .ray_start import start_head
from .sshd import CuttableLink, SSHKeys, SSHServer, free_port, link_cutter, ssh_keys, sshd_server  # noqa: F401

#: The module's head is started by hand, and may need several tries on a busy machine (tests/ray_start.py).
pytestmark = pytest.mark.timeout(600)

OUTAGE = 45.0
LINES = 100  # a line every 0.5 s: the outage (from 3 s to 48 s) ends a few seconds before the cell
SOURCE = counting(LINES)


def _options(server: SSHServer, known_hosts: Path | None = None) -> dict[str, Any]:
    return {"identity": str(server.identity), "known_hosts": str(known_hosts or server.known_hosts)}


@pytest.fixture(scope="module")
def head(sshd_server: SSHServer) -> Iterator[str]:
    """Ray on the loopback head, started once by hand with token authentication on; yields its address.

    Its ``--temp-dir`` is a folder of its own, not one of ``up``'s (``/tmp/jc-*``): this module
    runs beside the other tests (``scripts/test.sh``), whose ``--start-head`` must not find and
    join it. The token travels as ``up``'s does: the kernel hands its ``RAY_AUTH_TOKEN`` to each
    agent it starts."""
    previous = jc.current()
    token = secrets.token_hex(32)
    temp = tempfile.mkdtemp(prefix="jcl-head-", dir="/tmp")
    environ = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")}
    environ.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=token)
    args = ["--num-cpus", "1", "--disable-usage-stats", "--include-dashboard", "false", "--temp-dir", temp]
    done, address = start_head(args, environ)
    assert address, done.stderr[-2000:]
    session = os.path.basename(os.path.realpath(os.path.join(temp, "session_latest")))
    target = SSHTarget.parse(f"root@{sshd_server.host}:{sshd_server.port}", **_options(sshd_server))
    started = StartedRay(address, session, token, [target])
    saved = os.environ.get("RAY_AUTH_TOKEN")
    os.environ["RAY_AUTH_TOKEN"] = token
    try:
        yield started.address
    finally:
        if saved is None:
            os.environ.pop("RAY_AUTH_TOKEN", None)
        else:
            os.environ["RAY_AUTH_TOKEN"] = saved
        asyncio.run(_stop_started(started))
        shutil.rmtree(temp, ignore_errors=True)
        if previous is not None and previous.alive:
            jc._cluster.attach(previous)


def _attach(host: str, port: int, server: SSHServer, address: str, known_hosts: Path, **kw: Any) -> jc.Cluster:
    return jc.connect(f"root@{host}:{port}", address=address, **_options(server, known_hosts), **kw)


def _link_events(cell: Any) -> list[dict[str, Any]]:
    return [data for event, data in cell._history if event == "link"]


def _hold(seconds: float, cell: Any) -> None:
    time.sleep(seconds)
    assert not cell.done(), "the cell finished while its link was down"


def test_a_reset_link_reconnects_and_loses_nothing(
    link_cutter: CuttableLink, sshd_server: SSHServer, head: str
) -> None:
    assert link_cutter.known_hosts is not None
    cluster = _attach(link_cutter.host, link_cutter.port, sshd_server, head, link_cutter.known_hosts)
    try:
        cell = cluster.run_cell(SOURCE)
        time.sleep(3)
        link_cutter.cut()  # RST both ways, and refuse new connections
        _hold(OUTAGE, cell)
        assert cluster.link["state"] == "reconnecting" and cluster.link["attempts"] >= 3
        assert "reconnecting" in str(cluster.status())
        link_cutter.restore()
        check_exactly_once(cell, LINES)
        assert cluster.link["state"] == "connected"
    finally:
        cluster.down(force=True)


def test_a_reset_link_through_a_command_reconnects_and_loses_nothing(
    link_cutter: CuttableLink, sshd_server: SSHServer, head: str
) -> None:
    """``--via`` with OpenSSH's own client through the same cut link: the client exits with the link, each try to
    run it again fails while the link refuses, and the first that gets through resumes the session, as the
    asyncssh link does."""
    assert link_cutter.known_hosts is not None
    client = ["ssh", "-F", "/dev/null", "-i", str(sshd_server.identity), "-p", str(link_cutter.port)]
    client += ["-o", f"UserKnownHostsFile={link_cutter.known_hosts}", "-o", "StrictHostKeyChecking=yes"]
    client += ["-o", "BatchMode=yes", "-o", "IdentitiesOnly=yes", f"root@{link_cutter.host}"]
    cluster = jc.connect(via=shlex.join(client), address=head)
    try:
        cell = cluster.run_cell(SOURCE)
        time.sleep(3)
        link_cutter.cut()
        _hold(OUTAGE, cell)
        assert cluster.link["state"] == "reconnecting" and cluster.link["attempts"] >= 3
        link_cutter.restore()
        check_exactly_once(cell, LINES)
        assert cluster.link["state"] == "connected"
    finally:
        link_cutter.restore()
        cluster.down(force=True)


def test_a_cell_that_ends_during_the_outage_still_hears_the_link_come_back(
    link_cutter: CuttableLink, sshd_server: SSHServer, head: str
) -> None:
    """Its end and last lines are replayed after the reconnect; "reconnected" must come first (the notebook
    showed "lost… reconnecting…" and nothing after it)."""
    assert link_cutter.known_hosts is not None
    cluster = _attach(link_cutter.host, link_cutter.port, sshd_server, head, link_cutter.known_hosts)
    try:
        cell = cluster.run_cell("import time\nfor i in range(8):\n    print(i, flush=True)\n    time.sleep(0.5)\nn = 8")
        time.sleep(1.5)
        link_cutter.cut()
        time.sleep(8)  # the cell ends on the cluster meanwhile
        assert not cell.done()
        link_cutter.restore()
        assert cell.result(60).outputs["n"] == 8
        assert cell.stdout.split() == [str(i) for i in range(8)], "a line was lost or repeated"
        events = [e if e != "link" else d["state"] for e, d in cell._history if e in ("link", "done")]
        assert events == ["lost", "reconnected", "done"], events
    finally:
        link_cutter.restore()
        cluster.down(force=True)


def test_a_cleanly_closed_link_reconnects(ssh_keys: SSHKeys, tmp_path: Path, head: str) -> None:
    """sshd stopped, its per-connection processes ended (FIN, not RST), started again 45 s later on the same port."""
    server = SSHServer(ssh_keys, tmp_path / "sshd").start()
    try:
        cluster = _attach(server.host, server.port, server, head, server.known_hosts)
        try:
            cell = cluster.run_cell(SOURCE)
            time.sleep(3)
            server.stop_cleanly()
            _hold(OUTAGE, cell)
            reason = _link_events(cell)[0]["reason"]
            assert "Reset" not in reason, f"expected a clean close, got {reason}"
            server.start(port=server.port)
            check_exactly_once(cell, LINES)
        finally:
            cluster.down(force=True)
    finally:
        server.stop()


def test_a_silent_link_is_noticed_and_reconnected(link_cutter: CuttableLink, sshd_server: SSHServer, head: str) -> None:
    """Nothing closes and nothing arrives: the keepalive notices, and the link comes back when bytes flow again."""
    assert link_cutter.known_hosts is not None
    cluster = _attach(link_cutter.host, link_cutter.port, sshd_server, head, link_cutter.known_hosts, keepalive=10)
    try:
        cell = cluster.run_cell(SOURCE)
        time.sleep(3)
        link_cutter.freeze()
        frozen = time.monotonic()
        deadline = frozen + 25
        while not _link_events(cell) and time.monotonic() < deadline:
            time.sleep(0.2)
        noticed = time.monotonic() - frozen
        assert _link_events(cell), "a silent link was not noticed within 25 s"
        assert noticed <= 10 + 5, f"noticed after {noticed:.1f} s with keepalive=10"
        _hold(OUTAGE - noticed, cell)
        agent_log = Path.home() / ".jupyter_cluster" / "sessions" / cluster.session / "agent.log"
        assert "no word from the kernel" in agent_log.read_text(), "the agent did not notice the silent kernel"
        link_cutter.thaw()
        check_exactly_once(cell, LINES)
    finally:
        cluster.down(force=True)


def test_the_agent_channel_closing_while_ssh_stays_up(sshd_server: SSHServer, head: str, tmp_path: Path) -> None:
    """The agent ends the kernel's channel (another connection took the session) and its socket is away for 45 s;
    SSH itself never drops."""
    cluster = _attach(sshd_server.host, sshd_server.port, sshd_server, head, sshd_server.known_hosts)
    socket_path = cluster._link.transport.socket_path  # type: ignore[attr-defined]
    away = socket_path + ".away"
    ssh_conn = cluster._link.transport.conn  # type: ignore[attr-defined]

    async def take_the_session() -> asyncio.StreamWriter:
        reader, writer = await asyncio.open_unix_connection(away)
        hello = {"type": "hello", "secret": cluster._link.secret, "session": cluster.session, "last_seq": 0}
        write_frame(writer, Frame(hello))
        assert (await asyncio.wait_for(read_frame(reader), 10)).type == "welcome"
        return writer

    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, daemon=True).start()
    try:
        cell = cluster.run_cell(SOURCE)
        time.sleep(3)
        os.rename(socket_path, away)  # new channels find no socket: "Connect failed"
        thief = asyncio.run_coroutine_threadsafe(take_the_session(), loop).result(20)
        _hold(OUTAGE, cell)
        assert cluster.link["state"] == "reconnecting"
        os.rename(away, socket_path)
        check_exactly_once(cell, LINES)
        assert cluster._link.transport.conn is ssh_conn, "SSH was reconnected, though it never dropped"  # type: ignore[attr-defined]
        loop.call_soon_threadsafe(thief.close)
    finally:
        if os.path.exists(away):
            os.rename(away, socket_path)
        loop.call_soon_threadsafe(loop.stop)
        cluster.down(force=True)


@pytest.mark.slow
def test_an_outage_longer_than_reconnect_for(
    link_cutter: CuttableLink, sshd_server: SSHServer, head: str, shell: Any
) -> None:
    """The cell ends with an error naming the session, the namespace is intact, and resuming binds the result."""
    assert link_cutter.known_hosts is not None
    previous = jc.current()
    target = f"root@{link_cutter.host}:{link_cutter.port}"
    options = f"--identity {sshd_server.identity} --known-hosts {link_cutter.known_hosts}"
    shell.run_cell(f"%cluster connect {target} --address {head} --reconnect-for 25 {options}")
    cluster = jc.current()
    assert cluster is not None and cluster.kind.startswith("ssh")
    session = cluster.session
    try:
        shell.user_ns["kept"] = "before"
        threading.Timer(3, link_cutter.cut).start()
        started = time.monotonic()
        outcome = shell.run_cell("%%remote\n" + SOURCE.replace(str(LINES), "40"))
        waited = time.monotonic() - started
        error = outcome.error_in_exec
        assert isinstance(error, jc.LinkLostError), repr(error)
        assert 25 <= waited < 60, f"gave up after {waited:.0f} s with reconnect_for=25"
        assert session in str(error) and f"--session {session}" in str(error)
        assert shell.user_ns["kept"] == "before" and "n" not in shell.user_ns
        assert jc.current() is None and _detached.get(session) is cluster
        time.sleep(max(0.0, OUTAGE - (time.monotonic() - started - 3)))
        link_cutter.restore()
        shell.run_cell(f"%cluster connect {target} --session {session} {options}")
        assert jc.current() is cluster
        assert shell.user_ns.get("n") == 40, "what finished while the link was down was not bound on resume"
        assert shell.run_cell("%%remote\nm = n + 1").success and shell.user_ns["m"] == 41
    finally:
        link_cutter.restore()
        cluster.down(force=True)
        if previous is not None and previous.alive:
            jc._cluster.attach(previous)


@pytest.mark.parametrize("on_interrupt", ["cancel", "keep"])
def test_interrupting_while_the_link_is_down(
    link_cutter: CuttableLink, sshd_server: SSHServer, head: str, shell: Any, on_interrupt: str
) -> None:
    """The wait ends at once with a message; the cell is cancelled when the link returns, or ("keep") goes on and
    its outputs are bound then."""
    assert link_cutter.known_hosts is not None
    previous = jc.current()
    cluster = _attach(
        link_cutter.host, link_cutter.port, sshd_server, head, link_cutter.known_hosts, on_interrupt=on_interrupt
    )
    try:
        threading.Timer(2, link_cutter.cut).start()
        threading.Timer(6, _thread.interrupt_main).start()
        started = time.monotonic()
        outcome = shell.run_cell("%%remote\nimport time\nfor i in range(30):\n    time.sleep(0.5)\ndone = 'yes'")
        waited = time.monotonic() - started
        assert isinstance(outcome.error_in_exec, KeyboardInterrupt)
        assert waited < 8, f"the interrupted wait took {waited:.1f} s"
        (cell,) = [c for c in list(cluster.cells.values()) if "done = 'yes'" in c.spec.source]
        assert not cell.done()
        time.sleep(5)
        link_cutter.restore()
        if on_interrupt == "cancel":
            assert isinstance(cell.exception(60), KeyboardInterrupt), (
                "the cell was not cancelled when the link came back"
            )
            assert time.monotonic() - started < 25, "cancelled only when it would have finished anyway"
            assert "done" not in shell.user_ns
        else:
            assert cell.result(60).outputs["done"] == "yes"
            assert shell.user_ns.get("done") == "yes"
        assert not cluster.status().data["cells"], "a cell is still running on the cluster"  # type: ignore[index]
    finally:
        link_cutter.restore()
        cluster.down(force=True)
        if previous is not None and previous.alive:
            jc._cluster.attach(previous)


def test_interrupting_as_the_link_goes_silent(
    link_cutter: CuttableLink, sshd_server: SSHServer, head: str, shell: Any
) -> None:
    """An interrupt that comes while the link still counts as up, though it has gone silent: the cancel is sent
    into the silence, and the wait for the cell to stop ends once the keepalive finds the link down (not when
    the link is back); the cancel goes through then."""
    assert link_cutter.known_hosts is not None
    previous = jc.current()
    cluster = _attach(link_cutter.host, link_cutter.port, sshd_server, head, link_cutter.known_hosts, keepalive=4)
    thaw = threading.Timer(25, link_cutter.thaw)  # a wait that never ends without the link fails, not hangs
    try:
        threading.Timer(2, link_cutter.freeze).start()
        threading.Timer(2.5, _thread.interrupt_main).start()
        thaw.start()
        started = time.monotonic()
        outcome = shell.run_cell("%%remote\nimport time\nfor i in range(40):\n    time.sleep(0.5)\ndone = 'yes'")
        waited = time.monotonic() - started
        assert isinstance(outcome.error_in_exec, KeyboardInterrupt)
        assert "went down as" in str(outcome.error_in_exec) and cluster.session in str(outcome.error_in_exec)
        assert waited < 15, f"the interrupted wait took {waited:.1f} s with keepalive=4"
        (cell,) = [c for c in list(cluster.cells.values()) if "done = 'yes'" in c.spec.source]
        assert not cell.done()
        link_cutter.thaw()
        assert isinstance(cell.exception(60), KeyboardInterrupt), "the cancel sent into the silence was lost"
        assert "done" not in shell.user_ns
        assert not cluster.status().data["cells"], "a cell is still running on the cluster"  # type: ignore[index]
    finally:
        thaw.cancel()
        link_cutter.thaw()
        cluster.down(force=True)
        if previous is not None and previous.alive:
            jc._cluster.attach(previous)
