"""The Binder spec (binder/) says what pyproject.toml says: the examples' dependency set, the Python, the torch build.

repo2docker installs binder/requirements.txt from the repository root; these checks keep it from
drifting away from the package: every module an example imports (in the notebook or in its
%%remote cells, which run in the same environment on the embedded cluster) is installed by it."""

from __future__ import annotations

import ast
import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from .test_examples import NOTEBOOKS

tomllib = pytest.importorskip("tomllib")  # Python 3.11 and later

ROOT = Path(__file__).resolve().parent.parent
BINDER = ROOT / "binder"
README = ROOT / "README.md"


def _requirements() -> list[str]:
    lines = (BINDER / "requirements.txt").read_text().splitlines()
    return [line.strip() for line in lines if line.strip() and not line.strip().startswith("#")]


def _pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_python_is_the_one_the_project_and_ci_use() -> None:
    assert (BINDER / "runtime.txt").read_text().strip() == "python-3.11"
    assert Requirement(f"x{_pyproject()['project']['requires-python']}").specifier.contains("3.11")


def test_requirements_install_this_repository_with_the_examples_extra_and_cpu_torch() -> None:
    lines = _requirements()
    assert "--extra-index-url https://download.pytorch.org/whl/cpu" in lines, "PyTorch's CPU wheels"
    pins = [line for line in lines if line.startswith("torch")]
    test_script = (ROOT / "scripts" / "test.sh").read_text()
    assert pins and re.search(rf'pip install "{re.escape(pins[0])}"', test_script), "the torch CI installs"
    assert ".[examples]" in lines, "the repository itself, with the examples' extra"
    others = [x for x in lines if not x.startswith(("--", "torch", ".["))]
    assert others == [], f"every other dependency is said once, in pyproject.toml: {others}"
    assert "examples" in _pyproject()["project"]["optional-dependencies"]
    assert not (BINDER / "postBuild").exists() or (BINDER / "postBuild").read_text().startswith("#!/bin/bash\nset -e")


def _closure(requirements: list[str]) -> set[str]:
    """Every distribution ``requirements`` install, as resolved in this environment (extras followed)."""
    seen: set[str] = set()
    todo = [(Requirement(r), "") for r in requirements]
    while todo:
        req, via_extra = todo.pop()
        env = {**default_environment(), "extra": via_extra}
        if req.marker is not None and not req.marker.evaluate(env):
            continue
        name = canonicalize_name(req.name)
        extras = sorted(req.extras)
        key = f"{name}[{','.join(extras)}]"
        if key in seen:
            continue
        seen.add(key)
        try:
            dist = importlib.metadata.distribution(req.name)
        except importlib.metadata.PackageNotFoundError:
            continue
        for line in dist.requires or []:
            inner = Requirement(line)
            if inner.marker is None or inner.marker.evaluate({**default_environment(), "extra": ""}):
                todo.append((inner, ""))
            else:
                for extra in extras:
                    if inner.marker.evaluate({**default_environment(), "extra": extra}):
                        todo.append((inner, extra))
    return {key.split("[", 1)[0] for key in seen}


def _imports(source: str) -> set[str]:
    code = "\n".join(line for line in source.splitlines() if not line.lstrip().startswith(("%", "!")))
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return set()
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


def test_every_module_the_examples_import_is_installed_by_the_binder_spec() -> None:
    extra = _pyproject()["project"]["optional-dependencies"]["examples"]
    installed = _closure([*extra, *_pyproject()["project"]["dependencies"], "torch"])
    providers = importlib.metadata.packages_distributions()
    missing = {}
    for notebook in NOTEBOOKS:
        cells = json.loads(notebook.read_text())["cells"]
        for cell in cells:
            if cell["cell_type"] != "code":
                continue
            for module in _imports("".join(cell["source"])):
                if module in sys.stdlib_module_names or module == "jupyter_cluster":
                    continue
                dists = {canonicalize_name(d) for d in providers.get(module, [])}
                if not dists & installed:
                    missing.setdefault(module, []).append(notebook.name)
    assert not missing, f"imported by the examples but not installed by binder/requirements.txt: {missing}"


def test_the_readme_badge_launches_this_repository_on_examples() -> None:
    """The Binder badge opens JupyterLab on examples/ of the repository pyproject.toml names, at its main branch."""
    repository = _pyproject()["project"]["urls"]["Repository"]
    owner_name = re.fullmatch(r"https://github\.com/([^/]+/[^/]+)", repository)
    assert owner_name, f"pyproject.toml's Repository is not a GitHub repository: {repository}"
    badges = re.findall(r"\[!\[[^\]]*\]\(https://mybinder\.org/badge_logo\.svg\)\]\(([^)]+)\)", README.read_text())
    assert badges == [f"https://mybinder.org/v2/gh/{owner_name[1]}/main?urlpath=lab/tree/examples"], badges


# ------------------------------------------------------------------------------------------ a small container


