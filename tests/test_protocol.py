"""The wire protocol: framing, the outbox, and resume/dedup against the real agent."""

from __future__ import annotations

import asyncio
import os
import stat
import time
from collections.abc import Sequence
from typing import Any

import cloudpickle
import pytest

import jupyter_cluster as jc
from jupyter_cluster.agent._protocol import (
    OOB_MIN,
    Frame,
    FrameReader,
    FrameWriter,
    Pickled,
    ProtocolError,
    SessionOutbox,
    dumps,
    loads,
    open_unix_frames,
    read_frame,
    serve_unix_frames,
    write_frame,
)
from jupyter_cluster.agent.cells._execute import CellSpec


# Framing and outbox, no Ray --------------------------------------------------------
def _reader(data: bytes) -> asyncio.StreamReader:
    reader = asyncio.StreamReader()
    reader.feed_data(data)
    reader.feed_eof()
    return reader


def test_frames_round_trip() -> None:
    frames = [Frame({"type": "a", "n": 1}), Frame({"type": "b"}, b"x" * 3_000_000), Frame({"type": "c"}, b"\0")]
    data = b"".join(f.encode() for f in frames)

    async def read_all() -> list[Frame]:
        reader = _reader(data)
        return [await read_frame(reader) for _ in frames]

    assert asyncio.run(read_all()) == frames


def test_large_buffers_travel_out_of_band_and_arrive_writable() -> None:
    np = pytest.importorskip("numpy")
    big = np.arange(1 << 20, dtype=np.float64)  # 8 MiB
    small = np.arange(10)
    edge = np.ones(OOB_MIN, dtype=np.uint8)
    payload, buffers = dumps({"big": big, "small": small, "edge": edge, "raw": b"y" * 100})
    assert len(buffers) == 2  # the 8 MiB array and the 64 KiB one; the small array stays in band
    assert len(payload) < 4096
    frame = Frame({"type": "result"}, payload, buffers)
    encoded = frame.encode()
    assert len(encoded) == len(payload) + big.nbytes + OOB_MIN + len(frame._head()) + 12

    async def read() -> Frame:
        return await read_frame(_reader(encoded + Frame({"type": "next"}).encode()))

    got = asyncio.run(read())
    assert got.header == {"type": "result"}  # the sizes are framing, not part of the header
    body = loads(got.payload, got.buffers)
    assert (body["big"] == big).all() and (body["small"] == small).all() and (body["edge"] == edge).all()
    assert body["raw"] == b"y" * 100
    body["big"][0] = -1.0  # arrays built on a received buffer are writable, as after a plain pickle
    assert body["big"][0] == -1.0


def test_pickled_values_keep_their_buffers_through_a_frame() -> None:
    np = pytest.importorskip("numpy")
    value = {"x": np.ones((512, 512)), "name": "grid"}
    blob = Pickled.of(value)
    assert len(blob.buffers) == 1 and blob.nbytes >= value["x"].nbytes
    payload, buffers = dumps({"inputs": {"x": blob}})
    assert len(buffers) == 1 and len(payload) < 4096  # nested Pickled hands its buffer on: no copy in band
    again = loads(payload, buffers)["inputs"]["x"]
    assert again.digest() == blob.digest()
    assert (again.load()["x"] == value["x"]).all()
    changed = value["x"].copy()
    changed[0, 0] = 2.0
    assert Pickled.of({"x": changed, "name": "grid"}).digest() != blob.digest()


def test_frame_writer_keeps_frames_in_order_across_large_ones() -> None:
    np = pytest.importorskip("numpy")
    arrays = [np.full(300_000 + i, i, dtype=np.uint8) for i in range(3)]

    async def exchange() -> list[Frame]:
        got: list[Frame] = []
        done = asyncio.Event()

        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            while len(got) < 7:
                got.append(await read_frame(reader))
            done.set()
            writer.close()

        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        _, stream = await asyncio.open_connection("127.0.0.1", port)
        out = FrameWriter(stream)
        out.write(Frame({"n": 0}))
        for i, array in enumerate(arrays):
            # a small frame queued behind a large one waits its turn
            out.write(Frame({"n": 2 * i + 1}, *dumps(array)))
            out.write(Frame({"n": 2 * i + 2}))
        await asyncio.wait_for(done.wait(), 30)
        out.close()
        server.close()
        return got

    got = asyncio.run(exchange())
    assert [f.header["n"] for f in got] == list(range(7))
    for i, array in enumerate(arrays):
        frame = got[2 * i + 1]
        assert len(frame.buffers) == 1
        assert (loads(frame.payload, frame.buffers) == array).all()


