"""The worker process: its parts, put together, and its shutdown.

The parts, each in its own module:

- `runs` (rc.worker.runs): the job ledger every other part shares;
- `registration` (rc.worker.registration): register, heartbeat, re-register,
  push labels, long-poll, leave: everything that dials out to the
  controller;
- `dispatch` (rc.worker.dispatch): acts on what the long poll and report
  replies hand over: kills, sessions inside holds (rc.worker.sessions),
  survivor scans, job runs (rc.worker.job);
- `endings` (rc.worker.ending): a job run's end, its Xids and terminal
  report, and the lingering release once that is settled;
- `recheck` (rc.worker.recheck): survivor scans, periodic and asked for;
- and those of the library: the reporter (rc.worker.reporter), the prober
  (rc.worker.labels), the lease hooks (rc.worker.hooks), the log spool
  (rc.worker.spool), process tracking (rc.worker.cgroups).

Threads: the main thread waits for a signal; the poll thread runs the startup
release pass (every device's on_release, rc.worker.hooks) and then long-polls
for assignments and kills; the heartbeat thread names the jobs this worker
supervises every `heartbeat_interval`; the probe thread re-probes every
`probe_interval` and pushes labels and usage sheets (POST
/v1/workers/{id}/labels, never a re-registration); the re-check thread
rescans while a re-check is due; the reporter sends faults and status
reports; one thread per job (rc.worker.job), per session and per survivor
scan. The worker only dials out.

A job id is never started twice by one worker process. A job's lingering
release is armed once its terminal report is settled. SIGTERM/SIGINT: stop
polling and start nothing more, end running jobs (their terminal reports go
out), wait for the reports (45 s at most), leave (POST
/v1/workers/{id}/leave: the jobs assigned to this worker that it never
started go back to the queue, rc.controller.fleet.leave), fire pending
releases (20 s at most), exit 0.
"""

from __future__ import annotations

import functools
import logging
import threading
import uuid

from rc.proto.client import Client
from rc.proto.codec import decode
from rc.proto.wire import Assignment, Assignments
from rc.worker import cgroups, sessions
from rc.worker.clock import SYSTEM, Clock
from rc.worker.config import DeviceConfig, WorkerConfig
from rc.worker.dispatch import Dispatcher
from rc.worker.ending import Endings
from rc.worker.hooks import Leases
from rc.worker.job import JobContext, JobRun
from rc.worker.labels import Prober
from rc.worker.logsink import LogSink
from rc.worker.recheck import Recheck
from rc.worker.registration import Registration
from rc.worker.reporter import Reporter
from rc.worker.runs import Runs
from rc.worker.spool import Spool

__all__ = ["Agent"]

log = logging.getLogger("rc.worker")

SHUTDOWN_GRACE_S = 45.0
LEAVE_TIMEOUT_S = 10.0
"""The most a stopping worker waits to hand back the jobs it never started."""


