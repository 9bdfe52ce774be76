"""What the dashboard calls each device state, quarantine reason, job state
and event kind: the one table of its words.

Each table is keyed by the members of an rc.proto.model enum, so a member
added there without words here fails tests/unit/test_dashboard_words.py.
rc.controller.dashboard puts `vocabulary()` into the page's script when it
assembles the page; the script keeps no words or enum lists of its own.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from rc.proto.model import DeviceState, EventKind, JobState, QuarantineReason

__all__ = [
    "DEVICE_ORDER",
    "DEVICE_STATES",
    "DRAINING",
    "EVENTS",
    "JOBS",
    "QUARANTINE",
    "TONES",
    "Quarantine",
    "Shown",
    "vocabulary",
]

TONES = ("good", "bad", "info")
"""How an activity-feed entry is coloured."""


@dataclass(frozen=True, slots=True)
class Shown:
    """A word and how it is drawn: `icon` names a glyph of the page's script
    (ICONS in dashboard.js); `tone` is a device state's colour (`s-ready`...)
    for a job state, or one of TONES for an event kind."""

    word: str
    icon: str = ""
    tone: str = ""


@dataclass(frozen=True, slots=True)
class Quarantine:
    """Why a device is out of the pool, in plain words: a headline, what
    happened, and what brings it back."""

    headline: str
    why: str
    advice: str


DRAINING = "draining"
"""The state a ready device being drained is shown as (not a DeviceState)."""

DEVICE_STATES: dict[str, Shown] = {
    DeviceState.READY: Shown("Free", "check"),
    DeviceState.BUSY: Shown("In use", "play"),
    DeviceState.UNKNOWN: Shown("Not reporting", "question"),
    DeviceState.UNHEALTHY: Shown("Out of the pool", "cross"),
    DRAINING: Shown("Draining", "pause"),
}
DEVICE_ORDER = (
    DeviceState.READY,
    DeviceState.BUSY,
    DRAINING,
    DeviceState.UNKNOWN,
    DeviceState.UNHEALTHY,
)
"""The order the page counts devices by state in."""

_RETURNS = (
    "It comes back after a reboot or a clean survivor check by its worker, "
    "or when an admin returns it."
)
QUARANTINE: dict[QuarantineReason, Quarantine] = {
    QuarantineReason.FAULT: Quarantine(
        "Its worker reported a fault",
        "The worker found this device unfit to hand out (a failed acquire hook or verify check).",
        "A fault never clears by itself, not even by a reboot: an admin checks the device "
        "and returns it to the pool.",
    ),
    QuarantineReason.WORKER_LOST: Quarantine(
        "Its worker stopped reporting",
        "No heartbeat came from the host for too long, so nothing proves the device is free. "
        "Jobs on it were marked lost.",
        "It comes back by itself when the host reboots or its worker proves nothing of the "
        "old job survived; an admin can also return it.",
    ),
    QuarantineReason.LEASE_EXPIRED: Quarantine(
        "A job's lease ran out",
        "The worker stopped renewing the lease of the job on this device, so that job may "
        "still be running.",
        _RETURNS,
    ),
    QuarantineReason.REGISTRATION: Quarantine(
        "Its worker restarted during a job",
        "The worker registered again while a job was running here, and nothing proves that "
        "job is gone.",
        _RETURNS,
    ),
    QuarantineReason.NONE: Quarantine(
        "Out of the pool, cause unknown",
        "The reason was not recorded.",
        "Only an admin can return it to the pool.",
    ),
}

JOBS: dict[JobState, Shown] = {
    JobState.QUEUED: Shown("waiting", tone=DeviceState.UNKNOWN),
    JobState.ASSIGNED: Shown("starting", tone=DeviceState.BUSY),
    JobState.RUNNING: Shown("running", tone=DeviceState.BUSY),
    JobState.SUCCEEDED: Shown("succeeded", tone=DeviceState.READY),
    JobState.FAILED: Shown("failed", tone=DeviceState.UNHEALTHY),
    JobState.KILLED: Shown("killed", tone=DeviceState.UNKNOWN),
    JobState.LOST: Shown("lost", tone=DeviceState.UNHEALTHY),
}

EVENTS: dict[EventKind, Shown] = {
    EventKind.DEVICE_UNHEALTHY: Shown("Quarantined", tone="bad"),
    EventKind.VERIFY_FAILED: Shown("Verify failed", tone="bad"),
    EventKind.WORKER_LOST: Shown("Worker lost", tone="bad"),
    EventKind.JOB_LOST: Shown("Job lost", tone="bad"),
    EventKind.LEASE_EXPIRED: Shown("Lease expired", tone="bad"),
    EventKind.WATCHDOG_TRIP: Shown("Watchdog", tone="bad"),
    EventKind.DEVICE_RECOVERED: Shown("Recovered", tone="good"),
    EventKind.RECOVERY_REFUSED: Shown("Recovery refused", tone="bad"),
    EventKind.DEVICE_CLEARED: Shown("Returned to pool", tone="good"),
    EventKind.DEVICE_RETIRED: Shown("Retired", tone="info"),
    EventKind.DEVICE_DRAINED: Shown("Draining", tone="info"),
    EventKind.DEVICE_UNDRAINED: Shown("Undrained", tone="good"),
    EventKind.JOB_KILLED: Shown("Job killed", tone="info"),
    EventKind.SUBMITTED_AS: Shown("Submitted as", tone="info"),
    EventKind.TOKEN_CREATED: Shown("Token created", tone="info"),
    EventKind.TOKEN_REVOKED: Shown("Token revoked", tone="info"),
    EventKind.HOLD_IDLE_WARNING: Shown("Hold idle", tone="info"),
    EventKind.HOLD_RECLAIMED: Shown("Idle hold released", tone="info"),
    EventKind.JOB_REQUEUED: Shown("Requeued", tone="info"),
    EventKind.JOB_SUBMITTED: Shown("Submitted via", tone="info"),
    EventKind.JOB_UPDATED: Shown("Changed", tone="info"),
}


def vocabulary() -> dict[str, Any]:
    """Every table as JSON data for the page's script:

    {"device_states": {state: {word, icon, tone}}, "device_order": [state],
     "quarantine": {reason: {headline, why, advice}},
     "jobs": {state: {word, icon, tone, terminal}},
     "events": {kind: {word, icon, tone}}}

    keyed by the enums' wire values (a quarantine with no recorded reason is "").
    """
    return {
        "device_states": {str(k): asdict(v) for k, v in DEVICE_STATES.items()},
        "device_order": [str(k) for k in DEVICE_ORDER],
        "quarantine": {str(k): asdict(v) for k, v in QUARANTINE.items()},
        "jobs": {str(k): {**asdict(v), "terminal": k.terminal} for k, v in JOBS.items()},
        "events": {str(k): asdict(v) for k, v in EVENTS.items()},
    }
