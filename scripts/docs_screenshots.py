"""Take the pictures the README and the user guide show, from runs of the examples in JupyterLab.

    python scripts/docs_screenshots.py [--only NAME ...] [--out FOLDER] [--keep FOLDER]

JupyterLab is served on loopback (tests/lab.py's server: a random token, its own root and settings), and
headless Chromium (Debian's, through Playwright) opens notebooks made from the examples, runs their cells,
opens the *Ray cluster* sidebar beside them and takes the pictures. Nothing is staged: every number in them
comes from the run. Each scene starts a fresh kernel and so a fresh embedded cluster; on two cores the whole
takes several minutes (the training run and the sweep most of it).

The pictures, in docs/images/ (``--only`` takes their names, with or without the extension):

* ``sidebar-start.png``: a copy of examples/01-quickstart.ipynb, not yet run: the sidebar shows how to start;
* ``dashboard-in-jupyterlab.png``: the cells of examples/10-watching.ipynb that start the cluster, open the
  dashboard, put a value in the object store and run a ``--map`` cell, with the sidebar beside them;
* ``tour.gif``: that ``--map`` cell running, its bar filling, the sidebar showing the running cell and the node's
  load, the dashboard moving (the README's first picture);
* ``training.png``: the output of examples/03-train-torch.ipynb's training run once it ended (the notebook run up
  to it, the left panel closed): its last header and table, and the picture of its curves;
* ``sidebar.png``: examples/04-tune-asha.ipynb up to its sweep, taken while the sweep runs;
* ``trials.png``: the output of that sweep once it ended: its last header and table, and the picture of its curves.

Each file written is printed with its size; look at every one before committing it. ``--keep FOLDER`` also keeps
every frame of the animation and the full page at each step there.
"""

from __future__ import annotations

import argparse
import io
import json
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
IMAGES = ROOT / "docs" / "images"

VIEWPORT = {"width": 1400, "height": 900}
#: The sidebar's width: wide enough for the link's socket path (widened further if a line is still cut).
SIDEBAR_WIDTH = 380
SIDEBAR_MAX_WIDTH = 520
SIDEBAR = "#jupyter-cluster-sidebar"

#: The animation: one frame every FRAME_EVERY seconds while the cell runs, and FRAMES_AFTER once it ended.
FRAME_EVERY = 0.3
FRAMES_AFTER = 6
#: Colours in the animation's palette (JupyterLab's flat colours and the plots' fit in fewer than 256).
GIF_COLOURS = 128

#: Run cell ``index`` of the current notebook without waiting: ``window.jcRuns[index]`` says when it has run.
START_CELL_JS = """
(index) => {
  const app = window.jupyterapp;
  const panel = app.shell.currentWidget;
  panel.content.activeCellIndex = index;
  panel.content.deselectAll();
  const state = {done: false, ok: null, error: null};
  window.jcRuns = window.jcRuns || {};
  window.jcRuns[index] = state;
  app.commands.execute("notebook:run-cell").then(
    (ok) => { state.done = true; state.ok = ok; },
    (error) => { state.done = true; state.ok = false; state.error = String(error); },
  );
  return true;
}
"""

#: The text of cell ``index``'s output area.
OUTPUT_JS = """
(index) => {
  const cell = window.jupyterapp.shell.currentWidget.content.widgets[index];
  return cell && cell.outputArea ? cell.outputArea.node.innerText : "";
}
"""

#: Lines of the sidebar that are cut (an ellipsis): [text, pixels missing].
CLIPPED_JS = """
(selector) => {
  const root = document.querySelector(selector);
  if (!root) return [];
  const cut = [];
  for (const el of root.querySelectorAll("*")) {
    if (el.children.length > 0 || !el.textContent.trim() || el.offsetParent === null) continue;
    const missing = el.scrollWidth - el.clientWidth;
    if (missing > 1) cut.push([el.textContent.trim(), missing]);
  }
  return cut;
}
"""

