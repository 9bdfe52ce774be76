"""The leadership lease of standby controllers at the store level
(rc.controller.store.leader): two controllers' Leadership and PgDatabase
objects on one throwaway PostgreSQL database, short ttls, the database's
clock. Takeover only after expiry, epoch + 1, and fencing: a write batch of
a controller whose lease has passed on commits nothing."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import pytest

from rc.controller.errors import NotLeader
from rc.controller.store import leader, pg, tokens
from rc.proto.model import Role
from tests.helpers.schema_data import _prepare_text
from tests.helpers.wait import until

psycopg = pytest.importorskip("psycopg")

TTL = 1.0


def test_every_leader_query_prepares_on_postgresql(pg_dsn):
    assert set(leader.LEADER_QUERIES) == {
        "leader_seed",
        "leader_take",
        "leader_renew",
        "leader_peek",
        "leader_fence",
        "leader_release",
    }
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        for name, sql in leader.LEADER_QUERIES.items():
            conn.execute(f"PREPARE q AS {_prepare_text(sql)}")
            conn.execute("DEALLOCATE q")
            assert name


def test_a_standby_takes_the_lease_only_once_it_has_expired(pg_dsn):
    async def go() -> None:
        a = await leader.Leadership(pg_dsn, "ctl-a", "http://a:1", TTL).open()
        b = await leader.Leadership(pg_dsn, "ctl-b", "http://b:2", TTL).open()
        try:
            assert await a.take()
            assert a.lease == leader.Lease("ctl-a", 1)
            assert a.deadline > time.monotonic()  # it acts until before the expiry
            assert not await b.take()  # a live lease is never taken
            seen = await b.peek()
            assert seen == leader.Active("ctl-a", "http://a:1", 1, True)
            assert b.active_url() == "http://a:1"
            assert await a.renew()  # renewed: still a's
            assert not await b.take()
            # a stops renewing: b takes over after the expiry, epoch + 1
            await until(b.take, interval=0.05, what="b's takeover")
            assert b.lease == leader.Lease("ctl-b", 2)
            assert (await a.peek()) == leader.Active("ctl-b", "http://b:2", 2, True)
            assert not await a.renew()  # lost for good, never taken back by a renewal
        finally:
            await a.close()
            await b.close()

    asyncio.run(asyncio.wait_for(go(), 30))


def test_the_active_steps_down_by_its_deadline_when_renewals_cannot_reach_the_database(pg_dsn):
    async def go() -> None:
        a = await leader.Leadership(pg_dsn, "ctl-a", "http://a:1", TTL).open()
        try:
            assert await a.take()
            # every renewal fails (its connection is gone and the database
            # cannot be reached again): hold returns at the deadline, before
            # the lease's expiry by the database's clock
            a.dsn = "postgresql://rc@/nowhere?host=/nonexistent&connect_timeout=1"
            a._conn.raw.close()
            started = time.monotonic()
            why = await asyncio.wait_for(a.hold(), 5 * TTL)
            assert "could not be renewed before it expired" in why
            assert time.monotonic() - started <= TTL
            assert time.monotonic() >= a.deadline
        finally:
            await a.close()
        b = await leader.Leadership(pg_dsn, "ctl-b", "http://b:2", TTL).open()
        try:
            assert (await b.peek()).holder == "ctl-a"
            await until(b.take, interval=0.05, what="b's takeover")
        finally:
            await b.close()

    asyncio.run(asyncio.wait_for(go(), 30))


def test_a_write_after_the_lease_passed_on_is_fenced_and_nothing_of_it_commits(pg_dsn):
    async def go() -> None:
        la = await leader.Leadership(pg_dsn, "ctl-a", "http://a:1", TTL).open()
        lb = await leader.Leadership(pg_dsn, "ctl-b", "http://b:2", TTL).open()
        assert await la.take()
        a = await pg.PgDatabase(pg_dsn, clock=time.time, lease=la.lease).open()
        fenced: list[NotLeader] = []
        a.on_fenced = fenced.append
        b = None
        try:
            await a.write(tokens.create, "before", Role.USER, "h1", "", None, "")
            await until(
                lb.take, interval=0.05, what="b's takeover"
            )  # a's lease expired, b holds it
            b = await pg.PgDatabase(pg_dsn, clock=time.time, lease=lb.lease).open()
            # a's next batch fails whole, each of its functions gets NotLeader
            results = await asyncio.gather(
                a.write(tokens.create, "after-1", Role.USER, "h2", "", None, ""),
                a.write(tokens.create, "after-2", Role.USER, "h3", "", None, ""),
                return_exceptions=True,
            )
            assert all(isinstance(r, NotLeader) for r in results), results
            assert fenced and isinstance(fenced[0], NotLeader)
            await b.write(tokens.create, "by-b", Role.USER, "h4", "", None, "")
            names = sorted(t.token.name for t in await b.read(tokens.live))
            assert names == ["before", "by-b"]  # nothing a wrote after losing the lease
        finally:
            await a.close()
            if b is not None:
                await b.close()
            await la.close()
            await lb.close()

    asyncio.run(asyncio.wait_for(go(), 30))


def test_a_clean_stop_gives_the_lease_up_at_once(pg_dsn):
    async def go() -> None:
        a = await leader.Leadership(pg_dsn, "ctl-a", "http://a:1", 60.0).open()
        b = await leader.Leadership(pg_dsn, "ctl-b", "http://b:2", 60.0).open()
        try:
            assert await a.take()
            assert not await b.take()
            await a.release()
            assert await b.take()  # no 60 s wait
            assert b.lease.epoch == 2
        finally:
            await a.close()
            await b.close()

    asyncio.run(asyncio.wait_for(go(), 30))


def test_the_fence_sets_the_idle_timeout_for_its_transaction_only(pg_dsn):
    """A controller paused inside a write batch holds the lease row's share
    lock: the server ends that session after pg.WRITER_IDLE_TIMEOUT_MS, set
    by the fence for the transaction alone (nothing stays on the session, as
    a pooler in transaction mode needs)."""

    async def go() -> leader.Lease:
        la = await leader.Leadership(pg_dsn, "ctl-a", "http://a:1", 30.0).open()
        try:
            assert await la.take()
            return la.lease
        finally:
            await la.close()

    lease = asyncio.run(go())
    with psycopg.connect(pg_dsn, autocommit=True) as raw:
        conn = pg._Conn(raw)
        try:
            conn.execute("BEGIN")
            pg.fence(conn, lease)
            assert conn.execute("SHOW idle_in_transaction_session_timeout").fetchone()[0] == "5s"
            conn.execute("COMMIT")
            assert conn.execute("SHOW idle_in_transaction_session_timeout").fetchone()[0] == "0"
            conn.execute("BEGIN")
            with pytest.raises(NotLeader):
                pg.fence(conn, leader.Lease("ctl-a", lease.epoch + 1))  # not its epoch
            conn.execute("ROLLBACK")
        finally:
            conn.executor.shutdown()


def test_a_takeover_waits_for_a_fenced_transaction_and_renewals_do_not(pg_dsn):
    """The fence's lock: while a write transaction of the active holds it, the
    active's renewal goes through at once (a long batch, 1,000 heartbeats,
    cost the lease before), and a standby's takeover waits for the
    transaction to end even once the lease has expired (its try times out)."""

    async def go() -> None:
        la = await leader.Leadership(pg_dsn, "ctl-a", "http://a:1", TTL).open()
        lb = await leader.Leadership(pg_dsn, "ctl-b", "http://b:2", TTL).open()
        raw = psycopg.connect(pg_dsn, autocommit=True)
        conn = pg._Conn(raw)
        try:
            assert await la.take()
            conn.execute("BEGIN")
            pg.fence(conn, la.lease)  # a write batch in progress
            started = time.monotonic()
            assert await asyncio.wait_for(la.renew(), 5)
            assert time.monotonic() - started < 0.5
            # a stops renewing; its lease expires while the batch is still open
            await until(lambda: _expired(lb), interval=0.05, what="a's lease to expire")
            assert not await lb.take()  # waited for the lock, gave up (statement timeout)
            conn.execute("COMMIT")
            assert await lb.take()
            assert lb.lease.epoch == 2
        finally:
            raw.close()
            conn.executor.shutdown()
            await la.close()
            await lb.close()

    asyncio.run(asyncio.wait_for(go(), 30))


async def _expired(lb: leader.Leadership) -> bool:
    seen = await lb.peek()
    return seen is not None and not seen.live


def test_the_lease_connection_is_made_again_after_it_broke(pg_dsn):
    """The server ended the lease's connection (a restart, a dropped network):
    the next try connects again, so a standby is not stuck trying forever and
    an active one renews if the database is back before its deadline."""

    async def go() -> None:
        a = await leader.Leadership(pg_dsn, "ctl-a", "http://a:1", 30.0).open()
        try:
            assert await a.take()
            pid = a._conn.raw.info.backend_pid
            with psycopg.connect(pg_dsn, autocommit=True) as admin:
                admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
            ok = None
            for _ in range(3):  # the first try may find the connection broken
                try:
                    ok = await a.renew()
                    break
                except psycopg.Error:
                    continue
            assert ok is True
            assert a._conn.raw.info.backend_pid != pid
        finally:
            await a.close()

    asyncio.run(asyncio.wait_for(go(), 30))


def test_an_active_whose_database_connection_broke_stops_acting(pg_dsn):
    """After a database restart or failover the store's connections are gone
    for good (nothing reconnects them): the active must step down (on_fenced)
    so that a standby, with connections of its own, takes over, instead of
    renewing its lease while every write fails."""

    async def go() -> None:
        la = await leader.Leadership(pg_dsn, "ctl-a", "http://a:1", 30.0).open()
        assert await la.take()
        a = await pg.PgDatabase(pg_dsn, clock=time.time, lease=la.lease).open()
        told: list[Exception] = []
        a.on_fenced = told.append
        try:
            await a.write(tokens.create, "before", Role.USER, "h1", "", None, "")
            assert told == []
            with psycopg.connect(pg_dsn, autocommit=True) as admin:
                admin.execute("SELECT pg_terminate_backend(%s)", (a._writer.raw.info.backend_pid,))
            # NotLeader, answered 503 standby (clients go on down their list);
            # found by a new user: a submit during a database restart got a 500
            with pytest.raises(NotLeader, match="a connection to the database broke"):
                await a.write(tokens.create, "after", Role.USER, "h2", "", None, "")
            assert len(told) == 1 and "connection to the database broke" in str(told[0])
            with psycopg.connect(pg_dsn, autocommit=True) as admin:
                for r in a._readers:
                    admin.execute("SELECT pg_terminate_backend(%s)", (r.raw.info.backend_pid,))
            for _ in a._readers:  # a read too
                with pytest.raises(NotLeader, match="a connection to the database broke"):
                    await a.read(tokens.count)
        finally:
            await a.close()
            await la.close()

    asyncio.run(asyncio.wait_for(go(), 30))


def test_a_take_answered_after_the_lease_length_is_renewed_not_dropped(pg_dsn):
    """Found by a new user: PostgreSQL frozen for longer than the ttl while a
    standby's take was on its way: the take succeeded when the database woke,
    but its deadline, measured from the send, had passed, so the new active
    dropped the lease at once and exited, and no controller was left. Now a
    late take is renewed at once and acts on that renewal's deadline."""

    async def go() -> None:
        b = await leader.Leadership(pg_dsn, "ctl-b", "http://b:2", TTL).open()
        try:
            pid = b._conn.raw.info.backend_pid
            os.kill(pid, signal.SIGSTOP)  # the database is frozen for b
            try:
                trying = asyncio.create_task(b.take())
                thawed_at = time.monotonic() + TTL * 1.5

                async def later() -> bool:
                    return time.monotonic() > thawed_at

                await until(later, interval=0.05, what="a freeze longer than the ttl")
            finally:
                os.kill(pid, signal.SIGCONT)
            assert await asyncio.wait_for(trying, 10)
            assert b.deadline > time.monotonic()  # acts on the renewal's deadline
            assert b.lease.epoch == 1
        finally:
            await b.close()

    asyncio.run(asyncio.wait_for(go(), 30))
