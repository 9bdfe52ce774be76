"""The schema is the truth: store.sql, its CHECK lists,
its invariants, the named queries, and how an old or foreign database is met."""

from __future__ import annotations

import asyncio
import re
import sqlite3
from pathlib import Path

import pytest

from rc.controller.errors import StoreError
from rc.controller.store import sql as store_sql
from rc.controller.store import sqlite
from rc.proto.model import (
    JobState,
)
from tests.helpers.harness import REPO
from tests.helpers.schema_data import CHECKED, V9_ROWS, V10_JOBS, V11_SPEC_BYTES, _v10_owners

OLD_SCHEMA = REPO / "tests" / "data" / "store_v1.sql"
"""store.sql as schema version 1 had it (its statements verbatim): the
oldest database a migration must bring up to date."""


def _schema_db(path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None)
    sqlite.add_functions(conn)
    sqlite.migrate(conn, str(path))
    return conn


def _table_sql(table: str) -> str:
    m = re.search(rf"CREATE TABLE {table} \((.*?)\n\) STRICT", store_sql.SCHEMA_SQL, re.DOTALL)
    assert m, table
    return m.group(1)


@pytest.mark.parametrize("table,column", sorted(CHECKED))
def test_check_lists_equal_the_python_enums(table, column):
    body = _table_sql(table)
    m = re.search(rf"\b{column}\s+TEXT[^,]*?CHECK \({column} IN \((.*?)\)\)", body, re.DOTALL)
    assert m, f"{table}.{column} has no CHECK list"
    values = set(re.findall(r"'([^']*)'", m.group(1)))
    assert values == {e.value for e in CHECKED[(table, column)]}


def test_every_table_is_strict():
    tables = re.findall(r"CREATE TABLE (\w+) \(", store_sql.SCHEMA_SQL)
    assert len(tables) >= 8
    for t in tables:
        assert re.search(rf"CREATE TABLE {t} \(.*?\n\) STRICT", store_sql.SCHEMA_SQL, re.DOTALL), t


