"""The store's SQL, loaded once: the schema, the named queries and the
migrations of both engines. Nothing here talks to a database.

- The schema: rc/store.sql (SQLite), rc/store.pg.sql beside it (the same
  schema for PostgreSQL): SCHEMA_SQL, PG_SCHEMA_SQL.
- The named queries: queries.sql here, each under a `-- name: NAME` header
  with its description on the `--` lines right under it (QUERIES,
  DESCRIPTIONS); queries.pg.sql, only the queries whose SQL differs on
  PostgreSQL, under the same names (PG_OVERRIDES; rc.controller.store.pg
  says how to port one); leader.pg.sql, the leadership lease's
  (LEADER_SQL, PostgreSQL only: rc.controller.store.leader).
- The migrations: migrations/NNNN_x.sql for SQLite (MIGRATIONS, numbered by
  `PRAGMA user_version`), migrations/pg/NNNN_x.sql for PostgreSQL under the
  same numbers from PG_BASELINE on (PG_MIGRATIONS, numbered in the
  rc_schema table), and the Python steps both run after a migration's SQL
  (MIGRATION_STEPS). A new version appends its file to both lists and edits
  both schema files to match (tests/store/test_schema.py and
  tests/store/test_schema_pg.py prove the two paths agree).
"""

from __future__ import annotations

import importlib.resources
import re
from collections.abc import Callable
from typing import Any

from rc.controller.store.principals import owners_by_uid

__all__ = [
    "DESCRIPTIONS",
    "LEADER_SQL",
    "MIGRATIONS",
    "MIGRATION_STEPS",
    "PG_BASELINE",
    "PG_MIGRATIONS",
    "PG_OVERRIDES",
    "PG_SCHEMA_SQL",
    "PG_SCHEMA_VERSION",
    "QUERIES",
    "SCHEMA_SQL",
    "SCHEMA_VERSION",
    "WRITES",
    "load_queries",
    "migration",
    "parse_queries",
    "pg_migration",
]


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


def _read(package: str, *path: str) -> str:
    return importlib.resources.files(package).joinpath(*path).read_text(encoding="utf-8")


def migration(name: str) -> str:
    """The text of SQLite migration `name` (a file of MIGRATIONS)."""
    return _read(__name__, "migrations", name)


def pg_migration(name: str) -> str:
    """The text of PostgreSQL migration `name` (a file of PG_MIGRATIONS)."""
    return _read(__name__, "migrations", "pg", name)


_PARSED = parse_queries(_read(__name__, "queries.sql"))
QUERIES: dict[str, str] = {name: sql for name, (_doc, sql) in _PARSED.items()}
"""Every named query of queries.sql: name → statement."""
DESCRIPTIONS: dict[str, str] = {name: doc for name, (doc, _sql) in _PARSED.items()}
"""Every named query's description: name → text (one line, or a few joined)."""
_CHANGES = re.compile(r"\b(INSERT|UPDATE|DELETE|REPLACE)\b", re.IGNORECASE)


def _writes(sql: str) -> bool:
    """Whether a statement may change rows: anything but a SELECT, and a
    WITH whose text names INSERT, UPDATE, DELETE or REPLACE."""
    verb = sql.split(None, 1)[0].upper()
    if verb == "SELECT":
        return False
    return verb != "WITH" or _CHANGES.search(sql) is not None


WRITES: frozenset[str] = frozenset(name for name, sql in QUERIES.items() if _writes(sql))
"""The named queries that may change rows (INSERT, UPDATE, DELETE, and a WITH
that names one of them; a WITH ... SELECT is a read): any of them run counts
as a write (Tx.wrote)."""
PG_OVERRIDES: dict[str, str] = load_queries(_read(__name__, "queries.pg.sql"))
"""The queries queries.pg.sql writes again for PostgreSQL: name → statement
(in SQLite's placeholder style: rc.controller.store.pg translates them)."""
LEADER_SQL: dict[str, str] = load_queries(_read(__name__, "leader.pg.sql"))
"""name → statement (psycopg placeholders) of leader.pg.sql: the leadership
lease of standby controllers (rc.controller.store.leader)."""

SCHEMA_SQL: str = _read("rc", "store.sql")
"""The whole SQLite schema (rc/store.sql)."""
PG_SCHEMA_SQL: str = _read("rc", "store.pg.sql")
"""The whole PostgreSQL schema (rc/store.pg.sql)."""

# Ordered migrations: (version, file) under migrations/. Version 1 is the
# first store.sql (kept as tests/data/store_v1.sql); a later version appends
# its file here and edits store.sql to match.
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
    (12, "0012_queue_edits.sql"),  # stashed jobs, begin times; the feed's job_updated
    (15, "0015_retention.sql"),  # the ledger's daily rollups; leases marked rolled up
    (16, "0016_via.sql"),  # the feed's job_submitted (a submission via rc mcp)
]
SCHEMA_VERSION = MIGRATIONS[-1][0]
MIGRATION_STEPS: dict[int, Callable[..., Any]] = {10: owners_by_uid}
"""Python run after a migration's SQL, in its transaction, on both engines
(version → fn(execute, mark)): what SQL cannot do (schema 10 asks the
password database)."""

PG_BASELINE = 4
"""The schema version rc/store.pg.sql first had (SQLite's version 4)."""
PG_MIGRATIONS: list[tuple[int, str]] = [
    (5, "0005_usage.sql"),  # sessions per hold; fair-share weights
    (6, "0006_hold_idle.sql"),  # a hold's idle rule; its warning and reclaim events
    (7, "0007_requeue.sql"),  # requeue after a hardware failure; job_requeued
    (8, "0008_leadership.sql"),  # the leadership lease (rc.controller.store.leader)
    (9, "0009_queue_ask.sql"),  # the queue indexed by ask (positions) and by submitter
    (10, "0010_principals.sql"),  # owners are principals; keys unique per owner
    (11, "0011_spec_bytes.sql"),  # a job's spec bytes, for the per-user budget of them
    (12, "0012_queue_edits.sql"),  # stashed jobs, begin times; the feed's job_updated
    (15, "0015_retention.sql"),  # the ledger's daily rollups; leases marked rolled up
    (16, "0016_via.sql"),  # the feed's job_submitted (a submission via rc mcp)
]
"""(version, file) under migrations/pg/, after PG_BASELINE; the same numbers
as MIGRATIONS."""
PG_SCHEMA_VERSION = PG_MIGRATIONS[-1][0]
