"""The entities shared by controller, worker and client.

Frozen dataclasses and string enums holding JSON primitives only: timestamps
are float seconds since the Unix epoch, durations whole seconds. Encode and
decode them with rc.proto.codec. The rules of names (hosts, devices, tokens,
Unix users, principals, job names) are rc.proto.names, re-exported here.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from rc.proto.names import (
    ENV_NAME_RE,
    JOB_NAME_MAX,
    JOB_NAME_RE,
    NAME_RE,
    PRINCIPAL_RE,
    ROOT,
    SHARE_WEIGHT_MAX,
    SHARE_WEIGHT_MIN,
    TOKEN_NAME_RE,
    UNIX_USER_RE,
    Principal,
    device_list,
    token_label,
    valid_device_id,
    valid_env_name,
    valid_job_name,
    valid_unix_user,
)

__all__ = [
    "AFTER_MAX",
    "COUNT_MAX",
    "ENV_NAME_RE",
    "JOB_NAME_MAX",
    "JOB_NAME_RE",
    "NAME_RE",
    "PRINCIPAL_RE",
    "PRIORITY_MAX",
    "PRIORITY_MIN",
    "RESTARTS_MAX",
    "ROOT",
    "SHARE_WEIGHT_MAX",
    "SHARE_WEIGHT_MIN",
    "TOKEN_NAME_RE",
    "UNIX_USER_RE",
    "Condition",
    "Device",
    "DeviceState",
    "Event",
    "EventKind",
    "Job",
    "JobKind",
    "JobState",
    "Label",
    "LabelSource",
    "Lease",
    "Link",
    "Principal",
    "QuarantineReason",
    "RecoveryProof",
    "Role",
    "Stdio",
    "Token",
    "Worker",
    "device_list",
    "parse_after",
    "token_label",
    "valid_device_id",
    "valid_env_name",
    "valid_job_name",
    "valid_unix_user",
]


PRIORITY_MIN = -10


PRIORITY_MAX = 10


COUNT_MAX = 64
"""The most devices one job or hold may ask for (all on one host)."""


RESTARTS_MAX = 3
"""The most times a hardware failure puts one job back in the queue."""


DEVICES_PER_WORKER_MAX = 1024
"""The most devices one worker may declare (the controller's limit too:
rc.controller.config Limits.devices_per_worker)."""


AFTER_MAX = 64
"""The most dependencies (`--after`) one job may name."""


class Condition(enum.StrEnum):
    """How a dependency must end for its dependent to start: OK (it
    succeeded), NOTOK (it failed, was killed or lost), ANY (it ended)."""

    OK = "ok"
    NOTOK = "notok"
    ANY = "any"

    def met_by(self, state: JobState) -> bool:
        """Whether a dependency that ended in `state` satisfies this condition."""
        if self is Condition.OK:
            return state is JobState.SUCCEEDED
        if self is Condition.NOTOK:
            return state in (JobState.FAILED, JobState.KILLED, JobState.LOST)
        return state.terminal


def parse_after(text: str) -> tuple[int, Condition]:
    """`JOB[:ok|:notok|:any]` (`--after`) → (job id, condition; ok by
    default). Raises ValueError naming the problem."""
    head, sep, cond = text.strip().partition(":")
    if not head.isascii() or not head.isdigit() or len(head) > 18 or int(head) < 1:
        raise ValueError(f"--after {text[:40]!r}: {head[:40]!r} is not a job id")
    try:
        condition = Condition(cond) if sep else Condition.OK
    except ValueError:
        raise ValueError(
            f"--after {text[:40]!r}: unknown condition {cond[:20]!r} (ok, notok or any)"
        ) from None
    return int(head), condition


class DeviceState(enum.StrEnum):
    """Where a device stands (docs/design.md#quarantine-and-proof).

    ready: schedulable. busy: a live lease is on it. unknown: its worker has
    been quiet for a while; not schedulable, not a quarantine. unhealthy:
    quarantined, with a QuarantineReason.
    """

    READY = "ready"
    BUSY = "busy"
    UNKNOWN = "unknown"
    UNHEALTHY = "unhealthy"


class QuarantineReason(enum.StrEnum):
    """Why an unhealthy device is out of the pool.

    NONE ("") on an unhealthy device means the cause is unknown; only an admin
    clears it, as it does FAULT. A reboot or a recovery proof may return the
    others (README "Reliability: quarantine and recovery").
    """

    NONE = ""
    FAULT = "fault"
    WORKER_LOST = "worker_lost"
    LEASE_EXPIRED = "lease_expired"
    REGISTRATION = "registration"

    @property
    def reboot_clearable(self) -> bool:
        """Whether a reboot or a recovery proof may return the device."""
        return self in (
            QuarantineReason.WORKER_LOST,
            QuarantineReason.LEASE_EXPIRED,
            QuarantineReason.REGISTRATION,
        )


class JobState(enum.StrEnum):
    """A job's life: queued → assigned → running → one terminal state."""

    QUEUED = "queued"
    ASSIGNED = "assigned"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    KILLED = "killed"
    LOST = "lost"

    @property
    def terminal(self) -> bool:
        """True for the four states that never change again."""
        return self in _TERMINAL

    @property
    def active(self) -> bool:
        """True while the job holds a device (assigned or running)."""
        return self in (JobState.ASSIGNED, JobState.RUNNING)


_TERMINAL = frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.KILLED, JobState.LOST})


