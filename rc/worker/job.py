"""Running one assignment, from acquire hooks to terminal report.

A job may have several devices of this host (Assignment.devices): it is one
process group across all of them, and each step below is done for each.

0. The job's Unix user (rc.worker.account): one this host cannot run the
   job as (no such user, root without allow_root_jobs) fails the job at
   once, before anything else runs; its devices stay as they were.
1. Each device's on_acquire hook (rc.worker.hooks), in order. Cancelled by
   our own kill or shutdown → killed, devices untouched; failed → the job
   fails with the hook's output and that device is faulted.
2. The job, in its own session and process group, stdin from /dev/null,
   stdout and stderr merged into the LogSink. Every 100 ms the run reads its
   clock and asks the watchdog (rc.worker.watchdog: max runtime, the lowest
   ceiling of its devices when the job has none or a larger one; idle
   timeout), after cancellation (a kill request, the controller ending the
   job, worker shutdown). Ending it is SIGTERM to the group, SIGKILL after
   the kill grace, then stragglers. A tty or pipe job is wired to the relay
   instead (rc.worker.attached).
3. Teardown checks (rc.worker.leftovers): processes that escaped the group
   but carry RC_JOB_ID are swept; where nvidia-smi knows a device's GPU no
   compute process may remain on it. A survivor of the group or of the
   sweep (found by its RC_JOB_ID, on no GPU in particular) faults every
   device of the job; a compute process left on a GPU faults that device.
   The survivors are named.
4. The verify pass (rc.worker.verify), for each device; a failure faults
   that device.
5. Logs flushed, then the terminal report is queued (faults go out first);
   once it is settled the agent arms the lingering release.

How it ended is labelled by rc.worker.launch.label.
State: killed (we ended it, or a signal did) > failed (start error or a
non-zero exit) > succeeded. Death by signal N is exit code 128+N. A job that
exits on its own while a kill is on its way is labelled by how it exited.
Background children left in the group after the leader's exit (stragglers)
are reaped with SIGKILL and noted in the reason; they do not change the
state.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import select
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from rc.proto import calls
from rc.proto.client import Client
from rc.proto.duration import format_duration
from rc.proto.errors import RcError
from rc.proto.model import JobKind, JobState, Stdio
from rc.proto.wire import Assignment
from rc.worker import account, cgroups, leftovers, procfs, supervise, verify, watchdog
from rc.worker.account import Account
from rc.worker.attached import Halves, Pipes, Process
from rc.worker.clock import Clock
from rc.worker.config import DeviceConfig, WorkerConfig
from rc.worker.hooks import DeviceHooks, HookContext, hook_env
from rc.worker.launch import (
    HOLD_COMMAND,
    READER_DRAIN_S,
    Result,
    cannot_start,
    cannot_start_line,
    clean_env,
    job_env,
    label,
    working_dir,
)
from rc.worker.logsink import LogSink
from rc.worker.probe import cuda_visible
from rc.worker.reporter import Report
from rc.worker.terminal import TTY_DRAIN_S, Terminal, end_terminal_session, login_shell

__all__ = [
    "LOG_FLUSH_S",
    "LOG_FLUSH_SHUTDOWN_S",
    "WATCHDOG_TICK_S",
    "JobContext",
    "JobRun",
    "needs_scan",
    "open_job_log",
    "restart_separator",
]

log = logging.getLogger("rc.worker.job")

WATCHDOG_TICK_S = 0.1
"""How often a running job's watchdog looks (real seconds: a tick)."""
LOG_FLUSH_S = 300.0
"""How long a job's log may take to reach the controller after it ended (s)."""
LOG_FLUSH_SHUTDOWN_S = 20.0
"""The same while the worker shuts down (s)."""


def restart_separator(restart: int, mid_line: bool = False) -> bytes:
    """The line a requeued run's output starts with in the job's log (on a
    line of its own: after a newline when the log ends `mid_line`)."""
    line = f"--- restart {restart} after a hardware failure ---\n".encode()
    return b"\n" + line if mid_line else line


