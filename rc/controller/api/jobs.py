"""Client routes on jobs: submit, list, get, kill, logs, explain.

What a submission may hold is checked in rc.controller.submission."""

from __future__ import annotations

import asyncio
import dataclasses
import re
import time

from starlette.requests import Request
from starlette.responses import StreamingResponse

from rc.controller.api import (
    caller,
    ctl,
    free_text,
    json_body,
    path_int,
    query_bool,
    query_float,
    query_int,
    reply,
)
from rc.controller.auth import Caller
from rc.controller.errors import Refused
from rc.controller.scans import scan_or_refuse, survivors_text
from rc.controller.store import edits, jobs, views
from rc.controller.submission import pinned_devices, validate_submit
from rc.proto import VIA_HEADER, VIA_RE
from rc.proto.duration import MAX_SECONDS
from rc.proto.errors import ErrorCode
from rc.proto.model import JOB_NAME_MAX, JobKind, JobState, Stdio
from rc.proto.wire import (
    KILL_MANY_MAX,
    ExtendResult,
    JobList,
    KillManyResult,
    KillOutcome,
    SubmitRequest,
)

__all__ = [
    "explain_job",
    "extend",
    "get_array",
    "get_job",
    "kill",
    "list_jobs",
    "read_logs",
    "submit",
    "update",
]

LOG_READ_CHUNK = 256 << 10
NO_WAIT_REASON = "no-wait: no device was free"
"""The kill reason of a refused no_wait submission in a database from before
such submissions were taken back (jobs.withdraw_queued); still answered 409."""
TOKEN_RECHECK_S = 1.0
"""A log follow re-checks its caller's token this often (a revoked token stops it)."""


_VIA = re.compile(VIA_RE)


def via(request: Request) -> str:
    """The program the caller names with rc.proto.VIA_HEADER ("mcp"), ""
    without one; 400 bad_request for a value not of VIA_RE's form."""
    value = request.headers.get(VIA_HEADER)
    if value is None:
        return ""
    if not _VIA.fullmatch(value):
        raise Refused(
            ErrorCode.BAD_REQUEST,
            f"the {VIA_HEADER} header is 1..16 of a-z, 0-9 and '-', starting with a letter",
        )
    return value


async def submit(request: Request):
    """POST /v1/jobs: 201 with the job (200 for an idempotent replay).

    With no_wait, a job that cannot start at once is taken back (deleted, see
    jobs.withdraw_queued) and the answer is 409 no_device_available: nothing
    is left in the queue, the listings or the history.
    """
    c = ctl(request)
    who = caller(request)
    req = await json_body(request, c.cfg.limits.body_bytes)
    new = validate_submit(
        req, who, c.cfg.limits, c.policy.cap, c.cfg.max_user_priority, c.cfg.export_default
    )
    new = dataclasses.replace(new, via=via(request))
    if c.policy.shares is not None:
        c.policy.shares.note_submitter(new.unix_user or "")
    job_id, created = await c.db.write(jobs.enqueue, new, c.match_cache)
    try:
        view = await c.job_view(job_id)
    except Refused as e:
        if not (req.no_wait and e.status == 404):
            raise
        view = None  # a concurrent duplicate (same key, no_wait too) took it back
    if req.no_wait:
        # A concurrent duplicate (created False) carries no_wait too: either
        # request may take it back, and both then answer 409.
        if view is not None and view.job.state is JobState.QUEUED:
            await c.db.write(jobs.withdraw_queued, job_id)
            view = None
        if view is None or (
            view.job.state is JobState.KILLED and view.job.kill_reason == NO_WAIT_REASON
        ):
            _no_device(req)
    return reply(_visible(view, who), 201 if created else 200)


def _visible(view, who):
    """A JobView as the caller may see it (views.for_caller)."""
    return dataclasses.replace(view, job=views.for_caller(view.job, who))


def _no_device(req: SubmitRequest):
    pins = pinned_devices(req)
    if len(pins) > 1 or (req.count > 1 and not pins):
        target = ", ".join(pins) if pins else f"{req.count} devices matching {req.selector!r}"
        what = "not all free on one host right now" if not pins else "not all free right now"
    else:
        target = pins[0] if pins else f"selector {req.selector!r}"
        what = "no device free right now"
    raise Refused(ErrorCode.NO_DEVICE_AVAILABLE, f"{target}: {what} (no-wait); nothing was queued")


POSITION_SETTLE_S = 0.5
"""The soonest a job's long poll answers a move in the queue that happened
while it waited (seconds since it began); see get_job."""