class Link(enum.StrEnum):
    """How two GPUs of one host are connected, in `nvidia-smi topo -m`'s
    words, best first: NV (NVLink, any number of links), PIX (one PCIe
    switch), PXB (several PCIe switches), PHB (one PCIe host bridge), NODE
    (one NUMA node), SYS (across sockets), UNKNOWN (anything else, or a
    topology that could not be read). `rank` orders them, 0 best."""

    NV = "NV"
    PIX = "PIX"
    PXB = "PXB"
    PHB = "PHB"
    NODE = "NODE"
    SYS = "SYS"
    UNKNOWN = "unknown"

    @property
    def rank(self) -> int:
        """0 (NV) .. 6 (unknown): lower is a better link."""
        return _LINK_ORDER.index(self)


_LINK_ORDER = tuple(Link)


class JobKind(enum.StrEnum):
    """A job runs the submitted command; a hold runs the worker's own sleeper."""

    JOB = "job"
    HOLD = "hold"


class Stdio(enum.StrEnum):
    """Where a job's standard streams go (seed: StdioLogs / StdioTTY / StdioPipe).

    LOGS: no input, output batched to the controller's log store. TTY: a
    pseudo-terminal relayed to the client, never stored. PIPE: raw bytes both
    ways through the relay, stderr stored; `rc cp` and `rc exec` ride on it.
    """

    LOGS = ""
    TTY = "tty"
    PIPE = "pipe"

    @property
    def attached(self) -> bool:
        """Whether the process is wired to the relay rather than the log store."""
        return self is not Stdio.LOGS


class LabelSource(enum.StrEnum):
    """Where a label came from: a probe saw it, or an operator wrote it."""

    DETECTED = "detected"
    DECLARED = "declared"


class Role(enum.StrEnum):
    """A token's role (docs/design.md#identity-and-ownership). Admin passes every route."""

    ADMIN = "admin"
    USER = "user"
    WORKER = "worker"


class EventKind(enum.StrEnum):
    """Kinds of rows in the activity feed (docs/design.md#the-activity-feed)."""

    DEVICE_UNHEALTHY = "device_unhealthy"
    VERIFY_FAILED = "verify_failed"
    WORKER_LOST = "worker_lost"
    JOB_LOST = "job_lost"
    LEASE_EXPIRED = "lease_expired"
    WATCHDOG_TRIP = "watchdog_trip"
    DEVICE_RECOVERED = "device_recovered"
    RECOVERY_REFUSED = "recovery_refused"
    DEVICE_CLEARED = "device_cleared"
    DEVICE_RETIRED = "device_retired"
    DEVICE_DRAINED = "device_drained"
    DEVICE_UNDRAINED = "device_undrained"
    JOB_KILLED = "job_killed"
    SUBMITTED_AS = "submitted_as"
    TOKEN_CREATED = "token_created"
    TOKEN_REVOKED = "token_revoked"
    HOLD_IDLE_WARNING = "hold_idle_warning"
    HOLD_RECLAIMED = "hold_reclaimed"
    JOB_REQUEUED = "job_requeued"
    JOB_SUBMITTED = "job_submitted"
    """A submission through a program that named itself (rc.proto.VIA_HEADER)."""
    JOB_UPDATED = "job_updated"


@dataclass(frozen=True, slots=True)
class Label:
    """One fact about a device, with its provenance and last confirmation."""

    key: str
    value: str
    source: LabelSource = LabelSource.DETECTED
    updated_at: float = 0.0


@dataclass(frozen=True, slots=True)
class Device:
    """A schedulable unit on a host; id is "host:name"."""

    id: str
    host: str
    name: str
    worker_id: str
    state: DeviceState
    last_heartbeat_at: float = 0.0
    max_runtime_seconds: int = 0
    quarantine_reason: QuarantineReason = QuarantineReason.NONE
    quarantine_detail: str = ""
    draining: bool = False
    drain_reason: str = ""
    labels: tuple[Label, ...] = ()


