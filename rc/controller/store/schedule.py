"""The scheduling pass: read the queue and the fleet, plan, write assignments.

The decisions are rc.controller.planning's (pure); the reads and the writes
are the store's (rc.controller.store.queue, .jobs): the pass is a
transaction function like any other, so it lives in the store. The pass runs at the
end of any write batch that asked for one (Database.after_batch), so an
assignment commits with the change that made it possible.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from rc.controller.planning import LazyMatches, Policy, plan
from rc.controller.planning.records import Slot
from rc.controller.store import jobs, leases, queue
from rc.controller.store.db import Tx
from rc.controller.store.labels import MatchCache
from rc.proto.names import HEALTH_UNANSWERED

__all__ = ["schedule"]


def schedule(
    tx: Tx,
    match_cache: MatchCache,
    policy: Policy,
    on_wait: Callable[[float], None] | None = None,
) -> list[tuple[int, tuple[str, ...]]]:
    """The scheduling pass: assign queued jobs to free devices, durably, all
    of a job's devices in one go. Returns the (job id, its device ids) it
    assigned.

    First, a queued job whose dependency can no longer be met is ended
    (jobs.end_doomed). Cheap when nothing can move: no queued job or no schedulable device means
    no planning at all. Otherwise it reads the queue lazily, already in
    scheduling order (SQLite orders it with the planner's aging rule), and plans only until every
    free device is assigned or reserved, so a pass costs the jobs it looks
    at, not the length of the queue. The decisions are plan()'s.
    `on_wait(seconds)` is told each assigned job's wait in the queue (the
    wait-time histogram of /metrics).
    """
    jobs.end_doomed(tx)  # a dependency that can never be met ends its dependent now
    if not queue.anything_to_place(tx):
        return []
    slots = _answering(queue.slots(tx), match_cache.labels(tx))
    usage = leases.usage(tx) if policy.cap > 0 else {}
    adjust = queue.adjustments(tx, policy)
    queued_at: dict[int, float] = {}

    def noted(jobs_in_order):
        for j in jobs_in_order:
            queued_at[j.id] = j.queued_at
            yield j

    p = plan(
        noted(queue.in_order(tx, policy.aging, adjust)),
        slots,
        LazyMatches(lambda sel: match_cache.matching(tx, sel)),
        tx.now,
        aging=policy.aging,
        cap=policy.cap,
        usage=usage,
        links=match_cache.links(tx),
        ordered=True,
        until_settled=True,
        arrays_active=queue.arrays_active(tx),
        adjust=adjust,
    )
    done = [(j, ds) for j, ds in p.assignments if jobs.assign(tx, j, ds, policy)]
    if on_wait is not None:
        for j, _ in done:
            on_wait(tx.now - queued_at[j])
    return done


def _answering(slots: dict[str, Slot], labels: dict[str, dict[str, str]]) -> dict[str, Slot]:
    """The slots, with each GPU whose driver did not answer its worker's last
    health pass (label health=unanswered) taken out of the pool as a draining
    one is: handed to no job, reserved for none (README "GPU health")."""
    return {
        i: dataclasses.replace(s, draining=True)
        if labels.get(i, {}).get("health") == HEALTH_UNANSWERED
        else s
        for i, s in slots.items()
    }
