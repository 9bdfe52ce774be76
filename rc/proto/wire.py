"""Request and response records of the HTTP API (docs/design.md#the-wire).

One definition per record, imported by controller, worker and CLI. Headers
live here too, and every route a client calls in rc.proto.calls, so the three
sides cannot drift.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rc.proto import API, INSTANCE_HEADER
from rc.proto.model import (
    Device,
    Event,
    Job,
    JobKind,
    JobState,
    Label,
    Link,
    RecoveryProof,
    Role,
    Stdio,
    Token,
)

WORKER_PROTOCOL = 2
"""The worker protocol this rc speaks, sent in RegisterRequest.protocol.
1: the protocol of workers from before the field (they omit it): work comes
only from the long poll. 2: a reports request may ask for the new
assignments in its reply (POST /v1/workers/{id}/reports?assignments=1). A
controller takes 1 and 2; a worker it does not know the protocol of is
refused (400 bad_request naming both numbers)."""

LOG_TAIL_BYTES = 64 << 10
"""The most output bytes one JobReport carries as its log tail (before
base64); a controller that takes tails says so in RegisterResponse.log_tail_bytes."""
LOG_TAILS_PER_REQUEST = 256 << 10
"""The most log-tail bytes (before base64) a worker puts in one reports
request: about 342 KiB of base64, well under the controller's body limit."""

__all__ = [
    "API",
    "INSTANCE_HEADER",
    "LOG_TAILS_PER_REQUEST",
    "LOG_TAIL_BYTES",
    "WORKER_PROTOCOL",
    "ActionResult",
    "ArraySummary",
    "Assignment",
    "Assignments",
    "ClearRequest",
    "Dependency",
    "DescribeResponse",
    "DeviceDecl",
    "DeviceHolder",
    "DeviceLink",
    "DeviceList",
    "DeviceView",
    "DrainRequest",
    "EventList",
    "ExplainResponse",
    "ExtendRequest",
    "ExtendResult",
    "FaultRequest",
    "HeartbeatRequest",
    "HeartbeatResponse",
    "HoldIdle",
    "HoldUse",
    "HostFit",
    "JobDetail",
    "JobExplanation",
    "JobList",
    "JobReport",
    "JobView",
    "KillRequest",
    "LabelsRequest",
    "LeaveRequest",
    "LeaveResponse",
    "LocalSession",
    "LogAppended",
    "RecheckRequest",
    "RecheckResponse",
    "RegisterRequest",
    "RegisterResponse",
    "ReportResult",
    "ReportResults",
    "Reports",
    "ReservationView",
    "ScanRequest",
    "ScanResult",
    "SessionReport",
    "SessionRequest",
    "SessionStart",
    "SessionView",
    "ShareList",
    "ShareSet",
    "ShareView",
    "SignInCode",
    "SignInRequest",
    "SignInSession",
    "StateResponse",
    "SubmitRequest",
    "Survivor",
    "TokenCreate",
    "TokenCreated",
    "TokenList",
    "TokenRevoked",
    "UndrainRequest",
    "UsageReport",
    "UsageRow",
    "WhoAmI",
]

