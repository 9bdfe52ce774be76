"""The planner: who gets which free devices (README "Order: priority, first
come first served, aging, the per-user cap" and "Several devices for one job").

`plan()` is a pure function over a snapshot of the queue and the fleet, so the
same code decides assignments, queue positions and `rc explain`:

- order: effective priority first (priority plus one step per `aging` seconds
  waited, when aging is on), then submission order (job id);
- each job's candidates: its pinned devices, or the devices its selector
  matches, minus devices whose runtime ceiling is below the job's ask and
  those whose worker does not run jobs as the job's Unix user
  (`runs_jobs_of`: a single-user worker runs only its own user's);
- a job asks for `count` devices, all on one host, granted together or not
  at all. It takes the best set among the hosts with `count` available
  candidates (rc.controller.placement: best topology, then the host with the
  fewest available candidates, then the set that breaks the fewest intact
  groups, then the lowest ids) unless its account (its Unix user: the
  person, QueuedJob.account) would pass the per-user device cap (a job
  held back by the cap reserves nothing);
- reservation and conservative backfill: a job on several devices that
  cannot be placed reserves, on the host where `count` of its candidates
  are expected free soonest, those devices, with the time T they are expected free at the
  latest (a running job ends by its start plus its max runtime; one with no
  bound never ends; a free device is free now). A later job may take a
  reserved device only when its own runtime bound (its max runtime, else the
  device's ceiling) ends before T, and only within BACKFILL_DEPTH jobs of the
  head of the queue; a job without a bound never backfills. Devices out of
  the pool (quarantined, silent, draining) are never reserved, nor devices
  another job reserved first: each blocked job in order (the first
  RESERVATIONS_MAX of them) reserves what it can find, so a wide job cannot be starved by a stream of narrow ones. (A job
  on one device needs no reservation: the pass places it before every job
  behind it as soon as one of its candidates frees.)

- eligibility: a job with an unmet dependency, or an element of an array
  whose cap of elements is already assigned or running, is skipped: it
  takes and reserves nothing and is nobody's rival (an element held by its
  array's cap is a rival of its array's later elements only).

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
from typing import Any

from rc.controller.placement import HostTopology, device_key, host_of
from rc.proto import selector as selectors
from rc.proto.model import ROOT, DeviceState

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
    "host_slot",
    "match_devices",
    "not_run_here",
    "plan",
    "runs_jobs_of",
]

BACKFILL_DEPTH = 256
"""Only the first this many jobs of the queue (in scheduling order) may take
a reserved device (backfill); a pass stops looking further once every free
device is taken or reserved, so a long queue costs no more than this."""
RESERVATIONS_MAX = 32
"""At most this many blocked jobs reserve devices in one pass (the first in
scheduling order); one behind them waits in its place and reserves once it
is among them."""


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


def effective_priority(
    job: QueuedJob, now: float, aging: float, adjust: Mapping[str, int] | None = None
) -> int:
    """A queued job's priority with aging (aged_priority), minus its
    account's fair-share adjustment in `adjust` (user → steps, 0..10;
    rc.controller.fairshare; None or a user left out: 0)."""
    aged = aged_priority(job.priority, job.queued_at, now, aging)
    return aged - adjust.get(job.account, 0) if adjust else aged


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


def runtime_on(ask: int, ceilings: Iterable[int]) -> int:
    """The runtime bound of a job asking `ask` seconds (0: none) on devices
    with these ceilings: its ask, else the lowest ceiling among them (0:
    none at all). The worker stops it there."""
    if ask:
        return ask
    return min((c for c in ceilings if c), default=0)


def candidates(
    selector: str,
    pins: tuple[str, ...],
    max_runtime: int,
    slots: Mapping[str, Slot],
    matches: Mapping[str, frozenset[str]],
    unix_user: str = "",
    excluded: tuple[str, ...] = (),
) -> tuple[str, ...]:
    """A queued job's candidate device ids: its pinned devices in their order
    (a job with no selector), or the devices its selector matches
    (`matches`, as for plan()) in natural order (gpu2 before gpu10); minus
    devices that do not exist, those whose runtime ceiling is below its ask
    (seconds), those whose worker does not run jobs as `unix_user`
    (runs_jobs_of; "" asks nothing of them), and the `excluded` ones."""
    if selector:
        pool: Iterable[str] = sorted(matches.get(selector, frozenset()), key=device_key)
    else:
        pool = pins
    return tuple(
        d
        for d in pool
        if d in slots
        and d not in excluded
        and fits_ceiling(max_runtime, slots[d].max_runtime)
        and (not unix_user or runs_jobs_of(slots[d], unix_user))
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
    links: Mapping[str, Mapping[tuple[str, str], int]] | None = None,
    ordered: bool = False,
    until_settled: bool = False,
    arrays_active: Mapping[int, int] | None = None,
    adjust: Mapping[str, int] | None = None,
) -> Plan:
    """Decide assignments and reservations for one pass.

    `matches` maps each selector (normalised text) to the device ids it
    matches; `usage` maps an account (QueuedJob.account: a Unix user) to
    the devices it holds now; `links`
    maps a host to its reported pair ranks (placement.pair(a, b) → rank;
    a host left out has no topology); `arrays_active` maps a capped array's
    id to its elements assigned or running now; `adjust` maps an account
    to its fair-share adjustment (effective_priority). `now` is seconds
    since the epoch.
    Pure: reads nothing else, changes nothing.

    `ordered`: the queue already comes in scheduling order (the pass reads it
    so from SQLite), so it is not sorted again and may be a lazy iterator.
    `until_settled`: stop as soon as no later job could get a device (every
    free device assigned or reserved, and the backfill depth passed),
    leaving order and candidates partial: what the scheduling pass needs,
    in time proportional to the jobs it looks at.
    """
    if ordered:
        jobs_in_order: Iterable[QueuedJob] = queue
    else:
        jobs_in_order = sorted(
            queue, key=lambda j: (-effective_priority(j, now, aging, adjust), j.id)
        )
    return _Pass(slots, matches, now, cap, usage or {}, links or {}, arrays_active or {}).run(
        jobs_in_order, until_settled
    )


class _Pass:
    """One plan(): the free devices, what is taken and reserved so far."""

    def __init__(self, slots, matches, now, cap, usage, links, arrays_active) -> None:
        self.array_used = dict(arrays_active)
        self.slots = slots
        self.matches = matches
        self.now = now
        self.cap = cap
        self.used = dict(usage)
        self.links = links
        self.out = Plan()
        self.free = {d for d, s in slots.items() if s.schedulable}
        self.ends: dict[str, float] = {}  # taken in this pass → expected end
        self.hosts: dict[str, list[str]] | None = None
        self.topologies: dict[str, HostTopology] = {}
        self.known: dict[tuple, tuple[str, ...]] = {}  # many jobs share a target
        self.by_host: dict[tuple[str, ...], dict[str, list[str]]] = {}
        self.cand_sets: dict[tuple[str, ...], frozenset[str]] = {}
        self.no_room: set[tuple[tuple[str, ...], int]] = set()  # (cands, wants) found nothing
        self.by_end: dict[str, list[tuple[float, tuple, str]]] = {}

    def run(self, jobs: Iterable[QueuedJob], until_settled: bool) -> Plan:
        out = self.out
        for index, job in enumerate(jobs):
            if until_settled and self.settled(index):
                break
            out.order.append(job.id)
            key = (job.selector, job.pins, job.max_runtime, job.unix_user, job.excluded)
            cands = self.known.get(key)
            if cands is None:
                cands = self.known[key] = candidates(
                    *key[:3], self.slots, self.matches, job.unix_user, job.excluded
                )
            out.candidates[job.id] = cands
            if job.blocked:
                out.waiting.add(job.id)
                continue
            if job.array_cap and self.array_used.get(job.array_id, 0) >= job.array_cap:
                out.held.add(job.id)
                continue
            if self.cap > 0 and self.used.get(job.account, 0) + job.wants > self.cap:
                out.capped.add(job.id)
                continue
            chosen = self.place(job, cands, index)
            if chosen is None:
                self.reserve(job, cands)
                continue
            out.assignments.append((job.id, chosen))
            if any(d in out.reserved for d in chosen):
                out.backfilled.add(job.id)
            self.used[job.account] = self.used.get(job.account, 0) + len(chosen)
            if job.array_cap:
                self.array_used[job.array_id] = self.array_used.get(job.array_id, 0) + 1
            runtime = runtime_on(job.max_runtime, (self.slots[d].max_runtime for d in chosen))
            end = self.now + runtime if runtime else math.inf
            for d in chosen:
                self.free.discard(d)
                self.ends[d] = end
            topo = self.topologies.get(host_of(chosen[0]))
            if topo is not None:
                topo.take(chosen)
            self.by_end.pop(host_of(chosen[0]), None)  # their ends moved
        return out

    def settled(self, index: int) -> bool:
        """No later job could get a device: each free one is reserved, and
        past the backfill depth none may be backfilled either."""
        reserved = self.out.reserved
        if any(d not in reserved for d in self.free):
            return False
        return index >= BACKFILL_DEPTH or not self.free

    def available(self, job: QueuedJob, d: str, index: int) -> bool:
        """Whether `job` (at `index` in the order) may take device `d` now."""
        if d not in self.free:
            return False
        holder = self.out.reserved.get(d)
        if holder is None:
            return True
        if index >= BACKFILL_DEPTH:
            return False
        bound = job.max_runtime or self.slots[d].max_runtime
        return bound > 0 and self.now + bound <= self.out.reservations[holder].start_at

    def host_devices(self, host: str) -> list[str]:
        """Every device of a host (the fleet grouped once per pass)."""
        if self.hosts is None:
            self.hosts = {}
            for d in self.slots:
                self.hosts.setdefault(host_of(d), []).append(d)
        return self.hosts.get(host, [])

    def topology(self, host: str) -> HostTopology:
        topo = self.topologies.get(host)
        if topo is None:
            topo = self.topologies[host] = HostTopology(
                self.host_devices(host), self.links.get(host, {}), self.free.__contains__
            )
        return topo

    def grouped(self, cands: tuple[str, ...]) -> dict[str, list[str]]:
        """A candidate tuple's devices per host, in order (cached)."""
        got = self.by_host.get(cands)
        if got is None:
            got = self.by_host[cands] = {}
            for d in cands:
                got.setdefault(host_of(d), []).append(d)
        return got

    def place(self, job: QueuedJob, cands: tuple[str, ...], index: int) -> tuple[str, ...] | None:
        """The devices `job` gets now, in order, or None."""
        pins = job.pins
        if pins:
            if len(cands) == len(pins) and all(self.available(job, d, index) for d in pins):
                return pins
            return None
        # only free devices can be taken: look at those (a pass has few)
        if len(self.free) < len(cands):
            among = self.cand_sets.get(cands)
            if among is None:
                among = self.cand_sets[cands] = frozenset(cands)
            pool = sorted((d for d in self.free if d in among), key=device_key)
        else:
            pool = [d for d in cands if d in self.free]
        per_host: dict[str, list[str]] = {}
        for d in pool:
            if self.available(job, d, index):
                per_host.setdefault(host_of(d), []).append(d)
        best = None
        for host, avail in per_host.items():
            if len(avail) < job.count:
                continue
            found = self.topology(host).best(avail, job.count)
            if found is None:
                continue
            (worst, total, damage, ids), chosen = found
            key = (worst, total, len(avail), damage, ids)
            if best is None or key < best[0]:
                best = (key, chosen)
        return None if best is None else best[1]

    def soonest_on(self, host: str) -> list[tuple[float, tuple, str]]:
        """A host's devices as (expected free, natural key, id), soonest first
        (cached until the pass takes one of them)."""
        got = self.by_end.get(host)
        if got is None:
            got = self.by_end[host] = sorted(
                (self.end_of(d), device_key(d), d) for d in self.host_devices(host)
            )
        return got

    def end_of(self, d: str) -> float:
        """When device `d` is expected free at the latest."""
        if d in self.ends:
            return self.ends[d]
        if d in self.free:
            return self.now
        return self.slots[d].free_at

    def reserve(self, job: QueuedJob, cands: tuple[str, ...]) -> None:
        """A blocked job on several devices reserves the devices of the host
        where `count` of its candidates are expected free soonest (never
        devices out of the pool or reserved by a job ahead of it). A job on
        one device reserves nothing: whenever one of its candidates frees,
        it is placed before every job behind it anyway."""
        if job.wants < 2 or len(self.out.reservations) >= RESERVATIONS_MAX:
            return
        ask = (cands, job.wants)
        if ask in self.no_room:  # reservations only grow within a pass
            return
        reserved = self.out.reserved
        pins = job.pins
        wants = job.wants
        best = None
        if pins:
            groups = {host_of(pins[0]): list(pins)} if len(cands) == len(pins) else {}
        else:
            groups = self.grouped(cands)
        among = self.cand_sets.get(cands)
        if among is None:
            among = self.cand_sets[cands] = frozenset(cands)
        for host, ds in groups.items():
            if len(ds) < wants:
                continue
            soonest = []
            for _end, _key, d in self.soonest_on(host):  # expected free soonest first
                if d in among and d not in reserved and self.slots[d].in_pool:
                    soonest.append(d)
                    if len(soonest) == wants:
                        break
            if len(soonest) < wants:
                continue
            start = self.end_of(soonest[-1])
            rank = (start, device_key(host))
            if best is None or rank < best[0]:
                best = (rank, pins or tuple(sorted(soonest, key=device_key)))
        if best is None:
            self.no_room.add(ask)
            return
        chosen = tuple(best[1])
        self.out.reservations[job.id] = Reservation(job.id, chosen, best[0][0])
        for d in chosen:
            reserved[d] = job.id


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
    """The scheduling knobs of ControllerConfig (seconds; cap 0 means none).

    `shares`: fair share's standings (rc.controller.store.usage.ShareCache,
    its half-life 0 when off); None: off."""

    aging: float = 0.0
    cap: int = 0
    lease_default: float = 300.0
    lease_grace: float = 600.0
    shares: Any = field(default=None, compare=False)