def test_the_schema_enforces_its_invariants(tmp_path):
    conn = _schema_db(tmp_path / "rc.db")
    conn.execute("PRAGMA foreign_keys = ON")
    conn.execute(
        "INSERT INTO devices (id, host, name, worker_id, state, last_heartbeat_at, "
        "created_at) VALUES ('h:d', 'h', 'd', 'h', 'ready', 0, 0)"
    )
    with pytest.raises(sqlite3.IntegrityError):
        conn.execute("UPDATE devices SET state = 'broken' WHERE id = 'h:d'")
    with pytest.raises(sqlite3.IntegrityError):  # a reason only on a quarantined device
        conn.execute("UPDATE devices SET quarantine_reason = 'fault' WHERE id = 'h:d'")
    for i in (1, 2):
        conn.execute(
            "INSERT INTO jobs (kind, state, submitter, device_id, command, "
            "submitted_at, queued_at, owner) "
            "VALUES ('job', 'queued', 'u', 'h:d', '[]', 0, 0, 'uid:1000')"
        )
    conn.execute(
        "INSERT INTO leases (device_id, job_id, holder, kind, acquired_at, expires_at) "
        "VALUES ('h:d', 1, 'u', 'job', 0, 10)"
    )
    for bad in ("", "u", "alice", "token:", "token:0", "token:1x", "uid:", "uid:-1", "name:"):
        with pytest.raises(sqlite3.IntegrityError):  # an owner is a principal
            conn.execute(
                "INSERT INTO jobs (kind, state, submitter, device_id, command, "
                "submitted_at, queued_at, owner) VALUES ('job', 'queued', 'u', 'h:d', '[]', "
                "0, 0, ?)",
                (bad,),
            )
    with pytest.raises(sqlite3.IntegrityError):  # one live lease per device
        conn.execute(
            "INSERT INTO leases (device_id, job_id, holder, kind, acquired_at, "
            "expires_at) VALUES ('h:d', 2, 'u', 'job', 0, 10)"
        )
    conn.execute("UPDATE leases SET released_at = 5")
    conn.execute(
        "INSERT INTO leases (device_id, job_id, holder, kind, acquired_at, expires_at) "
        "VALUES ('h:d', 2, 'u', 'job', 0, 10)"
    )
    conn.execute(
        "INSERT INTO devices (id, host, name, worker_id, state, last_heartbeat_at, "
        "created_at) VALUES ('h:e', 'h', 'e', 'h', 'ready', 0, 0)"
    )
    conn.execute(  # a job holds one lease per device it was granted
        "INSERT INTO leases (device_id, job_id, holder, kind, acquired_at, expires_at) "
        "VALUES ('h:e', 2, 'u', 'job', 0, 10)"
    )
    with pytest.raises(sqlite3.IntegrityError):  # count is 1..64
        conn.execute("UPDATE jobs SET count = 65 WHERE id = 2")
    with pytest.raises(sqlite3.IntegrityError):  # device_ids is a JSON array
        conn.execute("UPDATE jobs SET device_ids = '\"h:d\"' WHERE id = 2")
    with pytest.raises(sqlite3.IntegrityError):  # a link pair is named once, in order
        conn.execute("INSERT INTO device_links VALUES ('h', 'gpu1', 'gpu0', 'NV')")
    with pytest.raises(sqlite3.IntegrityError):  # leases point at real jobs
        conn.execute(
            "INSERT INTO leases (device_id, job_id, holder, kind, acquired_at, "
            "expires_at) VALUES ('x:y', 99, 'u', 'job', 0, 10)"
        )
    conn.execute("UPDATE jobs SET state = 'succeeded', finished_at = 1 WHERE id = 1")
    with pytest.raises(sqlite3.IntegrityError, match="terminal"):
        conn.execute("UPDATE jobs SET state = 'running' WHERE id = 1")
    with pytest.raises(sqlite3.IntegrityError):  # finished_at exactly when terminal
        conn.execute("UPDATE jobs SET state = 'failed', finished_at = NULL WHERE id = 2")
    key = (
        "INSERT INTO jobs (kind, state, submitter, device_id, command, "
        "idempotency_key, submitted_at, queued_at, owner) "
        "VALUES ('job', 'queued', 'u', 'h:d', '[]', 'k', 0, 0, ?)"
    )
    conn.execute(key, ("token:7",))
    conn.execute(key, ("uid:7",))  # another owner's key is its own
    with pytest.raises(sqlite3.IntegrityError):  # idempotency keys are unique per owner
        conn.execute(key, ("token:7",))
    with pytest.raises(sqlite3.IntegrityError):  # a hold carries no command environment
        conn.execute(
            "INSERT INTO jobs (kind, state, submitter, device_id, command, env, "
            "submitted_at, queued_at, owner) "
            "VALUES ('hold', 'queued', 'u', 'h:d', '[]', '{\"A\":\"1\"}', 0, 0, 'uid:0')"
        )
    conn.close()


def _used_query_names() -> set[str]:
    names = set()
    pattern = re.compile(
        r"""tx\.(?:one|all|scalar|iter|exec|many|change)\(\s*["']([a-z0-9_]+)["']"""
    )
    for path in (REPO / "rc" / "controller").rglob("*.py"):
        names |= set(pattern.findall(path.read_text()))
    return names


def test_every_query_the_code_uses_exists():
    missing = _used_query_names() - set(store_sql.QUERIES)
    assert missing == set()


def test_every_query_is_used_by_the_code():
    """A query nothing runs is dead code (tests may read the store with any)."""
    assert set(store_sql.QUERIES) - _used_query_names() == set()


def test_every_query_has_a_one_line_description():
    """The `--` line under each `-- name:` header says what the query does."""
    missing = sorted(name for name, doc in store_sql.DESCRIPTIONS.items() if not doc)
    assert missing == [], f"queries without a description: {missing}"
    text = (REPO / "rc/controller/store/sql/queries.sql").read_text()
    first = re.findall(r"^-- name: ([a-z0-9_]+)\n(.*)$", text, re.MULTILINE)
    assert len(first) == len(store_sql.QUERIES)
    assert [n for n, line in first if not re.match(r"-- \S", line)] == []


