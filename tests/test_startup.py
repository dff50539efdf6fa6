"""What the agent's start costs: ``import ray`` without the grammar a dependency of Ray builds and nothing uses."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import jupyter_cluster as jc
from jupyter_cluster.agent._importing import lean_pythonpath

CHECK = textwrap.dedent(
    """
    import sys
    from jupyter_cluster.agent._importing import import_ray

    ray = import_ray()
    assert "ray.actor" in sys.modules
    assert "rfc3987_syntax.syntax_helpers" not in sys.modules, "the IRI grammar was built at import"
    import jsonschema

    iri = jsonschema.Draft202012Validator({"format": "iri"}, format_checker=jsonschema.FormatChecker())
    assert iri.is_valid("https://example.org/a%C3%A4?q=1#f")
    assert not iri.is_valid("not an iri: spaces and no scheme"), "jsonschema's IRI check still checks"
    import rfc3987_syntax

    assert rfc3987_syntax.parse("iri", "https://example.org/") is not None, "the package itself, once asked for"
    """
)


def test_the_agent_imports_ray_without_building_the_iri_grammar_and_iri_checks_still_work() -> None:
    """Ray imports jsonschema, which imports ``rfc3987_syntax`` (installed with Jupyter) for its ``iri`` format
    checker, and that builds an Earley parser at import: 0.77 s of a 1.04 s ``import ray`` here. The agent's
    ``import_ray`` defers it to the first IRI check; the check itself and the package are unchanged."""
    done = subprocess.run([sys.executable, "-c", CHECK], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]


def test_the_agent_and_the_embedded_clusters_workers_did_not_build_the_iri_grammar(cluster: jc.Cluster) -> None:
    """The agent (a driver cell runs in it) and a worker of the embedded cluster (a task cell), which imports Ray
    through the ``sitecustomize`` in ``agent/_site``; in the worker, jsonschema's IRI check still works."""
    source = "import sys\nbuilt = 'rfc3987_syntax.syntax_helpers' in sys.modules\nhas_ray = 'ray.actor' in sys.modules"
    outputs = cluster.run_cell(source, mode="driver").result(60).outputs
    assert (outputs["built"], outputs["has_ray"]) == (False, True), "in the agent"
    check = (
        "import jsonschema\n"
        "iri = jsonschema.Draft202012Validator({'format': 'iri'}, format_checker=jsonschema.FormatChecker())\n"
        "checked = [iri.is_valid('https://example.org/'), iri.is_valid('no scheme here')]\n"
        "import rfc3987_syntax\nreal = hasattr(rfc3987_syntax, 'syntax_parser')"
    )
    outputs = cluster.run_cell(source + "\n" + check).result(60).outputs
    assert (outputs["built"], outputs["has_ray"]) == (False, True), "in a worker"
    assert outputs["checked"] == [True, False] and outputs["real"]


def test_the_embedded_clusters_sitecustomize_runs_the_one_it_is_in_front_of(tmp_path: Path) -> None:
    """Its folder goes first on the embedded cluster's PYTHONPATH: a ``sitecustomize`` further along still runs (a
    distribution's, a user's), and one that fails is reported as Python reports it, the process going on."""
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "sitecustomize.py").write_text("import builtins\nbuiltins.THEIRS_RAN = True\n")
    probe = (
        "import builtins, sys\n"
        "print(getattr(builtins, 'THEIRS_RAN', False), type(sys.modules['rfc3987_syntax']).__name__)"
    )
    env = {**os.environ, "PYTHONPATH": lean_pythonpath(str(theirs))}
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 0 and done.stdout.split() == ["True", "_StandIn"], (done.stdout, done.stderr)
    (theirs / "sitecustomize.py").write_text("raise RuntimeError('theirs is broken')\n")
    done = subprocess.run([sys.executable, "-c", "print('went on')"], capture_output=True, text=True, env=env)
    assert done.stdout.strip() == "went on"
    assert "Error in sitecustomize" in done.stderr and "theirs is broken" in done.stderr
