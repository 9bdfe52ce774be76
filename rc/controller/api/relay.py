"""Relay routes and sessions inside holds (docs/design.md#the-relay).

The four halves of a job's terminal or pipe session:

    GET  /v1/jobs/{id}/tty/out   client reads output      (owner or admin)
    POST /v1/jobs/{id}/tty/in    client writes input      (owner or admin)
    POST /v1/jobs/{id}/tty/out   worker writes output     (the job's worker)
    GET  /v1/jobs/{id}/tty/in    worker reads input       (the job's worker)

and the same four under /v1/jobs/{hold}/sessions/{sid}/tty/... for a session
inside a hold, which is started with POST /v1/jobs/{hold}/sessions, watched
with GET /v1/jobs/{hold}/sessions/{sid}?wait=S&state=X and reported on by the
worker with POST /v1/jobs/{hold}/sessions/{sid}/status.

A job half reads the database once (does the job exist, who owns it, is it a
tty or pipe job still running); a session half reads only relay memory.
Someone else's token gets 403 not_job_owner (clients) or not_worker_job
(workers). The halves are raw ASGI endpoints: a POST half answers its status
line at once and streams its request body into the session while the
response stays open (HTTP/1.1 full duplex), ending it with one JSON line,
`{"ok": true}` or `{"ended": "<why>"}` (rc.proto.relay).
"""

from __future__ import annotations

import asyncio
import time

import orjson
from starlette.requests import Request
from starlette.types import Receive, Scope, Send

from rc.controller.api import Role, caller, ctl, json_body, path_int, query_float, reply
from rc.controller.auth import Caller
from rc.controller.errors import Refused
from rc.controller.relay import Ended, Pipe, Relay, Session
from rc.controller.store import jobs, usage
from rc.controller.submission import validate_submit
from rc.proto.errors import ErrorCode
from rc.proto.model import JobKind, JobState, Stdio
from rc.proto.wire import SubmitRequest

__all__ = ["Half", "get_session", "open_session", "report_session"]

DRAIN_S = 5.0
"""After ending a POST half early, how long its leftover body is read and
dropped while the sender notices (so the server never stalls on it)."""
SESSION_STATES = ("running", "ended")


def _owner_check(who: Caller, owner: str, label: str, what: str) -> None:
    """403 not_job_owner unless `who` owns (Caller.owns) what the principal
    `owner` owns; `label` names that owner in the refusal."""
    if not who.owns(owner):
        raise Refused(
            ErrorCode.NOT_JOB_OWNER,
            f"{what} belongs to {label}; only its owner or an admin may attach to it",
        )


def _worker_check(who: Caller, worker: str, what: str) -> None:
    if who.role is Role.WORKER and who.host != worker:
        raise Refused(
            ErrorCode.NOT_WORKER_JOB, f"{what} does not run on {who.host or 'this worker'}"
        )


async def _job_session(request: Request, who: Caller, side: str) -> Session:
    c = ctl(request)
    job_id = path_int(request)
    job = await c.db.read(jobs.brief, job_id)
    if job is None:
        raise Refused(ErrorCode.NOT_FOUND, f"no job {job_id}")
    what = f"job {job_id}"
    if side == "client":
        _owner_check(who, job.owner, job.submitter, what)
    else:
        _worker_check(who, job.worker_id, what)
    stdio = job.stdio
    if not stdio.attached:
        raise Refused(
            ErrorCode.NOT_ATTACHED,
            f"{what} has no terminal or pipe; its output is in its log (rc logs {job_id})",
        )
    if job.state.terminal:
        # a job that ended before its client attached (a short command, a
        # client still waiting to hear it started) may still have output in
        # the relay: the client reads it; anything else has ended for good
        live = c.relay.live_job_session(job_id)
        if side == "client" and live is not None:
            return live
        raise Refused(ErrorCode.SESSION_ENDED, f"{what} has ended ({job.state.value})")
    return c.relay.for_job(job_id, job.owner, job.worker_id, stdio, job.submitter)


def _hold_session(request: Request) -> Session:
    c = ctl(request)
    hold_id, sid = path_int(request), path_int(request, "sid")
    s = c.relay.get(hold_id, sid)
    if s is None or s.start is None:
        raise Refused(
            ErrorCode.NOT_FOUND,
            f"no session {sid} in hold {hold_id} (a session is forgotten "
            "10 minutes after it ends, and when the controller restarts)",
        )
    return s


