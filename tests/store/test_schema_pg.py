"""The PostgreSQL schema is the truth too: store.pg.sql against store.sql and
the Python enums, its invariants, its migrations, and every named query
prepared on it (tests/store/test_schema.py does the same for SQLite)."""

from __future__ import annotations

import asyncio
import re
import sqlite3

import pytest

from rc.controller.errors import StoreError
from rc.controller.planning import aged_priority
from rc.controller.planning.fairshare import decayed
from rc.controller.store import pg, sqlite
from rc.controller.store import sql as store_sql
from rc.proto.model import Condition, JobState
from tests.helpers.harness import REPO
from tests.helpers.schema_data import CHECKED, _prepare_text

psycopg = pytest.importorskip("psycopg")

OLD_PG_SCHEMA = REPO / "tests" / "data" / "store_pg_v4.sql"
"""store.pg.sql as PG_BASELINE had it: the oldest PostgreSQL database a PG
migration must bring up to date."""


@pytest.fixture
def conn(pg_cluster):
    """An autocommit connection to a fresh database with rc's PG schema."""
    dsn, drop = pg_cluster.rc_database()
    with psycopg.connect(dsn, autocommit=True) as c:
        yield c
    drop()


def test_every_query_prepares_on_postgresql(conn):
    """The porting gate: each named query, as PostgreSQL runs it (its
    override in queries.pg.sql, else queries.sql translated), parses and
    type-checks against store.pg.sql. A failure names the query to port."""
    bad = {}
    for name, (sql, _numbered) in pg.PG_QUERIES.items():
        try:
            conn.execute(f"PREPARE q AS {_prepare_text(sql)}")
            conn.execute("DEALLOCATE q")
        except psycopg.Error as e:
            bad[name] = str(e).splitlines()[0]
    assert bad == {}, "port these to queries.pg.sql: " + repr(bad)


def test_every_override_names_a_query_of_queries_sql():
    assert pg.PG_OVERRIDES and pg.PG_OVERRIDES <= set(store_sql.QUERIES)


def _placeholders(sql: str) -> list[str]:
    """The parameters a translated statement takes: each `%s` as "?", each
    named one once, in a sorted list."""
    plain = re.findall(r"(?<!%)%s", sql.replace("%%", ""))
    named = set(re.findall(r"%\((\w+)\)s", sql))
    return ["?"] * len(plain) + sorted(named)


def test_every_override_takes_the_parameters_of_its_query():
    """An override drifts when its query gains a column on main (as
    job_insert_element did with schema 7): it must take the same parameters."""
    for name in sorted(pg.PG_OVERRIDES):
        want = _placeholders(pg.translate(store_sql.QUERIES[name])[0])
        assert _placeholders(pg.PG_QUERIES[name][0]) == want, name


def test_no_query_names_a_reserved_word_unquoted_on_postgresql():
    """`user` (share_weights' column) is a reserved word on PostgreSQL:
    unquoted it prepares and reads the session's role, so the preparing gate
    above cannot catch it (share_weights_all returned the role's name)."""
    bad = []
    for name, (sql, _numbered) in pg.PG_QUERIES.items():
        body = re.sub(r"--[^\n]*|'(?:[^']|'')*'|%\(\w+\)s", "", sql)
        if re.search(r'(?<![\w".])user\b(?!")', body):
            bad.append(name)
    assert bad == []


@pytest.mark.parametrize(
    "sql,want",
    [
        ("SELECT * FROM jobs WHERE id = ?", ("SELECT * FROM jobs WHERE id = %s", False)),
        (
            "UPDATE t SET a = ?1 WHERE b = ?2 OR c = ?1",
            ("UPDATE t SET a = %(p1)s WHERE b = %(p2)s OR c = %(p1)s", True),
        ),
        ("SELECT :now, x::text FROM t", ("SELECT %(now)s, x::text FROM t", False)),
        (
            "SELECT 1 WHERE d LIKE 'job % done: ?' -- 50% of :it",
            ("SELECT 1 WHERE d LIKE 'job %% done: ?' -- 50%% of :it", False),
        ),
        ("SELECT 'it''s :x' || ?", ("SELECT 'it''s :x' || %s", False)),
    ],
)
def test_translate_maps_sqlite_placeholders_to_psycopg(sql, want):
    assert pg.translate(sql) == want


def test_translate_refuses_mixed_placeholders():
    with pytest.raises(ValueError, match="mixes"):
        pg.translate("SELECT ?1, ?")


def _pg_checks(text: str, table: str) -> str:
    m = re.search(rf"CREATE TABLE {table} \((.*?)\n\);", text, re.DOTALL)
    assert m, table
    return m.group(1)