def test_a_small_container_gets_a_small_store_in_tmp() -> None:
    from jupyter_cluster.agent._sizing import STORE_MINIMUM, small_container

    binder: dict = {}
    notes = small_container(binder, 2 * 2**30, 64 * 2**20)  # Binder: 2 GiB, Docker's 64 MiB /dev/shm
    idle = {"num_workers_soft_limit": 0}  # an idle worker (300 MiB once it imported PyTorch) is given back
    assert binder == {
        "object_store_memory": int(2 * 2**30 * 0.15),
        "_system_config": idle,
        "_plasma_directory": "/tmp",
    }, binder
    assert notes == [
        "object store 307 MiB (15% of 2048 MiB)",
        "idle workers end after 1 s",
        "object store in /tmp (/dev/shm holds 64 MiB)",
    ]
    tiny: dict = {}
    small_container(tiny, 256 * 2**20, 2**30)
    assert tiny == {"object_store_memory": STORE_MINIMUM, "_system_config": idle}, "never below Ray's minimum"
    laptop: dict = {}
    assert small_container(laptop, 16 * 2**30, 8 * 2**30) == [] and laptop == {}, "a laptop is left to Ray"
    given = {"object_store_memory": 100 * 2**20}
    small_container(given, 2 * 2**30, 64 * 2**20)
    assert given == {"object_store_memory": 100 * 2**20, "_system_config": idle, "_plasma_directory": "/tmp"}


def test_the_memory_limit_is_the_processs_own_cgroups(tmp_path: Path) -> None:
    from jupyter_cluster.agent._sizing import cgroup_files, memory_limit

    proc = tmp_path / "cgroup"
    proc.write_text("12:cpu,cpuacct:/\n4:memory:/process_api/notebook\n0::/user.slice/a\n")
    files = cgroup_files(str(proc))
    assert files[:2] == (
        "/sys/fs/cgroup/memory/process_api/notebook/memory.limit_in_bytes",
        "/sys/fs/cgroup/user.slice/a/memory.max",
    ), files
    assert files[-2:] == ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes")
    proc.write_text("0::/\n")  # a container's own cgroup namespace: the root is its cgroup
    assert cgroup_files(str(proc)) == ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes")

    v1, v2, unlimited = tmp_path / "v1", tmp_path / "v2", tmp_path / "none"
    v1.write_text(f"{2 * 2**30}\n")
    v2.write_text("max\n")
    unlimited.write_text("9223372036854771712\n")  # v1's "no limit"
    assert memory_limit((str(v1), str(v2), str(tmp_path / "missing"))) == 2 * 2**30
    machine = memory_limit((str(v2), str(unlimited)))
    assert machine is not None and machine > 2**28, "no cgroup limit: the machine's memory"


# ------------------------------------------------------------------------- the examples in a Binder-sized box

#: Binder's memory limit (mybinder.org: 2 GB), and Docker's /dev/shm.
LIMIT = 2 * 2**30
#: The most anonymous memory an example may hold in the box: a box a little fuller than ours still holds it.
ANON_TARGET = int(1.8 * 2**30)
SHM = "64m"
CGROUP_V1 = Path("/sys/fs/cgroup/memory")
PEAKS = ROOT / "tests" / "artifacts" / "binder-peaks.json"

WRAPPER = """#!/bin/sh
# A kernel in a Binder-sized box: the memory cgroup $1, and a mount namespace whose /dev/shm is Docker's 64 MiB.
echo $$ > "$1/cgroup.procs"
exec unshare -m sh -c 'mount -t tmpfs -o size={shm} tmpfs /dev/shm && exec "$0" -m ipykernel_launcher -f "$1"' \\
    {python} "$2"
"""


def skip_without_boxes() -> None:
    """Skip where a kernel cannot be put in a box: it takes root, cgroup v1's memory controller and unshare."""
    if os.geteuid() != 0 or not (CGROUP_V1 / "cgroup.procs").exists() or not shutil.which("unshare"):
        pytest.skip("needs root, cgroup v1's memory controller at /sys/fs/cgroup/memory, and unshare")


def boxed_kernel(
    tmp_path: Path, cgroup: Path, monkeypatch: pytest.MonkeyPatch, wrapper: str, name: str, display_name: str
) -> str:
    """A kernelspec ``name`` whose kernel (and all it starts: the agent, Ray) runs in ``cgroup``, started by the
    shell script ``wrapper`` (its arguments: the cgroup and the connection file)."""
    script = tmp_path / f"{name}.sh"
    script.write_text(wrapper)
    script.chmod(0o755)
    spec = tmp_path / "jupyter" / "kernels" / name
    spec.mkdir(parents=True)
    argv = [str(script), str(cgroup), "{connection_file}"]
    (spec / "kernel.json").write_text(json.dumps({"argv": argv, "display_name": display_name, "language": "python"}))
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
    return name


