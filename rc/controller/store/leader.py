"""Leadership of standby controllers on PostgreSQL: a lease row, not a lock.

Two or more `rc serve` on one PostgreSQL database: exactly one is active.
The lease is the one row of the `leadership` table (holder: the controller's
instance id, url: its advertised URL, epoch, expires_at), queries in
leader.pg.sql. Every time is the database's clock (clock_timestamp()), never
a controller's: the controllers' clocks need not agree.

- A standby tries `leader_take` every TAKE_EVERY_S; it succeeds only when
  the row is missing or its expires_at has passed, and then sets epoch + 1
  in the same statement.
- The active renews every `renew` seconds (ttl * RENEW_SHARE, 2 s at the
  default ttl of 5 s) on a connection of its own (not the store's writer:
  a long write batch never delays a renewal).
- It steps down on its own at the expiry the database last told it, minus a
  margin (ttl * MARGIN_SHARE), measured on this process's monotonic clock
  from the moment it *sent* that renewal: so it has stopped acting before a
  standby can take over, even when renewals fail because the database is
  unreachable.
- Fencing: every write batch of the store checks, inside its transaction,
  that this epoch still holds a live lease (`leader_fence`, FOR KEY SHARE:
  a takeover, which locks the row FOR UPDATE, waits until that transaction
  ends; a renewal, an UPDATE of no key column, does not), see
  rc.controller.store.pg.
  A controller paused past its expiry (SIGSTOP, a VM pause) writes nothing
  when it wakes: its first batch fails whole with NotLeader.

Why a row and not an advisory lock: a session lock belongs to a connection,
moves or vanishes when a pooler recycles it (PgBouncer in transaction mode
gives no session at all), and a paused holder keeps it for as long as its TCP
connection looks alive. A row with an epoch is judged by the database's clock
and checked inside every write.

The default ttl and the failover bound: kill -9 of the active → the
standby's takeover within ttl + TAKE_EVERY_S (5.5 s), then a controller
start (a restart's rules: the startup grace, workers re-register at their
next retry, at most 2 s apart) → the first job dispatched within 10 s.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rc.controller.errors import StoreError
from rc.controller.store import pg
from rc.controller.store.pg import LEADER_QUERIES

__all__ = [
    "LEADER_QUERIES",
    "LEASE_TTL_S",
    "TAKE_EVERY_S",
    "Active",
    "Leadership",
    "Lease",
]

log = logging.getLogger("rc.leader")

LEASE_TTL_S = 5.0
"""The lease's default length, seconds (rc serve --leader-ttl)."""
RENEW_SHARE = 0.4
"""The active renews every ttl * this (2 s at the default ttl)."""
MARGIN_SHARE = 0.2
"""The active steps down this share of the ttl before the expiry it last saw."""
TAKE_EVERY_S = 0.5
"""How often a standby tries to take an expired lease."""
STATEMENT_TIMEOUT_MS = 2000
"""The longest a lease statement may run (or wait for the row's lock)."""


@dataclass(frozen=True, slots=True)
class Lease:
    """The lease this controller holds: its instance id and epoch."""

    holder: str
    epoch: int


@dataclass(frozen=True, slots=True)
class Active:
    """Who holds the lease: holder, advertised url, epoch; `live` is False
    once its expires_at has passed (no controller is active then)."""

    holder: str
    url: str
    epoch: int
    live: bool


