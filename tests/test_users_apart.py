"""Two Unix users on one host, each with an embedded cluster: neither reaches into the other's.

User A (``jc-hub-ann``) starts ``jc.local()`` in a Python of their own and says where its parts are: the agent's
socket and folder (Ray's session files, logs and spilled objects are in it), A's Ray token file and the GCS's
address. Then, as user B (``jc-hub-bob``), a probe tries each way in and reports what happened:

* connect to A's agent socket;
* list or read A's folder: the socket's folder, Ray's session files and logs in it;
* read A's Ray token;
* attach as this product does (the agent's socket, and the session's secret, which only A's agent process holds
  in its environment: ``/proc/PID/environ``);
* join A's Ray as a driver (``ray.init(address=...)``) with a token of B's own: Ray's token stops it. (Ray's
  servers listen on every interface: ``tests/test_ports.py``. The token is what keeps B out, so the agent keeps it
  0600 in a 0700 ``~/.ray``: Ray 2.60 writes it readable by all.)

Each must fail, and for the reason expected (permission, or Ray's authentication), not by chance.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest

from .unix_users import as_user, make_user, this_python_reachable

pytestmark = pytest.mark.timeout(600)

A, B = "jc-hub-ann", "jc-hub-bob"

#: User A's cluster: started, described on one line of JSON, held until stdin closes.
START = """
import json, os, sys
import jupyter_cluster as jc
cluster = jc.local(cpus=1)
agent = cluster._agent
token = os.path.expanduser("~/.ray/auth_token")
print(json.dumps({
    "socket": agent.socket,
    "folder": agent.folder,
    "gcs": agent.ready.get("gcs"),
    "pid": agent.process.pid,
    "token": token if os.path.exists(token) else None,
    "ray_files": sorted(os.listdir(os.path.join(agent.folder, "ray")))[:5],
    "answer": cluster.run_cell("answer = 6 * 7\\nanswer").result().value,
}), flush=True)
sys.stdin.read()
cluster.down()
"""

#: What user B tries, each attempt's outcome as ``[ok, what happened]``.
PROBE = """
import json, os, socket, sys
a = json.loads(sys.argv[1]) if len(sys.argv) > 1 else json.loads(sys.stdin.readline())
out = {}
def attempt(name, fn):
    try:
        out[name] = [True, repr(fn())[:300]]
    except BaseException as exc:
        said, cause = [], exc
        while cause is not None:  # the whole chain: Ray's ConnectionError says why only in its cause
            said.append(f"{type(cause).__name__}: {cause}"[:3000])
            cause = cause.__cause__
        out[name] = [False, " <- ".join(said)]
def connect():
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(5)
    s.connect(a["socket"])
    return "connected"
attempt("socket", connect)
attempt("list folder", lambda: os.listdir(a["folder"]))
attempt("read log", lambda: open(os.path.join(a["folder"], "agent.log")).read(100))
attempt("ray files", lambda: os.listdir(os.path.join(a["folder"], "ray")))
attempt("token", lambda: open(a["token"]).read())
attempt("secret", lambda: open(f"/proc/{a['pid']}/environ", "rb").read().count(b"JUPYTER_CLUSTER_SECRET"))
def join(token_mode):
    os.environ["RAY_AUTH_MODE"] = token_mode
    os.environ["RAY_AUTH_TOKEN"] = "0" * 64  # a token of B's own: not A's cluster's
    import ray
    ray.init(address=a["gcs"], log_to_driver=False)
    return ray.get(ray.remote(lambda: 42).remote(), timeout=60)
attempt("ray driver", lambda: join("token"))
print(json.dumps(out), flush=True)
"""


@pytest.fixture(scope="module")
def ann() -> Iterator[dict[str, Any]]:
    if os.geteuid() != 0:
        pytest.skip("two Unix users are made for this test (useradd): root only")
    for name in (A, B):
        make_user(name)
    with this_python_reachable():
        process = as_user(A, START, stdin=subprocess.PIPE)
        try:
            assert process.stdout is not None
            line = process.stdout.readline()
            if not line:
                raise AssertionError(
                    "user A's cluster did not start:\n" + (process.stderr.read() if process.stderr else "")
                )
            yield json.loads(line)
        finally:
            if process.stdin is not None:
                process.stdin.close()
            try:
                process.wait(timeout=120)
            except subprocess.TimeoutExpired:
                process.kill()
            subprocess.run(["pkill", "-KILL", "-u", A], check=False)


def test_user_b_reaches_nothing_of_user_a_s_embedded_cluster(ann: dict[str, Any]) -> None:
    assert ann["answer"] == 42, ann  # A's cluster runs
    assert ann["token"] is not None and ann["ray_files"], ann  # A's token and Ray's files exist, to be refused
    with this_python_reachable():
        probe = as_user(B, PROBE, stdin=subprocess.PIPE)
        out, err = probe.communicate(json.dumps(ann) + "\n", timeout=300)
    assert probe.returncode == 0, err[-3000:]
    tried = json.loads(out.strip().splitlines()[-1])
    print(json.dumps(tried, indent=1))
    refused = {name: outcome for name, outcome in tried.items() if not outcome[0]}
    assert set(refused) == set(tried), f"user B got in: {json.dumps(tried, indent=1)}"
    for name in ("socket", "list folder", "read log", "ray files", "token", "secret"):
        assert "PermissionError" in refused[name][1], (name, refused[name])
    assert "AuthenticationError" in refused["ray driver"][1], refused["ray driver"]  # Ray's token stops B


def test_ray_s_token_for_the_embedded_cluster_is_its_owner_s_only(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ray 2.60 writes the token of a new local cluster with the umask (0644, in a 0755 ``~/.ray``): the agent
    makes it first, 0600 in a 0700 folder, and closes an existing one to others."""
    from jupyter_cluster.agent._main import private_token

    monkeypatch.setenv("HOME", str(tmp_path))
    for name in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"):
        monkeypatch.delenv(name, raising=False)
    private_token()
    token = tmp_path / ".ray" / "auth_token"
    assert len(token.read_text()) >= 32
    assert token.stat().st_mode & 0o777 == 0o600 and (tmp_path / ".ray").stat().st_mode & 0o777 == 0o700
    kept = token.read_text()
    token.chmod(0o644)
    (tmp_path / ".ray").chmod(0o755)
    private_token()
    assert token.read_text() == kept  # the user's token is kept, closed
    assert token.stat().st_mode & 0o777 == 0o600 and (tmp_path / ".ray").stat().st_mode & 0o777 == 0o700
