"""Client routes on jobs: submit, list, get, kill, logs, explain."""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import pwd
import time

import orjson
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
from rc.controller.auth import TOKEN_NAME_RE, Caller
from rc.controller.config import Limits
from rc.controller.errors import Refused
from rc.controller.scans import scan_or_refuse, survivors_text
from rc.controller.store import jobs, views
from rc.proto import arrayspec, copyjob
from rc.proto import selector as selectors
from rc.proto.arrayspec import ARRAY_MAX
from rc.proto.codec import encode
from rc.proto.duration import MAX_SECONDS, format_duration
from rc.proto.errors import ErrorCode
from rc.proto.model import (
    AFTER_MAX,
    COUNT_MAX,
    JOB_NAME_MAX,
    PRIORITY_MAX,
    PRIORITY_MIN,
    JobKind,
    JobState,
    Principal,
    Stdio,
    parse_after,
    valid_env_name,
    valid_job_name,
    valid_unix_user,
)
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
    "pinned_devices",
    "read_logs",
    "submit",
    "validate_submit",
]

LOG_READ_CHUNK = 256 << 10
NO_WAIT_REASON = "no-wait: no device was free"
"""The kill reason of a refused no_wait submission in a database from before
such submissions were taken back (jobs.withdraw_queued); still answered 409."""
TOKEN_RECHECK_S = 1.0
"""A log follow re-checks its caller's token this often (a revoked token stops it)."""


def pinned_devices(req: SubmitRequest) -> tuple[str, ...]:
    """The devices a submission pins (device_ids, or device_id alone), in order."""
    return req.device_ids or ((req.device_id,) if req.device_id else ())