def test_a_query_description_is_kept_apart_from_its_statement():
    parsed = store_sql.parse_queries("-- name: a\n-- Says what a does,\n-- at length.\nSELECT 1\n")
    assert parsed == {"a": ("Says what a does, at length.", "SELECT 1")}


def test_every_query_compiles_against_the_schema(tmp_path):
    conn = _schema_db(tmp_path / "rc.db")
    for name, sql in store_sql.QUERIES.items():
        try:
            conn.execute("EXPLAIN " + sql, _dummy_params(sql))
        except sqlite3.Error as e:
            pytest.fail(f"query {name} does not compile: {e}")
    conn.close()


def _dummy_params(sql: str):
    named = re.findall(r":([a-z_]+)", sql)
    if named:
        return {n: "[]" for n in named}
    numbered = re.findall(r"\?(\d+)", sql)
    if numbered:
        return ["[]"] * max(int(n) for n in numbered)
    return ["[]"] * sql.count("?")


def _checks(sql: str) -> list[str]:
    """Every CHECK (...) clause of a CREATE TABLE, whitespace collapsed."""
    out = []
    for m in re.finditer(r"CHECK\s*\(", sql):
        depth, i = 1, m.end()
        while depth:
            depth += {"(": 1, ")": -1}.get(sql[i], 0)
            i += 1
        out.append(" ".join(sql[m.start() : i].split()))
    return sorted(out)


def _shape(conn: sqlite3.Connection) -> dict:
    """What a schema is, independent of how its text was written: each
    table's columns in order (name, type, not null, default, key), its CHECK
    clauses, foreign keys, STRICT and WITHOUT ROWID; each index's and
    trigger's statement (whitespace collapsed)."""
    out = {}
    for kind, name, sql in conn.execute(
        "SELECT type, name, sql FROM sqlite_master WHERE name NOT LIKE 'sqlite_%' ORDER BY name"
    ):
        if kind == "table":
            listed = conn.execute("PRAGMA table_list(" + name + ")").fetchone()
            out[name] = (
                [tuple(r) for r in conn.execute(f"PRAGMA table_xinfo({name})")],
                _checks(sql),
                [tuple(r) for r in conn.execute(f"PRAGMA foreign_key_list({name})")],
                listed[4:],  # without rowid, strict
            )
        else:
            out[name] = (kind, " ".join((sql or "").split()))
    return out


def _old_database(path: Path) -> sqlite3.Connection:
    """A database as schema version 1 wrote it (from its own store.sql)."""
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode = WAL")
    for stmt in sqlite.statements(OLD_SCHEMA.read_text()):
        conn.execute(stmt)
    conn.execute("PRAGMA user_version = 1")
    return conn


def test_the_oldest_schema_plus_every_migration_is_store_sql(tmp_path):
    versions = [v for v, _ in store_sql.MIGRATIONS]
    # increasing from 2; a number may be left out while another branch holds it
    assert versions == sorted(set(versions)) and versions[0] == 2
    assert store_sql.SCHEMA_VERSION == versions[-1] >= 2
    _old_database(tmp_path / "old.db").close()
    migrated = _schema_db(tmp_path / "old.db")  # opening it migrates it
    fresh = _schema_db(tmp_path / "fresh.db")
    assert migrated.execute("PRAGMA user_version").fetchone()[0] == store_sql.SCHEMA_VERSION
    assert _shape(migrated) == _shape(fresh)
    migrated.close()
    fresh.close()


