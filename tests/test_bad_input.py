"""Bad input gets a clear error and loses nothing: namespace, session and work survive."""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import pytest
from IPython.core.error import UsageError

import jupyter_cluster as jc

from .conftest import remote, run


def _usage(res: Any) -> str:
    assert isinstance(res.error_in_exec, UsageError), res.error_in_exec
    return str(res.error_in_exec)


def test_syntax_error_names_the_line_and_sends_nothing(shell: Any, sent_ops: list[str]) -> None:
    run(shell, "keep = 1")
    res = remote(shell, "x = 1\ny = (2 +\nz = 3")
    error = res.error_in_exec
    assert isinstance(error, jc.CellSourceError)
    assert "line 2" in str(error) and "never closed" in str(error)
    assert error.lineno == 2
    assert "y = (2 +" in "\n".join(error._render_traceback_())
    assert sent_ops == []
    assert shell.user_ns["keep"] == 1


def test_ipython_syntax_inside_a_remote_cell_is_refused(shell: Any) -> None:
    res = remote(shell, "x = 1\n!ls\ny = 2")
    assert isinstance(res.error_in_exec, jc.CellSourceError)
    assert "line 2" in str(res.error_in_exec) and "IPython" in str(res.error_in_exec)


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        ("--nodes 2", "unrecognized"),
        ("--cpus two", "invalid float"),
        ("--actor a --driver", "choose one"),
        ("--out a --no-out", "contradict"),
        ("--out 'a b,c'", "not names"),
        ("--resources {oops}", "not JSON"),
        ("--resources '{\"CPU\": 1}'", "with --cpus"),
        ("--map x range(3)", "--map NAME in EXPR"),
        ("--map x in undefined_name", "NameError"),
        ("--map x in []", "no items"),
        ("--memory lots", "not a size"),
        ("--cpus -1", "must not be negative"),
        ("--timeout 0", "timeout must be positive"),
    ],
)
def test_bad_options_are_usage_errors(shell: Any, options: str, expected: str) -> None:
    run(shell, "keep = 'safe'")
    assert expected in _usage(remote(shell, "x = 1", options))
    assert shell.user_ns["keep"] == "safe"


def test_unknown_cluster_command(shell: Any) -> None:
    res = run(shell, "%cluster fly")
    assert isinstance(res.error_in_exec, UsageError)
    assert "invalid choice" in str(res.error_in_exec)


def test_running_work_survives_a_bad_cell(shell: Any) -> None:
    assert remote(shell, "import time\ntime.sleep(1.5)\nlate = 'arrived'", "--async").success
    assert isinstance(remote(shell, "x = 1", "--gpus 64").error_in_exec, jc.RequestError)
    assert isinstance(remote(shell, "x = (", "").error_in_exec, jc.CellSourceError)
    shell.user_ns["late"].wait(30)
    assert jc.get(shell.user_ns["late"]) == "arrived"


def test_agent_death_is_a_clear_error_and_local_starts_afresh(shell: Any, cluster: jc.Cluster) -> None:
    run(shell, "precious = [1, 2, 3]")
    cell = cluster.run_cell("import time\ntime.sleep(60)")
    time.sleep(0.5)
    assert cluster._agent is not None
    cluster._agent.process.kill()
    with pytest.raises(jc.AgentLostError, match=r"the embedded agent died: killed \(SIGKILL\)"):
        cell.result(30)
    res = remote(shell, "y = precious")
    # With the old agent gone, the next cell starts a new embedded cluster and works.
    assert res.success, res.error_in_exec
    assert shell.user_ns["y"] == [1, 2, 3] and shell.user_ns["precious"] == [1, 2, 3]
    assert jc.current() is not cluster