def test_a_frame_reader_fills_large_buffers_from_the_socket_and_notices_an_end(tmp_path: Any) -> None:
    """The agent's and the embedded kernel's reader: large buffers are received straight into their own memory,
    whether their bytes arrive before the read (held by the reader) or after it, in pieces of any size; frames
    around them read as before; a stream that ends or is cut inside a buffer is an IncompleteReadError."""
    np = pytest.importorskip("numpy")
    arrays = [np.arange(n, dtype=np.uint8) for n in (3 << 20, (8 << 20) + 13)]
    payload, buffers = dumps(arrays)
    frames = [Frame({"n": 0}), Frame({"n": 1}, payload, buffers), Frame({"n": 2})]
    data = b"".join(f.encode() for f in frames)
    path = str(tmp_path / "s")

    async def exchange(pieces: list[int], end: str) -> tuple[list[Frame], BaseException | None, int]:
        got: list[Frame] = []
        failure: list[BaseException] = []
        heard = [0]
        served = asyncio.Event()

        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            assert isinstance(reader, FrameReader)
            try:
                while True:
                    got.append(await read_frame(reader, lambda: heard.__setitem__(0, heard[0] + 1)))
            except (asyncio.IncompleteReadError, ConnectionError) as exc:
                failure.append(exc)
            served.set()

        server = await serve_unix_frames(serve, path, limit=1 << 20)
        _, writer = await open_unix_frames(path, limit=1 << 20)
        start = 0
        for size in pieces:
            writer.write(data[start : start + size])
            await writer.drain()
            await asyncio.sleep(0.01)
            start += size
        if end == "abort":
            writer.transport.abort()
        else:
            writer.close()
        await asyncio.wait_for(served.wait(), 30)
        server.close()
        return got, (failure or [None])[0], heard[0]

    # All at once, then in uneven pieces (a piece ends inside the prefix, the header, each buffer).
    for pieces in ([len(data)], [5, 300, 1 << 20, 7, (3 << 20) - 1, 1 << 22, len(data)]):
        got, failure, heard = asyncio.run(exchange(pieces, "close"))
        assert [f.header["n"] for f in got] == [0, 1, 2]
        body = loads(got[1].payload, got[1].buffers)
        assert all((a == b).all() for a, b in zip(body, arrays, strict=True))
        assert isinstance(failure, asyncio.IncompleteReadError) and not failure.partial  # a clean end, between frames
        assert heard > 3, "each part of a large buffer that arrives says the link is alive"
    # Ended, or cut, inside the second buffer: the frame is not taken, and the reader says why.
    for end in ("close", "abort"):
        got, failure, _ = asyncio.run(exchange([len(data) - (4 << 20)], end))
        assert [f.header["n"] for f in got] == [0]
        assert isinstance(failure, (asyncio.IncompleteReadError, ConnectionError)), failure


def test_garbage_is_a_protocol_error() -> None:
    async def read(data: bytes) -> Frame:
        return await read_frame(_reader(data))

    with pytest.raises(ProtocolError):
        asyncio.run(read(b"\xff\xff\xff\xff" + b"\0" * 8))
    with pytest.raises(ProtocolError):
        asyncio.run(read(b"\0\0\0\x03" + b"\0" * 8 + b"abc"))
    with pytest.raises(asyncio.IncompleteReadError):
        asyncio.run(read(Frame({"type": "a"}, b"12345").encode()[:-2]))