# INSTANCE_HEADER and API are defined in rc.proto (cheap to import) and re-exported here.


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
    """

    waited_seconds: float | None = None
    ran_seconds: float | None = None
    ceiling_seconds: int = 0
    log_bytes: int = 0
    explain: str = ""
    array: ArraySummary | None = None
    after: tuple[Dependency, ...] = ()
    idle: HoldIdle | None = None


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
class DeviceDecl:
    """A device as a worker declares it at registration.

    max_runtime_seconds is the device's runtime ceiling (0: none).
    """

    name: str
    max_runtime_seconds: int = 0


@dataclass(frozen=True, slots=True)
class DeviceLink:
    """How two devices of the registering host are connected (device names,
    either order; from `nvidia-smi topo -m`). A pair a host leaves out is
    `unknown` when the host reports any link, and "no topology" (every pair
    equal, as for CPU devices) when it reports none."""

    a: str
    b: str
    link: Link


@dataclass(frozen=True, slots=True)
class RegisterRequest:
    """POST /v1/workers/register.

    labels: detected facts, "" → host-wide, device name → that device; None
    means "say nothing" (keep what is stored). declared_labels: the operator's
    labels, same shape. sheet: host.md (None keeps the stored copy);
    device_sheets: device name → body. instance: a random id of this worker
    process; running_job_ids: the jobs it still supervises or reports. When
    the same process registers again, assigned jobs it never started are
    handed out again instead of being lost. links: the host's topology
    (DeviceLink), replacing what was stored (None keeps it).

    Whom it runs jobs as: `run_as` "" means every job as the job's own Unix
    user (a worker running as root); a name means only as that user, its
    own (a worker not running as root), so the controller hands its devices
    only to that user's jobs, unless `shared_account` (any identity's job
    runs as `run_as`). `allow_root_jobs`: a job whose Unix user is root may
    run here.
    """

    host: str
    devices: tuple[DeviceDecl, ...]
    boot_id: str = ""
    recovery: RecoveryProof = field(default_factory=RecoveryProof)
    labels: dict[str, dict[str, str]] | None = None
    declared_labels: dict[str, dict[str, str]] | None = None
    sheet: str | None = None
    device_sheets: dict[str, str] = field(default_factory=dict)
    version: str = ""
    instance: str = ""
    running_job_ids: tuple[int, ...] = ()
    links: tuple[DeviceLink, ...] | None = None
    run_as: str = ""
    shared_account: bool = False
    allow_root_jobs: bool = False
    protocol: int = 1
    """The worker protocol it speaks (WORKER_PROTOCOL); omitted: 1."""


@dataclass(frozen=True, slots=True)
class RegisterResponse:
    """The worker's id (its host name), the controller's instance id and the
    heartbeat interval the controller expects, in seconds. `log_tail_bytes`:
    the most log-tail bytes per job this controller takes in a report
    (JobReport.log_tail, LOG_TAIL_BYTES); 0, or missing in the reply of a
    controller from before tails: none, so the worker sends none (that
    controller would refuse the field)."""

    worker_id: str
    instance: str
    heartbeat_seconds: float
    log_tail_bytes: int = 0


@dataclass(frozen=True, slots=True)
class LabelsRequest:
    """POST /v1/workers/{id}/labels: a periodic re-probe. Touches labels,
    sheets and the host's topology (`links`: None keeps what is stored) only,
    never jobs or device states."""

    host: str
    devices: tuple[str, ...] = ()
    labels: dict[str, dict[str, str]] | None = None
    declared_labels: dict[str, dict[str, str]] | None = None
    sheet: str | None = None
    device_sheets: dict[str, str] = field(default_factory=dict)
    links: tuple[DeviceLink, ...] | None = None


@dataclass(frozen=True, slots=True)
class HoldUse:
    """Whether a running hold was in use since the worker's previous
    heartbeat (the idle rule, README "Holds: the idle rule"): `busy`, and
    what was read: the highest utilization.gpu of its GPUs (percent), or on
    CPU devices its processes' CPU use (percent of one core); None: not read."""

    job_id: int
    busy: bool = False
    gpu_pct: int | None = None
    cpu_pct: int | None = None


@dataclass(frozen=True, slots=True)
class HeartbeatRequest:
    """POST /v1/workers/{id}/heartbeat: the jobs this worker still
    supervises, and the use of its running holds (`hold_use`)."""

    running_job_ids: tuple[int, ...] = ()
    hold_use: tuple[HoldUse, ...] = ()