class Leadership:
    """The lease, seen from one controller: `holder` (its instance id), `url`
    (its advertised URL), `ttl` seconds (> 0).

    `open()` connects (its own connection) and creates or migrates the schema;
    `take()` tries once; `hold(on_lost)` renews until the lease is lost and
    then calls `on_lost(reason)`; `peek()` reads who is active. Raises
    StoreError when the database cannot be reached at open.
    """

    def __init__(self, dsn: str, holder: str, url: str, ttl: float = LEASE_TTL_S) -> None:
        if ttl <= 0:
            raise ValueError("the lease ttl must be positive")
        self.dsn = dsn
        self.holder = holder
        self.url = url
        self.ttl = ttl
        self.renew_every = ttl * RENEW_SHARE
        self.margin = ttl * MARGIN_SHARE
        self.lease: Lease | None = None
        self.deadline = 0.0
        """time.monotonic() at which this controller must have stopped acting."""
        self.active: Active | None = None
        """The lease's holder as last read (peek, take)."""
        self._conn: Any = None
        self._failing: str | None = None
        """What failed first in the current spell of database failures (None: none)."""

    async def open(self) -> Leadership:
        try:
            import psycopg
        except ImportError:
            raise StoreError(
                "PostgreSQL needs psycopg: pip install 'rc[postgres]' (or -e '.[postgres]')"
            ) from None
        where = pg.redact(self.dsn)
        try:
            self._conn = await self._connect()
            await self._on_thread(pg.migrate, where)
        except psycopg.Error as e:
            await self.close()
            msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise StoreError(f"cannot open database {where}: {msg}") from None
        except StoreError:
            await self.close()
            raise
        return self

    async def close(self) -> None:
        """Close the lease's connection (the lease itself is not given up: release)."""
        if self._conn is not None:
            conn, self._conn = self._conn, None
            await asyncio.get_running_loop().run_in_executor(None, conn.close)

    async def _on_thread(self, fn: Callable, *args: Any) -> Any:
        if self._conn is None or self._conn.raw.closed:
            await self._reconnect()
        return await asyncio.get_running_loop().run_in_executor(
            self._conn.executor, fn, self._conn, *args
        )

    async def _reconnect(self) -> None:
        """A new lease connection after the last one broke (the server
        restarted, the network dropped it): a standby keeps trying, an
        active one renews again if it is back before its deadline. Raises
        psycopg's error when the database cannot be reached (the caller's
        try fails; the next one reconnects again)."""
        if self._conn is not None:
            old, self._conn = self._conn, None
            await asyncio.get_running_loop().run_in_executor(None, old.close)
        self._conn = await self._connect()
        log.info("reconnected the leadership lease's connection")

    async def _connect(self) -> Any:
        """A new lease connection (pg._Conn) with the lease's statement timeout."""
        loop = asyncio.get_running_loop()
        conn = await loop.run_in_executor(None, pg.PgDatabase(self.dsn, time.time)._connect)
        sql = f"SET statement_timeout = {STATEMENT_TIMEOUT_MS}"
        await loop.run_in_executor(conn.executor, _set, conn, sql)
        return conn

    async def _query(self, name: str, params: dict) -> Any:
        return await self._on_thread(_one, LEADER_QUERIES[name], params)

    async def _take(self) -> Any:
        def run(conn: Any) -> Any:
            conn.execute(LEADER_QUERIES["leader_seed"])
            params = {"holder": self.holder, "url": self.url, "ttl": self.ttl}
            return conn.execute(LEADER_QUERIES["leader_take"], params).fetchone()

        return await self._on_thread(run)

    async def take(self) -> bool:
        """One try: take the lease if it has expired (or was never taken).
        True: this controller is now the active one (self.lease, deadline set).
        A database error counts as not taken (logged)."""
        sent = time.monotonic()
        try:
            row = await self._take()
        except Exception as e:  # noqa: BLE001 - the next try retries
            self._failed("could not try the leadership lease", e)
            return False
        self._answered()
        if row is None:
            return False
        self.lease = Lease(self.holder, int(row[0]))
        self.deadline = sent + float(row[1]) - self.margin
        if self.deadline <= time.monotonic():
            # the answer took longer than the lease (a frozen database, a
            # paused process): taken, but its deadline has passed by this
            # process's measure; a renewal now sets one from a fresh send
            try:
                if not await self.renew() or self.deadline <= time.monotonic():
                    return False
            except Exception as e:  # noqa: BLE001 - it expires; a later try takes it
                self._failed("could not renew the leadership lease just taken", e)
                return False
        self.active = Active(self.holder, self.url, self.lease.epoch, True)
        return True

    def _failed(self, what: str, e: BaseException) -> None:
        """Log a failure to reach the database once per spell, not every try."""
        if self._failing is None:
            log.warning("%s: %s (said once until the database answers)", what, _first_line(e))
            self._failing = what

    def _answered(self) -> None:
        if self._failing is not None:
            log.info("the database answers the leadership queries again")
            self._failing = None

    async def peek(self) -> Active | None:
        """Who holds the lease now (None: nobody ever did, or the database
        did not answer); also kept in self.active."""
        try:
            row = await self._query("leader_peek", {})
        except Exception as e:  # noqa: BLE001 - a standby keeps answering
            self._failed("could not read the leadership lease", e)
            self.active = None
            return None
        self._answered()
        if row is None or int(row[2]) == 0:  # never taken (the seed row)
            self.active = None
        else:
            self.active = Active(row[0], row[1], int(row[2]), bool(row[3]))
        return self.active

    def active_url(self) -> str | None:
        """The advertised URL of the live active controller as last read, or None."""
        a = self.active
        return a.url if a is not None and a.live else None

    async def renew(self) -> bool:
        """One renewal; True when the lease was extended (deadline moved).
        False: lost for good (another epoch, or expired). Raises on a
        database error (the caller retries until the deadline)."""
        assert self.lease is not None
        sent = time.monotonic()
        row = await self._query(
            "leader_renew", {"holder": self.holder, "epoch": self.lease.epoch, "ttl": self.ttl}
        )
        if row is None:
            return False
        self.deadline = sent + float(row[0]) - self.margin
        return True

    async def hold(self) -> str:
        """Renew until the lease is lost; returns why it was lost (a sentence).
        Never raises for a database error: it retries every TAKE_EVERY_S
        until the deadline."""
        next_at = time.monotonic() + self.renew_every
        while True:
            now = time.monotonic()
            if now >= self.deadline:
                return "its lease could not be renewed before it expired"
            await asyncio.sleep(max(0.0, min(next_at, self.deadline) - now))
            if time.monotonic() >= self.deadline:
                return "its lease could not be renewed before it expired"
            try:
                left = self.deadline - time.monotonic()
                ok = await asyncio.wait_for(self.renew(), timeout=max(0.05, left))
            except Exception as e:  # noqa: BLE001 - retried until the deadline
                log.warning("renewing the leadership lease failed: %s", _first_line(e))
                next_at = time.monotonic() + TAKE_EVERY_S
                continue
            if not ok:
                return "another controller holds the lease now"
            next_at = time.monotonic() + self.renew_every

    async def release(self) -> None:
        """Give the lease up now (a clean stop): a standby takes over at its
        next try instead of waiting for the expiry. Never raises."""
        if self.lease is None or self._conn is None:
            return
        try:
            await self._query("leader_release", {"holder": self.holder, "epoch": self.lease.epoch})
        except Exception as e:  # noqa: BLE001 - it expires by itself
            log.warning("could not give up the leadership lease: %s", _first_line(e))
        else:
            log.info(
                "gave up the leadership lease (epoch %d): a standby takes over", self.lease.epoch
            )


def _one(conn: Any, sql: str, params: dict) -> Any:
    cur = conn.execute(sql, params)
    return cur.fetchone() if cur.description is not None else None


def _set(conn: Any, sql: str) -> None:
    conn.execute(sql)


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__
