"""rc's Python API: submit jobs, wait for them, read their logs, kill them,
list jobs and devices, from a script or a notebook (README "A Python API").

Standard library only (it ships in dist/rc.pyz beside rc.cli), and it speaks
exactly as the CLI does: the client vocabulary of rc.proto.calls, the
records of rc.proto.wire and rc.proto.model, and the CLI's credential
discovery (rc.cli.context.client: --controller/--token become `controller=`
and `token=`, else RC_CONTROLLER/RC_TOKEN, the config file, or on the
controller's own box its local socket, so a user of `rc up` needs no token).

    import rc.api

    job = rc.api.submit(["python", "train.py", "--lr", "3e-4"], selector="kind=gpu",
                        name="lr-sweep", max_runtime=3600)
    done = job.wait()                  # the rc.proto.model.Job once it has ended
    print(done.state, done.exit_code)  # JobState.SUCCEEDED 0
    print(job.logs())                  # its stored output, as text

    for j in rc.api.jobs(state="running"):   # the caller's own, newest first
        j.kill("superseded")
    free = [d for d in rc.api.devices() if d.device.state == "ready"]

The module-level functions use one connection, made at first use with the
CLI's resolution (`connection()`); `connect(controller=..., token=...)`
makes another, with the same methods. Errors are rc's (rc.proto.errors):
ApiError (the controller refused: `.code` is an ErrorCode value such as
"bad_selector", `.status` the HTTP status, `.message` the words),
TransportError (no controller answers), RcError (no credentials found,
WaitTimeout); bad arguments raise BadArgument (an RcError and a ValueError)
before anything is sent. Times are seconds since the epoch, durations
seconds, sizes bytes. A submit carries a fresh idempotency key and is
retried over transport failures for up to 30 s (rc.cli.follow.submit,
which says so once on stderr), so it never makes two jobs.
"""

from __future__ import annotations

import argparse
import dataclasses
import io
import threading
import time
import types
import typing
import uuid
from collections.abc import Iterable, Sequence
from typing import Any, TypeVar

from rc.proto import calls, wire
from rc.proto.client import Client
from rc.proto.codec import decode
from rc.proto.errors import ApiError, RcError, TransportError
from rc.proto.model import Job as JobRecord
from rc.proto.model import JobState, valid_device_id, valid_env_name, valid_job_name

__all__ = [
    "TERMINAL",
    "ApiError",
    "BadArgument",
    "Connection",
    "Job",
    "RcError",
    "TransportError",
    "WaitTimeout",
    "connect",
    "connection",
    "devices",
    "explain",
    "job",
    "jobs",
    "submit",
    "usage",
    "whoami",
]

T = TypeVar("T")

TERMINAL = frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.KILLED, JobState.LOST})
"""The states a job ends in (never left again)."""
WAIT_POLL_S = 50.0
"""The longest long poll of Job.wait (the controller takes at most 60 s)."""
JOBS_PAGE_MAX = 1000
"""The most jobs one `jobs()` call lists (GET /v1/jobs' own page limit)."""
LOG_TAIL_MAX = 64 << 20
"""The most bytes `Job.logs(tail_bytes=...)` asks for in one request."""


class BadArgument(RcError, ValueError):
    """An argument of this API is wrong in a way seen before anything is
    sent (a command that is not a list of strings, a bad device id)."""


class WaitTimeout(RcError, TimeoutError):
    """Job.wait(timeout=...) passed its timeout with the job still on;
    `.job` is the job's last record."""

    def __init__(self, job: JobRecord, timeout: float) -> None:
        super().__init__(f"job {job.id} is still {job.state.value} after {timeout:g} s")
        self.job = job


def _known(tp: Any, data: Any) -> Any:
    """`data` with the fields no record of `tp` declares left out, at every
    depth: a newer controller may answer fields this client does not know
    yet, which rc.proto.codec.decode (strict, for the controller's own
    input) would refuse."""
    if dataclasses.is_dataclass(tp) and isinstance(data, dict):
        hints = typing.get_type_hints(tp)
        return {k: _known(hints[k], v) for k, v in data.items() if k in hints}
    origin = typing.get_origin(tp)
    if origin is typing.Union or origin is types.UnionType:
        rest = [a for a in typing.get_args(tp) if a is not type(None)]
        return _known(rest[0], data) if len(rest) == 1 and data is not None else data
    if origin is tuple and isinstance(data, list):
        return [_known(typing.get_args(tp)[0], v) for v in data]
    if origin is dict and isinstance(data, dict):
        vt = typing.get_args(tp)[1]
        return {k: _known(vt, v) for k, v in data.items()}
    return data


