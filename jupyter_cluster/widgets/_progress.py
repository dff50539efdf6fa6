"""Progress in a cell's output: a bar for many items, a status line for one cell.

Both are one display (a display id) redrawn in place, at most every :attr:`EVERY`
seconds, as HTML with a plain-text twin; neither needs a widget manager, so what a
notebook saved shows is the last state. A bar ends as a one-line summary. Updates may
come from any thread: a redraw that has to wait is scheduled on the link's loop.
"""

from __future__ import annotations

import contextvars
import html
import json
import re
import threading
import time
from collections.abc import Callable
from typing import Any

from .._handles import format_duration

GREEN, BLUE, RED, GREY = "#2e7d32", "#64b5f6", "#c62828", "#9e9e9e"


def _rate(count: float, seconds: float, unit: str) -> str:
    if seconds <= 0 or count <= 0:
        return ""
    per = count / seconds
    return f"{per:,.1f} {unit}/s" if per < 100 else f"{per:,.0f} {unit}/s"


def elapsed(seconds: float) -> str:
    """``3.2 s``, ``4 min 05 s`` (as every result says it)."""
    return format_duration(seconds)


class _Display:
    """One display id, redrawn at most every ``EVERY`` s (the last state always lands)."""

    EVERY = 0.25

    def __init__(self, show: bool = True) -> None:
        self._lock = threading.Lock()
        self._sent = 0.0
        self._scheduled = False
        self.handle: Any = None
        if show:
            from IPython.display import display

            self.handle = display(self.bundle(), raw=True, display_id=True)
            self._sent = time.monotonic()

    def bundle(self) -> dict[str, str]:
        raise NotImplementedError

    def redraw(self, now: bool = False) -> None:
        if self.handle is None:
            return
        with self._lock:
            wait = self.EVERY - (time.monotonic() - self._sent)
            if not now and wait > 0:
                if not self._scheduled:
                    self._scheduled = True
                    _later(wait, self._deferred)
                return
            self._sent = time.monotonic()
        in_current_cell(self.handle.update, self.bundle(), raw=True)

    def _deferred(self) -> None:
        with self._lock:
            self._scheduled = False
            if time.monotonic() - self._sent < self.EVERY:  # drawn meanwhile (the final state, say)
                return
        self.redraw(now=True)


def in_current_cell(fn: Any, *args: Any, **kwargs: Any) -> Any:
    """Call ``fn`` so that what it publishes goes out as part of the cell running now.

    ipykernel 7 keeps the cell a message belongs to in a context variable, and a callback
    on the link's thread carries the context of whatever cell scheduled it, long done. A
    display update sent so is routed by its display id in JupyterLab, but a headless
    client (nbclient) keeps only the messages of the cell it runs: in a fresh context
    the kernel's latest cell is used.
    """
    return contextvars.Context().run(fn, *args, **kwargs)


def _later(delay: float, fn: Any) -> None:
    from .._link import _LoopThread

    loop = _LoopThread.get().loop
    loop.call_soon_threadsafe(loop.call_later, delay, fn)