def open_job_log(ctx: JobContext, a: Assignment) -> LogSink:
    """The LogSink for a run of assignment `a`: a rerun after a hardware
    failure (restart_count > 0) appends after the stored log (its
    log_offset), starting with restart_separator; the logstore's offsets
    keep every earlier byte and never duplicate one."""
    sink = ctx.open_log(a.job_id)
    if a.restart_count:
        sink.resume_at(a.log_offset, restart_separator(a.restart_count, a.log_mid_line))
    return sink


@dataclass(frozen=True, slots=True)
class JobContext:
    """What a job run needs of its worker (rc.worker.agent builds one; a
    test can build its own).

    cfg: the worker's configuration (host, kill_grace, verify_dir,
    verify_timeout, verify_pass_budget). clock: its time (rc.worker.clock).
    client: the controller (the relay halves of a tty or pipe job). markers:
    RC_HOST and RC_WORKER_INSTANCE, set in every job's environment (the
    escapee sweep only ends processes carrying this RC_WORKER_INSTANCE).
    report(Report): queue a status report. fault(device_id, reason, job_id):
    quarantine a device (sent before any later report). open_log(job_id): a
    LogSink for a job's output. hooks(device_name): the device's lease hooks
    (None: not configured). gpu_uuid(device_name): its GPU's UUID ("" when
    none is known). stopping(): the worker is shutting down. finished(run,
    result): the run is over; its terminal report is the worker's to send.
    tracker: how the worker tracks processes (rc.worker.cgroups; scan mode
    by default).
    """

    cfg: WorkerConfig
    clock: Clock
    client: Client
    markers: Mapping[str, str]
    report: Callable[[Report], None]
    fault: Callable[[str, str, int | None], None]
    open_log: Callable[[int], LogSink]
    hooks: Callable[[str], DeviceHooks | None]
    gpu_uuid: Callable[[str], str]
    stopping: Callable[[], bool]
    finished: Callable[[JobRun, Result], None]
    tracker: cgroups.Tracker = field(default_factory=lambda: cgroups.Tracker(cgroups.SCAN))

    @property
    def sweep_scope(self) -> dict[bytes, bytes]:
        """The variables a process must carry to be swept as this worker's."""
        instance = self.markers.get("RC_WORKER_INSTANCE", "")
        return {b"RC_WORKER_INSTANCE": instance.encode()} if instance else {}


def needs_scan(kind: JobKind, placed: bool, user: Account | None, left: list[int]) -> bool:
    """Whether a job's teardown must scan /proc for processes tagged with its
    RC_JOB_ID. Not when its cgroup answers for everything: a job (a hold's
    sessions may run outside any cgroup) whose leader was placed in its
    cgroup before its program ran, that ran as a user other than root (only
    root may move a process out of the worker's subtree: a move needs write
    access to the common ancestor's cgroup.procs) and whose cgroup kill
    left nothing alive (`left`)."""
    trusted = kind is JobKind.JOB and placed and user is not None and user.uid != 0
    return not trusted or bool(left)


