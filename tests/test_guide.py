"""The user guide's cells run, and show what the guide says they show (and the README's first look too).

The convention, which docs/guide.md states for its readers:

* Every ```` ```python ```` block is a notebook cell, and runs, unless the line just before it (blank lines
  aside) is a marker ``<!-- not run: REASON -->``; the reason is required.
* A ```` ```text ```` block right after a cell (blank lines aside) is what that cell shows. Each of its lines
  must match a line the cell printed or displayed (its ``Out``, its stdout and stderr, the text of what it
  displayed), in any order; ``...`` matches anything, and runs of spaces count as one.
* A cell whose shown output ends in an exception line (``InputError: cannot send ...``) must fail; every other
  cell must succeed.
* The cells of a ``##`` section run in order in one IPython shell, a fresh namespace per section, on the test
  session's embedded cluster. There ``%cluster local`` finds the cluster attached and says "Already attached";
  that is read as the "Attached to" line a fresh notebook shows.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "docs" / "guide.md", ROOT / "README.md"]

FENCE = re.compile(r"^(\s*)```(\w*)\s*$")
NOT_RUN = re.compile(r"^\s*<!--\s*not run:(.*?)-->\s*$")
HEADING = re.compile(r"^## (.+)$")
EXCEPTION_LINE = re.compile(r"^\w*(Error|Exception|Interrupt|Interrupted)\b[^:]*: ")
ANSI = re.compile(r"\x1b\[[0-9;]*m")
TAG = re.compile(r"<[^>]+>")
ALREADY = re.compile(r"Already attached: (<Cluster .*>)\. `%cluster down` first to start another\.")


@dataclass
class Block:
    page: str
    line: int  # of the opening fence, from 1
    end: int  # index of the closing fence's line, from 0
    lang: str
    code: str
    section: str
    not_run: str | None = None
    shows: str | None = None


@dataclass
class Section:
    page: str
    title: str
    blocks: list[Block] = field(default_factory=list)

    @property
    def id(self) -> str:
        anchor = re.sub(r"[^\w\- ]", "", self.title.lower()).replace(" ", "-")
        return f"{self.page}#{anchor}"


def parse(page: Path) -> list[Block]:
    """The fenced blocks of ``page``, each with its section, its not-run reason and the output shown after it."""
    lines = page.read_text().splitlines()
    blocks: list[Block] = []
    section = ""
    marker: tuple[int, str] | None = None
    i = 0
    while i < len(lines):
        line = lines[i]
        fence = FENCE.match(line)
        if fence is None:
            heading = HEADING.match(line)
            if heading:
                section = heading.group(1).strip()
            found = NOT_RUN.match(line)
            if found:
                marker = (i + 1, found.group(1).strip())
            elif line.strip() and marker is not None:
                raise AssertionError(f"{page.name}:{marker[0]}: a not-run marker must stand right before a block")
            i += 1
            continue
        start, indent, lang = i, fence.group(1), fence.group(2)
        body: list[str] = []
        i += 1
        while i < len(lines) and lines[i].strip() != "```":
            body.append(lines[i][len(indent) :] if lines[i].startswith(indent) else lines[i].lstrip())
            i += 1
        block = Block(page.name, start + 1, i, lang, "\n".join(body), section)
        if marker is not None:
            block.not_run = marker[1]
            marker = None
        previous = blocks[-1] if blocks else None
        follows = previous is not None and all(not x.strip() for x in lines[previous.end + 1 : start])
        if lang == "text" and follows and previous is not None and previous.lang == "python" and previous.shows is None:
            previous.shows = block.code
        blocks.append(block)
        i += 1
    assert marker is None, f"{page.name}:{marker[0]}: a not-run marker with no block after it"
    return blocks


def sections() -> list[Section]:
    found: dict[tuple[str, str], Section] = {}
    for page in PAGES:
        for block in parse(page):
            if block.lang == "python" and block.not_run is None:
                key = (block.page, block.section)
                found.setdefault(key, Section(block.page, block.section)).blocks.append(block)
    return list(found.values())


def _normal(line: str) -> str:
    return " ".join(ANSI.sub("", line).split())


def shown(stdout: str, stderr: str, outputs: list[Any]) -> list[str]:
    """What a cell showed, as lines: its stdout (``Out[n]:`` dropped) and stderr, and each display's text (its
    plain text, and its HTML's text)."""
    text = ALREADY.sub(r"Attached to \1.", stdout) + "\n" + stderr
    for output in outputs:
        text += "\n" + str(output.data.get("text/plain", ""))
        if "text/html" in output.data:
            text += "\n" + TAG.sub("", str(output.data["text/html"]))
    lines = [_normal(re.sub(r"^Out\[\d+\]: ?", "", line)) for line in ANSI.sub("", text).splitlines()]
    return [line for line in lines if line]


def unmatched(expected: str, got: list[str]) -> list[str]:
    """The lines of ``expected`` that match no line of ``got`` (``...`` matching anything)."""
    missing = []
    for line in filter(None, map(_normal, expected.splitlines())):
        pattern = re.compile(".*".join(re.escape(part) for part in line.split("...")))
        if not any(pattern.fullmatch(candidate) for candidate in got):
            missing.append(line)
    return missing


def test_every_block_follows_the_convention() -> None:
    """Each page parses (markers stand right before a block), every cell that does not run says why, and most
    of the guide runs."""
    for page in PAGES:
        blocks = parse(page)
        for block in blocks:
            where = f"{block.page}:{block.line}"
            if block.not_run is not None:
                assert block.lang == "python", f"{where}: a not-run marker before a {block.lang or 'plain'} block"
                assert block.not_run, f"{where}: a not-run marker without a reason"
        runs = [b for b in blocks if b.lang == "python" and b.not_run is None]
        checked = [b for b in runs if b.shows is not None]
        if page.name == "guide.md":
            assert len(runs) >= 25 and len(checked) >= 15, (len(runs), len(checked))


def test_the_output_matching_is_strict_enough() -> None:
    got = ["Attached to <Cluster embedded local Python 3.11.7 Ray 2.60.0 attached>.", "[0, 1, 4, 9]"]
    assert unmatched("Attached to <Cluster embedded local Python ... Ray ... attached>.\n[0, 1, 4, 9]", got) == []
    assert unmatched("[0, 1, 4]", got) == ["[0, 1, 4]"]
    assert unmatched("Attached to <Cluster ... attached>. and more", got) != []
    lines = shown("Already attached: <Cluster x>. `%cluster down` first to start another.\nOut[3]: 42\n", "", [])
    assert lines == ["Attached to <Cluster x>.", "42"]


@pytest.mark.ray
@pytest.mark.timeout(240)
@pytest.mark.parametrize("section", sections(), ids=lambda s: s.id)
def test_the_cells_of_a_section_run_as_shown(section: Section, shell: Any) -> None:
    from IPython.utils.capture import capture_output

    for block in section.blocks:
        where = f"{block.page}:{block.line}"
        with capture_output() as captured:
            result = shell.run_cell(block.code, store_history=True)
        got = shown(captured.stdout, captured.stderr, captured.outputs)
        report = f"{where}:\n{block.code}\n--- it showed:\n" + "\n".join(got)
        expected = block.shows or ""
        last = [line for line in expected.splitlines() if line.strip()][-1:]
        if last and EXCEPTION_LINE.match(last[0].strip()):
            assert not result.success, f"{report}\n--- it was to fail with: {last[0]}"
        else:
            assert result.success, report
        missing = unmatched(expected, got)
        assert not missing, f"{report}\n--- the guide shows lines it did not: {missing}"
