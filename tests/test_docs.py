"""The README and the user guide: every link to a file of the repository resolves, every link to a section
names a heading that exists, and every screenshot the guide shows is committed."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", ROOT / "docs" / "guide.md"]
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
    guide = (ROOT / "docs" / "guide.md").read_text()
    shown = set(re.findall(r"!\[[^\]]*\]\(images/([^)]+)\)", guide))
    assert {"dashboard-in-jupyterlab.png", "sidebar.png", "training.png", "trials.png"} <= shown, shown
    for name in shown:
        image = ROOT / "docs" / "images" / name
        assert image.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name
