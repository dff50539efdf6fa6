"""The README, the user guide, the internals and CONTRIBUTING: every link to a file of the repository resolves,
every link to a section names a heading that exists, every screenshot the guide shows is committed, and the
guide's API reference names exactly the public names of ``jupyter_cluster.__all__``, with the functions'
signatures as the code has them, every public member of each public class, and every ``%cluster`` command with
its options. (tests/test_guide.py runs the guide's cells.)"""

from __future__ import annotations

import dataclasses
import inspect
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
GUIDE = ROOT / "docs" / "guide.md"
PAGES = [ROOT / "README.md", GUIDE, ROOT / "docs" / "internals.md", ROOT / "CONTRIBUTING.md"]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def _anchor(heading: str) -> str:
    """GitHub's id for a heading: lower case, punctuation but hyphens and underscores dropped, spaces as hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)  # a "# comment" in a code block is no heading
    return {_anchor(line.lstrip("#")) for line in text.splitlines() if line.startswith("#")}


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_every_link_resolves(page: Path) -> None:
    broken = []
    for target in LINK.findall(page.read_text()):
        if target.startswith(("http://", "https://", "mailto:")):
            continue
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            broken.append(f"{target}: no such file")
        elif anchor and file.suffix == ".md" and anchor not in _anchors(file):
            broken.append(f"{target}: no such heading in {file.name}")
    assert not broken, f"{page.name}: {broken}"


def test_the_guide_shows_screenshots_of_each_view() -> None:
    guide = GUIDE.read_text()
    shown = set(re.findall(r"!\[[^\]]*\]\(images/([^)]+)\)", guide))
    assert {"dashboard-in-jupyterlab.png", "sidebar.png", "training.png", "trials.png"} <= shown, shown
    for name in shown:
        image = ROOT / "docs" / "images" / name
        assert image.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name


def _reference() -> dict[str, str]:
    """The guide's API reference: each name it lists, with the code it shows for it (``jc.local(cpus=None, ...)``,
    or ``jc.Cluster``). Entries are list items that open with code; a search-space item lists several."""
    text = GUIDE.read_text()
    section = text.split("\n## API reference\n", 1)[1].split("\n## ", 1)[0]
    entries: dict[str, str] = {}
    for item in re.split(r"\n(?=- )", section):
        if not item.startswith("- `jc."):
            continue
        head = item.split("`:", 1)[0] + "`"  # the item's opening code spans, up to its description
        for code in re.findall(r"`(jc\.[^`]+)`", head):
            name = re.match(r"jc\.(\w+)", code)
            assert name is not None and name.group(1) not in entries, f"listed twice: {code}"
            entries[name.group(1)] = code
    return entries


def _signature(function: Callable[..., Any]) -> str:
    """A function's signature as the reference writes it: no annotations, no private parameters, double quotes."""
    signature = inspect.signature(function)
    public = [
        p.replace(annotation=inspect.Parameter.empty)
        for p in signature.parameters.values()
        if not p.name.startswith("_")
    ]
    plain = signature.replace(parameters=public, return_annotation=inspect.Signature.empty)
    return str(plain).replace("'", '"')


def test_the_api_reference_lists_every_public_name_and_no_other() -> None:
    import jupyter_cluster as jc

    listed = _reference()
    public = set(jc.__all__)
    assert not public - set(listed), f"public, but not in the guide's API reference: {sorted(public - set(listed))}"
    assert not set(listed) - public, f"in the API reference, but not in __all__: {sorted(set(listed) - public)}"
    for name, code in listed.items():
        obj = getattr(jc, name)
        if inspect.isfunction(obj):
            assert code == f"jc.{name}{_signature(obj)}", f"the reference shows {code}; the code has {_signature(obj)}"
        else:
            assert code == f"jc.{name}", f"{code}: a class is listed by its name alone"


def test_the_reference_check_can_fail() -> None:
    """The parser finds what a drifted reference would show."""
    import jupyter_cluster as jc

    assert _signature(jc.sync) == '(path=None, exclude=(), max_size="100MiB")'
    listed = _reference()
    assert listed["local"] == "jc.local(cpus=None, gpus=None, object_store=None, runtime_env=None)"
    assert {"choice", "uniform", "loguniform", "randint", "grid_search", "Cluster", "SyncError"} <= set(listed)


def _section(title: str) -> str:
    text = GUIDE.read_text().split("\n## API reference\n", 1)[1].split("\n## ", 1)[0]
    return text.split(f"\n### {title}\n", 1)[1].split("\n### ", 1)[0]


def _entries(title: str, opening: str) -> dict[str, str]:
    """The items of a section of the reference, sub-items included, by the name their first code span opens."""
    found = {}
    for item in re.split(r"\n(?=- )", _section(title)):
        name = re.match(rf"- `{re.escape(opening)}(\w+)", item)
        if name:
            found[name.group(1)] = item
    return found


def _members(cls: type) -> set[str]:
    """The public members the package's own classes give ``cls``: methods, properties, class attributes, dataclass
    fields and annotated attributes (not those of ipywidgets' or Python's classes it derives from)."""
    names: set[str] = set()
    for klass in cls.__mro__:
        if not klass.__module__.startswith("jupyter_cluster"):
            continue
        names |= set(vars(klass)) | set(getattr(klass, "__annotations__", {}))
    if dataclasses.is_dataclass(cls):
        names |= {f.name for f in dataclasses.fields(cls)}
    return {name for name in names if not name.startswith("_")}


def test_the_api_reference_lists_every_public_member_of_each_public_class() -> None:
    import jupyter_cluster as jc

    entries = _entries("Classes", "jc.")
    missing = {}
    for name in jc.__all__:
        cls = getattr(jc, name)
        if not inspect.isclass(cls) or issubclass(cls, BaseException):
            continue
        assert name in entries, f"jc.{name} is not under the reference's Classes"
        lacking = sorted(m for m in _members(cls) if not re.search(rf"`{m}\b", entries[name]))
        if lacking:
            missing[name] = lacking
    assert not missing, f"public members the API reference does not name: {missing}"


def test_the_member_check_can_fail() -> None:
    """What the issue found missing is among what the check reads: were it dropped from the guide, it would fail."""
    import jupyter_cluster as jc

    assert {"timeline", "cancel_all", "session", "alive", "link"} <= _members(jc.Cluster)
    assert {"history", "errors"} <= _members(jc.TuneResult) and "wait" in _members(jc.Run)
    assert {"cpus", "memory_available", "ray_env", "launcher_line"} <= _members(jc.ClusterStatus)
    assert {"spans", "to_chrome_trace"} <= _members(jc.Timeline) and {"close", "snapshot"} <= _members(jc.Dashboard)
    assert "observe" not in _members(jc.Dashboard)  # ipywidgets' own, not the package's


def test_the_magics_reference_lists_every_cluster_command_and_its_options() -> None:
    from jupyter_cluster._magics import _cluster_parser

    entries = _entries("Magics", "%cluster ")
    commands = next(a for a in _cluster_parser()._actions if a.dest == "command").choices  # type: ignore[attr-defined]
    assert set(commands) <= set(entries), sorted(set(commands) - set(entries))
    for command, parser in commands.items():
        options = [
            o for action in parser._actions for o in action.option_strings if o.startswith("--") and o != "--help"
        ]
        text = entries.get(command, "")
        shared = entries["connect"] if command == "up" else ""  # up takes connect's SSH options, said so
        lacking = [o for o in options if o not in text and o not in shared]
        assert not lacking, f"%cluster {command}: options the reference does not show: {lacking}"