def test_old_tokens_and_jobs_take_their_own_name_as_unix_user(tmp_path):
    """Schema 3: a token's jobs run as the Unix user of its name (a worker
    token none), an old job as its submitter, and an old worker says nothing
    of whom it runs jobs as until it registers again."""
    conn = _old_database(tmp_path / "rc.db")
    conn.execute(
        "INSERT INTO tokens (name, role, secret_hash, created_at) VALUES "
        "('alice', 'user', 'h1', 0), ('gpu-1', 'worker', 'h2', 0), ('admin', 'admin', 'h3', 0)"
    )
    conn.execute(
        "INSERT INTO jobs (kind, state, submitter, selector, command, submitted_at, "
        "queued_at) VALUES ('job', 'queued', 'bob', '*', '[\"true\"]', 4, 4)"
    )
    conn.execute(
        "INSERT INTO workers (id, host, registered_at, last_heartbeat_at) VALUES ('h', 'h', 0, 0)"
    )
    conn.close()
    conn = _schema_db(tmp_path / "rc.db")
    got = dict(conn.execute("SELECT name, unix_user FROM tokens"))
    assert got == {"alice": "alice", "gpu-1": "", "admin": "admin"}
    assert conn.execute("SELECT unix_user FROM jobs").fetchall() == [("bob",)]
    worker = conn.execute("SELECT run_as, shared_account, allow_root_jobs FROM workers").fetchone()
    assert worker == ("", 0, 0)
    conn.close()


def test_a_job_of_the_old_schema_reads_back_after_the_migration(tmp_path):
    """Every job and lease is kept: an old job has count 1 and its one device."""
    from rc.controller.store import rows

    conn = _old_database(tmp_path / "rc.db")
    conn.execute(
        "INSERT INTO devices (id, host, name, worker_id, state, last_heartbeat_at, created_at) "
        "VALUES ('h:gpu0', 'h', 'gpu0', 'h', 'busy', 0, 0)"
    )
    conn.execute(
        "INSERT INTO jobs (id, kind, state, submitter, selector, device_id, worker_id, "
        "command, submitted_at, queued_at, assigned_at, started_at) VALUES "
        "(7, 'job', 'running', 'ann', 'model=h100', 'h:gpu0', 'h', '[\"train\"]', 1, 1, 2, 3)"
    )
    conn.execute(
        "INSERT INTO jobs (id, kind, state, submitter, selector, command, submitted_at, "
        "queued_at) VALUES (8, 'job', 'queued', 'bob', '*', '[\"true\"]', 4, 4)"
    )
    conn.execute(
        "INSERT INTO jobs (id, kind, state, submitter, device_id, command, submitted_at, "
        "queued_at) VALUES (9, 'job', 'queued', 'bob', 'h:gpu0', '[\"true\"]', 5, 5)"
    )
    conn.execute(
        "INSERT INTO leases (device_id, job_id, holder, kind, acquired_at, expires_at) "
        "VALUES ('h:gpu0', 7, 'ann', 'job', 2, 100)"
    )
    conn.close()
    conn = _schema_db(tmp_path / "rc.db")
    conn.row_factory = sqlite3.Row
    got = {r["id"]: rows.job(r) for r in conn.execute("SELECT * FROM jobs")}
    assert (got[7].count, got[7].device_ids, got[7].device_id) == (1, ("h:gpu0",), "h:gpu0")
    assert got[7].command == ("train",) and got[7].state is JobState.RUNNING
    assert (got[8].count, got[8].device_ids, got[8].selector) == (1, (), "*")
    assert (got[9].count, got[9].device_ids) == (1, ("h:gpu0",))  # the pinned device
    live = conn.execute("SELECT device_id, job_id FROM leases WHERE released_at IS NULL")
    assert [tuple(r) for r in live] == [("h:gpu0", 7)]
    conn.close()


def test_fresh_database_gets_the_current_version(tmp_path):
    conn = _schema_db(tmp_path / "rc.db")
    assert conn.execute("PRAGMA user_version").fetchone()[0] == store_sql.SCHEMA_VERSION
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    conn.close()


def test_database_from_a_newer_rc_is_refused(tmp_path):
    path = tmp_path / "rc.db"
    _schema_db(path).close()
    conn = sqlite3.connect(path)
    conn.execute(f"PRAGMA user_version = {store_sql.SCHEMA_VERSION + 1}")
    conn.close()
    store = sqlite.SqliteDatabase(str(path), clock=lambda: 0.0)
    with pytest.raises(StoreError, match="newer rc"):
        asyncio.run(store.open())


