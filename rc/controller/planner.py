"""The planner: who gets which free device (README "Order: priority, first come
first served, aging, the per-user cap").

`plan()` is a pure function over a snapshot of the queue and the fleet, so the
same code decides assignments, queue positions and `rc explain`:

- order: effective priority first (priority plus one step per `aging` seconds
  waited, when aging is on), then submission order (job id);
- each job's candidates: its pinned device, or the devices its selector
  matches, minus devices whose runtime ceiling is below the job's ask and
  those whose worker does not run jobs as the job's Unix user
  (`runs_jobs_of`: a single-user worker runs only its own user's);
- a job takes its first free candidate (by device id) unless its submitter is
  at the per-user device cap;
- a job that cannot be placed reserves all its remaining candidates, so no
  later job jumps onto them when they free (head-of-line reservation: a broad
  job is not overtaken forever). A job held back by the user cap reserves
  nothing.

Nothing here reads the clock, the database or the network. The scheduling
pass (rc.controller.scheduler) feeds it what the store read and writes back
what it decided; the read side (rc.controller.store.views) plans the same
snapshot for queue positions and `rc explain`, so what they say is what the
pass does.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from rc.proto import selector as selectors
from rc.proto.model import ROOT, DeviceState

__all__ = [
    "LazyMatches",
    "Plan",
    "Policy",
    "QueuedJob",
    "Slot",
    "Snapshot",
    "aged_priority",
    "candidates",
    "effective_priority",
    "fits_ceiling",
    "host_slot",
    "match_devices",
    "not_run_here",
    "plan",
    "runs_jobs_of",
]


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
    unix_user: str = ""


@dataclass(frozen=True, slots=True)
class Slot:
    """What planning needs of a device: schedulable means ready and not
    draining. Whom its worker runs jobs as: `run_as` "" any job's own Unix
    user (root's only when `root_ok`), a name only that user's (a
    single-user worker)."""

    id: str
    state: DeviceState
    max_runtime: int = 0
    draining: bool = False
    run_as: str = ""
    root_ok: bool = True

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


def aged_priority(priority: int, queued_at: float, now: float, aging: float) -> int:
    """The aging rule, its one definition: `priority` plus one step per
    `aging` seconds waited since `queued_at` (seconds since the epoch); aging
    0 (or less) turns it off, and a clock that went back counts as no wait.

    SQL calls this same function as `effective_priority(priority, queued_at,
    :now, :aging)` (registered on every connection by
    rc.controller.store.db), so the queue SQLite orders is the queue plan()
    orders.
    """
    if aging <= 0:
        return priority
    return priority + math.floor(max(0.0, now - queued_at) / aging)


def effective_priority(job: QueuedJob, now: float, aging: float) -> int:
    """A queued job's priority with aging (aged_priority)."""
    return aged_priority(job.priority, job.queued_at, now, aging)


def fits_ceiling(ask: int, ceiling: int) -> bool:
    """Whether a job asking `ask` seconds (0: none) may run under `ceiling` (0: none)."""
    return ceiling == 0 or ask == 0 or ask <= ceiling


def runs_jobs_of(slot: Slot, unix_user: str) -> bool:
    """Whether the worker of `slot` runs a job whose Unix user is `unix_user`."""
    if slot.run_as:
        return unix_user == slot.run_as
    return slot.root_ok or unix_user != ROOT


SINGLE_USER_HINT = (
    "a worker that is not root runs only its own user's jobs; one started as root runs "
    "every user's, each as that user (on a one-box: sudo rc up -d)"
)


def host_slot(r) -> Slot:
    """Whom a worker runs jobs as (a workers row: run_as, shared_account,
    allow_root_jobs), as the Slot fields runs_jobs_of reads."""
    shared = bool(r["shared_account"])
    return Slot(
        "",
        DeviceState.READY,
        run_as="" if shared else r["run_as"],
        root_ok=shared or bool(r["allow_root_jobs"]),
    )


def not_run_here(host: str, slot: Slot, unix_user: str) -> str:
    """Why the worker of `host` (`slot`) does not run a job of `unix_user`,
    in words (what `rc explain` and a refused submit say)."""
    if slot.run_as:
        return f"{host} runs jobs as {slot.run_as} only ({SINGLE_USER_HINT})"
    return f"{host} does not run root's jobs (its worker config does not set allow_root_jobs)"


def candidates(
    selector: str,
    device_id: str,
    max_runtime: int,
    slots: Mapping[str, Slot],
    matches: Mapping[str, frozenset[str]],
    unix_user: str = "",
) -> tuple[str, ...]:
    """A queued job's candidate device ids, sorted: its pinned device (a job
    with no selector), or the devices its selector matches (`matches`, as for
    plan()), minus those whose runtime ceiling is below its ask (seconds) and
    those whose worker does not run jobs as `unix_user` (runs_jobs_of; ""
    asks nothing of them)."""
    if device_id and not selector:
        pool: Iterable[str] = (device_id,) if device_id in slots else ()
    else:
        pool = matches.get(selector, frozenset())
    return tuple(
        sorted(
            d
            for d in pool
            if fits_ceiling(max_runtime, slots[d].max_runtime)
            and (not unix_user or runs_jobs_of(slots[d], unix_user))
        )
    )


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
    known: dict[tuple[str, str, int, str], tuple[str, ...]] = {}  # many jobs share a target
    for job in jobs_in_order:
        if until_settled and not (free - out.reserved.keys()):
            break
        out.order.append(job.id)
        key = (
            job.selector,
            job.device_id if not job.selector else "",
            job.max_runtime,
            job.unix_user,
        )
        cands = known.get(key)
        if cands is None:
            cands = known[key] = candidates(*key[:3], slots, matches, job.unix_user)
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
