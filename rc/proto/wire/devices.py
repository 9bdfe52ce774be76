"""Wire records of devices and the fleet: list, describe, explain a selector,
the state of everything (GET /v1/state)."""

from __future__ import annotations

from dataclasses import dataclass, field

from rc.proto.model import Device, Event, Job, Label
from rc.proto.wire.jobs import HoldIdle


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
