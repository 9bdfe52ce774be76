"""The planner: who gets which free devices (README "Order: priority, first
come first served, aging, the per-user cap" and "Several devices for one job").

`plan()` is a pure function over a snapshot of the queue and the fleet, so the
same code decides assignments, queue positions and `rc explain`:

- order: effective priority first (priority plus one step per `aging` seconds
  waited, when aging is on; rc.controller.planning.priority), then
  submission order (job id);
- each job's candidates: its pinned devices, or the devices its selector
  matches, minus devices whose runtime ceiling is below the job's ask and
  those whose worker does not run jobs as the job's Unix user
  (`runs_jobs_of`: a single-user worker runs only its own user's;
  rc.controller.planning.devices);
- a job asks for `count` devices, all on one host, granted together or not
  at all. It takes the best set among the hosts with `count` available
  candidates (rc.controller.planning.placement: best topology, then the host with the
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
pass (rc.controller.store.schedule) feeds it what the store read and writes back
what it decided; the read side (rc.controller.store.views) plans the same
snapshot for queue positions and `rc explain`, so what they say is what the
pass does.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

from rc.controller.planning.devices import candidates, runtime_on
from rc.controller.planning.placement import HostTopology, device_key, host_of
from rc.controller.planning.priority import effective_priority
from rc.controller.planning.records import Plan, QueuedJob, Reservation, Slot

__all__ = ["BACKFILL_DEPTH", "RESERVATIONS_MAX", "plan"]

BACKFILL_DEPTH = 256
"""Only the first this many jobs of the queue (in scheduling order) may take
a reserved device (backfill); a pass stops looking further once every free
device is taken or reserved, so a long queue costs no more than this."""
RESERVATIONS_MAX = 32
"""At most this many blocked jobs reserve devices in one pass (the first in
scheduling order); one behind them waits in its place and reserves once it
is among them."""


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
