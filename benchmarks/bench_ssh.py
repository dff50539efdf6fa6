"""Cells over SSH side by side with the embedded cluster, raw Ray, Ray Client and ipyparallel.

One run measures, each over the same number of round trips:

- trivial task and actor cells (``z = 1``) through the embedded cluster, on its own;
- ipyparallel's ``%px z = 1`` on one local engine (what the magic runs:
  ``view.execute(code, block=True)``), on its own;
- then, on a real ``sshd`` on loopback (the test suite's helper, generated keys) attached with
  ``--start-head`` (Ray's token authentication on, as a user would), in alternating rounds:
  the same cells over SSH; raw ``ray.get(f.remote())`` / ``ray.get(actor.m.remote())`` from a
  driver on that head; the same calls through Ray Client (``ray://``, the client server
  ``ray start`` runs at 10001); 256 MB of numpy sent to the head as a cell input and the
  cell's result fetched back (``jc.get``), against ``ssh host 'cat > /dev/null'`` with the
  same bytes and Ray Client's ``ray.put`` / ``ray.get``. That head is this machine, so the
  array goes twice a round: over SSH with the kernel's shared memory turned off
  (``JUPYTER_CLUSTER_SHARED_MEMORY=0``, as a head on another host), and through the shared
  memory the head's agent can open (:mod:`jupyter_cluster.agent._shared`).

Run: ``python benchmarks/bench_ssh.py [--rounds 3] [--values-only]`` (root, ``openssh-server``;
``pip install -e ".[bench]"`` for ipyparallel).
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

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]

from _timing import cells, driver  # noqa: E402

from tests.sshd import SSHKeys, SSHServer, free_port  # noqa: E402

MB = 1 << 20


def shipping(cluster: Any, data: Any) -> dict[str, float]:
    """Send ``data`` to the head as a cell input (the cell adds one: the result stays there), then fetch it."""
    import numpy as np

    data[:1] += 1  # new content each round: an input the agent already holds is not sent again
    t = time.perf_counter()
    result = cluster.run_cell("y = x + 1", namespace={"x": data}).result()
    there = time.perf_counter() - t
    handle = result.outputs["y"]
    t = time.perf_counter()
    back = cluster.get(handle)
    home = time.perf_counter() - t
    assert back.nbytes == data.nbytes and np.array_equal(back[::4096], data[::4096] + 1)
    return {"send": data.nbytes / there, "fetch": data.nbytes / home}


def sharing(cluster: Any, on: bool) -> None:
    """Reconnect ``cluster`` with its kernel's shared memory offered, or not (``JUPYTER_CLUSTER_SHARED_MEMORY``).

    This head is this machine: its agent can open the kernel's segments, and large values skip the SSH link. The
    SSH path is measured with them off, and the same-host path beside it with them on.
    """
    os.environ["JUPYTER_CLUSTER_SHARED_MEMORY"] = "1" if on else "0"
    link = cluster._link
    link.drop_connection()
    deadline = time.monotonic() + 60
    while not (link.state == "connected" and link.shared == on):
        if time.monotonic() > deadline:
            raise RuntimeError(f"the link did not come back with shared memory {'on' if on else 'off'}")
        time.sleep(0.05)


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
    parser.add_argument("--values-only", action="store_true", help="only the shipped array and ssh cat")
    args = parser.parse_args()

    import numpy as np

    import jupyter_cluster as jc

    nbytes = args.mb * MB
    data = np.random.default_rng(0).integers(0, 255, nbytes, dtype=np.uint8)
    rounds: dict[str, dict[str, list[float]]] = {}

    def record(who: str, values: dict[str, float]) -> None:
        for key, value in values.items():
            rounds.setdefault(who, {}).setdefault(key, []).append(value)

    # The embedded cluster and ipyparallel each run alone (two Ray clusters and an
    # ipcluster idling on two cores slow everything down); SSH, raw Ray and Ray Client
    # share the SSH head, in alternating rounds.
    if not args.values_only:
        local = jc.local(cpus=2)
        try:
            for _ in range(args.rounds):
                record("local", cells(local, args.n))
        finally:
            local.down()
        import ipyparallel as ipp

        ipp_cluster = ipp.Cluster(n=1, log_level=40)
        rc = ipp_cluster.start_and_connect_sync()
        try:
            for _ in range(args.rounds):
                record("ipp", {"task": ipyparallel_px(rc[:], args.n)})
        finally:
            ipp_cluster.stop_cluster_sync()

    with tempfile.TemporaryDirectory(prefix="jc-bench-ssh-") as tmp:
        keys = SSHKeys.generate(Path(tmp) / "keys")
        payload = Path(tmp) / "payload.bin"
        payload.write_bytes(data.tobytes())
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
            try:
                for _ in range(args.rounds):
                    if not args.values_only:
                        record("ssh", cells(remote, args.n))
                    sharing(remote, False)
                    record("ssh", shipping(remote, data))
                    sharing(remote, True)
                    record("same host", shipping(remote, data))
                    if args.values_only:
                        record("cat", {"send": ssh_cat(server, payload)})
                        continue
                    record("raw", driver(remote.started.address, args.n, env=env))
                    record("client", driver(f"ray://{server.host}:10001", args.n, nbytes=nbytes, env=env))
                    record("cat", {"send": ssh_cat(server, payload)})
            finally:
                remote.down()

    med = {who: {k: statistics.median(v) for k, v in d.items()} for who, d in rounds.items()}
    print(json.dumps(rounds), file=sys.stderr)  # every round, for the spread
    s, cat, same = med["ssh"], med["cat"]["send"], med["same host"]
    both = 2 / (1 / s["send"] + 1 / s["fetch"])
    print(
        f"{args.mb} MB over SSH (MB/s): to the head {s['send'] / MB:.0f}, back {s['fetch'] / MB:.0f}; "
        f"ssh cat {cat / MB:.0f}"
    )
    print(f"to the head and back / ssh cat:        {both / cat:6.2f}   target >= 0.9")
    print(
        f"{args.mb} MB to the same-host head in shared memory (MB/s): to the head {same['send'] / MB:.0f}, "
        f"back {same['fetch'] / MB:.0f}"
    )
    if args.values_only:
        return
    ms = {who: {k: v * 1e3 for k, v in d.items() if k in ("task", "actor")} for who, d in med.items()}
    print(f"{'round trip (ms)':16s} {'SSH':>7s} {'embedded':>9s} {'raw Ray':>8s} {'Ray Client':>11s} {'%px':>7s}")
    for key in ("task", "actor"):
        row = [ms[w].get(key) for w in ("ssh", "local", "raw", "client", "ipp")]
        print(
            f"{key + ' cell':16s} "
            + " ".join(f"{v:>{w}.2f}" if v else f"{'':>{w}s}" for v, w in zip(row, (7, 9, 8, 11, 7)))
        )
    print()
    ssh, raw, client = ms["ssh"], ms["raw"], ms["client"]
    print(f"SSH actor cell / raw Ray actor call:   {ssh['actor'] / raw['actor']:6.2f}   target <= 1.5")
    print(f"Ray Client actor call / SSH actor cell: {client['actor'] / ssh['actor']:6.2f}   target >= 3")
    print(f"SSH task cell / raw Ray task:          {ssh['task'] / raw['task']:6.2f}")
    print(f"Ray Client task / SSH task cell:        {client['task'] / ssh['task']:6.2f}")
    print(f"%px / SSH task cell:                    {ms['ipp']['task'] / ssh['task']:6.2f}")
    print()
    c = med["client"]
    print(f"Ray Client put {c['put'] / MB:.0f} MB/s, get {c['get'] / MB:.0f} MB/s")
    print(f"to the head / Ray Client put:          {s['send'] / c['put']:6.2f}   target >= 5")
    print(f"back / Ray Client get:                 {s['fetch'] / c['get']:6.2f}")


if __name__ == "__main__":
    main()
