"""The controller's settings, every threshold in one place (docs/design.md#limits).

All durations are seconds. `rc serve` builds a ControllerConfig from its
flags; tests build one directly (with small thresholds and a fake clock).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ControllerConfig", "Limits"]


@dataclass(frozen=True, slots=True)
class Limits:
    """Every size limit the controller enforces, each with its own error code
    (docs/design.md#limits: every limit explicit and documented)."""

    body_bytes: int = 1 << 20
    """Largest JSON request body (413 body_too_large)."""
    heartbeat_body_bytes: int = 64 << 10
    """Largest heartbeat body (413 body_too_large)."""
    register_body_bytes: int = 4 << 20
    """Largest registration or labels body, sheets included (413 body_too_large)."""
    log_chunk_bytes: int = 1 << 20
    """Largest single log append (413 chunk_too_large)."""
    log_cap_bytes: int = 256 << 20
    """Per-job log cap; output past it is dropped and a marker says so."""
    argv_items: int = 4096
    """Most arguments in a command (400 limit_exceeded)."""
    argv_bytes: int = 256 << 10
    """Most bytes in a command's arguments together (400 limit_exceeded)."""
    env_items: int = 1024
    """Most environment entries per job, the exported shell's included (400
    limit_exceeded)."""
    env_bytes: int = 256 << 10
    """Most bytes in a job's environment together (400 limit_exceeded)."""
    text_bytes: int = 4096
    """Longest free-text field: reason, cwd, selector, names (400 limit_exceeded)."""
    labels_per_device: int = 256
    """Most labels per device and source (400 limit_exceeded)."""
    label_bytes: int = 1024
    """Longest label key or value (400 limit_exceeded)."""
    sheet_bytes: int = 64 << 10
    """Largest usage sheet (413 sheet_too_large)."""
    devices_per_worker: int = 1024
    """Most devices one worker may declare (400 limit_exceeded)."""
    links_per_worker: int = 2016
    """Most device pairs a worker's topology may name: every pair of 64 GPUs
    (400 limit_exceeded)."""
    queued_per_user: int = 10000
    """Most queued jobs per submitter (429 queue_full)."""
    queued_spec_bytes: int = 256 << 20
    """Most spec bytes of queued jobs per user (rc.controller.store.jobs.spec_bytes;
    429 queued_spec_bytes; 0: no budget; rc serve --max-queued-spec-bytes)."""
    relay_sessions_per_user: int = 16
    """Most open relay sessions per user, forward connections not counted
    (429 limit_exceeded)."""
    forward_connections_per_user: int = 256
    """Most open `rc forward` connections per user (429 limit_exceeded)."""
    hold_idle_timeout: int = 7200
    """A hold's idle timeout when `rc hold` names none, seconds (0: off;
    rc serve --hold-idle-timeout; README "Holds: the idle rule")."""
    hold_idle_timeout_max: int = 0
    """The longest idle timeout a user may ask for, seconds; when set, a user
    may not turn the rule off either (400 limit_exceeded). 0: no maximum.
    Admins are exempt (rc serve --hold-idle-timeout-max)."""
    hold_idle_timeout_min: int = 0
    """The shortest idle timeout a user may ask for, seconds; when set, a
    user may not turn the rule off either (400 limit_exceeded). 0: none.
    Admins are exempt (rc serve --hold-idle-timeout-min; README "Shared-box
    defaults")."""
    hold_ttl_max: int = 0
    """The longest ttl a user's hold may have, seconds, at submit and after
    rc extend (400 limit_exceeded). 0: none. Admins are exempt (rc serve
    --hold-ttl-max)."""


@dataclass(frozen=True, slots=True)
class ControllerConfig:
    """What `rc serve` was told: a field that is one of its flags has the flag's
    default (rc serve --help); the others are fixed."""

    data_dir: str
    database: str = ""
    """Where the state lives: "" the embedded SQLite file DATA/rc.db, or a
    postgresql:// URL (rc.controller.store.pg); logs stay files (log_dir)."""
    log_dir: str = ""
    """Where job logs live: "" DATA/logs. Standby controllers on one
    PostgreSQL database give each the same directory (README "More than one box")."""
    advertise_url: str = ""
    """The URL a standby names for this controller while it is active (""
    the URL of the listen address; PostgreSQL only)."""
    leader_ttl: float = 5.0
    """The leadership lease's length, seconds (rc.controller.store.leader)."""
    listen: str = "127.0.0.1:8080"
    socket: str = ""
    """The local Unix socket's path ("": none; rc.controller.localsocket)."""
    local_users: str = "all"
    """Who may take a token from it: "all" or "group:NAME"."""
    certfile: str = ""
    keyfile: str = ""
    schedule_interval: float = 1.0
    sweep_interval: float = 10.0
    heartbeat_flush: float = 2.0
    """Heartbeats that change nothing but timestamps and lease renewals are
    kept in memory and written together this often (s); 0 writes each one
    before its reply. After a crash the stored ones are at most this old."""
    heartbeat_interval: float = 10.0
    """What workers are told to use."""
    unknown_after: float = 30.0
    """Silence after which a device shows `unknown`."""
    lost_after: float = 300.0
    """Silence after which a device is quarantined worker_lost and its jobs lost."""
    startup_grace: float = 30.0
    """After a controller start, no lease expires and no worker is written off."""
    lease_default: float = 300.0
    """Lease of a job without a runtime, until its first renewal."""
    lease_grace: float = 600.0
    """A lease outlives the job's max runtime by this much (the worker's
    watchdog fires first)."""
    lease_renewal: float = 900.0
    """A heartbeat naming a job extends its lease to at least now + this."""
    kill_redelivery: float = 30.0
    poll_wait_default: float = 30.0
    poll_wait_max: float = 60.0
    aging: float = 600.0
    """A queued job gains one priority step per `aging` seconds waited (0: off)."""
    max_devices_per_user: int = 0
    """Most devices one submitter may hold at once (0: no cap)."""
    max_user_priority: int = 0
    """Highest priority a user (not an admin) may ask for, -10..10; admins
    may ask up to 10, and anyone for a negative one (400 priority_not_allowed)."""
    export_default: str = "ALL"
    """What a job takes of its submitter's shell when the request names no
    export (rc.proto.exports grammar; rc serve --export-default)."""
    fair_share: float = 0.0
    """Half-life of the decayed usage fair share reads, seconds (0: fair share off)."""
    flap_limit: int = 3
    """Automatic recoveries per device per flap_window before a human must clear."""
    flap_window: float = 3600.0
    retain_disconnected_jobs: bool = False
    drain_degraded: bool = False
    """Drain a device whose `health` label says degraded (README "GPU health")."""
    webhook_url: str = ""
    webhook_queue: int = 256
    log_follow_check: float = 0.5
    relay_alone_timeout: float = 60.0
    retain: float = 90 * 86400.0
    """Finished jobs, their leases, events and logs, and events, older than
    this are deleted, seconds (0: kept for ever; rc serve --retain; README
    "History that ends"). The ledger keeps their usage as daily rollups."""
    log_quota: int = 0
    """Most bytes of logs per Unix user; past it the logs of their finished
    jobs go, oldest first (0: no quota; rc serve --log-quota)."""
    retain_interval: float = 60.0
    """How often the rollups, the retention and the log quota run, seconds
    (rc.controller.retention)."""
    limits: Limits = Limits()