def _record(cls: type[T], data: Any) -> T:
    """A wire record from an answer (unknown fields dropped; WireError, an
    RcError, for one that does not fit)."""
    return decode(cls, _known(cls, data))


class Job:
    """A handle on one job of the controller: its `id` and its last
    `record` (rc.proto.model.Job, as last read; `refresh()` reads it again).
    `state`, `exit_code` and `name` are the record's."""

    def __init__(self, conn: Connection, record: JobRecord, queue_position: int = 0) -> None:
        self.conn = conn
        self.record = record
        self.queue_position = queue_position
        """1-based position in the queue while queued, as last read (0 otherwise)."""

    def __repr__(self) -> str:
        return f"<rc.api.Job {self.id} {self.state.value}>"

    @property
    def id(self) -> int:
        """The job's id."""
        return self.record.id

    @property
    def state(self) -> JobState:
        """Its state as last read (rc.proto.model.JobState)."""
        return self.record.state

    @property
    def exit_code(self) -> int | None:
        """Its exit code once it ended on its own (None before, or when killed before exiting)."""
        return self.record.exit_code

    @property
    def name(self) -> str:
        """Its name ("" for none)."""
        return self.record.name

    @property
    def done(self) -> bool:
        """Whether the job has ended (as last read)."""
        return self.record.state in TERMINAL

    def refresh(self) -> JobRecord:
        """Read the job again (calls.JOB_GET); returns the new record.
        Raises ApiError not_found for a job this caller may not see."""
        view = _record(wire.JobView, self.conn.client.call(calls.JOB_GET, self.id))
        self.record, self.queue_position = view.job, view.queue_position
        return view.job

    def wait(self, timeout: float | None = None) -> JobRecord:
        """Block until the job has ended; returns its final record
        (`.state`, `.exit_code`, `.kill_reason`). Long polls the controller
        (at most WAIT_POLL_S a request) and rides out a controller restart
        (transport failures are retried with a backoff up to 5 s, for up to
        5 minutes in a row). `timeout` in seconds (None: no limit) raises
        WaitTimeout when it passes first; the job goes on either way."""
        deadline = None if timeout is None else time.monotonic() + timeout
        failing_since, delay = None, 0.2
        while self.record.state not in TERMINAL:
            left = WAIT_POLL_S if deadline is None else deadline - time.monotonic()
            if left <= 0:
                raise WaitTimeout(self.record, timeout)
            poll = max(1, min(WAIT_POLL_S, int(left)))
            try:
                got = self.conn.client.call(
                    calls.JOB_GET,
                    self.id,
                    params={
                        "wait": f"{poll}s",
                        "state": self.record.state.value,
                        "position": self.queue_position,  # answered when either moves
                    },
                    timeout=poll + 15,
                )
            except TransportError:
                now = time.monotonic()
                failing_since = failing_since or now
                if now - failing_since > 300:
                    raise
                time.sleep(delay)
                delay = min(delay * 2, 5.0)
                continue
            failing_since, delay = None, 0.2
            view = _record(wire.JobView, got)
            self.record, self.queue_position = view.job, view.queue_position
        return self.record

    def logs(
        self,
        *,
        offset: int = 0,
        tail_bytes: int | None = None,
        follow: bool = False,
        encoding: str | None = "utf-8",
    ) -> str | bytes:
        """The job's stored output (stdout and stderr, one stream) from byte
        `offset`, or its last `tail_bytes` bytes (at most LOG_TAIL_MAX);
        with `follow`, streamed until the job ends (resuming from the byte
        reached after a broken connection, rc.cli.follow.follow_log).
        Decoded with `encoding` (invalid bytes replaced), or bytes when it
        is None. A queued job has no output yet (""). Only the job's owner
        or an admin may read it (ApiError not_job_owner); a tty or pipe job's
        output is never stored (ApiError logs_not_stored)."""
        if tail_bytes is not None:
            if not 0 < tail_bytes <= LOG_TAIL_MAX:
                raise BadArgument(f"tail_bytes must be 1..{LOG_TAIL_MAX}, not {tail_bytes}")
            got = self.conn.client.call(calls.JOB_GET, self.id, params={"detail": "1"})
            size = (got.get("detail") or {}).get("log_bytes", 0)
            offset = max(0, size - tail_bytes)
        if offset < 0:
            raise BadArgument(f"offset must be 0 or more, not {offset}")
        if follow:
            from rc.cli.follow import follow_log

            buf = io.BytesIO()
            follow_log(self.conn.client, self.id, buf, offset=offset, follow=True)
            data = buf.getvalue()
        else:
            data = self.conn.client.call(
                calls.JOB_LOGS, self.id, params={"offset": offset, "follow": "0"}
            )
        return data if encoding is None else data.decode(encoding, "replace")

    def kill(self, reason: str = "") -> str:
        """Kill the job, or cancel it while queued (calls.JOB_KILL); returns
        what the controller did, in words. The kill is asked for: `wait()`
        sees it end. Raises ApiError not_cancellable (it has ended already),
        not_job_owner."""
        got = _record(
            wire.ActionResult,
            self.conn.client.call(calls.JOB_KILL, self.id, body=wire.KillRequest(reason)),
        )
        return got.message or f"kill requested for {self.id}"

    def explain(self) -> wire.JobExplanation:
        """Why the job is not running, in sentences (calls.JOB_EXPLAIN; `rc explain JOB`)."""
        return _record(wire.JobExplanation, self.conn.client.call(calls.JOB_EXPLAIN, self.id))


