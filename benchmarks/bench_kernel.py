"""Cells through a real Jupyter kernel, as a notebook runs them, against raw Ray in the same kernel.

A real ``ipykernel`` (``jupyter_client``) loads the extension and starts the embedded
cluster; the same kernel also imports Ray and attaches a plain driver to that cluster.
Each round then times, from the client's side (``execute_request`` to
``execute_reply``), interleaved one after the other:

- ``%%remote`` + ``z = 1`` (a Ray task) against ``z = ray.get(f.remote())``;
- ``%%remote --actor bench --out z`` + ``z = 1`` against ``z = ray.get(a.m.remote())``;
- an empty cell (``pass``): what the kernel itself costs.

Run: ``python benchmarks/bench_kernel.py [-n 200] [--rounds 3]``.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

SETUP_RAW = """
import os
os.environ.setdefault("RAY_AUTH_MODE", "token")  # the embedded cluster keeps Ray's token authentication on
import ray
ray.init(address=_jc_address, log_to_driver=False, namespace="bench-raw")

@ray.remote
def f():
    return 1

@ray.remote
class A:
    def m(self):
        return 1

a = A.remote()
ray.get([f.remote(), a.m.remote()])
"""

CELLS = {
    "task": ("%%remote\nz = 1", "z = ray.get(f.remote())"),
    "actor": ("%%remote --actor bench --out z\nz = 1", "z = ray.get(a.m.remote())"),
}


def execute(client: Any, code: str, timeout: float = 120.0) -> float:
    """Run ``code``; seconds from sending the request to its reply. Raises if the cell failed."""
    start = time.perf_counter()
    msg_id = client.execute(code, store_history=False)
    while True:
        reply = client.get_shell_msg(timeout=timeout)
        if reply["parent_header"].get("msg_id") == msg_id:
            break
    elapsed = time.perf_counter() - start
    if reply["content"]["status"] != "ok":
        raise RuntimeError(f"{code!r} failed: {reply['content'].get('ename')}: {reply['content'].get('evalue')}")
    while True:  # keep the iopub queue short
        try:
            client.get_iopub_msg(timeout=0)
        except Exception:
            break
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-n", type=int, default=200, help="cells of each kind per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--cpus", type=int, default=2)
    args = parser.parse_args()

    from jupyter_client.manager import start_new_kernel

    manager, client = start_new_kernel(kernel_name="python3")
    try:
        execute(client, f"%load_ext jupyter_cluster\n%cluster local --cpus {args.cpus}", timeout=300)
        execute(client, "%%remote --driver --out _jc_address\n_jc_address = ray.get_runtime_context().gcs_address")
        execute(client, SETUP_RAW, timeout=300)
        for _ in range(20):  # warm-up
            for ours, raw in CELLS.values():
                execute(client, ours)
                execute(client, raw)
        medians: dict[str, list[float]] = {}
        for _ in range(args.rounds):
            samples: dict[str, list[float]] = {}
            for _ in range(args.n):
                for kind, (ours, raw) in CELLS.items():
                    samples.setdefault(f"{kind} ours", []).append(execute(client, ours))
                    samples.setdefault(f"{kind} raw", []).append(execute(client, raw))
                samples.setdefault("empty", []).append(execute(client, "pass"))
            for key, values in samples.items():
                medians.setdefault(key, []).append(statistics.median(values))
        med = {key: statistics.median(values) * 1e3 for key, values in medians.items()}
        print(f"{'through a real kernel (median ms)':36s} {'ours':>8s} {'raw Ray':>8s} {'ratio':>6s}  target")
        for kind, target in (("task", "<= 1.3"), ("actor", "<= 1.5")):
            ours_ms, raw_ms = med[f"{kind} ours"], med[f"{kind} raw"]
            print(f"{'trivial ' + kind + ' cell':36s} {ours_ms:8.2f} {raw_ms:8.2f} {ours_ms / raw_ms:6.2f}  {target}")
        print(f"{'empty cell (the kernel alone)':36s} {med['empty']:8.2f}")
        execute(client, "ray.shutdown()\n%cluster down", timeout=120)
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)


if __name__ == "__main__":
    main()
