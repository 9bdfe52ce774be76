"""The real controller in-process on a fake clock, for tests of its rules.

`Lab` drives the real transaction functions the HTTP routes call
(validate_submit → jobs.enqueue, jobs.release, jobs.kill, workers.register,
Controller.kick) against a real SQLite file; nothing is mocked. Scheduling,
explain and recovery tests build on it.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import zlib
from pathlib import Path

from rc.controller.auth import Caller, hash_secret, new_secret
from rc.controller.config import ControllerConfig
from rc.controller.core import Controller
from rc.controller.store import jobs, rows, tokens, views, workers
from rc.controller.submission import validate_submit
from rc.proto.model import Job, JobKind, JobState, Role
from rc.proto.wire import (
    DeviceDecl,
    DeviceLink,
    JobExplanation,
    RegisterRequest,
    SubmitRequest,
)

__all__ = ["ENGINE", "T0", "Lab", "local_user"]

T0 = 1_800_000_000.0


def local_user(name: str, role: Role = Role.USER) -> Caller:
    """A caller as the local socket makes one for Unix user `name`: the
    principal uid:<n> (a made-up uid, the same for the same name in every
    Lab: a restart keeps who owns what), its jobs run as `name`."""
    return Caller(0, name, role, unix_user=name, uid=60_000 + zlib.crc32(name.encode()) % 10**6)


class _Engine:
    """Which store engine a Lab made without `database=` uses: SQLite unless
    the `engine` fixture (tests/conftest.py) set `new_database`, a function
    returning (DSN of a fresh PostgreSQL database, a function dropping it)."""

    new_database = None
    by_data: dict[str, str] = {}  # noqa: RUF012 - one registry for the session
    """Data dir given to a Lab → its database, so that a later Lab on that
    dir (a controller restart) finds the state the first one left."""


ENGINE = _Engine()


class Lab:
    """A Controller (no background loops) over a fresh data dir, fake clock `now`.

    `config` is passed on to ControllerConfig (thresholds, retention...);
    without `database` the engine is ENGINE's (SQLite, or PostgreSQL under
    the `engine` fixture's postgresql parameter).
    `now`: the clock when the controller starts (a restart on the same data
    starts later than T0).
    """

    def __init__(
        self,
        data: Path | None = None,
        *,
        aging: float = 0.0,
        cap: int = 0,
        now: float = T0,
        **config,
    ) -> None:
        self._own = data is None
        self._drop = None
        if "database" not in config and ENGINE.new_database is not None:
            if data is None:
                config["database"], self._drop = ENGINE.new_database()
            else:  # a Lab on the same data dir is the same controller again (a restart)
                if str(data) not in ENGINE.by_data:
                    ENGINE.by_data[str(data)] = ENGINE.new_database()[0]
                config["database"] = ENGINE.by_data[str(data)]
        self.data = Path(data or tempfile.mkdtemp(prefix="rc-lab-"))
        self.now = now
        self.loop = asyncio.new_event_loop()
        config.setdefault("max_user_priority", 10)  # tests of the policy give their own
        cfg = ControllerConfig(
            data_dir=str(self.data), aging=aging, max_devices_per_user=cap, **config
        )
        self.ctl = Controller(cfg, clock=lambda: self.now)
        self.run(self.ctl.start(loops=False))

    def close(self) -> None:
        self.run(self.ctl.stop())
        self.loop.close()
        if self._drop is not None:
            self._drop()
        if self._own:
            shutil.rmtree(self.data, ignore_errors=True)

    def run(self, coro):
        return self.loop.run_until_complete(coro)

    def write(self, fn, *args):
        return self.run(self.ctl.db.write(fn, *args))

    def read(self, fn, *args):
        return self.run(self.ctl.db.read(fn, *args))

    # -- the fleet -----------------------------------------------------------

    def register(
        self,
        host: str,
        devices: dict[str, tuple[int, dict[str, str]]],
        boot_id: str = "boot-1",
        links: tuple[DeviceLink, ...] | None = None,
        **runs_as,
    ) -> None:
        """Register `host` with {name: (ceiling seconds, detected labels)} and
        its topology (`links`; None keeps what is stored); `runs_as`:
        RegisterRequest's run_as, shared_account, allow_root_jobs (default: a
        root worker running each job as its own user)."""
        req = RegisterRequest(
            host=host,
            boot_id=boot_id,
            devices=tuple(DeviceDecl(name, ceiling) for name, (ceiling, _) in devices.items()),
            labels={name: dict(labels) for name, (_, labels) in devices.items()},
            links=links,
            **runs_as,
        )
        self.write(workers.register, req, self.ctl.match_cache, self.ctl.thresholds)

    def heartbeat(self, host: str, named: tuple[int, ...] = ()):
        """A heartbeat as POST /v1/workers/{host}/heartbeat makes it
        (Controller.heartbeat: coalesced unless it changes state). Returns
        (jobs to stop, hold ttls)."""
        return self.run(self.ctl.heartbeat(host, tuple(named)))

    # -- jobs ------------------------------------------------------------------

    def token(self, name: str, role: Role = Role.USER, unix_user: str | None = None) -> Caller:
        """A new live API token `name` whose jobs run as `unix_user` (its
        name unless given; none for a worker token), as the caller its
        secret authenticates (principal token:<id>)."""
        if unix_user is None:
            unix_user = "" if role is Role.WORKER else name
        t = self.write(
            tokens.create, name, role, hash_secret(new_secret()), "admin", None, unix_user
        ).token
        return Caller(t.id, name, role, t.host, None, t.unix_user)

    def submit(self, who: str | Caller = "alice", **fields) -> tuple[int, bool]:
        """validate_submit + enqueue, as POST /v1/jobs does, for `who` (a
        name: that local user, local_user; or a Caller). Returns (id,
        created); raises Refused. A job gets command ("true",) unless given one."""
        return self.run(self.submit_async(who, **fields))

    async def submit_async(self, who: str | Caller = "alice", **fields) -> tuple[int, bool]:
        """`submit` for a coroutine already running on the lab's loop."""
        if fields.get("kind", JobKind.JOB) is JobKind.JOB:
            fields.setdefault("command", ("true",))
        if not fields.get("device_id") and not fields.get("device_ids"):
            fields.setdefault("selector", "*")
        new = validate_submit(
            SubmitRequest(**fields),
            local_user(who) if isinstance(who, str) else who,
            self.ctl.cfg.limits,
            self.ctl.policy.cap,
            self.ctl.cfg.max_user_priority,
        )
        if self.ctl.policy.shares is not None:
            self.ctl.policy.shares.note_submitter(new.unix_user or "")
        return await self.ctl.db.write(jobs.enqueue, new, self.ctl.match_cache)

    def job(self, job_id: int) -> Job:
        return self.read(lambda tx: rows.job(tx.one("job_get", (job_id,))))

    def finish(self, job_id: int, state: JobState = JobState.SUCCEEDED) -> None:
        """The worker reports the job ended (releases its device; a pass follows)."""
        j = self.job(job_id)
        self.write(jobs.release, job_id, j.worker_id, state, 0, "", None)

    def kill(self, job_id: int, who: str | Caller = "alice") -> str:
        return self.write(jobs.kill, job_id, local_user(who) if isinstance(who, str) else who, "")

    def kick(self) -> None:
        self.run(self.ctl.kick())

    def explain(self, job_id: int) -> JobExplanation:
        return self.read(views.explain_job, job_id, self.ctl.policy)

    def running_on(self, device_id: str) -> int | None:
        def q(tx):
            return next(
                (r["job_id"] for r in tx.all("leases_live") if r["device_id"] == device_id), None
            )

        return self.read(q)