async def get_job(request: Request):
    """GET /v1/jobs/{id}[?wait=S&state=X&position=N&detail=1]: the job and its
    queue position.

    With `wait`, a long poll: answers as soon as the state differs from `state`
    or the queue position from `position`, or after `wait` seconds (max 60).
    A position that differs when the poll begins is answered at once; one
    that moves while it waits, no sooner than POSITION_SETTLE_S after it
    began (a state change at once): a queue moving by many jobs a second is
    counted once per settle per watcher, not after every commit.
    With `detail=1` (not with `wait`), what `rc show` adds (wire.JobDetail).
    """
    c = ctl(request)
    who = caller(request)
    job_id = path_int(request)
    wait = query_float(request, "wait", 0.0, 0.0, 60.0)
    detail = query_bool(request, "detail", False)
    if detail:
        if wait:
            raise Refused(ErrorCode.BAD_REQUEST, "detail=1 does not go with wait")
        view = await c.job_view(job_id)
        job = view.job
        more = await c.db.read(views.job_detail, job, c.policy, c.logs.size(job_id))
        retain = c.cfg.retain
        removed_at = job.finished_at + retain if retain > 0 and job.finished_at else 0.0
        more = dataclasses.replace(
            more, retain_seconds=retain, removed_at=removed_at, log_quota_bytes=c.cfg.log_quota
        )
        if job.array_id is not None:
            summary = await c.db.read(jobs.array_summary, job.array_id)
            more = dataclasses.replace(more, array=summary)
        if job.kind is JobKind.HOLD:
            timeout = await c.db.read(jobs.hold_idle_timeout, job_id)
            if timeout is not None:
                more = dataclasses.replace(more, idle=c.hold_idle(job, timeout))
        return reply(dataclasses.replace(_visible(view, who), detail=more))
    seen_state = request.query_params.get("state", "")
    seen_pos = request.query_params.get("position", "")
    began = time.monotonic()
    deadline = began + wait
    while True:
        ev_job = c.hub.waiter(f"job:{job_id}")
        ev_jobs = c.hub.waiter("jobs")
        view = await c.job_view(job_id)
        changed = view.job.state.value != seen_state or str(view.queue_position) != seen_pos
        now = time.monotonic()
        left = deadline - now
        if not wait or changed or left <= 0 or c.hub.closing:
            return reply(_visible(view, who))
        waiters = [asyncio.ensure_future(ev_job.wait())]
        if view.job.state is JobState.QUEUED:
            settle = began + POSITION_SETTLE_S - now
            if settle > 0:  # a move in the queue is looked at once settled
                left = min(left, settle)
            else:
                waiters.append(asyncio.ensure_future(ev_jobs.wait()))
        _done, pending = await asyncio.wait(
            waiters, timeout=left, return_when=asyncio.FIRST_COMPLETED
        )
        for p in pending:
            p.cancel()


LIST_MAX = 1000
"""The most jobs one listing page holds (`limit`); `before` pages further."""


def job_filter(request: Request, who: Caller) -> jobs.Filter:
    """The filters of GET /v1/jobs (and of a kill by filter) from the query:
    device, user (the Unix user the jobs run as: the person; `submitter`
    is its older name), mine (the caller's own: owned by its principal; not
    with user), array (an array's id),
    state (comma list), name (a GLOB: * ? [..], at most JOB_NAME_MAX
    characters), since (seconds since the epoch), before (an id). 400
    bad_request naming a bad one."""
    q = request.query_params
    user = q.get("user", "") or q.get("submitter", "")
    owner = ""
    if query_bool(request, "mine", False):
        if user:
            raise Refused(ErrorCode.BAD_REQUEST, "give mine or a user, not both")
        owner = who.principal or "-"  # "-": a caller that owns nothing matches nothing
    states = tuple(s for s in q.get("state", "").split(",") if s)
    known = {s.value for s in JobState}
    for s in states:
        if s not in known:
            raise Refused(
                ErrorCode.BAD_REQUEST,
                f"unknown state {s[:40]!r} (one of {', '.join(x.value for x in JobState)})",
            )
    name = q.get("name", "")
    if len(name) > JOB_NAME_MAX or "\0" in name:
        raise Refused(
            ErrorCode.BAD_REQUEST, f"name pattern is longer than {JOB_NAME_MAX} characters"
        )
    raw_since = q.get("since", "")
    since = 0.0
    if raw_since:
        try:
            since = float(raw_since)
        except ValueError:
            since = -1.0
        if not 0 <= since < 1e11:
            raise Refused(
                ErrorCode.BAD_REQUEST,
                "query parameter since must be a time in seconds since the epoch",
            )
    return jobs.Filter(
        device=q.get("device", ""),
        user=user,
        owner=owner,
        states=states,
        name=name,
        since=since,
        before=query_int(request, "before", 0, 0, 1 << 62),
        array=query_int(request, "array", 0, 0, 1 << 62),
    )