class ProgressBar(_Display):
    """Done / running / failed of ``total``, elapsed time and rate; ends as one line.

    ``running``: the items being worked on (the bar's blue part); ``tasks``, where items run in chunks (a
    ``--map`` cell's), the Ray tasks running them, which the caption counts instead: a 2-CPU cluster runs 2
    tasks of 3 items each, not "6 running".

    >>> bar = ProgressBar(100, "jc.map(f)", show=False)
    >>> bar.update(done=40, running=8)
    >>> print(bar.text())  # doctest: +ELLIPSIS
    jc.map(f): [################------------------------] 40/100 items done, 8 running, 0 failed ...
    >>> bar.update(done=40, running=6, tasks=2)
    >>> print(bar.text())  # doctest: +ELLIPSIS
    jc.map(f): [################------------------------] 40/100 items done, 2 tasks running, 0 failed ...
    """

    WIDTH = 40

    def __init__(self, total: int, label: str, unit: str = "items", show: bool = True) -> None:
        self.total = max(int(total), 0)
        self.label = label
        self.unit = unit
        self.done = self.running = self.failed = 0
        self.tasks: int | None = None
        self.started = time.monotonic()
        self.outcome: str | None = None
        self.detail = ""
        self.ended: float | None = None
        super().__init__(show)

    @property
    def elapsed(self) -> float:
        return (self.ended or time.monotonic()) - self.started

    def update(
        self, done: int | None = None, running: int | None = None, failed: int | None = None, tasks: int | None = None
    ) -> None:
        if self.outcome is not None:
            return
        if done is not None:
            self.done = done
        if running is not None:
            self.running = max(0, min(running, self.total - self.done))
        if tasks is not None:
            self.tasks = max(0, tasks)
        if failed is not None:
            self.failed = failed
        self.redraw()

    def finish(
        self, outcome: str = "done", detail: str = "", done: int | None = None, took: float | None = None
    ) -> None:
        """End as one line: ``done``, ``failed`` or ``cancelled``, with ``detail`` (why);
        ``done``: how many ended (all of them when it is done and this is not given); ``took``: how long the work
        took, where it has a time of its own (a cell's, which its result and the sidebar show too)."""
        if self.outcome is not None:
            return
        self.outcome, self.detail = outcome, detail
        self.ended = time.monotonic()
        if took is not None:
            self.started = self.ended - took
        if done is not None:
            self.done = done
        elif outcome == "done":
            self.done = max(self.done, self.total)
        self.running = 0
        self.tasks = None if self.tasks is None else 0
        self.redraw(now=True)

    def on_wait(self, wanted: int | None = None) -> Callable[[str, Any], None]:
        """What drives this bar from the events of a ``wait`` request with progress (``jc.map``, ``jc.wait``):
        ``wanted``, the handles waited for (``num_returns``), when not all of them."""

        def on_event(event: str, data: Any) -> None:
            if event == "progress":
                self.update(done=data["done"], failed=data["failed"])
            elif event == "done":
                ready = len(data)
                if wanted is not None and ready < wanted:
                    self.finish("timed out", f"{ready} of the {wanted} waited for are ready", done=ready)
                else:
                    self.finish("done", done=ready)
            elif event in ("error", "lost"):
                message = data.get("message") if isinstance(data, dict) else str(data)
                self.finish("failed", str(message).splitlines()[0] if message else "")

        return on_event

    def summary(self) -> str:
        took = elapsed(self.elapsed)
        rate = _rate(self.done, self.elapsed, self.unit)
        rate = f" ({rate})" if rate else ""
        detail = f": {self.detail}" if self.detail else ""
        failed = f", {self.failed} failed" if self.failed else ""
        if self.outcome == "done":
            return f"{self.label}: {self.done}/{self.total} {self.unit} done{failed} in {took}{rate}"
        return f"{self.label}: {self.outcome} after {took}, {self.done}/{self.total} {self.unit} done{failed}{detail}"

    def text(self) -> str:
        if self.outcome is not None:
            return self.summary()
        total = self.total or 1
        filled = round(self.WIDTH * self.done / total)
        bar = "#" * filled + "-" * (self.WIDTH - filled)
        rate = _rate(self.done, self.elapsed, self.unit)
        return (
            f"{self.label}: [{bar}] {self.done}/{self.total} {self.unit} done, {self._running()}, {self.failed} failed"
            f" · {elapsed(self.elapsed)}" + (f" · {rate}" if rate else "")
        )

    def _running(self) -> str:
        """What runs, named for what it counts: the tasks, where items run in chunks; else the items."""
        if self.tasks is not None:
            return f"{self.tasks} task{'' if self.tasks == 1 else 's'} running"
        return f"{self.running} running"

    def bundle(self) -> dict[str, str]:
        text = self.text()
        if self.outcome is not None:
            color = {"done": GREEN, "failed": RED}.get(self.outcome, GREY)
            mark = {"done": "✔", "failed": "✘"}.get(self.outcome, "■")
            body = f'<span style="color:{color}">{mark}</span> {html.escape(text)}'
            return {"text/plain": text, "text/html": f'<div class="jc-progress jc-{self.outcome}">{body}</div>'}
        total = self.total or 1
        parts = "".join(
            f'<div style="width:{100 * n / total:.2f}%;background:{color}"></div>'
            for n, color in ((self.done - self.failed, GREEN), (self.failed, RED), (self.running, BLUE))
            if n > 0
        )
        rate = _rate(self.done, self.elapsed, self.unit)
        caption = (
            f"{self.done}/{self.total} {self.unit} done · {self._running()} · {self.failed} failed · "
            f"{elapsed(self.elapsed)}" + (f" · {rate}" if rate else "")
        )
        bar = (
            '<div style="display:flex;width:320px;height:14px;background:#e0e0e0;border-radius:3px;'
            f'overflow:hidden" role="progressbar" aria-valuenow="{self.done}" aria-valuemax="{self.total}">'
            f"{parts}</div>"
        )
        return {
            "text/plain": text,
            "text/html": (
                '<div class="jc-progress jc-running" style="display:flex;align-items:center;gap:8px;'
                f'font-size:12px"><span>{html.escape(self.label)}</span>{bar}<span>{html.escape(caption)}</span></div>'
            ),
        }


