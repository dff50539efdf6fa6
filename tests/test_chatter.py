"""A cell shows the user's work, never Ray's chatter (a real kernel on the shared cluster).

Real Ray Train, Tune, Serve and RLlib runs and driver cells with tasks, each from a notebook
kernel: no line of Ray's loggers, no raylet or C++ core line, no warning raised in Ray's code
and no terminal escape in any cell's output; the user's own prints, warnings and log records are
there, exactly; what Ray logged is in ``%cluster logs``, and a cell whose work made Ray warn says
so in one quiet line.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import pytest

import jupyter_cluster as jc

from .kernel import Kernel, attach_second
from .test_worker_output import _agent_of

pytestmark = [pytest.mark.ray, pytest.mark.timeout(600)]

#: What Ray's own words look like in a cell: its loggers' formats (the driver's, Serve's), its C++ core's, its
#: actors' prefixes, its warnings' files, and the lines seen in the examples before they were kept out.
CHATTER = [
    re.compile(r"\t(INFO|WARNING|ERROR) \S+\.py:\d+ -- "),  # Ray's driver-side logger
    re.compile(r"^(INFO|WARNING|ERROR) \d{4}-\d\d-\d\d .* -- ", re.M),  # Serve's loggers
    re.compile(r"\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ [DIWEF] \d+ \d+\]"),  # Ray's C++ core
    re.compile(r"\((TrainController|ServeController|ProxyActor|SynchronizationActor|PreemptionWatcher) pid="),
    re.compile(r"\(raylet"),
    re.compile(r"site-packages/ray/"),  # a warning (or traceback) from inside Ray's code
    re.compile(r"DeprecationWarning|new API stack|Install gputil|Setting up process group|Requesting resources"),
    re.compile(r"\x1b\["),  # a terminal escape
]


def chatter(text: str) -> list[str]:
    return [line for line in text.splitlines() if any(p.search(line) for p in CHATTER)]


def shown(messages: list[Any]) -> str:
    """Everything a cell showed: its streams and the text of what it displayed."""
    parts = []
    for m in messages:
        if m["msg_type"] == "stream":
            parts.append(m["content"]["text"])
        elif m["msg_type"] in ("display_data", "update_display_data", "execute_result"):
            data = m["content"]["data"]
            parts.append(str(data.get("text/plain", "")) + "\n" + str(data.get("text/html", "")))
    return "\n".join(parts)


@pytest.fixture(scope="module")
def kernel(_session_cluster: None) -> Iterator[Kernel]:
    cluster = jc.current() or jc.local(cpus=2)
    second = attach_second(*_agent_of(cluster), name="chatter")
    try:
        yield second
    finally:
        second.kc.stop_channels()
        second.km.shutdown_kernel(now=True)


def run(kernel: Kernel, code: str, timeout: float = 300, quiet: bool = True) -> str:
    """Run a cell; what it showed, which (``quiet``) holds nothing of Ray's."""
    reply, messages = kernel.execute(code, timeout=timeout)
    out = shown(messages)
    assert reply["status"] == "ok", f"the cell failed: {reply}\n{out}"
    found = chatter(out) if quiet else []
    assert not found, "Ray's chatter in the cell:\n" + "\n".join(found)
    return out


def test_a_driver_cells_tasks_show_the_users_words_and_not_rays(kernel: Kernel) -> None:
    out = run(
        kernel,
        "%%remote --driver --out n\n"
        "import logging, warnings\n"
        "import ray\n"
        "logging.getLogger('ray.serve').warning('ray says something in the driver')\n"
        "logging.getLogger('mine').warning('my own warning in the driver')\n"
        "warnings.warn('my UserWarning in the driver')\n"
        "print('my print in the driver')\n"
        "@ray.remote\n"
        "def f():\n"
        "    import logging, warnings\n"
        "    logging.getLogger('ray.train').warning('ray says something in a task')\n"
        "    logging.getLogger('mine').warning('my own record in a task')\n"
        "    warnings.warn('my UserWarning in a task')\n"
        "    print('my print in a task')\n"
        "    return 1\n"
        "n = sum(ray.get([f.remote() for _ in range(2)]))\n",
    )
    for said in (
        "my own warning in the driver",
        "UserWarning: my UserWarning in the driver",
        "my print in the driver",
        ") my own record in a task",
        "UserWarning: my UserWarning in a task",
        ") my print in a task",
    ):
        assert said in out, f"{said!r} is missing from the cell:\n{out}"
    assert "ray says something" not in out
    assert "Ray logged 3 warnings while this cell ran: %cluster logs shows them." in out, out
    logs = run(kernel, "%cluster logs --tail 200", quiet=False)
    assert "(driver) ray says something in the driver" in logs, logs
    assert "ray says something in a task" in logs, logs