@dataclass(frozen=True, slots=True)
class HeartbeatResponse:
    """Jobs the worker named that the controller no longer considers active
    (so the worker can stop them), the controller's instance id, and the
    ttl in seconds of each hold it named, by id (`rc extend` changes it; the
    worker's watchdog follows)."""

    instance: str
    stop_job_ids: tuple[int, ...] = ()
    hold_ttls: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class LeaveRequest:
    """POST /v1/workers/{id}/leave: a worker process stopping cleanly.

    A positive claim by the process `instance` (RegisterRequest.instance):
    it will start nothing more, and of the jobs assigned to it, it started
    (or may have started) only those in `started_job_ids` (every job it
    started whose terminal report the controller has not yet accepted).
    Every other job still assigned to it provably never started: it goes
    back to the queue in its old place.
    """

    instance: str
    started_job_ids: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class LeaveResponse:
    """The assigned jobs the leave put back in the queue, and those it ended
    instead because a kill had been requested for them."""

    requeued_job_ids: tuple[int, ...] = ()
    killed_job_ids: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class Assignment:
    """One job handed to a worker by the long poll.

    device_ids: every device the job got, in the order chosen (its
    RC_DEVICES); device_id is the first. One job is one process group
    across all of them. (A controller from before jobs had several devices
    sends no device_ids: the job has device_id alone.) `unix_user` is the
    Unix user it runs as (model.Job.unix_user). `restart_count`: how many
    times a hardware failure requeued it (its RC_RESTART_COUNT, 0 on the
    first run); `log_offset`: the byte offset its output starts at in the
    stored log (after the earlier runs' output and the restart's separator
    line; 0 on the first run); `log_mid_line`: the stored log ends inside a
    line (the separator then starts on a new one).
    """

    job_id: int
    device_id: str
    kind: JobKind
    command: tuple[str, ...]
    cwd: str
    env: dict[str, str]
    submitter: str
    max_runtime_seconds: int = 0
    idle_timeout_seconds: int = 0
    stdio: Stdio = Stdio.LOGS
    device_ids: tuple[str, ...] = ()
    unix_user: str = ""
    restart_count: int = 0
    log_offset: int = 0
    log_mid_line: bool = False

    @property
    def devices(self) -> tuple[str, ...]:
        """The job's devices, in order (device_ids, else device_id alone)."""
        return self.device_ids or (self.device_id,)


@dataclass(frozen=True, slots=True)
class ScanRequest:
    """A survivor scan the controller asks a worker for (Assignments.scans):
    processes left of `job_ids` (their cgroups, their RC_JOB_ID) or of any
    job on `device_ids` (RC_DEVICES naming one, compute processes on its
    GPU). `kill`: end them (TERM, the kill grace, KILL) and scan again. The
    worker answers at POST /v1/workers/{id}/scans/{scan_id}."""

    scan_id: int
    device_ids: tuple[str, ...] = ()
    job_ids: tuple[int, ...] = ()
    kill: bool = False


@dataclass(frozen=True, slots=True)
class Survivor:
    """A process a survivor scan found: its pid, command line, and where it
    was found ("cgroup job-58", "RC_JOB_ID=58", "GPU GPU-...")."""

    pid: int
    command: str = ""
    where: str = ""


@dataclass(frozen=True, slots=True)
class ScanResult:
    """POST /v1/workers/{id}/scans/{scan_id}: what a survivor scan found.

    survivors: alive at the end (after the kill, when asked for one);
    ended: ended by the kill; complete: the scan could read every process
    (False: "none found" proves nothing); error: why it could not run.
    health: each scanned GPU device's health read afresh (device id →
    rc.worker.health.proof_status: "ok", "fault:row-remap-failed",
    "drain:row-remap-pending unknown:ecc-uncorrected" (every kind that
    applies, space-separated), "unreadable" when nvidia-smi could not read
    it); devices that are no GPU are absent.
    """

    survivors: tuple[Survivor, ...] = ()
    ended: tuple[Survivor, ...] = ()
    complete: bool = True
    error: str = ""
    health: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class RecheckRequest:
    """POST /v1/workers/{id}/recheck: the worker's periodic survivor scan
    (every recheck_interval) while devices of it may be out with survivors;
    a proof that proves returns them (rc.controller.store.workers.recover)."""

    recovery: RecoveryProof


