"""Ray's own documentation scripts, run with plain ``python`` and pasted into ``%%remote --driver`` cells.

What it measures: whether code written for a plain Ray driver works unchanged in a notebook driver
cell. Each ``.py`` file under ``--scripts`` (recursively) runs twice:

- **python**: ``python script.py`` with a copy of the script in an empty temporary folder (so the
  other scripts of the folder, ``tqdm.py`` say, shadow nothing), under a timeout, with the
  environment of a new user: ``PATH`` (this interpreter's folder first), ``LANG``, ``USER``,
  ``LOGNAME`` and a fresh, empty ``HOME`` shared by the run's python scripts; no ``RAY_ADDRESS``,
  no ``PYTHONPATH``. One addition: ``RAY_TMPDIR`` points at a folder of the script's own, so its
  Ray session cannot find another one on the machine, and so every process it left behind
  (Ray's workers, its dashboard's forkserver, ...) is found by that variable in its environment
  and killed once the script ends. Nothing else is stopped: no ``ray stop --force``, which would
  stop every Ray on the machine. The script's own ``ray.init()`` starts its own Ray, as usual.
- **cell**: one Jupyter kernel (``jupyter_client``) for the whole run, with the same kind of
  environment (its own fresh ``HOME`` and ``RAY_TMPDIR``), runs ``%load_ext jupyter_cluster`` and
  ``%cluster local --cpus 2`` once, then each script as ``"%%remote --driver\\n" + source``.
  Between scripts (untimed) ``jc.current().reset_driver()`` stops what the previous script
  started (its actors, placement groups, the driver namespace), as the end of a python process
  does; then a driver cell waits up to 15 s for all the cluster's CPUs to be free. If they are
  not (tasks a script left queued or running hold them), or the cluster is gone, ``%cluster
  down`` and ``%cluster local --cpus 2`` start it afresh, and the restart is listed under the
  table: without that, one script that leaves the 2 CPUs busy makes every later cell time out.
  A cell past the timeout is interrupted (the notebook's stop button).

The python runs all come first, then the cells: never two of Ray's clusters busy at once.

A script **passes** under python if it exits 0; as a cell if its ``execute_reply`` is ``ok``.

**Same printed lines.** What each way printed (python: stdout then stderr; cell: its ``stream``
messages, stdout and stderr, in order) is normalised into lines, and the two multisets compared:

1. ANSI colours are removed; ``\\r`` ends a line as ``\\n`` does; blank lines are dropped.
2. Ray's own lines are dropped: its logger's (``2024-01-01 12:00:00,123<TAB>INFO worker.py:1 --``
   and ``WARNING``/``ERROR``/``DEBUG``, with the traceback or the ``- item`` lines that follow
   such a record: indented lines, ``Traceback ...``, ``^^^``, ``SomeError: ...``), its C++
   core's (``[2024-01-01 12:00:00,123 W 12 34] ...``), those of its own processes
   (``(raylet)``, ``(gcs_server)``, ``(autoscaler +3s)``, ...), its log-deduplication notice,
   Python warnings raised from inside Ray's own package (with the source line that follows
   them), progress bars (``45%|####``, ``it/s]``), and the reports Python prints when a thread
   or a finaliser fails (``Exception in thread ...``, ``Exception ignored in ...``, up to the
   exception's line), which Ray's workers print as they are killed.
3. Ray's deduplicated worker lines, ``X [repeated 3x across cluster]``, count as 3 lines ``X``.
4. Masked, in order: a worker line's prefix ``(name pid=123, ip=10.0.0.1)`` to ``(name)``; the
   script's path (python) and ``<remote-cell-...>`` (cell) to ``<SCRIPT>``; the temporary
   folders and ``HOME``; Ray session folders (wherever Ray's temporary folder is); date-times
   and clock times; ``ObjectRef(...)``-style ids, ``0x`` addresses, UUIDs and hex ids of 8+
   characters; IP addresses (with a port); Tune's trial ids (``1a2b3_00000``); ``pid=123``,
   ``pid: 123`` and ``pid 123``; durations (``1.5s``, ``12 ms``); decimal and scientific numbers
   (timings, random estimates); percentages; on a line that says "time", every number.
5. Tune's Unicode table borders become ASCII (``╭─┤│`` to ``+-+|``: Tune draws ASCII when
   ``sys.stdout.encoding`` is not UTF-8), runs of spaces one space, and a line made only of
   border characters ``<BORDER>`` (its width follows the numbers in the table).

"yes": the two multisets are equal; "set": the same distinct lines, counted differently (timing:
how often a loop polled, how many lines a worker got out before the process ended); "no"
otherwise, and the first line one side has that the other lacks is shown (``-python:`` a line
only python printed, ``+cell:`` one only the cell printed). A cell's ``Out[]`` value and the
displays the notebook shows (not printed lines) are kept in ``--json`` only.

**Differences by design or by chance** ("by" in the table, and counted apart in the headline): a
script whose lines differ is listed as differing *only by* these kinds of lines when every line
one side has and the other lacks is one of them:

- *chance*: python itself prints it differently from run to run. A script whose cell printed other
  lines runs under python again (``--reruns``, 2 at most, after the cells); a line whose template
  (its integers masked) one python run has and another lacks, or has another number of times, is
  the script's chance (random numbers, timing) and is left out on every side.
- *notice*: the cell's one ``ray.init: ...`` line on what of ``ray.init``'s arguments the attached
  cluster does not give (``num_cpus=4`` on a 2-CPU cluster), which the product prints by design.
- *log*: a line python printed that the cell put in the cluster's log (``%cluster logs``, read
  after each cell) instead: Ray's own records in its workers (Train's and Tune's loggers), which a
  cell keeps out by design, and lines that came after the cell ended; and the further lines of a
  record of Ray's loggers that python printed over several lines (its first line, with the time and
  level, is dropped as Ray's above; :func:`record_tails`).
- *once*: a ``RayDeprecationWarning`` (with its source line) that python printed again at another
  line where the cell printed it once. Ray shows each once per module; python's process shows it
  again only because a module Ray imports on first use changed its warning filters in between.

**Skipped**, with the reason shown, by these rules on the source (first match wins): CUDA
(``.cuda(``, ``device="cuda"``); NCCL/NIXL; NPU/Neuron accelerators; TensorFlow imports; Java/C++
(``cross_language``, ``java_function``); downloads (``torchvision``, ``download=True``, a
runtime_env with ``"conda"``/``"pip"``); ``ray start``/``ray stop`` from the script (it would stop
the notebook's cluster and any other Ray on the machine); endless allocations waiting for the OOM
killer (``while True: chunks.append``); and by name: ``limit_tasks.py`` (a million tasks with 8 MB
arguments). Scripts that only declare GPUs to a fresh ``ray.init(num_gpus=...)`` are run.

Run: ``python benchmarks/bench_ray_docs.py --scripts DIR [--only PATTERN] [--timeout 120]
[--json OUT] [--sides python,cell] [--python-from OLD.json] [--reruns 2] [--list]``; ``--recompare OLD.json``
compares the saved outputs again (after a change to the rules above) without running anything.
The scripts are not part of this repository; ``DIR`` is a folder of Ray's
``doc/source/**/doc_code`` files. The headline: of the scripts that pass under python, how many
pass as cells, and how many print the same lines. The python side takes about 30 s a script on
2 cores (each starts a Ray); ``--python-from`` reuses it from an earlier ``--json``.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import fnmatch
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

# --------------------------------------------------------------------------- which scripts run

#: (pattern on the source, reason); the first that matches skips the script.
SKIP_RULES: list[tuple[re.Pattern[str], str]] = [
    (re.compile(r"""\.cuda\(|device=["']cuda["']"""), "needs a CUDA GPU"),
    (re.compile(r"nccl|nixl", re.IGNORECASE), "needs a GPU transport (NCCL/NIXL)"),
    (re.compile(r"torch_npu|\.npu\(|neuron_core|NEURON_RT"), "needs an NPU / AWS Neuron accelerator"),
    (re.compile(r"^\s*(import tensorflow|from tensorflow)", re.MULTILINE), "needs TensorFlow (not installed)"),
    (re.compile(r"cross_language|java_function|java_actor_class"), "calls Java/C++ (cross-language)"),
    (
        re.compile(r"""torchvision|download=True|["']conda["']\s*:|["']pip["']\s*:"""),
        "downloads packages or data (no network here)",
    ),
    (
        re.compile(r"""["']ray["']\s*,\s*["'](start|stop)["']"""),
        "runs `ray start`/`ray stop --force`: stops every Ray on the machine, the notebook's cluster included",
    ),
    (
        re.compile(r"while True:\s*\n\s*chunks\.append"),
        "allocates memory until Ray's OOM killer fires: unsafe on a shared machine",
    ),
]

#: Skipped by file name.
SKIP_NAMES: dict[str, str] = {
    "limit_tasks.py": "1,000,000 tasks with 8 MB arguments: runs far past any timeout, spills GBs to disk",
}


def skip_reason(path: Path, source: str) -> str | None:
    """Why the script is not run, or None."""
    code = "\n".join(line.split("#", 1)[0] if line.lstrip().startswith("#") else line for line in source.splitlines())
    for pattern, reason in SKIP_RULES:
        if pattern.search(code):
            return reason
    return SKIP_NAMES.get(path.name)


def find_scripts(folder: Path, only: str | None) -> list[Path]:
    scripts = sorted(p for p in folder.rglob("*.py") if p.is_file())
    if only:
        patterns = [f"*{part.strip()}*" for part in only.split(",") if part.strip()]
        scripts = [p for p in scripts if any(fnmatch.fnmatch(str(p.relative_to(folder)), pat) for pat in patterns)]
    return scripts


# --------------------------------------------------------------------------- normalising output

ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
RAY_LOGGER = re.compile(
    r"^\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2},\d{3}\s+(DEBUG|INFO|WARNING|ERROR|CRITICAL)\s+\S+:\d+ --"
)
RAY_CORE = re.compile(r"^\[\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2},\d{3} [DIWEF] \d+ \d+\]")
RAY_PROCESS = re.compile(
    r"^\((raylet|gcs_server|autoscaler[^)]*|monitor|dashboard[^)]*|log_monitor|runtime_env_agent|"
    r"raylet, ip=[\d.]+)\)"
)
RAY_WARNING = re.compile(r"site-packages/ray/\S+:\d+: \w*Warning:")
PROGRESS = re.compile(r"\d+%\|[^|]*\||it/s\]|s/it\]")
DEDUP_NOTICE = re.compile(r"\s*\(Ray deduplicates logs by default\..*$")
REPEATED = re.compile(r"^(?P<line>.*?) \[repeated (?P<n>\d+)x across cluster\]\s*$")
PREFIX = re.compile(r"^\((?P<name>.+?) pid=\d+(?:, ip=[\d.]+)?\)(?: |$)")
IGNORED_START = re.compile(r"^(Exception ignored in|Exception in thread)\b")
IGNORED_END = re.compile(r"^[A-Za-z_][\w.]*(Error|Exit|Exception|Interrupt)\b")
BOXES = str.maketrans({c: "+" for c in "╭╮╰╯├┤┼┬┴"} | {"│": "|", "─": "-"})
BORDER = re.compile(r"^[+|-][+| -]*$")
CONTINUATION = re.compile(
    r"^(\s|Traceback \(most recent call last\)|The above exception|During handling of the above|\^|~|- |"
    r"[\w.]+(Error|Exception|Exit|Interrupt)\b)"
)
TIME_WORD = re.compile(r"time", re.IGNORECASE)
PY_WARNING = re.compile(r"^\S+:\d+: \w*Warning: ")
INTEGER = re.compile(r"(?<![\w<])\d+(?![\w>])")

MASKS: list[tuple[re.Pattern[str], str]] = [
    (re.compile(r"<remote-cell-[0-9a-f]+>"), "<SCRIPT>"),
    (re.compile(r"session_\d{4}-\d{2}-\d{2}_\d{2}-\d{2}-\d{2}_\d+_\d+"), "session_<ID>"),
    (re.compile(r"[^\s`'\"]*/ray/session_<ID>"), "<RAYTMP>/ray/session_<ID>"),
    (re.compile(r"\d{4}-\d{2}-\d{2}[ _T]\d{2}[:-]\d{2}[:-]\d{2}(?:[.,]\d+)?"), "<TIME>"),
    (re.compile(r"\b\d{1,2}:\d{2}:\d{2}(?:\.\d+)?\b"), "<TIME>"),
    (re.compile(r"\b(ObjectRef|ActorID|TaskID|NodeID|JobID|ObjectID|PlacementGroupID)\([0-9a-f]+\)"), r"\1(<ID>)"),
    (re.compile(r"0x[0-9a-fA-F]+"), "0x<ADDR>"),
    (re.compile(r"\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b"), "<UUID>"),
    (re.compile(r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*\d)[0-9a-f]{8,}\b"), "<HEX>"),
    (re.compile(r"\b\d{1,3}(?:\.\d{1,3}){3}(?::\d+)?\b"), "<IP>"),
    (re.compile(r"(?<![0-9a-f])[0-9a-f]{5}_\d{5}(?![0-9])"), "<TRIAL>"),
    (re.compile(r"\bpid(?:=|: | )\d+"), "pid=<PID>"),
    (re.compile(r"(?<![\w.])\d+(?:\.\d+)?\s?(?:ms|us|µs|s|sec|secs|seconds|min|mins|minutes)\b"), "<DUR>"),
    (re.compile(r"(?<![\w.])-?\d+(?:\.\d+(?:[eE][-+]?\d+)?|[eE][-+]?\d+)"), "<NUM>"),
    (re.compile(r"\b\d+(?:\.\d+)?%"), "<PCT>"),
]


def normalise(text: str, paths: dict[str, str]) -> list[str]:
    """The lines of ``text`` that count, masked (see the module docstring). ``paths`` maps
    literal paths (longest first) to their placeholders."""
    lines: list[str] = []
    drop_next_indented = False
    ignoring: set[str] = set()  # the worker prefixes inside an "Exception ignored in" report
    in_record: set[str] = set()  # the prefixes whose last line was one of Ray's log records
    for raw in ANSI.sub("", text).replace("\r\n", "\n").replace("\r", "\n").split("\n"):
        line = DEDUP_NOTICE.sub("", raw.rstrip())
        if drop_next_indented and line.startswith("  "):
            drop_next_indented = False
            continue
        drop_next_indented = False
        prefix = PREFIX.match(line)
        who = prefix["name"] if prefix else ""
        body = line[prefix.end() :] if prefix else line
        if who in ignoring:
            if IGNORED_END.match(body):
                ignoring.discard(who)
            continue
        if IGNORED_START.match(body):
            ignoring.add(who)
            continue
        if not body.strip():
            continue
        if RAY_LOGGER.match(body) or RAY_CORE.match(body):
            in_record.add(who)
            continue
        if who in in_record and CONTINUATION.match(body):
            continue
        in_record.discard(who)
        if RAY_PROCESS.match(line) or PROGRESS.search(line):
            continue
        if RAY_WARNING.search(body):
            drop_next_indented = True
            continue
        copies = 1
        repeated = REPEATED.match(line)
        if repeated:
            line, copies = repeated["line"], int(repeated["n"])
        line = PREFIX.sub(lambda m: f"({m['name']}) ", line)
        for literal, placeholder in paths.items():
            line = line.replace(literal, placeholder)
        for pattern, replacement in MASKS:
            line = pattern.sub(replacement, line)
        if TIME_WORD.search(line):
            line = INTEGER.sub("<N>", line.replace("<NUM>", "<N>").replace("<DUR>", "<N>"))
        line = " ".join(line.translate(BOXES).split())
        if BORDER.match(line):
            line = "<BORDER>"
        lines.extend([line] * copies)
    return lines


@dataclass
class Comparison:
    same: str  # "yes", "set" or "no"
    only_python: list[str]
    only_cell: list[str]
    #: Why the lines differ, where every difference is one of these (see :func:`explain`); empty otherwise.
    because: list[str] = field(default_factory=list)


#: A warning of Ray's deprecations, where the script's code called the deprecated API. Ray shows each once per
#: module (its filter's action is "module"); python's process shows it again where its warning filters changed
#: between two calls (a module Ray imports on first use changes them), which the cell's process, where Ray's
#: modules are imported already, does not.
RAY_DEPRECATION = re.compile(r"^<SCRIPT>:\d+: RayDeprecationWarning: (?P<text>.*)$")
#: What the cell prints that ``python`` does not, by design: the one line saying what of ``ray.init``'s
#: arguments the attached cluster does not give (``num_cpus=4`` on a 2-CPU cluster, say).
NOTICE = "ray.init: "


def template(line: str) -> str:
    """A line with its integers masked: the lines of one ``print`` that differ in the numbers it prints."""
    return INTEGER.sub("<N>", line)


def unstable(runs: list[list[str]]) -> set[str]:
    """The templates of the lines that ``python``'s own runs of one script print differently (other numbers,
    other counts, or only in some runs): the script's chance (random numbers, timing), not the cell's."""
    found: set[str] = set()
    first = collections.Counter(runs[0]) if runs else collections.Counter()
    for other in map(collections.Counter, runs[1:]):
        found |= {template(line) for line in (first - other) + (other - first)}
    return found


def compare(
    python_lines: list[str], cell_lines: list[str], logged: list[str] = (), chance: set[str] = frozenset()
) -> Comparison:
    """``logged``: the (normalised) lines the cell's cluster log got while the script ran; ``chance``: the
    templates of the lines python's own runs differ in (:func:`unstable`)."""
    py, cell = collections.Counter(python_lines), collections.Counter(cell_lines)
    only_py = [line for line in python_lines if (py - cell)[line]]
    only_cell = [line for line in cell_lines if (cell - py)[line]]
    if py == cell:
        same = "yes"
    elif set(py) == set(cell):
        same = "set"
    else:
        same = "no"
    comparison = Comparison(same, list(dict.fromkeys(only_py)), list(dict.fromkeys(only_cell)))
    if same != "yes":
        comparison.because = explain(py - cell, cell - py, set(logged), chance, python_lines, cell_lines)
    return comparison


def explain(
    only_py: collections.Counter[str],
    only_cell: collections.Counter[str],
    logged: set[str],
    chance: set[str],
    python_lines: list[str] = (),
    cell_lines: list[str] = (),
) -> list[str]:
    """Why every line one side has and the other lacks differs, if each is one of: ``"chance"`` (python's own
    runs differ in it too), ``"notice"`` (the cell's ``ray.init:`` line, which the product prints by design),
    ``"log"`` (a line python printed that the cell put in the cluster's log instead: Ray's own records, which a
    cell keeps out by design, and lines that came after the cell ended), ``"once"`` (a ``RayDeprecationWarning``
    the cell printed once where python printed it again: see :data:`RAY_DEPRECATION`). ``[]`` where any
    difference is left."""
    because: set[str] = set()
    for bag in (only_py, only_cell):
        for line in [line for line in bag if template(line) in chance]:
            del bag[line]
            because.add("chance")
    for line in [line for line in only_cell if line.startswith(NOTICE)]:
        del only_cell[line]
        because.add("notice")
    for line in [line for line in only_py if line in logged]:
        del only_py[line]
        because.add("log")
    shown = {m["text"] for m in map(RAY_DEPRECATION.match, cell_lines) if m}
    for i, line in enumerate(python_lines):
        warned = RAY_DEPRECATION.match(line)
        if warned and warned["text"] in shown and only_py[line]:
            source = python_lines[i + 1] if i + 1 < len(python_lines) else None
            only_py[line] -= 1
            if source is not None and only_py[source]:
                only_py[source] -= 1
            because.add("once")
    only_py = +only_py
    return sorted(because) if not only_py and not only_cell else []


# --------------------------------------------------------------------------- the two ways


@dataclass
class Outcome:
    status: str  # "ok", "fail", "timeout", "skip", "not run"
    seconds: float = 0.0
    text: str = ""  # what it printed, stdout and stderr (python: stdout then stderr)
    error: str = ""  # python: the last line of stderr; cell: "ename: evalue"
    extra: dict[str, Any] = field(default_factory=dict)


def new_user_env(home: Path, ray_tmpdir: Path) -> dict[str, str]:
    user = os.environ.get("USER") or os.environ.get("LOGNAME") or "user"
    return {
        "PATH": os.pathsep.join([str(Path(sys.executable).parent), "/usr/local/bin", "/usr/bin", "/bin"]),
        "HOME": str(home),
        "LANG": "C.UTF-8",
        "USER": user,
        "LOGNAME": user,
        "RAY_TMPDIR": str(ray_tmpdir),
    }


def processes_with(variable: str) -> list[int]:
    """Our processes whose environment holds ``variable`` (``NAME=value``)."""
    needle = variable.encode() + b"\0"
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        with contextlib.suppress(OSError):
            if needle in (entry / "environ").read_bytes() + b"\0":
                found.append(int(entry.name))
    return found


def kill_leftovers(variable: str, group: int | None) -> int:
    """Kill what a script left running; how many processes were still there."""
    if group is not None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(group, signal.SIGKILL)
    left = processes_with(variable)
    for pid in left:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while processes_with(variable) and time.monotonic() < deadline:
        time.sleep(0.2)
    return len(left)


def run_python(script: Path, root: Path, home: Path, timeout: float) -> tuple[Outcome, dict[str, str]]:
    """``python script.py`` in a fresh folder; its outcome and the paths to mask in its output."""
    work = Path(tempfile.mkdtemp(prefix="p", dir=root))
    cwd, ray_tmp = work / "cwd", work / "t"
    cwd.mkdir()
    ray_tmp.mkdir()
    shutil.copy(script, cwd / script.name)
    env = new_user_env(home, ray_tmp)
    start = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, script.name],
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
        status = "ok" if proc.returncode == 0 else "fail"
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        status = "timeout"
    seconds = time.perf_counter() - start
    left = kill_leftovers(f"RAY_TMPDIR={ray_tmp}", proc.pid)
    shutil.rmtree(work, ignore_errors=True)
    stdout, stderr = out.decode(errors="replace"), err.decode(errors="replace")
    last = [
        line
        for line in ANSI.sub("", stderr).splitlines()
        if line.strip() and not RAY_LOGGER.match(line) and not RAY_CORE.match(line)
    ]
    outcome = Outcome(
        status,
        seconds,
        stdout + stderr,
        {"ok": "", "timeout": f"timed out after {timeout:g} s"}.get(
            status, last[-1] if last else f"exit {proc.returncode}"
        ),
        {"returncode": proc.returncode, "stdout": stdout, "stderr": stderr, "leftover_processes": left},
    )
    paths = {str(cwd / script.name): "<SCRIPT>", str(ray_tmp): "<RAYTMP>", str(cwd): "<CWD>", str(home): "<HOME>"}
    return outcome, paths


class Notebook:
    """One kernel, attached to ``%cluster local --cpus 2``, running scripts as ``--driver`` cells."""

    SETUP = "%load_ext jupyter_cluster\n%cluster local --cpus 2"
    RESET = "import jupyter_cluster as _bench_jc\n_bench_jc.current().reset_driver()"
    LOG = (
        "import json as _bench_json, jupyter_cluster as _bench_jc\n"
        "print('BENCH_LOG', _bench_json.dumps([t for w, _, t in _bench_jc.current().logs(tail=None).lines "
        "if w >= {since}]))"
    )
    FREE_WAIT = 15
    FREE = (
        "%%remote --driver\n"
        "import time as _t, ray as _r\n"
        f"for _i in range({FREE_WAIT * 2}):\n"
        "    _free, _total = _r.available_resources().get('CPU', 0), _r.cluster_resources().get('CPU', 0)\n"
        "    if _free >= _total:\n"
        "        break\n"
        "    _t.sleep(0.5)\n"
        "print('BENCH_FREE', _free, _total)"
    )

    def __init__(self, root: Path) -> None:
        self.home = root / "home_cell"
        self.home.mkdir(exist_ok=True)
        self.ray_tmp = root / "c"
        self.ray_tmp.mkdir(exist_ok=True)
        self.cwd = root / "cwd_cell"
        self.cwd.mkdir(exist_ok=True)
        self.km: Any = None
        self.kc: Any = None
        self.restarts: list[str] = []

    def start(self) -> None:
        from jupyter_client.manager import KernelManager

        self.km = KernelManager(kernel_name="python3")
        self.km.start_kernel(env=new_user_env(self.home, self.ray_tmp), cwd=str(self.cwd))
        self.kc = self.km.blocking_client()
        self.kc.start_channels()
        self.kc.wait_for_ready(timeout=120)
        self.setup()

    def setup(self) -> None:
        reply = self.execute(self.SETUP, timeout=300)
        if reply.status != "ok":
            raise RuntimeError(f"{self.SETUP!r} failed: {reply.error}\n{reply.text}")

    def stop(self) -> None:
        if self.kc is None:
            return
        with contextlib.suppress(Exception):
            self.execute("%cluster down", timeout=120)
        self.kc.stop_channels()
        self.km.shutdown_kernel(now=True)
        self.kc = self.km = None
        kill_leftovers(f"RAY_TMPDIR={self.ray_tmp}", None)

    def execute(self, code: str, timeout: float) -> Outcome:
        """Run ``code``; past ``timeout`` interrupt it (and give it 60 s more to end)."""
        start = time.perf_counter()
        msg_id = self.kc.execute(code)
        streams: list[tuple[str, str]] = []
        displays: list[str] = []
        result: str | None = None
        error = ""
        traceback = ""
        interrupted = False
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                if interrupted:
                    raise TimeoutError("the kernel did not end the cell 60 s after an interrupt")
                self.km.interrupt_kernel()
                interrupted = True
                deadline = time.monotonic() + 60
                continue
            try:
                msg = self.kc.get_iopub_msg(timeout=min(left, 1.0))
            except Exception:  # queue.Empty
                if not self.km.is_alive():
                    raise RuntimeError("the kernel died") from None
                continue
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            kind, content = msg["msg_type"], msg["content"]
            if kind == "stream":
                streams.append((content["name"], content["text"]))
            elif kind == "error":
                error = f"{content['ename']}: {content['evalue']}"
                traceback = ANSI.sub("", "\n".join(content["traceback"]))
            elif kind == "execute_result":
                result = str(content["data"].get("text/plain"))
            elif kind in ("display_data", "update_display_data"):
                displays.append(str(content["data"].get("text/plain")))
            elif kind == "status" and content["execution_state"] == "idle":
                break
        reply = self._reply(msg_id)
        status = "timeout" if interrupted else ("ok" if reply.get("status") == "ok" else "fail")
        if status != "ok" and not error:
            error = f"{reply.get('ename', '')}: {reply.get('evalue', '')}"
        if interrupted:
            error = f"timed out after {timeout:g} s, interrupted ({error})"
        return Outcome(
            status,
            time.perf_counter() - start,
            "".join(text for _, text in streams),
            error,
            {
                "stdout": "".join(text for name, text in streams if name == "stdout"),
                "stderr": "".join(text for name, text in streams if name == "stderr"),
                "result": result,
                "displays": displays,
                "traceback": traceback,
            },
        )

    def _reply(self, msg_id: str) -> dict[str, Any]:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with contextlib.suppress(Exception):
                reply = self.kc.get_shell_msg(timeout=1)
                if reply["parent_header"].get("msg_id") == msg_id:
                    return dict(reply["content"])
        return {"status": "unknown"}

    def run(self, script: Path, timeout: float) -> tuple[Outcome, dict[str, str]]:
        paths = {str(self.cwd): "<CWD>", str(self.ray_tmp): "<RAYTMP>", str(self.home): "<HOME>"}
        since = time.time()
        try:
            outcome = self.execute("%%remote --driver\n" + script.read_text(), timeout)
        except (TimeoutError, RuntimeError) as exc:
            outcome = Outcome("timeout" if isinstance(exc, TimeoutError) else "fail", timeout, "", str(exc))
            self.restart(f"kernel restarted after {script.name}: {exc}")
            return outcome, paths
        outcome.extra["log"] = self.logged(since)
        self.reset(script.name, outcome)
        return outcome, paths

    def logged(self, since: float) -> list[str]:
        """The lines the cluster's log got since ``since`` (a second after the cell, for its late lines)."""
        time.sleep(1)
        found = self.execute(self.LOG.format(since=since), timeout=60)
        for line in found.text.splitlines():
            if line.startswith("BENCH_LOG "):
                return list(json.loads(line[len("BENCH_LOG ") :]))
        return []

    def reset(self, name: str, outcome: Outcome) -> None:
        """Stop what the script started; then, unless all the cluster's CPUs are free again within
        :attr:`FREE_WAIT` seconds (or the cluster is gone), start the cluster again."""
        why = ""
        for _ in range(10):
            try:
                done = self.execute(self.RESET, timeout=180)
            except (TimeoutError, RuntimeError) as exc:
                self.restart(f"kernel restarted after {name}: reset: {exc}")
                outcome.extra["restarted_after"] = "kernel"
                return
            if done.status == "ok" or not ("refused" in done.error or "running" in done.error):
                break
            time.sleep(2)  # the interrupted cell is still stopping
        outcome.extra["reset"] = done.extra.get("result") if done.status == "ok" else done.error
        if done.status == "ok":
            check = self.execute(self.FREE, timeout=self.FREE_WAIT + 60)
            found = re.search(r"BENCH_FREE (\S+) (\S+)", check.text)
            if found and float(found[1]) >= float(found[2]):
                return
            why = f"{found[1]} of {found[2]} CPUs free" if found else f"CPU check failed: {check.error}"
            why += f" {self.FREE_WAIT} s after reset_driver()"
        else:
            why = f"reset_driver() failed: {done.error}"
        with contextlib.suppress(Exception):
            self.execute("%cluster down", timeout=120)
        try:
            self.setup()
            self.restarts.append(f"cluster restarted after {name}: {why}")
            outcome.extra["restarted_after"] = why
        except Exception as exc:
            self.restart(f"kernel restarted after {name}: {why}; the cluster did not start again: {exc}")
            outcome.extra["restarted_after"] = f"kernel: {why}"

    def restart(self, why: str) -> None:
        self.restarts.append(why)
        with contextlib.suppress(Exception):
            self.stop()
        self.start()


# --------------------------------------------------------------------------- the run


@dataclass
class Row:
    name: str
    skipped: str | None
    python: Outcome
    cell: Outcome
    comparison: Comparison | None = None

    def note(self) -> str:
        if self.skipped:
            return f"skipped: {self.skipped}"
        if self.cell.status not in ("ok", "not run"):
            return f"cell: {self.cell.error}"
        if self.python.status not in ("ok", "not run"):
            return f"python: {self.python.error}"
        comp = self.comparison
        if comp and comp.because:
            return "differs only by: " + ", ".join(BECAUSE[b] for b in comp.because)
        if comp and comp.same != "yes":
            if comp.only_python:
                return f"-python: {comp.only_python[0]}"
            if comp.only_cell:
                return f"+cell: {comp.only_cell[0]}"
            return "same lines, other counts"
        return ""


#: What each reason of :func:`explain` means, in the table and the headline.
BECAUSE = {
    "chance": "lines python's own runs differ in",
    "notice": "the cell's ray.init: line",
    "log": "lines the cell keeps in %cluster logs",
    "once": "a RayDeprecationWarning python repeats",
}


def short(text: str, width: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"


def table(rows: list[Row]) -> str:
    width = max([len("script"), *(len(r.name) for r in rows)])
    out = [f"{'script':{width}s}  {'python':7s}  {'cell':7s}  {'same':4s}  note", "-" * (width + 34 + 60)]
    for r in rows:
        py = "skip" if r.skipped else r.python.status
        cell = "skip" if r.skipped else r.cell.status
        same = (r.comparison.same if not r.comparison.because else "by") if r.comparison else "-"
        out.append(f"{r.name:{width}s}  {py:7s}  {cell:7s}  {same:4s}  {short(r.note(), 110)}")
    return "\n".join(out)


def headline(rows: list[Row]) -> str:
    ran = [r for r in rows if not r.skipped]
    py_ok = [r for r in ran if r.python.status == "ok"]
    cell_ok = [r for r in py_ok if r.cell.status == "ok"]
    same = [r for r in cell_ok if r.comparison and r.comparison.same == "yes"]
    by = [r for r in cell_ok if r.comparison and r.comparison.because]
    counts = collections.Counter(b for r in by for b in r.comparison.because)  # type: ignore[union-attr]

    def pct(n: int) -> str:
        return f"{100 * n / len(py_ok):.0f}%" if py_ok else "-"

    reasons = "; ".join(f"{BECAUSE[b]}: {counts[b]}" for b in BECAUSE if counts[b])
    return (
        f"{len(rows)} scripts: {len(rows) - len(ran)} skipped, {len(ran)} run; {len(py_ok)} pass under python.\n"
        f"Of those {len(py_ok)}: {len(cell_ok)} pass as --driver cells ({pct(len(cell_ok))}), "
        f"{len(same)} of them with the same printed lines ({pct(len(same))}); "
        f"{len(by)} more differ only by lines of these kinds ({reasons or 'none'}): "
        f"{len(same) + len(by)} the same or so ({pct(len(same) + len(by))})."
    )


def git_head() -> str:
    with contextlib.suppress(Exception):
        here = Path(__file__).resolve().parent.parent
        return subprocess.run(
            ["git", "describe", "--always", "--dirty"], cwd=here, capture_output=True, text=True, check=True
        ).stdout.strip()
    return "?"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scripts", type=Path, help="a folder of .py files (searched recursively); required")
    parser.add_argument(
        "--only",
        help="run only scripts whose relative path contains this (wildcards allowed; several, comma-separated)",
    )
    parser.add_argument("--timeout", type=float, default=120, help="seconds per script, each way")
    parser.add_argument("--json", type=Path, help="write every outcome here")
    parser.add_argument("--sides", default="python,cell", help="python, cell or both (python,cell)")
    parser.add_argument("--list", action="store_true", help="only list the scripts and what would be skipped")
    parser.add_argument("--recompare", type=Path, help="compare again the outputs saved by an earlier --json")
    parser.add_argument(
        "--python-from", type=Path, help="take the python side from an earlier --json instead of running it again"
    )
    parser.add_argument(
        "--reruns", type=int, default=2, help="python runs again, at most, of a script whose cell printed other lines"
    )
    args = parser.parse_args()
    if args.recompare:
        recompare(args.recompare, args.json)
        return
    if args.scripts is None:
        parser.error("--scripts is required")
    sides = {s.strip() for s in args.sides.split(",")}

    folder = args.scripts.resolve()
    scripts = find_scripts(folder, args.only)
    if not scripts:
        sys.exit(f"no .py files under {folder}" + (f" matching {args.only!r}" if args.only else ""))
    rows: list[Row] = []
    for path in scripts:
        reason = skip_reason(path, path.read_text())
        name = str(path.relative_to(folder))
        rows.append(Row(name, reason, Outcome("not run"), Outcome("not run")))
    if args.list:
        for row in rows:
            print(f"{row.name:55s} {'skip: ' + row.skipped if row.skipped else 'run'}")
        return

    print(f"jupyter_cluster at {git_head()} at the start", file=sys.stderr, flush=True)
    by_name = {str(p.relative_to(folder)): p for p in scripts}
    to_run = [r for r in rows if not r.skipped]
    root = Path(tempfile.mkdtemp(prefix="rdb", dir="/tmp"))  # short: Ray's socket paths must fit 107 bytes
    python_paths: dict[str, dict[str, str]] = {}
    cell_paths: dict[str, dict[str, str]] = {}
    notebook: Notebook | None = None
    started = time.time()
    try:
        if args.python_from:
            saved = {r["name"]: r["python"] for r in json.loads(args.python_from.read_text())["rows"]}
            for row in to_run:
                if row.name in saved:
                    row.python = Outcome(**saved[row.name])
                    python_paths[row.name] = row.python.extra.get("paths", {})
        elif "python" in sides:
            home = root / "home_python"
            home.mkdir()
            for i, row in enumerate(to_run, 1):
                row.python, python_paths[row.name] = run_python(by_name[row.name], root, home, args.timeout)
                print(
                    f"[python {i}/{len(to_run)}] {row.name}: {row.python.status} {row.python.seconds:.1f}s",
                    file=sys.stderr,
                    flush=True,
                )
        if "cell" in sides:
            notebook = Notebook(root)
            notebook.start()
            for i, row in enumerate(to_run, 1):
                row.cell, cell_paths[row.name] = notebook.run(by_name[row.name], args.timeout)
                print(
                    f"[cell {i}/{len(to_run)}] {row.name}: {row.cell.status} {row.cell.seconds:.1f}s",
                    file=sys.stderr,
                    flush=True,
                )
        if notebook is not None:
            notebook.stop()
            notebook = None
        for row in to_run:
            row.python.extra.setdefault("paths", python_paths.get(row.name, {}))
            row.cell.extra["paths"] = cell_paths.get(row.name, {})
        rerun_differing(to_run, by_name, root, args.timeout, args.reruns)
    finally:
        if notebook is not None:
            notebook.stop()
        shutil.rmtree(root, ignore_errors=True)
    report(rows, notebook.restarts if notebook else [], args.json, args.timeout)
    print(f"\n({time.time() - started:.0f} s)")


def compare_row(row: Row) -> None:
    if row.skipped or row.python.status != "ok" or row.cell.status != "ok":
        return
    runs = [normalise(row.python.text, row.python.extra.get("paths", {}))]
    runs += [normalise(r["text"], r["paths"]) for r in row.python.extra.get("reruns", []) if r["status"] == "ok"]
    cell_paths = row.cell.extra.get("paths", {})
    logged = [line for text in row.cell.extra.get("log", []) for line in normalise(LOG_MARK.sub("", text), cell_paths)]
    stderr = row.python.extra.get("stderr", "")
    logged += [line for text in record_tails(stderr) for line in normalise(text, row.python.extra.get("paths", {}))]
    row.comparison = compare(runs[0], normalise(row.cell.text, cell_paths), logged, unstable(runs))


def record_tails(stderr: str) -> list[str]:
    """The lines of python's stderr that continue one of Ray's log records: a record's message of several lines
    (Ray Train's ``A run snapshot was found …`` and the two sentences after it) is one record, whose first line
    alone has the logger's time and level. They count as Ray's records, which a cell keeps out (not in a cell,
    and in the cluster's log where the agent's loggers log that level), like that first line. A record ends at the
    next record, a line of Ray's C++ core, a worker's line, or a Python warning (``path:12: SomeWarning: …``)."""
    tails, inside = [], False
    for raw in ANSI.sub("", stderr).splitlines():
        line = raw.rstrip()
        if RAY_LOGGER.match(line) or RAY_CORE.match(line):
            inside = True
        elif not line.strip() or PREFIX.match(line) or RAY_PROCESS.match(line) or PY_WARNING.match(line):
            inside = False
        elif inside:
            tails.append(line)
    return tails


#: How the cluster's log marks a line of a cell (``[In[5]] ``, ``[In[5], after it ended] ``), and one of Ray's
#: records in the agent (``(driver) ``: its loggers in the script's process, which python prints plain).
LOG_MARK = re.compile(r"^(\[[^\]]*\] )?(\(driver\) )?")


def rerun_differing(rows: list[Row], paths: dict[str, Path], root: Path, timeout: float, reruns: int) -> None:
    """Run ``python`` again, up to ``reruns`` times, for each script whose cell printed other lines: what its own
    runs print differently is its chance, not the cell's (:func:`unstable`). Reruns saved already are reused."""
    home = root / "home_python"
    home.mkdir(exist_ok=True)
    for row in rows:
        compare_row(row)
        done = row.python.extra.setdefault("reruns", [])
        while row.comparison and row.comparison.same != "yes" and not row.comparison.because and len(done) < reruns:
            again, again_paths = run_python(paths[row.name], root, home, timeout)
            done.append({"status": again.status, "text": again.text, "paths": again_paths})
            print(f"[python again] {row.name}: {again.status} {again.seconds:.1f}s", file=sys.stderr, flush=True)
            compare_row(row)


def report(rows: list[Row], restarts: list[str], out: Path | None, timeout: float) -> None:
    """Compare, print the table and the headline, and write ``out``."""
    for row in rows:
        compare_row(row)
    print(table(rows))
    print()
    print(headline(rows))
    if restarts:
        print("\nRestarts during the cell runs:\n  " + "\n  ".join(restarts))
    print(f"\nRay {ray_version()}; jupyter_cluster at {git_head()}; timeout {timeout:g} s")
    if out:
        out.write_text(
            json.dumps(
                {
                    "ray": ray_version(),
                    "jupyter_cluster": git_head(),
                    "timeout": timeout,
                    "restarts": restarts,
                    "rows": [
                        {
                            "name": r.name,
                            "skipped": r.skipped,
                            "python": asdict(r.python),
                            "cell": asdict(r.cell),
                            "comparison": asdict(r.comparison) if r.comparison else None,
                            "note": r.note(),
                        }
                        for r in rows
                    ],
                },
                indent=1,
            )
        )


def recompare(saved: Path, out: Path | None) -> None:
    """Compare again the outputs of an earlier ``--json`` (after changing the rules here)."""
    data = json.loads(saved.read_text())
    rows = [Row(r["name"], r["skipped"], Outcome(**r["python"]), Outcome(**r["cell"])) for r in data["rows"]]
    report(rows, data.get("restarts", []), out, data.get("timeout", 0))


def ray_version() -> str:
    try:
        from importlib.metadata import version

        return version("ray")
    except Exception:
        return "?"


if __name__ == "__main__":
    main()