class Half:
    """One relay half as a raw ASGI endpoint: `half` is side_direction
    (client_out, client_in, worker_out, worker_in); `in_hold` for the halves
    of a session inside a hold."""

    def __init__(self, half: str, in_hold: bool) -> None:
        self.half = half
        self.side = half.partition("_")[0]
        self.in_hold = in_hold

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        request = Request(scope, receive)
        c = ctl(request)
        who = caller(request)
        if self.in_hold:
            s = _hold_session(request)
            what = f"session {s.key[1]} of hold {s.key[0]}"
            if self.side == "client":
                _owner_check(who, s.owner, s.label, what)
            else:
                _worker_check(who, s.worker, what)
        else:
            s = await _job_session(request, who, self.side)
        relay: Relay = c.relay
        relay.attach(s, self.half)
        stop = c.hub.waiter("relay")  # set when the controller shuts down
        try:
            if self.half == "client_out":
                await _reader(relay, s, s.out, self.half, receive, send, stop)
            elif self.half == "worker_in":
                await _reader(relay, s, s.inp, self.half, receive, send, stop)
            elif self.half == "worker_out":
                await _writer(relay, s, s.out, self.half, receive, send, stop)
            else:
                await _writer(relay, s, s.inp, self.half, receive, send, stop)
        finally:
            relay.detach(s, self.half)


async def _start(send: Send, media_type: str) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [(b"content-type", media_type.encode()), (b"cache-control", b"no-store")],
        }
    )