def validate_submit(  # noqa: C901 - too complex; it is to be split into named steps
    req: SubmitRequest,
    who: Caller,
    lim: Limits,
    cap: int = 0,
    max_user_priority: int = PRIORITY_MAX,
) -> jobs.NewJob:
    """Check a submission and turn it into a NewJob. Raises Refused (400/403).

    `cap` is the per-user device cap (0: none): a job asking for more
    devices than that could never start, so it is refused (400
    limit_exceeded). `max_user_priority` is the priority policy (rc serve
    --max-user-priority): a caller who is not an admin asking for more is
    refused (400 priority_not_allowed); admins may ask up to PRIORITY_MAX.

    The job is owned by the caller's principal and runs as its Unix user;
    under `as_user` (admins only, 403 otherwise) by the target's
    (_as_target), the admin's label kept as its `actor`."""
    bad = Refused
    if req.device_id and req.device_ids:
        raise bad(ErrorCode.BAD_REQUEST, "give device_id or device_ids, not both")
    pins = pinned_devices(req)
    if bool(pins) == bool(req.selector):
        raise bad(
            ErrorCode.BAD_REQUEST,
            "give exactly one of a selector and pinned devices (device_id or device_ids)",
        )
    count = _checked_count(req.count, pins, cap)
    owner, submitter, unix_user = who.principal, who.label, who.unix_user
    actor = as_token = ""
    if req.as_user:
        if not who.admin:
            raise Refused(ErrorCode.FORBIDDEN, "only an admin may submit as someone else")
        owner, submitter, unix_user, as_token = _as_target(req.as_user)
        actor = who.label
    if not owner and not as_token:
        raise Refused(ErrorCode.FORBIDDEN, f"{who.name!r} is no principal that can own a job")
    for what, text in (
        ("cwd", req.cwd),
        ("reason", req.reason),
        ("device_id", req.device_id),
        ("device_ids", ",".join(req.device_ids)),
        ("selector", req.selector),
        ("as_user", req.as_user),
        ("idempotency_key", req.idempotency_key or ""),
    ):
        if len(text) > lim.text_bytes:
            raise bad(
                ErrorCode.LIMIT_EXCEEDED, f"{what} is longer than {lim.text_bytes} characters"
            )
        if "\0" in text:
            raise bad(ErrorCode.BAD_REQUEST, f"{what} contains a NUL character")
    if req.name and not valid_job_name(req.name):
        raise bad(
            ErrorCode.BAD_REQUEST,
            f"job name {req.name[:40]!r} is not valid (letters, digits and . _ : + = , @ % -, "
            f"starting with a letter, digit or '_'; at most {JOB_NAME_MAX} characters)",
        )
    if not PRIORITY_MIN <= req.priority <= PRIORITY_MAX:
        raise bad(
            ErrorCode.PRIORITY_OUT_OF_RANGE,
            f"priority {req.priority} is outside {PRIORITY_MIN}..{PRIORITY_MAX}",
        )
    if req.priority > 0 and not who.admin and req.priority > max_user_priority:
        raise bad(
            ErrorCode.PRIORITY_NOT_ALLOWED,
            f"priority {req.priority} is above this controller's limit of {max_user_priority} "
            f"for users (rc serve --max-user-priority); admins may ask up to {PRIORITY_MAX}, "
            "and anyone for a negative priority",
        )
    if req.max_runtime_seconds < 0 or req.idle_timeout_seconds < 0:
        raise bad(ErrorCode.BAD_REQUEST, "durations cannot be negative")
    if max(req.max_runtime_seconds, req.idle_timeout_seconds) > MAX_SECONDS:
        raise bad(ErrorCode.LIMIT_EXCEEDED, "durations are at most 100 years")
    if req.kind is JobKind.HOLD:
        extras = [
            name
            for name, present in (
                ("a command", bool(req.command)),
                ("a cwd", bool(req.cwd)),
                ("env", bool(req.env)),
                ("an idle timeout", bool(req.idle_timeout_seconds)),
                ("a terminal or pipe", req.stdio is not Stdio.LOGS),
            )
            if present
        ]
        if extras:
            raise bad(
                ErrorCode.BAD_REQUEST,
                f"a hold runs the worker's own sleeper; it cannot carry {', '.join(extras)}",
            )
        if req.max_runtime_seconds <= 0:
            raise bad(ErrorCode.BAD_REQUEST, "a hold needs a ttl (max_runtime_seconds > 0)")
        if not req.reason.strip():
            raise bad(ErrorCode.BAD_REQUEST, "a hold needs a reason (say what it is for)")
        command: tuple[str, ...] = ("hold",)
        hold_idle: int | None = _checked_hold_idle(req.hold_idle_timeout_seconds, who, lim)
    else:
        if req.hold_idle_timeout_seconds is not None:
            raise bad(
                ErrorCode.BAD_REQUEST,
                "hold_idle_timeout_seconds is for a hold; a job's idle timeout is "
                "idle_timeout_seconds (no output for that long)",
            )
        hold_idle = None
        command = req.command
        if not command and req.stdio is not Stdio.TTY:
            raise bad(ErrorCode.BAD_REQUEST, "the command is empty")
        if len(command) > lim.argv_items:
            raise bad(
                ErrorCode.LIMIT_EXCEEDED,
                f"the command has {len(command)} arguments; the limit is {lim.argv_items}",
            )
        if sum(len(a.encode()) for a in command) > lim.argv_bytes:
            raise bad(
                ErrorCode.LIMIT_EXCEEDED, f"the command is over the {lim.argv_bytes}-byte limit"
            )
        if any("\0" in a for a in command):
            raise bad(ErrorCode.BAD_REQUEST, "a command argument contains a NUL character")
        if command and not command[0]:
            raise bad(ErrorCode.BAD_REQUEST, "the program name (first argument) is empty")
        if len(req.env) > lim.env_items:
            raise bad(
                ErrorCode.LIMIT_EXCEEDED,
                f"{len(req.env)} environment entries; the limit is {lim.env_items}",
            )
        if sum(len(k.encode()) + len(v.encode()) for k, v in req.env.items()) > lim.env_bytes:
            raise bad(ErrorCode.LIMIT_EXCEEDED, f"the environment is over {lim.env_bytes} bytes")
        for k, v in req.env.items():
            if not valid_env_name(k):
                raise bad(
                    ErrorCode.BAD_REQUEST,
                    f"environment variable name {k[:40]!r} is not valid "
                    "(letters, digits and '_', not starting with a digit)",
                )
            if "\0" in v:
                raise bad(
                    ErrorCode.BAD_REQUEST, f"environment variable {k!r} contains a NUL character"
                )
    indices, items, cap, spec_text = _checked_array(req, lim)
    after = _checked_after(req.after)
    sel = ""
    if req.selector:
        try:
            sel = str(selectors.parse(req.selector))
        except selectors.SelectorError as e:
            raise bad(ErrorCode.BAD_SELECTOR, str(e)) from None
    canon = encode(req)
    canon.pop("idempotency_key", None)
    for name, default in (
        ("count", 1),
        ("device_ids", []),
        ("name", ""),
        ("array", ""),
        ("array_items", []),
        ("after", []),
        ("hold_idle_timeout_seconds", None),
        ("requeue_on_hardware", True),
    ):
        if canon[name] == default:  # a request from before these fields digests as it did
            del canon[name]
    # a key is looked up among its owner's own jobs only (jobs.enqueue): the
    # same key from another principal is another submission
    digest = hashlib.sha256(orjson.dumps(canon, option=orjson.OPT_SORT_KEYS)).hexdigest()
    return jobs.NewJob(
        kind=req.kind,
        submitter=submitter,
        token_name=who.name,
        owner=owner,
        actor=actor,
        as_token=as_token,
        command=command,
        selector=sel,
        device_id=pins[0] if pins else "",
        cwd=req.cwd,
        env=dict(req.env) if req.kind is JobKind.JOB else {},
        idempotency_key=req.idempotency_key or None,
        digest=digest,
        priority=req.priority,
        max_runtime=req.max_runtime_seconds,
        idle_timeout=req.idle_timeout_seconds,
        reason=req.reason.strip() if req.kind is JobKind.HOLD else _job_reason(req, command, pins),
        stdio=req.stdio.value,
        queued_limit=lim.queued_per_user,
        queued_spec_limit=lim.queued_spec_bytes,
        count=count,
        device_ids=pins,
        unix_user=unix_user,
        name=req.name,
        array_indices=indices,
        array_items=items,
        array_cap=cap,
        array_spec=spec_text,
        after=after,
        hold_idle=hold_idle,
        requeue_on_hardware=req.requeue_on_hardware,
    )


