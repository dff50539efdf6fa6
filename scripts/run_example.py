"""Run an example notebook headless and keep the executed copy.

    python scripts/run_example.py [NOTEBOOK] [--output PATH] [--timeout SECONDS]

The notebook (default ``examples/01-quickstart.ipynb``) runs top to bottom in a fresh
``python3`` kernel, in the notebook's own folder, with nbclient. The executed copy is
written next to it as ``NAME.out.ipynb`` (git ignores those), also when a cell fails,
so the failing output can be read there. The exit status is 1 when a cell raised.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT = ROOT / "examples" / "01-quickstart.ipynb"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Execute an example notebook headless with nbclient.")
    parser.add_argument("notebook", nargs="?", type=Path, default=DEFAULT, help="default: %(default)s")
    parser.add_argument("--output", type=Path, help="where to write the executed copy (default: NAME.out.ipynb)")
    parser.add_argument("--timeout", type=int, default=600, help="seconds allowed per cell (default: %(default)s)")
    parser.add_argument("--kernel", default="python3", help="kernel name (default: %(default)s)")
    args = parser.parse_args(argv)

    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    source: Path = args.notebook.resolve()
    if not source.is_file():
        parser.error(f"no such notebook: {source}")
    output: Path = (args.output or source.with_name(source.name.removesuffix(".ipynb") + ".out.ipynb")).resolve()

    nb = nbformat.read(source, as_version=4)
    client = NotebookClient(
        nb, timeout=args.timeout, kernel_name=args.kernel, resources={"metadata": {"path": str(source.parent)}}
    )
    print(f"Running {_shown(source)} ({len(nb.cells)} cells)…", flush=True)
    start = time.perf_counter()
    failed: BaseException | None = None
    try:
        client.execute()
    except CellExecutionError as exc:
        failed = exc
    finally:
        nbformat.write(nb, output)
    elapsed = time.perf_counter() - start
    if failed is not None:
        print(f"A cell failed after {elapsed:.1f} s:\n{failed}", file=sys.stderr)
        print(f"The executed copy, with the error, is in {_shown(output)}", file=sys.stderr)
        return 1
    print(f"Done in {elapsed:.1f} s. The executed copy is in {_shown(output)}")
    return 0


def _shown(path: Path) -> str:
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


if __name__ == "__main__":
    sys.exit(main())
