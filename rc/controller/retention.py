"""History that ends: the rollups, the retention and the log quota (README
"History that ends").

Every turn (ControllerConfig.retain_interval seconds; the first soon after
start) the controller
1. rolls finished jobs up into the ledger's daily rollups
   (rc.controller.store.rollups.roll_up), ROLL_BATCH_JOBS per transaction;
2. with `rc serve --retain D` (default 90 days, 0 keeps everything), deletes
   the jobs that finished more than D ago, with their leases, events and
   logs, and the events older than D, EXPIRE_BATCH_JOBS per transaction;
3. with `rc serve --log-quota SIZE` (default 0: none), deletes the logs of a
   user's finished jobs, oldest first, while their logs together take more
   than SIZE. A log a queued, assigned or running job owns is never deleted
   (a job still on counts towards the quota, but only finished jobs' logs go).
A turn does at most TURN_BATCHES_MAX batches of each kind, yielding to the
other writers between them; what is left waits for the next turn.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable
from pathlib import Path

from rc.controller.store import rollups
from rc.controller.store.db import Database

__all__ = ["TURN_BATCHES_MAX", "Retention", "log_sizes"]

log = logging.getLogger("rc.controller.retention")

TURN_BATCHES_MAX = 400
"""Most batches of each kind one turn runs (400 × 500 jobs: 200,000 jobs)."""


def log_sizes(root: Path) -> dict[int, int]:
    """job id → bytes of each `<id>.log` under `root` (others ignored)."""
    out: dict[int, int] = {}
    try:
        entries = list(os.scandir(root))
    except FileNotFoundError:
        return out
    for e in entries:
        stem, dot, ext = e.name.partition(".")
        if ext != "log" or not dot or not stem.isdigit():
            continue
        try:
            out[int(stem)] = e.stat().st_size
        except FileNotFoundError:
            continue
    return out


class Retention:
    """One controller's rollups, retention and log quota. `retain` and
    `log_quota` as rc serve's flags (seconds, bytes; 0: off); `remove_log(id)`
    deletes one job's log file (a missing one is no error)."""

    def __init__(
        self,
        db: Database,
        log_root: Path,
        retain: float,
        log_quota: int,
        clock: Callable[[], float],
    ) -> None:
        self.db = db
        self.log_root = Path(log_root)
        self.retain = retain
        self.log_quota = log_quota
        self.clock = clock
        self.rolled = 0
        self.expired = 0
        self.logs_removed = 0
        """Counters since start (for tests and the log line)."""

    def horizon(self, now: float) -> float:
        """The cutoff of the retention at `now` (0: nothing is deleted)."""
        return now - self.retain if self.retain > 0 else 0.0

    async def turn(self) -> tuple[int, int, int]:
        """One turn now; returns (jobs rolled up, jobs deleted, logs deleted)."""
        rolled = expired = removed = 0
        for _ in range(TURN_BATCHES_MAX):
            n = await self.db.write(rollups.roll_up)
            rolled += n
            if n < rollups.ROLL_BATCH_JOBS:
                break
        if self.retain > 0:
            for _ in range(TURN_BATCHES_MAX):
                cutoff = self.horizon(self.clock())
                ids = await self.db.write(rollups.expire, cutoff)
                expired += len(ids)
                removed += await asyncio.to_thread(self._unlink, ids)
                if len(ids) < rollups.EXPIRE_BATCH_JOBS:
                    break
        if self.log_quota > 0:
            removed += await self._quota()
        self.rolled += rolled
        self.expired += expired
        self.logs_removed += removed
        if expired or removed:
            log.info("retention: %d jobs deleted, %d logs deleted", expired, removed)
        return rolled, expired, removed

    def _unlink(self, ids: list[int]) -> int:
        n = 0
        for j in ids:
            try:
                (self.log_root / f"{j}.log").unlink()
                n += 1
            except FileNotFoundError:
                pass
        return n

    async def _quota(self) -> int:
        """Delete finished jobs' logs, oldest first, of each user over the quota."""
        sizes = await asyncio.to_thread(log_sizes, self.log_root)
        ids = sorted(sizes)

        used: dict[str, int] = {}
        done: dict[str, list[tuple[float, int]]] = {}
        for job_id, user, finished_at in await self.db.read(rollups.log_owners, ids):
            used[user] = used.get(user, 0) + sizes[job_id]
            if finished_at is not None:
                done.setdefault(user, []).append((finished_at, job_id))
        gone = []
        for user, total in used.items():
            for _at, job_id in sorted(done.get(user, ())):
                if total <= self.log_quota:
                    break
                gone.append(job_id)
                total -= sizes[job_id]
        return await asyncio.to_thread(self._unlink, gone)
