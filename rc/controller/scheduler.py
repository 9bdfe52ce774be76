"""The scheduling pass: read the queue and the fleet, plan, write assignments.

The decisions are rc.controller.planner's (pure); this module loads what it
plans over and applies what it decides. `snapshot()` loads the queue and the
fleet and plans them (the read side uses it for queue positions and `rc
explain`); `schedule()` is the pass, run at the end of a write batch that
asked for one; `MatchCache` is the writer's cache of which devices each
selector matches.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterable

from rc.controller.planner import (
    LazyMatches,
    Policy,
    QueuedJob,
    Slot,
    Snapshot,
    match_devices,
    plan,
)
from rc.controller.store.db import Tx
from rc.proto.model import DeviceState

__all__ = ["MATCH_CACHE_MAX", "MatchCache", "assign", "load_labels", "schedule", "snapshot"]

MATCH_CACHE_MAX = 4096
"""Most selectors the writer's MatchCache remembers matches for; past it the
cache starts over (it also starts over whenever labels or devices change)."""


class MatchCache:
    """The writer's cache of effective labels and the devices each selector matches.

    Effective labels of a device: its declared labels overlaid by detected
    ones (detected wins), plus `host`, `device` (its name) and `id`. Any
    transaction that changes labels or the device set calls `invalidate()`;
    the next use reloads from the database inside the current transaction.
    At most MATCH_CACHE_MAX selectors are remembered.
    """

    def __init__(self) -> None:
        self._labels: dict[str, dict[str, str]] | None = None
        self._matches: dict[str, frozenset[str]] = {}

    def invalidate(self) -> None:
        """Forget labels and matches (labels or the device set changed)."""
        self._labels = None
        self._matches = {}

    def labels(self, tx: Tx) -> dict[str, dict[str, str]]:
        """device id → effective labels (loaded on first use after invalidate)."""
        if self._labels is None:
            self._labels = load_labels(tx)
        return self._labels

    def matching(self, tx: Tx, sel: str) -> frozenset[str]:
        """Ids of the devices a normalised selector matches."""
        hit = self._matches.get(sel)
        if hit is None:
            hit = match_devices(self.labels(tx), sel)
            if len(self._matches) >= MATCH_CACHE_MAX:
                self._matches = {}
            self._matches[sel] = hit
        return hit


def load_labels(tx: Tx) -> dict[str, dict[str, str]]:
    """Effective labels of every device, read in one pass."""
    out: dict[str, dict[str, str]] = {}
    for r in tx.all("device_identities"):
        out[r["id"]] = {"host": r["host"], "device": r["name"], "id": r["id"]}
    for r in tx.all("all_labels"):  # declared first, then detected overwrites
        d = out.get(r["device_id"])
        if d is not None:
            d[r["key"]] = r["value"]
    return out


def _queued_job(r: sqlite3.Row) -> QueuedJob:
    return QueuedJob(
        id=r["id"],
        submitter=r["submitter"],
        priority=r["priority"],
        queued_at=r["queued_at"],
        selector=r["selector"],
        device_id=r["device_id"],
        max_runtime=r["max_runtime"],
    )


def queued_jobs(rows: Iterable[sqlite3.Row]) -> list[QueuedJob]:
    """Rows of the `queued_jobs` query as QueuedJobs."""
    return [_queued_job(r) for r in rows]


def slots(rows: Iterable[sqlite3.Row]) -> dict[str, Slot]:
    """Rows of the `device_slots` query as Slots by device id."""
    return {
        r["id"]: Slot(r["id"], DeviceState(r["state"]), r["max_runtime"], bool(r["draining"]))
        for r in rows
    }


def snapshot(tx: Tx, matching: Callable[[str], frozenset[str]], policy: Policy) -> Snapshot:
    """Load the queue and the fleet in `tx` and plan them.

    `matching(selector)` gives the device ids a normalised selector matches
    (the writer passes its MatchCache, readers match fresh labels).
    """
    queue = queued_jobs(tx.all("queued_jobs"))
    fleet_slots = slots(tx.all("device_slots"))
    matches = {sel: matching(sel) for sel in {j.selector for j in queue if j.selector}}
    usage = {r["holder"]: r["n"] for r in tx.all("live_leases_per_holder")}
    p = plan(queue, fleet_slots, matches, tx.now, aging=policy.aging, cap=policy.cap, usage=usage)
    return Snapshot(queue, fleet_slots, usage, p, tx.now)


def schedule(tx: Tx, match_cache: MatchCache, policy: Policy) -> list[tuple[int, str]]:
    """The scheduling pass: assign queued jobs to free devices, durably.

    Cheap when nothing can move: no queued job or no schedulable device means
    no planning at all. Otherwise it reads the queue lazily, already in
    scheduling order (aging computed by SQLite), and plans only until every
    free device is assigned or reserved, so a pass costs the jobs it looks
    at, not the length of the queue. The decisions are plan()'s.
    """
    if not tx.scalar("any_schedulable") or not tx.scalar("any_queued"):
        return []
    fleet_slots = slots(tx.all("device_slots"))
    usage = (
        {r["holder"]: r["n"] for r in tx.all("live_leases_per_holder")} if policy.cap > 0 else {}
    )
    rows = tx.iter("queued_jobs_ordered", {"now": tx.now, "aging": policy.aging})
    matches = LazyMatches(lambda sel: match_cache.matching(tx, sel))
    p = plan(
        map(_queued_job, rows),
        fleet_slots,
        matches,
        tx.now,
        aging=policy.aging,
        cap=policy.cap,
        usage=usage,
        ordered=True,
        until_settled=True,
    )
    done = []
    for job_id, device_id in p.assignments:
        if assign(tx, job_id, device_id, policy):
            done.append((job_id, device_id))
    return done


def assign(tx: Tx, job_id: int, device_id: str, policy: Policy) -> bool:
    """Give a queued job a ready device: job assigned, device busy, lease taken.

    A selector job with no runtime of its own inherits the device's ceiling
    (inventory §4.5). Returns False, changing nothing, when the job is no longer
    queued or the device no longer ready.
    """
    dev = tx.one("device_for_assign", (device_id,))
    if dev is None or dev["state"] != "ready" or dev["draining"]:
        return False
    job = tx.one("job_for_assign", (job_id,))
    if job is None or job["state"] != "queued":
        return False
    runtime = job["max_runtime"] or dev["max_runtime"]
    ttl = runtime + policy.lease_grace if runtime else policy.lease_default
    tx.exec("device_set_busy", (device_id,))
    tx.exec("job_assign", (device_id, dev["worker_id"], runtime, tx.now, job_id))
    tx.exec(
        "lease_insert",
        (device_id, job_id, job["submitter"], job["kind"], job["reason"], tx.now, tx.now + ttl),
    )
    tx.notify(f"worker:{dev['worker_id']}", f"job:{job_id}", "jobs", "devices")
    return True
