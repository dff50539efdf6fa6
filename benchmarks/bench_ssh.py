"""Cells over SSH side by side with the embedded cluster, raw Ray, Ray Client and ipyparallel.

One run starts a real ``sshd`` on loopback (the test suite's helper, generated keys), attaches
over it with ``--start-head`` (Ray's token authentication on, as a user would), and starts an
embedded cluster and a one-engine ipyparallel cluster beside it. Then, in alternating rounds:

- trivial task and actor cells (``z = 1``) over SSH and through the embedded cluster;
- raw ``ray.get(f.remote())`` / ``ray.get(actor.m.remote())`` from a local driver on the SSH head;
- the same calls through Ray Client (``ray://``, the head's client server);
- ipyparallel's ``%px z = 1`` (what the magic runs: ``view.execute(code, block=True)``);
- 256 MB of numpy sent to the head as a cell input and fetched back (``jc.get``), against
  ``ssh host 'cat > /dev/null'`` with the same bytes and Ray Client's ``ray.put``.

Run: ``python benchmarks/bench_ssh.py [--rounds 3]`` (root, ``openssh-server``, ``ipyparallel``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.sshd import SSHKeys, SSHServer, free_port  # noqa: E402

MB = 1 << 20

DRIVER = r"""
import json, os, sys, time
import numpy as np
import ray
address, n, nbytes = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
ray.init(address=address, log_to_driver=False)

@ray.remote
def f():
    return 1

@ray.remote
class Actor:
    def m(self):
        return 1

actor = Actor.remote()
for _ in range(20):
    ray.get(f.remote()); ray.get(actor.m.remote())
out = {}
t = time.perf_counter()
for _ in range(n):
    ray.get(f.remote())
out["task"] = (time.perf_counter() - t) / n
t = time.perf_counter()
for _ in range(n):
    ray.get(actor.m.remote())
out["actor"] = (time.perf_counter() - t) / n
if nbytes:
    data = np.random.default_rng(0).integers(0, 255, nbytes, dtype=np.uint8)
    t = time.perf_counter()
    ref = ray.put(data)
    ray.wait([ref])
    out["put"] = nbytes / (time.perf_counter() - t)
    t = time.perf_counter()
    back = ray.get(ref)
    out["get"] = nbytes / (time.perf_counter() - t)
    assert back.nbytes == nbytes