def test_train_and_tune_runs_show_the_users_prints_and_no_chatter(kernel: Kernel) -> None:
    out = run(
        kernel,
        "def train_func(config):\n"
        "    import warnings\n"
        "    import ray.train\n"
        "    print('training on my own words')\n"
        "    warnings.warn('a warning of my training code')\n"
        "    for epoch in range(2):\n"
        "        ray.train.report({'loss': 1.0 / (epoch + 1)})\n"
        "result = jc.train_torch(train_func, num_workers=2)\n"
        "print('train:', result.error, len(result.reports))\n"
        "def trainable(config):\n"
        "    from ray import tune\n"
        "    print('trial', config['x'])\n"
        "    for i in range(2):\n"
        "        tune.report({'score': config['x'] * i})\n"
        "sweep = jc.tune(trainable, {'x': jc.grid_search([1, 2])}, metric='score', mode='max')\n"
        "print('tune:', sweep.best_config)\n",
        timeout=400,
    )
    assert "(rank 0) training on my own words" in out and "(rank 1) training on my own words" in out, out
    assert "UserWarning: a warning of my training code" in out, out
    assert "train: None 4" in out and "tune: {'x': 2}" in out, out
    assert ") trial 1" in out and ") trial 2" in out, out
    logs = run(kernel, "%cluster logs --tail 0", quiet=False)
    assert "(TrainController pid=" in logs and "Started training worker group" in logs, logs[-3000:]


def test_serve_and_rllib_from_a_driver_cell_show_no_chatter(kernel: Kernel) -> None:
    port = _free_port()
    out = run(
        kernel,
        "%%remote --driver --no-out\n"
        "import json, urllib.request\n"
        "from ray import serve\n"
        "@serve.deployment(ray_actor_options={'num_cpus': 0.25})\n"
        "class Echo:\n"
        "    async def __call__(self, request):\n"
        "        body = await request.json()\n"
        "        print('the deployment got', body)\n"
        "        return {'echo': body}\n"
        f"serve.start(http_options={{'host': '127.0.0.1', 'port': {port}}})\n"
        "serve.run(Echo.bind(), name='echo', route_prefix='/echo')\n"
        f"request = urllib.request.Request('http://127.0.0.1:{port}/echo', data=json.dumps(7).encode())\n"
        "print('served:', json.load(urllib.request.urlopen(request, timeout=60)))\n"
        "serve.shutdown()\n",
    )
    assert "served: {'echo': 7}" in out, out
    out = run(
        kernel,
        "%%remote --driver --out ret\n"
        "from ray.rllib.algorithms.ppo import PPOConfig\n"
        "config = (\n"
        "    PPOConfig().environment('CartPole-v1').env_runners(num_env_runners=0).learners(num_learners=0)\n"
        "    .training(train_batch_size_per_learner=200, minibatch_size=100, num_epochs=1)\n"
        ")\n"
        "algo = config.build_algo()\n"
        "ret = float(algo.train()['env_runners']['num_env_steps_sampled'])\n"
        "algo.stop()\n"
        "print('sampled', ret)\n",
    )
    assert "sampled " in out, out
    logs = run(kernel, "%cluster logs --tail 0", quiet=False)  # what Ray said: in the cluster's log
    for said in ("(ServeController pid=", "Deploying new version", "new API stack"):
        assert said in logs, f"{said!r} is not in the cluster's log:\n{logs[-3000:]}"
    assert "\x1b[" not in logs


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_no_saved_output_of_the_examples_holds_a_terminal_escape() -> None:
    from pathlib import Path

    examples = Path(__file__).resolve().parent.parent / "examples"
    for path in sorted(examples.glob("[0-9][0-9]-*.ipynb")):
        if path.name.endswith(".out.ipynb"):
            continue
        nb = json.loads(path.read_text())
        for index, cell in enumerate(nb["cells"]):
            for output in cell.get("outputs", []):
                text = json.dumps(output)
                assert "\\u001b[" not in text, f"{path.name}, cell {index}: a terminal escape in {text[:300]}"
                found = chatter(shown_output(output))
                assert not found, f"{path.name}, cell {index}: Ray's chatter: {found}"


def shown_output(output: dict[str, Any]) -> str:
    if output.get("output_type") == "stream":
        text = output.get("text", "")
        return "".join(text) if isinstance(text, list) else str(text)
    data = output.get("data", {})
    plain = data.get("text/plain", "")
    return "".join(plain) if isinstance(plain, list) else str(plain)
