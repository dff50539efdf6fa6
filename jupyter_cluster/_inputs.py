"""Shipping a cell's inputs: by name, by handle, by value, or not at all.

Modules travel by name and handles by id. Everything else is pickled with
cloudpickle (notebook functions and classes by value; the data of arrays kept out of
band, so it is neither copied into the pickle nor by the link) and hashed; a name whose
content hash the agent already holds is sent as that hash alone, so a large value
read by ten cells crosses the link once. A value that cannot be pickled is refused
before anything is sent, naming the variable.
"""

from __future__ import annotations

import hashlib
import types
import uuid
from dataclasses import dataclass, field
from typing import Any, Protocol

import cloudpickle

from ._errors import InputError, failed_input
from ._handles import ObjectHandle
from .agent._protocol import Digest, Pickled
from .agent._shared import worth_sharing


@dataclass(frozen=True)
class Held:
    """A value the agent holds under an input name."""

    #: What the agent knows it by: its hash, or, sent before its hash was taken, a name of its own.
    token: str
    #: Its :func:`sample`, and its content hash (:meth:`Pickled.digest`), or that hash still to be taken.
    sample: str
    hash: str | Digest

    def digest(self) -> str:
        return self.hash if isinstance(self.hash, str) else self.hash.result()


#: Blocks a sample reads of each large buffer, and their size.
SAMPLE_BLOCKS = 64
SAMPLE_BLOCK = 4096