class Agent:
    """One worker process: `run()` returns the exit code.

    `clock` (default: the real one) is the time of every timer of the worker:
    its loops, its job runs, hooks, reporter and log sinks (rc.worker.clock).
    `ready_fd`: where to write "registered" once the first registration
    went through (rc up's --ready-fd), or None.
    """

    def __init__(
        self,
        cfg: WorkerConfig,
        client: Client,
        clock: Clock = SYSTEM,
        ready_fd: int | None = None,
    ) -> None:
        self.cfg = cfg
        self.client = client
        self.clock = clock
        self.worker_id = cfg.host
        self.stop_event = threading.Event()
        self.stopping = False
        self.runs = Runs()
        """The jobs of this process (rc.worker.runs): what its leave claims
        it may have started, once closed."""
        self.reporter = Reporter(
            client, self.worker_id, self._report_done, clock, self._carried_assignments
        )
        # Every job carries these, so sweeps and survivor scans only ever see
        # this host's jobs (and post-job sweeps only this worker process's).
        self.instance_id = uuid.uuid4().hex
        self.markers = {"RC_HOST": cfg.host, "RC_WORKER_INSTANCE": self.instance_id}
        self.tracker = cgroups.Tracker.detect(cfg.host, cfg.cgroup_root)
        """How this worker tracks its jobs' processes (label proctrack)."""
        log.info("process tracking: %s (%s)", self.tracker.mode, self.tracker.why)
        self.prober = Prober(cfg, clock=clock)
        self.prober.fixed["proctrack"] = self.tracker.mode
        self.leases = Leases(cfg, clock)
        self.spool = Spool(cfg.spool_dir, cfg.spool_max_bytes)
        self.recheck = Recheck(
            cfg, client, clock, self.runs, self.tracker, self.prober, lambda: self.devices
        )
        self.registration = Registration(
            cfg,
            client,
            clock,
            self.runs,
            self.reporter,
            self.prober,
            self.tracker,
            self.leases,
            self.recheck,
            self.instance_id,
            self.stop_event,
            ready_fd,
        )
        self.endings = Endings(cfg.host, clock, self.runs, self.reporter, self.prober, self.leases)
        self.job_context = JobContext(
            cfg=cfg,
            clock=clock,
            client=client,
            markers=self.markers,
            report=self.reporter.submit,
            fault=self._job_fault,
            open_log=self._open_log,
            hooks=self.leases.device,
            gpu_uuid=self.prober.gpu_uuid,
            stopping=lambda: self.stopping,
            finished=self.endings.finished,
            tracker=self.tracker,
        )
        """What this worker's job runs see of it."""
        session_context = sessions.SessionContext(
            cfg=cfg,
            client=client,
            clock=clock,
            markers=self.markers,
            tracker=self.tracker,
            runs=self.runs,
            stopping=lambda: self.stopping,
        )
        self.dispatch = Dispatcher(
            self.runs,
            self.reporter.submit,
            self._new_run,
            functools.partial(sessions.run_session, session_context),
            self.recheck.answer,
        )

    @property
    def devices(self) -> dict[str, DeviceConfig]:
        """The devices of the last registration, by name."""
        return self.registration.devices

    def _new_run(self, a: Assignment) -> JobRun:
        """A run of assignment `a` on this worker's devices (not started)."""
        return JobRun(
            self.job_context, a, [self.devices.get(d.rpartition(":")[2]) for d in a.devices]
        )

    def _open_log(self, job_id: int) -> LogSink:
        """Where job `job_id`'s output goes: the controller, through the spool."""
        return LogSink(
            self.client,
            job_id,
            spool=self.spool,
            clock=self.clock,
            tail_limit=lambda: self.reporter.tail_bytes,
        )

    def _report_done(self, job_id: int, accepted: bool) -> None:
        self.endings.settled(job_id, accepted)

    def _carried_assignments(self, items: list) -> None:
        """Start the assignments a report reply carried (rc.worker.reporter),
        as a long poll's: a job id and restart count already started here is
        skipped."""
        got = decode(Assignments, {"assignments": items})
        if got.assignments and not self.stop_event.is_set():
            self.dispatch.dispatch(got)

    def _job_fault(self, device_id: str, reason: str, job_id: int | None) -> None:
        """A job run quarantines a device; survivors of its teardown arm the re-check."""
        self.recheck.note_fault(reason)
        self.reporter.submit_fault(device_id, reason, job_id)

    def fault(self, device_id: str, reason: str, job_id: int | None) -> None:
        """Quarantine a device (`fault`): queued, retried, and sent before any
        later report (rc.worker.reporter)."""
        self.reporter.submit_fault(device_id, reason, job_id)

    # -- the process --------------------------------------------------------

    def run(self) -> int:
        """Register, start the loops, wait for a stop; the exit code (0; 1 when
        the controller refused the registration for good)."""
        reg = self.registration
        if not reg.register():
            self.tracker.close()
            return 1 if reg.refused else 0
        threading.Thread(target=reg.heartbeat_loop, name="rc-heartbeat", daemon=True).start()
        threading.Thread(target=reg.probe_loop, name="rc-probe", daemon=True).start()
        threading.Thread(
            target=self.recheck.loop, args=(self.stop_event,), name="rc-recheck", daemon=True
        ).start()
        threading.Thread(
            target=reg.poll_loop, args=(self.dispatch.dispatch,), name="rc-poll", daemon=True
        ).start()
        while not self.stop_event.wait(1.0):  # a tick: signal handlers run between waits
            pass
        return self._shutdown()

    def stop(self) -> None:
        """Ask the worker to shut down (signal handlers call this)."""
        self.stopping = True
        self.stop_event.set()
        self.registration.beat_now.set()  # the heartbeat loop waits on this, not on stop_event

    def _shutdown(self) -> int:
        runs = self.runs.close()  # nothing starts from here on
        log.info("shutting down: ending %d running job(s)", len(runs))
        deadline = self.clock.monotonic() + SHUTDOWN_GRACE_S
        for run in runs:
            run.cancel("the worker is shutting down")
        for run in runs:
            run.thread.join(max(0.0, deadline - self.clock.monotonic()))
        if not self.reporter.drain(max(1.0, deadline - self.clock.monotonic())):
            log.error("some job reports could not be delivered before shutdown")
        self.registration.leave(max(1.0, min(LEAVE_TIMEOUT_S, deadline - self.clock.monotonic())))
        self.reporter.stop()
        self.leases.drain()
        self.spool.close()
        self.tracker.close()
        log.info("worker stopped")
        return 0
