"""A value there and back: ``%%remote`` ``y = x.copy()`` then ``jc.get(y)``, against raw Ray in the same kernel.

Raw Ray is ``ref = copy.remote(ray.put(x))``, waited for without fetching, then ``ray.get(ref)``, in the same
kernel on the same embedded cluster. Rounds alternate (ours, raw, ours, raw...) and medians are printed.

While our value passes, the agent's memory is sampled every 20 ms from ``/proc/PID/status``: its private
pages (``RssAnon``: what the agent itself allocates) and the object store's shared-memory pages it maps
(``RssShmem``: Ray's own copy of the value, which raw Ray's driver maps the same way). The raw kernel's growth
is sampled the same way while it runs raw Ray's round, for comparison. Growth is the peak less the level
before the round.

The cells' workers copy a fresh array (``x.copy()``), and on this machine numpy asks for transparent huge pages
for it, which the kernel then compacts memory for (``defrag=madvise``): the same copy took 0.1 s or 2.6 s from one
task to the next, whichever side ran it. The benchmark turns that off for its cluster
(``NUMPY_MADVISE_HUGEPAGE=0``, for ours and raw Ray's tasks alike: they share the workers).

The object store is sized at ten times the largest value (``--object-store``). A round holds up to five values
in it at once (ours: the input the agent keeps for the cells after, the new one, the output; raw Ray's: its input
and output), and objects are freed a moment after their last reference goes: in Ray's default store (30 % of
memory, 6.3 GB here) a 1 GiB round spilled objects to disk, and a round took from 1 s to 17 s, raw Ray's and ours
alike.

A warm-up round of each size comes first and is left out (``--warmup``): the first value of a size is written into
fresh memory on both sides (our segment, Ray's store pages), and the figures are for the values after it.

Run: ``python benchmarks/bench_values.py [--sizes 256M,1G] [--rounds 5] [--warmup 1] [--cpus 2]``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import threading
from pathlib import Path

from bench_scale import Kernel, start


def memory(pid: int) -> tuple[int, int]:
    """(private, shared) resident bytes of ``pid``."""
    anon = shmem = 0
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("RssAnon:"):
                anon = int(line.split()[1]) * 1024
            elif line.startswith("RssShmem:"):
                shmem = int(line.split()[1]) * 1024
    except OSError:
        pass
    return anon, shmem


class Growth:
    """The peak growth of ``pid``'s private and total resident memory while the ``with`` block runs."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.private = self.total = self.peak = 0
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _take(self) -> None:
        anon, shmem = memory(self.pid)
        self.private = max(self.private, anon - self._base[0])
        self.total = max(self.total, anon + shmem - sum(self._base))
        self.peak = max(self.peak, anon + shmem)

    def _sample(self) -> None:
        while not self._done.wait(0.02):
            self._take()

    def __enter__(self) -> Growth:
        self._base = memory(self.pid)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join()
        self._take()


def size_of(text: str) -> int:
    units = {"K": 2**10, "M": 2**20, "G": 2**30}
    return int(float(text[:-1]) * units[text[-1].upper()]) if text[-1].upper() in units else int(text)


def gib(n: float) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:,.0f} MiB"


def one_round(kernel: Kernel, agent: int, size: int, fill: int) -> dict[str, float]:
    # Each round's value differs, so none is found in the agent's cache of inputs.
    kernel.run(f"import numpy as np\nx = np.full({size // 8}, {fill}.0)")
    with Growth(agent) as ours:
        there, _ = kernel.run("%%remote\ny = x.copy()")
        back, _ = kernel.run("z = jc.get(y)\nassert z.nbytes == x.nbytes and z[-1] == x[-1]\ndel z, y")
    with Growth(kernel.pid) as raw:
        raw_there, _ = kernel.run("ref = copy.remote(ray.put(x))\nray.wait([ref], fetch_local=False)")
        raw_back, _ = kernel.run("z = ray.get(ref)\nassert z.nbytes == x.nbytes and z[-1] == x[-1]\ndel z, ref")
    kernel.run("del x")
    return {
        "there": there,
        "back": back,
        "raw_there": raw_there,
        "raw_back": raw_back,
        "private": ours.private,
        "total": ours.total,
        "peak": ours.peak,
        "raw_total": raw.total,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="256M,1G")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=1, help="rounds run first and left out of the figures")
    parser.add_argument("--cpus", type=int, default=2)
    parser.add_argument("--object-store", default="", help="the object store (default: 10x the largest value)")
    args = parser.parse_args()
    os.environ["NUMPY_MADVISE_HUGEPAGE"] = "0"  # the kernel, the agent and the cluster's workers inherit it
    store = args.object_store or str(10 * max(size_of(t) for t in args.sizes.split(",")))
    kernel, agent, _, _ = start(args.cpus, f"--object-store {store}")
    try:
        print(
            f"{'value':>9s} {'ours':>7s} {'(there':>7s} {'back)':>6s} {'raw':>7s} {'ratio':>6s} "
            f"{'agent private':>14s} {'agent total':>12s} {'raw kernel':>11s} {'agent peak':>11s}"
        )
        for text in args.sizes.split(","):
            size = size_of(text)
            rows = [one_round(kernel, agent, size, fill) for fill in range(1, args.warmup + args.rounds + 1)]
            rows = rows[args.warmup :]
            med = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
            ours, raw = med["there"] + med["back"], med["raw_there"] + med["raw_back"]
            best_ours = min(r["there"] + r["back"] for r in rows)
            best_raw = min(r["raw_there"] + r["raw_back"] for r in rows)
            each = ", ".join(f"{r['there'] + r['back']:.2f}/{r['raw_there'] + r['raw_back']:.2f}" for r in rows)
            print(f"  rounds (ours/raw, s): {each}; best {best_ours:.2f}/{best_raw:.2f} = {best_ours / best_raw:.2f}")
            print(
                f"{gib(size):>9s} {ours:6.2f}s {med['there']:6.2f}s {med['back']:5.2f}s {raw:6.2f}s "
                f"{ours / raw:6.2f} {med['private'] / size:13.2f}x {med['total'] / size:11.2f}x "
                f"{med['raw_total'] / size:10.2f}x {gib(med['peak']):>11s}",
                flush=True,
            )
        kernel.run("ray.shutdown()\n%cluster down", timeout=120)
    finally:
        kernel.stop()


if __name__ == "__main__":
    main()
