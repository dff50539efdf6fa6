"""The wheel a user installs: `python -m build` makes the sdist and, from it, the wheel, on a PATH without Node
(the sidebar comes prebuilt in the sdist); each holds what it should and nothing more; and the wheel, installed
with pip into a fresh virtualenv that has no Node either, gives JupyterLab the sidebar and IPython the magics."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tarfile
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "jupyter_cluster"
LABEXT = "jupyter-cluster-labextension"
SHARE = f"share/jupyter/labextensions/{LABEXT}"

# What pip, the venv and the Jupyter commands may use from /usr/bin and /bin: a few basics, never Node.
TOOLS = ["sh", "bash", "env", "uname", "cat", "ls", "cp", "mv", "rm", "mkdir", "ln", "chmod"]
NODE_TOOLS = ["node", "nodejs", "npm", "npx", "yarn", "yarnpkg", "corepack", "jlpm"]
# What pip says when the package index cannot be reached at all.
NO_NETWORK = re.compile(
    r"Failed to establish a new connection|Temporary failure in name resolution|Network is unreachable"
    r"|Name or service not known|ProxyError|Could not fetch URL"
)


def _python_files() -> set[str]:
    """The package's Python files on disk, relative to the repository root."""
    return {
        p.relative_to(ROOT).as_posix()
        for p in PACKAGE.rglob("*.py")
        if "__pycache__" not in p.parts and "labextension" not in p.relative_to(PACKAGE).parts
    }


def _run(argv: list[str], *, env: dict[str, str], cwd: Path, timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, env=env, cwd=cwd, timeout=timeout)


