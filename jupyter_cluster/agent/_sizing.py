"""The embedded cluster in a small container (Binder: 2 GiB of memory, Docker's 64 MiB ``/dev/shm``).

Ray sizes its object store at 30 % of the memory it sees and puts it in ``/dev/shm``. In a
2 GiB container that is 600 MB of a budget the kernel, the agent, Ray's own processes and
the workers share; and a 64 MiB ``/dev/shm`` is below Ray's 75 MiB minimum, so Ray falls
back to ``/tmp`` with a warning. Below :data:`SMALL` of memory the embedded cluster takes
:data:`STORE_SHARE` of it for the store (at least Ray's minimum), and puts the store in
``/tmp`` at once when ``/dev/shm`` cannot hold it. An object store size given by the user
(``%cluster local --object-store``) is kept as it is. There, too, Ray ends a worker process
that has been idle for a second (``num_workers_soft_limit`` 0: Ray keeps one idle worker per
CPU otherwise, and a worker that imported PyTorch for a task holds 300 MiB and more while it
waits), the agent does not start workers ahead of the first cell, and no spare actor waits,
Ray Train imported, for the next ``jc.train_torch`` or ``jc.tune`` run.
"""

from __future__ import annotations

import os
import shutil
from typing import Any

#: Memory at or below which the embedded cluster sizes itself for a small container.
SMALL = 4 * 2**30
#: The share of that memory the object store gets.
STORE_SHARE = 0.15
#: Ray's smallest object store (``ray_constants.OBJECT_STORE_MINIMUM_MEMORY_BYTES``).
STORE_MINIMUM = 75 * 2**20
#: What ``/dev/shm`` must hold beyond the store (Ray's own shared memory).
SHM_MARGIN = 16 * 2**20

_CGROUP_FILES = ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes")


def cgroup_files(proc: str = "/proc/self/cgroup") -> tuple[str, ...]:
    """Where this process's memory limit is written: the files of its own cgroup (v2, or v1's memory controller),
    as ``/proc/self/cgroup`` names it, then those at the root of ``/sys/fs/cgroup`` (what a container whose cgroup
    is mounted there sees)."""
    own = []
    try:
        with open(proc) as f:
            lines = f.read().splitlines()
    except OSError:
        lines = []
    for line in lines:
        _, controllers, path = line.split(":", 2) if line.count(":") >= 2 else ("", "?", "")
        path = path.rstrip("/")
        if controllers == "":
            own.append(f"/sys/fs/cgroup{path}/memory.max")
        elif "memory" in controllers.split(","):
            own.append(f"/sys/fs/cgroup/memory{path}/memory.limit_in_bytes")
    return (*[f for f in own if f not in _CGROUP_FILES], *_CGROUP_FILES)


def memory_limit(files: tuple[str, ...] | None = None) -> int | None:
    """The memory this process may use: its cgroup's limit (v2 or v1), else the machine's; None if unknown."""
    if files is None:
        files = cgroup_files()
    limits = []
    for path in files:
        try:
            with open(path) as f:
                text = f.read().strip()
        except OSError:
            continue
        if text.isdigit() and int(text) < 2**60:  # "max", or v1's "no limit" (a huge number)
            limits.append(int(text))
    try:
        limits.append(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError):
        pass
    return min(limits) if limits else None


def memory_used(files: tuple[str, ...] | None = None) -> int | None:
    """What this process's cgroup uses now, as Ray counts a node's use (inactive file pages aside); None without
    a limited cgroup of its own."""
    for limit_file in files if files is not None else cgroup_files():
        v1 = limit_file.endswith("memory.limit_in_bytes")
        folder = os.path.dirname(limit_file)
        usage, inactive = (
            ("memory.usage_in_bytes", "total_inactive_file") if v1 else ("memory.current", "inactive_file")
        )
        try:
            with open(limit_file) as f:
                limit = f.read().strip()
            if not limit.isdigit() or int(limit) >= 2**60:
                continue
            with open(os.path.join(folder, usage)) as f:
                used = int(f.read().strip())
            with open(os.path.join(folder, "memory.stat")) as f:
                stat = dict(line.split()[:2] for line in f if line.strip())
        except (OSError, ValueError):
            continue
        return max(0, used - int(stat.get(inactive, 0)))
    return None


def memory_free(meminfo: str = "/proc/meminfo") -> int | None:
    """The memory this process could still take: what its cgroup leaves (limit less use), or what the machine
    has available, whichever is less; None if unknown."""
    free = []
    files = cgroup_files()
    limit, used = memory_limit(files), memory_used(files)
    if limit is not None and used is not None:
        free.append(max(0, limit - used))
    try:
        with open(meminfo) as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    free.append(int(line.split()[1]) * 1024)
    except (OSError, ValueError, IndexError):
        pass
    return min(free) if free else None


#: What taking a value in costs the head, as a multiple of its size: the bytes as they arrive, then the object
#: store's copy (the first is freed once the second is made).
TAKE_COST = 2