def test_outbox_keeps_until_acked_and_replays_in_order() -> None:
    box = SessionOutbox()
    for i in range(5):
        box.append({"type": "event", "i": i})
    assert [f.header["seq"] for f in box.after(2)] == [3, 4, 5]
    box.ack(3)
    assert len(box) == 2
    assert [f.header["i"] for f in box.after(0)] == [3, 4]
    box.ack(99)  # an ack beyond what was sent acks what was sent, no more
    assert len(box) == 0 and box.acked == 5
    assert box.append({"type": "event"}).header["seq"] == 6


# Against the real agent ----------------------------------------------------------
class RawSession:
    """A bare protocol client, to drive the agent below the kernel's link."""

    def __init__(self, cluster: jc.Cluster, name: str, secret: str | None = None) -> None:
        assert cluster._agent is not None
        self.path = cluster._agent.socket
        self.secret = cluster._agent.secret if secret is None else secret
        self.name = name
        self.last_seq = 0

    async def open(self, behind: Sequence[Frame] = (), **extra: Any) -> Frame:
        """Connect and say hello (with ``extra`` fields), the frames ``behind`` it at once; the agent's answer."""
        self.reader, self.writer = await asyncio.open_unix_connection(self.path)
        hello = {"type": "hello", "secret": self.secret, "session": self.name, "last_seq": self.last_seq, **extra}
        write_frame(self.writer, Frame(hello))
        for frame in behind:
            write_frame(self.writer, frame)
        return await asyncio.wait_for(read_frame(self.reader), 10)

    def request(self, request_id: str, op: str, body: dict[str, Any]) -> None:
        write_frame(self.writer, Frame({"type": "request", "id": request_id, "op": op}, cloudpickle.dumps(body)))

    async def next_event(self) -> tuple[dict[str, Any], Any]:
        frame = await asyncio.wait_for(read_frame(self.reader), 30)
        self.last_seq = frame.header["seq"]
        return frame.header, cloudpickle.loads(frame.payload) if frame.payload else None

    def drop(self) -> None:
        self.writer.transport.abort()


def _driver_cell(cell_id: str, source: str) -> dict[str, Any]:
    return {"spec": CellSpec(cell_id=cell_id, source=source), "mode": "driver", "options": {}, "inputs": []}


def test_connection_without_the_secret_is_refused(cluster: jc.Cluster) -> None:
    async def attempt() -> Frame:
        return await RawSession(cluster, "intruder", secret="not-the-secret").open()

    answer = asyncio.run(attempt())
    assert answer.type == "refused" and "secret" in answer.header["reason"]


def test_socket_folder_is_private(cluster: jc.Cluster) -> None:
    assert cluster._agent is not None
    folder = os.path.dirname(cluster._agent.socket)
    assert stat.S_IMODE(os.stat(folder).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(cluster._agent.socket).st_mode) == 0o600


def test_resume_replays_exactly_what_was_missed(cluster: jc.Cluster) -> None:
    source = "import time\nfor i in range(6):\n    print(f'line {i}', flush=True)\n    time.sleep(0.3)\n"
    texts: list[str] = []

    async def scenario() -> list[str]:
        session = RawSession(cluster, f"resume-{time.time()}")
        assert (await session.open()).type == "welcome"
        session.request("r1", "run_cell", _driver_cell(f"resume-{time.time()}", source))
        while not any("line 1" in t for t in texts):
            header, data = await session.next_event()
            if header["event"] == "stream":
                texts.extend(text for _, text in data)
        session.drop()  # no ack was sent: the agent must keep and replay the rest
        await asyncio.sleep(1.0)  # lines are printed while nobody is attached
        assert (await session.open()).type == "welcome"
        session.request("r1", "run_cell", _driver_cell("never-runs", source))  # a re-sent request
        while True:
            header, data = await session.next_event()
            if header["event"] == "stream":
                texts.extend(text for _, text in data)
            if header.get("final"):
                finals = [header]
                break
        # Nothing else arrives for r1: the re-sent request did not run a second time.
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(read_frame(session.reader), 1.5)
        assert finals[0]["event"] == "done"
        return texts

    lines = "".join(asyncio.run(scenario())).splitlines()
    assert lines == [f"line {i}" for i in range(6)]


