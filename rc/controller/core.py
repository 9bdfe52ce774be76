"""The running controller: database, caches, wake-ups and background loops.

One `Controller` per `rc serve` process. Route handlers reach it through
`request.app.state.ctl`; they validate input, then call the store's
transaction functions through `ctl.db.write(...)` and its reads through
`ctl.db.read(...)` (rc.controller.store).

Background loops (each turn reads the clock once, every wait has a deadline):
- the scheduling tick: a pass every `schedule_interval` seconds, besides the
  pass that follows every submit, release and registration;
- the sweeper: `store.workers.sweep` every `sweep_interval` seconds;
- the idle watch: `idle_pass` every `IDLE_TICK_S` (README "Holds: the idle
  rule"): warns, then releases, holds left idle past their idle timeout;
- history that ends: `retention.turn` every `retain_interval` seconds
  (rc.controller.retention: rollups, --retain, --log-quota).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
import uuid
from collections.abc import Callable
from pathlib import Path

from rc.controller import idle, planning
from rc.controller.auth import TokenCache, hash_secret, new_secret
from rc.controller.config import ControllerConfig
from rc.controller.errors import NotLeader, Refused, StartupError
from rc.controller.handout import Handouts
from rc.controller.hub import Hub
from rc.controller.logstore import LogStore
from rc.controller.metrics import Metrics
from rc.controller.relay import Relay
from rc.controller.retention import Retention
from rc.controller.scans import Scans
from rc.controller.signin import SignIn
from rc.controller.store import jobs, queue, schedule, tokens, usage, views, workers
from rc.controller.store.db import Database, Tx
from rc.controller.store.labels import MatchCache
from rc.controller.store.sqlite import SqliteDatabase
from rc.controller.webhook import Webhook
from rc.proto.duration import format_duration
from rc.proto.model import JobState, Role, valid_unix_user
from rc.proto.wire import HoldIdle

__all__ = ["ADMIN_TOKEN_FILE", "Controller", "own_unix_user"]

log = logging.getLogger("rc.controller")

ADMIN_TOKEN_FILE = "admin.token"
PLAN_MAX_AGE_S = 1.0
"""A shared queue plan is reused at most this long (aging moves the order)."""
IDLE_TICK_S = 1.0
"""How often the idle watch looks at the running holds (a hold is warned
and released within this of its time)."""
RETAIN_FIRST_S = 5.0
"""The first retention turn runs this soon after start (then every
retain_interval)."""
DB_FILE = "rc.db"
LOG_DIR = "logs"
"""Job logs live in DATA/logs (rc.controller.logstore) unless rc serve --log-dir."""


def own_unix_user() -> str:
    """The Unix user this process runs as ("" when the password database
    does not know its uid or its name is not a portable one)."""
    import pwd

    try:
        name = pwd.getpwuid(os.geteuid()).pw_name
    except KeyError:
        return ""
    return name if valid_unix_user(name) else ""


def open_database(config: ControllerConfig, clock: Callable[[], float]) -> Database:
    """The store engine `config.database` names: a postgresql:// URL is
    PostgreSQL (rc.controller.store.pg, needs the `postgres` extra), ""
    the embedded SQLite file DATA/rc.db (rc.controller.store.sqlite)."""
    if config.database:
        from rc.controller.store import pg

        return pg.PgDatabase(config.database, clock)
    return SqliteDatabase(str(Path(config.data_dir) / DB_FILE), clock)


def _fenced(what: str, e: NotLeader) -> None:
    """A background loop's write was fenced (the lease passed on; the store
    already logged it and this controller is stopping): one line, no
    traceback."""
    log.info("%s: %s (this controller is stopping)", what, e)


class Controller:
    """State shared by every request of one controller process.

    `clock` returns wall time in seconds (tests pass a fake one). `instance`
    is a random id sent on every response so workers notice a restart.
    """

    def __init__(self, config: ControllerConfig, clock: Callable[[], float] = time.time) -> None:
        self.cfg = config
        self.clock = clock
        self.instance = uuid.uuid4().hex
        self.data = Path(config.data_dir)
        self.db = open_database(config, clock)
        self.hub = Hub()
        self.match_cache = MatchCache()
        self.tokens = TokenCache()
        self.signin = SignIn(self.tokens, clock)
        """The dashboard's one-time sign-in codes and their sessions (rc.controller.signin)."""
        self.logs: LogStore | None = None
        self.policy = planning.Policy(
            aging=config.aging,
            cap=config.max_devices_per_user,
            lease_default=config.lease_default,
            lease_grace=config.lease_grace,
            shares=usage.ShareCache(config.fair_share) if config.fair_share > 0 else None,
        )
        self.thresholds = workers.Thresholds(
            unknown_after=config.unknown_after,
            lost_after=config.lost_after,
            startup_grace=config.startup_grace,
            lease_renewal=config.lease_renewal,
            flap_limit=config.flap_limit,
            flap_window=config.flap_window,
            retain=config.retain_disconnected_jobs,
        )
        self.handouts = Handouts()
        """The assigned jobs handed to each worker (rc.controller.handout)."""
        self.poll_generation: dict[str, int] = {}
        """worker id → the number of its newest long poll (only it hands out work)."""
        self.heard: set[str] = set()
        """Workers that registered or heartbeated with this controller process:
        a long poll of any other answers at once (api.workers.assignments), so
        that after a restart or a failover the worker sees the new instance and
        heartbeats, which brings its devices back from `unknown`."""
        self.beats: dict[str, tuple[float, tuple[int, ...]]] = {}
        """worker id → its newest heartbeat not yet written (wall seconds, the
        job ids it named): `heartbeat` keeps it, `flush_beats` writes it."""
        self.quiet: dict[str, int] = {}
        """worker id → the database's write generation (Database.generation)
        at which store.workers.beat_check last found that a heartbeat of it
        naming no jobs changes nothing: until the next write that is not a
        heartbeat flush, such a heartbeat is answered from here, with no
        read. At most one entry per registered worker."""
        self.scans = Scans()
        """Survivor scans asked of workers (rc clear, rc kill of a lost job)."""
        self.started_at = 0.0
        self.created_admin_token = False
        self._loops: list[asyncio.Task] = []
        self.webhook: Webhook | None = None
        self._plan_version = 0
        self._plan: tuple | None = None
        self._plan_pending: tuple | None = None
        self.log_dir = Path(config.log_dir) if config.log_dir else self.data / LOG_DIR
        """Where job logs live (DATA/logs unless rc serve --log-dir)."""
        self.metrics = Metrics(self.db, self.log_dir)
        """Prometheus registry and hooks (`metrics.relay_sessions`, `metrics.webhook_dropped`)."""
        self.retention = Retention(self.db, self.log_dir, config.retain, config.log_quota, clock)
        """The rollups, the retention and the log quota (rc.controller.retention)."""
        self.relay = Relay(
            config.relay_alone_timeout,
            config.limits.relay_sessions_per_user,
            self.hub.notify,
            forwards_per_user=config.limits.forward_connections_per_user,
        )
        self.metrics.relay_sessions = lambda: float(self.relay.open_sessions())
        self.idle = idle.IdleWatch()
        """The idle clocks of the running holds (memory only)."""
        self.relay.idle, self.relay.wall = self.idle, clock

    # -- life cycle ------------------------------------------------------

    async def start(self, loops: bool = True) -> None:
        """Open the data dir and database, bootstrap the admin token, start loops.

        Raises StartupError / StoreError with a message naming the problem.
        """
        try:
            self.data.mkdir(mode=0o700, parents=True, exist_ok=True)
            probe = self.data / ".rc-write-test"
            probe.write_bytes(b"")
            probe.unlink()
        except OSError as e:
            raise StartupError(f"data dir {self.data} is not writable: {e.strerror or e}") from None
        self.logs = LogStore(
            self.log_dir,
            self.cfg.limits.log_cap_bytes,
            lambda j: self.hub.notify([f"log:{j}"]),
        )
        self.db.after_batch = self._pass
        self.db.on_commit = self.hub.notify
        self.db.on_rollback = self.match_cache.invalidate
        self.hub.listeners.append(self._note_change)
        await self.db.open()
        self.started_at = self.clock()
        self.idle.floor = self.started_at
        await self.db.write(workers.controller_started)
        await self._bootstrap_admin()
        await self.reload_tokens()
        if self.cfg.webhook_url:
            await self._start_webhook()
        if loops:
            self._loops = [
                asyncio.create_task(self._tick_loop(), name="rc-schedule-tick"),
                asyncio.create_task(self._sweep_loop(), name="rc-sweeper"),
                asyncio.create_task(self._idle_loop(), name="rc-idle-watch"),
                asyncio.create_task(self._retain_loop(), name="rc-retention"),
            ]
            if self.cfg.heartbeat_flush > 0:
                self._loops.append(asyncio.create_task(self._beat_loop(), name="rc-beats"))

    async def _start_webhook(self) -> None:
        import urllib.parse

        u = urllib.parse.urlsplit(self.cfg.webhook_url)
        if u.scheme not in ("http", "https") or not u.hostname:
            raise StartupError(f"--webhook-url {self.cfg.webhook_url!r} is not an http(s) URL")
        self.webhook = Webhook(self.cfg.webhook_url, self.db, self.cfg.webhook_queue)
        self.hub.listeners.append(self.webhook.listener())
        self.metrics.webhook_dropped = lambda: float(self.webhook.dropped)
        await self.webhook.start()

    async def stop(self) -> None:
        """Stop the loops, deliver queued webhooks (5 s), close the database."""
        if self.webhook is not None:
            await self.webhook.stop()
        for t in self._loops:
            t.cancel()
        for t in self._loops:
            try:
                await t
            except asyncio.CancelledError:
                pass
        self._loops = []
        try:
            await self.flush_beats()
        except NotLeader as e:
            _fenced("could not write the last heartbeats", e)
        except Exception:
            log.exception("could not write the last heartbeats")
        await self.db.close()

    async def _bootstrap_admin(self) -> None:
        """On an empty database, create the `admin` token and write it to
        DATA/admin.token (mode 0600): the only time that secret is shown. Its
        jobs run as the Unix user this controller runs as (whoever can read
        the data dir)."""
        if await self.db.read(tokens.count):
            return
        secret = new_secret()
        path = self.data / ADMIN_TOKEN_FILE
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secret + "\n")
        os.chmod(path, 0o600)
        await self.db.write(
            tokens.create, "admin", Role.ADMIN, hash_secret(secret), "", None, own_unix_user()
        )
        self.created_admin_token = True
        log.info("created the admin token in %s", path)

    async def reload_tokens(self) -> None:
        """Load the whole in-memory token map from the database (at start;
        each token change then updates it in place: rc.controller.auth)."""
        self.tokens.load(await self.db.read(tokens.live))

    # -- the queue plan, shared by readers ----------------------------------

    def _note_change(self, keys) -> None:
        if "jobs" in keys or "devices" in keys:
            self._plan_version += 1

    async def queue_plan(self):
        """A plan of the queue (planning.Snapshot) no older than the latest
        committed change to jobs or devices and at most PLAN_MAX_AGE_S old.

        Readers that only need queue positions share it: under a burst of
        submissions the queue is planned once per commit, not once per
        request (planning costs the length of the queue).
        """
        version = self._plan_version
        cached = self._plan
        if (
            cached is not None
            and cached[0] == version
            and time.monotonic() - cached[1] < PLAN_MAX_AGE_S
        ):
            return cached[2]
        pending = self._plan_pending
        if pending is not None and pending[0] == version:
            return await asyncio.shield(pending[1])
        fut = asyncio.get_running_loop().create_future()
        self._plan_pending = (version, fut)
        try:
            snap = await self.db.read(views.plan_snapshot, self.policy)
        except BaseException as e:
            fut.set_exception(e)
            fut.exception()  # retrieved: waiters get it, nobody is left unawaited
            raise
        finally:
            if self._plan_pending is not None and self._plan_pending[1] is fut:
                self._plan_pending = None
        self._plan = (version, time.monotonic(), snap)
        fut.set_result(snap)
        return snap

    async def job_view(self, job_id: int):
        """views.job_view for one job: its record and queue position, planning
        the queue (shared, see queue_plan) only when a per-user cap needs it.
        Raises Refused (404) for an unknown id."""
        snap = await self.queue_plan() if self.policy.cap > 0 else None
        return await self.db.read(views.job_view, job_id, self.policy, snap)

    # -- scheduling ------------------------------------------------------

    def _pass(self, tx: Tx) -> None:
        schedule.schedule(tx, self.match_cache, self.policy, self.metrics.observe_wait)

    async def kick(self) -> None:
        """Run a scheduling pass now (in the next write batch)."""
        await self.db.write(queue.request_pass)

    async def _tick_loop(self) -> None:
        while True:
            await asyncio.sleep(self.cfg.schedule_interval)
            try:
                await self.kick()
            except NotLeader as e:
                _fenced("scheduling tick failed", e)
            except Exception:
                log.exception("scheduling tick failed")

    async def _sweep_loop(self) -> None:
        while True:
            await asyncio.sleep(self.cfg.sweep_interval)
            try:
                await self.sweep()
            except NotLeader as e:
                _fenced("sweep failed", e)
            except Exception:
                log.exception("sweep failed")

    async def _retain_loop(self) -> None:
        delay = min(RETAIN_FIRST_S, self.cfg.retain_interval)
        while True:
            await asyncio.sleep(delay)
            delay = self.cfg.retain_interval
            try:
                await self.retention.turn()
            except NotLeader as e:
                _fenced("retention turn failed", e)
            except Exception:
                log.exception("retention turn failed")

    async def _idle_loop(self) -> None:
        while True:
            await asyncio.sleep(IDLE_TICK_S)
            try:
                await self.idle_pass()
            except NotLeader as e:
                _fenced("idle pass failed", e)
            except Exception:
                log.exception("idle pass failed")

    async def idle_pass(self) -> tuple[list[int], list[int]]:
        """One turn of the idle rule now: warn the holds about to be idle
        for their timeout (an event, a line into each of their terminal
        sessions), release those idle for it after a warning. Returns the
        ids (warned, released)."""
        now = self.clock()
        watched = await self.db.read(jobs.idle_watched)
        warn, reclaim = self.idle.due(watched, now)
        for w in warn:
            at = self.idle.reclaim_at(w.hold_id, w.started_at, w.timeout)
            clock = time.strftime("%H:%M:%S", time.localtime(at))
            # not "or rc extend": extending adds ttl, never idle time
            text = f"hold {w.hold_id} is idle and will be released at {clock}; type anything to keep it"
            await self.db.write(
                jobs.warn_idle, w, f"{text} ({self.idle.clocks[w.hold_id].words(now)})"
            )
            self.relay.say(w.hold_id, f"rc: {text}")
        released = []
        for w in reclaim:
            reason = f"idle: no use for {format_duration(w.timeout)}"
            if await self.db.write(jobs.reclaim_idle, w, reason):
                self.relay.say(w.hold_id, f"rc: hold {w.hold_id} released ({reason})")
                released.append(w.hold_id)
        return [w.hold_id for w in warn], released

    def hold_idle(self, job, timeout: int) -> HoldIdle:
        """The idle rule's state of a hold (`job`: its model.Job) with idle
        timeout `timeout` seconds, as rc show and the dashboard give it."""
        if not timeout or job.state is not JobState.RUNNING or job.started_at is None:
            return HoldIdle(timeout)
        return self.idle_state(job.id, job.started_at, timeout)

    def idle_state(self, hold_id: int, started_at: float, timeout: int) -> HoldIdle:
        """The idle rule's state of a running hold whose rule is on."""
        now = self.clock()
        c = self.idle.clock(hold_id, started_at)
        return HoldIdle(
            timeout,
            idle_seconds=max(0.0, now - c.last),
            reclaim_at=c.last + timeout,
            warned=c.warned,
            state=c.words(now),
        )

    async def sweep(self) -> int:
        """One sweep now, after the heartbeats kept in memory are written
        (it never judges silence on stale stamps); returns how many things
        changed."""
        await self.flush_beats()
        return await self.db.write(workers.sweep, self.thresholds, self.started_at)

    # -- heartbeats ----------------------------------------------------------

    async def heartbeat(
        self, worker_id: str, running: tuple[int, ...]
    ) -> tuple[list[int], dict[str, int]]:
        """A worker's heartbeat naming `running`; returns (the jobs it should
        stop, the ttl of each named hold by id), as store.workers.beat.

        Coalesced: a heartbeat that changes no state (store.workers.beat_check
        reads that) is kept in memory and written with the others by
        `flush_beats` within heartbeat_flush seconds: its timestamps and lease
        renewals are soft state, and after a crash the startup grace covers
        what was lost. One that changes state (a device back from `unknown`,
        a `worker_lost` one in retention mode) is written before the reply.
        heartbeat_flush = 0 writes every one at once. Raises Refused (404)
        for a worker that never registered.

        A coalesced heartbeat naming no jobs whose check found nothing to
        change is answered without a read until the next write that is not
        a heartbeat flush (`quiet`): what beat_check reads (the worker's
        row, its devices' states) changes only in such writes, and none
        has committed since the check."""
        self.heard.add(worker_id)
        if self.cfg.heartbeat_flush > 0:
            generation = self.db.generation
            if not running and self.quiet.get(worker_id) == generation:
                self.beats[worker_id] = (self.clock(), running)
                return [], {}
            try:
                changes, stop, ttls = await self.db.read(
                    workers.beat_check, worker_id, running, self.thresholds
                )
            except Refused:
                self.quiet.pop(worker_id, None)  # no longer registered
                raise
            if not changes:
                if not running:
                    self.quiet[worker_id] = generation
                self.beats[worker_id] = (self.clock(), running)
                return stop, ttls
        self.beats.pop(worker_id, None)  # older than the one written now
        return await self.db.write(workers.beat, worker_id, running, self.thresholds)

    async def flush_beats(self) -> int:
        """Write the heartbeats kept in memory, in one transaction; how many."""
        if not self.beats:
            return 0
        beats, self.beats = self.beats, {}
        rows_ = [(w, at, running) for w, (at, running) in beats.items()]
        return await self.db.write_soft(workers.touch_beats, rows_, self.thresholds)

    async def _beat_loop(self) -> None:
        while True:
            await asyncio.sleep(self.cfg.heartbeat_flush)
            try:
                await self.flush_beats()
            except NotLeader as e:
                _fenced("writing heartbeats failed", e)
            except Exception:
                log.exception("writing heartbeats failed")

    # -- hand-out ----------------------------------------------------------

    async def handout(self, worker_id: str):
        """Assignments not yet handed to this worker, and kills due.

        Hand-out writes nothing for assignments: the ledger in memory
        (`handouts`, rc.controller.handout) says which assigned jobs were
        handed out already.
        """

        assigned, due = await self.db.read(jobs.pending_for, worker_id, self.cfg.kill_redelivery)
        fresh = self.handouts.fresh(worker_id, assigned)
        kills: list[int] = []
        if due:
            kills = await self.db.write(jobs.deliver_kills, worker_id, self.cfg.kill_redelivery)
        return fresh, kills

    async def handout_assigned(self, worker_id: str):
        """Every job assigned to this worker and not yet running (Assignments,
        id order), for the reply to its reports (rc.controller.api.workers.reports).

        All of them, not only those never handed out: a worker whose reply
        was lost gets them in the reply to its retry (it never starts a job
        id and restart count twice). They count as handed out, so the long
        poll does not answer for them again.
        """
        assigned = await self.db.read(jobs.assigned_to, worker_id)
        self.handouts.handed(worker_id, assigned)
        return assigned