def refuse_value(nbytes: int, free: int | None = None) -> str | None:
    """Why a value of ``nbytes`` cannot be taken in here (in words), or None when it can.

    >>> print(refuse_value(3 * 2**30, free=2 * 2**30))  # doctest: +NORMALIZE_WHITESPACE
    the head has 2.0 GiB of memory free, and taking in 3.0 GiB needs about 6.0 GiB there
    (the bytes as they arrive, then the object store's copy)
    >>> refuse_value(2**20, free=2 * 2**30) is None
    True
    """
    free = memory_free() if free is None else free
    if free is None or nbytes * TAKE_COST <= free:
        return None
    return (
        f"the head has {_gib(free)} of memory free, and taking in {_gib(nbytes)} needs about "
        f"{_gib(nbytes * TAKE_COST)} there (the bytes as they arrive, then the object store's copy)"
    )


def _gib(n: int) -> str:
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.0f} MiB"


def own_memory(sample: dict[str, Any]) -> None:
    """Correct a sample of this (the agent's) node where Ray read another cgroup than the agent's own: Ray reads
    the root of ``/sys/fs/cgroup``, which is the container's own in a container, but not in a cgroup nested below
    it (a Binder-sized box on a bigger machine). Code that sizes its work to what the node has, and the dashboard,
    then see the box."""
    limit = memory_limit()
    total = sample.get("mem_total")
    if limit is None or not total or total <= limit * 1.05:
        return
    used = memory_used()
    if used is not None:
        sample["mem_total"], sample["mem_used"] = float(limit), float(used)


def shm_size(path: str = "/dev/shm") -> int | None:
    try:
        return shutil.disk_usage(path).total
    except OSError:
        return None


#: Where the embedded cluster runs Ray's dashboard: a box of more memory than this. Measured on Ray 2.60 (an embedded
#: cluster of 1 CPU, the processes' PSS summed 15 s after ray.init): 571 MiB in 10 processes without it, 808 MiB in
#: 21 with it. In Binder's 2 GiB those 237 MiB are an eighth of the box, which the examples need.
DASHBOARD_ROOM = SMALL
#: Setting it by hand: "1" runs Ray's dashboard on the embedded cluster, "0" does not (unset: by the box's room).
DASHBOARD_SETTING = "JUPYTER_CLUSTER_RAY_DASHBOARD"


def dashboard_fits(memory: int | None) -> bool:
    """Whether the embedded cluster runs Ray's dashboard: Ray's ``default`` extra is installed, and the box has more
    memory than :data:`DASHBOARD_ROOM` (or :data:`DASHBOARD_SETTING` says)."""
    setting = os.environ.get(DASHBOARD_SETTING, "").strip()
    if setting in ("0", "1"):
        return setting == "1"
    try:
        from ray._private.utils import get_dashboard_dependency_error

        installed = get_dashboard_dependency_error() is None
    except Exception:
        installed = False
    return installed and (memory is None or memory > DASHBOARD_ROOM)


_small = False


def small_machine() -> bool:
    """Whether this agent's embedded cluster was sized for a small container (see :func:`small_container`)."""
    return _small


def small_container(kwargs: dict[str, Any], memory: int | None, shm: int | None) -> list[str]:
    """Size ``ray.init``'s ``kwargs`` (in place) for a container of ``memory`` bytes and a ``/dev/shm`` of
    ``shm`` bytes; returns what it changed, in words (the agent logs it).

    >>> kw = {}
    >>> for note in small_container(kw, 2 * 2**30, 64 * 2**20):
    ...     print(note)
    object store 307 MiB (15% of 2048 MiB)
    idle workers end after 1 s
    object store in /tmp (/dev/shm holds 64 MiB)
    >>> kw
    {'object_store_memory': 322122547, '_system_config': {'num_workers_soft_limit': 0}, '_plasma_directory': '/tmp'}
    """
    notes = []
    if memory is not None and memory <= SMALL and "object_store_memory" not in kwargs:
        store = max(STORE_MINIMUM, int(memory * STORE_SHARE))
        kwargs["object_store_memory"] = store
        notes.append(f"object store {store >> 20} MiB ({STORE_SHARE:.0%} of {memory >> 20} MiB)")
    if memory is not None and memory <= SMALL:
        global _small
        _small = True
        kwargs.setdefault("_system_config", {})["num_workers_soft_limit"] = 0
        notes.append("idle workers end after 1 s")
    given = kwargs.get("object_store_memory")
    if given is not None and shm is not None and shm < given + SHM_MARGIN:
        kwargs["_plasma_directory"] = "/tmp"
        notes.append(f"object store in /tmp (/dev/shm holds {shm >> 20} MiB)")
    return notes


__all__ = [
    "cgroup_files",
    "memory_limit",
    "memory_used",
    "own_memory",
    "shm_size",
    "small_container",
    "small_machine",
]