@pytest.mark.parametrize("table,column", sorted(CHECKED))
def test_pg_check_lists_equal_the_python_enums(table, column):
    body = _pg_checks(store_sql.PG_SCHEMA_SQL, table)
    m = re.search(rf"\b{column}\s+text[^,]*?CHECK \({column} IN \((.*?)\)\)", body, re.DOTALL)
    assert m, f"{table}.{column} has no CHECK list"
    assert set(re.findall(r"'([^']*)'", m.group(1))) == {e.value for e in CHECKED[(table, column)]}


def test_both_engines_have_the_same_tables_and_columns(conn, tmp_path):
    lite = sqlite3.connect(tmp_path / "rc.db", isolation_level=None)
    sqlite.add_functions(lite)
    sqlite.migrate(lite, "rc.db")
    want = {}
    for (table,) in lite.execute(
        "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'"
    ):
        want[table] = [  # (name, not null: a key column is, default given)
            (r[1], bool(r[3] or r[5]), r[4] is not None)
            for r in lite.execute(f"PRAGMA table_info({table})")
        ]
    lite.close()
    got: dict[str, list] = {}
    for table, column, nullable, default in conn.execute(
        "SELECT table_name, column_name, is_nullable, column_default FROM information_schema.columns "
        "WHERE table_schema = current_schema() AND table_name != 'rc_schema' "
        "ORDER BY table_name, ordinal_position"
    ):
        got.setdefault(table, []).append((column, nullable == "NO", default is not None))
    # an identity column has no DEFAULT clause in PG; SQLite's rowid alias none either
    assert got == want


def test_the_pg_schema_enforces_its_invariants(conn):
    ex = conn.execute
    ex(
        "INSERT INTO devices (id, host, name, worker_id, state, last_heartbeat_at, "
        "created_at) VALUES ('h:d', 'h', 'd', 'h', 'ready', 0, 0)"
    )
    with pytest.raises(psycopg.errors.CheckViolation):
        ex("UPDATE devices SET state = 'broken' WHERE id = 'h:d'")
    with pytest.raises(psycopg.errors.CheckViolation):  # a reason only on a quarantined device
        ex("UPDATE devices SET quarantine_reason = 'fault' WHERE id = 'h:d'")
    for _ in (1, 2):
        ex(
            "INSERT INTO jobs (kind, state, submitter, device_id, command, "
            "submitted_at, queued_at, owner) "
            "VALUES ('job', 'queued', 'u', 'h:d', '[]', 0, 0, 'uid:1000')"
        )
    for bad in ("", "u", "alice", "token:", "token:0", "token:1x", "uid:", "uid:-1", "name:"):
        with pytest.raises(psycopg.errors.CheckViolation):  # an owner is a principal
            ex(
                "INSERT INTO jobs (kind, state, submitter, device_id, command, "
                "submitted_at, queued_at, owner) VALUES ('job', 'queued', 'u', 'h:d', '[]', "
                "0, 0, %s)",
                (bad,),
            )
    lease = (
        "INSERT INTO leases (device_id, job_id, holder, kind, acquired_at, expires_at) "
        "VALUES (%s, %s, 'u', 'job', 0, 10)"
    )
    ex(lease, ("h:d", 1))
    with pytest.raises(psycopg.errors.UniqueViolation):  # one live lease per device
        ex(lease, ("h:d", 2))
    ex("UPDATE leases SET released_at = 5")
    ex(lease, ("h:d", 2))
    ex(lease, ("h:e", 2))  # a job holds one lease per device it was granted
    with pytest.raises(psycopg.errors.CheckViolation):  # count is 1..64
        ex("UPDATE jobs SET count = 65 WHERE id = 2")
    with pytest.raises(psycopg.errors.CheckViolation):  # device_ids is a JSON array
        ex("UPDATE jobs SET device_ids = '\"h:d\"' WHERE id = 2")
    with pytest.raises(psycopg.errors.CheckViolation):  # a link pair is named once, in order
        ex("INSERT INTO device_links VALUES ('h', 'gpu1', 'gpu0', 'NV')")
    with pytest.raises(psycopg.errors.ForeignKeyViolation):  # leases point at real jobs
        ex(lease, ("x:y", 99))
    ex("UPDATE jobs SET state = 'succeeded', finished_at = 1 WHERE id = 1")
    with pytest.raises(psycopg.errors.CheckViolation, match="terminal"):
        ex("UPDATE jobs SET state = 'running' WHERE id = 1")
    with pytest.raises(psycopg.errors.CheckViolation):  # finished_at exactly when terminal
        ex("UPDATE jobs SET state = 'failed', finished_at = NULL WHERE id = 2")
    keyed = (
        "INSERT INTO jobs (kind, state, submitter, device_id, command, idempotency_key, "
        "submitted_at, queued_at, owner) VALUES ('job', 'queued', 'u', 'h:d', '[]', 'k', 0, 0, %s)"
    )
    ex(keyed, ("token:7",))
    ex(keyed, ("uid:7",))  # another owner's key is its own
    with pytest.raises(psycopg.errors.UniqueViolation):  # idempotency keys are unique per owner
        ex(keyed, ("token:7",))
    with pytest.raises(psycopg.errors.CheckViolation):  # a hold carries no command environment
        ex(
            "INSERT INTO jobs (kind, state, submitter, device_id, command, env, "
            "submitted_at, queued_at, owner) "
            "VALUES ('hold', 'queued', 'u', 'h:d', '[]', '{\"A\":\"1\"}', 0, 0, 'uid:0')"
        )


