"""Shared fixtures: an isolated HOME, a built zipapp, a live controller, workers, CLI."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import settings

from tests.helpers.harness import (
    REPO,
    SYSTEM_PY,
    TEST_USERS,
    Cli,
    Controller,
    Worker,
    base_env,
    ensure_unix_user,
)
from tests.helpers.inprocess import ENGINE, Lab
from tests.helpers.pgcluster import PgCluster, missing_postgres
from tests.helpers.wait import wait_until

# CI is deterministic: the same examples every run, no example database, so a
# run is red only when the code is. Locally (no CI variable) hypothesis explores
# and remembers what it found in .hypothesis/. RC_HYPOTHESIS_PROFILE overrides.
settings.register_profile("ci", derandomize=True, database=None, print_blob=True)
settings.register_profile("dev")
settings.load_profile(
    os.environ.get("RC_HYPOTHESIS_PROFILE") or ("ci" if os.environ.get("CI") else "dev")
)


E2E = Path(__file__).resolve().parent / "e2e"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The e2e marker goes by folder: every test under tests/e2e (real
    controller, worker and CLI processes) is e2e, and no other test is, so
    `-m e2e` and `-m "not e2e"` split the suite by where a module lives."""
    for item in items:
        if item.path.is_relative_to(E2E):
            item.add_marker(pytest.mark.e2e)


@pytest.fixture(autouse=True)
def _no_local_one_box(monkeypatch) -> None:
    """CLI code run inside pytest never finds this machine's own one-box: with
    no controller configured, rc uses the default local socket when it exists
    (/run/rc/rc.sock as root), so a `sudo rc up -d` left running on the test
    machine turned "no controller" tests into tests of that box. Tests of the
    socket give their own RC_SOCKET."""
    monkeypatch.setenv("RC_SOCKET", "/nonexistent/rc-tests/rc.sock")


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
        shared_account: bool = True,
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
            shared_account=shared_account,
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
    """Factory: an in-process controller on a fake clock (tests.helpers.inprocess.Lab)."""
    made = []

    def make(**kw) -> Lab:
        lb = Lab(tmp_path / f"lab{len(made)}", **kw)
        made.append(lb)
        return lb

    yield make
    for lb in made:
        lb.close()


@pytest.fixture(scope="session")
def unix_users() -> tuple[str, ...]:
    """The real Unix users of the identity tests (tests.helpers.harness.TEST_USERS),
    created with useradd when missing. Needs root, as CI runs (.ci/run)."""
    if os.geteuid() != 0:
        pytest.skip("needs root to create Unix users (CI runs as root)")
    if not os.path.exists(SYSTEM_PY):
        pytest.skip(f"needs {SYSTEM_PY}, an interpreter every user may run")
    for name in TEST_USERS:
        ensure_unix_user(name)
    return TEST_USERS


@pytest.fixture(scope="session")
def public_pyz(pyz) -> Iterator[Path]:
    """The zipapp in a directory every user may read (pytest's own are 0700)."""
    import shutil
    import tempfile

    where = Path(tempfile.mkdtemp(prefix="rc-public-", dir="/tmp"))
    where.chmod(0o755)
    copy = where / "rc.pyz"
    shutil.copyfile(pyz, copy)
    copy.chmod(0o644)
    yield copy
    shutil.rmtree(where, ignore_errors=True)


@pytest.fixture(scope="session")
def pg_cluster() -> Iterator[PgCluster]:
    """A throwaway PostgreSQL cluster for the session (tests/helpers/pgcluster.py),
    in a directory of its own under /tmp (not pytest's basetemp: another
    pytest run on the machine may prune that while the server runs).
    Skips, with the reason, where the server binaries or psycopg are
    missing; under CI=true that is a failure instead."""
    why = missing_postgres()
    if why:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI must run the PostgreSQL tests: {why}")
        pytest.skip(why)
    root = Path(tempfile.mkdtemp(prefix="rc-test-pg-"))
    try:
        cluster = PgCluster(root / "pg").start()
        yield cluster
        cluster.stop()
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def pg_dsn(pg_cluster) -> Iterator[str]:
    """The libpq URL of an empty rc database (rc's schema, no rows) in the
    session's throwaway cluster, emptied again after the test."""
    dsn, drop = pg_cluster.rc_database()
    yield dsn
    drop()


@pytest.fixture(params=["sqlite", "postgresql"])
def engine(request) -> Iterator[str]:
    """Run a test once per store engine: every Lab it makes (tests.helpers.inprocess)
    uses the embedded SQLite file, then a fresh PostgreSQL database of the
    session's cluster. Use it as `pytestmark = pytest.mark.usefixtures("engine")`."""
    if request.param == "postgresql":
        ENGINE.new_database = request.getfixturevalue("pg_cluster").rc_database
    try:
        yield request.param
    finally:
        ENGINE.new_database = None
