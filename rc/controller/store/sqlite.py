"""The SQLite engine: the embedded default, one file in the data directory.

`SqliteDatabase(path, clock)` is rc.controller.store.db.Database on SQLite:
WAL, foreign keys on, `synchronous=FULL`, a write batch in `BEGIN IMMEDIATE
... COMMIT` (one fsync for the batch), `readers` reader connections
(`query_only`). Opening creates the schema (rc/store.sql) on an empty file
and runs the migrations an older file needs (rc.controller.store.sql); a
file from a newer rc is refused with a clear message.

Why transaction functions run whole on the connection's thread instead of one
`await` per statement (aiosqlite's usual form): aiosqlite hops to its thread for
each statement, about 200 µs per hop on the 2-core machine we target (the hop
itself: a bare executor measures the same). A ten-statement transaction would
cost 2 ms of hops; run whole, a batch of transactions costs one hop. We keep
aiosqlite for what it is good at (owning the connection's thread, opening and
closing it) and hand that thread whole functions; `_on_thread` is the one
place that relies on its dispatch method.
"""

from __future__ import annotations

import logging
import os
import sqlite3
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, ClassVar

import aiosqlite

from rc.controller.errors import GuardFailed, StoreError
from rc.controller.planning import aged_priority
from rc.controller.planning.fairshare import decayed
from rc.controller.store import sql
from rc.controller.store.db import Database, Tx
from rc.controller.store.sql import QUERIES, WRITES
from rc.proto.model import Condition, JobState

__all__ = [
    "SQL_FUNCTIONS",
    "SqliteDatabase",
    "SqliteTx",
    "add_functions",
    "migrate",
    "statements",
]

log = logging.getLogger("rc.store")

BUSY_TIMEOUT_MS = 5000


class SqliteTx(Tx):
    """db.Tx on SQLite, which keeps `wrote`: it becomes True when a
    statement may have changed rows: one of exec, change or many that
    reports rows changed (or cannot say), or a query that is not a SELECT
    run by one, all, scalar or iter (an INSERT ... RETURNING: sqlite3 counts
    its rows only once it is stepped to its end)."""

    __slots__ = ()

    COUNTS_WRITES: ClassVar[bool] = True

    def one(self, name: str, params: Any = ()) -> sqlite3.Row | None:
        self.wrote = self.wrote or name in WRITES
        return self.conn.execute(QUERIES[name], params).fetchone()

    def all(self, name: str, params: Any = ()) -> list[sqlite3.Row]:
        self.wrote = self.wrote or name in WRITES
        return self.conn.execute(QUERIES[name], params).fetchall()

    def scalar(self, name: str, params: Any = ()) -> Any:
        self.wrote = self.wrote or name in WRITES
        row = self.conn.execute(QUERIES[name], params).fetchone()
        return None if row is None else row[0]

    def iter(self, name: str, params: Any = ()) -> sqlite3.Cursor:
        self.wrote = self.wrote or name in WRITES
        return self.conn.execute(QUERIES[name], params)

    def exec(self, name: str, params: Any = ()) -> int:
        n = self.conn.execute(QUERIES[name], params).rowcount
        self.wrote = self.wrote or n != 0
        return n

    def change(self, name: str, params: Any = ()) -> None:
        n = self.conn.execute(QUERIES[name], params).rowcount
        self.wrote = self.wrote or n != 0
        if n != 1:
            raise GuardFailed(f"query {name} changed {n} rows; it must change exactly one")

    def many(self, name: str, rows: Iterable[Any]) -> int:
        n = self.conn.executemany(QUERIES[name], rows).rowcount
        self.wrote = self.wrote or n != 0
        return n


def dep_met(condition: str, state: str) -> bool:
    """SQL's dep_met(condition, state): whether a dependency in `state` meets
    `condition` (rc.proto.model.Condition.met_by, its one definition)."""
    return Condition(condition).met_by(JobState(state))


SQL_FUNCTIONS: dict[str, tuple[int, Callable[..., Any]]] = {
    "effective_priority": (4, aged_priority),
    "dep_met": (2, dep_met),
    "decayed_seconds": (4, decayed),
}
"""Python functions queries call by name: name → (number of arguments, function).

Why aging is a Python function called from SQL rather than a SQL expression:
it is then written once (rc.controller.planning.aged_priority), for the
planner and for the queries that order the queue. The cost, measured on the
2-core machine we target: the first job of a 10,000-job queue in scheduling
order (aging on) comes after 7.0 ms with the rule as an inline SQL
expression and 10.0 ms with the function (0.3 µs a row); the pass orders the
queue only when a device is free (queue.anything_to_place).

One query writes the rule inline instead: `queue_ahead_by_ask`, the position
count every queued job's view makes (each submit's reply among them). There
the calls were most of the count's time, and the count most of the
controller's CPU under a stream of submissions (bench/pyspy.py); inline,
with the jobs_queue_ask index covering it, and the rule worked out only for
jobs of a lower priority than the counted one's, a count over 2,000 queued
jobs takes 0.8 ms instead of 11. tests/store/test_queue_position.py holds it
equal to the plan.
"""


