"""Wire records of usage and fair share (GET /v1/usage, /v1/shares)."""

from __future__ import annotations

from dataclasses import dataclass, field


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