RAY_TQDM_MAGIC = "__ray_tqdm_magic_token__"

# tqdm's default format: "desc: 45%|████▌     | 45/100 [00:01<00:02, 30.20it/s]" (desc optional).
_TQDM = re.compile(
    r"^(?:(?P<desc>.*?): ?)?\s*(?P<pct>\d+)%\|(?P<bar>[^|]*)\| ?(?P<n>[\d.]+[kMGTPEZY]?)/(?P<total>[\d.]+[kMGTPEZY]?)"
    r" ?\[(?P<elapsed>[\d:]+)<(?P<remaining>[\d:?]+)(?:, ?(?P<rate>[^\]]*))?\]\s*$"
)
_SI = {"": 1, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18, "Z": 1e21, "Y": 1e24}


def _count(text: str) -> float:
    unit = text[-1] if text and text[-1] in _SI else ""
    return float(text[: len(text) - len(unit)]) * _SI[unit]


class RemoteBar(_Display):
    """A progress bar made by code on the cluster (``tqdm``, or Ray's ``tqdm_ray``), drawn here."""

    def __init__(self, desc: str, total: float | None, unit: str = "it", show: bool = True) -> None:
        self.desc = desc
        self.total = total
        self.n = 0.0
        self.unit = unit
        self.note = ""  # tqdm's own "[elapsed<remaining, rate]"
        self.closed = False
        self.started = time.monotonic()
        super().__init__(show)

    def text(self) -> str:
        desc = f"{self.desc}: " if self.desc else ""
        total = f"/{self.total:g}" if self.total else ""
        pct = f"{100 * self.n / self.total:3.0f}% " if self.total else ""
        note = self.note or f"{elapsed(time.monotonic() - self.started)}"
        return f"{desc}{pct}{self.n:g}{total} {self.unit} [{note}]" + (" (closed)" if self.closed else "")

    def bundle(self) -> dict[str, str]:
        text = self.text()
        frac = min(1.0, self.n / self.total) if self.total else 0.0
        color = GREEN if self.closed else BLUE
        bar = (
            '<div style="display:flex;width:240px;height:12px;background:#e0e0e0;border-radius:3px;overflow:hidden">'
            f'<div style="width:{100 * frac:.2f}%;background:{color}"></div></div>'
        )
        desc = f"<span>{html.escape(self.desc)}</span>" if self.desc else ""
        total = f"/{self.total:g}" if self.total else ""
        caption = f"{self.n:g}{total} {self.unit} [{self.note}]" if self.note else f"{self.n:g}{total} {self.unit}"
        body = f"{desc}{bar}<span>{html.escape(caption)}</span>"
        return {
            "text/plain": text,
            "text/html": (
                '<div class="jc-remote-bar" style="display:flex;align-items:center;gap:8px;font-size:12px">'
                f"{body}</div>"
            ),
        }