def _job_reason(req: SubmitRequest, command: tuple[str, ...], pins: tuple[str, ...]) -> str:
    """A job's reason: "rc cp SRC DST" for a pipe job on one device whose
    command is exactly one of rc cp's (rc.proto.copyjob.copy_label, built
    from that command: what the client says is not asked), else the
    client's free text, listed beside the command. Only the controller
    labels a copy: a client's reason starting "rc cp" is dropped."""
    if req.stdio is Stdio.PIPE and len(pins) == 1:
        label = copyjob.copy_label(command, pins[0])
        if label:
            return label
    if req.reason.lstrip().startswith(copyjob.COPY_LABEL_PREFIX):
        return ""
    return req.reason


def _as_target(text: str) -> tuple[str, str, str, str]:
    """Whom an admin submits `--as`: (owner, label, Unix user, token name).

    `token:NAME`: the live token NAME (its principal, label and Unix user,
    which jobs.enqueue looks up: the first three are then ""). Anything
    else is a Unix user of the controller's host: it owns the job as
    `uid:<uid>` (as if it had used the local socket) and the job runs as it.
    400 bad_request for a name that is neither, naming it."""
    kind, sep, name = text.partition(":")
    if sep and kind == Principal.TOKEN:
        if not TOKEN_NAME_RE.fullmatch(name):
            raise Refused(
                ErrorCode.BAD_REQUEST,
                f"as_user {text[:50]!r}: {name[:40]!r} is not a token name "
                "(letters, digits, '.', '_', '@', '-'; at most 64)",
            )
        return "", "", "", name
    if not valid_unix_user(text):
        raise Refused(
            ErrorCode.BAD_REQUEST,
            f"as_user {text[:40]!r} is not a Unix user name; to submit as an API token, "
            "give token:NAME",
        )
    try:
        entry = pwd.getpwnam(text)
    except KeyError:
        raise Refused(
            ErrorCode.BAD_REQUEST,
            f"as_user {text!r}: there is no Unix user {text!r} on the controller's host; "
            f"to submit as the API token of that name, give token:{text}",
        ) from None
    return str(Principal.of_uid(entry.pw_uid)), entry.pw_name, entry.pw_name, ""


def _checked_hold_idle(asked: int | None, who: Caller, lim: Limits) -> int:
    """A hold's idle timeout in seconds (0: off) from what was asked (None:
    the controller's default). Past the admin-set maximum, or off while a
    maximum is set, a user is refused (400 limit_exceeded); an admin is not."""
    if asked is None:
        return lim.hold_idle_timeout
    if asked < 0:
        raise Refused(ErrorCode.BAD_REQUEST, "an idle timeout cannot be negative (0 turns it off)")
    if asked > MAX_SECONDS:
        raise Refused(ErrorCode.LIMIT_EXCEEDED, "durations are at most 100 years")
    top = lim.hold_idle_timeout_max
    if top and not who.admin and (asked == 0 or asked > top):
        what = "turned off" if asked == 0 else format_duration(asked)
        raise Refused(
            ErrorCode.LIMIT_EXCEEDED,
            f"a hold's idle timeout may be at most {format_duration(top)} here, not {what} "
            "(rc serve --hold-idle-timeout-max; an admin may go past it)",
        )
    return asked


def _checked_after(after: tuple[str, ...]) -> tuple[tuple[int, str], ...]:
    """A submission's dependencies as (job id, condition), each job once (the
    last condition given wins). 400 for a malformed one or an unknown
    condition, and limit_exceeded past AFTER_MAX."""
    if len(after) > AFTER_MAX:
        raise Refused(
            ErrorCode.LIMIT_EXCEEDED,
            f"{len(after)} dependencies; a job may wait for at most {AFTER_MAX}",
        )
    out: dict[int, str] = {}
    for text in after:
        try:
            job_id, cond = parse_after(text)
        except ValueError as e:
            raise Refused(ErrorCode.BAD_REQUEST, str(e)) from None
        out[job_id] = cond.value
    return tuple(out.items())


