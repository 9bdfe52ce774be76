"""Shared fixtures: an isolated HOME, a built zipapp, a live controller, workers, CLI."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import settings

from tests.harness import REPO, Cli, Controller, Worker, base_env, wait_until
from tests.inprocess import Lab

# CI is deterministic: the same examples every run, no example database, so a
# run is red only when the code is. Locally (no CI variable) hypothesis explores
# and remembers what it found in .hypothesis/. RC_HYPOTHESIS_PROFILE overrides.
settings.register_profile("ci", derandomize=True, database=None, print_blob=True)
settings.register_profile("dev")
settings.load_profile(
    os.environ.get("RC_HYPOTHESIS_PROFILE") or ("ci" if os.environ.get("CI") else "dev")
)


@pytest.fixture(scope="session")
def pyz(tmp_path_factory) -> Path:
    """dist/rc.pyz built once per session into a temporary directory."""
    out = tmp_path_factory.mktemp("zipapp") / "rc.pyz"
    subprocess.run(
        [sys.executable, str(REPO / "zipapp"), "--output", str(out)],
        check=True,
        capture_output=True,
        timeout=60,
    )
    return out


@pytest.fixture
def home(tmp_path) -> Path:
    h = tmp_path / "home"
    h.mkdir()
    return h


@pytest.fixture
def env(home) -> dict[str, str]:
    return base_env(home)


@pytest.fixture
def controller(tmp_path, env) -> Iterator[Controller]:
    """A running `rc serve` with a fresh data dir."""
    ctl = Controller(tmp_path / "data", env).start()
    yield ctl
    ctl.stop()


@pytest.fixture
def make_controller(tmp_path, env) -> Iterator:
    """Factory for controllers with extra flags; all are stopped afterwards."""
    made: list[Controller] = []

    def make(*extra: str, data: Path | None = None) -> Controller:
        ctl = Controller(data or tmp_path / f"data{len(made)}", env, list(extra)).start()
        made.append(ctl)
        return ctl

    yield make
    for ctl in made:
        ctl.stop()


@pytest.fixture
def make_worker(tmp_path, env, pyz) -> Iterator:
    """Factory: start a worker (from the zipapp) with a fresh worker token and
    wait until this worker process has registered and its devices are ready
    (a host's devices may still look ready from an earlier worker process)."""
    made: list[Worker] = []

    def make(
        ctl: Controller,
        host: str = "testhost",
        devices: str = "cpu:2",
        *,
        wait: bool = True,
        token: str | None = None,
        extra: list[str] | None = None,
        config: Path | None = None,
        worker_env: dict[str, str] | None = None,
        launcher: list[str] | None = None,
    ) -> Worker:
        tok = token or ctl.token(f"worker-{host}-{len(made)}", "worker")
        w = Worker(
            ctl.url,
            tok,
            tmp_path / "workers",
            worker_env or env,
            host=host,
            devices=devices,
            extra=extra,
            pyz=pyz,
            config=config,
            launcher=launcher,
        )
        seen = len(w.log())  # the log file is shared by worker processes of a host
        w.start()
        made.append(w)
        if wait:
            c = ctl.client()

            def registered() -> bool:
                if w.proc.poll() is not None:
                    raise AssertionError(f"worker exited {w.proc.returncode}:\n{w.log()}")
                return f"registered {host} " in w.log()[seen:] and any(
                    v["device"]["host"] == host and v["device"]["state"] == "ready"
                    for v in c.get("/v1/devices")["devices"]
                )

            wait_until(registered, timeout=30, what=f"worker {host} to register")
        return w

    yield make
    for w in made:
        w.stop()


@pytest.fixture
def cli(controller, env, tmp_path) -> Cli:
    """The CLI as an ordinary user ("alice") of `controller`."""
    return Cli(controller.url, controller.token("alice"), env, tmp_path)


@pytest.fixture
def admin_cli(controller, env, tmp_path) -> Cli:
    return Cli(controller.url, controller.admin_token, env, tmp_path)


@pytest.fixture
def lab(tmp_path):
    """Factory: an in-process controller on a fake clock (tests.inprocess.Lab)."""
    made = []

    def make(**kw) -> Lab:
        lb = Lab(tmp_path / f"lab{len(made)}", **kw)
        made.append(lb)
        return lb

    yield make
    for lb in made:
        lb.close()
