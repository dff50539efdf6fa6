"""Packages and variables through Ray's runtime_env: per cell (--pip, --env, --runtime-env), per session
(set_runtime_env, --runtime-env on %cluster local/connect/up) and per call (jc.submit, jc.map). The
package installs are real: a small pure-Python package from the package index, installed by Ray."""

from __future__ import annotations

import importlib.util
import os
from typing import Any

import pytest
from IPython.core.error import UsageError

import jupyter_cluster as jc
from jupyter_cluster import _environment
from jupyter_cluster.agent.cells import _environment as agent_env

from .conftest import remote, run

pytestmark = pytest.mark.timeout(600)

#: A small pure-Python package on the package index that this environment does not have.
PACKAGE = "pyjokes"


def test_the_package_is_not_here_to_begin_with() -> None:
    assert importlib.util.find_spec(PACKAGE) is None, f"{PACKAGE} must not be installed for these tests to mean much"


def test_pip_installs_a_package_for_the_cell_and_says_it_is_preparing(shell: Any, capsys: Any) -> None:
    run(shell, "keep = 'kept'")
    res = remote(
        shell, f"import {PACKAGE}\njoke = {PACKAGE}.get_joke()\nwhere = {PACKAGE}.__file__", f"--pip {PACKAGE}"
    )
    assert res.success, res.error_in_exec
    assert isinstance(shell.user_ns["joke"], str) and shell.user_ns["joke"]
    assert "runtime_resources" in shell.user_ns["where"], "installed in Ray's environment, not this Python"
    out = capsys.readouterr().out
    assert f"preparing the environment (pip install {PACKAGE})" in out, out[-2000:]
    assert "environment ready after" in out
    # Without --pip the cell fails, and says the exact option.
    res = remote(shell, f"import {PACKAGE}")
    assert isinstance(res.error_in_exec, ModuleNotFoundError)
    assert f"run the cell with --pip {PACKAGE}" in str(res.error_in_exec)
    assert shell.user_ns["keep"] == "kept"


def test_the_preparing_events_come_before_the_cell_runs(cluster: jc.Cluster) -> None:
    env = {"pip": [PACKAGE], "env_vars": {"JC_PREPARING": "1"}}  # a new environment: Ray prepares it anew
    cell = cluster.run_cell(f"import {PACKAGE}\nok = 1", runtime_env=env, out=["ok"])
    events: list[tuple[str, Any]] = []
    cell.subscribe(lambda event, data: events.append((event, data)))
    assert cell.result(300).outputs == {"ok": 1}
    kinds = [event for event, _ in events]
    assert "preparing" in kinds and "running" in kinds, kinds
    assert kinds.index("preparing") < kinds.index("running")
    first = next(data for event, data in events if event == "preparing")
    assert first["what"] == f"pip install {PACKAGE}"


def test_an_install_that_fails_shows_pips_error_and_loses_nothing(shell: Any) -> None:
    run(shell, "keep = [1, 2]")
    res = remote(shell, "x = 1", "--pip jc-no-such-package-anywhere==0.0.1")
    error = str(res.error_in_exec)
    assert "Ray could not prepare the cell's environment (pip install jc-no-such-package-anywhere==0.0.1)" in error
    assert "No matching distribution found for jc-no-such-package-anywhere" in error, error
    assert len(error) < 3000, "trimmed to the lines that say what went wrong"
    assert shell.user_ns["keep"] == [1, 2] and "x" not in shell.user_ns
    assert remote(shell, "y = 2").success and shell.user_ns["y"] == 2


def test_env_and_runtime_env_options_reach_the_cell(shell: Any) -> None:
    res = remote(
        shell,
        "import os\nmode = os.environ['MODE']\nlevel = os.environ['LEVEL']\nsession = os.environ.get('JC_SESSION')",
        '--env MODE=fast --env LEVEL=3 --runtime-env \'{"env_vars": {"LEVEL": "1", "OTHER": "x"}}\'',
    )
    assert res.success, res.error_in_exec
    assert (shell.user_ns["mode"], shell.user_ns["level"], shell.user_ns["session"]) == ("fast", "3", None)


def _getenv(name: str) -> str | None:

    return os.environ.get(name)


def test_the_sessions_environment_reaches_every_mode_and_calls(shell: Any, cluster: jc.Cluster) -> None:
    try:
        assert cluster.set_runtime_env({"env_vars": {"JC_SESSION": "on"}})["env_vars"] == {"JC_SESSION": "on"}
        source = "import os\nseen = os.environ.get('JC_SESSION')\nmine = os.environ.get('MINE')"
        res = remote(shell, source, "--env MINE=yes")
        assert res.success, res.error_in_exec
        assert (shell.user_ns["seen"], shell.user_ns["mine"]) == ("on", "yes"), "the cell's own adds to the session's"
        assert remote(shell, source, "--map i in range(3)").success
        assert shell.user_ns["seen"] == ["on"] * 3
        assert remote(shell, source, "--actor envs").success and remote(shell, "seen", "--actor envs").success
        assert jc.get(jc.submit(_getenv, "JC_SESSION")) == "on"
        assert jc.get(jc.submit(_getenv, "CALL", runtime_env={"env_vars": {"CALL": "c"}})) == "c"
        assert [jc.get(h) for h in jc.map(_getenv, ["JC_SESSION"], progress=False)] == ["on"]
    finally:
        cluster.set_runtime_env(None)
        jc.current().kill_actor("envs")
    assert remote(shell, "import os\nseen = os.environ.get('JC_SESSION')").success
    assert shell.user_ns["seen"] is None, "cleared"


