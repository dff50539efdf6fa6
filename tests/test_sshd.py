"""Smoke tests for the SSH fixtures in ``tests/sshd.py``: the servers, keys, link and namespaces are real."""

# Test parameters named after the fixtures imported below "redefine" those imports:
# ruff: noqa: F811

from __future__ import annotations

import asyncio
import os
import sys
import tempfile
from pathlib import Path

import asyncssh
import pytest

from .sshd import (  # noqa: F401
    LOGIN_FILES,
    CuttableLink,
    SSHHosts,
    SSHKeys,
    SSHServer,
    link_cutter,
    ssh_hosts,
    ssh_keys,
    sshd_server,
)

pytestmark = pytest.mark.timeout(120)


def test_asyncssh_runs_a_command(sshd_server: SSHServer) -> None:
    """asyncssh logs in with the identity, checks the host key against known_hosts, and runs a command."""

    async def main() -> str:
        async with asyncssh.connect(**sshd_server.connect_kwargs()) as conn:
            result = await conn.run("echo hi", check=True, timeout=30)
            return str(result.stdout)

    assert asyncio.run(main()) == "hi\n"


def test_real_ssh_client(sshd_server: SSHServer) -> None:
    """The OpenSSH client runs a command with strict host key checking."""
    proc = sshd_server.ssh("whoami")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "root"


def test_wrong_key_is_refused(sshd_server: SSHServer, tmp_path: Path) -> None:
    """A user key that is not in authorized_keys is refused."""
    other = SSHKeys.generate(tmp_path / "other")

    async def main() -> None:
        kwargs = sshd_server.connect_kwargs() | {"client_keys": [str(other.user_key)]}
        async with asyncssh.connect(**kwargs):
            pass

    with pytest.raises(asyncssh.PermissionDenied):
        asyncio.run(main())


def test_unknown_host_key_is_refused(sshd_server: SSHServer, ssh_keys: SSHKeys, tmp_path: Path) -> None:
    """known_hosts without this server's key (here: another host's key for the same address) is refused."""
    other = SSHKeys.generate(tmp_path / "other")
    known = other.write_known_hosts(tmp_path / "known_hosts", [(sshd_server.host, sshd_server.port)])
    assert ssh_keys.host_key_pub.split()[1] not in known.read_text()

    async def main() -> None:
        async with asyncssh.connect(**(sshd_server.connect_kwargs() | {"known_hosts": str(known)})):
            pass

    with pytest.raises(asyncssh.HostKeyNotVerifiable):
        asyncio.run(main())
    assert sshd_server.ssh("true").returncode == 0


def test_unix_socket_forward(sshd_server: SSHServer) -> None:
    """A Unix-socket connection opened through sshd reaches a local echo server."""

    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while data := await reader.read(1024):
            writer.write(data)
            await writer.drain()
        writer.close()

    async def main(path: str) -> bytes:
        server = await asyncio.start_unix_server(echo, path)
        try:
            async with asyncssh.connect(**sshd_server.connect_kwargs()) as conn:
                reader, writer = await conn.open_unix_connection(path)
                writer.write(b"ping over ssh\n")
                line = await asyncio.wait_for(reader.readline(), 10)
                writer.close()
                return bytes(line)
        finally:
            server.close()
            await server.wait_closed()

    with tempfile.TemporaryDirectory(prefix="jc-sock-") as tmp:
        assert asyncio.run(main(f"{tmp}/echo.sock")) == b"ping over ssh\n"


