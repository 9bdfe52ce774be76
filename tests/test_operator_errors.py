"""Operator mistakes get one line, not a traceback or a silently broken
controller: two `rc serve` on one data dir, the last admin token revoked,
numeric `rc serve` options out of range."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.harness import Controller

pytestmark = pytest.mark.e2e


def _serve(env, data, *flags, timeout: float = 60):
    return subprocess.run([sys.executable, "-m", "rc", "serve", "--listen", "127.0.0.1:0",
                           "--data", str(data), *flags],
                          env=env, capture_output=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)


def test_second_serve_on_the_same_data_dir_is_refused(tmp_path, env):
    data = tmp_path / "data"
    ctl = Controller(data, env).start()
    try:
        state = (data / "controller.json").read_text()
        res = _serve(env, data)
        assert res.returncode != 0
        lines = res.stderr.decode().strip().splitlines()
        assert lines == [f"rc serve: data dir {data} is in use by another rc serve "
                         f"(pid {ctl.proc.pid})"], lines
        # the first controller is untouched: its state file and its API
        assert (data / "controller.json").read_text() == state
        assert ctl.client().get("/v1/whoami")
    finally:
        ctl.stop()
    # once the first has stopped, the data dir is free again
    again = Controller(data, env).start()
    again.stop()