@dataclass(frozen=True, slots=True)
class RecheckResponse:
    """The devices the re-check returned to the pool."""

    recovered: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class ClearRequest:
    """POST /v1/devices/{id}/clear: `kill` ends the survivors the scan finds,
    then scans again; `force` clears without a scan (for a scan that cannot
    run; the event says so)."""

    kill: bool = False
    force: bool = False


@dataclass(frozen=True, slots=True)
class Assignments:
    """GET /v1/workers/{id}/assignments: new jobs, jobs to kill, sessions
    inside holds, survivor scans."""

    assignments: tuple[Assignment, ...] = ()
    kills: tuple[int, ...] = ()
    sessions: tuple[SessionStart, ...] = ()
    scans: tuple[ScanRequest, ...] = ()


@dataclass(frozen=True, slots=True)
class JobReport:
    """One job's status inside a batch of reports, from the worker running it.

    state is "running" or a terminal state; exit_code is the process's code
    (128+N for death by signal N); reason says why (kill reason, watchdog);
    started_at is when the process started, by the worker's clock.
    hardware_cause: for a job that ended unsuccessfully, what of the
    hardware made it end ("Xid 79 on HOST:gpu3: GPU has fallen off the
    bus"; "" when nothing did: its own failure), and hardware_device_ids
    the faulty devices (ids) of its own; a job with a cause may be
    requeued (README "GPU health").

    `log_offset` and `log_tail`: the job's output the worker holds and the
    controller has not acknowledged yet, `log_tail` base64 (RFC 4648, with
    padding) of at most LOG_TAIL_BYTES bytes starting at stream offset
    `log_offset`. The controller stores it as POST /v1/jobs/{id}/logs?offset=N
    would (what it has is skipped, a gap is refused), before it applies the
    report; ReportResult.log_size says how far the log then reaches. Only
    sent to a controller whose RegisterResponse.log_tail_bytes is not 0."""

    job_id: int
    state: JobState
    exit_code: int | None = None
    reason: str = ""
    started_at: float | None = None
    hardware_cause: str = ""
    hardware_device_ids: tuple[str, ...] = ()
    log_offset: int | None = None
    log_tail: str = ""


@dataclass(frozen=True, slots=True)
class Reports:
    """POST /v1/workers/{id}/reports: several status reports in one request."""

    reports: tuple[JobReport, ...]


@dataclass(frozen=True, slots=True)
class ReportResult:
    """The outcome of one report: ok, or the error code and message.

    For a report that carried a log tail: `log_size`, the offset the job's
    stored log reaches after it (the next append starts there; the worker
    may forget the bytes before it), or None and `log_error`, the error code
    of the refused tail (logs_not_stored for a tty job, offset_gap,
    limit_exceeded past LOG_TAIL_BYTES, bad_request for bad base64,
    not_found, not_worker_job); the report itself is applied either way."""

    job_id: int
    ok: bool
    error: str = ""
    message: str = ""
    log_size: int | None = None
    log_error: str = ""


@dataclass(frozen=True, slots=True)
class ReportResults:
    """The answer to Reports, in the same order. `assignments`, only when
    the request asked for them (?assignments=1, worker protocol 2): every
    job assigned to the worker and not yet running, read after the reports'
    commit and the scheduling pass it ran (so the devices the reports freed
    carry their next jobs); the same as a long poll would hand out, and again
    in every such reply until the job runs, so a lost reply loses nothing
    (the worker never starts a job id and restart count twice)."""

    results: tuple[ReportResult, ...]
    assignments: tuple[Assignment, ...] = ()


@dataclass(frozen=True, slots=True)
class LogAppended:
    """POST /v1/jobs/{id}/logs?offset=N: the log's size after the append, in
    bytes of the job's output stream (the offset the next append starts at)."""

    size: int