def test_foreign_database_is_refused(tmp_path):
    path = tmp_path / "rc.db"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE other (x)")
    conn.close()
    with pytest.raises(StoreError, match="not an rc database"):
        asyncio.run(sqlite.SqliteDatabase(str(path), clock=lambda: 0.0).open())


def test_query_file_has_no_duplicate_names():
    with pytest.raises(ValueError, match="defined twice"):
        store_sql.load_queries("-- name: a\nSELECT 1\n-- name: a\nSELECT 2\n")


def test_schema_10_gives_every_old_job_its_owner(tmp_path):
    """Found in a lab trial: owners were names; a schema-9 database's jobs get the
    principal that submitted them (the token live at the time, else the
    local user of that name by uid, else name:<n>), their labels, and
    their leases the Unix user as holder; ids are never drawn again."""
    path = tmp_path / "rc.db"
    conn = _old_database(path)
    for target, name in store_sql.MIGRATIONS:
        if target > 9:
            break
        for stmt in sqlite.statements(store_sql.migration(name)):
            conn.execute(stmt)
        conn.execute(f"PRAGMA user_version = {target}")
    conn.execute("PRAGMA foreign_keys = ON")
    for stmt in sqlite.statements(V9_ROWS.read_text()):
        conn.execute(stmt)
    conn.close()
    conn = _schema_db(path)
    got = {r[0]: (r[1], r[2]) for r in conn.execute("SELECT id, owner, submitter FROM jobs")}
    assert got == _v10_owners()
    assert conn.execute("SELECT owner, submitter FROM arrays").fetchall() == [
        ("token:2", "alice (token alice)")
    ]
    assert conn.execute("SELECT holder FROM leases").fetchall() == [("root",)]
    assert conn.execute("SELECT job_id, after_id FROM job_deps").fetchall() == [(4, 1)]
    assert conn.execute("PRAGMA foreign_key_check").fetchall() == []
    # keys are per owner now; the old key stays its owner's
    insert = (
        "INSERT INTO jobs (kind, state, submitter, selector, command, idempotency_key, "
        "submitted_at, queued_at, owner) VALUES ('job', 'queued', 'x', '*', '[]', 'k', 0, 0, ?) "
        "RETURNING id"
    )
    assert conn.execute(insert, ("uid:4242",)).fetchone() == (10,)  # 9 was drawn once
    with pytest.raises(sqlite3.IntegrityError):
        conn.execute(insert, ("token:1",))
    assert _shape(conn) == _shape(_schema_db(tmp_path / "fresh.db"))
    conn.close()


def test_schema_11_counts_every_old_jobs_spec_bytes(tmp_path):
    """Schema 11: every job of a schema-10 database gets the bytes its spec
    takes (command and env as stored, cwd, reason, array item), and a
    user's queued sum is read from jobs_queued_by_user alone."""
    path = tmp_path / "rc.db"
    conn = _old_database(path)
    for target, name in store_sql.MIGRATIONS:
        if target > 10:
            break
        for stmt in sqlite.statements(store_sql.migration(name)):
            conn.execute(stmt)
        conn.execute(f"PRAGMA user_version = {target}")
    conn.execute(V10_JOBS)
    conn.close()
    conn = _schema_db(path)
    got = dict(conn.execute("SELECT id, spec_bytes FROM jobs"))
    assert got == V11_SPEC_BYTES
    sql = store_sql.QUERIES["queued_of_user"]
    assert conn.execute(sql, ("alice",)).fetchone() == (1, V11_SPEC_BYTES[1])
    assert conn.execute(sql, ("carol",)).fetchone() == (0, 0)
    plan = " ".join(str(r[-1]) for r in conn.execute("EXPLAIN QUERY PLAN " + sql, ("alice",)))
    assert "COVERING INDEX jobs_queued_by_user" in plan, plan
    assert _shape(conn) == _shape(_schema_db(tmp_path / "fresh.db"))
    conn.close()
