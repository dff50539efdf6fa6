"""Links as the browser reaches them (``jupyter_cluster/_links.py``): through the Jupyter server's proxy when the
kernel runs under one, found as Dask's dashboard link finds it; a setting overrides it."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from jupyter_cluster import _links
from jupyter_cluster._forward import PortForward


@pytest.fixture(autouse=True)
def _fresh(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(_links.SETTING, raising=False)
    monkeypatch.delenv("JUPYTERHUB_SERVICE_PREFIX", raising=False)
    _links._detected.cache_clear()
    yield
    _links._detected.cache_clear()


def test_the_setting_names_the_prefix_or_turns_the_proxy_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(_links.SETTING, "https://hub.example.org/user/alice")
    assert _links.browser_url("http://127.0.0.1:8265") == "https://hub.example.org/user/alice/proxy/8265/"
    assert (
        _links.browser_url("http://localhost:8000/hello?x=1")
        == "https://hub.example.org/user/alice/proxy/8000/hello?x=1"
    )
    assert _links.browser_url("http://10.0.0.5:8265") == "http://10.0.0.5:8265"  # not this machine's loopback
    monkeypatch.setenv(_links.SETTING, "off")
    assert _links.browser_url("http://127.0.0.1:8265") == "http://127.0.0.1:8265"
    assert _links.browser_url(None) is None


def test_jupyterhub_s_prefix_is_used_where_the_proxy_is_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("jupyter_server_proxy")
    monkeypatch.setenv("JUPYTERHUB_SERVICE_PREFIX", "/user/bob/")
    assert _links.proxy_prefix() == "/user/bob/"
    forward = PortForward(8000, 8000, "embedded cluster", None)
    assert forward.url == "http://127.0.0.1:8000"  # what code in the kernel uses
    assert forward.link == "/user/bob/proxy/8000/"  # what a person opens
    assert "/user/bob/proxy/8000/ -> embedded cluster:8000 (from code in this kernel: http://127.0.0.1:8000)" in (
        forward.describe()
    )


def test_the_base_url_of_the_server_that_started_the_kernel(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A kernel a Jupyter server started is its child: the server's runtime file (``jpserver-PID.json``, which
    every Jupyter server writes) gives its base URL."""
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(tmp_path))
    parent = os.getppid()
    assert _links._server_base_url(parent) is None  # no server started this process
    (tmp_path / f"jpserver-{parent}.json").write_text(json.dumps({"pid": parent, "base_url": "/lab-base/"}))
    (tmp_path / "jpserver-1.json").write_text(json.dumps({"pid": 1, "base_url": "/someone-else/"}))
    assert _links._server_base_url(parent) == "/lab-base/"
    pytest.importorskip("jupyter_server_proxy")
    assert _links.proxy_prefix() == "/lab-base/"