@dataclass(frozen=True, slots=True)
class FaultRequest:
    """POST /v1/devices/{id}/fault: quarantine a device as `fault`; with
    `drain`, drain it instead (its job finishes, no new one starts: a GPU
    health rule, rc.worker.health)."""

    reason: str
    job_id: int | None = None
    drain: bool = False


@dataclass(frozen=True, slots=True)
class DeviceView:
    """A device with who holds it (GET /v1/devices, /v1/state).

    elapsed_seconds: since the live lease was acquired; expires_at: the lease's
    expiry (a hold's end at most). heartbeat_age_seconds: controller clock.
    """

    device: Device
    holder: str = ""
    job_id: int | None = None
    kind: str = ""
    reason: str = ""
    command: tuple[str, ...] = ()
    elapsed_seconds: float | None = None
    max_runtime_seconds: int = 0
    expires_at: float | None = None
    heartbeat_age_seconds: float | None = None


@dataclass(frozen=True, slots=True)
class DeviceList:
    """GET /v1/devices."""

    devices: tuple[DeviceView, ...]


@dataclass(frozen=True, slots=True)
class DescribeResponse:
    """GET /v1/devices/{id}/describe: everything about one device.

    label_age_seconds is keyed "key/source". sheet is the device's usage sheet,
    or the host-wide one when the device has none (sheet_is_host_wide).
    health_history: the device's GPU health events (faults and drains of
    its health rules, and the clears, undrains and recoveries), newest first.
    """

    view: DeviceView
    labels: tuple[Label, ...] = ()
    label_age_seconds: dict[str, float] = field(default_factory=dict)
    sheet: str = ""
    sheet_is_host_wide: bool = False
    sheet_age_seconds: float | None = None
    recent_jobs: tuple[Job, ...] = ()
    health_history: tuple[Event, ...] = ()


@dataclass(frozen=True, slots=True)
class ExplainResponse:
    """GET /v1/explain?selector=S: which devices match, which are free, and how
    many queued jobs compete for them."""

    selector: str
    matching: tuple[str, ...]
    free: tuple[str, ...]
    queue_depth: int


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
class UsageRow:
    """One row of the usage ledger (GET /v1/usage): `key` is the user, host,
    device, day (YYYY-MM-DD, UTC) or week (its Monday) it counts.

    device_seconds: device-time held in the window (one lease per device: a
    job on 4 devices for an hour is 4 device-hours); jobs / holds: those that
    held a device in the window, by state (running or assigned while still
    on); idle_hold_seconds: the device-time of holds in which no session
    (rc shell, rc exec, rc cp --hold) was ever opened; waits: jobs and holds
    granted in the window, with the 50th and 95th percentile of how long
    they were queued (seconds, nearest rank; 0 when none)."""

    key: str
    device_seconds: float = 0.0
    jobs: dict[str, int] = field(default_factory=dict)
    holds: dict[str, int] = field(default_factory=dict)
    idle_hold_seconds: float = 0.0
    waits: int = 0
    wait_p50_seconds: float = 0.0
    wait_p95_seconds: float = 0.0


@dataclass(frozen=True, slots=True)
class UsageReport:
    """GET /v1/usage: the ledger over [since, until] (seconds since the
    epoch), one row per `by` key (largest device-time first; days and weeks
    in order), and the total over them all."""

    by: str
    since: float
    until: float
    rows: tuple[UsageRow, ...]
    total: UsageRow
    user: str = ""


@dataclass(frozen=True, slots=True)
class ShareView:
    """One user's fair share (GET /v1/shares): weight, entitlement and share
    (fractions 0..1), decayed usage (device-seconds) and the adjustment in
    priority steps (README "Sharing fairly")."""

    user: str
    weight: float
    entitled: float
    share: float
    decayed_device_seconds: float
    adjust: int


@dataclass(frozen=True, slots=True)
class ShareList:
    """GET /v1/shares: fair share's half-life (seconds; 0: off) and every user's
    standing (those with decayed usage, a queued job or a weight set)."""

    half_life_seconds: float
    shares: tuple[ShareView, ...]


