"""Wire records of jobs: submit, show, list, extend, kill, and why one waits
(GET /v1/jobs/{id}/explain)."""

from __future__ import annotations

from dataclasses import dataclass, field

from rc.proto.model import Job, JobKind, Stdio


@dataclass(frozen=True, slots=True)
class SubmitRequest:
    """POST /v1/jobs. Exactly one target: a `selector`, or pinned devices
    (`device_ids`, a list of one host's devices; `device_id` is the same as a
    one-element list, and only one of the two may be given).

    `count` (1..COUNT_MAX, default 1) devices, all on one host, each matching
    the selector, granted together or not at all; a pinned job gets exactly
    its list (a count other than 1 must equal the list's length).

    A hold (kind=hold) carries no command, cwd, env, idle timeout or attached
    stdio, needs max_runtime_seconds (its TTL) and a non-blank reason.
    `as_user` lets an admin submit on someone's behalf (403 for anyone else).
    `array` (rc.proto.arrayspec SPEC) makes an array: one job per index, all
    queued in one transaction, at most K running at once with "%K";
    `array_items` gives each element an item (RC_ARRAY_ITEM), the indices
    then 0..n-1 unless `array` names as many. `after` lists dependencies,
    "JOB[:ok|:notok|:any]" (model.parse_after; at most AFTER_MAX; an
    array's id means every element of it).
    `env` names are model.ENV_NAME_RE (400 bad_request naming a bad one).
    `requeue_on_hardware` (default true): a hardware failure of the job
    (JobReport.hardware_cause) puts it back in the queue, away from the
    faulty devices, at most model.RESTARTS_MAX times (README "GPU health").
    `export` (rc.proto.exports grammar; "" the controller's default, rc serve
    --export-default) says what of `caller_env`, the submitting shell's
    environment as the client sent it, the job takes; `env` goes on top
    (README "Your environment in a job"). `begin_at`: not before then
    (seconds since the epoch; 0: as soon as it can; README "Editing the queue").
    """

    command: tuple[str, ...] = ()
    device_id: str = ""
    selector: str = ""
    kind: JobKind = JobKind.JOB
    cwd: str = ""
    env: dict[str, str] = field(default_factory=dict)
    idempotency_key: str | None = None
    priority: int = 0
    max_runtime_seconds: int = 0
    idle_timeout_seconds: int = 0
    no_wait: bool = False
    reason: str = ""
    stdio: Stdio = Stdio.LOGS
    as_user: str = ""
    count: int = 1
    device_ids: tuple[str, ...] = ()
    name: str = ""
    array: str = ""
    array_items: tuple[str, ...] = ()
    after: tuple[str, ...] = ()
    hold_idle_timeout_seconds: int | None = None
    requeue_on_hardware: bool = True
    export: str = ""
    caller_env: dict[str, str] = field(default_factory=dict)
    begin_at: float = 0.0


@dataclass(frozen=True, slots=True)
class Dependency:
    """One dependency of a job as `rc show` lists it: the job it waits for,
    the condition, that job's state and exit code, and whether it is met."""

    job_id: int
    condition: str
    state: str
    exit_code: int | None = None
    met: bool = False


@dataclass(frozen=True, slots=True)
class ArraySummary:
    """GET /v1/arrays/{id}: an array (its id is its first element's) summed up.

    counts: JobState value → elements in it (states with none left out);
    failed_indices: the indices that ended without succeeding (failed,
    killed, lost), ascending; wall_seconds: from its first element's start
    to its last one's end (to now while any runs; None before any started).
    """

    array_id: int
    submitter: str
    size: int
    max_running: int
    spec: str
    counts: dict[str, int]
    failed_indices: tuple[int, ...]
    wall_seconds: float | None = None
    done: bool = False


@dataclass(frozen=True, slots=True)
class HoldIdle:
    """A hold's idle rule and its state (README "Holds: the idle rule").

    timeout_seconds: its idle timeout (0: off). While it runs with the rule
    on: idle_seconds since its last use, reclaim_at (wall seconds) when it
    is released if nothing happens, warned once the warning went out, and
    state in words ("idle 1h42m: no input, GPU 0 %, no forward")."""

    timeout_seconds: int
    idle_seconds: float | None = None
    reclaim_at: float | None = None
    warned: bool = False
    state: str = ""


@dataclass(frozen=True, slots=True)
class JobDetail:
    """What `rc show JOB` adds to a job (GET /v1/jobs/{id}?detail=1).

    waited_seconds: from queued to started (to now while queued; to its end
    when it ended unstarted); ran_seconds: from started to its end (to now
    while running), None when it never started. ceiling_seconds: the lowest
    runtime ceiling of its devices (of its pinned ones while queued; 0:
    none, or not known yet). log_bytes: the stored log's size. explain: for a
    queued job, the first sentence of `rc explain JOB` ("" otherwise).
    The controller's history settings (README "History that ends"):
    retain_seconds (rc serve --retain, 0: kept for ever), removed_at (when a
    finished job will be deleted, seconds since the epoch; 0: not finished or
    kept for ever) and log_quota_bytes (rc serve --log-quota, 0: none).
    """

    waited_seconds: float | None = None
    ran_seconds: float | None = None
    ceiling_seconds: int = 0
    log_bytes: int = 0
    explain: str = ""
    array: ArraySummary | None = None
    after: tuple[Dependency, ...] = ()
    idle: HoldIdle | None = None
    retain_seconds: float = 0.0
    removed_at: float = 0.0
    log_quota_bytes: int = 0


