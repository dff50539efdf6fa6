"""cloudpickle, keeping where the code it carries was written.

cloudpickle 3.1.3 replaces each code object's ``co_filename`` by ``"<dynamic-code>"``
(a deterministic payload). A notebook function's frames then name no file, and a
traceback can no longer show the notebook's own lines. :func:`dumps` pickles as
cloudpickle does, but keeps the code's own file name (the cell it came from).
"""

from __future__ import annotations

import io
import types
from collections import ChainMap
from collections.abc import Callable
from typing import Any, ClassVar

try:
    import cloudpickle
except ImportError:  # a head without cloudpickle: Ray's own copy
    from ray import cloudpickle  # type: ignore[no-redef,unused-ignore]

_code_reduce = getattr(getattr(cloudpickle, "cloudpickle", None), "_code_reduce", None)
PLACEHOLDER = "<dynamic-code>"


def _code_keeping_filename(code: types.CodeType) -> Any:
    constructor, args = _code_reduce(code)  # type: ignore[misc]
    return constructor, tuple(code.co_filename if arg == PLACEHOLDER else arg for arg in args)


class Pickler(cloudpickle.Pickler):  # type: ignore[misc,name-defined,unused-ignore]
    dispatch_table: ClassVar[Any] = ChainMap(
        {types.CodeType: _code_keeping_filename}, cloudpickle.Pickler.dispatch_table
    )


def dumps(obj: Any, protocol: int | None = None, buffer_callback: Callable[[Any], Any] | None = None) -> bytes:
    """``cloudpickle.dumps``, with each code object's file name kept."""
    if _code_reduce is None:  # a cloudpickle without it: its own (file names as it keeps them)
        return cloudpickle.dumps(obj, protocol=protocol, buffer_callback=buffer_callback)  # type: ignore[no-any-return,unused-ignore]
    with io.BytesIO() as file:
        Pickler(file, protocol=protocol, buffer_callback=buffer_callback).dump(obj)
        return file.getvalue()


__all__ = ["dumps"]