def _command(command: Sequence[str]) -> tuple[str, ...]:
    if isinstance(command, (str, bytes)) or not isinstance(command, Iterable):
        raise BadArgument(
            "command is a list of strings, the argv of the job (['python', 'train.py']); "
            "for a shell line give ['sh', '-c', LINE]"
        )
    argv = tuple(command)
    if not argv or not all(isinstance(a, str) for a in argv):
        raise BadArgument("command must be a non-empty list of strings")
    return argv


def _target(selector: str | None, device: str | Sequence[str] | None, count: int) -> dict:
    """The submit's target fields, as rc.cli.follow.target builds them."""
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise BadArgument(f"count must be a whole number of at least 1, not {count!r}")
    if device is not None:
        if selector is not None:
            raise BadArgument("give a selector or a device, not both")
        pins = (device,) if isinstance(device, str) else tuple(device)
        bad = [d for d in pins if not isinstance(d, str) or not valid_device_id(d)]
        if not pins or bad:
            raise BadArgument(f"{bad[0] if bad else device!r} is not a device id (host:name)")
        if count not in (1, len(pins)):
            raise BadArgument(f"count {count} but {len(pins)} devices named")
        if len(pins) == 1:
            return {"device_id": pins[0]}
        return {"device_ids": list(pins), "count": len(pins)}
    sel = "*" if selector is None else selector
    if not isinstance(sel, str) or not sel.strip():
        raise BadArgument("selector must be a non-blank string ('*' for any device)")
    return {"selector": sel, "count": count}


def _env(env: dict[str, str] | None) -> dict[str, str]:
    env = dict(env or {})
    for k, v in env.items():
        if not isinstance(k, str) or not valid_env_name(k):
            raise BadArgument(f"{k!r} is not an environment variable name")
        if not isinstance(v, str) or "\0" in v:
            raise BadArgument(f"the value of {k} must be a string without NUL")
    return env