def _checked_array(
    req: SubmitRequest, lim: Limits
) -> tuple[tuple[int, ...], tuple[str, ...], int, str]:
    """An array submission's (indices, items, cap on running elements,
    normal-form spec); ((), (), 0, "") for a single job. 400 naming the
    problem: a malformed spec, no indices and no items, items that do not
    match the indices, more than ARRAY_MAX elements (limit_exceeded), an
    array of holds, of terminal jobs or with no_wait."""
    if not req.array and not req.array_items:
        return (), (), 0, ""
    bad = Refused
    if req.kind is JobKind.HOLD:
        raise bad(ErrorCode.BAD_REQUEST, "an array is of jobs, not holds")
    if req.stdio is not Stdio.LOGS:
        raise bad(ErrorCode.BAD_REQUEST, "an array's elements cannot have a terminal or pipe")
    if req.no_wait:
        raise bad(ErrorCode.BAD_REQUEST, "an array cannot be submitted with no_wait")
    if len(req.array_items) > ARRAY_MAX:
        raise bad(
            ErrorCode.LIMIT_EXCEEDED,
            f"{len(req.array_items)} array items; an array has at most {ARRAY_MAX} elements",
        )
    try:
        spec = arrayspec.parse(req.array) if req.array else arrayspec.ArraySpec(())
    except arrayspec.ArraySpecError as e:
        code = ErrorCode.LIMIT_EXCEEDED if "the limit" in str(e) else ErrorCode.BAD_REQUEST
        raise bad(code, str(e)) from None
    items = tuple(req.array_items)
    indices = spec.indices
    if items:
        if not indices:
            indices = tuple(range(len(items)))
        elif len(indices) != len(items):
            raise bad(
                ErrorCode.BAD_REQUEST,
                f"{len(items)} array items for {len(indices)} indices; give one item per index",
            )
        for k, item in enumerate(items):
            if not item:
                raise bad(ErrorCode.BAD_REQUEST, f"array item {k} is empty")
            if "\0" in item or len(item) > lim.text_bytes:
                raise bad(
                    ErrorCode.BAD_REQUEST,
                    f"array item {k} has a NUL character or is longer than "
                    f"{lim.text_bytes} characters",
                )
    if not indices:
        raise bad(ErrorCode.BAD_REQUEST, "an array needs indices (0-99) or items")
    normal = arrayspec.format(arrayspec.ArraySpec(indices, spec.max_running))
    return indices, items, spec.max_running, normal


def _checked_count(count: int, pins: tuple[str, ...], cap: int) -> int:
    """How many devices a submission asks for: `count` (1..COUNT_MAX), or
    the pinned list's length (pins of one host, none twice; a count other
    than 1 must equal it). Raises Refused 400 naming the problem."""
    bad = Refused
    if not 1 <= count <= COUNT_MAX:
        raise bad(ErrorCode.BAD_REQUEST, f"count {count} is outside 1..{COUNT_MAX}")
    if pins:
        if len(pins) > COUNT_MAX:
            raise bad(
                ErrorCode.BAD_REQUEST,
                f"{len(pins)} pinned devices; a job has at most {COUNT_MAX}",
            )
        seen: set[str] = set()
        for d in pins:
            if d in seen:
                raise bad(ErrorCode.BAD_REQUEST, f"device {d[:80]!r} is pinned twice")
            seen.add(d)
        hosts = sorted({d.rpartition(":")[0] for d in pins})
        if len(hosts) > 1:
            raise bad(
                ErrorCode.BAD_REQUEST,
                f"the pinned devices span hosts {', '.join(repr(h[:40]) for h in hosts[:4])}; "
                "a job's devices are all on one host",
            )
        if count not in (1, len(pins)):
            raise bad(
                ErrorCode.BAD_REQUEST,
                f"count {count} does not match the {len(pins)} pinned devices",
            )
        count = len(pins)
    if cap and count > cap:
        raise bad(
            ErrorCode.LIMIT_EXCEEDED,
            f"{count} devices is more than the per-user cap of {cap} "
            "(rc serve --max-devices-per-user); it could never start",
        )
    return count


async def submit(request: Request):
    """POST /v1/jobs: 201 with the job (200 for an idempotent replay).

    With no_wait, a job that cannot start at once is taken back (deleted, see
    jobs.withdraw_queued) and the answer is 409 no_device_available: nothing
    is left in the queue, the listings or the history.
    """
    c = ctl(request)
    who = caller(request)
    req = await json_body(request, c.cfg.limits.body_bytes)
    new = validate_submit(req, who, c.cfg.limits, c.policy.cap, c.cfg.max_user_priority)
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
        jobs.extend, job_id, who, req.seconds, c.policy.lease_grace, c.match_cache
    )
    return reply(ExtendResult(job_id, ttl))


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
