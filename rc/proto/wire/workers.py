"""Wire records of the worker protocol: register, labels, heartbeat, leave,
assignments, survivor scans, reports and log appends, faults."""

from __future__ import annotations

from dataclasses import dataclass, field

from rc.proto.model import JobKind, JobState, Link, RecoveryProof, Stdio
from rc.proto.wire.relay import SessionStart

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
