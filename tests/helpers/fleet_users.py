"""A controller and worker with users alice, bob and an admin (their CLIs as fixtures over the module's own `fleet`), and a line reader with a deadline."""

from __future__ import annotations

import os
import select
import subprocess
import time
from pathlib import Path

import pytest

from rc.proto.errors import ApiError
from tests.helpers.harness import Cli, Controller, Worker, base_env
from tests.helpers.wait import wait_until

WORKER_TOML = """\
kill_grace = "1s"
devices = [
  { name = "cpu0", max_runtime = "2h", labels = { model = "h100", vram = "81920M" } },
  { name = "cpu1", labels = { model = "a100", vram = "40G" } },
]
"""


class ConfiguredWorker(Worker):
    """A worker whose devices (with ceilings and labels) come from its config file."""

    def command(self) -> list[str]:
        cmd = super().command()
        i = cmd.index("--devices")
        return cmd[:i] + cmd[i + 2 :]


def start_fleet(tmp: Path, pyz: Path, serve_flags: list[str], host: str = "box"):
    """A controller and one configured worker; returns (controller, worker, env)."""
    home = tmp / "home"
    home.mkdir(parents=True, exist_ok=True)
    env = base_env(home)
    ctl = Controller(tmp / "data", env, serve_flags).start()
    cfg = tmp / "worker.toml"
    cfg.write_text(WORKER_TOML)
    w = ConfiguredWorker(
        ctl.url,
        ctl.token(f"worker-{host}", "worker"),
        tmp / "w",
        env,
        host=host,
        pyz=pyz,
        config=cfg,
    ).start()
    c = ctl.client()
    wait_until(
        lambda: (
            sum(v["device"]["state"] == "ready" for v in c.get("/v1/devices")["devices"]) == 2
            or w.proc.poll() is not None
        ),
        30,
        "the worker's two devices",
    )
    assert w.proc.poll() is None, w.log()
    return ctl, w, env


@pytest.fixture(scope="module")
def fleet(tmp_path_factory, pyz):
    tmp = tmp_path_factory.mktemp("hold")
    ctl, w, env = start_fleet(tmp, pyz, [])
    users = {name: Cli(ctl.url, ctl.token(name), env, tmp) for name in ("alice", "bob")}
    yield ctl, users, w.proc.pid
    w.stop()
    ctl.stop()


# alice, bob and admin serve test_queue.py too, over its own `fleet`.
@pytest.fixture
def alice(fleet):
    return fleet[1]["alice"]


@pytest.fixture
def bob(fleet):
    return fleet[1]["bob"]


@pytest.fixture
def admin(fleet):
    ctl = fleet[0]
    c = ctl.client()
    yield c
    # leave nothing behind for the next test: every job ended, both devices ready
    for j in c.get("/v1/state")["jobs"] + c.get("/v1/state")["queued"]:
        try:
            c.post(f"/v1/jobs/{j['id']}/kill", {"reason": "test cleanup"})
        except ApiError:
            pass
    wait_until(
        lambda: all(v["device"]["state"] == "ready" for v in c.get("/v1/devices")["devices"]),
        30,
        "both devices free",
    )
    c.close_all()


def read_line(proc: subprocess.Popen, timeout: float, what: str, stream: str = "stdout") -> str:
    """The next line of `proc`'s stdout (or stderr), waiting at most `timeout` seconds."""
    deadline = time.monotonic() + timeout
    buf = b""
    fd = getattr(proc, stream).fileno()
    while not buf.endswith(b"\n"):
        left = deadline - time.monotonic()
        if left <= 0 or proc.poll() is not None and not select.select([fd], [], [], 0)[0]:
            err = proc.stderr.read().decode(errors="replace") if proc.poll() is not None else ""
            raise AssertionError(f"no line from rc for {what} (got {buf!r}) {err}")
        if select.select([fd], [], [], min(left, 0.5))[0]:
            chunk = os.read(fd, 1)
            if not chunk:
                continue
            buf += chunk
    return buf.decode()
