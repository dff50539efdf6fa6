"""Ray's ``runtime_env`` as a cell or a session asks for it: ``--pip``, ``--env``, ``--runtime-env``.

Ray installs and sets up what a runtime environment names on each node that runs the work
(its own mechanism: a virtualenv per package set, cached by Ray); this module only builds
the dict from the magics' options and checks its shape in the notebook, so that a typo is
a usage error before anything is sent. The agent merges a cell's environment into its
session's (see ``agent/cells/_environment.py``) and Ray checks the rest.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from typing import Any

#: What a pip requirement looks like, roughly: a name, extras, a version clause (no spaces
#: outside the clause, which a comma-separated --pip list could not carry anyway).
_REQUIREMENT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(\[[A-Za-z0-9._,-]+\])?\s*([<>=!~].*)?$")


def parse_pip(text: str) -> list[str]:
    """``--pip a,b==1.0,c[x]`` as Ray's ``pip`` list.

    >>> parse_pip("pyjokes, requests==2.31.0")
    ['pyjokes', 'requests==2.31.0']
    """
    packages = [p.strip() for p in _split_requirements(_unquote(text)) if p.strip()]
    if not packages:
        raise ValueError("--pip needs one or more packages, e.g. --pip pyjokes,requests==2.31.0")
    bad = [p for p in packages if not _REQUIREMENT.match(p) and "://" not in p]
    if bad:
        raise ValueError(
            f"--pip takes pip requirements separated by commas (e.g. pyjokes,requests==2.31.0); "
            f"not a requirement: {', '.join(repr(b) for b in bad)}"
        )
    return packages


def _split_requirements(text: str) -> list[str]:
    """Split on commas that separate requirements, not those inside ``[extras]`` or a version clause
    (``numpy>=1.20,<2`` is one requirement)."""
    parts: list[str] = []
    depth = 0
    current = ""
    for char in text:
        if char == "[":
            depth += 1
        elif char == "]":
            depth = max(0, depth - 1)
        if char == "," and depth == 0:
            parts.append(current)
            current = ""
            continue
        current += char
    parts.append(current)
    merged: list[str] = []
    for part in parts:  # "<2" after "numpy>=1.20": a clause of the requirement before
        if merged and re.match(r"^\s*[<>=!~]", part):
            merged[-1] += "," + part
        else:
            merged.append(part)
    return merged


def _unquote(text: str) -> str:
    """IPython's magic arguments keep the quotes around a quoted option value."""
    text = text.strip()
    if len(text) > 1 and text[0] == text[-1] and text[0] in "'\"":
        return text[1:-1]
    return text


def parse_env(assignments: Iterable[str]) -> dict[str, str]:
    """``--env KEY=VAL`` (each given once) as Ray's ``env_vars``.

    >>> parse_env(["MODE=fast", "N=3"])
    {'MODE': 'fast', 'N': '3'}
    """
    env: dict[str, str] = {}
    for item in assignments:
        item = _unquote(item)
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--env takes KEY=VALUE (e.g. --env OMP_NUM_THREADS=1), not {item!r}")
        key = key.strip()
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
            raise ValueError(f"--env {item}: {key!r} is not an environment variable name")
        env[key] = value
    return env


def parse_json(text: str, option: str = "--runtime-env") -> dict[str, Any]:
    """``--runtime-env JSON`` as a dict (the quotes a magic keeps around it removed)."""
    text = _unquote(text)
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise ValueError(
            f'{option} is not JSON ({exc}); write e.g. \'{{"pip": ["pyjokes"], "env_vars": {{"MODE": "fast"}}}}\''
        ) from None
    return check(value, option)


def check(runtime_env: Any, what: str = "runtime_env") -> dict[str, Any]:
    """The shape Ray needs, checked here so that the mistake is named before anything is sent."""
    if not isinstance(runtime_env, Mapping):
        raise ValueError(
            f'{what} must be a dict such as {{"pip": ["pyjokes"]}} (Ray\'s runtime_env), '
            f"not {type(runtime_env).__name__}"
        )
    env = dict(runtime_env)
    for key in env:
        if not isinstance(key, str):
            raise ValueError(f"{what}: its keys are Ray's runtime_env fields (str), not {key!r}")
    pip = env.get("pip")
    if pip is not None and not isinstance(pip, (list, tuple, str, Mapping)):
        raise ValueError(f'{what}["pip"] must be a list of requirements (or a requirements file), not {pip!r}')
    variables = env.get("env_vars")
    if variables is not None and not (
        isinstance(variables, Mapping) and all(isinstance(k, str) and isinstance(v, str) for k, v in variables.items())
    ):
        raise ValueError(f'{what}["env_vars"] must map names to strings, e.g. {{"MODE": "fast"}}, not {variables!r}')
    if "worker_process_setup_hook" in env:
        raise ValueError(
            f"{what}: worker_process_setup_hook is the agent's own (it routes what the workers print to the cells); "
            "run setup code at the top of the cell, or in an --actor's first cell"
        )
    return env


def build(
    pip: str | Iterable[str] | None = None,
    env: Mapping[str, str] | Iterable[str] | None = None,
    runtime_env: Mapping[str, Any] | str | None = None,
) -> dict[str, Any] | None:
    """One ``runtime_env`` from the three ways of giving it; None when none is given.

    ``pip`` adds to ``runtime_env``'s pip list, ``env`` to its ``env_vars``.

    >>> build(pip="pyjokes", env=["MODE=fast"], runtime_env='{"env_vars": {"N": "1"}}')
    {'env_vars': {'N': '1', 'MODE': 'fast'}, 'pip': ['pyjokes']}
    """
    if pip is None and env is None and runtime_env is None:
        return None
    result = parse_json(runtime_env) if isinstance(runtime_env, str) else check(runtime_env or {})
    if pip is not None:
        packages = parse_pip(pip) if isinstance(pip, str) else parse_pip(",".join(pip))
        given = result.get("pip")
        if given is None:
            result["pip"] = packages
        elif isinstance(given, (list, tuple)):
            result["pip"] = [*given, *(p for p in packages if p not in given)]
        elif isinstance(given, Mapping) and isinstance(given.get("packages"), (list, tuple)):
            result["pip"] = {**given, "packages": [*given["packages"], *packages]}
        else:
            raise ValueError("--pip adds to a runtime_env whose pip is a list; this one's is a requirements file")
    if env is not None:
        variables = dict(env) if isinstance(env, Mapping) else parse_env(env)
        result["env_vars"] = {**(result.get("env_vars") or {}), **variables}
    return check(result)


__all__ = ["build", "check", "parse_env", "parse_json", "parse_pip"]
