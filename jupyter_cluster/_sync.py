"""``%cluster sync``: the notebook's folder on every node, as the cells' working directory.

The folder is read here (``.gitignore`` files honoured, ``--exclude`` patterns, the folders no
cell needs left out), compared with what the head already holds by content hash, and only what
changed crosses the link, in pieces, under a progress bar. On the head the agent writes it into
a folder of the session's and hands it to Ray as the session's ``working_dir``: Ray packs it once
(by content), every node that runs a later task or actor of the session unpacks it, and the work
runs in it. Driver cells run in the agent itself; the folder's path on the head is in
:attr:`SyncResult.remote_path` for them.
"""

from __future__ import annotations

import fnmatch
import hashlib
import os
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from ._handles import format_size, parse_size
from .agent._errors import ClusterError

#: What a sync sends at most unless told otherwise: Ray's working_dir is for code and data of a
#: notebook's size (Ray itself refuses a package over its gRPC limit, 512 MiB).
DEFAULT_MAX_SIZE = 100 * 2**20
#: Folders never sent: version control, caches, environments, notebook checkpoints.
SKIPPED_DIRS = frozenset(
    {
        ".git",
        ".hg",
        ".svn",
        "__pycache__",
        ".ipynb_checkpoints",
        ".venv",
        "venv",
        ".tox",
        ".mypy_cache",
        ".pytest_cache",
        ".ruff_cache",
        "node_modules",
    }
)
#: Bytes of file data in one request to the agent (a large file goes in several).
PIECE = 4 * 2**20


@dataclass(frozen=True)
class Entry:
    rel: str  # POSIX path inside the folder
    path: str  # absolute path here
    size: int
    mtime_ns: int


@dataclass
class SyncResult:
    """What a sync did: the folder, what it holds, what crossed the link."""

    path: str
    remote_path: str
    files: int
    size: int
    sent_files: int
    sent_bytes: int
    removed: int
    elapsed: float
    working_dir: str

    def __repr__(self) -> str:
        if self.sent_files or self.removed:
            sent = f"sent {self.sent_files} changed file(s), {format_size(self.sent_bytes)}"
            if self.removed:
                sent += f"; removed {self.removed}"
        else:
            sent = "nothing changed since the last sync"
        return (
            f"<synced {self.path} ({self.files} files, {format_size(self.size)}) to {self.remote_path}: {sent}, "
            f"in {self.elapsed:.1f} s; later cells run in it on every node>"
        )


class SyncOwner(Protocol):
    """What a sync uses of the cluster (``_cluster.Cluster``): its requests, and the hashes it keeps."""

    _sync_digests: Digests

    def _call(self, op: str, body: dict[str, Any] | None = None, timeout: float | None = 60.0) -> Any: ...


class SyncError(ClusterError, ValueError):
    """A folder that cannot be synced as it is: says why and what to do."""


class _Ignore:
    """``.gitignore`` files (each applying to its folder and below), ``--exclude`` patterns and
    the folders never sent."""

    def __init__(self, root: Path, exclude: Iterable[str]) -> None:
        self.root = root
        self.exclude = [p.strip() for p in exclude if p.strip()]
        self.specs: dict[str, Any] = {}

    def load(self, folder: Path, rel: str) -> None:
        gitignore = folder / ".gitignore"
        if gitignore.is_file():
            import pathspec

            with open(gitignore, encoding="utf-8", errors="replace") as f:
                lines = f.readlines()
            try:  # git's own rules (pathspec 0.12 and later); before, their first version
                self.specs[rel] = pathspec.PathSpec.from_lines("gitignore", lines)
            except LookupError:
                self.specs[rel] = pathspec.PathSpec.from_lines("gitwildmatch", lines)

    def ignored(self, rel: str, is_dir: bool) -> bool:
        name = rel.rsplit("/", 1)[-1]
        if is_dir and name in SKIPPED_DIRS:
            return True
        for pattern in self.exclude:
            pattern = pattern.rstrip("/")
            if fnmatch.fnmatch(rel, pattern) or fnmatch.fnmatch(name, pattern) or rel.startswith(pattern + "/"):
                return True
        for base, spec in self.specs.items():
            if base and not (rel == base or rel.startswith(base + "/")):
                continue
            inner = rel[len(base) + 1 :] if base else rel
            if spec.match_file(inner + ("/" if is_dir else "")):
                return True
        return False


def scan(root: Path, exclude: Iterable[str] = ()) -> list[Entry]:
    """The files of ``root`` a sync sends, in a stable order."""
    ignore = _Ignore(root, exclude)
    entries: list[Entry] = []

    def walk(folder: Path, rel: str) -> Iterator[Entry]:
        ignore.load(folder, rel)
        with os.scandir(folder) as listing:
            items = sorted(listing, key=lambda e: e.name)
        for item in items:
            child = f"{rel}/{item.name}" if rel else item.name
            if item.is_symlink() and item.is_dir():
                continue  # a link to a folder could lead anywhere (a loop, the whole disk): left out
            if item.is_dir():
                if not ignore.ignored(child, True):
                    yield from walk(Path(item.path), child)
            elif item.is_file() and not ignore.ignored(child, False):
                stat = item.stat()
                yield Entry(child, item.path, stat.st_size, stat.st_mtime_ns)

    entries.extend(walk(root, ""))
    return entries