@dataclass(frozen=True, slots=True)
class JobView:
    """GET /v1/jobs/{id}: the job and, while queued, its 1-based position;
    `detail` only when asked for (detail=1)."""

    job: Job
    queue_position: int = 0
    detail: JobDetail | None = None


@dataclass(frozen=True, slots=True)
class JobList:
    """GET /v1/jobs: newest first, each job listed: its command and reasons
    cut to rc.proto.listed.LISTED_TEXT_CHARS (GET /v1/jobs/ID has them
    whole). `next_before`: pass it as `before` for the next page (0 when
    this page was the last)."""

    jobs: tuple[Job, ...]
    next_before: int = 0


@dataclass(frozen=True, slots=True)
class ExtendRequest:
    """POST /v1/jobs/{id}/extend: add `seconds` (1 to 100 years) to a hold's ttl."""

    seconds: int


@dataclass(frozen=True, slots=True)
class UpdateRequest:
    """POST /v1/jobs/{id}/update: change a queued job (README "Editing the
    queue"); a field left None stays as it is. `priority` within the
    caller's limit; `name` ("" for none); `max_runtime_seconds` (a user may
    only shorten it; lengthening, or 0 for the devices' ceiling, is an
    admin's); `stashed` parks it in its place or lets it go again;
    `begin_at` the time before which it may not start (seconds since the
    epoch; 0: none); `selector` and `count` (1..COUNT_MAX) for a job that
    asked by selector (not one pinned to devices)."""

    priority: int | None = None
    name: str | None = None
    max_runtime_seconds: int | None = None
    stashed: bool | None = None
    begin_at: float | None = None
    selector: str | None = None
    count: int | None = None


@dataclass(frozen=True, slots=True)
class ExtendResult:
    """What rc extend did: the hold's ttl is now `ttl_seconds` (from its start)."""

    job_id: int
    ttl_seconds: int


@dataclass(frozen=True, slots=True)
class KillRequest:
    """POST /v1/jobs/{id}/kill; `reason` is optional free text."""

    reason: str = ""


KILL_MANY_MAX = 10_000
"""The most job ids one POST /v1/jobs/kill takes (an array's most elements)."""


@dataclass(frozen=True, slots=True)
class KillManyRequest:
    """POST /v1/jobs/kill: kill or cancel each job of `ids` (at most
    KILL_MANY_MAX) in one transaction; `reason` is optional free text."""

    ids: tuple[int, ...]
    reason: str = ""


@dataclass(frozen=True, slots=True)
class KillOutcome:
    """What a kill of one job of a KillManyRequest did: `ok` with what
    happened in words, or the refusal's code (an ErrorCode value) and message."""

    job_id: int
    ok: bool
    message: str
    code: str = ""


@dataclass(frozen=True, slots=True)
class KillManyResult:
    """The answer to POST /v1/jobs/kill: one outcome per id, in the order given."""

    results: tuple[KillOutcome, ...]


@dataclass(frozen=True, slots=True)
class DeviceHolder:
    """Who holds a device a queued job could use, and until when at most
    (`until`: seconds since the epoch; None when the holder has no time
    limit)."""

    device_id: str
    job_id: int
    holder: str
    kind: str
    reason: str = ""
    until: float | None = None


@dataclass(frozen=True, slots=True)
class HostFit:
    """One host a queued job could run on: how many of its devices match the
    job (ceiling applied), how many of those are free now, how many the job
    needs, and who holds the matching devices that are taken."""

    host: str
    matching: int
    free: int
    count: int
    held: tuple[DeviceHolder, ...] = ()


@dataclass(frozen=True, slots=True)
class ReservationView:
    """Devices a queued job reserved: no later job may take them unless it
    ends before `start_at` (seconds since the epoch, when they are expected
    free at the latest; None: a holder has no time limit)."""

    device_ids: tuple[str, ...]
    start_at: float | None = None


@dataclass(frozen=True, slots=True)
class JobExplanation:
    """GET /v1/jobs/{id}/explain: why a queued job is not running, in words.

    `reasons` are complete sentences, most important first; `blockers` maps a
    matching device id to why it cannot take this job now; `hosts` says, per
    host the job could run on, how many matching devices are free and who
    holds the rest; `reservation` names the devices this job reserved.
    """

    job_id: int
    state: str
    reasons: tuple[str, ...]
    queue_position: int = 0
    blockers: dict[str, str] = field(default_factory=dict)
    hosts: tuple[HostFit, ...] = ()
    reservation: ReservationView | None = None
    priority: str = ""
    """Every term of its effective priority in one line ("priority 0 + aging 2
    - fair share 3 (alice: ...) = -1")."""