class Connection:
    """One controller and one identity: every function of this module as a
    method. Thread-safe (the client keeps one connection per thread).
    `client` is the rc.proto.client.Client (or the local socket's
    LocalClient) it sends with."""

    def __init__(self, client: Client) -> None:
        self.client = client

    def close(self) -> None:
        """Close its kept-alive connections."""
        self.client.close_all()

    def whoami(self) -> wire.WhoAmI:
        """Who this connection acts as (calls.WHOAMI): name, role, Unix user, principal."""
        return _record(wire.WhoAmI, self.client.call(calls.WHOAMI))

    def submit(
        self,
        command: Sequence[str],
        *,
        selector: str | None = None,
        device: str | Sequence[str] | None = None,
        count: int = 1,
        name: str = "",
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        priority: int = 0,
        max_runtime: int = 0,
        idle_timeout: int = 0,
        no_wait: bool = False,
        after: Sequence[str] = (),
        array: str = "",
        array_items: Sequence[str] = (),
        requeue_on_hardware: bool = True,
        idempotency_key: str | None = None,
    ) -> Job:
        """Submit a job (calls.JOB_SUBMIT) and return its handle at once
        (queued, or assigned when a device was free). As `rc run`:

        - `command`: the argv (a list of strings; a shell line is
          ['sh', '-c', LINE]).
        - `selector` ('*' when neither it nor `device` is given: any device)
          or `device` (a device id host:name, or a list of one host's
          devices in the order the job sees them); `count` devices of one
          host (1..64).
        - `cwd`: the directory the job runs in (default: this process's,
          made absolute); `env`: the job's environment additions (names
          [A-Za-z_][A-Za-z0-9_]*; nothing of this process's is sent
          unless given).
        - `priority` (-10..10; above 0 may need an admin), `max_runtime` and
          `idle_timeout` in whole seconds (0: the device's ceiling, none);
          `no_wait`: refuse (ApiError no_device_available) instead of queueing.
        - `after`: dependencies, "JOB[:ok|:notok|:any]"; `array` an array
          spec ("0-9%2"), `array_items` one item per element (RC_ARRAY_ITEM).
        - `idempotency_key`: the same key with the same request returns the
          same job (default: a fresh one per call).

        Raises BadArgument for a bad argument, ApiError for the
        controller's refusals (bad_selector, no_matching_device,
        runtime_above_ceiling, queue_full, ...: rc.proto.calls.JOB_SUBMIT),
        TransportError when no controller answers for 30 s."""
        from rc.cli.context import job_cwd
        from rc.cli.follow import submit as post_submit

        if not isinstance(name, str) or (name and not valid_job_name(name)):
            raise BadArgument(f"{name!r} is not a job name (see rc run --name)")
        for label, n in (
            ("priority", priority),
            ("max_runtime", max_runtime),
            ("idle_timeout", idle_timeout),
        ):
            if isinstance(n, bool) or not isinstance(n, int):
                raise BadArgument(f"{label} must be a whole number (seconds), not {n!r}")
        body = {
            **_target(selector, device, count),
            "command": list(_command(command)),
            "cwd": job_cwd(cwd),
            "env": _env(env),
            "idempotency_key": idempotency_key or uuid.uuid4().hex,
            "priority": priority,
            "max_runtime_seconds": max_runtime,
            "idle_timeout_seconds": idle_timeout,
            "no_wait": bool(no_wait),
            "name": name,
            "array": array,
            "array_items": list(array_items),
            "after": list(after),
        }
        if not requeue_on_hardware:
            body["requeue_on_hardware"] = False
        view = _record(wire.JobView, post_submit(self.client, body))
        return Job(self, view.job, view.queue_position)

    def job(self, job_id: int) -> Job:
        """A handle on job `job_id` (read now). Raises ApiError not_found."""
        if isinstance(job_id, bool) or not isinstance(job_id, int) or job_id < 1:
            raise BadArgument(f"a job id is a whole number of at least 1, not {job_id!r}")
        view = _record(wire.JobView, self.client.call(calls.JOB_GET, job_id))
        return Job(self, view.job, view.queue_position)

    def jobs(
        self,
        *,
        mine: bool = True,
        user: str | None = None,
        state: str | Sequence[str] | None = None,
        name: str | None = None,
        since: float | None = None,
        array: int | None = None,
        limit: int = 20,
    ) -> list[Job]:
        """Jobs newest first (calls.JOBS), at most `limit` (1..1000): the
        caller's own (`mine`, the default) or everyone's (mine=False), or
        those run as Unix `user`; `state` one state or several ("running",
        ["queued", "running"]); `name` a glob; `since` epoch seconds;
        `array` an array's id. Commands and reasons come cut to 256
        characters (`job(id)` or Job.refresh() has them whole)."""
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= JOBS_PAGE_MAX:
            raise BadArgument(f"limit must be 1..{JOBS_PAGE_MAX}, not {limit!r}")
        states = [state] if isinstance(state, str) else list(state or ())
        bad = [s for s in states if s not in {m.value for m in JobState}]
        if bad:
            allowed = ", ".join(m.value for m in JobState)
            raise BadArgument(f"{bad[0]!r} is not a job state ({allowed})")
        params: dict[str, Any] = {"limit": limit}
        if mine and user is None:
            params["mine"] = "1"
        if user is not None:
            params["user"] = user
        if states:
            params["state"] = ",".join(states)
        if name is not None:
            params["name"] = name
        if since is not None:
            params["since"] = since
        if array is not None:
            params["array"] = array
        page = _record(wire.JobList, self.client.call(calls.JOBS, params=params))
        return [Job(self, j) for j in page.jobs]

    def devices(self) -> list[wire.DeviceView]:
        """Every device and who holds it (calls.DEVICES): `.device` (id,
        host, state, labels, quarantine), `.holder`, `.job_id`, `.kind`..."""
        return list(_record(wire.DeviceList, self.client.call(calls.DEVICES)).devices)

    def explain(self, selector: str) -> wire.ExplainResponse:
        """Which devices `selector` matches and which are free, and the queue
        depth (calls.EXPLAIN). Raises ApiError bad_selector."""
        if not isinstance(selector, str) or not selector.strip():
            raise BadArgument("selector must be a non-blank string ('*' for any device)")
        got = self.client.call(calls.EXPLAIN, params={"selector": selector})
        return _record(wire.ExplainResponse, got)

    def usage(self, since: str = "30d", by: str = "user", user: str | None = None):
        """The usage ledger over the last `since` (a duration such as "7d"),
        one row `by` user, host, device, day or week (calls.USAGE): a
        wire.UsageReport (device-seconds, jobs by state, wait percentiles).
        Raises ApiError bad_request for a bad duration or `by`."""
        params = {"since": since, "by": by}
        if user is not None:
            params["user"] = user
        return _record(wire.UsageReport, self.client.call(calls.USAGE, params=params))