@dataclass(frozen=True, slots=True)
class ShareSet:
    """POST /v1/shares/{user}: the user's fair-share weight (0.01 <= weight <= 1000; 1
    is everyone's default)."""

    weight: float


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


@dataclass(frozen=True, slots=True)
class StateResponse:
    """GET /v1/state: the fleet, active jobs and the queue in scheduling order,
    and the idle clocks of the running holds (README "Holds: the idle rule").
    Every job, and every holder's command and reason, is listed: cut to
    rc.proto.listed.LISTED_TEXT_CHARS (GET /v1/jobs/ID has a job whole)."""

    devices: tuple[DeviceView, ...]
    jobs: tuple[Job, ...]
    queued: tuple[Job, ...]
    queued_waiting_seconds: dict[str, float] = field(default_factory=dict)
    queue_positions: dict[str, int] = field(default_factory=dict)
    holds_idle: dict[str, HoldIdle] = field(default_factory=dict)
    """The idle rule's state of each running hold whose rule is on, by id."""


@dataclass(frozen=True, slots=True)
class WhoAmI:
    """GET /v1/whoami: the caller's token name and role (never the secret),
    a worker token's bound host, and the Unix user its jobs run as; who it
    is, `principal` (rc.proto.model.Principal: `token:<id>` or `uid:<uid>`,
    what a job's `owner` is compared with), and its display `label`
    ("alice", "alice (token laptop)")."""

    name: str
    role: Role
    host: str = ""
    unix_user: str = ""
    principal: str = ""
    label: str = ""


@dataclass(frozen=True, slots=True)
class LocalSession:
    """The one JSON line the controller's local Unix socket answers
    (rc.proto.localsocket): a bearer token for the Unix user the kernel says
    is on the other end (SO_PEERCRED), valid until `expires_at` (seconds
    since the epoch) and only in the controller's memory, for the HTTP API
    at `url`. name and unix_user are that user's name; role is user (admin
    for uid 0). A refusal is the error shape {"error", "message"} instead."""

    token: str
    name: str
    role: Role
    unix_user: str
    expires_at: float
    url: str


@dataclass(frozen=True, slots=True)
class SignInCode:
    """POST /v1/dashboard/code: a one-time code for the dashboard, acting as
    the caller who asked (rc.controller.signin), valid once until
    `expires_at` (seconds since the epoch, `expires_in_seconds` from now).
    Not a token: it opens nothing but POST /v1/dashboard/session."""

    code: str
    expires_at: float
    expires_in_seconds: float


@dataclass(frozen=True, slots=True)
class SignInRequest:
    """POST /v1/dashboard/session: the code `rc dashboard` printed."""

    code: str


@dataclass(frozen=True, slots=True)
class SignInSession:
    """POST /v1/dashboard/session: a session token acting as the code's
    caller (`name`, `role`), in the controller's memory only, valid until
    `expires_at` (seconds since the epoch; never past the caller's own
    token)."""

    token: str
    name: str
    role: Role
    expires_at: float


@dataclass(frozen=True, slots=True)
class TokenCreate:
    """POST /v1/tokens. expires_in_seconds 0 means never. `unix_user`: whom
    the token's jobs run as ("": the token's own name, which must then be a
    Unix user name; root only when given here; none for a worker token)."""

    name: str
    role: Role
    expires_in_seconds: int = 0
    unix_user: str = ""


@dataclass(frozen=True, slots=True)
class TokenCreated:
    """The only response that ever carries a token's secret."""

    token: Token
    secret: str


@dataclass(frozen=True, slots=True)
class TokenList:
    """GET /v1/tokens."""

    tokens: tuple[Token, ...]


@dataclass(frozen=True, slots=True)
class EventList:
    """GET /v1/events: feed rows with id > after, oldest first."""

    events: tuple[Event, ...]