def test_a_package_missing_on_the_cluster_is_named_with_how_to_install_it(cluster: jc.Cluster) -> None:
    """A cell importing what the cluster lacks says which package, where, and the pip line;
    an RLlib environment whose package is missing (gymnasium's own error) says so too."""
    with pytest.raises(ModuleNotFoundError) as info:
        cluster.run_cell("import sklearn_not_here.svm", mode="task").result(60)
    assert "`sklearn_not_here` is not installed on the cluster (the task could not import it)" in str(info.value)
    assert "pip install sklearn_not_here" in str(info.value)
    assert "run the cell with --pip sklearn_not_here" in str(info.value), "the exact --pip option"
    with pytest.raises(jc.RemoteError) as info:
        cluster.run_cell("import gymnasium as gym\nenv = gym.make('ALE/Pong-v5')", mode="driver").result(60)
    assert type(info.value).__name__ == "NamespaceNotFound" and "Namespace ALE not found" in str(info.value)
    assert "pip install 'gymnasium[atari]'" in str(info.value)
    # Through RLlib, the env runner's error is only logged, then RLlib fails with one of its own.
    rllib = "from ray.rllib.algorithms.ppo import PPOConfig\n" + (
        "PPOConfig().environment('ALE/Pong-v5').env_runners(num_env_runners=1).build_algo()"
    )
    with pytest.raises(Exception) as info:
        cluster.run_cell(rllib, mode="driver").result(120)
    assert "the environment could not be made on the cluster: Namespace ALE not found" in str(info.value)
    assert cluster.run_cell("ok = 1", mode="driver").result(60).outputs["ok"] == 1


def test_refusing_a_value_says_how_large_it_is_and_what_the_head_has_free() -> None:
    from jupyter_cluster.agent._sizing import memory_free, refuse_value

    why = refuse_value(3 * 2**30, free=2 * 2**30)
    assert why is not None and "2.0 GiB of memory free" in why and "3.0 GiB" in why and "6.0 GiB" in why
    assert refuse_value(2**30, free=2 * 2**30) is None
    free = memory_free()
    assert free is not None and 0 < free <= os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def test_a_head_that_does_not_answer_the_room_question_gets_the_value_as_before(
    cluster: jc.Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The agent stopped (SIGSTOP) while a cell with an 80 MiB input is sent: the question whether the head has
    room goes unanswered, the kernel sends the value after its wait, and once the agent runs again the cell runs
    with it. Nothing is refused for want of an answer."""
    np = pytest.importorskip("numpy")
    from jupyter_cluster import _cluster

    monkeypatch.setattr(_cluster, "ROOM_WAIT", 1.0)
    agent = cluster._agent
    assert agent is not None
    value = np.arange(10 * 2**20, dtype=np.float64)  # 80 MiB
    os.kill(agent.process.pid, signal.SIGSTOP)
    try:
        started = time.monotonic()
        cell = cluster.run_cell("n = int(x.nbytes)\nlast = float(x[-1])", namespace={"x": value})
        assert time.monotonic() - started >= 1.0, "the kernel did not wait for the answer"
        assert not cell.done()
    finally:
        os.kill(agent.process.pid, signal.SIGCONT)
    outputs = cell.result(120).outputs
    assert outputs == {"n": value.nbytes, "last": float(value[-1])}


def test_a_value_the_head_cannot_take_is_refused_before_it_is_sent(
    shell: Any, cluster: jc.Cluster, sent_ops: list[str]
) -> None:
    """A value of 60 % of the free memory (the embedded head is this machine): taking it in needs twice that.
    ``np.empty`` maps no memory until it is written, so making and hashing it costs nothing here."""
    from jupyter_cluster.agent._sizing import memory_free

    free = memory_free()
    assert free is not None
    run(shell, f"import numpy as np\nbig = np.empty({int(free * 0.6)}, dtype=np.uint8)\nkeep = 'safe'")
    error = remote(shell, "y = big[:10].copy()").error_in_exec
    assert isinstance(error, jc.InputError), error
    message = str(error)
    assert message.startswith("cannot send `big` (") and "GiB of memory free" in message, message
    assert "Nothing was sent" in message
    assert "room" in sent_ops and "run_cell" not in sent_ops, sent_ops
    with pytest.raises(jc.InputError, match="of memory free"):
        cluster.put(shell.user_ns["big"])
    assert sent_ops.count("put") == 0
    run(shell, "del big")
    assert shell.user_ns["keep"] == "safe"
    assert remote(shell, "z = 6 * 7").error_in_exec is None
    assert cluster.get(shell.user_ns["z"]) == 42
