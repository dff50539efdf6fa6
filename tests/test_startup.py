"""What the agent's start costs: ``import ray`` without the grammar a dependency of Ray builds and nothing uses."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import jupyter_cluster as jc

CHECK = textwrap.dedent(
    """
    import sys
    from jupyter_cluster.agent._main import import_ray

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


def test_the_running_agent_did_not_build_the_iri_grammar(cluster: jc.Cluster) -> None:
    source = "import sys\nbuilt = 'rfc3987_syntax.syntax_helpers' in sys.modules\nhas_ray = 'ray.actor' in sys.modules"
    outputs = cluster.run_cell(source, mode="driver").result(60).outputs
    assert (outputs["built"], outputs["has_ray"]) == (False, True)