def add_functions(conn: sqlite3.Connection) -> None:
    """Register SQL_FUNCTIONS on a connection (every connection the store opens)."""
    for name, (n_args, fn) in SQL_FUNCTIONS.items():
        conn.create_function(name, n_args, fn, deterministic=True)


def configure(conn: sqlite3.Connection) -> None:
    conn.row_factory = sqlite3.Row
    add_functions(conn)
    conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
    conn.execute("PRAGMA foreign_keys = ON")
    conn.execute("PRAGMA synchronous = FULL")


def migrate(conn: sqlite3.Connection, path: str) -> None:
    """Create or upgrade the schema of the SQLite file `path` on `conn`;
    refuse (StoreError) a database from a newer rc, one that is not an rc
    database, or one that cannot be in WAL mode."""
    mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
    if mode.lower() != "wal":
        raise StoreError(f"{path}: could not switch the database to WAL mode (got {mode})")
    version = conn.execute("PRAGMA user_version").fetchone()[0]
    if version > sql.SCHEMA_VERSION:
        raise StoreError(
            f"{path} was written by a newer rc (schema version {version}; this rc knows "
            f"versions up to {sql.SCHEMA_VERSION}). Upgrade rc, or point --data elsewhere."
        )
    if version == 0:
        tables = conn.execute("SELECT count(*) FROM sqlite_master WHERE type='table'").fetchone()[0]
        if tables:
            raise StoreError(f"{path} is not an rc database (it has tables but no schema version)")
        conn.execute("BEGIN IMMEDIATE")
        for stmt in statements(sql.SCHEMA_SQL):
            conn.execute(stmt)
        conn.execute(f"PRAGMA user_version = {sql.SCHEMA_VERSION}")
        conn.execute("COMMIT")
        return
    # foreign keys off around migrations (SQLite's recipe for making a table
    # again: schema 10), checked before each commits
    conn.execute("PRAGMA foreign_keys = OFF")
    try:
        for target, name in sql.MIGRATIONS:
            if target <= version:
                continue
            conn.execute("BEGIN IMMEDIATE")
            try:
                for stmt in statements(sql.migration(name)):
                    conn.execute(stmt)
                step = sql.MIGRATION_STEPS.get(target)
                if step is not None:
                    step(conn.execute, "?")
                if (bad := conn.execute("PRAGMA foreign_key_check").fetchone()) is not None:
                    raise StoreError(f"{path}: schema {target} broke a reference: {tuple(bad)}")
                conn.execute(f"PRAGMA user_version = {target}")
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise
            log.info("migrated %s to schema version %d", path, target)
    finally:
        conn.execute("PRAGMA foreign_keys = ON")


def statements(script: str) -> list[str]:
    """Split a schema script into statements (triggers keep their inner `;`)."""
    out, buf = [], []
    for line in script.splitlines():
        if line.strip().startswith("--") and not buf:
            continue
        buf.append(line)
        joined = "\n".join(buf)
        if sqlite3.complete_statement(joined):
            if joined.strip():
                out.append(joined.strip())
            buf = []
    if "\n".join(buf).strip():
        raise StoreError("schema script ends in an incomplete statement")
    return out


class SqliteDatabase(Database):
    """The controller's SQLite file (`path`, made private: mode 0600) with
    one writer and `readers` readers: db.Database's contract on SQLite.
    `open()` raises StoreError when the file cannot be opened, is not an rc
    database or comes from a newer rc."""

    TX = SqliteTx
    BEGIN = "BEGIN IMMEDIATE"

    async def open(self) -> SqliteDatabase:
        Path(self.path).parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        if not os.path.exists(self.path):
            # job environments live here: the file is private (SQLite gives its
            # -wal and -shm files the same mode)
            os.close(os.open(self.path, os.O_CREAT | os.O_WRONLY, 0o600))
        try:
            self._writer = await aiosqlite.connect(self.path, isolation_level=None)
            await self._on_thread(self._writer, configure)
            await self._on_thread(self._writer, migrate, self.path)
            for _ in range(self.n_readers):
                r = await aiosqlite.connect(self.path, isolation_level=None)
                await self._on_thread(r, configure)
                await r.execute("PRAGMA query_only = ON")
                self._readers.append(r)
        except sqlite3.Error as e:
            await self.close()
            raise StoreError(f"cannot open database {self.path}: {e}") from None
        except StoreError:
            await self.close()
            raise
        self._start_writer()
        return self

    @staticmethod
    async def _on_thread(conn: aiosqlite.Connection, fn: Callable, *args: Any) -> Any:
        # aiosqlite's dispatch: run fn on the connection's own thread, one hop.
        return await conn._execute(fn, conn._conn, *args)
