"""The controller's event loop: uvloop's when it is installed (the optional
`fast` extra), else asyncio's own (rc.controller.serve._loop_factory)."""

from __future__ import annotations

import asyncio
import importlib.util
import sys

import pytest

from rc.controller import serve


def test_without_uvloop_the_controller_uses_asyncio_s_own_loop(monkeypatch):
    monkeypatch.setitem(sys.modules, "uvloop", None)  # `import uvloop` raises ImportError
    assert serve._loop_factory() is None
    with asyncio.Runner(loop_factory=serve._loop_factory()) as runner:
        assert runner.run(asyncio.sleep(0, "ran")) == "ran"


@pytest.mark.skipif(importlib.util.find_spec("uvloop") is None, reason="uvloop is not installed")
def test_with_uvloop_the_controller_runs_on_it():
    import uvloop

    factory = serve._loop_factory()
    assert factory is uvloop.new_event_loop
    with asyncio.Runner(loop_factory=factory) as runner:
        assert isinstance(runner.get_loop(), uvloop.Loop)
