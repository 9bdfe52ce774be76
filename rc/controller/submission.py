"""Admission: a submission checked and turned into a jobs.NewJob.

POST /v1/jobs (rc.controller.api.jobs.submit) and a relayed session's hold
(rc.controller.api.relay) take a wire.SubmitRequest through validate_submit,
which runs the checks below in a fixed order, so that of two problems in one
request the same one is always named. Each check is a pure function of the
request, the caller and the limits (the one exception: `--as` a Unix user
looks that user up in the host's password database). Every refusal is a
Refused (400, or 403 for who may submit), naming the field and the problem:

- the target: a selector or pinned devices, and how many (`checked_target`);
- who: the caller, or under `as_user` the one an admin submits as
  (`checked_identity`);
- free text: lengths and NUL characters (`check_texts`), the job's name
  (`check_name`);
- limits and runtime: priority and its policy (`check_priority`), durations
  (`check_durations`);
- what runs: a hold's sleeper (`checked_hold`) or a job's command and
  environment (`checked_command`);
- arrays and dependencies (`checked_array`, `checked_after`);
- the selector's grammar (`checked_selector`);
- the digest an idempotency key is compared by (`request_digest`).
"""

from __future__ import annotations

import hashlib
import pwd
from dataclasses import dataclass

import orjson

from rc.controller.auth import TOKEN_NAME_RE, Caller
from rc.controller.config import Limits
from rc.controller.environment import EXPORT_DEFAULT, check_env, job_environment
from rc.controller.errors import Refused
from rc.controller.store import jobs
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
    Principal,
    Stdio,
    parse_after,
    valid_job_name,
    valid_unix_user,
)
from rc.proto.wire import SubmitRequest

__all__ = [
    "Identity",
    "check_durations",
    "check_env",
    "check_name",
    "check_priority",
    "check_texts",
    "checked_after",
    "checked_array",
    "checked_command",
    "checked_hold",
    "checked_identity",
    "checked_selector",
    "checked_target",
    "pinned_devices",
    "request_digest",
    "validate_submit",
]

DIGEST_DEFAULTS = (
    ("count", 1),
    ("device_ids", []),
    ("name", ""),
    ("array", ""),
    ("array_items", []),
    ("after", []),
    ("hold_idle_timeout_seconds", None),
    ("requeue_on_hardware", True),
    ("export", ""),
    ("caller_env", {}),
    ("begin_at", 0.0),
)
"""Fields left out of a request's digest when they hold these values: a
request from before these fields digests as it did."""


def validate_submit(
    req: SubmitRequest,
    who: Caller,
    lim: Limits,
    cap: int = 0,
    max_user_priority: int = PRIORITY_MAX,
    export_default: str = EXPORT_DEFAULT,
) -> jobs.NewJob:
    """Check a submission and turn it into a NewJob. Raises Refused (400/403).

    `cap` is the per-user device cap (0: none): a job asking for more
    devices than that could never start, so it is refused (400
    limit_exceeded). `max_user_priority` is the priority policy (rc serve
    --max-user-priority): a caller who is not an admin asking for more is
    refused (400 priority_not_allowed); admins may ask up to PRIORITY_MAX.

    The job is owned by the caller's principal and runs as its Unix user;
    under `as_user` (admins only, 403 otherwise) by the target's
    (checked_identity), the admin's label kept as its `actor`. Its
    environment is rc.controller.environment.job_environment's, with
    `export_default` (rc serve --export-default) for a request naming none."""
    pins, count = checked_target(req, cap)
    me = checked_identity(req, who)
    check_texts(req, lim)
    check_name(req)
    check_priority(req, who, max_user_priority)
    check_durations(req)
    hold_idle: int | None = None
    if req.kind is JobKind.HOLD:
        command, hold_idle = checked_hold(req, who, lim)
    else:
        command = checked_command(req, lim)
    env = job_environment(req, lim, export_default) if req.kind is JobKind.JOB else {}
    indices, items, array_cap, spec_text = checked_array(req, lim)
    after = checked_after(req.after)
    sel = checked_selector(req)
    return jobs.NewJob(
        kind=req.kind,
        submitter=me.submitter,
        token_name=who.name,
        owner=me.owner,
        actor=me.actor,
        as_token=me.as_token,
        command=command,
        selector=sel,
        device_id=pins[0] if pins else "",
        cwd=req.cwd,
        env=env,
        idempotency_key=req.idempotency_key or None,
        digest=request_digest(req),
        priority=req.priority,
        max_runtime=req.max_runtime_seconds,
        idle_timeout=req.idle_timeout_seconds,
        reason=req.reason.strip() if req.kind is JobKind.HOLD else _job_reason(req, command, pins),
        stdio=req.stdio.value,
        queued_limit=lim.queued_per_user,
        queued_spec_limit=lim.queued_spec_bytes,
        count=count,
        device_ids=pins,
        unix_user=me.unix_user,
        name=req.name,
        array_indices=indices,
        array_items=items,
        array_cap=array_cap,
        array_spec=spec_text,
        after=after,
        hold_idle=hold_idle,
        requeue_on_hardware=req.requeue_on_hardware,
        begin_at=req.begin_at,
    )