def test_the_sql_functions_agree_with_their_python_definitions(conn):
    for priority in (-10, 0, 3):
        for wait in (-50.0, 0.0, 59.9, 60.0, 601.0):
            for aging in (0.0, -1.0, 60.0):
                got = conn.execute(
                    "SELECT effective_priority(%s, %s, %s, %s)",
                    (priority, 1000.0, 1000.0 + wait, aging),
                ).fetchone()[0]
                assert got == aged_priority(priority, 1000.0, 1000.0 + wait, aging)
    for cond in Condition:
        for state in JobState:
            got = conn.execute("SELECT dep_met(%s, %s)", (cond.value, state.value)).fetchone()[0]
            assert got == cond.met_by(state), (cond, state)
    day = 86400.0
    for acquired in (0.0, 1000.0, 5000.0):
        for released in (None, 500.0, 1000.0, 3000.0, 9000.0):
            for now in (900.0, 4000.0, 10000.0, 1000.0 + 1000 * day):
                for half_life in (0.0, -1.0, 600.0, 7 * day):
                    got = conn.execute(
                        "SELECT decayed_seconds(%s, %s, %s, %s)",
                        (acquired, released, now, half_life),
                    ).fetchone()[0]
                    want = decayed(acquired, released, now, half_life)
                    assert got == pytest.approx(want, rel=1e-9, abs=1e-9), (
                        acquired,
                        released,
                        now,
                        half_life,
                    )


GLOBS = ["train*", "*-[0-9]", "a?c", "[^a]*", "[!a]*", "x.y*", "a+b", "*(1)", "[a-c]x", "^$"]
NAMES = ["train-1", "train", "abc", "axc", "bcd", "x.yz", "xzyz", "a+b", "aab", "f(1)", "bx", "^$"]


def test_rc_glob_matches_as_sqlite_glob_does(conn):
    lite = sqlite3.connect(":memory:")
    for pattern in [*GLOBS, "job\\*"]:
        names = [*NAMES, "job\\x", "!x"]
        want = [n for n in names if lite.execute("SELECT ? GLOB ?", (n, pattern)).fetchone()[0]]
        got = [
            n for n in names if conn.execute("SELECT %s ~ rc_glob(%s)", (n, pattern)).fetchone()[0]
        ]
        assert got == want, pattern
    lite.close()


def _shape(c) -> dict:
    """A PG schema independent of its text: columns, constraints, indexes,
    triggers and functions as the catalog states them."""
    q = {
        "columns": "SELECT table_name, column_name, data_type, is_nullable, column_default, "
        "is_identity FROM information_schema.columns WHERE table_schema = current_schema() "
        "ORDER BY 1, ordinal_position",
        "constraints": "SELECT conrelid::regclass::text, pg_get_constraintdef(oid) FROM "
        "pg_constraint WHERE connamespace = current_schema()::regnamespace ORDER BY 1, 2",
        "indexes": "SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = "
        "current_schema() ORDER BY 1",
        "triggers": "SELECT tgname, pg_get_triggerdef(oid) FROM pg_trigger WHERE NOT "
        "tgisinternal ORDER BY 1",
        "functions": "SELECT proname, pg_get_functiondef(oid) FROM pg_proc WHERE pronamespace "
        "= current_schema()::regnamespace ORDER BY 1",
    }
    return {k: c.execute(sql).fetchall() for k, sql in q.items()}


def test_the_oldest_pg_schema_plus_every_pg_migration_is_store_pg_sql(pg_cluster, conn):
    assert store_sql.PG_SCHEMA_VERSION == store_sql.PG_MIGRATIONS[-1][0] == store_sql.SCHEMA_VERSION
    pg_versions = [v for v, _ in store_sql.PG_MIGRATIONS]
    assert pg_versions == sorted(set(pg_versions)) and pg_versions[0] == store_sql.PG_BASELINE + 1
    dsn = pg_cluster.create_database()
    try:
        with psycopg.connect(dsn, autocommit=True) as old:
            for stmt in pg.pg_statements(OLD_PG_SCHEMA.read_text()):
                old.execute(stmt)
            old.execute("INSERT INTO rc_schema VALUES (%s)", (store_sql.PG_BASELINE,))
            pg.migrate(pg._Conn(old), "old")  # opening it migrates it
            assert (
                old.execute("SELECT version FROM rc_schema").fetchone()[0]
                == store_sql.PG_SCHEMA_VERSION
            )
            assert _shape(old) == _shape(conn)
    finally:
        pg_cluster.drop_database(dsn)