@dataclass(frozen=True, slots=True)
class DrainRequest:
    """POST /v1/devices/{id}/drain."""

    reason: str = ""


@dataclass(frozen=True, slots=True)
class UndrainRequest:
    """POST /v1/devices/{id}/undrain: `force` undrains a device a GPU health
    rule drained without re-probing it (README "GPU health")."""

    force: bool = False


@dataclass(frozen=True, slots=True)
class ActionResult:
    """The answer to an admin verb: what was done, in words. `already`: the
    effect was in place before (drain a draining device, undrain one that is
    not): nothing changed and no event was recorded; the message says since
    when and by whom where it knows."""

    ok: bool
    message: str = ""
    already: bool = False


@dataclass(frozen=True, slots=True)
class TokenRevoked:
    """DELETE /v1/tokens/{name}[?keep_jobs=true]: the token is revoked; the
    ids of the queued jobs and holds of its name that were cancelled with it
    (none with keep_jobs)."""

    ok: bool
    message: str = ""
    cancelled_job_ids: tuple[int, ...] = ()


# ---------------------------------------------------------------- sessions inside a hold
# (`rc shell HOLD`, `rc exec HOLD`, `rc cp --hold`). A session runs on
# the device a hold already has, under the hold's lease: no second lease, no
# job row. The controller keeps it in memory only and hands it to the hold's
# worker through the assignments long poll (Assignments.sessions).


@dataclass(frozen=True, slots=True)
class SessionRequest:
    """POST /v1/jobs/{hold_id}/sessions: start a process inside a hold you own.

    stdio is tty (a terminal; an empty command means the login shell of the
    worker's user) or pipe (raw stdin and stdout, stderr kept). rows and cols
    are the terminal's initial size (0: the default 24x80).

    port (1..65535) makes it one connection of a port forward (`rc forward`):
    no process; the worker connects to 127.0.0.1:port on the hold's host and
    relays its bytes both ways (stdio pipe, no command, cwd or env).
    """

    stdio: Stdio
    command: tuple[str, ...] = ()
    cwd: str = ""
    env: dict[str, str] = field(default_factory=dict)
    rows: int = 0
    cols: int = 0
    port: int = 0


@dataclass(frozen=True, slots=True)
class SessionStart:
    """A session for a worker to start on a hold it runs (in Assignments).
    device_ids: every device of the hold, in order (device_id is the first);
    the session sees them all, as the hold's job would."""

    session_id: int
    hold_id: int
    device_id: str
    stdio: Stdio
    command: tuple[str, ...]
    cwd: str
    env: dict[str, str]
    submitter: str
    rows: int = 0
    cols: int = 0
    device_ids: tuple[str, ...] = ()
    port: int = 0
    """A forward's loopback port on the hold's host (0: run `command`)."""

    @property
    def devices(self) -> tuple[str, ...]:
        """The hold's devices, in order (device_ids, else device_id alone)."""
        return self.device_ids or (self.device_id,)


@dataclass(frozen=True, slots=True)
class SessionReport:
    """POST /v1/jobs/{hold_id}/sessions/{id}/status from the hold's worker.

    state is "running" or "ended"; exit_code is the process's code (128+N for
    signal N; None when it never started); stderr is the tail of a pipe
    session's standard error (at most 64 KiB, decoded as UTF-8 with
    replacement), stderr_dropped how many bytes before it were not kept.
    """

    state: str
    exit_code: int | None = None
    reason: str = ""
    stderr: str = ""
    stderr_dropped: int = 0


@dataclass(frozen=True, slots=True)
class SessionView:
    """A session as the controller knows it (GET /v1/jobs/{hold}/sessions/{id}).

    state: starting (waiting for the worker), running, ended. The record is
    kept in memory for a while after it ended, then forgotten.
    """

    session_id: int
    hold_id: int
    device_id: str
    stdio: Stdio
    state: str
    exit_code: int | None = None
    reason: str = ""
    stderr: str = ""
    stderr_dropped: int = 0