def test_an_actor_keeps_the_environment_it_was_made_in(shell: Any, cluster: jc.Cluster) -> None:
    try:
        assert remote(shell, "import os\na = os.environ['A']", "--actor kept --env A=1").success
        res = remote(shell, "b = 2", "--actor kept --env A=2")
        assert "actor `kept` runs in the environment it was made with" in str(res.error_in_exec)
        assert "kill_actor('kept')" in str(res.error_in_exec)
        assert remote(shell, "import os\na = os.environ['A']", "--actor kept --out a").success
        assert shell.user_ns["a"] == "1"
        # The session's environment changing later (a sync, say) does not lock the actor's cells out.
        cluster.set_runtime_env({"env_vars": {"LATER": "1"}})
        res = remote(
            shell, "import os\na = os.environ['A']\nlater = os.environ.get('LATER')", "--actor kept --out a,later"
        )
        assert res.success, res.error_in_exec
        assert (shell.user_ns["a"], shell.user_ns["later"]) == ("1", None), "it keeps the environment it was made in"
    finally:
        cluster.set_runtime_env(None)
        cluster.kill_actor("kept")


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        ("--env NOEQUALS", "--env takes KEY=VALUE"),
        ("--env 1BAD=x", "is not an environment variable name"),
        ("--pip ''", "--pip needs one or more packages"),
        ("--pip 'a b'", "not a requirement: 'a b'"),
        ("--runtime-env '{bad'", "--runtime-env is not JSON"),
        ("--runtime-env '[1]'", "must be a dict"),
        ('--runtime-env \'{"env_vars": {"A": 1}}\'', "must map names to strings"),
        ('--runtime-env \'{"worker_process_setup_hook": "x"}\'', "is the agent's own"),
        ("--driver --pip pyjokes", "a --driver cell runs in the agent's own process"),
    ],
)
def test_bad_environment_options_are_usage_errors_and_lose_nothing(
    shell: Any, sent_ops: list[str], options: str, expected: str
) -> None:
    run(shell, "keep = 1")
    res = remote(shell, "x = 1", options)
    assert isinstance(res.error_in_exec, UsageError), res.error_in_exec
    assert expected in str(res.error_in_exec)
    assert sent_ops == [], "nothing was sent"
    assert shell.user_ns["keep"] == 1 and "x" not in shell.user_ns


def test_a_field_ray_does_not_know_is_refused_by_the_agent(shell: Any, cluster: jc.Cluster) -> None:
    res = remote(shell, "x = 1", '--runtime-env \'{"pipp": ["pyjokes"]}\'')
    assert "Ray's runtime_env has no field 'pipp'" in str(res.error_in_exec)
    with pytest.raises(jc.RequestError, match="has no field 'pipp'"):
        cluster.set_runtime_env({"pipp": ["x"]})
    with pytest.raises(ValueError, match="must be a dict"):
        cluster.set_runtime_env(["pip"])  # type: ignore[arg-type]
    assert cluster.runtime_env == {}, "a refused environment changes nothing"
    assert remote(shell, "y = 1").success


def test_session_runtime_env_on_the_magic(shell: Any, cluster: jc.Cluster) -> None:
    res = run(shell, "%cluster local --runtime-env '{oops'")
    assert isinstance(res.error_in_exec, UsageError) and "--runtime-env is not JSON" in str(res.error_in_exec)
    try:
        assert run(shell, '%cluster local --runtime-env \'{"env_vars": {"FROM_MAGIC": "yes"}}\'').success
        assert jc.current() is cluster, "the attached cluster, its session's environment set"
        assert remote(shell, "import os\nseen = os.environ.get('FROM_MAGIC')").success
        assert shell.user_ns["seen"] == "yes"
    finally:
        cluster.set_runtime_env(None)


# ------------------------------------------------------------------ the pieces alone


def test_pip_lists_split_on_commas_between_requirements() -> None:
    assert _environment.parse_pip("a, b[x,y]>=1,<2 ,c==3") == ["a", "b[x,y]>=1,<2", "c==3"]


def test_the_agent_merges_a_cell_over_its_session(tmp_path: Any) -> None:
    envs = agent_env.Environments(job_modules=["/ship/jupyter_cluster"])
    envs.sessions["s"] = {"pip": ["a"], "env_vars": {"X": "1"}, "working_dir": "gcs://_ray_pkg_1.zip"}
    merged = envs.for_cell("s", {"pip": ["b", "a"], "env_vars": {"Y": "2"}, "py_modules": [str(tmp_path)]})
    assert merged == {
        "pip": ["a", "b"],
        "env_vars": {"X": "1", "Y": "2"},
        "working_dir": "gcs://_ray_pkg_1.zip",
        "py_modules": ["/ship/jupyter_cluster", str(tmp_path)],
    }, "the session's packages kept, the agent's own modules never dropped"
    assert envs.for_cell("other", None) is None, "a session without one runs in the job's own"
