"""The worker's job ledger: which jobs this worker process runs, which it
started, which ends the controller has still to acknowledge.

Every part of the agent reads it (registration names the running jobs,
heartbeats the holds, the re-check skips their devices, a session finds its
hold) and two write it: the dispatch, when it starts a job, and a job run's
end. One lock covers all of it, so each decision below is one critical
section: in particular, once `close()` returned, `unsettled()` names every
job this process may have started (what its leave claims,
rc.controller.fleet.leave).

A job is known by (job id, restart count): a job the hardware requeued comes
again with a higher restart count and may run here again; the same run of a
job never starts twice in one worker process.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable

from rc.proto.model import JobKind
from rc.proto.wire import Assignment
from rc.worker.job import JobRun

__all__ = ["KILLS_KEPT", "Runs"]

KILLS_KEPT = 1024
"""Kills of jobs not running here that the ledger remembers (then it starts
over: an assignment carried after its kill comes soon after it)."""


class Runs:
    """The jobs of one worker process; thread-safe.

    running: job id → its JobRun, from its start until its process is gone
    and its teardown done (`finished`). reporting: jobs whose terminal
    report is not yet settled (or that were killed before they started
    here). unsettled: jobs this process started (or may have) whose end the
    controller has not acknowledged. closed: set once shutting down; from
    then on nothing starts.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._jobs: dict[int, JobRun] = {}
        self._reporting: set[int] = set()
        self._started: set[tuple[int, int]] = set()  # (job id, restart count)
        self._unsettled: set[int] = set()
        self._killed_unstarted: set[int] = set()
        """Jobs a kill named before this process ran them: an assignment a
        report reply carried may arrive after its kill (the long poll hands
        out a job with a kill requested together with the kill)."""
        self._arms: dict[int, JobRun] = {}
        """Ended runs whose lingering release waits for their report to settle."""
        self._closed = False

    # -- readings -----------------------------------------------------------

    @property
    def closed(self) -> bool:
        """Whether `close()` was called (nothing starts any more)."""
        return self._closed

    def get(self, job_id: int) -> JobRun | None:
        """Job `job_id`'s run while it runs here, else None."""
        with self._lock:
            return self._jobs.get(job_id)

    def running(self) -> dict[int, JobRun]:
        """A copy of job id → JobRun of every job running here."""
        with self._lock:
            return dict(self._jobs)

    def idle(self) -> bool:
        """No job runs here (ends still being reported do not count)."""
        with self._lock:
            return not self._jobs

    def busy(self) -> bool:
        """A job runs here or its end is still being reported."""
        with self._lock:
            return bool(self._jobs) or bool(self._reporting)

    def named(self) -> list[int]:
        """The ids a heartbeat or a registration names, sorted: the jobs
        running here and those whose end is still being reported."""
        with self._lock:
            return sorted(set(self._jobs) | self._reporting)

    def holds(self) -> dict[int, list[str]]:
        """Job id → device names of every hold running here that started
        its process (what the idle rule samples)."""
        with self._lock:
            return {
                job_id: run.device_names
                for job_id, run in self._jobs.items()
                if run.a.kind is JobKind.HOLD and run.started_at is not None
            }

    def in_use(self) -> tuple[set[int], set[str]]:
        """(the ids `named()` gives, the device ids of the running jobs)."""
        with self._lock:
            return (
                set(self._jobs) | self._reporting,
                {d for run in self._jobs.values() for d in run.device_ids},
            )

    def unsettled(self) -> tuple[int, ...]:
        """The jobs this process may have started whose end the controller
        has not acknowledged, sorted (what the leave names)."""
        with self._lock:
            return tuple(sorted(self._unsettled))

    # -- changes --------------------------------------------------------------

    def note_kills(self, kills: Iterable[int]) -> None:
        """Remember the kills of jobs not running here, so that an
        assignment of one that comes after its kill is never started."""
        with self._lock:
            if len(self._killed_unstarted) >= KILLS_KEPT:
                self._killed_unstarted.clear()
            self._killed_unstarted.update(k for k in kills if k not in self._jobs)

    def admit(
        self, a: Assignment, kills: set[int], make: Callable[[], JobRun]
    ) -> tuple[bool, JobRun | None]:
        """Decide, record and register the start of assignment `a` in one
        critical section: (False, None) when it does not start (the ledger
        is closed, or this run of the job started here already); (True,
        None) when a kill came first (in `kills`, this long poll's, or an
        earlier one): the job counts as reporting, and its "killed" report is
        the caller's to send; (True, run) with the run `make()` built, now
        running here, for the caller to start. Either True counts the job
        unsettled."""
        with self._lock:
            if self._closed or (a.job_id, a.restart_count) in self._started:
                return False, None  # shutting down: never started, so the leave hands it back
            self._started.add((a.job_id, a.restart_count))
            self._unsettled.add(a.job_id)
            if a.job_id in kills or a.job_id in self._killed_unstarted:
                self._reporting.add(a.job_id)
                return True, None
            run = make()
            self._jobs[a.job_id] = run
            return True, run

    def cancel(self, job_id: int, reason: str, only: JobRun | None = None) -> None:
        """Cancel job `job_id`'s run here (with `only`: when it is that run;
        a run that started meanwhile is not the one a caller means).
        `reason` "" says "cancelled"."""
        run = self.get(job_id)
        if run is not None and (only is None or run is only):
            run.cancel(reason or "cancelled")

    def finished(self, run: JobRun) -> None:
        """`run`'s process is gone and its teardown done: from now on its
        job is reporting, and a run with lingering releases is armed once
        its report settles (`settled`)."""
        with self._lock:
            self._jobs.pop(run.job_id, None)
            self._reporting.add(run.job_id)
            if run.release_epochs:
                self._arms[run.job_id] = run

    def settled(self, job_id: int, accepted: bool) -> JobRun | None:
        """Job `job_id`'s terminal report is settled (`accepted`: the
        controller recorded its end, so it is no longer "may have run",
        unless the hardware requeued it and its next run started here
        already). Returns the ended run whose lingering releases are now to
        be armed, if any."""
        with self._lock:
            self._reporting.discard(job_id)
            if accepted and job_id not in self._jobs:
                self._unsettled.discard(job_id)
            return self._arms.pop(job_id, None)

    def close(self) -> list[JobRun]:
        """Start nothing from now on; the runs still running."""
        with self._lock:
            self._closed = True
            return list(self._jobs.values())
