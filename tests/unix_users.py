"""Unix users for the tests that need several (a JupyterHub's, users kept apart on one host): made with
``useradd`` (root only) and kept, and what they need to run this environment's Python."""

from __future__ import annotations

import contextlib
import pwd
import subprocess
from collections.abc import Iterator
from pathlib import Path


def make_user(name: str) -> Path:
    with contextlib.suppress(KeyError):
        return Path(pwd.getpwnam(name).pw_dir)
    subprocess.run(["useradd", "--create-home", "--shell", "/bin/bash", name], check=True)
    return Path(pwd.getpwnam(name).pw_dir)


@contextlib.contextmanager
def reachable(*paths: Path) -> Iterator[None]:
    """Every folder above ``paths`` searchable by other users (``o+x``, not listable) while the hub runs, as a
    hub's administrator makes a shared Python reachable: the users' servers run this environment's Python,
    whose interpreter may live under root's home (pyenv's). Put back as it was after."""
    changed: list[tuple[Path, int]] = []
    try:
        for path in paths:
            for folder in [*reversed(path.parents), path]:
                if folder.is_dir():
                    mode = folder.stat().st_mode
                    if not mode & 0o001:
                        folder.chmod(mode | 0o001)
                        changed.append((folder, mode))
        yield
    finally:
        for folder, mode in reversed(changed):
            folder.chmod(mode & 0o7777)


def this_python_reachable() -> contextlib.AbstractContextManager[None]:
    """:func:`reachable` for this environment, its base interpreter and this repository (an editable install)."""
    import os
    import sys

    here = Path(__file__).resolve().parent.parent
    return reachable(Path(sys.prefix), Path(sys.base_prefix), Path(os.path.realpath(sys.executable)).parent, here)


def as_user(name: str, code: str, stdin: int | None = None) -> subprocess.Popen[str]:
    """``python -c code`` of this environment, run as the Unix user ``name`` (their uid, group and no other
    groups) in their home, its output piped."""
    import os
    import sys

    entry = pwd.getpwnam(name)
    env = {"HOME": entry.pw_dir, "USER": name, "PATH": f"{sys.prefix}/bin:/usr/bin:/bin", "LANG": "C.UTF-8"}
    env.update({k: v for k, v in os.environ.items() if k in ("PYTHONPATH",)})
    return subprocess.Popen(
        [sys.executable, "-c", code],
        user=entry.pw_uid,
        group=entry.pw_gid,
        extra_groups=[],
        cwd=entry.pw_dir,
        env=env,
        stdin=stdin,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