async def list_jobs(request: Request):
    """GET /v1/jobs?limit=&device=&user=&mine=&state=&name=&since=&before=:
    newest first, keyset-paged by `before` (JobList.next_before)."""
    c = ctl(request)
    who = caller(request)
    limit = query_int(request, "limit", 20, 1, LIST_MAX)
    # one row past the page says whether there is a next one (a full page with
    # nothing after it names no next page)
    found = await c.db.read(jobs.listing, job_filter(request, who), limit + 1)
    found, more = found[:limit], found[limit - 1].id if len(found) > limit else 0
    return reply(JobList(tuple(views.for_caller(j, who) for j in found), more))


async def kill(request: Request):
    """POST /v1/jobs/{id}/kill: the owner or an admin kills (or cancels) a job."""
    c = ctl(request)
    who = caller(request)
    job_id = path_int(request)
    req = await json_body(request, c.cfg.limits.body_bytes, empty_ok=True)
    brief = await c.db.read(jobs.brief, job_id)
    if brief is not None and brief.state == JobState.LOST and who.owns(brief.owner):
        return reply({"ok": True, "message": await _end_remains(c, job_id, brief.device_id)})
    what = await c.db.write(
        jobs.kill,
        job_id,
        who,
        free_text("the kill reason", req.reason, c.cfg.limits.text_bytes),
        c.thresholds.retain,
        via(request),
    )
    return reply({"ok": True, "message": f"{what} for job {job_id}"})


async def kill_many(request: Request):
    """POST /v1/jobs/kill {"ids": [...], "reason": ...}: kill() of each job, the
    live ones in one transaction (jobs.kill_many); a lost one's remains are
    ended on its worker as for one kill. Each id's outcome is in the answer
    (wire.KillManyResult): one refused (not found, not yours, ended) is not
    the whole call refused. 400 limit_exceeded above KILL_MANY_MAX ids."""
    c = ctl(request)
    who = caller(request)
    req = await json_body(request, c.cfg.limits.body_bytes)
    if len(req.ids) > KILL_MANY_MAX:
        raise Refused(
            ErrorCode.LIMIT_EXCEEDED,
            f"{len(req.ids)} job ids in one kill; the limit is {KILL_MANY_MAX}",
        )
    reason = free_text("the kill reason", req.reason, c.cfg.limits.text_bytes)
    ids = tuple(dict.fromkeys(req.ids))
    briefs = await c.db.read(jobs.briefs, ids)
    lost = {i for i, b in briefs.items() if b.state == JobState.LOST and who.owns(b.owner)}
    done = {
        o.job_id: o
        for o in await c.db.write(
            jobs.kill_many,
            tuple(i for i in ids if i not in lost),
            who,
            reason,
            c.thresholds.retain,
        )
    }
    for i in sorted(lost):
        try:
            done[i] = KillOutcome(i, True, await _end_remains(c, i, briefs[i].device_id))
        except Refused as e:
            done[i] = KillOutcome(i, False, e.message, e.code)
    return reply(KillManyResult(tuple(done[i] for i in ids)))


async def get_array(request: Request):
    """GET /v1/arrays/{array_id}: an array summed up (wire.ArraySummary);
    404 when the id is no array's."""
    c = ctl(request)
    array_id = path_int(request, "array_id")
    summary = await c.db.read(jobs.array_summary, array_id)
    if summary is None:
        raise Refused(ErrorCode.NOT_FOUND, f"no array {array_id}")
    return reply(summary)


async def extend(request: Request):
    """POST /v1/jobs/{id}/extend {"seconds": N}: the owner or an admin adds N
    seconds to a hold's ttl, up to the ceiling of its devices (jobs.extend)."""
    c = ctl(request)
    who = caller(request)
    job_id = path_int(request)
    req = await json_body(request, c.cfg.limits.body_bytes)
    if not 1 <= req.seconds <= MAX_SECONDS:
        raise Refused(ErrorCode.BAD_REQUEST, "seconds must be from 1 to 100 years")
    ttl = await c.db.write(
        jobs.extend,
        job_id,
        who,
        req.seconds,
        c.policy.lease_grace,
        c.match_cache,
        c.cfg.limits.hold_ttl_max,
    )
    return reply(ExtendResult(job_id, ttl))