#: How many points in time the dashboard's series hold in the page (BokehJS's own data), -1 without one.
SERIES_POINTS_JS = """
() => {
  const Bokeh = window.Bokeh;
  if (!Bokeh || !Bokeh.index) return -1;
  let points = -1;
  for (const view of Bokeh.index) {
    const doc = view.model && view.model.document;
    if (!doc) continue;
    for (const model of doc._all_models.values()) {
      const data = model.data;
      if (data && typeof data === "object" && "cpu" in data && "t" in data) points = Math.max(points, data.t.length);
    }
  }
  return points;
}
"""


#: The dashboard's counts of the notebook's tasks, by state, as BokehJS holds them; null without a dashboard.
STATE_COUNTS_JS = """
() => {
  const Bokeh = window.Bokeh;
  if (!Bokeh || !Bokeh.index) return null;
  for (const view of Bokeh.index) {
    const doc = view.model && view.model.document;
    if (!doc) continue;
    for (const model of doc._all_models.values()) {
      const data = model.data;
      if (!data || typeof data !== "object" || !("count" in data)) continue;
      const counts = {};
      data.y.forEach((row, i) => { counts[row[0] + " " + row[1]] = data.count[i]; });
      return counts;
    }
  }
  return null;
}
"""


#: The box of what an element draws (its text, canvases and images, Bokeh's shadow roots included), in page pixels.
CONTENT_BOX_JS = """
(root) => {
  const box = {left: Infinity, top: Infinity, right: -Infinity, bottom: -Infinity};
  const add = (r) => {
    if (r.width < 1 || r.height < 1) return;
    box.left = Math.min(box.left, r.left); box.top = Math.min(box.top, r.top);
    box.right = Math.max(box.right, r.right); box.bottom = Math.max(box.bottom, r.bottom);
  };
  const walk = (node) => {
    const texts = document.createTreeWalker(node, NodeFilter.SHOW_TEXT);
    for (let text = texts.nextNode(); text; text = texts.nextNode()) {
      if (!text.textContent.trim() || text.parentElement.closest("style, script")) continue;
      const range = document.createRange();
      range.selectNodeContents(text);
      add(range.getBoundingClientRect());
    }
    for (const el of node.querySelectorAll("*")) {
      if (el.shadowRoot) walk(el.shadowRoot);
      if (el.tagName === "CANVAS" || el.tagName === "IMG") add(el.getBoundingClientRect());
    }
  };
  walk(root);
  return box;
}
"""


class _Folders:
    """What tests/lab.py's server asks of pytest's ``tmp_path_factory``: a fresh folder by name."""

    def __init__(self, base: Path) -> None:
        self._base = base

    def mktemp(self, name: str) -> Path:
        return Path(tempfile.mkdtemp(prefix=f"{name}-", dir=self._base))


def code_cells(example: str) -> list[str]:
    """The sources of an example's code cells."""
    nb = json.loads((EXAMPLES / example).read_text())
    return [_source(cell) for cell in nb["cells"] if cell["cell_type"] == "code"]


def _source(cell: dict[str, Any]) -> str:
    return "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]


def pick(cells: list[str], test: Callable[[str], bool], what: str) -> str:
    """The first of ``cells`` that passes ``test``; ``what`` names it when none does (the example changed)."""
    for source in cells:
        if test(source):
            return source
    raise LookupError(f"no cell {what}: has the example changed?")


def write_notebook(path: Path, cells: list[str]) -> None:
    import nbformat

    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(source) for source in cells]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, path)


def copy_example(example: str, path: Path, until: Callable[[str], bool] | None = None) -> int:
    """Copy an example without its outputs, up to and including the first code cell that passes ``until``
    (all of it when None); return that cell's index in the copy (-1 when ``until`` is None)."""
    import nbformat

    nb = nbformat.read(EXAMPLES / example, as_version=4)
    nb.metadata.pop("widgets", None)
    nb.metadata.pop("jupyter_cluster", None)
    kept = []
    last = -1
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs = []
            cell.execution_count = None
        kept.append(cell)
        if until is not None and cell.cell_type == "code" and until(_source(cell)):
            last = len(kept) - 1
            break
    if until is not None and last < 0:
        raise LookupError(f"{example}: no cell to stop at: has the example changed?")
    nb.cells = kept
    nbformat.write(nb, path)
    return last


