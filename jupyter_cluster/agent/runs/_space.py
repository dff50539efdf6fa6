"""Search spaces: the notebook's ``jc.choice`` & co., and what they become in Ray Tune.

The notebook never imports Ray, so ``jc.uniform(0.1, 0.9)`` is a :class:`Domain`, a
plain description; on the head, :func:`to_tune` turns a whole ``param_space`` into
Ray Tune's own domains (``tune.uniform`` ...). Ray Tune's domain objects, made in a
notebook that has Ray, pass through as they are. Anything else that looks like a
search domain of another library is refused with what to use instead, rather than
being passed to every trial as a constant.

This module imports only the standard library (the kernel imports it too).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from .._errors import ClusterError

#: Modules whose objects are search domains of other libraries, not values.
FOREIGN = ("hyperopt", "optuna.distributions", "scipy.stats", "skopt.space", "nevergrad", "ConfigSpace")


class SpaceError(ClusterError, ValueError):
    """A search space that cannot be sampled as written."""


@dataclass(frozen=True)
class Domain:
    """One searchable parameter: ``kind`` is the Ray Tune function it becomes."""

    kind: str
    args: tuple[Any, ...]

    def __repr__(self) -> str:
        return f"jc.{self.kind}({', '.join(map(repr, self.args))})"


def _number(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
        raise SpaceError(f"{name} must be a number, not {value!r}")
    return value


def choice(categories: Sequence[Any]) -> Domain:
    """Sample one of ``categories`` (``tune.choice``)."""
    if isinstance(categories, (str, bytes)) or not isinstance(categories, Sequence):
        raise SpaceError(f"jc.choice takes a list of options, not {type(categories).__name__} {categories!r}")
    if not categories:
        raise SpaceError("jc.choice([]) has no options to choose from")
    return Domain("choice", (list(categories),))


def uniform(lower: float, upper: float) -> Domain:
    """A float sampled uniformly in ``[lower, upper)`` (``tune.uniform``)."""
    lower, upper = _number("jc.uniform's lower bound", lower), _number("jc.uniform's upper bound", upper)
    if not lower < upper:
        raise SpaceError(f"jc.uniform({lower!r}, {upper!r}): the lower bound must be below the upper one")
    return Domain("uniform", (lower, upper))


def loguniform(lower: float, upper: float) -> Domain:
    """A float sampled uniformly in log space (``tune.loguniform``): learning rates."""
    lower, upper = _number("jc.loguniform's lower bound", lower), _number("jc.loguniform's upper bound", upper)
    if not 0 < lower < upper:
        raise SpaceError(
            f"jc.loguniform({lower!r}, {upper!r}): the bounds must be positive and the lower below the upper"
        )
    return Domain("loguniform", (lower, upper))


def randint(lower: int, upper: int) -> Domain:
    """An integer in ``[lower, upper)`` (``tune.randint``; ``upper`` is excluded)."""
    for name, value in (("lower", lower), ("upper", upper)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise SpaceError(f"jc.randint's {name} bound must be an int, not {value!r}")
    if not lower < upper:
        raise SpaceError(f"jc.randint({lower}, {upper}) is empty: the upper bound is excluded")
    return Domain("randint", (lower, upper))


def grid_search(values: Sequence[Any]) -> Domain:
    """Try every one of ``values`` (``tune.grid_search``; multiplies ``num_samples``)."""
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence) or not values:
        raise SpaceError(f"jc.grid_search takes a non-empty list of values, not {values!r}")
    return Domain("grid_search", (list(values),))


def _walk(space: Any, path: str) -> Iterator[tuple[str, Any]]:
    if isinstance(space, dict):
        for key, value in space.items():
            yield from _walk(value, f"{path}[{key!r}]")
    else:
        yield path, space


def foreign(value: Any) -> str | None:
    """The library a value is a search domain of, when it is one Ray Tune cannot sample."""
    module = type(value).__module__ or ""
    for prefix in FOREIGN:
        if module == prefix or module.startswith(prefix + "."):
            return f"{module}.{type(value).__qualname__}"
    return None


def check(space: Any, name: str = "param_space") -> None:
    """Refuse values that look like search domains but are none Ray Tune samples."""
    if not isinstance(space, dict):
        raise SpaceError(f"{name} must be a dict of parameter names to values or domains, not {type(space).__name__}")
    for path, value in _walk(space, name):
        if isinstance(value, Domain):
            if value.kind not in ("choice", "uniform", "loguniform", "randint", "grid_search"):
                raise SpaceError(f"{path} is an unknown search domain {value.kind!r}")
            continue
        what = foreign(value)
        if what is not None:
            raise SpaceError(
                f"{path} is a {what}, a search domain of another library, which Ray Tune cannot sample. "
                "Use jc.choice, jc.uniform, jc.loguniform, jc.randint or jc.grid_search (or Ray Tune's own "
                "tune.* domains) in param_space; a search_alg of that library takes its own space instead."
            )


def to_tune(space: Any) -> Any:
    """``space`` with every :class:`Domain` replaced by Ray Tune's (on the head: imports Ray)."""
    from ray import tune

    if isinstance(space, Domain):
        if space.kind == "grid_search":
            return tune.grid_search(*space.args)
        return getattr(tune, space.kind)(*space.args)
    if isinstance(space, dict):
        return {key: to_tune(value) for key, value in space.items()}
    if isinstance(space, list):
        return [to_tune(value) for value in space]
    return space


__all__ = ["Domain", "SpaceError", "check", "choice", "grid_search", "loguniform", "randint", "to_tune", "uniform"]