def _digest(path: str) -> str:
    h = hashlib.blake2b(digest_size=20)
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


class Digests:
    """Content hashes of the files last synced, kept while size and mtime say they did not change."""

    def __init__(self) -> None:
        self.known: dict[str, tuple[int, int, str]] = {}

    def of(self, entry: Entry) -> str:
        known = self.known.get(entry.path)
        if known is not None and known[:2] == (entry.size, entry.mtime_ns):
            return known[2]
        digest = _digest(entry.path)
        self.known[entry.path] = (entry.size, entry.mtime_ns, digest)
        return digest


def _too_big(root: Path, entries: list[Entry], total: int, limit: int) -> SyncError:
    largest = sorted(entries, key=lambda e: e.size, reverse=True)[:5]
    names = ", ".join(f"{e.rel} ({format_size(e.size)})" for e in largest)
    return SyncError(
        f"{root} holds {format_size(total)} in {len(entries):,} files, over the {format_size(limit)} a sync sends "
        f"(Ray's working_dir is for code and a notebook's data). The largest: {names}. Leave files out with "
        "--exclude 'PATTERN' (or a .gitignore line), put large data in the object store (jc.put) or on storage "
        "every node reads, or raise the limit: --max-size 500MiB (jc.sync(max_size=...))."
    )


def sync(
    cluster: SyncOwner,
    path: str | os.PathLike[str] | None = None,
    exclude: Iterable[str] = (),
    max_size: int | str = DEFAULT_MAX_SIZE,
    show_progress: Callable[[int], bool] = lambda count: False,
) -> SyncResult:
    """Send ``path`` (default: the notebook's folder, the kernel's working directory) to the
    head; later cells of the session run in it on every node (Ray's ``working_dir``). ``show_progress(n)``
    says whether sending ``n`` files gets a progress bar."""
    from . import _views

    started = time.monotonic()
    root = Path(path if path is not None else os.getcwd()).expanduser().resolve()
    if not root.exists():
        raise SyncError(f"{root} does not exist: give the folder to sync (default: the notebook's folder)")
    if not root.is_dir():
        raise SyncError(f"{root} is a file: a sync sends a folder (cells then run in it); sync its folder instead")
    limit = parse_size(max_size) if isinstance(max_size, str) else int(max_size)
    if isinstance(exclude, str):
        exclude = [exclude]
    entries = scan(root, exclude)
    total = sum(e.size for e in entries)
    if total > limit:
        raise _too_big(root, entries, total, limit)
    digests = cluster._sync_digests
    manifest = {e.rel: [e.size, digests.of(e)] for e in entries}
    plan = cluster._call("sync_plan", {"name": root.name or "root", "manifest": manifest})
    needed = set(plan["need"])
    need = [e for e in entries if e.rel in needed]
    sent_bytes = sum(e.size for e in need)
    bar = None
    if need and show_progress(len(need)):
        bar = _views.views.progress(max(1, (sent_bytes + 1023) // 1024), f"jc.sync({root.name})", "KiB")
    done = 0
    for batch in _batches(need):
        cluster._call("sync_put", {"files": batch}, timeout=300)
        done += sum(len(piece[2]) for piece in batch)
        if bar is not None:
            bar.update(done=done // 1024)
    answer = cluster._call("sync_commit", {"manifest": manifest}, timeout=600)
    if bar is not None:
        bar.finish("done", done=max(1, (sent_bytes + 1023) // 1024))
    return SyncResult(
        path=str(root),
        remote_path=answer["path"],
        files=len(entries),
        size=total,
        sent_files=len(need),
        sent_bytes=sent_bytes,
        removed=plan["removed"],
        elapsed=time.monotonic() - started,
        working_dir=answer["working_dir"],
    )


def _batches(entries: list[Entry]) -> Iterator[list[tuple[str, int, bytes, bool]]]:
    """The files' bytes as ``(rel, offset, data, last)`` pieces, about :data:`PIECE` bytes a batch
    (a file is sent as large as it was found: what it grew by since is left for the next sync)."""
    batch: list[tuple[str, int, bytes, bool]] = []
    size = 0
    for entry in entries:
        with open(entry.path, "rb") as f:
            offset = 0
            while True:
                data = f.read(min(PIECE - size, entry.size - offset))
                offset += len(data)
                last = offset >= entry.size or not data
                batch.append((entry.rel, offset - len(data), data, last))
                size += len(data)
                if size >= PIECE:
                    yield batch
                    batch, size = [], 0
                if last:
                    break
    if batch:
        yield batch


__all__ = ["DEFAULT_MAX_SIZE", "SyncError", "SyncResult", "scan", "sync"]