def kb(path: Path) -> str:
    return f"{path.stat().st_size / 1024:.0f} KB"


@dataclass
class Shots:
    """One browser page on one JupyterLab server, and where the pictures go."""

    lab: Any
    page: Any
    out: Path
    keep: Path | None
    console: list[str] = field(default_factory=list)
    written: list[Path] = field(default_factory=list)

    # ----------------------------------------------------------- notebooks
    def open(self, name: str, sidebar: bool = True) -> None:
        """Open notebook ``name`` alone in a fresh JupyterLab page, on a fresh kernel, with the sidebar shown
        (or, with ``sidebar`` False, no left panel at all: the notebook as wide as the page)."""
        from tests.lab import KERNEL_IDLE_JS, api

        for session in api(self.lab, "/api/sessions"):  # the last scene's kernel, and its cluster with it
            api(self.lab, f"/api/sessions/{session['id']}", method="DELETE")
        self.page.goto(f"{self.lab.url}/lab/tree/{name}?reset&token={self.lab.token}", timeout=60_000)
        self.page.wait_for_selector("#jupyterlab-splash", state="detached", timeout=60_000)
        # Cells sent before the kernel is idle are dropped: wait for it.
        self.page.wait_for_function(KERNEL_IDLE_JS, arg=name, timeout=120_000)
        if not sidebar:
            self.close_left()
            return
        self.page.locator('.jp-SideBar [data-id="jupyter-cluster-sidebar"]').click(timeout=30_000)
        self.page.locator(SIDEBAR).wait_for(state="visible", timeout=30_000)
        self.sidebar_width(SIDEBAR_WIDTH)

    def close_left(self) -> None:
        """Close the left panel: the notebook takes the page's width."""
        from tests.lab import execute

        if not self.page.evaluate("() => window.jupyterapp.shell.leftCollapsed"):
            execute(self.page, "application:toggle-left-area")
        self.page.locator("#jp-left-stack").wait_for(state="hidden", timeout=10_000)

    def sidebar_width(self, width: int) -> None:
        """Drag the handle between the left panel and the notebook until the panel is ``width`` wide."""
        panel = self.page.locator("#jp-left-stack")
        box = panel.bounding_box()
        assert box is not None, "the left panel is not shown"
        handle = self.page.locator("#jp-main-split-panel > .lm-SplitPanel-handle:not(.lm-mod-hidden)").first
        grip = handle.bounding_box()
        assert grip is not None, "no handle beside the left panel"
        y = grip["y"] + grip["height"] / 2
        self.page.mouse.move(grip["x"] + grip["width"] / 2, y)
        self.page.mouse.down()
        self.page.mouse.move(box["x"] + width + grip["width"] / 2, y, steps=5)
        self.page.mouse.up()
        self.page.wait_for_function(
            "([w]) => Math.abs(document.querySelector('#jp-left-stack').getBoundingClientRect().width - w) < 4",
            arg=[width],
            timeout=10_000,
        )

    def unclip_sidebar(self) -> None:
        """Widen the sidebar until no line of it is cut, up to SIDEBAR_MAX_WIDTH; say what stays cut."""
        for _ in range(4):
            cut = self.page.evaluate(CLIPPED_JS, SIDEBAR)
            if not cut:
                return
            width = self.page.locator("#jp-left-stack").bounding_box()["width"]
            wider = min(SIDEBAR_MAX_WIDTH, int(width + max(missing for _, missing in cut) + 8))
            if wider <= width:
                break
            self.sidebar_width(wider)
        cut = self.page.evaluate(CLIPPED_JS, SIDEBAR)
        if cut:
            print(f"  the sidebar still cuts: {cut}")

    def start(self, index: int) -> None:
        """Run cell ``index``; :meth:`ran` says when it has run."""
        self.page.evaluate(START_CELL_JS, index)

    def ran(self, index: int) -> bool:
        state = self.page.evaluate("(i) => window.jcRuns && window.jcRuns[i]", index)
        if not state or not state["done"]:
            return False
        if state["ok"] is not True:
            raise RuntimeError(f"cell {index} failed: {state['error'] or ''}\n" + self.output(index)[-3000:])
        return True

    def wait_ran(self, index: int, timeout: float) -> None:
        self.page.wait_for_function(
            "(i) => !!(window.jcRuns && window.jcRuns[i] && window.jcRuns[i].done)", arg=index, timeout=timeout * 1000
        )
        self.ran(index)

    def run(self, index: int, timeout: float = 300) -> None:
        """Run cell ``index`` and wait for it to end; raise with its output when it failed."""
        self.start(index)
        self.wait_ran(index, timeout)

    def output(self, index: int) -> str:
        return str(self.page.evaluate(OUTPUT_JS, index))

    def scroll_to(self, index: int) -> None:
        """Scroll the notebook so that cell ``index`` is at the top."""
        self.page.evaluate(
            "(i) => window.jupyterapp.shell.currentWidget.content.widgets[i].node.scrollIntoView({block: 'start'})",
            index,
        )

    def series_points(self) -> int:
        return int(self.page.evaluate(SERIES_POINTS_JS))

    def wait_points(self, points: int, timeout: float = 60) -> None:
        """Wait until the dashboard in the page holds ``points`` points in time."""
        self.page.wait_for_function(
            f"(n) => ({SERIES_POINTS_JS})() >= n", arg=points, timeout=timeout * 1000, polling=250
        )

    # ------------------------------------------------------------ pictures
    def png(self, name: str, **options: Any) -> Path:
        """Write docs/images/``name``: the page as it is now (``options``: Playwright's, such as ``clip``)."""
        self.page.mouse.move(1, VIEWPORT["height"] - 1)  # no tooltip or hover
        path = self.out / name
        self.page.screenshot(path=str(path), **options)
        self.written.append(path)
        print(f"  {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}: {kb(path)}")
        return path

    def view_png(self, name: str, view: Any) -> Path:
        """Write docs/images/``name``: the widget ``view``, cut to what it draws (its box spans the output area)."""
        view.scroll_into_view_if_needed()
        self.page.evaluate("() => new Promise((done) => requestAnimationFrame(() => requestAnimationFrame(done)))")
        box = self.page.evaluate(CONTENT_BOX_JS, view.element_handle())
        pad = 8
        clip = {
            "x": max(0, box["left"] - pad),
            "y": max(0, box["top"] - pad),
            "width": box["right"] - box["left"] + 2 * pad,
            "height": box["bottom"] - box["top"] + 2 * pad,
        }
        return self.png(name, clip=clip)

    def keep_page(self, name: str) -> None:
        if self.keep is not None:
            self.page.screenshot(path=str(self.keep / name))