# -- the target -------------------------------------------------------------------


def pinned_devices(req: SubmitRequest) -> tuple[str, ...]:
    """The devices a submission pins (device_ids, or device_id alone), in order."""
    return req.device_ids or ((req.device_id,) if req.device_id else ())


def checked_target(req: SubmitRequest, cap: int) -> tuple[tuple[str, ...], int]:
    """(pinned devices, how many devices) of a submission: exactly one of a
    selector and pinned devices (device_id or device_ids, not both), and a
    count that fits them and the per-user cap `cap` (0: none). 400
    bad_request naming the problem; limit_exceeded past the cap."""
    if req.device_id and req.device_ids:
        raise Refused(ErrorCode.BAD_REQUEST, "give device_id or device_ids, not both")
    pins = pinned_devices(req)
    if bool(pins) == bool(req.selector):
        raise Refused(
            ErrorCode.BAD_REQUEST,
            "give exactly one of a selector and pinned devices (device_id or device_ids)",
        )
    return pins, _checked_count(req.count, pins, cap)


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


# -- who --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Identity:
    """Whom a submission is for (jobs.NewJob's fields of the same names):
    the principal that owns it, its display label, the Unix user it runs as,
    the admin acting under --as (else ""), and the live token it is
    submitted as (`as_user: "token:NAME"`; the first three are then "",
    looked up by jobs.enqueue)."""

    owner: str
    submitter: str
    unix_user: str
    actor: str = ""
    as_token: str = ""


def checked_identity(req: SubmitRequest, who: Caller) -> Identity:
    """The caller, or under `as_user` whom an admin submits as (_as_target).
    403 forbidden for `as_user` from a caller who is not an admin, and for
    a caller that is no principal that can own a job; 400 for an `as_user`
    that names no Unix user or token."""
    if not req.as_user:
        me = Identity(who.principal, who.label, who.unix_user)
    elif not who.admin:
        raise Refused(ErrorCode.FORBIDDEN, "only an admin may submit as someone else")
    else:
        owner, submitter, unix_user, as_token = _as_target(req.as_user)
        me = Identity(owner, submitter, unix_user, who.label, as_token)
    if not me.owner and not me.as_token:
        raise Refused(ErrorCode.FORBIDDEN, f"{who.name!r} is no principal that can own a job")
    return me


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


# -- free text --------------------------------------------------------------------


def check_texts(req: SubmitRequest, lim: Limits) -> None:
    """Every free-text field of a submission (cwd, reason, the devices, the
    selector, as_user, the idempotency key) at most `lim.text_bytes`
    characters (400 limit_exceeded) and free of NUL characters (400
    bad_request), naming the field."""
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
            raise Refused(
                ErrorCode.LIMIT_EXCEEDED, f"{what} is longer than {lim.text_bytes} characters"
            )
        if "\0" in text:
            raise Refused(ErrorCode.BAD_REQUEST, f"{what} contains a NUL character")


