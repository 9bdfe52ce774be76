"""The SQLite database: one writer with group commit, a few readers.

Every state change is a *transaction function* `fn(tx, *args)` written against
`Tx` (named queries from queries.sql). `Database.write(fn, ...)` queues it for
the single writer, which runs a batch of queued functions inside one
`BEGIN IMMEDIATE ... COMMIT` with `synchronous=FULL`: every function gets its
own SAVEPOINT (one that raises is rolled back alone and its caller gets the
exception), and the batch costs one fsync. Nothing is acknowledged before the
commit that holds it is durable.

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

import asyncio
import importlib.resources
import logging
import os
import re
import sqlite3
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiosqlite
import orjson

from rc.controller.errors import GuardFailed, NotLeader, StoreError
from rc.controller.planning import aged_priority
from rc.controller.planning.fairshare import decayed
from rc.controller.store.principals import owners_by_uid
from rc.proto.model import Condition, JobState

__all__ = [
    "DESCRIPTIONS",
    "QUERIES",
    "SCHEMA_VERSION",
    "Database",
    "Tx",
    "dumps",
    "load_queries",
    "loads",
    "parse_queries",
]

log = logging.getLogger("rc.store")

BATCH_MAX = 256
"""Most transaction functions one commit carries."""

BUSY_TIMEOUT_MS = 5000


def parse_queries(text: str) -> dict[str, tuple[str, str]]:
    """Split a .sql file on `-- name: NAME` headers into {name: (description,
    statement)}: the description is the `--` comment lines right under the
    header, joined into one line ('' when there are none); the statement is
    the rest. Raises ValueError for a name defined twice."""
    out: dict[str, tuple[str, str]] = {}
    name = None
    buf: list[str] = []

    def close() -> None:
        doc = []
        while buf and buf[0].lstrip().startswith("--"):
            doc.append(buf.pop(0).lstrip()[2:].strip())
        out[name] = (" ".join(doc), "\n".join(buf).strip())

    for line in text.splitlines():
        m = re.match(r"--\s*name:\s*([a-z0-9_]+)\s*$", line)
        if m:
            if name:
                close()
            name, buf = m.group(1), []
            if name in out:
                raise ValueError(f"query {name} defined twice")
        elif name is not None:
            buf.append(line)
    if name:
        close()
    return out


def load_queries(text: str) -> dict[str, str]:
    """{name: statement} of a .sql file (parse_queries without descriptions)."""
    return {name: sql for name, (_doc, sql) in parse_queries(text).items()}


def _resource(package: str, name: str) -> str:
    return importlib.resources.files(package).joinpath(name).read_text(encoding="utf-8")


_PARSED = parse_queries(_resource("rc.controller.store", "queries.sql"))
QUERIES: dict[str, str] = {name: sql for name, (_doc, sql) in _PARSED.items()}
"""Every named query of queries.sql: name → statement."""
DESCRIPTIONS: dict[str, str] = {name: doc for name, (doc, _sql) in _PARSED.items()}
"""Every named query's description: name → text (one line, or a few joined)."""
WRITES: frozenset[str] = frozenset(
    name for name, sql in QUERIES.items() if sql.split(None, 1)[0].upper() != "SELECT"
)
"""The named queries that are not a plain SELECT (INSERT, UPDATE, DELETE, and WITH,
which could be either): any of them run counts as a write (Tx.wrote)."""
SCHEMA_SQL: str = _resource("rc", "store.sql")