@dataclass(slots=True)
class Snapshot:
    """The queue and the fleet as one transaction saw them, and their plan.

    queue: queued jobs in id order; slots: device id → Slot; usage: account
    → devices they hold (live leases); plan: what a pass would do now;
    adjust: account → fair-share adjustment the plan ordered by.
    """

    queue: list[QueuedJob]
    slots: dict[str, Slot]
    usage: dict[str, int]
    plan: Plan
    now: float
    adjust: dict[str, int] = field(default_factory=dict)

    def job(self, job_id: int) -> QueuedJob | None:
        """The queued job with this id, or None."""
        return next((j for j in self.queue if j.id == job_id), None)

    def _accounts(self) -> dict[int, str]:
        return {j.id: j.account for j in self.queue}

    def _arrays(self) -> dict[int, int]:
        return {j.id: j.array_id for j in self.queue if j.array_id}

    def rivals(self, job_id: int) -> list[int]:
        """Queued jobs ahead of this one in scheduling order that want a device
        it could use: the jobs that get such a device before it does. A job
        held back by the per-user cap is a rival only of its account's later
        jobs (they wait behind it; other users' jobs do not); one held back by
        its array's cap only of its array's later elements."""
        p = self.plan
        owner = self._accounts()
        arrays = self._arrays()
        mine = set(p.candidates.get(job_id, ()))
        out = []
        for other in p.order:
            if other == job_id:
                return out
            if (
                other not in p.waiting
                and (other not in p.capped or owner.get(other) == owner.get(job_id))
                and (other not in p.held or arrays.get(other) == arrays.get(job_id))
                and mine.intersection(p.candidates.get(other, ()))
            ):
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
        capped_seen: dict[tuple[str, int], int] = {}  # (account, group) → capped jobs
        held_seen: dict[tuple[int, int], int] = {}  # (array, group) → held elements
        owner = self._accounts()
        arrays = self._arrays()
        out = {}
        for job_id in p.order:
            g = groups[p.candidates.get(job_id, ())]
            who = owner.get(job_id, "")
            arr = arrays.get(job_id, 0)
            out[job_id] = 1 + sum(
                seen[h] + capped_seen.get((who, h), 0) + held_seen.get((arr, h), 0)
                for h in overlaps[g]
            )
            if job_id in p.waiting:
                pass  # it takes nothing: nobody waits behind it
            elif job_id in p.held:
                held_seen[(arr, g)] = held_seen.get((arr, g), 0) + 1
            elif job_id in p.capped:
                capped_seen[(who, g)] = capped_seen.get((who, g), 0) + 1
            else:
                seen[g] += 1
        return out
