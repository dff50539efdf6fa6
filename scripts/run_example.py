"""Run example notebooks headless and keep the executed copies.

    python scripts/run_example.py [NOTEBOOK ...] [--all] [--commit] [--output PATH] [--timeout SECONDS]

Each notebook (default ``examples/01-quickstart.ipynb``; ``--all``: every ``examples/NN-*.ipynb``) runs top to
bottom in a fresh ``python3`` kernel, in the notebook's own folder, with nbclient. The executed copy is written
next to it as ``NAME.out.ipynb`` (git ignores those), also when a cell fails, so the failing output can be read
there. The exit status is 1 when a cell of any notebook raised.

With ``--commit``, a notebook that ran cleanly is written over its source with its outputs, as the repository
keeps them: what a reader without a kernel sees (text, images, the widgets' static snapshots), without what only
a live kernel uses (the BokehJS bundle, widget views and their saved state), and with the digest of the code it
ran in its metadata (``jupyter_cluster.code``: tests/test_examples.py fails when the code changed since).

An SSH example (09) attaches to the head that ``JC_EXAMPLE_HEAD`` names (with ``JC_EXAMPLE_OPTIONS``), and runs on
an embedded cluster without one. With ``--commit`` and no ``JC_EXAMPLE_HEAD``, it runs against a real ``sshd`` on
127.0.0.1 started for it (the test suite's, tests/sshd.py; needs root and OpenSSH's server), so that the committed
copy shows the SSH path; where that cannot run, it says so and runs without a head.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
DEFAULT = EXAMPLES / "01-quickstart.ipynb"

#: Output types a committed copy leaves out: they only do something beside a live kernel (the BokehJS bundle
#: Bokeh's notebook output sends, megabytes a notebook; widget views, whose state is not kept).
LIVE_ONLY = (
    "application/javascript",
    "application/vnd.bokehjs_load.v0+json",
    "application/vnd.bokehjs_exec.v0+json",
    "application/vnd.jupyter.widget-view+json",
)


#: The examples that attach over SSH to the head JC_EXAMPLE_HEAD names.
SSH_EXAMPLES = ("09-ssh.ipynb",)


def examples() -> list[Path]:
    """The example notebooks, in order (executed copies aside)."""
    return sorted(p for p in EXAMPLES.glob("[0-9][0-9]-*.ipynb") if not p.name.endswith(".out.ipynb"))


def code_digest(nb: Any) -> str:
    """What a committed copy's outputs came from: the code cells' sources, in order."""
    sources = ["".join(c["source"]) if isinstance(c["source"], list) else c["source"] for c in nb["cells"]]
    code = [s for s, c in zip(sources, nb["cells"]) if c["cell_type"] == "code"]
    return hashlib.sha256(json.dumps(code).encode()).hexdigest()[:16]


def committed(nb: Any, seconds: float) -> Any:
    """``nb`` as the repository keeps it: outputs without live-only parts, the code's digest in its metadata."""
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        kept = []
        for output in cell.outputs:
            if "data" in output:
                for kind in LIVE_ONLY:
                    output["data"].pop(kind, None)
                if not output["data"]:
                    continue
            kept.append(output)
        cell.outputs = kept
    nb.metadata.pop("widgets", None)
    nb.metadata["jupyter_cluster"] = {"code": code_digest(nb), "seconds": round(seconds)}
    return nb


@contextlib.contextmanager
def loopback_head() -> Iterator[dict[str, str] | None]:
    """What points an SSH example at a real ``sshd`` on 127.0.0.1, started here for it (tests/sshd.py: root login
    with a fresh key, the head's Python the one running this); None where one cannot run (not root, no sshd)."""
    if os.geteuid() != 0 or not shutil.which("sshd", path="/usr/sbin:/usr/local/sbin:/usr/bin"):
        yield None
        return
    sys.path.insert(0, str(ROOT))
    from tests.sshd import SSHKeys, SSHServer, free_port

    with tempfile.TemporaryDirectory(prefix="jc-example-sshd.") as tmp:
        keys = SSHKeys.generate(Path(tmp) / "keys")
        with SSHServer(keys, Path(tmp) / "sshd") as server:
            yield {
                "JC_EXAMPLE_HEAD": f"{server.user}@{server.host}:{server.port}",
                "JC_EXAMPLE_OPTIONS": f"--identity {server.identity} --known-hosts {server.known_hosts} "
                f"--python {sys.executable} --port {free_port()}",
            }


