"""The engine-neutral store: the transaction contract and the one writer
with group commit, whatever the engine (rc.controller.store.sqlite, the
embedded default; rc.controller.store.pg, PostgreSQL).

Every state change is a *transaction function* `fn(tx, *args)` written against
`Tx` (named queries from rc.controller.store.sql). `Database.write(fn, ...)`
queues it for the single writer, which runs a batch of queued functions
inside one transaction: every function gets its own SAVEPOINT (one that
raises is rolled back alone and its caller gets the exception), and the
batch costs one commit (one fsync on SQLite). Nothing is acknowledged before
the commit that holds it is durable.

An engine subclasses `Database` (how a connection is opened, migrated and
driven on its own thread, `_on_thread`) and `Tx` (how a named query runs on
its connection); everything else, the batching, the savepoints, the
scheduling pass at the end of a batch, the write generation and the
callbacks, is here, once.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, ClassVar

import orjson

from rc.controller.errors import NotLeader, StoreError

__all__ = ["BATCH_MAX", "Database", "Tx", "dumps", "loads"]

log = logging.getLogger("rc.store")

BATCH_MAX = 256
"""Most transaction functions one commit carries."""


class Tx:
    """A transaction in progress, handed to transaction functions; an
    engine's subclass runs the named queries (rc.controller.store.sql) on
    its connection `conn`.

    `now` is the batch's clock reading (seconds since the epoch): a function
    reads the clock once, through it. `notify(key)` records a change to
    announce once the transaction has committed (worker pokes, job watchers).
    `schedule = True` asks for a scheduling pass at the end of the batch.
    `wrote` becomes True when a statement may have changed rows, for an
    engine that keeps it (COUNTS_WRITES; see Database.generation).
    """

    __slots__ = ("conn", "notes", "now", "schedule", "wrote")

    COUNTS_WRITES: ClassVar[bool] = False
    """Whether this engine's Tx keeps `wrote` (else every function counts
    as having written)."""

    def __init__(self, conn: Any, now: float) -> None:
        self.conn = conn
        self.now = now
        self.notes: set[str] = set()
        self.schedule = False
        self.wrote = False

    def notify(self, *keys: str) -> None:
        """Announce these keys after commit (see rc.controller.hub)."""
        self.notes.update(keys)

    def one(self, name: str, params: Any = ()) -> Any:
        """First row of a named query, or None."""
        raise NotImplementedError

    def all(self, name: str, params: Any = ()) -> list[Any]:
        """All rows of a named query."""
        raise NotImplementedError

    def scalar(self, name: str, params: Any = ()) -> Any:
        """First column of the first row, or None."""
        raise NotImplementedError

    def iter(self, name: str, params: Any = ()) -> Iterable[Any]:
        """The rows of a named query, fetched as they are iterated."""
        raise NotImplementedError

    def exec(self, name: str, params: Any = ()) -> int:
        """Run a named statement; returns the number of rows changed.

        For a statement whose count is the answer (`if tx.exec(...) == 0`)
        or that changes any number of rows by design; a write that must
        change exactly one row is a `change`.
        """
        raise NotImplementedError

    def change(self, name: str, params: Any = ()) -> None:
        """Run a named statement that must change exactly one row: a guarded
        transition (`UPDATE jobs SET state = 'assigned' WHERE id = ? AND
        state = 'queued'`), or an insert, upsert or delete of one row.

        Raises GuardFailed, naming the query, when it changed none or more
        than one (the transaction function's savepoint is then rolled back).
        """
        raise NotImplementedError

    def many(self, name: str, rows: Iterable[Any]) -> int:
        """Run a named statement once per parameter set; returns rows changed."""
        raise NotImplementedError


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


def _run_batch(
    conn: Any,
    ops: list[_Op],
    now: float,
    after: Callable | None,
    tx_class: type[Tx],
    begin: str,
    check: Callable[[Any], None] | None = None,
):
    """Run queued transaction functions in one transaction (on the writer
    thread). `conn` is the engine's connection: anything with `execute`
    and `in_transaction` (a sqlite3 connection, rc.controller.store.pg's
    wrapper); `tx_class` wraps it for the functions, `begin` opens the
    transaction. `check(conn)`, when given, runs first inside it: when it
    raises, the whole batch is rolled back and the error raised (the
    leadership fence, rc.controller.store.leader).

    Returns (the scheduling pass's notes, whether the pass may have changed
    rows) and sets each op's `changed` (Tx.wrote; always True with an
    engine's Tx that does not keep it: Tx.COUNTS_WRITES)."""
    counted = tx_class.COUNTS_WRITES
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


def _run_read(conn: Any, fn: Callable, args: tuple, now: float, tx_class: type[Tx], begin: str):
    conn.execute(begin)
    try:
        return fn(tx_class(conn, now), *args)
    finally:
        conn.execute("COMMIT")


class Database:
    """The controller's database with one writer and `readers` readers; an
    engine's subclass opens it (rc.controller.store.sqlite.SqliteDatabase,
    rc.controller.store.pg.PgDatabase). `path` names it in messages.

    `clock()` returns wall time in seconds; each write batch reads it once.
    `on_commit(notes)` is called on the event loop with the keys transaction
    functions announced, after their commit. `after_batch(tx)` runs at the end
    of any batch in which a function set `tx.schedule` (the scheduling pass).
    `open()` raises StoreError when the database cannot be opened, is not an
    rc database or comes from a newer rc.
    """

    TX: type[Tx] = Tx
    """The Tx class transaction functions get (the engine's own subclass)."""
    BEGIN = "BEGIN"
    """The statement that opens a write batch."""
    READ_BEGIN = "BEGIN"
    """The statement that opens a read transaction (one snapshot)."""

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
        self._writer: Any = None
        self._readers: list[Any] = []
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
        """Connect the writer and the readers, create or migrate the schema,
        start the writer; returns self. The engine's."""
        raise NotImplementedError

    def _start_writer(self) -> None:
        """Start the writer's loop (the end of an engine's open)."""
        self._queue = asyncio.Queue()
        self._task = asyncio.create_task(self._write_loop(), name="rc-db-writer")

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
    async def _on_thread(conn: Any, fn: Callable, *args: Any) -> Any:
        """Run `fn(raw connection, *args)` whole on the connection's own
        thread, in one hop (the engine's)."""
        raise NotImplementedError

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
        return await self._on_thread(
            conn, _run_read, fn, args, self.clock(), self.TX, self.READ_BEGIN
        )

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