async def update(request: Request):
    """POST /v1/jobs/{id}/update (wire.UpdateRequest): the owner or an
    admin changes a queued job (rc.controller.store.edits.update); replies
    with its JobView."""
    c = ctl(request)
    who = caller(request)
    job_id = path_int(request)
    req = await json_body(request, c.cfg.limits.body_bytes)
    await c.db.write(
        edits.update, job_id, who, req, c.cfg.max_user_priority, c.match_cache, c.policy.cap
    )
    return reply(await c.db.read(views.job_view, job_id, c.policy))


async def _end_remains(c, job_id: int, device_id: str) -> str:
    """A lost job may still run on its host (a worker killed with -9): its
    worker ends what is left of it (its cgroup, its RC_JOB_ID) and says
    what it found (503 scan_unavailable when it cannot)."""
    host = device_id.rpartition(":")[0]
    what = f"job {job_id}"
    result = await scan_or_refuse(c, host, (), (job_id,), True, what, hint="")
    if result.survivors:
        raise Refused(
            ErrorCode.SURVIVORS_FOUND,
            f"job {job_id} was lost; its processes on {host} survived the kill: "
            f"{survivors_text(result.survivors)}",
        )
    if result.ended:
        return f"job {job_id} was lost; ended what was left of it on {host}: " + survivors_text(
            result.ended
        )
    return f"job {job_id} was lost; a survivor scan on {host} found nothing of it left"


async def read_logs(request: Request):
    """GET /v1/jobs/{id}/logs?offset=N&follow=1: stored output from byte N.

    Without follow: what is stored now. With follow (the default): then every
    new byte until the job has ended and its last bytes are out. Only the
    job's owner or an admin may read; a terminal session stores nothing (409
    logs_not_stored).
    """
    c = ctl(request)
    who = caller(request)
    job_id = path_int(request)
    follow = request.query_params.get("follow", "1")
    if follow not in ("0", "1", "true", "false"):
        raise Refused(ErrorCode.BAD_REQUEST, "follow must be 0, 1, true or false")
    follow_on = follow in ("1", "true")
    offset = query_int(request, "offset", 0, 0, 1 << 62)
    brief = await c.db.read(jobs.brief, job_id)
    if brief is None:
        raise Refused(ErrorCode.NOT_FOUND, f"no job {job_id}")
    if not who.owns(brief.owner):
        raise Refused(
            ErrorCode.NOT_JOB_OWNER,
            f"job {job_id} belongs to {brief.submitter}; only its owner "
            "or an admin may read its logs",
        )
    if brief.stdio == Stdio.TTY:
        raise Refused(
            ErrorCode.LOGS_NOT_STORED,
            f"job {job_id} is a terminal session; its output is not stored",
        )
    header = request.headers.get("authorization")

    def still_allowed() -> bool:
        try:
            c.tokens.authenticate(header, c.clock())
            return True
        except Refused:
            return False

    return StreamingResponse(
        _log_stream(c, job_id, offset, follow_on, still_allowed),
        media_type="application/octet-stream",
        headers={"Cache-Control": "no-store"},
    )


async def _log_stream(c, job_id: int, offset: int, follow: bool, still_allowed):
    """Stored bytes from `offset`, then (follow) new ones until the job ended.
    A follow stops as soon as the caller's token is revoked or expires."""
    key = f"log:{job_id}"
    recheck = time.monotonic() + TOKEN_RECHECK_S
    while True:
        if time.monotonic() >= recheck:
            if not still_allowed():
                return
            recheck = time.monotonic() + TOKEN_RECHECK_S
        ev = c.hub.waiter(key)
        data = c.logs.read(job_id, offset, LOG_READ_CHUNK)
        if data:
            offset += len(data)
            yield data
            continue
        if not follow or c.hub.closing:
            return
        state = await c.db.read(jobs.state_of, job_id)
        if state is None or JobState(state).terminal:
            tail = c.logs.read(job_id, offset, LOG_READ_CHUNK)
            while tail:
                offset += len(tail)
                yield tail
                tail = c.logs.read(job_id, offset, LOG_READ_CHUNK)
            return
        try:
            await asyncio.wait_for(ev.wait(), c.cfg.log_follow_check)
        except TimeoutError:
            pass


async def explain_job(request: Request):
    """GET /v1/jobs/{id}/explain: why a queued job is not running."""
    c = ctl(request)
    job_id = path_int(request)
    return reply(await c.db.read(views.explain_job, job_id, c.policy))