async def _disconnected(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def _first(*aws) -> set:
    tasks = [asyncio.ensure_future(a) for a in aws]
    done, pending = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    for t in pending:
        t.cancel()
    return {tasks.index(t) for t in done}


async def _reader(
    relay: Relay,
    s: Session,
    pipe: Pipe,
    half: str,
    receive: Receive,
    send: Send,
    stop: asyncio.Event,
) -> None:
    """A GET half: the pipe's bytes as a streamed response. A clean end of the
    output (everything read) ends the session; the reader going away ends it
    too (client) or closes the process's input (worker)."""
    await _start(send, "application/octet-stream")
    watch = asyncio.ensure_future(_watch_reader(relay, s, pipe, half, receive, stop))
    try:
        while True:
            try:
                data = await pipe.get()
            except Ended:
                return  # abrupt: no closing chunk, so the reader knows it broke
            if data is None:
                await send({"type": "http.response.body", "body": b"", "more_body": False})
                if half == "client_out":
                    relay.finish(s, "the output ended", clean=True)
                return
            await send({"type": "http.response.body", "body": data, "more_body": True})
    finally:
        watch.cancel()


async def _watch_reader(
    relay: Relay, s: Session, pipe: Pipe, half: str, receive: Receive, stop: asyncio.Event
) -> None:
    """Wake a GET half's loop (through its pipe) when its reader goes away or
    the controller stops."""
    why = await _first(_disconnected(receive), stop.wait())
    if 1 in why:
        relay.finish(s, "the controller is shutting down")
    elif half == "client_out":
        relay.finish(s, "the client went away")
    else:
        pipe.breaks("the process's input was closed")


async def _pump(receive: Receive, pipe: Pipe, used=None) -> str:
    """A POST half's body into `pipe`; `used()` is called for every chunk
    (the idle rule's clock, see _activity)."""
    while True:
        msg = await receive()
        if msg["type"] == "http.disconnect":
            return "disconnect"
        body = msg.get("body")
        if body:
            if used is not None:
                used()
            await pipe.put(body)
        if not msg.get("more_body", False):
            return "complete"


async def _writer(
    relay: Relay,
    s: Session,
    pipe: Pipe,
    half: str,
    receive: Receive,
    send: Send,
    stop: asyncio.Event,
) -> None:
    """A POST half: its body into the pipe. The response's status line goes
    out at once; its one JSON line when the half ends."""
    await _start(send, "application/x-ndjson")
    pump = asyncio.ensure_future(_pump(receive, pipe, _activity(relay, s, half)))
    which = await _first(pump, s.done.wait(), stop.wait())
    outcome = None
    if 0 in which:
        try:
            outcome = pump.result()
        except Ended:
            outcome = None
    elif not pump.done():
        pump.cancel()
    if outcome == "complete":
        pipe.close()
        await _line(send, {"ok": True})
        return
    if outcome == "disconnect":
        if half == "worker_out":
            relay.finish(s, "the worker's output connection broke")
        else:
            pipe.close()  # the client's input ended: end of file for the process
        return
    if 2 in which:
        relay.finish(s, "the controller is shutting down")
    await _line(send, {"ended": s.end_reason or pipe.broken or "the session ended"})
    await _drain(receive)


def _activity(relay: Relay, s: Session, half: str):
    """What resets a hold's idle clock in this half (README "Holds: the idle
    rule"): a client's input into any session of the hold, and a forward
    connection's bytes either way. A session's output alone does not (a
    `watch` left running is not use). None for every other half."""
    hold, sid = s.key
    idle = relay.idle
    if not sid or idle is None:
        return None
    if s.forward and half in ("client_in", "worker_out"):
        what = "forward"
    elif half == "client_in":
        what = "input"
    else:
        return None
    clock = relay.wall
    return lambda: idle.touch(hold, clock(), what)


async def _line(send: Send, obj: dict) -> None:
    await send(
        {"type": "http.response.body", "body": orjson.dumps(obj) + b"\n", "more_body": False}
    )


async def _drain(receive: Receive) -> None:
    try:
        async with asyncio.timeout(DRAIN_S):
            while True:
                msg = await receive()
                if msg["type"] == "http.disconnect" or not msg.get("more_body", False):
                    return
    except TimeoutError:
        pass


# -- sessions inside a hold ---------------------------------------------------


async def open_session(request: Request):
    """POST /v1/jobs/{hold}/sessions: start a tty or pipe session in a running
    hold you own (201 with its SessionView). No second lease: it runs under
    the hold's, on the hold's device, and ends when the hold ends. With a
    `port` it is one forward connection (400 bad_request for a port outside
    1..65535 or a command with it)."""
    c = ctl(request)
    who = caller(request)
    hold_id = path_int(request)
    req = await json_body(request, c.cfg.limits.body_bytes)
    hold = await c.db.read(jobs.brief, hold_id)
    if hold is None:
        raise Refused(ErrorCode.NOT_FOUND, f"no job {hold_id}")
    is_hold = hold.kind == JobKind.HOLD
    _owner_check(who, hold.owner, hold.submitter, f"{'hold' if is_hold else 'job'} {hold_id}")
    if not is_hold:
        raise Refused(
            ErrorCode.NOT_A_HOLD,
            f"job {hold_id} is not a hold (sessions run inside holds; "
            "rc run --tty starts a terminal job of its own)",
        )
    if hold.state not in (JobState.ASSIGNED, JobState.RUNNING):
        raise Refused(
            ErrorCode.SESSION_ENDED,
            f"hold {hold_id} has ended ({hold.state.value})"
            if hold.state.terminal
            else f"hold {hold_id} is not granted yet ({hold.state.value})",
        )
    if not req.stdio.attached:
        raise Refused(ErrorCode.BAD_REQUEST, "a session's stdio is tty or pipe")
    if not (0 <= req.rows < 65536 and 0 <= req.cols < 65536):
        raise Refused(ErrorCode.BAD_REQUEST, "rows and cols must be in 0..65535")
    if req.port:
        _check_forward(req)
    else:
        # the same checks as a job's command, cwd and environment
        _check_command(req, hold, who, c.cfg.limits)
    s = c.relay.open_in_hold(
        hold_id, hold.device_ids, hold.worker_id, hold.owner, req, hold.submitter
    )
    await c.db.write(usage.session_opened, hold_id)  # the ledger's idle hold hours
    return reply(s.view(), 201)


def _check_forward(req) -> None:
    """A forward connection: a port in 1..65535, pipe mode, nothing to run."""
    if not 0 < req.port < 65536:
        raise Refused(ErrorCode.BAD_REQUEST, f"port {req.port} is not in 1..65535")
    if req.stdio is not Stdio.PIPE or req.command or req.cwd or req.env:
        raise Refused(
            ErrorCode.BAD_REQUEST,
            "a forward connection is a pipe session with no command, cwd or env",
        )


def _check_command(req, hold, who: Caller, limits) -> None:
    validate_submit(
        SubmitRequest(
            command=req.command,
            device_id=hold.device_id,
            cwd=req.cwd,
            env=req.env,
            stdio=req.stdio,
        ),
        who,
        limits,
    )


async def get_session(request: Request):
    """GET /v1/jobs/{hold}/sessions/{sid}[?wait=S&state=X]: a session's state;
    with `wait`, answers when it differs from X (or after S seconds, max 60)."""
    c = ctl(request)
    who = caller(request)
    s = _hold_session(request)
    _owner_check(who, s.owner, s.label, f"session {s.key[1]} of hold {s.key[0]}")
    wait = query_float(request, "wait", 0.0, 0.0, 60.0)
    seen = request.query_params.get("state", "")
    deadline = time.monotonic() + wait
    key = f"session:{s.key[0]}.{s.key[1]}"
    while True:
        ev = c.hub.waiter(key)
        left = deadline - time.monotonic()
        if s.state != seen or left <= 0 or c.hub.closing:
            return reply(s.view())
        try:
            await asyncio.wait_for(ev.wait(), left)
        except TimeoutError:
            pass


async def report_session(request: Request):
    """POST /v1/jobs/{hold}/sessions/{sid}/status: the worker says a session
    is running, or ended with an exit code (and a pipe session's stderr)."""
    c = ctl(request)
    who = caller(request)
    s = _hold_session(request)
    _worker_check(who, s.worker, f"session {s.key[1]} of hold {s.key[0]}")
    rep = await json_body(request, c.cfg.limits.body_bytes)
    if rep.state not in SESSION_STATES:
        raise Refused(ErrorCode.BAD_REQUEST, "a session report's state is running or ended")
    c.relay.report(s, rep)
    return reply({"ok": True})
