"""Reading one node's state from Ray's Prometheus text (no cluster needed).

``ray_metrics_idle.txt`` was recorded from an idle embedded cluster (Ray 2.60, 2 CPUs) and
cut to the drawn families plus a few others; ``ray_metrics_gpu.txt`` is written by hand
with the names and labels Ray's reporter agent emits for GPUs (no GPU is here).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from jupyter_cluster.agent.watching import _metrics
from jupyter_cluster.agent.watching._metrics import LineCache, changes, keep_drawn, summarize, totals

DATA = Path(__file__).parent / "data"
IDLE = (DATA / "ray_metrics_idle.txt").read_text()
GPU = (DATA / "ray_metrics_gpu.txt").read_text()


def test_only_the_drawn_families_are_kept_before_parsing() -> None:
    assert "ray_grpc_server" in IDLE
    kept = keep_drawn(IDLE)
    assert "ray_grpc_server" not in kept
    assert kept.count("ray_node_cpu_utilization{") == 1 and "# TYPE ray_resources gauge" in kept


def test_an_idle_node() -> None:
    node = summarize(IDLE)
    assert node["cpu"] == 0.0
    assert node["mem_total"] == pytest.approx(2.5276502016e10) and node["mem_used"] == pytest.approx(4.67673088e8)
    assert node["store_used"] == 0.0 and node["store_total"] == pytest.approx(7.503395635e9)
    assert node["resources"]["CPU"] == (0.0, 2.0)
    assert node["gpus"] == {} and node["tasks"] == {}


def test_gpus_tasks_and_actors() -> None:
    node = summarize(GPU)
    assert node["cpu"] == 63.5
    first = node["gpus"]["0"]
    assert first["name"] == "NVIDIA H100 80GB HBM3" and first["utilization"] == 87.0
    assert first["memory_used"] == 40960 * 2**20 and first["memory_available"] == 40960 * 2**20  # MB in Ray's text
    assert node["gpus"]["1"]["utilization"] == 13.0
    assert node["store"] == {"MMAP_SHM": 1.5e9, "SPILLED": 5.0e8} and node["store_used"] == 2.0e9
    assert node["store_total"] == 4.0e9 and node["resources"]["GPU"] == (2.0, 2.0)
    assert node["tasks"] == {"RUNNING": 2.0, "PENDING_NODE_ASSIGNMENT": 3.0}  # what the user's code started
    assert node["actors"] == {"ALIVE": 1.0}
    assert node["cell_tasks"] == {"FINISHED": 10.0} and node["cell_actors"] == {"ALIVE": 1.0}  # the cells' own


def test_only_what_changed_is_sent() -> None:
    before = summarize(IDLE)
    assert changes(None, before) == before
    assert changes(before, summarize(IDLE)) == {}
    cpu = next(line for line in IDLE.splitlines() if line.startswith("ray_node_cpu_utilization{"))
    busy = summarize(IDLE.replace(cpu, cpu.rsplit(" ", 1)[0] + " 42.0"))
    assert changes(before, busy) == {"cpu": 42.0}


def test_the_cluster_as_one() -> None:
    cluster = totals([summarize(IDLE), summarize(GPU)])
    assert cluster["cpu"] == pytest.approx(31.75) and cluster["gpu"] == 50.0
    assert cluster["store_used"] == 2.0e9 and cluster["store_total"] == pytest.approx(7.503395635e9 + 4.0e9)
    assert cluster["tasks"]["RUNNING"] == 2.0 and cluster["actors"] == {"ALIVE": 1.0}
    assert totals([summarize(IDLE)])["gpu"] is None


def test_a_line_cache_parses_only_new_lines_and_agrees(monkeypatch: pytest.MonkeyPatch) -> None:
    import gzip

    full = gzip.decompress((DATA / "ray_metrics_full.txt.gz").read_bytes()).decode()  # a whole scrape, 2.60
    cache = LineCache()
    kept = keep_drawn(full)
    assert summarize(kept, kept=True, cache=cache) == summarize(full)
    cpu = next(line for line in kept.splitlines() if line.startswith("ray_node_cpu_utilization{"))
    busier = kept.replace(cpu, cpu.rsplit(" ", 1)[0] + " 77.5")
    parsed: list[str] = []
    real = _metrics.parse
    monkeypatch.setattr(_metrics, "parse", lambda text: parsed.append(text) or real(text))
    node = summarize(busier, kept=True, cache=cache)
    assert node["cpu"] == 77.5 and parsed == [cpu.rsplit(" ", 1)[0] + " 77.5\n"]  # that line alone


def _task_lines(rows: list[tuple[str, str, str, str, float]]) -> str:
    return "".join(
        f'ray_{family}{{Name="{name}",State="{state}",Source="{source}",SessionName="s"}} {value}\n'
        for family, name, state, source, value in rows
    )


def test_the_systems_and_the_cells_tasks_and_actors_are_counted_apart_and_no_count_is_negative() -> None:
    from jupyter_cluster._feed import state_groups, system_said

    node = summarize(
        _task_lines(
            [
                ("tasks", "step", "RUNNING", "executor", 1),
                ("tasks", "step", "FINISHED", "owner", 3),
                # Ray counts a state where a task is owned and where it runs: read a moment apart, -1
                ("tasks", "step", "SUBMITTED_TO_WORKER", "owner", -1),
                ("tasks", "run_map_chunk", "RUNNING", "executor", 2),  # a map's chunks: the cells' own
                ("actors", "counter:CellNamespace.run", "ALIVE", "gcs", 1),
                ("tasks", "OutputRelay.push", "FAILED", "owner", 1),  # this project's own helper
                ("actors", "Counter", "ALIVE", "gcs", 1),  # the user's own actor class
                ("actors", "TrainController", "ALIVE", "gcs", 1),  # Ray Train's own actor
                ("actors", "OutputRelay", "DEAD", "gcs", 1),
                ("tasks", "join_lists", "RUNNING", "executor", 1),
            ]
        )
    )
    assert node["tasks"] == {"RUNNING": 1.0, "FINISHED": 3.0, "SUBMITTED_TO_WORKER": -1.0}
    assert node["actors"] == {"ALIVE": 1.0}
    assert node["system_actors"] == {"ALIVE": 1.0, "DEAD": 1.0}
    assert node["system_tasks"] == {"FAILED": 1.0, "RUNNING": 1.0}
    assert node["cell_tasks"] == {"RUNNING": 2.0} and node["cell_actors"] == {"ALIVE": 1.0}
    groups = state_groups(totals([node]))
    assert groups[("tasks", "pending")] == 0.0, "a count below zero is shown as none"
    assert ("tasks", "failed") not in groups and ("actors", "dead") not in groups, "the system's failures are apart"
    assert groups[("tasks", "finished")] == 3.0 and groups[("actors", "alive")] == 1.0
    assert system_said(totals([node])) == "system: 1 actor alive, 1 task running"


def test_other_jobs_work_is_counted_apart_from_the_notebooks_own() -> None:
    """Given the notebook's own Ray job, another job's tasks and actors (another notebook's cells and what its code
    started, a script) count as ``other_``; the system's stay the system's, whoever's job started them."""
    from jupyter_cluster._feed import other_jobs_said, state_groups

    rows = [
        ("tasks", "step", "RUNNING", "01000000", 2),  # ours
        ("tasks", "run_cell_task", "RUNNING", "01000000", 1),  # our cell
        ("tasks", "step", "RUNNING", "02000000", 3),  # another notebook's code
        ("tasks", "run_map_chunk", "RUNNING", "03000000", 1),  # another notebook's cell
        ("actors", "Counter", "ALIVE", "02000000", 1),
        ("actors", "ServeController", "ALIVE", "02000000", 1),  # Serve's: the system's, whoever started it
    ]
    text = "".join(
        f'ray_{family}{{Name="{name}",State="{state}",JobId="{job}",SessionName="s"}} {value}\n'
        for family, name, state, job, value in rows
    )
    node = summarize(text, job="01000000")
    assert node["tasks"] == {"RUNNING": 2.0} and node["cell_tasks"] == {"RUNNING": 1.0} and node["actors"] == {}
    assert node["other_tasks"] == {"RUNNING": 4.0} and node["other_actors"] == {"ALIVE": 1.0}
    assert node["system_actors"] == {"ALIVE": 1.0}
    assert state_groups(totals([node]))[("tasks", "running")] == 2.0
    assert other_jobs_said(totals([node])) == "other notebooks and drivers: 1 actor alive, 4 tasks running"
    # Without a job (a sampler told none), every job's work is the user's, as before.
    assert summarize(text)["tasks"] == {"RUNNING": 5.0} and other_jobs_said(totals([summarize(text)])) == ""