def connect(
    controller: str | None = None,
    token: str | None = None,
    cacert: str | None = None,
    *,
    timeout: float = 60.0,
    headers: dict[str, str] | None = None,
) -> Connection:
    """A Connection resolved as the CLI resolves one (rc.cli.context.client):
    `controller` (a URL, a comma list of a controller and its standbys, or
    unix:///PATH), `token` and `cacert` as --controller, --token and
    --cacert; each None falls back to RC_CONTROLLER / RC_TOKEN, the config
    file (~/.config/rc/config.toml), then the local socket of a controller
    on this box. `timeout`: the read timeout of an ordinary request, in
    seconds. `headers` go on every request (rc mcp sends rc.proto.VIA_HEADER).
    Raises RcError when no token is found and no local socket exists."""
    from rc.cli.context import client

    args = argparse.Namespace(controller=controller, token=token, cacert=cacert)
    c = client(args, timeout=timeout)
    if headers:
        c.headers.update(headers)
    return Connection(c)


_default: Connection | None = None
_default_lock = threading.Lock()


def connection() -> Connection:
    """The connection the module-level functions use, made at first use by
    `connect()` with no arguments (the CLI's resolution)."""
    global _default
    with _default_lock:
        if _default is None:
            _default = connect()
        return _default


def whoami() -> wire.WhoAmI:
    """Connection.whoami on the default connection."""
    return connection().whoami()


def submit(command: Sequence[str], **kw: Any) -> Job:
    """Connection.submit on the default connection (same arguments)."""
    return connection().submit(command, **kw)


def job(job_id: int) -> Job:
    """Connection.job on the default connection."""
    return connection().job(job_id)


def jobs(**kw: Any) -> list[Job]:
    """Connection.jobs on the default connection (same arguments)."""
    return connection().jobs(**kw)


def devices() -> list[wire.DeviceView]:
    """Connection.devices on the default connection."""
    return connection().devices()


def explain(selector: str) -> wire.ExplainResponse:
    """Connection.explain on the default connection."""
    return connection().explain(selector)


def usage(since: str = "30d", by: str = "user", user: str | None = None) -> wire.UsageReport:
    """Connection.usage on the default connection."""
    return connection().usage(since, by, user)