def test_a_pg_database_from_a_newer_rc_is_refused(pg_cluster, conn):
    conn.execute("UPDATE rc_schema SET version = version + 1")
    dsn = conn.info.dsn
    with pytest.raises(StoreError, match="newer rc"):
        asyncio.run(
            pg.PgDatabase(
                f"postgresql://rc@/{conn.info.dbname}?host={pg_cluster.sock}", clock=lambda: 0.0
            ).open()
        )
    assert dsn


def test_a_foreign_pg_database_is_refused(pg_cluster):
    dsn = pg_cluster.create_database()
    try:
        with psycopg.connect(dsn, autocommit=True) as c:
            c.execute("CREATE TABLE other (x int)")
        with pytest.raises(StoreError, match="not an rc database"):
            asyncio.run(pg.PgDatabase(dsn, clock=lambda: 0.0).open())
    finally:
        pg_cluster.drop_database(dsn)


def test_an_unreachable_pg_database_is_a_clear_error_without_its_password(tmp_path):
    dsn = f"postgresql://rc:hunter2@/nowhere?host={tmp_path}&connect_timeout=2"
    with pytest.raises(StoreError, match="cannot open database") as e:
        asyncio.run(pg.PgDatabase(dsn, clock=lambda: 0.0).open())
    assert "hunter2" not in str(e.value)


def test_schema_10_gives_every_old_pg_job_its_owner(pg_cluster, conn):
    """test_schema.py's test of schema 10 on PostgreSQL: the same rows of a
    schema-9 database, the same owners, labels and lease holders."""
    from tests.helpers.schema_data import V9_ROWS, _v10_owners

    dsn = pg_cluster.create_database()
    try:
        with psycopg.connect(dsn, autocommit=True) as old:
            for stmt in pg.pg_statements(OLD_PG_SCHEMA.read_text()):
                old.execute(stmt)
            for target, name in store_sql.PG_MIGRATIONS:
                if target > 9:
                    break
                for stmt in pg.pg_statements(store_sql.pg_migration(name)):
                    old.execute(stmt)
            old.execute("INSERT INTO rc_schema VALUES (9)")
            for stmt in pg.pg_statements(V9_ROWS.read_text()):
                old.execute(stmt)
            pg.migrate(pg._Conn(old), "old")
            got = {r[0]: (r[1], r[2]) for r in old.execute("SELECT id, owner, submitter FROM jobs")}
            assert got == _v10_owners()
            assert old.execute("SELECT owner, submitter FROM arrays").fetchall() == [
                ("token:2", "alice (token alice)")
            ]
            assert old.execute("SELECT holder FROM leases").fetchall() == [("root",)]
            keyed = (
                "INSERT INTO jobs (id, kind, state, submitter, selector, command, "
                "idempotency_key, submitted_at, queued_at, owner) "
                "VALUES (%s, 'job', 'queued', 'x', '*', '[]', 'k', 0, 0, %s)"
            )
            old.execute(keyed, (20, "uid:4242"))  # keys are per owner now
            with pytest.raises(psycopg.errors.UniqueViolation):
                old.execute(keyed, (21, "token:1"))
            assert _shape(old) == _shape(conn)
    finally:
        pg_cluster.drop_database(dsn)


def test_schema_11_counts_every_old_pg_jobs_spec_bytes(pg_cluster, conn):
    """test_schema.py's test of schema 11 on PostgreSQL: the same rows of a
    schema-10 database, the same spec bytes."""
    from tests.helpers.schema_data import V10_JOBS, V11_SPEC_BYTES

    dsn = pg_cluster.create_database()
    try:
        with psycopg.connect(dsn, autocommit=True) as old:
            for stmt in pg.pg_statements(OLD_PG_SCHEMA.read_text()):
                old.execute(stmt)
            for target, name in store_sql.PG_MIGRATIONS:
                if target > 10:
                    break
                for stmt in pg.pg_statements(store_sql.pg_migration(name)):
                    old.execute(stmt)
            old.execute("INSERT INTO rc_schema VALUES (10)")
            old.execute(V10_JOBS)
            pg.migrate(pg._Conn(old), "old")
            assert dict(old.execute("SELECT id, spec_bytes FROM jobs").fetchall()) == V11_SPEC_BYTES
            assert _shape(old) == _shape(conn)
    finally:
        pg_cluster.drop_database(dsn)
