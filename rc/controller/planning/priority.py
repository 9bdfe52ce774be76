"""The order of the queue: aging and the fair-share adjustment (README
"Order: priority, first come first served, aging, the per-user cap").

One definition of each, used by plan(), by queue positions and `rc explain`,
and (registered as an SQL function) by the queries that order the queue.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from rc.controller.planning.records import QueuedJob

__all__ = ["aged_priority", "effective_priority"]


def aged_priority(priority: int, queued_at: float, now: float, aging: float) -> int:
    """The aging rule, its one definition: `priority` plus one step per
    `aging` seconds waited since `queued_at` (seconds since the epoch); aging
    0 (or less) turns it off, and a clock that went back counts as no wait.

    SQL calls this same function as `effective_priority(priority, queued_at,
    :now, :aging)` (registered on every connection by
    rc.controller.store.sqlite), so the queue SQLite orders is the queue plan()
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
    rc.controller.planning.fairshare; None or a user left out: 0)."""
    aged = aged_priority(job.priority, job.queued_at, now, aging)
    return aged - adjust.get(job.account, 0) if adjust else aged
