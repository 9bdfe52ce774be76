"""Scheduling: who gets which free device (inventory §5, DESIGN.md §6.5).

`plan()` is a pure function over a snapshot of the queue and the fleet, so the
same code decides assignments, queue positions and `rc explain`:

- order: effective priority first (priority plus one step per `aging` seconds
  waited, when aging is on), then submission order (job id);
- each job's candidates: its pinned device, or the devices its selector
  matches, minus devices whose runtime ceiling is below the job's ask;
- a job takes its first free candidate (by device id) unless its submitter is
  at the per-user device cap;
- a job that cannot be placed reserves all its remaining candidates, so no
  later job jumps onto them when they free (head-of-line reservation: a broad
  job is not overtaken forever). A job held back by the user cap reserves
  nothing.

`snapshot()` loads the queue and the fleet and plans them; `schedule()` is the
transaction that applies a snapshot's assignments. The read side
(rc.controller.views) plans the same snapshot for queue positions and
`rc explain`, so what they say is what the pass does.
"""

from __future__ import annotations

import math
import sqlite3
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from rc.controller.store.db import Tx
from rc.proto import selector as selectors
from rc.proto.model import DeviceState

__all__ = [
    "Fleet",
    "LazyMatches",
    "Plan",
    "Policy",
    "QueuedJob",
    "Slot",
    "Snapshot",
    "assign",
    "candidates",
    "effective_priority",
    "fits_ceiling",
    "match_devices",
    "plan",
    "schedule",
    "snapshot",
]

MATCH_CACHE_MAX = 4096
"""Most selectors the writer's Fleet remembers matches for; past it the cache
starts over (it also starts over whenever labels or devices change)."""


@dataclass(frozen=True, slots=True)
class QueuedJob:
    """What planning needs of a queued job."""

    id: int
    submitter: str
    priority: int
    queued_at: float
    selector: str = ""
    device_id: str = ""
    max_runtime: int = 0


@dataclass(frozen=True, slots=True)
class Slot:
    """What planning needs of a device: schedulable means ready and not draining."""

    id: str
    state: DeviceState
    max_runtime: int = 0
    draining: bool = False

    @property
    def schedulable(self) -> bool:
        """Whether a job may be handed this device now."""
        return self.state is DeviceState.READY and not self.draining


@dataclass(slots=True)
class Plan:
    """The outcome of a pass.

    order: queued job ids in scheduling order. assignments: (job id, device id).
    reserved: device id → the job that reserved it. capped: jobs held back by
    the per-user cap. candidates: job id → its candidate device ids (ceiling
    applied, reservations not).
    """

    order: list[int] = field(default_factory=list)
    assignments: list[tuple[int, str]] = field(default_factory=list)
    reserved: dict[str, int] = field(default_factory=dict)
    capped: set[int] = field(default_factory=set)
    candidates: dict[int, tuple[str, ...]] = field(default_factory=dict)


def effective_priority(job: QueuedJob, now: float, aging: float) -> int:
    """Priority plus one step per `aging` seconds waited (aging 0: no aging)."""
    if aging <= 0:
        return job.priority
    waited = max(0.0, now - job.queued_at)
    return job.priority + math.floor(waited / aging)


def fits_ceiling(ask: int, ceiling: int) -> bool:
    """Whether a job asking `ask` seconds (0: none) may run under `ceiling` (0: none)."""
    return ceiling == 0 or ask == 0 or ask <= ceiling


def candidates(
    selector: str,
    device_id: str,
    max_runtime: int,
    slots: Mapping[str, Slot],
    matches: Mapping[str, frozenset[str]],
) -> tuple[str, ...]:
    """A queued job's candidate device ids, sorted: its pinned device (a job
    with no selector), or the devices its selector matches (`matches`, as for
    plan()), minus those whose runtime ceiling is below its ask (seconds)."""
    if device_id and not selector:
        pool: Iterable[str] = (device_id,) if device_id in slots else ()
    else:
        pool = matches.get(selector, frozenset())
    return tuple(sorted(d for d in pool if fits_ceiling(max_runtime, slots[d].max_runtime)))


def plan(
    queue: Iterable[QueuedJob],
    slots: Mapping[str, Slot],
    matches: Mapping[str, frozenset[str]],
    now: float,
    *,
    aging: float = 0.0,
    cap: int = 0,
    usage: Mapping[str, int] | None = None,
    ordered: bool = False,
    until_settled: bool = False,
) -> Plan:
    """Decide assignments for one pass.

    `matches` maps each selector (normalised text) to the device ids it
    matches; `usage` maps a submitter to the devices they hold now. Pure: reads
    nothing else, changes nothing.

    `ordered`: the queue already comes in scheduling order (the pass reads it
    so from SQLite), so it is not sorted again and may be a lazy iterator.
    `until_settled`: stop as soon as every free device is assigned or reserved
    (no later job could get one), leaving order and candidates partial: what
    the scheduling pass needs, in time proportional to the jobs it looks at.
    """
    out = Plan()
    used = dict(usage or {})
    free = {d for d, s in slots.items() if s.schedulable}
    if ordered:
        jobs_in_order: Iterable[QueuedJob] = queue
    else:
        jobs_in_order = sorted(queue, key=lambda j: (-effective_priority(j, now, aging), j.id))
    known: dict[tuple[str, str, int], tuple[str, ...]] = {}  # many jobs share a target
    for job in jobs_in_order:
        if until_settled and not (free - out.reserved.keys()):
            break
        out.order.append(job.id)
        key = (job.selector, job.device_id if not job.selector else "", job.max_runtime)
        cands = known.get(key)
        if cands is None:
            cands = known[key] = candidates(*key, slots, matches)
        out.candidates[job.id] = cands
        if cap > 0 and used.get(job.submitter, 0) >= cap:
            out.capped.add(job.id)
            continue
        open_ = [d for d in cands if d not in out.reserved]
        for d in open_:
            if d in free:
                free.discard(d)
                out.assignments.append((job.id, d))
                used[job.submitter] = used.get(job.submitter, 0) + 1
                break
        else:
            for d in open_:
                out.reserved[d] = job.id
    return out