def sample(blob: Pickled) -> str:
    """A hash of part of ``blob``: of a small value, all of it; of a large one, its pickle
    stream, its buffers' sizes and a few blocks spread over each buffer. Two values whose
    samples differ differ: a value whose sample is not that of what was sent under its
    name needs no hash to know it is not held."""
    if not worth_sharing(blob):
        return blob.digest()
    h = hashlib.sha256(blob.data)
    for buffer in blob.buffers:
        view = memoryview(buffer).cast("B")
        h.update(len(view).to_bytes(8, "little"))
        step = max(SAMPLE_BLOCK, len(view) // SAMPLE_BLOCKS)
        for start in [*range(0, len(view), step), max(0, len(view) - SAMPLE_BLOCK)]:
            h.update(view[start : start + SAMPLE_BLOCK])
    return h.hexdigest()[:32]


class InputOwner(Protocol):
    """What the ledger needs of its cluster (a :class:`._cluster.Cluster`, which sits above)."""

    def _check_reachable(self, handle: ObjectHandle) -> None: ...

    def _stage(self, blob: Pickled, hash_later: bool = False) -> tuple[Any, Any, Any] | None:
        """``blob`` written into a shared-memory segment: what travels in its place, the
        segment and, ``hash_later``, its content hash still to be taken; ``None`` where it
        crosses the socket."""


#: Markers of code objects in a cloudpickle stream: functions or classes by value.
_CODE_MARKERS = (b"_make_function", b"_make_skeleton_class", b"_make_code", b"_builtin_type")


@dataclass
class ShippedInputs:
    """A cell's inputs, ready for the agent."""

    names: tuple[str, ...] = ()
    entries: list[tuple[str, str, Any]] = field(default_factory=list)
    modules: dict[str, str] = field(default_factory=dict)
    #: What the agent holds under each value input's name once it has them.
    held: dict[str, Held] = field(default_factory=dict)
    #: The values to be sent, by name, and their sizes in bytes.
    sizes: dict[str, int] = field(default_factory=dict)
    #: The pickle streams of every value input (sent or not): which modules they name.
    pickles: list[bytes] = field(default_factory=list)
    #: The shared-memory segments the values to send were written into (:mod:`._segments`).
    segments: list[Any] = field(default_factory=list)
    #: Value entries not yet packed (:meth:`InputLedger.pack`): where, their sample, their hash if taken.
    unpacked: list[tuple[int, str, str | None]] = field(default_factory=list)

    @property
    def sent_bytes(self) -> int:
        return sum(self.sizes.values())


def pickle_value(name: str, value: Any) -> Pickled:
    """cloudpickle ``value``, or raise :class:`InputError` naming ``name``."""
    try:
        return Pickled.of(value, cloudpickle.dumps)
    except Exception as exc:
        kind = type(value).__qualname__
        raise InputError(
            f"cannot send `{name}` (a {kind}) to the cluster: {type(exc).__name__}: {exc}. "
            f"Create it inside the remote cell instead, or keep it on the cluster with "
            f"`%%remote --actor NAME`. Nothing was sent."
        ) from None


class InputLedger:
    """What the agent holds for each input name, so unchanged values are not re-sent."""

    def __init__(self, owner: InputOwner | None = None) -> None:
        self.owner = owner
        self.held: dict[str, Held] = {}
        self.code_ok = True
        self.code_reason = ""

    def accepts_code(self, data: bytes) -> bool:
        """Whether a pickle may be loaded on the other side: always, unless the Python
        versions differ and it carries code."""
        return self.code_ok or not any(marker in data for marker in _CODE_MARKERS)

    def _check(self, name: str, handle: ObjectHandle, reader: str) -> None:
        """Refuse a handle whose cell failed (with that cell's error), or that this
        ledger's cluster cannot reach, before anything is sent."""
        if handle.error is not None:
            raise failed_input(name, handle.error, reader)
        if self.owner is not None and not handle.has_local_value:  # a value here travels as a value
            self.owner._check_reachable(handle)

    def prepare(self, names: list[str], namespace: dict[str, Any], reader: str = "the cell") -> ShippedInputs:
        """Make the inputs ``names`` of ``namespace`` ready to send for the cell ``reader``:
        pickled, and sized for the head's room; :meth:`pack` readies the values to send."""
        shipped = ShippedInputs()
        order = []
        for name in names:
            value = namespace[name]
            if isinstance(value, types.ModuleType):
                shipped.modules[name] = value.__name__
                continue
            order.append(name)
            if isinstance(value, ObjectHandle):
                self._check(name, value, reader)
                if value.has_local_value:
                    value = value.local_value  # resolved small output: send the value
                else:
                    shipped.entries.append((name, "handle", value.id))
                    continue
            if isinstance(value, (list, tuple)) and any(isinstance(v, ObjectHandle) for v in value):
                # A list of handles (a --map output, say) is built on the cluster from
                # its parts: the values never come through the notebook.
                for i, part in enumerate(value):
                    if isinstance(part, ObjectHandle):
                        self._check(f"{name}[{i}]", part, reader)
                parts = [
                    ("handle", v.id)
                    if isinstance(v, ObjectHandle) and not v.has_local_value
                    else ("value", pickle_value(f"{name}[{i}]", getattr(v, "local_value", v)))
                    for i, v in enumerate(value)
                ]
                shipped.entries.append((name, "parts", (type(value).__name__, parts)))
                continue
            blob = pickle_value(name, value)
            shipped.pickles.append(blob.data)
            if not self.accepts_code(blob.data):
                raise InputError(
                    f"cannot send `{name}`: it carries Python code (a function or class defined "
                    f"in the notebook), and {self.code_reason} Data-only inputs still work; "
                    "define the function inside the remote cell, or match the Python versions."
                )
            # The agent may hold this value already, under this name: only if a sample of its bytes is that of
            # what was sent under it. Then, and only then, its hash decides (a value whose sample differs is not
            # hashed on its way: see :meth:`pack`).
            fingerprint = sample(blob)
            before = self.held.get(name)
            if not worth_sharing(blob):
                digest: str | None = fingerprint  # a small value's sample is its hash
            elif before is not None and before.sample == fingerprint:
                digest = blob.digest()
            else:
                digest = None
            if before is not None and digest == before.digest():
                shipped.entries.append((name, "cached", before.token))
                shipped.held[name] = before
                continue
            shipped.unpacked.append((len(shipped.entries), fingerprint, digest))
            shipped.entries.append((name, "value", blob))
            shipped.sizes[name] = blob.nbytes
        shipped.names = tuple(order)
        return shipped

    def pack(self, shipped: ShippedInputs) -> None:
        """Make the values to send ready to go, once the head has said it has room for them.

        Where the agent shares this machine, a large value is written into a segment of
        shared memory (:mod:`._segments`), which travels in its place, and its hash, when
        :meth:`prepare` did not take one, is taken from the segment afterwards, once the
        agent has read it: the hash makes no pass on the value's way. Elsewhere the value's bytes go on the
        socket, hashed here. The caller owns the segments (``shipped.segments``).
        """
        while shipped.unpacked:
            index, fingerprint, digest = shipped.unpacked.pop(0)
            name, kind, blob = shipped.entries[index]
            sent: Any = blob
            staged = self.owner._stage(blob, hash_later=digest is None) if self.owner is not None else None
            if staged is not None:
                sent, segment, later = staged
                shipped.segments.append(segment)
                digest = digest or later
            hashed = digest or blob.digest()
            token = hashed if isinstance(hashed, str) else f"{name}@{uuid.uuid4().hex}"
            shipped.held[name] = Held(token, fingerprint, hashed)
            shipped.entries[index] = (name, kind, (token, sent))

    def accepted(self, shipped: ShippedInputs) -> None:
        """The agent now holds these values (it resolved the cell's inputs)."""
        self.held.update(shipped.held)

    def forget(self) -> None:
        self.held.clear()