def _clean_env(path: str, tmp: Path) -> dict[str, str]:
    """This process's environment with PATH set to ``path`` and nothing that points into another Python or
    another Jupyter: no virtualenv, no PYTHONPATH, Jupyter's and IPython's own folders under ``tmp``."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "CONDA_PREFIX", "PIP_TARGET")
        and not k.startswith(("JUPYTER", "IPYTHON"))
    }
    env["PATH"] = path
    for name in ("JUPYTER_CONFIG_DIR", "JUPYTER_DATA_DIR", "JUPYTER_RUNTIME_DIR", "IPYTHONDIR"):
        (tmp / name.lower()).mkdir(exist_ok=True)
        env[name] = str(tmp / name.lower())
    return env


def _tools_dir(tmp: Path) -> Path:
    """A folder of links to TOOLS alone: with it, PATH reaches the basics of /usr/bin but not its node or npm."""
    tools = tmp / "tools"
    tools.mkdir(exist_ok=True)
    for name in TOOLS:
        found = shutil.which(name, path="/usr/bin:/bin")
        if found and not (tools / name).exists():
            (tools / name).symlink_to(found)
    return tools


def _assert_no_node(path: str) -> None:
    reachable = {name: shutil.which(name, path=path) for name in NODE_TOOLS}
    assert not any(reachable.values()), f"Node is reachable on PATH={path}: {reachable}"


@pytest.fixture(scope="module")
def dists(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Path]]:
    """The sdist and the wheel built from it, by `python -m build --no-isolation`, with no Node on PATH."""
    built = PACKAGE / "labextension" / "static" / "style.js"
    if not built.exists():
        pytest.fail(
            f"{built.relative_to(ROOT)} is missing: the sidebar is built by `pip install -e .` (with Node), "
            "and the sdist ships it prebuilt"
        )
    tmp = tmp_path_factory.mktemp("build")
    out = tmp / "dist"
    path = str(_tools_dir(tmp))
    _assert_no_node(path)
    start = time.monotonic()
    done = _run(
        [sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), str(ROOT)],
        env=_clean_env(path, tmp),
        cwd=tmp,
        timeout=300,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, f"python -m build failed ({done.returncode}):\n{output[-6000:]}"
    print(f"python -m build: {time.monotonic() - start:.1f} s")
    assert "Building wheel from sdist" in output, output[-3000:]
    sdists, wheels = sorted(out.glob("*.tar.gz")), sorted(out.glob("*.whl"))
    assert len(sdists) == 1 and len(wheels) == 1, sorted(p.name for p in out.iterdir())
    yield sdists[0], wheels[0]


def test_sdist_holds_what_builds_the_wheel(dists: tuple[Path, Path]) -> None:
    sdist, _ = dists
    with tarfile.open(sdist) as tar:
        names = {name.split("/", 1)[1] for name in tar.getnames() if "/" in name}
        license_text = tar.extractfile(f"{sdist.name.removesuffix('.tar.gz')}/LICENSE")
        assert license_text is not None
        assert license_text.read().decode() == (ROOT / "LICENSE").read_text()
    files = {n for n in names if not any(other.startswith(n + "/") for other in names)}
    print(f"sdist: {sdist.name}, {sdist.stat().st_size / 1024:.0f} KiB, {len(files)} files")

    needed = {
        "pyproject.toml",
        "README.md",
        "LICENSE",
        "PKG-INFO",
        "install.json",
        "labextension/package.json",
        "labextension/yarn.lock",
        "labextension/.yarnrc.yml",
        "labextension/tsconfig.json",
        "labextension/src/index.ts",
        "labextension/schema/plugin.json",
        "labextension/style/index.css",
        # The sidebar prebuilt: a wheel built from this sdist needs no Node.
        "jupyter_cluster/labextension/package.json",
        "jupyter_cluster/labextension/static/style.js",
        f"jupyter_cluster/labextension/schemas/{LABEXT}/plugin.json",
        *_python_files(),
    }
    assert not needed - files, f"missing from the sdist: {sorted(needed - files)}"
    assert any(re.fullmatch(r"jupyter_cluster/labextension/static/remoteEntry\.\w+\.js", n) for n in files)

    unwanted = re.compile(
        r"(^|/)(node_modules|__pycache__|\.yarn|__tests__|coverage)/|^labextension/lib/|\.tsbuildinfo$|\.eslintcache$"
        r"|^(tests|examples|benchmarks|scripts|binder|\.ci|\.git|dist|build)/"
    )
    assert not [n for n in files if unwanted.search(n)], sorted(n for n in files if unwanted.search(n))
    # Everything but the sidebar's prebuilt files and the user guide is source the wheel is made from.
    tops = {n.split("/", 1)[0] for n in files}
    assert tops <= {"pyproject.toml", "README.md", "LICENSE", "PKG-INFO", ".gitignore", "install.json"} | {
        "jupyter_cluster",
        "labextension",
        "docs",
    }, sorted(tops)
    assert sdist.stat().st_size < 2 * 1024 * 1024, f"the sdist is {sdist.stat().st_size} bytes"


def test_wheel_holds_the_package_the_sidebar_and_the_license(dists: tuple[Path, Path]) -> None:
    _, wheel = dists
    version = wheel.name.split("-")[1]
    dist_info, data = f"jupyter_cluster-{version}.dist-info", f"jupyter_cluster-{version}.data/data/{SHARE}"
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        metadata = zf.read(f"{dist_info}/METADATA").decode()
        license_text = zf.read(f"{dist_info}/licenses/LICENSE").decode()
        labext_package = zf.read(f"{data}/package.json").decode()
    print(f"wheel: {wheel.name}, {wheel.stat().st_size / 1024:.0f} KiB, {len(names)} files")

    assert license_text == (ROOT / "LICENSE").read_text()
    assert "License-Expression: BSD-3-Clause" in metadata
    assert "License-File: LICENSE" in metadata
    assert f'"name": "{LABEXT}"' in labext_package
    load = re.search(r'"load": "(static/remoteEntry\.\w+\.js)"', labext_package)
    assert load, labext_package

    needed = {
        f"{dist_info}/METADATA",
        f"{dist_info}/RECORD",
        f"{dist_info}/licenses/LICENSE",
        f"{data}/package.json",
        f"{data}/install.json",
        f"{data}/static/style.js",
        f"{data}/{load.group(1)}",
        f"{data}/schemas/{LABEXT}/plugin.json",
        "jupyter_cluster/py.typed",
        *_python_files(),
    }
    assert not needed - names, f"missing from the wheel: {sorted(needed - names)}"
    # Only the package, its dist-info and the sidebar's share data; no tests, no caches, and the prebuilt
    # sidebar once (as share data), not again inside the package.
    outside = sorted(
        n for n in names if not n.startswith(("jupyter_cluster/", f"{dist_info}/", f"{data}/")) or n.endswith("/")
    )
    assert not outside, f"in the wheel but neither the package, its dist-info nor the sidebar: {outside}"
    unwanted = sorted(
        n
        for n in names
        if re.search(r"(^|/)(tests?|__pycache__|examples|benchmarks|scripts|node_modules)/|\.pyc$", n)
        or n.startswith("jupyter_cluster/labextension/")
    )
    assert not unwanted, unwanted


def test_wheel_installs_into_a_fresh_venv_without_node(dists: tuple[Path, Path], tmp_path: Path) -> None:
    """As a user installs it, with JupyterLab (the `lab` extra) and its dependencies from the package index, into
    a virtualenv whose PATH reaches no Node: JupyterLab lists the sidebar enabled and OK, and IPython loads the
    extension (the kernel side never imports Ray, so the base dependencies suffice)."""
    _, wheel = dists
    venv = tmp_path / "venv"
    bin_dir = venv / "bin"
    path = f"{bin_dir}{os.pathsep}{_tools_dir(tmp_path)}"
    _assert_no_node(path)
    env = _clean_env(path, tmp_path)
    timings = {}

    start = time.monotonic()
    done = _run([sys.executable, "-m", "venv", str(venv)], env=env, cwd=tmp_path, timeout=180)
    assert done.returncode == 0, done.stdout + done.stderr
    timings["venv"] = time.monotonic() - start
    python = str(bin_dir / "python")

    start = time.monotonic()
    done = _run(
        [python, "-m", "pip", "install", "--progress-bar", "off", f"{wheel}[lab]"], env=env, cwd=tmp_path, timeout=420
    )
    timings["pip install"] = time.monotonic() - start
    output = done.stdout + done.stderr
    if done.returncode != 0 and NO_NETWORK.search(output):
        pytest.skip(f"the package index cannot be reached to install the wheel's dependencies:\n{output[-1500:]}")
    assert done.returncode == 0, f"pip install failed ({done.returncode}):\n{output[-6000:]}"
    # jupyterlab brings its jlpm, which is nothing without Node: Node itself is still out of reach.
    for name in ("node", "nodejs", "npm", "npx", "yarn", "yarnpkg", "corepack"):
        assert shutil.which(name, path=path) is None, f"{name} is reachable after the install"

    start = time.monotonic()
    done = _run([str(bin_dir / "jupyter"), "labextension", "list"], env=env, cwd=tmp_path, timeout=180)
    timings["jupyter labextension list"] = time.monotonic() - start
    listing = re.sub(r"\x1b\[[0-9;]*m", "", done.stdout + done.stderr)
    assert done.returncode == 0, listing
    # The entry under the venv's own labextensions folder (not one some other Jupyter folder of this machine has).
    sections = re.split(r"^(\S.*)$", listing, flags=re.M)
    ours = dict(zip(sections[1::2], sections[2::2])).get(str(venv / "share" / "jupyter" / "labextensions"), "")
    assert re.search(rf"^\s+{LABEXT} v\S+ enabled OK \(python, jupyter_cluster\)\s*$", ours, re.M), listing
    assert (venv / SHARE / "static" / "style.js").is_file()

    check = """
import sys
from IPython.core.interactiveshell import InteractiveShell
ip = InteractiveShell.instance()
ip.run_line_magic("load_ext", "jupyter_cluster")
import jupyter_cluster
magics = ip.magics_manager.magics
print("prefix", sys.prefix)
print("file", jupyter_cluster.__file__)
print("magics", "cluster" in magics["line"], "remote" in magics["cell"])
print("ray", "ray" in sys.modules)
"""
    start = time.monotonic()
    done = _run([python, "-c", check], env=env, cwd=tmp_path, timeout=180)
    timings["%load_ext"] = time.monotonic() - start
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stdout + done.stderr
    lines = dict(line.split(" ", 1) for line in done.stdout.splitlines())
    assert Path(lines["prefix"]).resolve() == venv.resolve(), lines
    assert Path(lines["file"]).resolve().is_relative_to(venv.resolve()), lines
    assert lines["magics"] == "True True", lines
    assert lines["ray"] == "False", lines
    print(", ".join(f"{what}: {seconds:.1f} s" for what, seconds in timings.items()))
