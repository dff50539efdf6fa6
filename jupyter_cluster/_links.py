"""Links as the browser reaches them: through the Jupyter server's proxy when the kernel runs under one.

A port on the kernel's loopback (Ray's dashboard of the embedded cluster, a ``%cluster forward``, a Serve
endpoint) is ``http://127.0.0.1:PORT`` only to code in the kernel. On a JupyterHub, or any Jupyter server
that is not on the user's own machine, the browser reaches it through jupyter-server-proxy, at the server's
base URL: ``/user/NAME/proxy/PORT/``. As Dask's dashboard link does, the prefix comes from
``JUPYTERHUB_SERVICE_PREFIX`` (which JupyterHub sets for the user's server and its kernels), else from the
runtime file of the Jupyter server that started this kernel (its ``base_url``), and only where
jupyter-server-proxy is installed. ``JUPYTER_CLUSTER_PROXY`` overrides both: a prefix (``/user/alice/``, or a
whole URL such as ``https://hub.example.org/user/alice/``), or ``off`` for plain loopback links.

Code in the kernel keeps the loopback address (``Cluster.forward`` returns it: ``requests.get(url)`` works);
what is shown to a person (the status card, the sidebar, ``%cluster forward``) is the browser's.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
from functools import lru_cache
from pathlib import Path

#: The variable that overrides the detected prefix (``off``: plain loopback links).
SETTING = "JUPYTER_CLUSTER_PROXY"
_LOOPBACK = re.compile(r"^https?://(?:127\.0\.0\.1|localhost|\[::1\]):(\d+)(/.*)?$")


def proxy_prefix() -> str | None:
    """The base URL the browser reaches this kernel's Jupyter server at, ending in ``/``, where loopback
    ports are proxied (None: links stay on loopback)."""
    setting = os.environ.get(SETTING)
    if setting is not None:
        setting = setting.strip()
        return None if setting.lower() in ("", "off", "none", "no", "0") else _slash(setting)
    return _detected()


@lru_cache(maxsize=1)
def _detected() -> str | None:
    if importlib.util.find_spec("jupyter_server_proxy") is None:
        return None
    prefix = os.environ.get("JUPYTERHUB_SERVICE_PREFIX")
    if prefix:
        return _slash(prefix)
    base = _server_base_url(os.getppid())
    return _slash(base) if base is not None else None


def _server_base_url(pid: int) -> str | None:
    """The ``base_url`` of the Jupyter server whose process is ``pid`` (the one that started this kernel), from
    the runtime file it writes; None where there is none (a kernel started otherwise: nbclient, a console)."""
    try:
        from jupyter_core.paths import jupyter_runtime_dir
    except ImportError:
        return None
    runtime = Path(jupyter_runtime_dir())
    for path in (runtime / f"jpserver-{pid}.json", runtime / f"nbserver-{pid}.json"):
        try:
            info = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if info.get("pid") == pid and isinstance(info.get("base_url"), str):
            return str(info["base_url"])
    return None


def _slash(prefix: str) -> str:
    return prefix if prefix.endswith("/") else prefix + "/"


def browser_url(url: str | None) -> str | None:
    """``url`` (a loopback address of this machine) as the browser reaches it: ``PREFIXproxy/PORT/PATH`` under a
    Jupyter server with jupyter-server-proxy, else ``url`` itself (as any other address).

    >>> os.environ[SETTING] = "/user/alice/"
    >>> browser_url("http://127.0.0.1:8265")
    '/user/alice/proxy/8265/'
    >>> browser_url("http://127.0.0.1:8000/hello?x=1")
    '/user/alice/proxy/8000/hello?x=1'
    >>> os.environ[SETTING] = "off"
    >>> browser_url("http://127.0.0.1:8265")
    'http://127.0.0.1:8265'
    >>> del os.environ[SETTING]
    """
    if url is None:
        return None
    prefix = proxy_prefix()
    found = _LOOPBACK.match(url)
    if prefix is None or found is None:
        return url
    port, path = found.group(1), found.group(2) or "/"
    return f"{prefix}proxy/{port}{path}"


__all__ = ["SETTING", "browser_url", "proxy_prefix"]