class JobRun:
    """One assignment being run in `ctx`; `cancel()` may be called from any
    thread.

    `configs` are the configurations of the devices it runs on, in its order
    (None for one the worker does not know: then no hooks and no ceiling
    apply to it).
    """

    def __init__(self, ctx: JobContext, a: Assignment, configs: list[DeviceConfig | None]) -> None:
        self.ctx = ctx
        self.clock = ctx.clock
        self.a = a
        self.configs = configs
        self.device_ids = a.devices
        self.device_names = [d.rpartition(":")[2] for d in self.device_ids]
        self.device_name = self.device_names[0]
        self.cuda = cuda_visible(self.device_names)
        self.job_id = a.job_id
        self.started_at: float | None = None
        self.cancel_reason: str | None = None
        self.cancelled = threading.Event()
        # cancel() writes here so a waiting supervisor acts at once, not at its tick
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._wake_lock = threading.Lock()
        self.last_output = self.clock.monotonic()
        self.in_write = False
        self._swept: list[int] | None = None
        self._pid_floor = 0  # 0: the escapee sweep reads every process
        self._last_pid: int | None = None
        self._pids_wrapped = True
        self.release_epochs: dict[str, int] = {}
        """device name → the ownership epoch to arm its release with (only
        the devices whose acquire ran)."""
        self.acquired = threading.Event()
        """Set once every device's acquire hook succeeded (or it has none)."""
        self.ending: str | None = None
        """Once the worker decided to end the job (or it ended): why, in the
        words a hold's sessions report ("hold 17 expired (ttl 30m)")."""
        self.hook_context = HookContext(a.job_id, a.submitter)
        self.account: Account | None = None
        """The Unix user the job runs as, once resolved (its sessions too)."""
        self.cgroup: cgroups.Cgroup | None = None
        """The job's own cgroup (None in scan mode), made just before it starts."""
        self.placed = False
        """Whether its leader was in `cgroup` before the job's program ran."""
        self.sink: LogSink | None = None
        """Its log sink, once open (a job with stdio logs); the terminal
        report may carry its tail."""
        self.thread = threading.Thread(target=self._run, name=f"rc-job-{a.job_id}", daemon=True)

    def start(self) -> None:
        """Run the job on its own thread."""
        self.thread.start()

    def cancel(self, reason: str) -> None:
        """End the job (first reason wins)."""
        if self.cancel_reason is None:
            self.cancel_reason = reason
        self.cancelled.set()
        with self._wake_lock:
            if self._wake_w >= 0:
                try:
                    os.write(self._wake_w, b"!")
                except BlockingIOError:  # already woken
                    pass

    # -- the run ------------------------------------------------------------

    def _run(self) -> None:
        self.started_at = self.clock.time()
        try:
            result = self._lifecycle()
        except Exception as e:  # a bug must still end in a report
            log.exception("job %d: worker error", self.job_id)
            result = Result(JobState.FAILED, None, f"worker error: {e}")
        finally:
            with self._wake_lock:
                os.close(self._wake_r)
                os.close(self._wake_w)
                self._wake_r = self._wake_w = -1
        self.ctx.finished(self, result)

    def _lifecycle(self) -> Result:
        a = self.a
        ctx = self.ctx
        cfg = ctx.cfg
        try:
            self.account = account.for_job(
                a.unix_user, cfg.host, cfg.shared_account, cfg.allow_root_jobs
            )
        except account.CannotRunAs as e:
            log.warning("job %d: %s", a.job_id, e)
            return Result(
                JobState.FAILED, None, str(e)
            )  # nothing ran; the devices are as they were
        for device_id, name in zip(self.device_ids, self.device_names, strict=True):
            hooks = ctx.hooks(name)
            if hooks is None:
                continue
            got = hooks.acquire(self.hook_context, self.cancelled)
            if got.cancelled:
                self.release_epochs[name] = got.epoch
                return Result(JobState.KILLED, None, got.error)
            if not got.ok:
                ctx.fault(device_id, got.error, a.job_id)
                return Result(JobState.FAILED, None, got.error)
            self.release_epochs[name] = got.epoch
        self.acquired.set()
        self.started_at = self.clock.time()  # the job proper starts after its acquire hooks
        result = self._execute()
        alive = list(result.survivors) + self.sweep_escapees()
        everywhere = (
            f"processes of job {a.job_id} survived teardown: {leftovers.describe_pids(alive)}"
            if alive
            else ""
        )
        uuids = {ctx.gpu_uuid(n): d for d, n in zip(self.device_ids, self.device_names)}
        uuids.pop("", None)
        on_gpu = leftovers.gpus_leftovers(list(uuids)) if uuids else {}
        by_device = {uuids[u]: why for u, why in on_gpu.items()}
        for device_id, why in leftovers.device_faults(
            self.device_ids, everywhere, by_device
        ).items():
            ctx.fault(device_id, why, a.job_id)
        for device_id in self.device_ids:
            failed = verify.run_pass(
                cfg.verify_dir,
                hook_env("verify", device_id, self.hook_context),
                timeout=cfg.verify_timeout,
                budget=cfg.verify_pass_budget,
                grace=cfg.kill_grace,
                clock=self.clock,
            )
            if failed:
                ctx.fault(device_id, failed, a.job_id)
        if not alive:  # verified empty: the cgroups go; with survivors they stay, to be rescanned
            for cg in self.cgroups():
                if not cg.live_pids():
                    cg.remove()
        return result

    def cgroups(self) -> list[cgroups.Cgroup]:
        """The job's cgroup and those of its sessions (a hold's), that exist."""
        own = [self.cgroup] if self.cgroup is not None and self.cgroup.exists() else []
        return own + self.ctx.tracker.children(f"session-{self.job_id}-")

    def watch_pids(self, leader: int) -> None:
        """Start watching the kernel's pid counter from a freshly spawned
        leader: while it never goes backwards, every descendant of the job has
        a pid above the leader's, and the escapee sweep reads only those."""
        self._pid_floor = leader
        self._last_pid = procfs.last_pid()
        self._pids_wrapped = self._last_pid is None

    def note_pids(self) -> None:
        """Sample the pid counter (at least every watchdog tick while the job
        runs: far too often for the counter to wrap unseen)."""
        now = procfs.last_pid()
        if now is None or (self._last_pid is not None and now < self._last_pid):
            self._pids_wrapped = True
        self._last_pid = now

    def sweep_escapees(self) -> list[int]:
        """End processes outside the group that carry this job's RC_JOB_ID (and
        this worker's marker); the pids still alive. Runs once per job."""
        if self._swept is None:
            in_cgroup = []
            for cg in self.cgroups():  # no tag needed: env -i and setsid stay members
                try:
                    in_cgroup += cg.kill()
                except OSError as e:
                    log.warning("job %d: cannot kill cgroup %s: %s", self.job_id, cg.path, e)
            self.note_pids()
            floor = 0 if self._pids_wrapped else self._pid_floor
            escaped: list[int] = []
            if needs_scan(self.a.kind, self.placed, self.account, in_cgroup):
                escaped, _complete = supervise.sweep_job(
                    str(self.a.job_id), self.ctx.sweep_scope, floor
                )
            if escaped:
                log.warning(
                    "job %d: %d process(es) escaped its group and survived",
                    self.a.job_id,
                    len(escaped),
                )
            self._swept = sorted(set(in_cgroup) | set(escaped))
        return self._swept

    def _execute(self) -> Result:
        a = self.a
        if a.stdio is not Stdio.LOGS:  # a terminal or pipe on the relay
            return self._execute_attached()
        hold = a.kind is JobKind.HOLD
        argv = HOLD_COMMAND if hold else a.command
        user = self.account
        assert user is not None  # resolved first (_lifecycle)
        env = job_env(
            self.clean_env(),
            {} if hold else a.env,
            a.job_id,
            self.device_ids,
            self.cuda,
            self.ctx.markers,
        )
        sink = self.sink = open_job_log(self.ctx, a)
        try:
            cwd, note = working_dir(a.cwd, self.ctx.cfg.host, user)
        except account.CannotRunAs as e:
            sink.write(f"rc: {e}\n".encode())
            sink.close(LOG_FLUSH_S)
            return Result(JobState.FAILED, None, f"cannot start: {e}")
        if note:
            sink.write(note)
        self.cgroup = self.ctx.tracker.create(f"job-{a.job_id}")
        r, w = os.pipe()
        try:
            try:
                group = supervise.spawn(
                    argv, cwd=cwd, env=env, stdout=w, stderr=w, account=user, cgroup=self.cgroup
                )
                self.watch_pids(group.pid)
                self.placed = group.joined
            except OSError as e:
                sink.write(cannot_start_line(argv[0], e, env.get("PATH")))
                sink.close(LOG_FLUSH_S)
                return cannot_start(e, argv[0], env.get("PATH"))
        finally:
            os.close(w)
        self.ctx.report(Report(a.job_id, "running", started_at=self.started_at, log=sink))
        reader = threading.Thread(
            target=self._read, args=(r, sink), daemon=True, name=f"rc-job-{a.job_id}-out"
        )
        self._reader_stop = False
        reader.start()
        outcome, why, survivors = self.watch(group, hold)
        if self.ending is None:
            self.ending = f"hold {a.job_id} ended" if hold else (why or "ended")
        stragglers = 0
        if why is None:
            stragglers, left = supervise.reap_stragglers(group)
            survivors = survivors or left
        self.sweep_escapees()  # before draining: an escapee may hold the pipe open
        reader.join(READER_DRAIN_S)
        if reader.is_alive():
            self._reader_stop = True
            reader.join(1.0)
        os.close(r)
        # a short rest of the output goes with the terminal report (its log
        # tail), unless the worker is stopping (rc.worker.reporter)
        stopping = self.ctx.stopping()
        if not sink.close(LOG_FLUSH_SHUTDOWN_S if stopping else LOG_FLUSH_S, not stopping):
            log.error("job %d: %d log bytes could not be delivered", a.job_id, sink.lost)
        result = label(outcome, why, stragglers, hold)
        result.survivors = [p.pid for p in survivors]
        return result

    def _execute_attached(self) -> Result:
        """Run a tty or pipe job on the relay (rc.worker.attached,
        rc.worker.terminal); the Result, with the pids of its group that
        survived (for the teardown checks that come next)."""
        a = self.a
        ctx = self.ctx
        tty = a.stdio is Stdio.TTY
        user = self.account
        assert user is not None  # resolved first (_lifecycle)
        env = job_env(self.clean_env(), a.env, a.job_id, self.device_ids, self.cuda, ctx.markers)
        try:
            cwd, note = working_dir(a.cwd, ctx.cfg.host, user)
        except account.CannotRunAs as e:
            return Result(JobState.FAILED, None, f"cannot start: {e}")
        procs: list[Process] = []

        def hung_up(reason: str) -> None:
            if procs:
                procs[0].hangup()
            self.cancel(f"{'terminal hung up' if tty else 'pipe closed'}: {reason}")

        try:
            halves = Halves.connect(
                ctx.client, calls.JOB_RELAY.at(a.job_id), hung_up, self.cancelled, self.clock
            )
        except RcError as e:
            return Result(JobState.FAILED, None, f"cannot attach to the relay: {e}")

        def on_output(sending: bool) -> None:
            self.last_output = self.clock.monotonic()
            self.in_write = sending

        sink = None
        if tty:
            proc: Process = Terminal(halves, on_output, None)
            env.setdefault("TERM", "xterm")
            argv = list(a.command) or login_shell(user)
        else:
            sink = open_job_log(ctx, a)
            proc = Pipes(halves, on_output, sink.write)
            argv = list(a.command)
        self.cgroup = ctx.tracker.create(f"job-{a.job_id}")
        try:
            proc.start(argv, env, cwd, note, user, self.cgroup)
        except OSError as e:
            proc.finish()
            if sink is not None:
                sink.write(cannot_start_line(argv[0], e))
                sink.close(LOG_FLUSH_S)
            return cannot_start(e)
        procs.append(proc)
        ctx.report(Report(a.job_id, "running", started_at=self.started_at))
        if tty:  # a cancelled terminal is hung up first: an interactive shell ignores SIGTERM
            threading.Thread(target=self._hangup_on_cancel, args=(proc,), daemon=True).start()
        outcome, why, survivors = self.watch(proc.group, False)
        stragglers, left = proc.leftovers(ctx.cfg.kill_grace) if why is None else (0, [])
        self.sweep_escapees()  # before draining: an escapee may hold the output open
        proc.drain(TTY_DRAIN_S if tty else READER_DRAIN_S)
        if tty:
            left += end_terminal_session(proc.group.pgid, ctx.cfg.kill_grace)
        proc.finish()
        if sink is not None and not sink.close(LOG_FLUSH_S):
            log.error("job %d: %d stderr bytes could not be stored", a.job_id, sink.lost)
        result = label(outcome, why, stragglers, False)
        if halves.hung_up and why is None and outcome is not None and outcome.signal:
            result = Result(JobState.KILLED, result.exit_code, self.cancel_reason or result.reason)
        result.survivors = [p.pid for p in survivors] + left
        return result

    def clean_env(self) -> dict[str, str]:
        """The base of this job's environment (launch.clean_env): its user's
        HOME, USER, LOGNAME, SHELL, the job PATH, and what the worker passes."""
        assert self.account is not None
        cfg = self.ctx.cfg
        return clean_env(self.account, os.environ, cfg.job_path, cfg.pass_env)

    def _hangup_on_cancel(self, proc: Process) -> None:
        while not proc.stop.is_set():
            if self.cancelled.wait(0.1):
                proc.hangup()
                return

    def set_runtime(self, seconds: int) -> None:
        """A new max runtime (a hold's ttl after rc extend), in seconds: the
        watchdog applies it from its next turn (the ceiling still bounds it)."""
        if seconds >= 0 and seconds != self.a.max_runtime_seconds:
            self.a = dataclasses.replace(self.a, max_runtime_seconds=seconds)

    def limits(self, hold: bool) -> watchdog.Limits:
        """This job's watchdog limits (the lowest ceiling of its devices applied)."""
        ceilings = [c.max_runtime for c in self.configs if c is not None and c.max_runtime]
        return watchdog.Limits.of(self.a, min(ceilings, default=0), hold)

    def watch(self, group: supervise.Group, hold: bool):
        """Wait for the group's leader under the watchdog and cancellation,
        reading the clock once per turn (every WATCHDOG_TICK_S, or at once on
        cancel()); returns (outcome, why we ended it or None, survivors)."""
        limits = self.limits(hold)
        started = self.clock.monotonic()
        while True:
            outcome = group.wait(WATCHDOG_TICK_S, self._wake_r)
            self.note_pids()
            if outcome is not None:
                return outcome, None, []
            now = self.clock.monotonic()
            fired = None
            limits = self.limits(hold)  # rc extend may have raised a hold's ttl
            if self.cancelled.is_set():
                why = self.cancel_reason or "cancelled"
            else:
                last_output = now if self.in_write else self.last_output
                fired = watchdog.due(limits, started, last_output, now)
                if fired is None:
                    continue
                why = watchdog.reason(fired, limits)
            outcome = group.wait(0)  # it may have just exited on its own
            if outcome is not None:
                return outcome, None, []
            self.ending = self._hold_ending(why, fired, limits) if hold else why
            outcome, survivors = supervise.kill_group(group, self.ctx.cfg.kill_grace)
            return outcome, why, survivors

    def _hold_ending(self, why: str, fired: watchdog.Fired | None, limits: watchdog.Limits) -> str:
        """What the sessions of a hold ended for `why` report."""
        if fired is watchdog.Fired.MAX_RUNTIME:  # its ttl
            return f"hold {self.job_id} expired (ttl {format_duration(limits.max_runtime)})"
        detail = "" if why == "cancelled" else f": {why}"
        return f"hold {self.job_id} ended{detail}"

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
            self.last_output = self.clock.monotonic()
            self.in_write = True  # a write blocked by us is not the job being idle
            try:
                sink.write(data)
            finally:
                # in this order: a watchdog turn between the two never sees
                # the time from before a long blocked write
                self.last_output = self.clock.monotonic()
                self.in_write = False
