"""The end of a job run on this worker.

A JobRun calls `Endings.finished` once its process is gone, the teardown
checks and the verify pass are done and its logs flushed: the job leaves
the running jobs (rc.worker.runs), the kernel log is read for Xids on its
GPUs (a fault or drain found goes out first, naming the job; those that hit
the job since it started go into its reason, and a fault or drain rule
matched is its hardware cause: rc.worker.health.job_note), and its terminal
report is queued after any fault queued before it (rc.worker.reporter).
Once that report is settled (`settled`), the run's lingering releases are
armed (rc.worker.hooks).
"""

from __future__ import annotations

from rc.proto.model import JobState
from rc.worker import health
from rc.worker.clock import Clock
from rc.worker.hooks import Leases
from rc.worker.job import JobRun, Result
from rc.worker.labels import Prober
from rc.worker.probe import cuda_index
from rc.worker.reporter import Report, Reporter
from rc.worker.runs import Runs

__all__ = ["SINCE_SLACK_S", "Endings", "kernel_since"]

SINCE_SLACK_S = 5.0
"""An Xid logged this long before a job's recorded start still counts as
hitting it (the kernel's clock and the job's start differ a little)."""


def kernel_since(clock: Clock, started_at: float | None) -> float:
    """When a job that started at `started_at` (wall seconds of `clock`, as
    JobRun.started_at; None: now) started, on the kernel log's clock
    (seconds since boot, which the monotonic clock counts), less
    SINCE_SLACK_S. Both readings come from `clock`, the one the start was
    read from: a fake clock's start is mapped by the fake clock."""
    now = clock.time()
    started = started_at if started_at is not None else now
    return clock.monotonic() - (now - started) - SINCE_SLACK_S


class Endings:
    """Job runs' ends on worker `host`, whose time is `clock` (the one its
    job runs read their start from): its jobs (`runs`), reports
    (`reporter`), probe passes (`prober`: the kernel log) and lease hooks
    (`leases`); thread-safe."""

    def __init__(
        self,
        host: str,
        clock: Clock,
        runs: Runs,
        reporter: Reporter,
        prober: Prober,
        leases: Leases,
    ) -> None:
        self.host = host
        self.clock = clock
        self.runs = runs
        self.reporter = reporter
        self.prober = prober
        self.leases = leases

    def finished(self, run: JobRun, result: Result) -> None:
        """Called by a JobRun when its process is gone, the teardown checks and
        the verify pass are done and its logs flushed: queue the terminal
        report (after any fault queued before it)."""
        self.runs.finished(run)
        reason = result.reason
        note = health.JobNote()
        if result.state is not JobState.SUCCEEDED:
            note = self._xid_note(run)
            reason = f"{reason}; {note.text}" if reason and note.text else reason or note.text
        self.reporter.submit(
            Report(
                run.job_id,
                result.state.value,
                result.exit_code,
                reason,
                run.started_at,
                hardware_cause=note.hardware,
                hardware_device_ids=tuple(f"{self.host}:{n}" for n in note.faulty),
                log=run.sink,
            )
        )

    def _xid_note(self, run: JobRun) -> health.JobNote:
        """Read the kernel log now: act on new Xid faults and drains (before
        the job's report, naming the job), and say which Xids hit the job's
        GPUs since it started (rc.worker.health.job_note; an empty JobNote
        for none).
        Kernel times are seconds since boot: the job's start is mapped onto
        them through the monotonic clock, with SINCE_SLACK_S of slack
        (kernel_since)."""
        if not any(cuda_index(n) is not None for n in run.device_names):
            return health.JobNote()
        new, recent = self.prober.poll_xids()
        self.reporter.submit_health(
            health.Pass(actions=[f for f in new if f.action in ("fault", "drain")]), run.job_id
        )
        since = kernel_since(self.clock, run.started_at)
        return health.job_note(recent, self.host, run.device_names, since)

    def settled(self, job_id: int, accepted: bool) -> None:
        """Job `job_id`'s terminal report is settled (`accepted`: the
        controller took it; rc.worker.reporter's on_done): arm its run's
        lingering releases, if it has any."""
        run = self.runs.settled(job_id, accepted)
        if run is not None:
            for name, epoch in run.release_epochs.items():
                hooks = self.leases.device(name)
                if hooks is not None:
                    hooks.arm_release(epoch, run.hook_context)
