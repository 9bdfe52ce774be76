"""The queue and the fleet as one transaction saw them, with their plan,
and what it says of each queued job: its rivals and its queue position
(README "Order: priority, first come first served, aging, the per-user cap").

Pure: rc.controller.store.views builds a Snapshot and reads it for `rc ps`
and `rc explain`, so what they say is what the pass does.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rc.controller.planning.records import Plan, QueuedJob, Slot

__all__ = ["Snapshot"]


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
