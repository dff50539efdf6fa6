"""The head's copy of each session's synced folder, handed to Ray as the session's ``working_dir``.

``sync_plan`` compares the kernel's manifest (path: size and content hash) with the copy and
answers what it lacks, removing what the folder no longer has; ``sync_put`` writes pieces of
files; ``sync_commit`` checks the copy against the manifest and packs it into Ray's package
store (``upload_working_dir_if_needed``, by content: an unchanged folder is not packed again).
The session's cells then carry ``working_dir: gcs://_ray_pkg_<hash>.zip``, which each node
unpacks once. Ray drops a package no job or task has used for a while, so before a cell
uses it after a pause the agent checks it is still there, and packs it again if not.

Every file operation runs on a thread: the loop only routes the requests.
"""

from __future__ import annotations

import asyncio
import logging
import os
import posixpath
import shutil
import time
from dataclasses import dataclass, field
from typing import Any

from ..cells._environment import Environments
from ..cells._objects import CellRequestError

log = logging.getLogger("jupyter_cluster.agent")

#: How often, at most, a session's package is checked to be still in Ray's store before a cell.
RECHECK = 300.0


@dataclass
class Folder:
    root: str  # the copy on the head
    digests: dict[str, str] = field(default_factory=dict)  # what the copy holds, as the kernel hashed it
    uri: str = ""
    checked: float = 0.0


def safe_rel(rel: Any) -> str:
    """A path inside the folder, refusing anything that would leave it."""
    if not isinstance(rel, str) or not rel or "\0" in rel:
        raise CellRequestError(f"sync: not a file path: {rel!r}")
    norm = posixpath.normpath(rel)
    if norm.startswith(("/", "../")) or norm in ("..", ".") or "\\" in rel:
        raise CellRequestError(f"sync: {rel!r} is not a path inside the synced folder")
    return norm


class SyncedFolders:
    """Each session's synced folder on the head."""

    def __init__(self, base: str, envs: Environments) -> None:
        self.base = base
        self.envs = envs
        self.folders: dict[str, Folder] = {}

    def _folder(self, session: str) -> Folder:
        folder = self.folders.get(session)
        if folder is None:
            raise CellRequestError("sync: no sync of this session is in progress; run %cluster sync again")
        return folder

    async def plan(self, session: str, name: str, manifest: dict[str, list[Any]]) -> dict[str, Any]:
        """What of ``manifest`` the copy lacks; what it has that the manifest does not is removed."""
        safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in name).strip(".") or "folder"
        root = os.path.join(self.base, "".join(c if c.isalnum() or c in "-_" else "_" for c in session), safe)
        folder = self.folders.get(session)
        if folder is None or folder.root != root:
            folder = self.folders[session] = Folder(root)
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(None, self._plan, folder, manifest)

    @classmethod
    def _plan(cls, folder: Folder, manifest: dict[str, list[Any]]) -> dict[str, Any]:
        """:meth:`plan`'s work, which grows with the folder's files: on a thread, off the agent's loop."""
        wanted = {safe_rel(rel): (int(size), str(digest)) for rel, (size, digest) in manifest.items()}
        removed = cls._prune(folder, wanted)
        need = [rel for rel, (_, digest) in wanted.items() if folder.digests.get(rel) != digest]
        return {"need": need, "removed": removed}

    @staticmethod
    def _prune(folder: Folder, wanted: dict[str, tuple[int, str]]) -> int:
        os.makedirs(folder.root, mode=0o700, exist_ok=True)
        if not folder.digests:  # a copy this agent did not write (an earlier agent's): start afresh
            shutil.rmtree(folder.root, ignore_errors=True)
            os.makedirs(folder.root, mode=0o700, exist_ok=True)
            return 0
        removed = 0
        for rel in list(folder.digests):
            if rel not in wanted:
                try:
                    os.remove(os.path.join(folder.root, rel))
                except OSError:
                    pass
                del folder.digests[rel]
                removed += 1
        for dirpath, dirnames, filenames in os.walk(folder.root, topdown=False):  # folders left empty
            if dirpath != folder.root and not dirnames and not filenames:
                try:
                    os.rmdir(dirpath)
                except OSError:
                    pass
        return removed

    async def put(self, session: str, pieces: list[tuple[str, int, bytes, bool]]) -> int:
        folder = self._folder(session)
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(None, self._write, folder, pieces)

    @staticmethod
    def _write(folder: Folder, pieces: list[tuple[str, int, bytes, bool]]) -> int:
        written = 0
        for given, offset, data, _last in pieces:
            rel = safe_rel(given)
            path = os.path.join(folder.root, rel)
            os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
            with open(path, "r+b" if offset else "wb") as f:
                f.seek(offset)
                f.write(data)
                f.truncate()
            folder.digests.pop(rel, None)  # known again at commit, once whole
            written += len(data)
        return written

    async def commit(self, session: str, manifest: dict[str, list[Any]]) -> dict[str, Any]:
        """Check the copy against ``manifest``, pack it for Ray, and make it the session's working_dir."""
        folder = self._folder(session)
        loop = asyncio.get_running_loop()
        uri = await loop.run_in_executor(None, self._commit, folder, manifest)
        self.envs.update(session, working_dir=uri)
        return {"path": folder.root, "working_dir": uri}

    @staticmethod
    def _commit(folder: Folder, manifest: dict[str, list[Any]]) -> str:
        wrong = []
        for rel, (size, digest) in manifest.items():
            rel = safe_rel(rel)
            try:
                ok = os.path.getsize(os.path.join(folder.root, rel)) == int(size)
            except OSError:
                ok = False
            if ok:
                folder.digests[rel] = str(digest)
            else:
                wrong.append(rel)
        if wrong:
            raise CellRequestError(
                f"sync: {len(wrong)} file(s) did not arrive whole ({', '.join(wrong[:5])}); run %cluster sync again"
            )
        folder.uri = pack(folder.root)
        folder.checked = time.monotonic()
        return folder.uri

    async def off(self, session: str) -> bool:
        """The session's cells no longer run in its folder, whose copy is removed."""
        folder = self.folders.pop(session, None)
        self.envs.sessions.setdefault(session, {}).pop("working_dir", None)
        if folder is None:
            return False
        await asyncio.get_running_loop().run_in_executor(None, shutil.rmtree, folder.root, True)
        return True

    async def keep(self, session: str) -> None:
        """Before a cell of ``session``: its package is still in Ray's store (packed again if Ray dropped it)."""
        folder = self.folders.get(session)
        if folder is None or not folder.uri or time.monotonic() - folder.checked < RECHECK:
            return
        folder.checked = time.monotonic()
        loop = asyncio.get_running_loop()
        uri = await loop.run_in_executor(None, _ensure_packed, folder.root, folder.uri)
        if uri != folder.uri:
            folder.uri = uri
            self.envs.update(session, working_dir=uri)


def pack(root: str) -> str:
    """``root`` in Ray's package store, as the ``gcs://`` URI a ``working_dir`` can name."""
    from ray._private.runtime_env.working_dir import upload_working_dir_if_needed

    env = upload_working_dir_if_needed({"working_dir": root}, include_gitignore=False, logger=log)
    return str(env["working_dir"])


def _ensure_packed(root: str, uri: str) -> str:
    from ray._private.runtime_env.packaging import package_exists, pin_runtime_env_uri

    if package_exists(uri):
        pin_runtime_env_uri(uri)
        return uri
    log.info("Ray dropped the synced package %s; packing %s again", uri, root)
    return pack(root)


__all__ = ["SyncedFolders", "pack", "safe_rel"]