print(json.dumps(out))
"""


def driver(address: str, n: int, nbytes: int, env: dict[str, str]) -> dict[str, float]:
    """Round trips (and a put/get of ``nbytes``) from a fresh Ray driver process at ``address``."""
    done = subprocess.run(
        [sys.executable, "-c", DRIVER, address, str(n), str(nbytes)],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        timeout=600,
    )
    if done.returncode:
        raise RuntimeError(f"driver at {address} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def cells(cluster: Any, n: int) -> dict[str, float]:
    for _ in range(20):
        cluster.run_cell("z = 1").result()
        cluster.run_cell("z = 1", mode="actor", actor="bench").result()
    out = {}
    t = time.perf_counter()
    for _ in range(n):
        cluster.run_cell("z = 1").result()
    out["task"] = (time.perf_counter() - t) / n
    t = time.perf_counter()
    for _ in range(n):
        cluster.run_cell("z = 1", mode="actor", actor="bench").result()
    out["actor"] = (time.perf_counter() - t) / n
    return out


def shipping(cluster: Any, data: Any) -> dict[str, float]:
    """Send ``data`` to the head as a cell input, keep it there, then fetch it back."""
    import numpy as np

    t = time.perf_counter()
    result = cluster.run_cell("y = x[::-1]", namespace={"x": data}).result()
    there = time.perf_counter() - t
    handle = result.outputs["y"]
    t = time.perf_counter()
    back = cluster.get(handle)
    home = time.perf_counter() - t
    assert back.nbytes == data.nbytes and back[0] == data[-1] and np.array_equal(back[:4096], data[::-1][:4096])
    return {"send": data.nbytes / there, "fetch": data.nbytes / home}


def ssh_cat(server: SSHServer, payload: Path) -> float:
    """Throughput of ``ssh host 'cat > /dev/null' < payload`` (bytes/s)."""
    with payload.open("rb") as stdin:
        t = time.perf_counter()
        subprocess.run(server.ssh_argv("cat > /dev/null"), stdin=stdin, check=True, timeout=300)
        return payload.stat().st_size / (time.perf_counter() - t)


def ipyparallel_px(view: Any, n: int) -> float:
    for _ in range(20):
        view.execute("z = 1", block=True)
    t = time.perf_counter()
    for _ in range(n):
        view.execute("z = 1", block=True)
    return (time.perf_counter() - t) / n


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("-n", type=int, default=200, help="round trips per measurement")
    parser.add_argument("--mb", type=int, default=256, help="size of the shipped array")
    args = parser.parse_args()

    import ipyparallel as ipp
    import numpy as np

    import jupyter_cluster as jc

    nbytes = args.mb * MB
    data = np.random.default_rng(0).integers(0, 255, nbytes, dtype=np.uint8)
    rounds: dict[str, dict[str, list[float]]] = {}

    def record(who: str, values: dict[str, float]) -> None:
        for key, value in values.items():
            rounds.setdefault(who, {}).setdefault(key, []).append(value)

    with tempfile.TemporaryDirectory(prefix="jc-bench-ssh-") as tmp:
        keys = SSHKeys.generate(Path(tmp) / "keys")
        payload = Path(tmp) / "payload.bin"
        payload.write_bytes(data.tobytes())
        client_port = free_port()
        with SSHServer(keys, Path(tmp) / "sshd") as server:
            remote = jc.connect(
                f"{server.user}@{server.host}:{server.port}",
                identity=str(server.identity),
                known_hosts=str(server.known_hosts),
                start_head=True,
                port=free_port(),
            )
            assert remote.started is not None
            env = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": remote.started.token}
            address = remote.started.address
            local = jc.local(cpus=2)
            ipp_cluster = ipp.Cluster(n=1, log_level=40)
            rc = ipp_cluster.start_and_connect_sync()
            # Ray Client needs its own server; ``ray start`` left it off (no --ray-client-server-port).
            client_server = subprocess.Popen(
                [sys.executable, "-m", "ray.util.client.server", f"--address={address}", "--host=127.0.0.1",
                 f"--port={client_port}", "--mode=proxy"],
                env={**os.environ, **env},
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            try:
                time.sleep(5)
                for _ in range(args.rounds):
                    record("ssh", cells(remote, args.n))
                    record("ssh", shipping(remote, data))
                    record("local", cells(local, args.n))
                    record("raw", driver(address, args.n, 0, env))
                    record("client", driver(f"ray://127.0.0.1:{client_port}", args.n, nbytes, env))
                    record("ipp", {"task": ipyparallel_px(rc[:], args.n)})
                    record("cat", {"send": ssh_cat(server, payload)})
            finally:
                client_server.terminate()
                ipp_cluster.stop_cluster_sync()
                local.down()
                remote.down()

    med = {who: {k: statistics.median(v) for k, v in d.items()} for who, d in rounds.items()}
    print(json.dumps(med, indent=1), file=sys.stderr)
    ms = {who: {k: v * 1e3 for k, v in d.items() if k in ("task", "actor")} for who, d in med.items()}
    print(f"{'round trip (ms)':16s} {'SSH':>7s} {'embedded':>9s} {'raw Ray':>8s} {'Ray Client':>11s} {'%px':>7s}")
    for key in ("task", "actor"):
        row = [ms[w].get(key) for w in ("ssh", "local", "raw", "client", "ipp")]
        print(f"{key + ' cell':16s} " + " ".join(f"{v:>{w}.2f}" if v else f"{'':>{w}s}" for v, w in zip(row, (7, 9, 8, 11, 7))))
    print()
    ssh, raw, client = ms["ssh"], ms["raw"], ms["client"]
    print(f"SSH actor cell / raw Ray actor call:   {ssh['actor'] / raw['actor']:6.2f}   target <= 1.5")
    print(f"Ray Client actor call / SSH actor cell: {client['actor'] / ssh['actor']:6.2f}   target >= 3")
    print(f"SSH task cell / raw Ray task:          {ssh['task'] / raw['task']:6.2f}")
    print(f"Ray Client task / SSH task cell:        {client['task'] / ssh['task']:6.2f}")
    print(f"%px / SSH task cell:                    {ms['ipp']['task'] / ssh['task']:6.2f}")
    print()
    s, c, cat = med["ssh"], med["client"], med["cat"]["send"]
    print(f"{args.mb} MB over SSH (MB/s): to the head {s['send'] / MB:.0f}, back {s['fetch'] / MB:.0f}; "
          f"ssh cat {cat / MB:.0f}; Ray Client put {c['put'] / MB:.0f}, get {c['get'] / MB:.0f}")
    both = 2 / (1 / s["send"] + 1 / s["fetch"])
    print(f"to the head and back / ssh cat:        {both / cat:6.2f}   target >= 0.7")
    print(f"to the head / Ray Client put:          {s['send'] / c['put']:6.2f}   target >= 5")
    print(f"back / Ray Client get:                 {s['fetch'] / c['get']:6.2f}")


if __name__ == "__main__":
    main()