@dataclass(frozen=True, slots=True)
class Job:
    """A request to run a command (or hold devices) on `count` devices of one
    host, each matching its selector, or on a pinned list of one host's devices.

    While queued, either `selector` is set, or `device_ids` is the pinned
    list (and `device_id` its first). Once assigned, `device_ids` are the
    devices it got, in the order chosen (the job's RC_DEVICES), and
    `device_id` is the first of them (RC_DEVICE). Durations are whole
    seconds, 0 meaning "none" (or, for max_runtime, the devices' ceiling).
    `submitter` is its display label (who submitted it, for people:
    "alice", "alice (token laptop)"), `owner` the Principal that owns it
    (str form: who may read its logs, kill it, attach to it), and
    `unix_user` the Unix user it runs as (its owner's, recorded at submit:
    the account fair share and the per-user limits count it against). `requeue_on_hardware`:
    whether a hardware failure puts it back in the queue (README "GPU
    health"); `restart_count` how many times it was (0..RESTARTS_MAX, its
    RC_RESTART_COUNT); `excluded_device_ids` the devices it must not be
    given again (the faulty ones). While queued, `stashed`: parked in its
    place (rc stash), and `begin_at`: not to start before then (seconds
    since the epoch; 0: no such time) (README "Editing the queue").
    """

    id: int
    kind: JobKind
    state: JobState
    submitter: str
    command: tuple[str, ...] = ()
    selector: str = ""
    device_id: str = ""
    worker_id: str = ""
    cwd: str = ""
    env: dict[str, str] = field(default_factory=dict)
    idempotency_key: str | None = None
    priority: int = 0
    max_runtime_seconds: int = 0
    idle_timeout_seconds: int = 0
    reason: str = ""
    stdio: Stdio = Stdio.LOGS
    exit_code: int | None = None
    kill_reason: str = ""
    submitted_at: float = 0.0
    queued_at: float = 0.0
    started_at: float | None = None
    finished_at: float | None = None
    count: int = 1
    device_ids: tuple[str, ...] = ()
    unix_user: str = ""
    name: str = ""
    array_id: int | None = None
    array_index: int | None = None
    array_item: str = ""
    requeue_on_hardware: bool = True
    restart_count: int = 0
    excluded_device_ids: tuple[str, ...] = ()
    owner: str = ""
    stashed: bool = False
    begin_at: float = 0.0


@dataclass(frozen=True, slots=True)
class Lease:
    """A job's claim on a device; at most one live (unreleased) per device."""

    id: int
    device_id: str
    job_id: int
    holder: str
    kind: JobKind
    acquired_at: float
    expires_at: float
    reason: str = ""
    released_at: float | None = None


@dataclass(frozen=True, slots=True)
class Worker:
    """The agent on one host; its id is the host name."""

    id: str
    host: str
    boot_id: str = ""
    last_heartbeat_at: float = 0.0


@dataclass(frozen=True, slots=True)
class RecoveryProof:
    """What a worker can prove at registration about an interrupted job's processes.

    Every field is a positive claim and the zero value proves nothing: a worker
    that could not look, or that declines to claim (require_manual_clear), sends
    all-false. No field can force recovery (seed: model.RecoveryProof).

    isolated: the worker is PID 1 alone in its PID namespace, so nothing from
    before can exist. survivors_checked: a scan for processes carrying an
    RC_JOB_ID ran to completion; survivors_found: it found some.
    """

    isolated: bool = False
    survivors_checked: bool = False
    survivors_found: bool = False

    def proves(self) -> bool:
        """Whether nothing of an interrupted job can still hold the device.

        Isolation answers it outright; a survivor check only when it ran and
        came back empty.
        """
        return self.isolated or (self.survivors_checked and not self.survivors_found)

    def summary(self) -> str:
        """Name the proof for an operator; empty when nothing is proven."""
        if self.isolated:
            return (
                "the worker is alone in a fresh PID namespace, so no process of the old job exists"
            )
        if self.survivors_checked and not self.survivors_found:
            return "a scan of every process found none left from an earlier job"
        return ""


@dataclass(frozen=True, slots=True)
class Event:
    """One row of the activity feed."""

    id: int
    at: float
    kind: EventKind
    device_id: str = ""
    job_id: int | None = None
    actor: str = ""
    text: str = ""


@dataclass(frozen=True, slots=True)
class Token:
    """A named API token as listed (the secret itself is never part of it).

    `host` is the host a worker token is bound to ("" until its first
    registration, and always "" for other roles). `unix_user` is the Unix
    user the jobs of a user or admin token run as ("" for a worker token).
    `id` is its tokens.id: the token is the principal `token:<id>`, which
    owns its jobs (a token made again under the same name has another id).
    """

    name: str
    role: Role
    created_at: float
    created_by: str = ""
    expires_at: float | None = None
    revoked_at: float | None = None
    host: str = ""
    unix_user: str = ""
    id: int = 0
