"""What planning reads and decides, as plain records (README "Order:
priority, first come first served, aging, the per-user cap"): a queued job
(QueuedJob), a device (Slot), the outcome of a pass (Plan, with its
Reservations) and the scheduling knobs (Policy).

Records only: nothing here reads the clock, the database or the network.
rc.controller.store.queue builds them from rows.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from rc.controller.planning.placement import host_of
from rc.proto.model import DeviceState

__all__ = ["Plan", "Policy", "QueuedJob", "Reservation", "Slot"]


@dataclass(frozen=True, slots=True)
class QueuedJob:
    """What planning needs of a queued job: who, its priority, when it was
    queued (seconds since the epoch), its target (a normalised selector, or
    pinned `device_ids`; `device_id` alone is a one-device pin), its
    max runtime (seconds, 0: none) and how many devices it asks for; for an
    element of an array, the array's id and its cap on running elements
    (0: none); `blocked` while a dependency of it is unmet; `excluded`: the
    devices it must not be given (the faulty ones of a run the hardware
    failed; never among its candidates)."""

    id: int
    submitter: str
    priority: int
    queued_at: float
    selector: str = ""
    device_id: str = ""
    max_runtime: int = 0
    count: int = 1
    device_ids: tuple[str, ...] = ()
    unix_user: str = ""
    array_id: int = 0
    array_cap: int = 0
    blocked: bool = False
    excluded: tuple[str, ...] = ()

    @property
    def account(self) -> str:
        """Whom it is counted to: the per-user cap, fair share (its Unix
        user, the person; `submitter`, its display label, only for a job
        built without one, as tests do)."""
        return self.unix_user or self.submitter

    @property
    def pins(self) -> tuple[str, ...]:
        """The pinned devices in order, () for a selector job."""
        if self.selector:
            return ()
        return self.device_ids or ((self.device_id,) if self.device_id else ())

    @property
    def wants(self) -> int:
        """How many devices it needs: its pinned list's length, else count."""
        pins = self.pins
        return len(pins) if pins else self.count


@dataclass(frozen=True, slots=True)
class Slot:
    """What planning needs of a device: schedulable means ready and not
    draining. `free_at`: when the job holding it is expected to end at the
    latest (seconds since the epoch; math.inf when it has no bound, or for a
    device no job holds but that is not ready). Whom its worker runs jobs
    as: `run_as` "" any job's own Unix user (root's only when `root_ok`), a
    name only that user's (a single-user worker)."""

    id: str
    state: DeviceState
    max_runtime: int = 0
    draining: bool = False
    free_at: float = math.inf
    run_as: str = ""
    root_ok: bool = True

    @property
    def schedulable(self) -> bool:
        """Whether a job may be handed this device now."""
        return self.state is DeviceState.READY and not self.draining

    @property
    def in_pool(self) -> bool:
        """Free or busy, and not draining: a device that can be reserved."""
        return self.state in (DeviceState.READY, DeviceState.BUSY) and not self.draining

    @property
    def host(self) -> str:
        """The host part of its id."""
        return host_of(self.id)


@dataclass(frozen=True, slots=True)
class Reservation:
    """Devices a blocked job reserved, and when they are expected free at the
    latest (seconds since the epoch; math.inf when a holder has no bound)."""

    job_id: int
    devices: tuple[str, ...]
    start_at: float


@dataclass(slots=True)
class Plan:
    """The outcome of a pass.

    order: queued job ids in scheduling order. assignments: (job id, its
    devices in the order chosen). reserved: device id → the job that
    reserved it; reservations: job id → its Reservation. backfilled: jobs
    assigned a device another job had reserved. capped: jobs held back by
    the per-user cap. held: elements held back by their array's cap (that
    many of its elements are assigned or running, or placed in this pass).
    waiting: jobs with an unmet dependency (not eligible; they take nothing
    and are nobody's rival). candidates: job id → its candidate device ids (ceiling applied,
    reservations not).
    """

    order: list[int] = field(default_factory=list)
    assignments: list[tuple[int, tuple[str, ...]]] = field(default_factory=list)
    reserved: dict[str, int] = field(default_factory=dict)
    reservations: dict[int, Reservation] = field(default_factory=dict)
    backfilled: set[int] = field(default_factory=set)
    capped: set[int] = field(default_factory=set)
    held: set[int] = field(default_factory=set)
    waiting: set[int] = field(default_factory=set)
    candidates: dict[int, tuple[str, ...]] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Policy:
    """The scheduling knobs of ControllerConfig (seconds; cap 0 means none).

    `shares`: fair share's standings (rc.controller.store.usage.ShareCache,
    its half-life 0 when off); None: off."""

    aging: float = 0.0
    cap: int = 0
    lease_default: float = 300.0
    lease_grace: float = 600.0
    shares: Any = field(default=None, compare=False)
