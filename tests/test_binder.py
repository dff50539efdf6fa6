"""The Binder spec (binder/) says what pyproject.toml says: the examples' dependency set, the Python, the torch build.

repo2docker installs binder/requirements.txt from the repository root; these checks keep it from
drifting away from the package: every module an example imports (in the notebook or in its
%%remote cells, which run in the same environment on the embedded cluster) is installed by it."""

from __future__ import annotations

import ast
import importlib.metadata
import json
import re
import sys
from pathlib import Path

import pytest
from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

tomllib = pytest.importorskip("tomllib")  # Python 3.11 and later

ROOT = Path(__file__).resolve().parent.parent
BINDER = ROOT / "binder"


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
    for notebook in sorted((ROOT / "examples").glob("[0-9][0-9]-*.ipynb")):
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