def check_name(req: SubmitRequest) -> None:
    """A job's name, when given, is valid (rc.proto.model.valid_job_name);
    400 bad_request saying what a name may hold."""
    if req.name and not valid_job_name(req.name):
        raise Refused(
            ErrorCode.BAD_REQUEST,
            f"job name {req.name[:40]!r} is not valid (letters, digits and . _ : + = , @ % -, "
            f"starting with a letter, digit or '_'; at most {JOB_NAME_MAX} characters)",
        )


# -- limits and runtime -----------------------------------------------------------


def check_priority(req: SubmitRequest, who: Caller, max_user_priority: int) -> None:
    """The priority is within PRIORITY_MIN..PRIORITY_MAX (400
    priority_out_of_range) and, for a caller who is not an admin, at most
    `max_user_priority` (400 priority_not_allowed; a negative one is anyone's)."""
    if not PRIORITY_MIN <= req.priority <= PRIORITY_MAX:
        raise Refused(
            ErrorCode.PRIORITY_OUT_OF_RANGE,
            f"priority {req.priority} is outside {PRIORITY_MIN}..{PRIORITY_MAX}",
        )
    if req.priority > 0 and not who.admin and req.priority > max_user_priority:
        raise Refused(
            ErrorCode.PRIORITY_NOT_ALLOWED,
            f"priority {req.priority} is above this controller's limit of {max_user_priority} "
            f"for users (rc serve --max-user-priority); admins may ask up to {PRIORITY_MAX}, "
            "and anyone for a negative priority",
        )


def check_durations(req: SubmitRequest) -> None:
    """The max runtime and idle timeout (seconds) are not negative (400
    bad_request) and at most MAX_SECONDS (400 limit_exceeded)."""
    if min(req.max_runtime_seconds, req.idle_timeout_seconds, req.begin_at) < 0:
        raise Refused(ErrorCode.BAD_REQUEST, "durations cannot be negative")
    if max(req.max_runtime_seconds, req.idle_timeout_seconds) > MAX_SECONDS:
        raise Refused(ErrorCode.LIMIT_EXCEEDED, "durations are at most 100 years")


# -- what runs --------------------------------------------------------------------


def checked_hold(req: SubmitRequest, who: Caller, lim: Limits) -> tuple[tuple[str, ...], int]:
    """A hold's (command, idle timeout in seconds): the worker's own sleeper
    ("hold",), so no command, cwd, env, idle timeout or terminal of its own;
    a ttl and a reason it needs. 400 bad_request naming what it must not
    carry or lacks; the idle timeout as _checked_hold_idle allows it."""
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
        raise Refused(
            ErrorCode.BAD_REQUEST,
            f"a hold runs the worker's own sleeper; it cannot carry {', '.join(extras)}",
        )
    if req.max_runtime_seconds <= 0:
        raise Refused(ErrorCode.BAD_REQUEST, "a hold needs a ttl (max_runtime_seconds > 0)")
    if not req.reason.strip():
        raise Refused(ErrorCode.BAD_REQUEST, "a hold needs a reason (say what it is for)")
    if lim.hold_ttl_max and not who.admin and req.max_runtime_seconds > lim.hold_ttl_max:
        raise Refused(
            ErrorCode.LIMIT_EXCEEDED,
            f"a hold's ttl may be at most {format_duration(lim.hold_ttl_max)} here, not "
            f"{format_duration(req.max_runtime_seconds)} (rc serve --hold-ttl-max)",
        )
    return ("hold",), _checked_hold_idle(req.hold_idle_timeout_seconds, who, lim)