def write_output(batch: list[tuple[str, Any]], bars: RemoteBars | None = None) -> None:
    """A batch of a cell's output, written into the notebook: its streams (the progress bars in them drawn as
    bars, given ``bars``) and what it displays."""
    import sys

    for kind, data in batch:
        if kind in ("stdout", "stderr") and bars is not None:
            data = bars.feed(kind, data)
        if kind in ("stdout", "stderr") and data:
            stream = sys.stdout if kind == "stdout" else sys.stderr
            stream.write(data)
            stream.flush()
        elif kind == "display":
            from IPython import get_ipython
            from IPython.display import display

            if get_ipython() is None:  # a script: what it says, as text
                print(data.get("text/plain", ""))
            else:
                display(data, raw=True)


class RemoteBars:
    """Turns the progress bars in a cell's printed output into :class:`RemoteBar` s.

    ``tqdm`` redraws its line with ``\\r``; Ray's ``tqdm_ray`` prints JSON lines that carry
    a magic token (Ray's driver decodes them the same way). Text that holds neither is
    passed on untouched; the rest of the text is what :meth:`feed` returns.
    ``show``: draw each bar as a display of its own (a foreground cell); otherwise the
    owner draws :attr:`bars` itself (an ``--async`` cell's area).
    """

    def __init__(self, show: bool = True) -> None:
        self.show = show
        self.bars: dict[str, RemoteBar] = {}
        self._line: dict[str, str] = {}  # stream -> key of the tqdm bar on its current line

    def feed(self, stream: str, text: str) -> str:
        if "\r" not in text and RAY_TQDM_MAGIC not in text and stream not in self._line:
            return text
        kept: list[str] = []
        for line in re.findall(r"[^\n]*\n|[^\n]+", text):  # not splitlines: it splits at "\r" too
            if RAY_TQDM_MAGIC in line and self._ray_state(line):
                continue
            if "\r" in line or stream in self._line:
                line = self._tqdm_line(stream, line)
            kept.append(line)
        return "".join(kept)

    def _ray_state(self, line: str) -> bool:
        try:
            state = json.loads(line[line.index("{") :])
            key = str(state["uuid"])
        except (ValueError, KeyError, TypeError):
            return False
        bar = self.bars.get(key)
        if bar is None:
            desc = str(state.get("desc") or "")
            bar = self.bars[key] = RemoteBar(desc, state.get("total"), str(state.get("unit") or "it"), self.show)
        bar.n = float(state.get("x") or 0)
        bar.total = state.get("total") or bar.total
        bar.desc = str(state.get("desc") or bar.desc)
        bar.closed = bool(state.get("closed"))
        bar.redraw(now=bar.closed)
        return True

    def _tqdm_line(self, stream: str, line: str) -> str:
        """A line tqdm redraws: its last drawing becomes the bar; other text stays."""
        ends = line.endswith("\n")
        pieces = line.rstrip("\n").split("\r")
        rest = []
        for piece in pieces:
            match = _TQDM.match(piece.rstrip())
            if match is None:
                if piece.strip():
                    rest.append(piece)
                continue
            key = self._line.get(stream)
            desc = (match.group("desc") or "").strip()
            if key is None or self.bars[key].desc != desc or self.bars[key].closed:
                key = f"{stream}-{len(self.bars)}"
                self.bars[key] = RemoteBar(desc, _count(match.group("total")), "it", self.show)
                self._line[stream] = key
            bar = self.bars[key]
            bar.n, bar.total = _count(match.group("n")), _count(match.group("total"))
            bar.note = f"{match.group('elapsed')}<{match.group('remaining')}" + (
                f", {match.group('rate')}" if match.group("rate") else ""
            )
            bar.redraw()
        if ends:
            key = self._line.pop(stream, None)
            if key is not None:
                self.bars[key].closed = self.bars[key].n >= (self.bars[key].total or 0)
                self.bars[key].redraw(now=True)
        text = "\r".join(rest)
        return text + ("\n" if ends and text else "")

    def close(self) -> None:
        """The cell ended: draw every bar's last state."""
        for bar in self.bars.values():
            bar.redraw(now=True)


__all__ = ["ProgressBar", "RemoteBar", "RemoteBars", "elapsed"]