@contextlib.contextmanager
def environment(values: dict[str, str]) -> Iterator[None]:
    """``os.environ`` with ``values`` set (the kernel nbclient starts inherits it), restored afterwards."""
    saved = {key: os.environ.get(key) for key in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def run_committed(source: Path, output: Path | None, timeout: int, kernel: str, commit: bool) -> bool:
    """:func:`run`, with an SSH example pointed at a loopback head when its outputs are to be committed."""
    if not (commit and source.name in SSH_EXAMPLES and not os.environ.get("JC_EXAMPLE_HEAD")):
        return run(source, output, timeout, kernel, commit)
    with loopback_head() as head:
        if head is None:
            print(f"{source.name}: no sshd can run here (it needs root and OpenSSH's server): run without a head")
            return run(source, output, timeout, kernel, commit)
        print(f"{source.name}: attaching to a real sshd started for it at {head['JC_EXAMPLE_HEAD']}")
        with environment(head):
            return run(source, output, timeout, kernel, commit)


def run(source: Path, output: Path | None, timeout: int, kernel: str, commit: bool) -> bool:
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    out = (output or source.with_name(source.name.removesuffix(".ipynb") + ".out.ipynb")).resolve()
    nb = nbformat.read(source, as_version=4)
    client = NotebookClient(
        nb, timeout=timeout, kernel_name=kernel, resources={"metadata": {"path": str(source.parent)}}
    )
    print(f"Running {_shown(source)} ({len(nb.cells)} cells)…", flush=True)
    start = time.perf_counter()
    failed: BaseException | None = None
    try:
        client.execute()
    except CellExecutionError as exc:
        failed = exc
    finally:
        nbformat.write(nb, out)
    elapsed = time.perf_counter() - start
    if failed is not None:
        print(f"A cell failed after {elapsed:.1f} s:\n{failed}", file=sys.stderr)
        print(f"The executed copy, with the error, is in {_shown(out)}", file=sys.stderr)
        return False
    print(f"Done in {elapsed:.1f} s. The executed copy is in {_shown(out)}")
    if commit:
        nbformat.write(committed(nb, elapsed), source)
        print(f"Committed its outputs to {_shown(source)} ({source.stat().st_size / 1024:.0f} KiB)")
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Execute example notebooks headless with nbclient.")
    parser.add_argument("notebooks", nargs="*", type=Path, help=f"default: {DEFAULT.relative_to(ROOT)}")
    parser.add_argument("--all", action="store_true", help="every example notebook, in order")
    parser.add_argument("--commit", action="store_true", help="write each clean run's outputs into the notebook")
    parser.add_argument("--output", type=Path, help="where to write the executed copy (one notebook only)")
    parser.add_argument("--timeout", type=int, default=600, help="seconds allowed per cell (default: %(default)s)")
    parser.add_argument("--kernel", default="python3", help="kernel name (default: %(default)s)")
    args = parser.parse_args(argv)

    if args.all and args.notebooks:
        parser.error("give notebooks or --all, not both")
    notebooks = [p.resolve() for p in (examples() if args.all else args.notebooks or [DEFAULT])]
    if args.output and len(notebooks) > 1:
        parser.error("--output is for one notebook")
    for path in notebooks:
        if not path.is_file():
            parser.error(f"no such notebook: {path}")
    failed = [p for p in notebooks if not run_committed(p, args.output, args.timeout, args.kernel, args.commit)]
    if failed and len(notebooks) > 1:
        print(f"{len(failed)} of {len(notebooks)} failed: {', '.join(p.name for p in failed)}", file=sys.stderr)
    return 1 if failed else 0


def _shown(path: Path) -> str:
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


if __name__ == "__main__":
    sys.exit(main())
