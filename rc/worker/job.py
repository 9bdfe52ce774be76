"""Running one assignment, from spawn to terminal report (inventory §6.4).

The job runs in its own session and process group, stdin from /dev/null,
stdout and stderr merged into the LogSink. Watchdogs tick every 100 ms:
max runtime (wall clock), idle timeout (no output), and cancellation (a kill
request, the controller ending the job, worker shutdown). Ending it is
SIGTERM to the group, SIGKILL after the grace, then stragglers; afterwards
processes that escaped the group but carry RC_JOB_ID are swept. If anything
of the job survives, the device is faulted with the survivors named
(DESIGN.md §6.4). Logs are flushed before the terminal report is queued.

State: killed (we ended it, or a signal did) > failed (start error or a
non-zero exit) > succeeded. Death by signal N is exit code 128+N.
"""

from __future__ import annotations

import logging
import os
import select
import threading
import time
from dataclasses import dataclass

from rc.proto.duration import format_duration
from rc.proto.model import JobKind, JobState, Stdio
from rc.proto.wire import Assignment
from rc.worker import procfs, supervise
from rc.worker.logsink import LogSink
from rc.worker.reporter import Report

__all__ = ["JobRun", "job_env", "HOLD_COMMAND", "WATCHDOG_TICK_S"]

log = logging.getLogger("rc.worker.job")

HOLD_COMMAND = ("sleep", "2147483647")
"""What a hold runs: the worker's own sleeper, never a submitted command."""
WATCHDOG_TICK_S = 0.1
READER_DRAIN_S = 2.0
LOG_FLUSH_S = 300.0
LOG_FLUSH_SHUTDOWN_S = 20.0
STRIPPED_ENV_PREFIX = "RC_"
"""Worker settings (RC_TOKEN above all) never leak into a job's environment."""


def job_env(
    base: dict[str, str],
    requested: dict[str, str],
    job_id: int,
    device_id: str,
    cuda: str | None,
    markers: dict[str, str] | None = None,
) -> dict[str, str]:
    """A job's environment: the worker's own (minus RC_* settings), the job's
    entries, then RC_JOB_ID, RC_DEVICE, CUDA_VISIBLE_DEVICES and the worker's
    `markers` (RC_HOST, RC_WORKER_INSTANCE), which always win over the job's."""
    env = {k: v for k, v in base.items() if not k.startswith(STRIPPED_ENV_PREFIX)}
    env.update(requested)
    env.update(markers or {})
    env["RC_JOB_ID"] = str(job_id)
    env["RC_DEVICE"] = device_id
    if cuda is not None:
        env["CUDA_VISIBLE_DEVICES"] = cuda
        env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    else:
        env.pop("CUDA_VISIBLE_DEVICES", None)
    return env


@dataclass(slots=True)
class Result:
    state: JobState
    exit_code: int | None
    reason: str