def _binder_kernel(tmp_path: Path, cgroup: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A kernelspec ``python3-binder`` whose kernel runs in ``cgroup``, with Docker's 64 MiB /dev/shm."""
    wrapper = WRAPPER.format(shm=SHM, python=sys.executable)
    return boxed_kernel(tmp_path, cgroup, monkeypatch, wrapper, "python3-binder", "Binder-sized")


def remove_box(cgroup: Path) -> None:
    """Kill what is left in ``cgroup`` and remove it (the kernel's processes leave the cgroup as they exit)."""
    for _ in range(50):
        pids = (cgroup / "cgroup.procs").read_text().split()
        if not pids:
            break
        subprocess.run(["kill", "-9", *pids], capture_output=True)
        time.sleep(0.2)
    cgroup.rmdir()


@pytest.mark.slow
@pytest.mark.timeout(1200)
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_each_example_runs_in_2_gib_with_a_small_dev_shm(
    path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As on mybinder.org: the kernel, the agent and the embedded Ray in a 2 GiB memory cgroup (v1, as here), with a
    64 MiB /dev/shm. The notebook runs top to bottom with the checks test_examples.py makes. Its peaks are recorded in
    tests/artifacts/binder-peaks.json: of anonymous memory (the cgroup's ``total_rss``, sampled every 0.2 s: what
    the processes hold, page cache aside), which must stay within :data:`ANON_TARGET` so that a box a little fuller
    than this one still holds it, and the cgroup's ``memory.max_usage_in_bytes`` (page cache included)."""
    from .test_examples import EXPECTED, execute

    skip_without_boxes()
    monkeypatch.delenv("JC_EXAMPLE_HEAD", raising=False)
    cgroup = CGROUP_V1 / f"jc-binder-{path.stem}-{os.getpid()}"
    cgroup.mkdir()
    anon = [0]
    done = threading.Event()

    def sample() -> None:
        while not done.wait(0.2):
            try:
                stat = dict(line.split() for line in (cgroup / "memory.stat").read_text().splitlines())
                anon[0] = max(anon[0], int(stat.get("total_rss", 0)))
            except (OSError, ValueError):
                pass

    sampler = threading.Thread(target=sample, daemon=True)
    try:
        (cgroup / "memory.limit_in_bytes").write_text(str(LIMIT))
        sampler.start()
        execute(path, _binder_kernel(tmp_path, cgroup, monkeypatch), tmp_path, EXPECTED.get(path.name, []))
        peak = int((cgroup / "memory.max_usage_in_bytes").read_text())
        oom = (cgroup / "memory.oom_control").read_text()
    finally:
        done.set()
        if sampler.is_alive():
            sampler.join()
        remove_box(cgroup)
    peaks = json.loads(PEAKS.read_text()) if PEAKS.exists() else {}
    peaks[path.stem] = {"anon_peak_mib": anon[0] >> 20, "peak_mib": peak >> 20, "limit_mib": LIMIT >> 20}
    PEAKS.parent.mkdir(parents=True, exist_ok=True)
    PEAKS.write_text(json.dumps(peaks, indent=1, sort_keys=True) + "\n")
    print(f"{path.stem}: anonymous peak {anon[0] >> 20} MiB, peak {peak >> 20} MiB of {LIMIT >> 20} MiB")
    assert "oom_kill 0" in oom or "oom_kill" not in oom, f"{path.name}: the kernel's cgroup hit its limit: {oom}"
    assert anon[0] <= ANON_TARGET, f"{path.name}: {anon[0] >> 20} MiB of anonymous memory, over {ANON_TARGET >> 20}"


def test_the_agents_node_is_sized_by_its_own_cgroup_where_ray_read_another(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ray reads the root of /sys/fs/cgroup: in a box nested below it (our Binder replay), the machine's. The agent's
    node is read from the agent's own cgroup then (what code sizing its work, and the dashboard, must see)."""
    from jupyter_cluster.agent import _sizing

    box = tmp_path / "memory" / "box"
    box.mkdir(parents=True)
    (box / "memory.limit_in_bytes").write_text(str(2 * 2**30))
    (box / "memory.usage_in_bytes").write_text(str(900 * 2**20))
    (box / "memory.stat").write_text(f"total_rss {700 * 2**20}\ntotal_inactive_file {100 * 2**20}\n")
    files = (str(box / "memory.limit_in_bytes"),)
    assert _sizing.memory_used(files) == 800 * 2**20
    monkeypatch.setattr(_sizing, "cgroup_files", lambda proc="": files)
    sample = {"mem_total": 24.0 * 2**30, "mem_used": 6.0 * 2**30}  # what Ray read: the machine
    _sizing.own_memory(sample)
    assert sample == {"mem_total": 2.0 * 2**30, "mem_used": 800.0 * 2**20}
    inside = {"mem_total": 2.0 * 2**30, "mem_used": 1.5 * 2**30}  # Ray read the box itself: kept as Ray said
    _sizing.own_memory(inside)
    assert inside == {"mem_total": 2.0 * 2**30, "mem_used": 1.5 * 2**30}