def match_devices(labels: Mapping[str, Mapping[str, str]], sel: str) -> frozenset[str]:
    """Ids of the devices whose effective labels a normalised selector matches.

    `labels` maps device id → effective labels (load_labels). Raises
    SelectorError for text that does not parse (stored selectors always do).
    """
    parsed = selectors.parse(sel)
    return frozenset(d for d, ls in labels.items() if parsed.matches(ls))


class Fleet:
    """The writer's cache of effective labels and selector matches.

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


class LazyMatches(dict):
    """selector → matching device ids, computed on first lookup."""

    def __init__(self, compute: Callable[[str], frozenset[str]]) -> None:
        super().__init__()
        self._compute = compute

    def __missing__(self, sel: str) -> frozenset[str]:
        hit = self[sel] = self._compute(sel)
        return hit

    def get(self, sel: str, default=None):  # plan() uses .get
        return self[sel]


def slots(rows: Iterable[sqlite3.Row]) -> dict[str, Slot]:
    """Rows of the `device_slots` query as Slots by device id."""
    return {
        r["id"]: Slot(r["id"], DeviceState(r["state"]), r["max_runtime"], bool(r["draining"]))
        for r in rows
    }


@dataclass(frozen=True, slots=True)
class Policy:
    """The scheduling knobs of ControllerConfig (seconds; cap 0 means none)."""

    aging: float = 0.0
    cap: int = 0
    lease_default: float = 300.0
    lease_grace: float = 600.0


@dataclass(slots=True)
class Snapshot:
    """The queue and the fleet as one transaction saw them, and their plan.

    queue: queued jobs in id order; slots: device id → Slot; usage: submitter
    → devices they hold (live leases); plan: what a pass would do now.
    """

    queue: list[QueuedJob]
    slots: dict[str, Slot]
    usage: dict[str, int]
    plan: Plan
    now: float

    def job(self, job_id: int) -> QueuedJob | None:
        """The queued job with this id, or None."""
        return next((j for j in self.queue if j.id == job_id), None)

    def _submitters(self) -> dict[int, str]:
        return {j.id: j.submitter for j in self.queue}

    def rivals(self, job_id: int) -> list[int]:
        """Queued jobs ahead of this one in scheduling order that want a device
        it could use: the jobs that get such a device before it does. A job
        held back by the per-user cap is a rival only of its submitter's later
        jobs (they wait behind it; other users' jobs do not)."""
        p = self.plan
        owner = self._submitters()
        mine = set(p.candidates.get(job_id, ()))
        out = []
        for other in p.order:
            if other == job_id:
                return out
            if (
                other not in p.capped or owner.get(other) == owner.get(job_id)
            ) and mine.intersection(p.candidates.get(other, ())):
                out.append(other)
        return []

    def position(self, job_id: int) -> int:
        """1 + rivals(job_id) for a queued job (an upper bound on how many
        devices must free before it starts); 0 when it is not queued."""
        if job_id not in self.plan.candidates:
            return 0
        return len(self.rivals(job_id)) + 1

    def positions(self) -> dict[int, int]:
        """position() of every queued job, in one sweep of the queue.

        Jobs are grouped by candidate set (a queue has few distinct ones), so
        this costs the queue length times the number of groups, not the
        square of the queue length.
        """
        p = self.plan
        groups: dict[tuple[str, ...], int] = {}
        for job_id in p.order:
            groups.setdefault(p.candidates.get(job_id, ()), len(groups))
        sets = [frozenset(g) for g in groups]
        overlaps = [[h for h, other in enumerate(sets) if s & other] for s in sets]
        seen = [0] * len(sets)
        capped_seen: dict[tuple[str, int], int] = {}  # (submitter, group) → capped jobs
        owner = self._submitters()
        out = {}
        for job_id in p.order:
            g = groups[p.candidates.get(job_id, ())]
            who = owner.get(job_id, "")
            out[job_id] = 1 + sum(seen[h] + capped_seen.get((who, h), 0) for h in overlaps[g])
            if job_id in p.capped:
                capped_seen[(who, g)] = capped_seen.get((who, g), 0) + 1
            else:
                seen[g] += 1
        return out


def snapshot(tx: Tx, matching: Callable[[str], frozenset[str]], policy: Policy) -> Snapshot:
    """Load the queue and the fleet in `tx` and plan them.

    `matching(selector)` gives the device ids a normalised selector matches
    (the writer passes its Fleet cache, readers match fresh labels).
    """
    queue = queued_jobs(tx.all("queued_jobs"))
    fleet_slots = slots(tx.all("device_slots"))
    matches = {sel: matching(sel) for sel in {j.selector for j in queue if j.selector}}
    usage = {r["holder"]: r["n"] for r in tx.all("live_leases_per_holder")}
    p = plan(queue, fleet_slots, matches, tx.now, aging=policy.aging, cap=policy.cap, usage=usage)
    return Snapshot(queue, fleet_slots, usage, p, tx.now)


def schedule(tx: Tx, fleet: Fleet, policy: Policy) -> list[tuple[int, str]]:
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
    matches = LazyMatches(lambda sel: fleet.matching(tx, sel))
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
