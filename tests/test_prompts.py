"""The notebook's waits while a login may ask (:mod:`jupyter_cluster._prompts`): a waited-on future's own error
comes out as it is, a ``TimeoutError`` among them (a cell's ``CellTimeoutError`` is one), rather than being taken
for the wait's own time running out. The questions themselves are asked in real kernels (``test_via``,
``test_ssh``)."""

from __future__ import annotations

import concurrent.futures
import threading

import pytest

from jupyter_cluster import _prompts


def test_a_futures_own_timeout_error_is_raised_not_waited_on() -> None:
    future: concurrent.futures.Future[int] = concurrent.futures.Future()
    threading.Timer(0.3, future.set_exception, [TimeoutError("the cell's own")]).start()
    with pytest.raises(TimeoutError, match="the cell's own"):
        _prompts.wait(future, timeout=30)


def test_the_wait_itself_times_out() -> None:
    with pytest.raises(concurrent.futures.TimeoutError) as waited:
        _prompts.wait(concurrent.futures.Future(), timeout=0.3)
    assert not str(waited.value)