# ------------------------------------------------------------------ scenes
def scene_start(shots: Shots, names: set[str]) -> None:
    """sidebar-start.png: a notebook not attached to a cluster yet, and the sidebar's way to start one."""
    copy_example("01-quickstart.ipynb", shots.lab.root / "quickstart.ipynb")
    shots.open("quickstart.ipynb")
    insert = shots.page.locator(f"{SIDEBAR} .jc-start-insert")
    insert.wait_for(timeout=30_000)
    text = shots.page.locator(SIDEBAR).inner_text()
    assert "%load_ext jupyter_cluster" in text, text
    shots.png("sidebar-start.png")


def scene_watching(shots: Shots, names: set[str]) -> None:
    """dashboard-in-jupyterlab.png and tour.gif: examples/10-watching.ipynb's dashboard, a value in the object
    store, and its --map cell running with the sidebar beside it."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    from jupyter_cluster.widgets import _dashboard

    cells = code_cells("10-watching.ipynb")
    chosen = [
        pick(cells, lambda s: "%cluster local" in s, "that starts the cluster"),
        pick(cells, lambda s: "jc.dashboard(" in s, "that opens the dashboard"),
        pick(cells, lambda s: "jc.put(" in s, "that puts a value in the object store"),
        pick(cells, lambda s: s.startswith("%%remote --map"), "with --map"),
    ]
    setup, dashboard, put, run_map = range(len(chosen))
    write_notebook(shots.lab.root / "watching.ipynb", chosen)
    shots.open("watching.ipynb")
    shots.run(setup, timeout=180)
    shots.run(dashboard, timeout=60)
    shown = time.monotonic()
    shots.run(put, timeout=60)
    page = shots.page
    dash = page.locator(".jupyter-cluster-dashboard").first
    dash.locator("canvas").nth(2).wait_for(timeout=60_000)  # Playwright's locators pierce Bokeh's shadow roots
    page.locator(f"{SIDEBAR} .jc-node").first.wait_for(timeout=60_000)
    shots.wait_points(5)
    # A dashboard's plots may be handed to every view again LIVE_FALLBACK s after it is made (in case the page
    # never said it shows one), which draws the view anew: let that pass before the frames.
    fallback = getattr(_dashboard, "LIVE_FALLBACK", 0.0)
    time.sleep(max(0.0, fallback + 1 - (time.monotonic() - shown)))
    shots.unclip_sidebar()
    shots.scroll_to(dashboard)
    shots.keep_page("watching-before.png")

    # The --map cell, a frame every FRAME_EVERY seconds while it runs, and a few after.
    frames: list[bytes] = []
    times: list[float] = []
    region = tour_region(shots)
    shots.start(run_map)
    page.locator(".jc-progress").first.wait_for(timeout=60_000)
    after = 0
    while after < FRAMES_AFTER:
        tick = time.monotonic()
        shots.scroll_to(dashboard)  # where it was, should a redrawn output have moved it
        frames.append(page.screenshot(clip=region))
        times.append(tick)
        if shots.ran(run_map):
            after += 1
        time.sleep(max(0.0, FRAME_EVERY - (time.monotonic() - tick)))
    done = page.locator(".jc-progress.jc-done").first.inner_text(timeout=10_000)
    print(f"  {done.strip()}; {len(frames)} frames")
    if "tour.gif" in names:
        write_gif(shots, "tour.gif", frames, times)

    # The dashboard once the map's end shows in it, Ray's task counts (reported every few seconds) included.
    try:
        page.wait_for_function(
            f"() => {{ const c = ({STATE_COUNTS_JS})(); return !!c && c['map items done'] > 0"
            " && !c['cells running'] && !c['Ray tasks running'] && !c['Ray tasks pending']; }",
            timeout=40_000,
            polling=500,
        )
    except PlaywrightTimeout:
        print(f"  the dashboard's task counts did not settle: {page.evaluate(STATE_COUNTS_JS)}")
    shots.wait_points(shots.series_points() + 2)
    shots.scroll_to(dashboard)
    if "dashboard-in-jupyterlab.png" in names:
        shots.png("dashboard-in-jupyterlab.png")


def tour_region(shots: Shots) -> dict[str, float]:
    """The part of the page the animation shows: from the sidebar's left edge to the notebook's right edge,
    under the menu bar and above the status bar."""
    page = shots.page
    left = page.locator("#jp-left-stack").bounding_box()
    main = page.locator("#jp-main-dock-panel").bounding_box()
    assert left is not None and main is not None
    x, y = left["x"], main["y"]
    return {"x": x, "y": y, "width": main["x"] + main["width"] - x, "height": main["height"]}


def write_gif(shots: Shots, name: str, frames: list[bytes], times: list[float]) -> None:
    """Frames taken at ``times`` as one looping GIF, in real time: one palette for all, the last frame held."""
    from PIL import Image

    images = [Image.open(io.BytesIO(frame)).convert("RGB") for frame in frames]
    if shots.keep is not None:
        for number, image in enumerate(images):
            image.save(shots.keep / f"frame-{number:03d}.png")
    # One palette for every frame (made from a strip of some of them): no flicker between frames. Octree
    # keeps the plots' small patches of colour (an orange legend line) that median cut merges into grey.
    picks = images[:: max(1, len(images) // 5)]
    sample = Image.new("RGB", (images[0].width, images[0].height * len(picks)))
    for slot, image in enumerate(picks):
        sample.paste(image, (0, slot * images[0].height))
    palette = sample.quantize(colors=GIF_COLOURS, method=Image.Quantize.FASTOCTREE)
    quantized = [image.quantize(palette=palette, dither=Image.Dither.NONE) for image in images]
    durations = [round(1000 * (later - earlier), -1) for earlier, later in pairwise(times)] + [3000]
    path = shots.out / name
    quantized[0].save(
        path, save_all=True, append_images=quantized[1:], duration=durations, loop=0, optimize=True, disposal=1
    )
    shots.written.append(path)
    print(f"  {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}: {kb(path)}, {len(frames)} frames")


def code_indexes(shots: Shots, upto: int) -> list[int]:
    """The code cells of the notebook open in the page, up to and including cell ``upto``."""
    kinds = shots.page.evaluate("() => window.jupyterapp.shell.currentWidget.content.widgets.map((w) => w.model.type)")
    return [index for index, kind in enumerate(kinds[: upto + 1]) if kind == "code"]


def scene_training(shots: Shots, names: set[str]) -> None:
    """training.png: examples/03-train-torch.ipynb up to its training run, and the run's view once it ended.
    The left panel is closed: the view draws three plots to a row."""
    train = copy_example("03-train-torch.ipynb", shots.lab.root / "train-torch.ipynb", lambda s: "jc.train_torch(" in s)
    shots.open("train-torch.ipynb", sidebar=False)
    for index in code_indexes(shots, train):
        shots.run(index, timeout=600)
    view = shots.page.locator(".jp-Notebook .jp-Cell").nth(train).locator(".jp-Cell-outputArea")
    shots.keep_page("training-page.png")
    print(f"  {view.locator('.jc-run-snapshot').first.inner_text().strip().splitlines()[0]}")
    shots.view_png("training.png", view)


def scene_tune(shots: Shots, names: set[str]) -> None:
    """sidebar.png while examples/04-tune-asha.ipynb's sweep runs; trials.png once it ended."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    sweep = copy_example("04-tune-asha.ipynb", shots.lab.root / "tune-asha.ipynb", lambda s: "jc.tune(" in s)
    shots.open("tune-asha.ipynb")
    page = shots.page
    for index in code_indexes(shots, sweep)[:-1]:
        shots.run(index, timeout=300)
    shots.start(sweep)
    view = page.locator(".jupyter-cluster-run").first
    view.wait_for(timeout=120_000)
    # The sweep runs: the sidebar lists its cell running, a trial has ended and another runs (or it is over).
    page.locator(f"{SIDEBAR} .jc-cell.jc-status-running").first.wait_for(timeout=120_000)
    page.wait_for_function(
        "(i) => { const t = document.querySelector('.jupyter-cluster-run .jc-trials-table');"
        " return (!!t && /(stopped early|terminated)/.test(t.innerText)"
        " && Array.from(t.querySelectorAll('tr')).some((r) => /running/.test(r.innerText)))"
        " || window.jcRuns[i].done; }",
        arg=sweep,
        timeout=900_000,
        polling=500,
    )
    if shots.ran(sweep):
        print("  the sweep ended before a trial ended while another ran: the sidebar shows it done")
    # An instant when the widget and the sidebar show the same best (each redraws on its own tick: one may be a
    # result ahead for a moment, which the one-truth browser test bounds).
    try:
        page.wait_for_function(
            "() => { const h = document.querySelector('.jupyter-cluster-run .widget-html');"
            f" const r = document.querySelector('{SIDEBAR} .jc-run .jc-row-detail');"
            " const best = (t) => ((t || '').match(/best \\S+ (\\S+)/) || [])[1];"
            " return !!h && !!r && !!best(h.innerText) && best(h.innerText) === best(r.innerText); }",
            timeout=15_000,
            polling=100,
        )
    except PlaywrightTimeout:
        print("  the widget and the sidebar did not show the same best within 15 s")
    if "sidebar.png" in names:
        shots.unclip_sidebar()
        shots.scroll_to(sweep)
        shots.png("sidebar.png")
    shots.wait_ran(sweep, timeout=900)
    shots.keep_page("tune-page.png")
    view = page.locator(".jp-Notebook .jp-Cell").nth(sweep).locator(".jp-Cell-outputArea")  # its snapshot, picture
    print(f"  {view.locator('.jc-run-snapshot').first.inner_text().strip().splitlines()[0]}")
    if "trials.png" in names:
        shots.close_left()  # the header on one line
        shots.view_png("trials.png", view)


