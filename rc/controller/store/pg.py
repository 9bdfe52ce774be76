"""The PostgreSQL engine: the same store contract as the SQLite one
(rc.controller.store.db.Database, rc.controller.store.sqlite).

`PgDatabase(dsn, clock)` has Database's API (open, close, write, read,
on_commit, on_rollback, after_batch) and runs the same transaction functions
`fn(tx, *args)` with the same group commit: one writer connection runs a
batch of queued functions in one transaction, each in its own SAVEPOINT, and
acknowledges none before the COMMIT (synchronous_commit on: durable on the
server) holding it; reads run on reader connections in a REPEATABLE READ,
READ ONLY snapshot.

Why psycopg 3, a *synchronous* connection driven on a thread of its own
(one single-thread executor per connection), and not asyncpg or psycopg's
async connection: the store's rule is that a transaction function runs whole,
with nothing awaited inside it, so a batch is one hop to the connection's
thread, as with SQLite (rc.controller.store.sqlite explains the measured cost
of one hop per statement). With an async driver every statement of a function
would be an `await`, every function would have to become a coroutine, and
two engines would need two sets of transaction functions. A sync connection
on its own thread keeps one set of functions for both engines.

The SQL (rc.controller.store.sql loads it): rc/store.pg.sql is the schema
(with effective_priority, dep_met and decayed_seconds, the functions SQLite
gets from Python, as SQL functions). Every named query
of sql/queries.sql runs on PostgreSQL as it is, with its placeholders translated
mechanically (`translate`): `?` → `%s`, `?N` → `%(pN)s` (the parameter
sequence becomes a mapping), `:name` → `%(name)s`, `%` → `%%`. A query whose
SQL differs between the dialects (json_each, GLOB, INSERT OR IGNORE, scalar
max...) is written again under the same name in queries.pg.sql, with the
same parameters in the same placeholder style: that file (sql/queries.pg.sql)
holds only such overrides. A column named by a PostgreSQL reserved word (share_weights."user")
is quoted there: unquoted, `user` prepares and means the session's role.
tests/store/test_schema_pg.py prepares every resulting query against the PG
schema, so a query that does not port fails there, by name.

How to port (for whoever adds a query or a migration):

- A new named query: add it to sql/queries.sql as usual. Run
  `python -m pytest -q tests/store/test_schema_pg.py`; if
  test_every_query_prepares_on_postgresql names it, copy it into
  queries.pg.sql under the same `-- name:` and rewrite only the dialect.
- A new function SQLite gets from Python (sqlite.SQL_FUNCTIONS): the same in SQL
  in rc/store.pg.sql and in the PG migration that first needs it, checked
  against its Python definition in tests/store/test_schema_pg.py.
- A changed query that has an override: change the override too
  (test_every_override_takes_the_parameters_of_its_query catches a new
  parameter, not a new result column).
- A schema change: migration sql/migrations/NNNN_x.sql for SQLite as
  usual, and the same change in PostgreSQL's dialect as
  sql/migrations/pg/NNNN_x.sql appended to sql.PG_MIGRATIONS (the same
  version number; a Python step in sql.MIGRATION_STEPS runs on both), and
  rc/store.pg.sql edited to match; tests/store/test_schema_pg.py checks fresh = oldest PG schema +
  migrations and that both schema files have the same tables, columns and
  CHECK lists. The PG line starts at version sql.PG_BASELINE (the first
  schema PostgreSQL had); the version is kept in the rc_schema table.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, ClassVar

from rc.controller.errors import GuardFailed, NotLeader, StoreError
from rc.controller.store import db, sql

__all__ = [
    "LEADER_QUERIES",
    "PG_OVERRIDES",
    "PG_QUERIES",
    "PgDatabase",
    "PgTx",
    "Row",
    "fence",
    "is_postgres_url",
    "translate",
]

log = logging.getLogger("rc.store")

CONNECT_TIMEOUT_S = 10
"""How long opening one connection may take before StoreError."""


def is_postgres_url(text: str) -> bool:
    """Whether a --database value names a PostgreSQL database."""
    return text.startswith(("postgresql://", "postgres://"))


_TOKEN = re.compile(r"'(?:[^']|'')*'|\"[^\"]*\"|--[^\n]*|\?(\d*)|(?<!:):([a-z_][a-z0-9_]*)|%")


def translate(sql: str) -> tuple[str, bool]:
    """SQLite placeholders → psycopg's: returns (statement, numbered).

    `?` → `%s`; `?N` → `%(pN)s` (numbered is then True: the caller's
    parameter sequence must become {"p1": ..., ...}); `:name` → `%(name)s`
    (a `::type` cast is left alone); `%` → `%%` everywhere (psycopg reads
    placeholders inside string literals too). String literals, quoted names
    and `--` comments are otherwise copied as they are. Raises ValueError for
    a statement mixing `?` and `?N` (SQLite's numbering rule for that is not
    worth reproducing).
    """
    kinds: set[str] = set()

    def sub(m: re.Match) -> str:
        text = m.group(0)
        if text == "%":
            return "%%"
        if text.startswith(("'", '"', "--")):
            return text.replace("%", "%%")
        if text.startswith("?"):
            if m.group(1):
                kinds.add("numbered")
                return f"%(p{m.group(1)})s"
            kinds.add("plain")
            return "%s"
        kinds.add("named")
        return f"%({m.group(2)})s"

    out = _TOKEN.sub(sub, sql)
    if len(kinds) > 1:
        raise ValueError(f"statement mixes placeholder styles {sorted(kinds)}: {sql[:80]}")
    return out, "numbered" in kinds


def _load() -> tuple[dict[str, tuple[str, bool]], set[str]]:
    overrides = sql.PG_OVERRIDES
    unknown = set(overrides) - set(sql.QUERIES)
    if unknown:
        raise ValueError(f"queries.pg.sql overrides queries queries.sql lacks: {sorted(unknown)}")
    return {
        name: translate(overrides.get(name, statement)) for name, statement in sql.QUERIES.items()
    }, set(overrides)


PG_QUERIES, PG_OVERRIDES = _load()
"""PG_QUERIES: name → (psycopg statement, numbered) for every named query;
PG_OVERRIDES: the names queries.pg.sql writes again."""


def _params(params: Any, numbered: bool) -> Any:
    if numbered:
        return {f"p{i}": v for i, v in enumerate(params, 1)}
    return params


class Row(tuple):
    """A result row like sqlite3.Row: by position (`r[0]`), by column name
    (`r["id"]`), `keys()`, and a tuple of its values (`tuple(r)`)."""

    __slots__ = ()
    _names: ClassVar[dict[str, int]] = {}

    def __getitem__(self, key: Any) -> Any:
        if isinstance(key, str):
            return tuple.__getitem__(self, self._names[key])
        return tuple.__getitem__(self, key)

    def keys(self) -> list[str]:
        return list(self._names)


def _row_factory(cursor: Any) -> Callable[[Any], Row]:
    desc = cursor.description
    if desc is None:
        return tuple
    cls = type("Row", (Row,), {"__slots__": (), "_names": {c.name: i for i, c in enumerate(desc)}})
    return cls


class _Conn:
    """One psycopg connection (autocommit: the store's BEGIN/COMMIT are
    explicit, as on SQLite) and the one thread that uses it."""

    def __init__(self, raw: Any) -> None:
        self.raw = raw
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rc-pg")

    def execute(self, sql: str, params: Any = None) -> Any:
        return self.raw.execute(sql, params)

    @property
    def in_transaction(self) -> bool:
        import psycopg.pq

        return self.raw.info.transaction_status != psycopg.pq.TransactionStatus.IDLE

    def close(self) -> None:
        try:
            self.raw.close()
        finally:
            self.executor.shutdown(wait=True)


class PgTx(db.Tx):
    """db.Tx on PostgreSQL: the same methods, running PG_QUERIES (it does
    not keep `wrote`: every function counts as having written)."""

    __slots__ = ()

    def _run(self, name: str, params: Any) -> Any:
        sql, numbered = PG_QUERIES[name]
        return self.conn.execute(sql, _params(params, numbered))

    def one(self, name: str, params: Any = ()) -> Row | None:
        return self._run(name, params).fetchone()

    def all(self, name: str, params: Any = ()) -> list[Row]:
        return self._run(name, params).fetchall()

    def scalar(self, name: str, params: Any = ()) -> Any:
        row = self._run(name, params).fetchone()
        return None if row is None else row[0]

    def iter(self, name: str, params: Any = ()) -> Any:
        return iter(self._run(name, params))

    def exec(self, name: str, params: Any = ()) -> int:
        return self._run(name, params).rowcount

    def change(self, name: str, params: Any = ()) -> None:
        n = self._run(name, params).rowcount
        if n != 1:
            raise GuardFailed(f"query {name} changed {n} rows; it must change exactly one")

    def many(self, name: str, rows: Iterable[Any]) -> int:
        sql, numbered = PG_QUERIES[name]
        with self.conn.raw.cursor() as cur:
            cur.executemany(sql, [_params(r, numbered) for r in rows])
            return cur.rowcount


def pg_statements(script: str) -> list[str]:
    """Split a PG schema script on `;` at line ends, keeping `$$ ... $$`
    bodies whole; `--` comment lines between statements are dropped."""
    out, buf, in_body = [], [], False
    for line in script.splitlines():
        if not buf and (not line.strip() or line.strip().startswith("--")):
            continue
        buf.append(line)
        if line.count("$$") % 2:
            in_body = not in_body
        if not in_body and line.rstrip().endswith(";"):
            out.append("\n".join(buf).strip())
            buf = []
    if "\n".join(buf).strip():
        raise StoreError("schema script ends in an incomplete statement")
    return out


def migrate(conn: _Conn, where: str) -> None:
    """Create or upgrade the PG schema; refuse a database from a newer rc or
    one with tables that is not an rc database. `where` names it in errors."""
    conn.execute("BEGIN")
    try:
        conn.execute("SELECT pg_advisory_xact_lock(727)")  # two first opens take turns
        has = conn.execute("SELECT to_regclass('rc_schema') IS NOT NULL").fetchone()[0]
        if not has:
            n = conn.execute(
                "SELECT count(*) FROM pg_tables WHERE schemaname = current_schema()"
            ).fetchone()[0]
            if n:
                raise StoreError(f"{where} is not an rc database (it has tables but no rc_schema)")
            for stmt in pg_statements(sql.PG_SCHEMA_SQL):
                conn.execute(stmt)
            conn.execute("INSERT INTO rc_schema (version) VALUES (%s)", (sql.PG_SCHEMA_VERSION,))
            conn.execute("COMMIT")
            return
        version = conn.execute("SELECT version FROM rc_schema").fetchone()[0]
        if version > sql.PG_SCHEMA_VERSION:
            raise StoreError(
                f"{where} was written by a newer rc (schema version {version}; this rc knows "
                f"versions up to {sql.PG_SCHEMA_VERSION}). Upgrade rc."
            )
        for target, name in sql.PG_MIGRATIONS:
            if target <= version:
                continue
            for stmt in pg_statements(sql.pg_migration(name)):
                conn.execute(stmt)
            step = sql.MIGRATION_STEPS.get(target)
            if step is not None:
                step(conn.execute, "%s")
            conn.execute("UPDATE rc_schema SET version = %s", (target,))
            log.info("migrated %s to schema version %d", where, target)
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise


LEADER_QUERIES: dict[str, str] = sql.LEADER_SQL
"""name → statement (psycopg placeholders) of sql/leader.pg.sql: the
leadership lease of standby controllers (rc.controller.store.leader)."""
WRITER_IDLE_TIMEOUT_MS = 5000
"""A fenced write transaction's session is ended by the server when it sits
idle inside the transaction this long (idle_in_transaction_session_timeout,
set by the fence for that transaction only):
a controller paused in the middle of a write batch holds the lease row's share
lock, which would keep a takeover waiting for as long as it is paused."""


def fence(conn: _Conn, lease: Any) -> None:
    """Inside a write transaction on `conn`: raise NotLeader unless `lease`
    (rc.controller.store.leader.Lease: holder, epoch) still holds a live
    leadership lease; the row stays locked FOR KEY SHARE until the
    transaction ends, so a takeover (FOR UPDATE) waits for it and a renewal
    does not."""
    params = {"holder": lease.holder, "epoch": lease.epoch, "idle_ms": str(WRITER_IDLE_TIMEOUT_MS)}
    row = conn.execute(LEADER_QUERIES["leader_fence"], params).fetchone()
    if row is None:
        raise NotLeader(f"this controller's lease (epoch {lease.epoch}) has passed on")


def redact(dsn: str) -> str:
    """A DSN without its password, for messages and logs."""
    return re.sub(r"(://[^:/@]*):[^@]*@", r"\1:***@", dsn)


class PgDatabase(db.Database):
    """The controller's PostgreSQL database with one writer and `readers`
    readers: db.Database's contract on PostgreSQL. `dsn` is a libpq URL
    (postgresql://user@host/dbname, a `host=` query parameter may name a
    Unix socket directory). Raises StoreError when it cannot connect (the
    message names the database without its password), when the database is
    not an rc database, or when it comes from a newer rc.

    `lease` (rc.controller.store.leader.Lease): the leadership lease this
    controller holds; every write batch is then fenced by it (NotLeader when
    it has passed on: nothing of the batch commits). None (tests, the bench):
    no fence, so nothing keeps a second writer out.
    """

    TX = PgTx
    BEGIN = "BEGIN"
    READ_BEGIN = "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY"

    def __init__(
        self, dsn: str, clock: Callable[[], float], readers: int = 2, lease: Any = None
    ) -> None:
        super().__init__(redact(dsn), clock, readers)
        self.dsn = dsn
        self.lease = None
        self._broken_told = False
        if lease is not None:
            self.fence_by(lease)

    def fence_by(self, lease: Any) -> None:
        """Fence every write batch from now on by `lease` (before open)."""
        self.lease = lease
        self.check = lambda conn: fence(conn, lease)

    def _connect(self) -> _Conn:
        import psycopg

        raw = psycopg.connect(
            self.dsn, autocommit=True, connect_timeout=CONNECT_TIMEOUT_S, row_factory=_row_factory
        )
        return _Conn(raw)

    async def open(self) -> PgDatabase:
        loop = asyncio.get_running_loop()
        try:
            import psycopg
        except ImportError:
            raise StoreError(
                "PostgreSQL needs psycopg: pip install 'rc[postgres]' (or -e '.[postgres]')"
            ) from None
        try:
            self._writer = await loop.run_in_executor(None, self._connect)
            await self._on_thread(self._writer, migrate, self.path)
            for _ in range(self.n_readers):
                self._readers.append(await loop.run_in_executor(None, self._connect))
        except psycopg.Error as e:
            await self.close()
            msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise StoreError(f"cannot open database {self.path}: {msg}") from None
        except StoreError:
            await self.close()
            raise
        self._start_writer()
        return self

    @staticmethod
    async def _close_connection(conn) -> None:
        """Close a connection on a thread (psycopg's close blocks)."""
        await asyncio.get_running_loop().run_in_executor(None, conn.close)

    @staticmethod
    async def _on_thread(conn: _Conn, fn: Callable, *args: Any) -> Any:  # type: ignore[override]
        return await asyncio.get_running_loop().run_in_executor(conn.executor, fn, conn, *args)

    async def read(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run `fn(tx, *args)` in a read transaction (a consistent snapshot)."""
        try:
            return await super().read(fn, *args)
        except Exception as e:
            err = self._failure(e)
            if err is e:
                raise
            raise err from None
        finally:
            self._check_connections()

    def _failure(self, e: Exception) -> Exception:
        """What a failed read or write batch raises: NotLeader (answered 503
        `standby`, so clients retry on their list) when this is an active
        controller's database and one of its connections broke (it steps
        down for the standby); else `e` itself for a read, StoreError for
        a write batch (db.Database._failure)."""
        conns = [self._writer, *self._readers]
        if (
            self.lease is not None
            and not isinstance(e, NotLeader | GuardFailed)
            and any(c is not None and c.raw.closed for c in conns)
        ):
            first = (str(e).strip() or type(e).__name__).splitlines()[0]
            return NotLeader(f"a connection to the database broke ({first})")
        return e

    async def _commit(self, ops: list) -> None:
        await super()._commit(ops)
        self._check_connections()

    def _check_connections(self) -> None:
        """A fenced database (an active controller's) whose connection broke
        (the server restarted, a database failover, the network): nothing
        reconnects it, so the controller must stop acting (on_fenced) for a
        standby, with connections of its own, to take over. Unfenced: the
        errors are the callers' (StoreError)."""
        if self.lease is None or self._broken_told:
            return
        if any(c is not None and c.raw.closed for c in [self._writer, *self._readers]):
            self._broken_told = True
            self.on_fenced(NotLeader("a connection to the database broke"))