class JobRun:
    """One assignment being run; `cancel()` may be called from any thread."""

    def __init__(self, agent, a: Assignment, cuda: str | None) -> None:
        self.agent = agent
        self.a = a
        self.cuda = cuda
        self.job_id = a.job_id
        self._cancel_reason: str | None = None
        self._cancel = threading.Event()
        self.last_output = time.monotonic()
        self.thread = threading.Thread(target=self._run, name=f"rc-job-{a.job_id}", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def cancel(self, reason: str) -> None:
        """End the job (first reason wins)."""
        if self._cancel_reason is None:
            self._cancel_reason = reason
        self._cancel.set()

    # -- the run ------------------------------------------------------------

    def _run(self) -> None:
        try:
            result = self._execute()
        except Exception as e:  # a bug must still end in a report
            log.exception("job %d: worker error", self.job_id)
            result = Result(JobState.FAILED, None, f"worker error: {e}")
        self.agent.finished(self, result.state.value, result.exit_code, result.reason,
                            self.started_at)

    def _execute(self) -> Result:
        a = self.a
        self.started_at = time.time()
        if a.stdio is not Stdio.LOGS:
            return Result(JobState.FAILED, None,
                          f"this worker cannot run {a.stdio.value} sessions yet")
        hold = a.kind is JobKind.HOLD
        argv = HOLD_COMMAND if hold else a.command
        env = job_env(dict(os.environ), {} if hold else a.env, a.job_id, a.device_id, self.cuda,
                      self.agent.markers)
        sink = LogSink(self.agent.client, a.job_id)
        cwd, note = _working_dir(a.cwd, self.agent.cfg.host)
        if note:
            sink.write(note)
        r, w = os.pipe()
        try:
            try:
                group = supervise.spawn(argv, cwd=cwd, env=env, stdout=w, stderr=w)
            except OSError as e:
                sink.write(f"rc: cannot start {argv[0]!r}: {e.strerror or e}\n".encode())
                sink.close(LOG_FLUSH_S)
                code = 127 if isinstance(e, FileNotFoundError) else 126
                return Result(JobState.FAILED, code, f"cannot start: {e.strerror or e}")
        finally:
            os.close(w)
        self.agent.reporter.submit(Report(a.job_id, "running", started_at=self.started_at))
        reader = threading.Thread(target=self._read, args=(r, sink), daemon=True,
                                  name=f"rc-job-{a.job_id}-out")
        self._reader_stop = False
        reader.start()
        outcome, why, survivors = self._supervise(group, hold)
        stragglers = False
        if why is None:
            stragglers, left = supervise.reap_stragglers(group)
            survivors = survivors or left
        escaped, complete = supervise.sweep_job(str(a.job_id), self.agent.sweep_scope)
        if escaped:
            log.warning("job %d: %d process(es) escaped its group and survived", a.job_id, len(escaped))
        reader.join(READER_DRAIN_S)
        if reader.is_alive():
            self._reader_stop = True
            reader.join(1.0)
        os.close(r)
        if not sink.close(LOG_FLUSH_SHUTDOWN_S if self.agent.stopping else LOG_FLUSH_S):
            log.error("job %d: %d log bytes could not be delivered", a.job_id, sink.lost)
        alive = [p.pid for p in survivors] + list(escaped)
        if alive:
            names = "; ".join(f"pid {p} {procfs.cmdline(p)!r}" for p in alive[:10])
            self.agent.fault(a.device_id, f"processes of job {a.job_id} survived teardown: {names}",
                             a.job_id)
        return _label(outcome, why, stragglers, hold, a)

    def _supervise(self, group: supervise.Group, hold: bool):
        a = self.a
        start = time.monotonic()
        limit = a.max_runtime_seconds
        idle = a.idle_timeout_seconds if not hold else 0
        why: str | None = None
        while True:
            outcome = group.wait(WATCHDOG_TICK_S)
            if outcome is not None:
                return outcome, why, []
            now = time.monotonic()
            if self._cancel.is_set():
                why = self._cancel_reason or "cancelled"
            elif limit and now - start >= limit:
                why = (f"hold ended: its ttl of {format_duration(limit)} was reached" if hold
                       else f"max_runtime exceeded ({format_duration(limit)})")
            elif idle and now - self.last_output >= idle:
                why = f"idle: no output for {format_duration(idle)}"
            if why is not None:
                outcome, survivors = supervise.kill_group(group, self.agent.cfg.kill_grace)
                return outcome, why, survivors

    def _read(self, fd: int, sink: LogSink) -> None:
        poller = select.poll()
        poller.register(fd, select.POLLIN | select.POLLHUP | select.POLLERR)
        while not self._reader_stop:
            if not poller.poll(200):
                continue
            try:
                data = os.read(fd, 65536)
            except OSError:
                return
            if not data:
                return
            self.last_output = time.monotonic()
            sink.write(data)


def _working_dir(cwd: str, host: str) -> tuple[str | None, bytes]:
    if not cwd:
        return None, b""
    if os.path.isdir(cwd):
        return cwd, b""
    home = os.path.expanduser("~")
    return home, f"[rc: {cwd} does not exist on {host}; running in {home}]\n".encode()


def _label(outcome: supervise.Outcome | None, why: str | None, stragglers: bool, hold: bool,
           a: Assignment) -> Result:
    code = outcome.exit_code if outcome is not None else None
    if why is not None:
        if hold and why.startswith("hold ended"):
            return Result(JobState.SUCCEEDED, 0, why)
        return Result(JobState.KILLED, code, why)
    assert outcome is not None
    if outcome.signal:
        return Result(JobState.KILLED, code, f"signal: {supervise.signal_name(outcome.signal)}")
    if stragglers:
        return Result(JobState.KILLED, code, "stragglers reaped after exit")
    if code != 0:
        return Result(JobState.FAILED, code, f"exited with code {code}")
    return Result(JobState.SUCCEEDED, 0, "")
