"""Large values in shared memory between a kernel and an agent on one machine (``agent/_shared.py``, ``_segments.py``).

The unit tests need no Ray: the hash taken while writing a segment is the one the socket's values get, a segment
is opened only by its inode, the pool reuses segments and gives them back. The rest run on the session's embedded
cluster, whose agent shares this machine: values go there and back through segments (the socket carries their
names), a segment that is gone is said in the error, a kernel that offers none sends its values on the socket,
a link dropped mid-cell loses nothing. Then a second notebook's kernel is killed (``kill -9``) while a value is
on its way, at four points: as it writes the value into its segment, while the agent reads it (the agent is held
still with SIGSTOP from the moment it has the segment, so the kill lands inside the copy), while the agent writes
a value back into it, and while the kernel holds that value. Each time no process (the agent, its Ray
workers) holds a segment afterwards, nor is one in ``/dev/shm``, and the agent goes on serving.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import os
import pickle
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import cloudpickle
import numpy as np
import pytest

import jupyter_cluster as jc
from jupyter_cluster import _segments
from jupyter_cluster._cluster import Cluster
from jupyter_cluster._errors import RequestError
from jupyter_cluster._inputs import sample
from jupyter_cluster._link import AgentLink, UnixTransport
from jupyter_cluster.agent import _shared as shared
from jupyter_cluster.agent._protocol import HASH_PIECE, HASH_STEP, Digest, Pickled

from .kernel import attach_second, text
from .test_worker_output import _agent_of

MiB = 1 << 20


# ------------------------------------------------------------------ unit


def _value(big: int) -> dict[str, Any]:
    return {"big": np.arange(big // 8, dtype=np.float64), "small": np.ones(3000), "text": "kept in band"}


@pytest.mark.parametrize("big", [3 * MiB, 2 * HASH_PIECE + 5 * MiB])  # hashed whole; in pieces
def test_a_value_written_into_a_segment_hashes_as_on_the_socket_and_reads_back(big: int) -> None:
    value = _value(big)
    blob = Pickled.of(value, cloudpickle.dumps)
    pool = _segments.SegmentPool()
    sent, segment, digest = pool.stage(blob, hash_later=True)  # taken afterwards, from the segment
    try:
        assert digest is not None
        assert digest.result() == blob.digest()  # the ledger's caching is the same whichever way a value goes
        assert pool.stage(blob)[2] is None  # (jc.put's: no hash at all)
        wire = pickle.dumps(sent, protocol=5)
        assert len(wire) < 64 * 1024, "the value's bytes went into the message"
        back = pickle.loads(wire).load()  # as the agent reads it: through /proc, by inode
        assert back["text"] == value["text"]
        assert np.array_equal(back["big"], value["big"]) and np.array_equal(back["small"], value["small"])
        # The way back: another segment, written as the agent writes it, read as the kernel reads it.
        offered = pool.take(shared.buffer_bytes(blob))
        answer = pickle.loads(pickle.dumps(shared.fill(offered.name(), blob)))
        received = pool.receive(answer, offered).load()
        assert np.array_equal(received["big"], value["big"])
        del back, received
        gc.collect()
        assert offered in pool._free, "the received value's segment did not come back to the pool once it was gone"
    finally:
        segment.close()
        pool.clear()


@contextlib.contextmanager
def _background_hashing_held() -> Iterator[None]:
    """The kernel's background hashing thread kept busy, as on a machine whose cores are all taken
    (it runs only when one is free)."""
    release = threading.Event()
    started = threading.Event()
    _segments._idle_thread().submit(lambda: (started.set(), release.wait(300)))
    assert started.wait(30)
    try:
        yield
    finally:
        release.set()


def test_a_hash_left_to_the_background_is_finished_by_whoever_needs_it() -> None:
    value = {"big": np.arange((2 * HASH_PIECE + 5 * MiB) // 8, dtype=np.float64)}
    value["small"] = [np.full(1000 + i, i % 251, dtype=np.uint8) for i in range(300)]  # grouped into one piece
    blob = Pickled.of(value, cloudpickle.dumps)
    whole = blob.digest()
    assert Pickled.of(value, cloudpickle.dumps).digest(side_by_side=False) == whole
    value["small"][150][7] += 1
    assert Pickled.of(value, cloudpickle.dumps).digest() != whole, "a change in a small buffer went unseen"
    value["small"][150][7] -= 1

    # The background got three steps into the first piece, and holds the second mid-step when it is needed.
    digest = Digest(blob)
    first, second = digest._pieces[0], digest._pieces[1]
    steps = iter(range(4))
    with first.lock:
        first.work(stop=lambda: next(steps) == 3)
    assert first.digest is None and first.offset == 3 * HASH_STEP
    second.lock.acquire()
    threading.Timer(0.3, second.lock.release).start()
    assert digest.result() == whole and not digest._pieces[0].views, "the views on the value were kept"
    done: list[str] = []
    again = Digest(blob)
    again.add_done_callback(lambda d: done.append(d.result()))
    again.run()  # all of it in the background
    assert done == [whole]

    # A segment given back before its hash is taken, on a machine too busy to take it: the next value of its
    # size does not get a new segment; the hash is taken then, and the segment reused.
    pool = _segments.SegmentPool()
    with _background_hashing_held():
        _sent, segment, staged = pool.stage(blob, hash_later=True)
        pool.give(segment)
        assert staged is not None and not staged.done() and segment in pool._hashing
        assert pool.take(blob.nbytes) is segment and staged.done() and staged.result() == whole
    pool.give(segment)
    _sent, again, unhashed = pool.stage(blob)  # reused for a value sent unhashed: no hash of the last one is said
    assert again is segment and unhashed is None and segment.hashing is None
    pool.give(segment)
    pool.clear()


def test_a_segment_is_opened_only_by_its_inode_and_only_if_it_is_one() -> None:
    fd = shared.create(4096)
    name = shared.name_of(fd)
    os.close(fd)
    stranger = shared.create(4096)  # most likely the same descriptor number, another memfd
    try:
        with pytest.raises(shared.SegmentError, match=r"no longer the segment|is gone"):
            shared.open_segment(name)
    finally:
        os.close(stranger)
    not_one = pytest.raises(shared.SegmentError, match="is not the notebook kernel's shared memory")
    with open(__file__, "rb") as f, not_one:  # a descriptor that is not a segment at all
        shared.open_segment(shared.SegmentName(os.getpid(), f.fileno(), 0, 0))
    fd, offer = shared.probe()
    try:
        assert shared.check_probe(offer)
        assert not shared.check_probe({**offer, "word": "00" * shared.PROBE_BYTES})  # another process's, say
        assert not shared.check_probe({"segment": [2**22 + 7, fd, 1, 16], "word": offer["word"]})  # no such pid
        assert not shared.check_probe({"segment": "garbage"})
    finally:
        os.close(fd)


def _mapped_here(ino: int) -> bool:
    return any(line.split()[4] == str(ino) for line in Path("/proc/self/maps").read_text().splitlines())


def test_the_agent_keeps_its_mapping_of_a_segment_while_the_kernel_keeps_the_segment() -> None:
    maps = shared.Mappings(sweep=0.1)
    fd = shared.create(4 * MiB)
    name = shared.name_of(fd)
    os.pwrite(fd, b"abc", 0)
    view = maps.view(name, 4 * MiB)
    assert bytes(view[:3]) == b"abc"
    view[3:6] = b"def"  # the agent's way back: written into the kernel's segment
    view.release()
    assert os.pread(fd, 6, 0) == b"abcdef"
    kept = maps._maps[name]
    maps.view(name, MiB).release()
    assert maps._maps[name] is kept and len(maps) == 1, "the mapping was not used again"
    # A copy still reads one segment when its kernel closes it; the other is closed while nobody reads it.
    other = shared.create(2 * MiB)
    other_name = shared.name_of(other)
    reading = maps.view(other_name, 2 * MiB)
    os.close(fd)
    os.close(other)
    assert _until(lambda: len(maps) == 0, 10, 0.05), "the mappings of closed segments were kept"
    assert not _mapped_here(name.ino), "the memory of a closed segment is still mapped"
    assert bytes(reading[:2]) == b"\0\0" and _mapped_here(other_name.ino)  # the copy reads on
    reading.release()
    assert not _mapped_here(other_name.ino), "a segment was still mapped once its last copy ended"


def test_the_pool_reuses_segments_keeps_a_few_and_gives_them_back_when_idle() -> None:
    pool = _segments.SegmentPool(idle=0.5, keep=2)
    first = pool.take(5 * MiB)
    pool.give(first)
    assert pool.take(4 * MiB) is first, "a segment that fits was not reused"
    assert pool.take(64 * MiB) is not first  # much bigger: a new one
    small = pool.take(1)
    assert small is not first and small.capacity == _segments.GRAIN, "a tiny value got a big segment"
    many = [pool.take(3 * MiB) for _ in range(3)]
    for segment in many:
        pool.give(segment)
    assert len(pool._free) == 2 and many[0].fd == -1, "the pool kept more than `keep` segments"
    kept = list(pool._free)
    deadline = time.monotonic() + 10
    while pool._free and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not pool._free, "idle segments were not given back"
    for segment in kept:
        assert segment.fd == -1


# ------------------------------------------------------ the embedded cluster


def test_large_values_go_there_and_back_through_shared_memory(cluster: jc.Cluster) -> None:
    link = cluster._link
    assert link.shared, "the embedded agent did not open the kernel's probe segment"
    pool = _segments.pool()
    x = np.arange(8 * MiB // 8, dtype=np.float64)
    cell = cluster.run_cell("y = x * 2\nd = {'a': x[:1000].copy(), 'b': x + 1, 'name': 'd'}", namespace={"x": x})
    entry = cell._shipped.entries[0]
    assert entry[1] == "value" and isinstance(entry[2][1], shared.Shared), entry
    outputs = cell.result(120).outputs
    before, reused = link.bytes_received, pool.reused
    y = jc.get(outputs["y"])
    d = jc.get(outputs["d"])
    assert np.array_equal(y, x * 2) and np.array_equal(d["b"], x + 1) and d["name"] == "d"
    assert link.bytes_received - before < 256 * 1024, "the values came on the socket"
    assert pool.reused > reused, "no segment was reused"
    # jc.put, and a result whose size the notebook does not know (answered Needs, then sent through a segment).
    handle = jc.put(x)
    assert np.array_equal(jc.get(handle), x)
    before = link.bytes_received
    doubled = jc.get(jc.submit(lambda a: a * 2, x))
    assert np.array_equal(doubled, x * 2) and link.bytes_received - before < 256 * 1024
    # The same value read again is not sent again: its sample is the same, and then its hash (taken meanwhile).
    again = cluster.run_cell("s = float(x.sum())", namespace={"x": x})
    assert again._shipped.entries[0][1] == "cached" and again.result(60).outputs["s"] == float(x.sum())
    # Changed in place where no sample looks: the same sample, another hash, so sent again.
    x[12345] += 0.5
    assert sample(Pickled.of(x)) == again._shipped.held["x"].sample, "the test's change is not between the samples"
    changed = cluster.run_cell("s = float(x.sum())", namespace={"x": x})
    assert changed._shipped.entries[0][1] == "value" and changed.result(60).outputs["s"] == float(x.sum())


def test_a_busy_machine_holds_up_no_cell_whose_input_is_unchanged(cluster: jc.Cluster) -> None:
    """The hash of a value sent through shared memory is taken when a core is free. On a machine
    whose cores are all taken it is not, and the next cell that sends the value must not wait for one."""
    x = np.arange(8 * MiB // 8, dtype=np.float64) + 7
    with _background_hashing_held():
        first = cluster.run_cell("s = float(x.sum())", namespace={"x": x})
        assert first._shipped.entries[0][1] == "value" and first.result(60).outputs["s"] == float(x.sum())
        held = first._shipped.held["x"].hash
        assert isinstance(held, Digest) and not held.done(), "the hash was taken on the value's way"
        answers: list[Any] = []
        second = functools.partial(cluster.run_cell, "t = float(x.max())", namespace={"x": x})
        worker = threading.Thread(target=lambda: answers.append(second()))
        worker.start()
        worker.join(60)
        assert answers, "the second cell waited for the background hash"
        assert answers[0]._shipped.entries[0][1] == "cached" and answers[0].result(60).outputs["t"] == float(x.max())


def test_a_segment_that_is_gone_is_said_and_the_session_goes_on(cluster: jc.Cluster) -> None:
    fd = shared.create(MiB)
    name = shared.name_of(fd)
    os.close(fd)
    gone = shared.Shared(pickle.dumps(b"x"), name, [(0, MiB)])
    with pytest.raises(RequestError, match=r"shared memory is gone|no longer the segment"):
        cluster._link.call("put", {"value": gone}, timeout=60)
    assert cluster.run_cell("m = 3").result(60).outputs["m"] == 3


def test_a_kernel_that_offers_no_segments_sends_its_values_on_the_socket(
    cluster: jc.Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("JUPYTER_CLUSTER_SHARED_MEMORY", "0")
    socket, secret = _agent_of(cluster)
    link = AgentLink(UnixTransport(socket), secret, f"no-shm-{time.time():.0f}")
    link.connect()
    other = Cluster(link, kind="embedded local")
    try:
        assert not link.shared
        x = np.full(4 * MiB // 8, 7.0)
        cell = other.run_cell("y = x + 1", namespace={"x": x})
        assert not isinstance(cell._shipped.entries[0][2][1], shared.Shared)
        handle = cell.result(120).outputs["y"]
        before = link.bytes_received
        assert np.array_equal(other.get(handle), x + 1)
        assert link.bytes_received - before >= x.nbytes
    finally:
        link.close()


def test_a_link_dropped_while_the_agent_reads_a_segment_loses_nothing(cluster: jc.Cluster) -> None:
    x = np.full(64 * MiB // 8, 5.0)
    pool = _segments.pool()
    for _ in range(2):
        cell = cluster.run_cell("s = float(x.sum())", namespace={"x": x})
        cluster._link.drop_connection()
        time.sleep(0.05)
        cluster._link.drop_connection()
        assert cell.result(120).outputs["s"] == float(x.sum())
        x[0] += 1  # a new value: sent again
    reused = pool.reused
    cluster.run_cell("s = float(x.sum())", namespace={"x": x + 1}).result(120)
    assert pool.reused > reused, "the segment of a cell whose link dropped did not come back to the pool"


def test_a_large_output_the_notebook_lets_go_of_leaves_the_object_store(cluster: jc.Cluster) -> None:
    """In a real kernel, with Python's cyclic garbage collector off: once the notebook deletes a large output it
    fetched, the agent lets go of its object at once. Before, the kernel's list of recent cells (the sidebar's)
    held the last ten cells, and an ended cell was kept alive by its own callbacks until a full collection: every
    value sent and fetched stayed in the store, and a few rounds of 1 GiB values filled it."""
    second = attach_second(*_agent_of(cluster), name=f"lets-go-{time.time():.0f}")
    try:
        second.ok("import gc\ngc.disable()\nimport numpy as np")
        ids = []
        for i in range(3):
            second.ok(f"x = np.full({4 * MiB // 8}, {i}.0)")
            second.ok("%%remote\ny = x + 1")
            said = text(second.ok("z = jc.get(y)\nassert z[-1] == x[-1] + 1\nprint(y.id)\ndel z, y"))
            ids.append(said.strip())
        for handle_id in ids:
            assert _until(functools.partial(_released, cluster, handle_id), 30, 0.2), f"{handle_id} is still held"
    finally:
        second.kc.stop_channels()  # (not stop(): its `%cluster down` would stop the session's agent)
        second.km.shutdown_kernel(now=True)


def _released(cluster: jc.Cluster, handle_id: str) -> bool:
    try:
        cluster._link.call("describe", {"handle": handle_id}, timeout=60)
    except RequestError as exc:
        return "no longer holds" in str(exc)
    return False


# ------------------------------------------------------------- kill -9


def _inodes(pid: int) -> set[int]:
    """The inodes of the segments ``pid`` has open."""
    found = set()
    with contextlib.suppress(OSError):
        for fd in os.listdir(f"/proc/{pid}/fd"):
            path = f"/proc/{pid}/fd/{fd}"
            with contextlib.suppress(OSError):
                if os.readlink(path).startswith(f"/memfd:{shared.PREFIX}"):
                    found.add(os.stat(path).st_ino)
    return found


def _segments_held(pid: int, of: set[int] | None = None) -> list[str]:
    """The segments ``pid`` holds, as descriptors and as mappings: all of them, or those whose inode is in ``of``."""
    held = [f"fd of inode {ino}" for ino in _inodes(pid) if of is None or ino in of]
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
            fields = line.split()
            if f"/memfd:{shared.PREFIX}" in line and (of is None or int(fields[4]) in of):
                held.append(fields[0])
    return held


def _tree(pid: int) -> list[int]:
    """``pid`` and its descendants (the agent: its Ray, its workers)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError):
                ppid = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
                children.setdefault(ppid, []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        p = todo.pop()
        found.append(p)
        todo.extend(children.get(p, []))
    return found


def _big_segment(pid: int, nbytes: int) -> bool:
    with contextlib.suppress(OSError):
        for fd in os.listdir(f"/proc/{pid}/fd"):
            path = f"/proc/{pid}/fd/{fd}"
            with contextlib.suppress(OSError):
                if os.readlink(path).startswith(f"/memfd:{shared.PREFIX}") and os.stat(path).st_size >= nbytes:
                    return True
    return False


def _until(predicate: Any, timeout: float, every: float = 0.002) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(every)
    return False


@contextlib.contextmanager
def _held_still(pid: int) -> Iterator[None]:
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


VALUE = 128 * MiB
POINTS = ["writing its segment", "agent reading it", "agent writing back", "holding the value"]


@pytest.mark.ray
@pytest.mark.timeout(600)
@pytest.mark.parametrize("point", POINTS)
def test_a_kernel_killed_mid_transfer_leaves_no_segment_behind(cluster: jc.Cluster, point: str) -> None:
    agent = cluster._agent
    assert agent is not None
    agent_pid = agent.process.pid
    second = attach_second(*_agent_of(cluster), name=f"killed-{POINTS.index(point)}-{time.time():.0f}")
    pid = second.km.provisioner.process.pid  # type: ignore[union-attr]
    try:
        # Every value in a new segment, kept by nobody once used: the one the agent copies is told by its inode (the
        # agent keeps its mappings of a kernel's segments while the kernel keeps them).
        second.ok("from jupyter_cluster import _segments\n_segments.pool().keep = 0")
        second.ok(f"import numpy as np\nx = np.full({VALUE // 8}, 2.0)")
        if point in ("agent writing back", "holding the value"):
            second.ok("%%remote\ny = x + 1")
        # (The agent keeps its mappings of other kernels' segments, this test's own among them: the dead kernel's
        # count.)
        theirs: set[int] = set()
        if point == "holding the value":
            second.ok("z = jc.get(y)\nassert z[-1] == 3.0")
            theirs = _inodes(pid)
            os.kill(pid, signal.SIGKILL)
        elif point == "writing its segment":
            second.kc.execute("%%remote\ny = x + 1")
            assert _until(lambda: _big_segment(pid, VALUE), 60), "the kernel never made its segment"
            theirs = _inodes(pid)
            os.kill(pid, signal.SIGKILL)
        else:
            before = _inodes(pid)
            second.kc.execute("%%remote\ny = x + 1" if point == "agent reading it" else "z = jc.get(y)")
            opened = _until(lambda: _segments_held(agent_pid, of=_inodes(pid) - before), 60)
            assert opened, "the agent never opened the kernel's segment"
            with _held_still(agent_pid):  # inside its copy, for sure
                theirs = _inodes(pid)
                os.kill(pid, signal.SIGKILL)
                _until(lambda: not os.path.exists(f"/proc/{pid}/fd"), 10, 0.01)
        assert theirs, "the kernel had no segment when it was killed"
        # Once the agent is done with its copy, nobody holds a segment of the dead kernel, nor is one in /dev/shm.
        processes = _tree(agent_pid)
        left: dict[int, list[str]] = {}

        def none_left() -> bool:
            left.clear()
            left.update({p: h for p in processes if (h := _segments_held(p, of=theirs))})
            return not left

        assert _until(none_left, 60, 0.2), f"segments left after kill -9 {point}: {left}"
        assert not [p for p in os.listdir("/dev/shm") if shared.PREFIX in p]
        assert cluster.run_cell("m = 4").result(120).outputs["m"] == 4  # the agent serves on
    finally:
        with contextlib.suppress(Exception):
            second.kc.stop_channels()
        with contextlib.suppress(Exception):
            second.km.shutdown_kernel(now=True)