# Ordered migrations: (version, file) under rc/controller/store/migrations/. Version 1
# is the first store.sql (kept as tests/data/schema_v1.sql); a later version
# appends its file here and edits store.sql to match (tests/test_schema.py
# proves the two paths agree).
MIGRATIONS: list[tuple[int, str]] = [
    (2, "0002_gang.sql"),  # jobs on several devices of one host; device_links
    (3, "0003_unix_users.sql"),  # tokens, jobs and workers name Unix users
    (4, "0004_lifecycle.sql"),  # a job's name; job arrays; dependencies
    (5, "0005_usage.sql"),  # sessions per hold; fair-share weights
    (6, "0006_hold_idle.sql"),  # a hold's idle rule; its warning and reclaim events
    (7, "0007_requeue.sql"),  # requeue after a hardware failure; job_requeued
    (8, "0008_leadership.sql"),  # the leadership lease of standby controllers (PG only)
    (9, "0009_queue_ask.sql"),  # the queue indexed by ask (positions) and by submitter
    (10, "0010_principals.sql"),  # owners are principals; keys unique per owner
    (11, "0011_spec_bytes.sql"),  # a job's spec bytes, for the per-user budget of them
]
SCHEMA_VERSION = 1 + len(MIGRATIONS)
MIGRATION_STEPS: dict[int, Callable[..., Any]] = {10: owners_by_uid}
"""Python run after a migration's SQL, in its transaction (version →
fn(execute, mark)): what SQL cannot do (schema 10 asks the password database)."""


class Tx:
    """A transaction in progress, handed to transaction functions.

    `now` is the batch's clock reading (seconds since the epoch): a function
    reads the clock once, through it. `notify(key)` records a change to
    announce once the transaction has committed (worker pokes, job watchers).
    `wrote` becomes True when a statement may have changed rows: one of
    exec, change or many that reports rows changed (or cannot say), or a
    query that is not a SELECT run by one, all, scalar or iter (an INSERT
    ... RETURNING: sqlite3 counts its rows only once it is stepped to its end).
    """

    __slots__ = ("conn", "notes", "now", "schedule", "wrote")

    def __init__(self, conn: sqlite3.Connection, now: float) -> None:
        self.conn = conn
        self.now = now
        self.notes: set[str] = set()
        self.schedule = False
        self.wrote = False

    def notify(self, *keys: str) -> None:
        """Announce these keys after commit (see rc.controller.hub)."""
        self.notes.update(keys)

    def one(self, name: str, params: Any = ()) -> sqlite3.Row | None:
        """First row of a named query, or None."""
        self.wrote = self.wrote or name in WRITES
        return self.conn.execute(QUERIES[name], params).fetchone()

    def all(self, name: str, params: Any = ()) -> list[sqlite3.Row]:
        """All rows of a named query."""
        self.wrote = self.wrote or name in WRITES
        return self.conn.execute(QUERIES[name], params).fetchall()

    def scalar(self, name: str, params: Any = ()) -> Any:
        """First column of the first row, or None."""
        self.wrote = self.wrote or name in WRITES
        row = self.conn.execute(QUERIES[name], params).fetchone()
        return None if row is None else row[0]

    def iter(self, name: str, params: Any = ()) -> sqlite3.Cursor:
        """A cursor over a named query's rows, fetched as they are iterated."""
        self.wrote = self.wrote or name in WRITES
        return self.conn.execute(QUERIES[name], params)

    def exec(self, name: str, params: Any = ()) -> int:
        """Run a named statement; returns the number of rows changed.

        For a statement whose count is the answer (`if tx.exec(...) == 0`)
        or that changes any number of rows by design; a write that must
        change exactly one row is a `change`.
        """
        n = self.conn.execute(QUERIES[name], params).rowcount
        self.wrote = self.wrote or n != 0
        return n

    def change(self, name: str, params: Any = ()) -> None:
        """Run a named statement that must change exactly one row: a guarded
        transition (`UPDATE jobs SET state = 'assigned' WHERE id = ? AND
        state = 'queued'`), or an insert, upsert or delete of one row.

        Raises GuardFailed, naming the query, when it changed none or more
        than one (the transaction function's savepoint is then rolled back).
        """
        n = self.conn.execute(QUERIES[name], params).rowcount
        self.wrote = self.wrote or n != 0
        if n != 1:
            raise GuardFailed(f"query {name} changed {n} rows; it must change exactly one")

    def many(self, name: str, rows: Iterable[Any]) -> int:
        """Run a named statement once per parameter set; returns rows changed."""
        n = self.conn.executemany(QUERIES[name], rows).rowcount
        self.wrote = self.wrote or n != 0
        return n