#: Each scene, and the pictures it takes.
SCENES: dict[str, tuple[Callable[..., None], tuple[str, ...]]] = {
    "start": (scene_start, ("sidebar-start.png",)),
    "watching": (scene_watching, ("dashboard-in-jupyterlab.png", "tour.gif")),
    "training": (scene_training, ("training.png",)),
    "tune": (scene_tune, ("sidebar.png", "trials.png")),
}
NAMES = [name for _, names in SCENES.values() for name in names]


def _wanted(only: list[str]) -> set[str]:
    wanted = set()
    for name in only:
        match = [n for n in NAMES if n == name or n.rsplit(".", 1)[0] == name]
        if not match:
            raise SystemExit(f"no picture named {name!r}: one of {', '.join(NAMES)}")
        wanted.update(match)
    return wanted


@contextmanager
def _shots(out: Path, keep: Path | None) -> Iterator[Shots]:
    from playwright.sync_api import sync_playwright

    from tests.lab import CHROMIUM, lab_server

    with (
        tempfile.TemporaryDirectory(prefix="jc-docs-screenshots.") as tmp,
        lab_server(_Folders(Path(tmp)), "docs-screenshots-lab.log") as lab,  # type: ignore[arg-type]
        sync_playwright() as p,
    ):
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True)
        try:
            page = browser.new_page(viewport=VIEWPORT, device_scale_factor=1)
            shots = Shots(lab=lab, page=page, out=out, keep=keep)
            page.on("console", lambda m: shots.console.append(f"[{m.type}] {m.text}"))
            page.on("pageerror", lambda e: shots.console.append(f"[pageerror] {e}"))
            yield shots
        finally:
            browser.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", nargs="+", default=[], metavar="NAME", help=f"only these: {', '.join(NAMES)}")
    parser.add_argument("--out", type=Path, default=IMAGES, help="where the pictures go (default docs/images)")
    parser.add_argument("--keep", type=Path, help="also keep the animation's frames and full pages here")
    args = parser.parse_args()
    wanted = _wanted(args.only) if args.only else set(NAMES)
    sys.path.insert(0, str(ROOT))  # tests/lab.py: the browser tests' JupyterLab server
    from tests.lab import ARTIFACTS, CHROMIUM, console_problems

    if not Path(CHROMIUM).exists() or not _has_module("jupyterlab") or not _has_module("playwright"):
        print(f"needs Chromium at {CHROMIUM}, JupyterLab and Playwright's Python module")
        return 1
    args.out.mkdir(parents=True, exist_ok=True)
    if args.keep is not None:
        args.keep.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    with _shots(args.out, args.keep) as shots:
        try:
            for scene, (take, names) in SCENES.items():
                if not wanted & set(names):
                    continue
                print(f"{scene}: {', '.join(n for n in names if n in wanted)}")
                take(shots, wanted & set(names))
        except Exception:
            failed = ARTIFACTS / "docs-screenshots-failed.png"
            failed.parent.mkdir(parents=True, exist_ok=True)
            shots.page.screenshot(path=str(failed), full_page=True)
            print(f"failed; the page as it was: {failed}\n" + "\n".join(shots.console[-30:]))
            raise
        problems = console_problems(shots.console)
    if problems:
        print("the browser console had errors:\n" + "\n".join(problems))
    print(f"{len(shots.written)} file(s) in {time.monotonic() - started:.0f} s")
    return 1 if problems else 0


def _has_module(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is not None


if __name__ == "__main__":
    sys.exit(main())
