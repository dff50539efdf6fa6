"""The public surface: one sorted ``__all__``, and a light import."""

from __future__ import annotations

import subprocess
import sys
import types

import jupyter_cluster as jc


def test_all_is_sorted_and_complete() -> None:
    assert jc.__all__ == sorted(jc.__all__)
    for name in jc.__all__:
        assert hasattr(jc, name), name
    typing_names = {"annotations", "TYPE_CHECKING", "Any", "Callable", "Iterable", "Sequence", "cast"}
    public = {
        name
        for name, value in vars(jc).items()
        if not name.startswith("_") and name not in typing_names and not isinstance(value, types.ModuleType)
    }
    # The widgets' two classes come from the module's __getattr__, when first asked for (hasattr above).
    assert public == set(jc.__all__) - {"Dashboard", "Timeline"}


def test_load_ext_imports_neither_ray_nor_numpy() -> None:
    code = (
        "import sys\nfrom IPython.core.interactiveshell import InteractiveShell\n"
        "InteractiveShell.instance().run_line_magic('load_ext', 'jupyter_cluster')\n"
        "print(sorted(m for m in ('ray', 'numpy', 'pandas') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
