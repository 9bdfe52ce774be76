"""A throwaway PostgreSQL cluster for tests of the second store engine.

`PgCluster.start(dir)` runs Debian's `initdb` into `dir/data` and `pg_ctl
start` with TCP off (`listen_addresses=''`): the server listens only on a
Unix socket in `dir/sock`, so nothing outside this machine's file system can
reach it. As root (CI) both run as the dedicated Unix user `rc-test-pg`
(PostgreSQL refuses to run as root). `dsn(dbname)` is a libpq conninfo for a
database of the cluster; `create_database()` makes a fresh one per test.

`missing_postgres()` says why the server binaries cannot be used ('' when they can):
tests skip with that reason locally and fail under CI=true (tests/conftest.py).
"""

from __future__ import annotations

import glob
import itertools
import os
import pwd
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

PG_USER = "rc-test-pg"
"""The Unix user that owns and runs the cluster when the tests run as root."""
PG_BIN_GLOB = "/usr/lib/postgresql/*/bin"
"""Where Debian's postgresql package puts the server binaries (newest first)."""
START_TIMEOUT_S = 60
_counter = itertools.count(1)


def _binary(name: str) -> str | None:
    dirs = sorted(glob.glob(PG_BIN_GLOB), key=lambda d: int(d.split("/")[-2]), reverse=True)
    for d in dirs:
        p = Path(d) / name
        if p.exists():
            return str(p)
    return shutil.which(name)


def missing_postgres() -> str:
    """Why no cluster can be started here ('' when it can)."""
    for name in ("initdb", "pg_ctl"):
        if _binary(name) is None:
            return f"PostgreSQL server binaries not found ({name}; apt-get install postgresql)"
    try:
        import psycopg  # noqa: F401
    except ImportError:
        return "psycopg is not installed (pip install -e '.[test]')"
    return ""


PG_MACHINE_EXAMPLES = 8
"""Examples of a hypothesis state machine on PostgreSQL (its full count runs
on SQLite): every statement there is a round trip to the server, measured at
1 to 4 ms on the loaded 2-core machine against microseconds in-process, so
a machine's 50 examples of 35 steps would take many minutes."""


def engine_settings(engine: str, base):
    """A state machine's settings for `engine` (the engine fixture's value)."""
    if engine == "postgresql":
        from hypothesis import settings

        return settings(base, max_examples=min(base.max_examples, PG_MACHINE_EXAMPLES))
    return base


class PgCluster:
    """One running cluster; `stop()` shuts it down (fast mode) and waits."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.data = root / "data"
        self.sock = root / "sock"
        self.user = PG_USER if os.geteuid() == 0 else None
        self.group: int | None = None
        self._free: list[str] = []

    def _run(self, *argv: str, timeout: float = START_TIMEOUT_S) -> None:
        done = subprocess.run(
            list(argv),
            user=self.user,
            group=self.group,
            extra_groups=[] if self.user else None,
            cwd=self.root,
            capture_output=True,
            timeout=timeout,
            check=False,
        )
        if done.returncode != 0:
            raise AssertionError(
                f"{argv[0]} failed ({done.returncode}): {done.stderr.decode(errors='replace')}"
                f"{done.stdout.decode(errors='replace')[-2000:]}"
            )

    def start(self) -> PgCluster:
        self.root.mkdir(parents=True, exist_ok=True)
        self.sock.mkdir(exist_ok=True)
        if self.user is not None:
            from tests.helpers.harness import ensure_unix_user

            ensure_unix_user(self.user)
            self.group = pwd.getpwnam(self.user).pw_gid
            shutil.chown(self.root, self.user)
            shutil.chown(self.sock, self.user)
            for parent in self.root.parents:  # the user must reach its directory
                if parent == Path("/"):
                    break
                parent.chmod(parent.stat().st_mode | 0o001)
        self._run(
            _binary("initdb"),
            "-D",
            str(self.data),
            "-U",
            "rc",
            "--auth=trust",
            "--encoding=UTF8",
            "--no-sync",
        )
        opts = (
            f"-c listen_addresses='' -c unix_socket_directories='{self.sock}' "
            "-c fsync=off -c max_connections=100"
        )
        self._run(
            _binary("pg_ctl"),
            "-D",
            str(self.data),
            "-l",
            str(self.root / "server.log"),
            "-o",
            opts,
            "-w",
            "-t",
            str(START_TIMEOUT_S),
            "start",
        )
        return self

    def dsn(self, dbname: str = "postgres") -> str:
        """A libpq conninfo for database `dbname` of this cluster."""
        return f"postgresql://rc@/{dbname}?host={self.sock}"

    def create_database(self, template: str = "template0") -> str:
        """A new database copied from `template` (template0: empty); returns its DSN."""
        import psycopg

        name = f"rc_test_{os.getpid()}_{next(_counter)}"
        with psycopg.connect(self.dsn(), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template}"')
        return self.dsn(name)

    def drop_database(self, dsn: str) -> None:
        """Drop a database create_database made (its connections are closed)."""
        import psycopg

        name = dsn.split("?")[0].rsplit("/", 1)[1]
        with psycopg.connect(self.dsn(), autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    def rc_database(self) -> tuple[str, Callable[[], None]]:
        """A database with rc's schema and no rows; returns (DSN, a function
        to call once nothing is connected to it any more). That function
        empties it (TRUNCATE ... RESTART IDENTITY: ids start from 1 again)
        and keeps it for the next caller: CREATE and DROP DATABASE each force
        a checkpoint, seconds over a state machine's hundred examples."""
        if self._free:
            dsn = self._free.pop()
        else:
            import asyncio

            from rc.controller.store.pg import PgDatabase

            dsn = self.create_database()
            asyncio.run(_open_close(PgDatabase(dsn, clock=lambda: 0.0)))
        return dsn, lambda: self._recycle(dsn)

    def _recycle(self, dsn: str) -> None:
        import psycopg

        from rc.controller.store.sql import PG_SCHEMA_VERSION

        with psycopg.connect(dsn, autocommit=True) as conn:
            if conn.execute("SELECT version FROM rc_schema").fetchone() != (PG_SCHEMA_VERSION,):
                conn.close()  # a test changed the schema: not for the next one
                self.drop_database(dsn)
                return
            tables = [
                r[0]
                for r in conn.execute(
                    "SELECT tablename FROM pg_tables WHERE schemaname = current_schema() "
                    "AND tablename != 'rc_schema'"
                )
            ]
            conn.execute(f"TRUNCATE {', '.join(tables)} RESTART IDENTITY CASCADE")
        self._free.append(dsn)

    def stop(self) -> None:
        self._run(_binary("pg_ctl"), "-D", str(self.data), "-m", "fast", "-w", "stop")


async def _open_close(database) -> None:
    await database.open()
    await database.close()