def test_link_cutter_cut_and_restore(link_cutter: CuttableLink, sshd_server: SSHServer) -> None:
    """Cutting the link drops the live SSH connection and refuses new ones; restoring it lets new ones in."""
    assert link_cutter.known_hosts is not None
    kwargs = sshd_server.connect_kwargs() | {
        "host": link_cutter.host,
        "port": link_cutter.port,
        "known_hosts": str(link_cutter.known_hosts),
    }

    async def main() -> None:
        conn = await asyncssh.connect(**kwargs)
        try:
            assert (await conn.run("echo before", check=True, timeout=30)).stdout == "before\n"
            assert link_cutter.connections == 1
            await asyncio.to_thread(link_cutter.cut)
            assert not link_cutter.listening
            await asyncio.wait_for(conn.wait_closed(), 10)
            with pytest.raises((asyncssh.Error, OSError)):
                await conn.run("echo after", check=True, timeout=10)
        finally:
            conn.close()

        with pytest.raises(OSError):  # ConnectionRefusedError: nothing listens while cut
            await asyncio.wait_for(asyncssh.connect(**kwargs), 10)

        port = link_cutter.port
        await asyncio.to_thread(link_cutter.restore)
        assert link_cutter.port == port
        async with asyncssh.connect(**kwargs) as conn2:
            assert (await conn2.run("echo restored", check=True, timeout=30)).stdout == "restored\n"

    asyncio.run(main())


def test_cuttable_link_refuses_outside_targets() -> None:
    """The link only forwards to loopback or the test subnet."""
    with pytest.raises(ValueError):
        CuttableLink("192.0.2.1", 22)


def test_ssh_hosts_are_separate_hosts(ssh_hosts: SSHHosts) -> None:
    """The real ssh client reaches each namespace host, which sees its own address."""
    for host, addr in ((ssh_hosts.head, "10.213.0.2"), (ssh_hosts.worker, "10.213.0.3")):
        proc = host.ssh("ip -4 -o addr show dev eth0; hostname -I")
        assert proc.returncode == 0, proc.stderr
        assert addr in proc.stdout
        other = "10.213.0.3" if addr == "10.213.0.2" else "10.213.0.2"
        assert other not in proc.stdout
    assert ssh_hosts.head.netns != ssh_hosts.worker.netns
    assert ssh_hosts.head.known_hosts.read_text().count("ssh-ed25519") == 2


def test_a_hosts_login_shell_finds_this_runs_ray(ssh_hosts: SSHHosts) -> None:
    """Ray's cluster launcher runs its commands on a host as ``bash --login -c -i 'source ~/.bashrc; ...'``: there
    ``ray`` and ``python3`` are this test run's (a virtualenv's too), whatever this machine's login files put first;
    and those files themselves are left as they were."""
    before = {
        name: Path(os.path.expanduser(name)).read_bytes()
        for name in LOGIN_FILES
        if Path(os.path.expanduser(name)).is_file()
    }
    here = os.path.dirname(sys.executable)
    for host in ssh_hosts:
        proc = host.ssh("bash --login -c -i 'source ~/.bashrc; command -v ray; command -v python3' 2>/dev/null")
        assert proc.stdout.split() == [f"{here}/ray", f"{here}/python3"], proc.stdout + proc.stderr
    with ssh_hosts.head.login_path("/usr/bin:/bin"):
        proc = ssh_hosts.head.ssh("bash --login -c -i 'source ~/.bashrc; command -v ray' 2>/dev/null")
        assert f"{here}/ray" not in proc.stdout
    after = {name: Path(os.path.expanduser(name)).read_bytes() for name in before}
    assert after == before, "this machine's own login files are unchanged"


def test_worker_reaches_head_sshd(ssh_hosts: SSHHosts) -> None:
    """From inside the worker namespace, the head's sshd port is reachable (worker -> bridge -> head)."""
    proc = ssh_hosts.worker.netns_exec(["bash", "-c", "echo > /dev/tcp/10.213.0.2/22"], timeout=15)
    assert proc.returncode == 0, proc.stderr
    proc = ssh_hosts.worker.ssh("timeout 10 bash -c 'head -c 4 < /dev/tcp/10.213.0.2/22'")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "SSH-"


def test_asyncssh_to_namespace_host(ssh_hosts: SSHHosts) -> None:
    """asyncssh connects to the head by its namespace address with the shared known_hosts."""

    async def main() -> str:
        async with asyncssh.connect(**ssh_hosts.head.connect_kwargs()) as conn:
            return str((await conn.run("cat /proc/net/dev | grep -c eth0", check=True, timeout=30)).stdout)

    assert asyncio.run(main()).strip() == "1"