def test_kernel_link_survives_dropped_connections_mid_cell(cluster: jc.Cluster) -> None:
    source = "import time\nfor i in range(20):\n    print(i, flush=True)\n    time.sleep(0.1)\nn = 20"
    cell = cluster.run_cell(source)
    for _ in range(3):
        time.sleep(0.5)
        cluster._link.drop_connection()
    result = cell.result(60)
    assert result.outputs["n"] == 20
    assert cell.stdout.split() == [str(i) for i in range(20)]
    # The link is usable afterwards.
    assert cluster.run_cell("m = 1").result(30).outputs["m"] == 1


def test_requests_right_behind_a_hello_run_only_on_the_agent_they_were_for(cluster: jc.Cluster) -> None:
    """A reconnecting kernel sends its waiting requests behind its hello, naming the agent process they were for:
    that agent runs them at once; an agent started since (another pid) ignores them, and the kernel fails them."""
    assert cluster._agent is not None
    agent_pid = cluster._agent.process.pid

    def ping(request_id: str) -> Frame:
        return Frame({"type": "request", "id": request_id, "op": "ping"}, cloudpickle.dumps({"data": request_id}))

    async def scenario() -> tuple[list[Any], list[Any]]:
        ours = RawSession(cluster, f"behind-{time.time()}")
        assert (await ours.open([ping("p1")], agent_pid=agent_pid, pipelined=["p1"])).type == "welcome"
        answered = [(await ours.next_event())[1]]
        other = RawSession(cluster, f"behind-other-{time.time()}")
        assert (await other.open([ping("q1")], agent_pid=agent_pid + 10_000, pipelined=["q1"])).type == "welcome"
        other.request("q2", "ping", {"data": "q2"})  # sent after the welcome: runs
        heard = [(await other.next_event())[1]]
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(read_frame(other.reader), 1.0)
        return answered, heard

    answered, heard = asyncio.run(scenario())
    assert answered == ["p1"]
    assert heard == ["q2"], "a request for another agent process ran"


def test_a_request_made_while_the_link_is_down_is_answered_once_it_is_back(cluster: jc.Cluster) -> None:
    link = cluster._link
    for _ in range(3):
        link.drop_connection()
        assert link.call("ping", {"data": "back"}, timeout=30) == "back"
    assert cluster.run_cell("m = 2").result(30).outputs["m"] == 2


def test_a_large_value_sent_while_the_link_is_down_goes_once_it_is_back(cluster: jc.Cluster) -> None:
    """128 MiB is asked room for before it is sent, when the link is up; while it is down, the cell waits for the
    link as any cell does."""
    import numpy as np

    x = np.full(16 * 2**20, 3.0)
    for _ in range(2):
        cluster._link.drop_connection()
        cell = cluster.run_cell("y = float(x[-1])", namespace={"x": x})
        assert cell.result(120).outputs["y"] == x[-1]
        x[-1] += 1  # a new value: sent again


def test_an_agent_with_no_session_attached_exits_after_its_idle_time(tmp_path: Any) -> None:
    import subprocess
    import sys

    folder = tmp_path / "agent"
    env = {**os.environ, "JUPYTER_CLUSTER_SECRET": "s3cret"}
    command = [
        sys.executable,
        "-m",
        "jupyter_cluster.agent",
        "--socket",
        str(folder / "agent.sock"),
        "--local",
        "--num-cpus",
        "1",
        "--idle-timeout",
        "2",
    ]
    agent = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    try:
        assert b'"ready": true' in agent.stdout.readline()  # type: ignore[union-attr]

        async def visit() -> str:
            reader, writer = await asyncio.open_unix_connection(str(folder / "agent.sock"))
            write_frame(writer, Frame({"type": "hello", "secret": "s3cret", "session": "idle", "last_seq": 0}))
            answer = await read_frame(reader)
            await asyncio.sleep(3)  # attached: the idle clock does not run
            writer.close()
            return answer.type

        assert asyncio.run(visit()) == "welcome"
        assert agent.poll() is None, "an agent with a session attached stays"
        start = time.monotonic()
        assert agent.wait(timeout=30) == 0
        assert time.monotonic() - start < 10
        assert not (folder / "agent.sock").exists()
    finally:
        if agent.poll() is None:
            agent.kill()