@dataclass(slots=True)
class _Op:
    fn: Callable[..., Any]
    args: tuple
    future: asyncio.Future
    result: Any = None
    error: BaseException | None = None
    notes: set[str] = field(default_factory=set)
    soft: bool = False
    changed: bool = True
    """Whether fn may have changed rows (False only when its Tx kept
    `wrote` and it stayed False)."""


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
jobs takes 0.8 ms instead of 11. tests/test_queue_position.py holds it
equal to the plan.
"""


def add_functions(conn: sqlite3.Connection) -> None:
    """Register SQL_FUNCTIONS on a connection (every connection the store opens)."""
    for name, (n_args, fn) in SQL_FUNCTIONS.items():
        conn.create_function(name, n_args, fn, deterministic=True)


def _configure(conn: sqlite3.Connection) -> None:
    conn.row_factory = sqlite3.Row
    add_functions(conn)
    conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
    conn.execute("PRAGMA foreign_keys = ON")
    conn.execute("PRAGMA synchronous = FULL")


def _migrate(conn: sqlite3.Connection, path: str) -> None:
    """Create or upgrade the schema; refuse a database from a newer rc."""
    mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
    if mode.lower() != "wal":
        raise StoreError(f"{path}: could not switch the database to WAL mode (got {mode})")
    version = conn.execute("PRAGMA user_version").fetchone()[0]
    if version > SCHEMA_VERSION:
        raise StoreError(
            f"{path} was written by a newer rc (schema version {version}; this rc knows "
            f"versions up to {SCHEMA_VERSION}). Upgrade rc, or point --data elsewhere."
        )
    if version == 0:
        tables = conn.execute("SELECT count(*) FROM sqlite_master WHERE type='table'").fetchone()[0]
        if tables:
            raise StoreError(f"{path} is not an rc database (it has tables but no schema version)")
        conn.execute("BEGIN IMMEDIATE")
        for stmt in _statements(SCHEMA_SQL):
            conn.execute(stmt)
        conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        conn.execute("COMMIT")
        return
    # foreign keys off around migrations (SQLite's recipe for making a table
    # again: schema 10), checked before each commits
    conn.execute("PRAGMA foreign_keys = OFF")
    try:
        for target, name in MIGRATIONS:
            if target <= version:
                continue
            conn.execute("BEGIN IMMEDIATE")
            try:
                for stmt in _statements(_resource("rc.controller.store.migrations", name)):
                    conn.execute(stmt)
                step = MIGRATION_STEPS.get(target)
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


def _statements(script: str) -> list[str]:
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


def _run_batch(
    conn: Any,
    ops: list[_Op],
    now: float,
    after: Callable | None,
    tx_class: type[Tx] = Tx,
    begin: str = "BEGIN IMMEDIATE",
    check: Callable[[Any], None] | None = None,
):
    """Run queued transaction functions in one transaction (on the writer
    thread). `conn` is a sqlite3 connection, or anything with its `execute`
    and `in_transaction` (rc.controller.store.pg); `tx_class` wraps it for
    the functions, `begin` opens the transaction. `check(conn)`, when given,
    runs first inside it: when it raises, the whole batch is rolled back and
    the error raised (the leadership fence, rc.controller.store.leader).

    Returns (the scheduling pass's notes, whether the pass may have changed
    rows) and sets each op's `changed` (Tx.wrote; always True with an
    engine's own Tx class, PostgreSQL's, which does not keep it)."""
    counted = tx_class is Tx  # an engine's own Tx (PostgreSQL's) does not keep `wrote`
    conn.execute(begin)
    try:
        if check is not None:
            check(conn)
        schedule = False
        for op in ops:
            tx = tx_class(conn, now)
            conn.execute("SAVEPOINT op")
            try:
                op.result = op.fn(tx, *op.args)
                op.changed = not counted or tx.wrote
                conn.execute("RELEASE op")
                op.notes = tx.notes
                schedule = schedule or tx.schedule
            except BaseException as e:  # noqa: BLE001 - handed back to the caller
                conn.execute("ROLLBACK TO op")
                conn.execute("RELEASE op")
                op.error = e
        extra: set[str] = set()
        pass_changed = False
        if schedule and after is not None:
            tx = tx_class(conn, now)
            conn.execute("SAVEPOINT after")
            try:
                after(tx)
                pass_changed = not counted or tx.wrote
                conn.execute("RELEASE after")
                extra = tx.notes
            except Exception:  # a failed pass must not undo the batch's writes
                conn.execute("ROLLBACK TO after")
                conn.execute("RELEASE after")
                log.exception("scheduling pass failed; the next pass retries")
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    return extra, pass_changed


def _run_read(conn: sqlite3.Connection, fn: Callable, args: tuple, now: float):
    conn.execute("BEGIN")
    try:
        return fn(Tx(conn, now), *args)
    finally:
        conn.execute("COMMIT")


class Database:
    """The controller's SQLite file with one writer and `readers` readers.

    `clock()` returns wall time in seconds; each write batch reads it once.
    `on_commit(notes)` is called on the event loop with the keys transaction
    functions announced, after their commit. `after_batch(tx)` runs at the end
    of any batch in which a function set `tx.schedule` (the scheduling pass).
    Raises StoreError when the file cannot be opened, is not an rc database or
    comes from a newer rc.
    """

    TX: type[Tx] = Tx
    """The Tx class transaction functions get (an engine's own subclass)."""
    BEGIN = "BEGIN IMMEDIATE"
    """The statement that opens a write batch."""

    def __init__(self, path: str, clock: Callable[[], float], readers: int = 2) -> None:
        self.path = path
        self.clock = clock
        self.n_readers = readers
        self.on_commit: Callable[[set[str]], None] = lambda notes: None
        self.on_rollback: Callable[[], None] = lambda: None
        """Called (between batches) when a transaction function was rolled
        back or a commit failed: in-memory caches filled inside the batch may
        hold rolled-back state."""
        self.after_batch: Callable[[Tx], None] | None = None
        self._writer: aiosqlite.Connection | None = None
        self._readers: list[aiosqlite.Connection] = []
        self._next_reader = 0
        self._queue: asyncio.Queue[_Op] | None = None
        self._task: asyncio.Task | None = None
        self.check: Callable[[Any], None] | None = None
        """Run first inside every write batch (see _run_batch); None on SQLite."""
        self.on_fenced: Callable[[NotLeader], None] = lambda e: None
        """Called (on the event loop) when a batch failed with NotLeader."""
        self.generation = 0
        """Write generation: goes up by one (on the event loop, before any
        caller of the batch resumes) when a write batch has ended that may
        have changed rows other than by functions queued with `write_soft`,
        or that failed. A batch that changed no rows (Tx.wrote stayed False
        for each function and for the pass; on PostgreSQL every batch counts
        as changing) leaves it alone, as does one of soft functions only. So an answer read while it was g, and
        found again while it is still g, is still what the database holds
        (every change goes through this Database: one controller owns the
        store)."""

    async def open(self) -> Database:
        Path(self.path).parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        if not os.path.exists(self.path):
            # job environments live here: the file is private (SQLite gives its
            # -wal and -shm files the same mode)
            os.close(os.open(self.path, os.O_CREAT | os.O_WRONLY, 0o600))
        try:
            self._writer = await aiosqlite.connect(self.path, isolation_level=None)
            await self._on_thread(self._writer, _configure)
            await self._on_thread(self._writer, _migrate, self.path)
            for _ in range(self.n_readers):
                r = await aiosqlite.connect(self.path, isolation_level=None)
                await self._on_thread(r, _configure)
                await r.execute("PRAGMA query_only = ON")
                self._readers.append(r)
        except sqlite3.Error as e:
            await self.close()
            raise StoreError(f"cannot open database {self.path}: {e}") from None
        except StoreError:
            await self.close()
            raise
        self._queue = asyncio.Queue()
        self._task = asyncio.create_task(self._write_loop(), name="rc-db-writer")
        return self

    async def close(self) -> None:
        """Finish queued writes, then close every connection."""
        if self._task is not None:
            await self._queue.put(None)  # type: ignore[arg-type]
            await self._task
            self._task = None
        for c in [self._writer, *self._readers]:
            if c is not None:
                await self._close_connection(c)
        self._writer, self._readers = None, []

    @staticmethod
    async def _close_connection(conn) -> None:
        """Close one of this database's connections (an engine's own way)."""
        await conn.close()

    @staticmethod
    async def _on_thread(conn: aiosqlite.Connection, fn: Callable, *args: Any) -> Any:
        # aiosqlite's dispatch: run fn on the connection's own thread, one hop.
        return await conn._execute(fn, conn._conn, *args)

    async def write(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run `fn(tx, *args)` in the next durable write batch and return its result.

        Raises whatever fn raised (its savepoint rolled back, the rest of the
        batch unaffected), or StoreError if the commit itself failed.
        """
        if self._queue is None:
            raise StoreError("the database is closed")
        fut = asyncio.get_running_loop().create_future()
        self._queue.put_nowait(_Op(fn, args, fut))
        return await fut

    async def write_soft(self, fn: Callable[..., Any], *args: Any) -> Any:
        """`write`, for a function that changes soft state only (heartbeat
        timestamps and lease renewals: store.workers.touch_beats): a batch
        of such functions alone leaves `generation` as it was, so answers
        cached against it (Controller.heartbeat) stay valid. Durable as `write`."""
        if self._queue is None:
            raise StoreError("the database is closed")
        fut = asyncio.get_running_loop().create_future()
        self._queue.put_nowait(_Op(fn, args, fut, soft=True))
        return await fut

    async def read(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run `fn(tx, *args)` in a read transaction (a consistent snapshot)."""
        conn = self._readers[self._next_reader % len(self._readers)]
        self._next_reader += 1
        return await self._on_thread(conn, _run_read, fn, args, self.clock())

    async def _write_loop(self) -> None:
        assert self._queue is not None and self._writer is not None
        stopping = False
        while not stopping:
            first = await self._queue.get()
            if first is None:
                break
            ops = [first]
            while len(ops) < BATCH_MAX and not self._queue.empty():
                op = self._queue.get_nowait()
                if op is None:
                    stopping = True
                    break
                ops.append(op)
            await self._commit(ops)

    def _failure(self, e: Exception) -> Exception:
        """What a failed write batch's callers get instead of `e` when it is a
        StoreError (the PostgreSQL engine's NotLeader after a broken
        connection); anything else becomes StoreError. Here: `e`."""
        return e

    async def _commit(self, ops: list[_Op]) -> None:
        changed = True  # unless the batch ran and says otherwise
        try:
            changed = await self._commit_ops(ops)
        finally:
            # before any caller resumes: the futures' callbacks run after this
            if changed:
                self.generation += 1

    async def _commit_ops(self, ops: list[_Op]) -> bool:
        """Run and commit one batch, answer its callers; whether it may have
        changed anything but soft state (see `generation`)."""
        try:
            extra, pass_changed = await self._on_thread(
                self._writer,
                _run_batch,
                ops,
                self.clock(),
                self.after_batch,
                self.TX,
                self.BEGIN,
                self.check,
            )
        except NotLeader as e:  # fenced: nothing in the batch happened
            log.error("write batch of %d fenced: %s", len(ops), e)
            self.on_rollback()
            for op in ops:
                if not op.future.done():
                    op.future.set_exception(e)
            self.on_fenced(e)
            return True
        except Exception as e:  # noqa: BLE001 - the commit failed: nothing in the batch happened
            log.error("write batch of %d failed: %s", len(ops), e)
            self.on_rollback()
            err = self._failure(e)
            if not isinstance(err, StoreError):
                err = StoreError(f"database write failed: {e}")
            for op in ops:
                if not op.future.done():
                    op.future.set_exception(err)
            return True
        notes: set[str] = set(extra)
        for op in ops:
            if op.error is None:
                notes |= op.notes
        if any(op.error is not None for op in ops):
            self.on_rollback()
        if notes:
            try:
                self.on_commit(notes)
            except Exception:
                log.exception("on_commit hook failed")
        for op in ops:
            if op.future.done():
                continue
            if op.error is not None:
                op.future.set_exception(op.error)
            else:
                op.future.set_result(op.result)
        return pass_changed or any(op.changed and not op.soft for op in ops)


def dumps(obj: Any) -> str:
    """JSON text for a column (compact, stable key order)."""
    return orjson.dumps(obj, option=orjson.OPT_SORT_KEYS).decode()


def loads(text: str) -> Any:
    """Decode a JSON column."""
    return orjson.loads(text)
