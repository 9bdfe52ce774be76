"""The hand-out ledger: which assigned jobs this controller process has
handed to each worker (docs/design.md#job-states).

Handing out an assignment writes nothing to the database: the controller
remembers here, in memory, which of a worker's assigned jobs it has handed
to it, so that a long poll answers only for new ones. Forgetting is always
safe: a worker never starts a job id and restart count twice, so an
assignment handed out again (after a restart of the controller, a
superseded poll, a heartbeat that does not name it) is harmless. A job
requeued after a hardware failure is a new run: the ledger knows a run by
its job id and restart count.

Only the methods below change the ledger; the route handlers
(rc.controller.api.workers) and Controller.handout call them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from rc.proto.wire import Assignment

__all__ = ["Handouts", "with_log_offset"]


def _run(a: Assignment) -> tuple[int, int]:
    """An assignment's run: (job id, restart count)."""
    return a.job_id, a.restart_count


class Handouts:
    """worker id → the runs (job id, restart count) of its assigned jobs
    handed to it. Memory only; at most one entry per worker that polled."""

    def __init__(self) -> None:
        self._given: dict[str, set[tuple[int, int]]] = {}

    def fresh(self, worker_id: str, assigned: Iterable[Assignment]) -> list[Assignment]:
        """The assignments of `assigned` (every job assigned to the worker
        now, as a long poll read them) not handed to it yet, in their order.
        From now on exactly `assigned` count as handed out: a job no longer
        assigned (it started, ended, went back to the queue) is forgotten."""
        assigned = list(assigned)
        seen = self._given.get(worker_id, set())
        self._given[worker_id] = {_run(a) for a in assigned}
        return [a for a in assigned if _run(a) not in seen]

    def handed(self, worker_id: str, assigned: Iterable[Assignment]) -> None:
        """These assignments were handed to the worker otherwise (the reply
        to its reports carries them): a long poll does not answer for them
        again."""
        self._given.setdefault(worker_id, set()).update(_run(a) for a in assigned)

    def give_back(self, worker_id: str, assignments: Iterable[Assignment]) -> None:
        """These assignments were not handed out after all (their poll was
        superseded while reading them): the next poll answers for them."""
        self._given.get(worker_id, set()).difference_update(_run(a) for a in assignments)

    def keep_only(self, worker_id: str, job_ids: set[int]) -> bool:
        """After a heartbeat naming `job_ids`: the assigned jobs the worker
        does not name are handed out again at its next poll. Returns whether
        anything was forgotten."""
        seen = self._given.get(worker_id)
        if not seen:
            return False
        kept = {s for s in seen if s[0] in job_ids}
        self._given[worker_id] = kept
        return kept != seen

    def forget(self, worker_id: str) -> None:
        """Forget everything handed to the worker (it registered again, or
        left): its next poll answers for every job assigned to it."""
        self._given.pop(worker_id, None)


def with_log_offset(a: Assignment, logs) -> Assignment:
    """An assignment as its worker gets it; `logs` (the LogStore, None
    without one) tells a requeued run (restart count above 0) where its
    output starts: after the stored log, and whether that ends inside a
    line (the worker's separator line then starts on a new one)."""
    if not a.restart_count or logs is None:
        return a
    offset = logs.size(a.job_id)
    mid_line = offset > 0 and logs.read(a.job_id, offset - 1, 1) != b"\n"
    return dataclasses.replace(a, log_offset=offset, log_mid_line=mid_line)
