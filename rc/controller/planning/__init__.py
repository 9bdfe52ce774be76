"""Planning: who gets which free devices, and why the others wait (README
"Order: priority, first come first served, aging, the per-user cap",
"Several devices for one job" and "Sharing fairly").

Pure: nothing in this package reads the clock, the database or the network.
The scheduling pass (rc.controller.store.schedule) feeds it what the store read
and writes back what it decided; the read side (rc.controller.store.views)
plans the same snapshot for queue positions and `rc explain`.

- `records`: the records planning reads and decides (QueuedJob, Slot, Plan,
  Reservation) and the scheduling knobs (Policy);
- `priority`: the order of the queue (aging, the fair-share adjustment);
- `devices`: a job's candidate devices (selector, pins, runtime ceilings,
  whom a worker runs jobs as);
- `planner`: plan(), one pass's assignments, reservations and backfill;
- `placement`: which devices of one host (topology ranks, the best set,
  packing);
- `fairshare`: the fair-share standings and adjustment;
- `snapshot`: a planned queue's rivals and queue positions.

This module is the package's public face: the names below are what the rest
of the controller imports. `placement` and `fairshare` are imported as
modules of their own.
"""

from __future__ import annotations

from rc.controller.planning.devices import (
    LazyMatches,
    candidates,
    fits_ceiling,
    match_devices,
    not_run_here,
    runs_jobs_of,
    runtime_on,
)
from rc.controller.planning.planner import BACKFILL_DEPTH, RESERVATIONS_MAX, plan
from rc.controller.planning.priority import aged_priority, effective_priority
from rc.controller.planning.records import Plan, Policy, QueuedJob, Reservation, Slot
from rc.controller.planning.snapshot import Snapshot

__all__ = [
    "BACKFILL_DEPTH",
    "RESERVATIONS_MAX",
    "LazyMatches",
    "Plan",
    "Policy",
    "QueuedJob",
    "Reservation",
    "Slot",
    "Snapshot",
    "aged_priority",
    "candidates",
    "effective_priority",
    "fits_ceiling",
    "match_devices",
    "not_run_here",
    "plan",
    "runs_jobs_of",
    "runtime_on",
]