def _checked_hold_idle(asked: int | None, who: Caller, lim: Limits) -> int:
    """A hold's idle timeout in seconds (0: off) from what was asked (None:
    the controller's default). Below the admin-set minimum, past the
    maximum, or off while either is set, a user is refused (400
    limit_exceeded); an admin is not."""
    if asked is None:
        return lim.hold_idle_timeout
    if asked < 0:
        raise Refused(ErrorCode.BAD_REQUEST, "an idle timeout cannot be negative (0 turns it off)")
    if asked > MAX_SECONDS:
        raise Refused(ErrorCode.LIMIT_EXCEEDED, "durations are at most 100 years")
    least = lim.hold_idle_timeout_min
    if least and not who.admin and (asked == 0 or asked < least):
        what = "turned off" if asked == 0 else format_duration(asked)
        raise Refused(
            ErrorCode.LIMIT_EXCEEDED,
            f"a hold's idle timeout must be at least {format_duration(least)} here, not {what} "
            "(rc serve --hold-idle-timeout-min; an admin may go below it)",
        )
    top = lim.hold_idle_timeout_max
    if top and not who.admin and (asked == 0 or asked > top):
        what = "turned off" if asked == 0 else format_duration(asked)
        raise Refused(
            ErrorCode.LIMIT_EXCEEDED,
            f"a hold's idle timeout may be at most {format_duration(top)} here, not {what} "
            "(rc serve --hold-idle-timeout-max; an admin may go past it)",
        )
    return asked


def checked_command(req: SubmitRequest, lim: Limits) -> tuple[str, ...]:
    """A job's command (argv; empty only for a terminal session, which runs
    the user's shell) within the argv limits (its environment is checked
    whole: rc.controller.environment). No hold_idle_timeout_seconds (a
    hold's). 400 bad_request
    or limit_exceeded naming the problem."""
    if req.hold_idle_timeout_seconds is not None:
        raise Refused(
            ErrorCode.BAD_REQUEST,
            "hold_idle_timeout_seconds is for a hold; a job's idle timeout is "
            "idle_timeout_seconds (no output for that long)",
        )
    command = req.command
    if not command and req.stdio is not Stdio.TTY:
        raise Refused(ErrorCode.BAD_REQUEST, "the command is empty")
    if len(command) > lim.argv_items:
        raise Refused(
            ErrorCode.LIMIT_EXCEEDED,
            f"the command has {len(command)} arguments; the limit is {lim.argv_items}",
        )
    if sum(len(a.encode()) for a in command) > lim.argv_bytes:
        raise Refused(
            ErrorCode.LIMIT_EXCEEDED, f"the command is over the {lim.argv_bytes}-byte limit"
        )
    if any("\0" in a for a in command):
        raise Refused(ErrorCode.BAD_REQUEST, "a command argument contains a NUL character")
    if command and not command[0]:
        raise Refused(ErrorCode.BAD_REQUEST, "the program name (first argument) is empty")
    return command


# -- arrays and dependencies ------------------------------------------------------


def checked_array(
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


def checked_after(after: tuple[str, ...]) -> tuple[tuple[int, str], ...]:
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


# -- the selector and the digest --------------------------------------------------


def checked_selector(req: SubmitRequest) -> str:
    """The request's selector in normal form ("" for a pinned job); 400
    bad_selector naming the bad term."""
    if not req.selector:
        return ""
    try:
        return str(selectors.parse(req.selector))
    except selectors.SelectorError as e:
        raise Refused(ErrorCode.BAD_SELECTOR, str(e)) from None


def request_digest(req: SubmitRequest) -> str:
    """The sha256 (hex) of the request's canonical JSON, its idempotency key
    left out (and the DIGEST_DEFAULTS fields holding their defaults): what a
    reused key is compared by. A key is looked up among its owner's own jobs
    only (jobs.enqueue): the same key from another principal is another
    submission."""
    canon = encode(req)
    canon.pop("idempotency_key", None)
    for name, default in DIGEST_DEFAULTS:
        if canon[name] == default:
            del canon[name]
    return hashlib.sha256(orjson.dumps(canon, option=orjson.OPT_SORT_KEYS)).hexdigest()


# -- the reason -------------------------------------------------------------------


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
