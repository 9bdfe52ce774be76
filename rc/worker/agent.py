"""The worker's main loop: register, heartbeat, long-poll, run.

Threads: the main thread waits for a signal; the poll thread runs the startup
release pass (every device's on_release, rc.worker.hooks) and then long-polls
for assignments and kills; the heartbeat thread names the jobs this worker
supervises every `heartbeat_interval`; the probe thread re-probes every
`probe_interval` and pushes labels and usage sheets (POST
/v1/workers/{id}/labels, never a re-registration); the reporter sends faults
and status reports; one thread per job (rc.worker.job). The worker only dials
out.

A job id is never started twice by one worker process. A job's lingering
release is armed once its terminal report is settled. SIGTERM/SIGINT: stop
polling and start nothing more, end running jobs (their terminal reports go
out), wait for the reports (45 s at most), leave (POST
/v1/workers/{id}/leave: the jobs assigned to this worker that it never
started go back to the queue, rc.controller.fleet.leave), fire pending
releases (20 s at most), exit 0.
"""

from __future__ import annotations

import logging
import os
import random
import threading
import time
import uuid

from rc import __version__
from rc.proto.client import Client
from rc.proto.codec import decode, encode
from rc.proto.errors import ApiError, TransportError
from rc.proto.model import JobState, RecoveryProof
from rc.proto.wire import (
    WORKER_PROTOCOL,
    Assignment,
    Assignments,
    DeviceDecl,
    LabelsRequest,
    LeaveRequest,
    LeaveResponse,
    RecheckRequest,
    RecheckResponse,
    RegisterRequest,
    ScanRequest,
    ScanResult,
)
from rc.worker import account, cgroups, health, recovery, sessions, sheets, survivors, usage
from rc.worker.clock import SYSTEM, Clock
from rc.worker.config import DeviceConfig, WorkerConfig
from rc.worker.hooks import Leases
from rc.worker.job import JobContext, JobRun, Result
from rc.worker.labels import Prober, ProbeResult
from rc.worker.logsink import LogSink
from rc.worker.probe import cuda_index
from rc.worker.reporter import Report, Reporter
from rc.worker.runs import Runs
from rc.worker.spool import Spool

__all__ = ["Agent"]

log = logging.getLogger("rc.worker")

RETRY_MIN_S = 1.0
RETRY_MAX_S = 30.0
POLL_FLOOR_S = 0.25
SHUTDOWN_GRACE_S = 45.0
LEAVE_TIMEOUT_S = 10.0
"""The most a stopping worker waits to hand back the jobs it never started."""
POLL_RETRY_MAX_S = 5.0
"""A failed long poll is retried within this, so work resumes soon after a
controller restart."""
REREGISTER_RETRY_S = 60.0
SINCE_SLACK_S = 5.0
"""An Xid logged this long before a job's recorded start still counts as
hitting it (the kernel's clock and the job's start differ a little)."""
PERMANENT_REFUSALS = frozenset({400, 403, 413})
"""Registration answers that end the worker (exit 1) instead of being retried
(see Agent.register)."""


class _Episode:
    """Logs a failure once per episode of consecutive failures."""

    def __init__(self, what: str) -> None:
        self.what = what
        self.failing = False

    def fail(self, err: Exception) -> None:
        if not self.failing:
            log.warning("%s: %s (retrying quietly)", self.what, err)
            self.failing = True

    def ok(self) -> None:
        if self.failing:
            log.info("%s: working again", self.what)
            self.failing = False


def _runs_jobs_as(req: RegisterRequest) -> str:
    """Whom this worker runs jobs as, in words for its log."""
    if req.shared_account:
        return f"runs every job as {req.run_as} (shared_account)"
    if req.run_as:
        return f"runs jobs as {req.run_as} only (not root: a single-user worker)"
    root = "root's too" if req.allow_root_jobs else "never root's (allow_root_jobs is off)"
    return f"runs each job as its own Unix user ({root})"


def _explain_refusal(e: ApiError) -> str:
    """A registration refusal in words; a controller from before the worker
    protocol (it refuses the field) is named as such."""
    text = str(e)
    if e.status == 400 and "protocol" in text and "not a known field" in text:
        return (
            f"{text} (the controller is older than this worker, rc {__version__}, and does "
            f"not speak worker protocol {WORKER_PROTOCOL}: run the same rc version on both)"
        )
    return text


def _tail_bytes(resp: dict) -> int:
    """The log-tail bytes per report a registration reply says its
    controller takes (RegisterResponse.log_tail_bytes; 0 when it says
    nothing: a controller from before tails)."""
    n = resp.get("log_tail_bytes")
    return n if isinstance(n, int) and not isinstance(n, bool) and n > 0 else 0


class Agent:
    """One worker process: `run()` returns the exit code.

    `clock` (default: the real one) is the time of every timer of the worker:
    its loops, its job runs, hooks, reporter and log sinks (rc.worker.clock).
    """

    def __init__(self, cfg: WorkerConfig, client: Client, clock: Clock = SYSTEM) -> None:
        self.cfg = cfg
        self.client = client
        self.clock = clock
        self.worker_id = cfg.host
        self.stop_event = threading.Event()
        self._beat_now = threading.Event()
        """Set to send a heartbeat at once (a new controller instance; a stop)."""
        self.stopping = False
        self.runs = Runs()
        """The jobs of this process (rc.worker.runs): what its leave claims
        it may have started, once closed."""
        self.left = False
        self._lock = threading.Lock()
        self._leaving = threading.Lock()  # a heartbeat never overtakes the leave
        self.devices: dict[str, DeviceConfig] = {}
        self.heartbeat_interval = cfg.heartbeat_interval
        self.instance = ""
        self.reregister = False
        self.reregister_at: float | None = None
        self._last_contact = 0.0
        self.ready_fd: int | None = None
        self.refused = False
        self._reregistering = threading.Lock()
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
        self._probe_lock = threading.Lock()
        self._health_due: health.Pass | None = None
        self.usage = usage.Sampler({b"RC_WORKER_INSTANCE": self.instance_id.encode()})
        """Whether each running hold was used between heartbeats (the idle rule)."""
        self.leases = Leases(cfg, clock)
        self.spool = Spool(cfg.spool_dir, cfg.spool_max_bytes)
        self._scans_seen: set[tuple[str, int]] = set()
        self.recheck_due = False
        """Devices of this worker may be out with survivors (its registration
        proof proved nothing, or a teardown left survivors): rescan every
        recheck_interval (rc.worker.survivors) until a clean scan returned them."""
        self.job_context = JobContext(
            cfg=cfg,
            clock=clock,
            client=client,
            markers=self.markers,
            report=self.reporter.submit,
            fault=self._job_fault,
            open_log=self._open_log,
            hooks=self.leases.device,
            gpu_uuid=self.gpu_uuid,
            stopping=lambda: self.stopping,
            finished=self.finished,
            tracker=self.tracker,
        )
        """What this worker's job runs see of it."""

    # -- registration -----------------------------------------------------

    def _probe(
        self, devices: list[DeviceConfig] | None
    ) -> tuple[ProbeResult, str | None, dict[str, str]]:
        """One probe pass plus the usage sheets."""
        with self._probe_lock:
            res = self.prober.run(devices)
        host_sheet, device_sheets = sheets.read_sheets(
            self.cfg.sheet_dir, [d.name for d in res.devices]
        )
        return res, host_sheet, device_sheets

    def _declared(self, configs: list[DeviceConfig]) -> dict[str, dict[str, str]]:
        """Declared labels, always sent verbatim (so removing one clears it)."""
        declared = {"": dict(self.cfg.labels)}
        for d in configs:
            declared[d.name] = dict(d.labels)
        return declared

    def _registration(self) -> RegisterRequest:
        res, host_sheet, device_sheets = self._probe(None)
        self._health_due = res.health  # acted on once the controller knows the devices
        configs = res.devices
        self.devices = {d.name: d for d in configs}
        self.leases.configure(configs)
        idle = self.runs.idle()
        proof = (
            recovery.recovery_proof(self.cfg.require_manual_clear, self.cfg.host) if idle else None
        )
        if idle:  # the cgroups of jobs of an earlier worker process of this host
            left = survivors.scan(self.tracker, self.cfg.host, every_job=True)
            for cg in left.groups:
                if not cg.live_pids():
                    cg.remove()
            if left.found and proof is not None and proof.survivors_checked:
                # an untagged process (env -i) of such a job is still in its cgroup
                proof = RecoveryProof(survivors_checked=True, survivors_found=True)
        self.recheck_due = proof is None or not proof.proves()
        run_as, shared, allow_root = account.registration(
            self.cfg.shared_account, self.cfg.allow_root_jobs
        )
        return RegisterRequest(
            host=self.cfg.host,
            devices=tuple(DeviceDecl(d.name, int(d.max_runtime)) for d in configs),
            boot_id=recovery.boot_id(),
            recovery=proof or RecoveryProof(),
            labels=res.labels,
            declared_labels=self._declared(configs),
            sheet=host_sheet,
            device_sheets=device_sheets,
            version=__version__,
            instance=self.instance_id,
            running_job_ids=tuple(self.runs.named()),
            links=res.links,
            run_as=run_as,
            shared_account=shared,
            allow_root_jobs=allow_root,
            protocol=WORKER_PROTOCOL,
        )

    def push_labels(self) -> bool:
        """Re-probe and send labels and sheets (never re-registers). True when
        the controller took them."""
        configs = list(self.devices.values())
        res, host_sheet, device_sheets = self._probe(configs)
        req = LabelsRequest(
            host=self.cfg.host,
            devices=tuple(d.name for d in configs),
            labels=res.labels,
            declared_labels=self._declared(configs),
            sheet=host_sheet,
            device_sheets=device_sheets,
            links=res.links,
        )
        try:
            self.client.post(f"/v1/workers/{self.worker_id}/labels", encode(req))
        except ApiError as e:
            log.warning("labels push refused: %s", e)
            if e.status == 404:
                self.reregister = True
            return False
        except TransportError as e:
            log.warning("labels push failed: %s", e)
            return False
        finally:
            self._act_on_health(res.health)
        return True

    def _act_on_health(self, checked: health.Pass | None, job_id: int | None = None) -> None:
        """Send the faults (quarantine as `fault`) and drains a health pass
        found (rc.worker.health), and the faults still standing (quietly),
        through the reporter: queued and retried,
        and before any later job report; `job_id` names the job that ended
        when they were found (in the event)."""
        if checked is None:
            return
        for f in checked.actions:
            device_id = f"{self.cfg.host}:{f.device}"
            if f.action == "fault":
                self.reporter.submit_fault(device_id, f.reason(device_id), job_id)
            elif f.action == "drain":
                self.reporter.submit_fault(device_id, f.reason(device_id), job_id, drain=True)
        for f in checked.standing:  # a fault still there: again, for a device cleared meanwhile
            device_id = f"{self.cfg.host}:{f.device}"
            self.reporter.submit_fault(device_id, f.reason(device_id), job_id, quiet=True)

    def gpu_uuid(self, device_name: str) -> str:
        """The UUID of a device's GPU, as nvidia-smi last listed it ("" if never)."""
        return self.prober.uuids.get(device_name, "")

    def _open_log(self, job_id: int) -> LogSink:
        """Where job `job_id`'s output goes: the controller, through the spool."""
        return LogSink(
            self.client,
            job_id,
            spool=self.spool,
            clock=self.clock,
            tail_limit=lambda: self.reporter.tail_bytes,
        )

    def _register_once(self) -> bool:
        """One registration attempt; True when the controller took it."""
        try:
            resp = self.client.post("/v1/workers/register", encode(self._registration()))
        except (ApiError, TransportError) as e:
            log.warning("re-registration failed: %s", e)
            return False
        self.instance = resp["instance"]
        self.reporter.tail_bytes = _tail_bytes(resp)
        log.info("registered %s again", self.cfg.host)
        self._act_on_health(self._health_due)
        self._health_due = None
        return True

    def register(self) -> bool:
        """Register until it works, the worker is told to stop, or the
        controller refuses this registration for good (`self.refused` set).

        Refused for good (`PERMANENT_REFUSALS`): 400 (a request the controller
        will never take, e.g. limit_exceeded: too many devices), 403 (the
        token is for another host, or not a worker token) and 413 (a usage
        sheet too large): retrying the same request cannot help, so the
        refusal is logged once and the worker exits 1 (its service manager
        may start it again after the operator fixed it). Not 401: an unknown
        token may be one an admin is (re-)creating right now, so it is logged
        and retried like 5xx answers and transport errors, quietly after the
        first failure of each episode."""
        episode = _Episode(f"cannot register with {self.client.url}")
        delay = RETRY_MIN_S
        while not self.stop_event.is_set():
            try:
                req = self._registration()
                resp = self.client.post("/v1/workers/register", encode(req))
                self.instance = resp["instance"]
                self.reporter.tail_bytes = _tail_bytes(resp)
                self.heartbeat_interval = float(
                    resp.get("heartbeat_seconds") or self.cfg.heartbeat_interval
                )
                episode.ok()
                log.info(
                    "registered %s with %s: %s; %s",
                    self.cfg.host,
                    self.client.url,
                    ", ".join(self.devices) or "no devices",
                    _runs_jobs_as(req),
                )
                self._announce_ready()
                self._act_on_health(self._health_due)
                self._health_due = None
                return True
            except ApiError as e:
                if e.status in PERMANENT_REFUSALS:
                    log.error(
                        "the controller %s refused to register %s (HTTP %d): %s; not retrying",
                        self.client.url,
                        self.cfg.host,
                        e.status,
                        _explain_refusal(e),
                    )
                    self.refused = True
                    return False
                episode.fail(e)
            except TransportError as e:
                episode.fail(e)
            self.clock.wait(self.stop_event, delay)
            delay = min(delay * 2, RETRY_MAX_S)
        return False

    def _announce_ready(self) -> None:
        """Tell whoever started this worker (rc up, through --ready-fd) that it
        registered; once."""
        fd, self.ready_fd = self.ready_fd, None
        if fd is not None:
            try:
                os.write(fd, b"registered\n")
                os.close(fd)
            except OSError:
                pass

    # -- loops ------------------------------------------------------------

    def run(self) -> int:
        """Register, start the loops, wait for a stop; the exit code (0; 1 when
        the controller refused the registration for good)."""
        if not self.register():
            self.tracker.close()
            return 1 if self.refused else 0
        threading.Thread(target=self._heartbeat_loop, name="rc-heartbeat", daemon=True).start()
        threading.Thread(target=self._probe_loop, name="rc-probe", daemon=True).start()
        threading.Thread(target=self._recheck_loop, name="rc-recheck", daemon=True).start()
        threading.Thread(target=self._poll_loop, name="rc-poll", daemon=True).start()
        while not self.stop_event.wait(1.0):  # a tick: signal handlers run between waits
            pass
        return self._shutdown()

    def _probe_loop(self) -> None:
        while not self.clock.wait(self.stop_event, self.cfg.probe_interval):
            try:
                self.push_labels()
            except Exception:  # a probe bug must not end the loop
                log.exception("probe pass failed")

    def stop(self) -> None:
        """Ask the worker to shut down (signal handlers call this)."""
        self.stopping = True
        self.stop_event.set()
        self._beat_now.set()  # the heartbeat loop waits on this, not on stop_event

    def _heartbeat_loop(self) -> None:
        """A heartbeat every heartbeat_interval, and at once when a response
        came from a new controller instance (a restart or a failover: the new
        one keeps this worker's devices `unknown` until it hears one)."""
        episode = _Episode("heartbeat failed")
        self.client.on_new_instance = lambda _instance: self._beat_now.set()
        while True:
            self.clock.wait(self._beat_now, self.heartbeat_interval)
            if self.stop_event.is_set():
                return
            self._beat_now.clear()
            self.heartbeat_once(episode)

    def heartbeat_once(self, episode: _Episode | None = None) -> None:
        """One heartbeat naming the jobs this worker supervises; stops the
        ones the controller says have ended. None once the worker has left
        (a heartbeat would bring its devices back into the pool)."""
        holds = self.runs.holds()
        use = [encode(u) for u in self.usage.sample(holds, self.clock.monotonic())]
        with self._leaving:
            if self.left:
                return
            named = self.runs.named()
            runs = self.runs.running()  # a stop names these runs, not a later one
            try:
                resp = self.client.post(
                    f"/v1/workers/{self.worker_id}/heartbeat",
                    {"running_job_ids": named, "hold_use": use},
                )
            except (ApiError, TransportError) as e:
                err = e
            else:
                err = None
        if err is not None:
            self._heartbeat_failed(err, episode)
            return
        if episode:
            episode.ok()
        self._note_instance(resp.get("instance", ""))
        for job_id in resp.get("stop_job_ids", []):
            # a run that started after the heartbeat went (a job the hardware
            # requeued, run again here) is not the one the controller ended
            if job_id in runs:
                self.runs.cancel(job_id, "the controller ended this job", runs[job_id])
        for key, ttl in (resp.get("hold_ttls") or {}).items():
            run = self.runs.get(int(key))
            if run is not None and isinstance(ttl, int):
                run.set_runtime(ttl)
        self._maybe_reregister()  # the poll loop may sit in a long poll

    def _heartbeat_failed(self, e: Exception, episode: _Episode | None) -> None:
        if isinstance(e, ApiError) and e.status == 404:
            log.warning("the controller does not know this worker; registering again")
            self.reregister = True
        elif episode:
            episode.fail(e)

    def _note_instance(self, instance: str) -> None:
        """After any response: arm a re-registration when the controller
        restarted (a new instance id; a missing header never counts) or when
        contact resumed after `reregister_after` of silence,
        so that the worker can present its recovery proof."""
        last = self.client.last_response
        with self._lock:
            seen, self._last_contact = self._last_contact, last
        if instance and self.instance and instance != self.instance:
            log.info("the controller restarted (instance %s)", instance[:8])
            self.instance = instance
            self._arm()
        elif seen and last - seen >= self.cfg.reregister_after:
            log.info("contact with the controller resumed after %.0fs of silence", last - seen)
            self._arm()

    def _arm(self, delay: float | None = None) -> None:
        """Owe a re-registration, due after `delay` (default: a random jitter
        in [0, reregister_jitter) so a fleet does not stampede)."""
        if delay is None:
            delay = random.uniform(0, self.cfg.reregister_jitter)
        with self._lock:
            if self.reregister_at is None:
                self.reregister_at = self.clock.monotonic() + delay

    def _poll_loop(self) -> None:
        self.leases.startup_release_pass()
        episode = _Episode(f"cannot reach {self.client.url}")
        delay = RETRY_MIN_S
        path = f"/v1/workers/{self.worker_id}/assignments"
        while not self.stop_event.is_set():
            self._maybe_reregister()
            t0 = self.clock.monotonic()
            try:
                resp = self.client.request(
                    "GET",
                    path,
                    params={"wait": f"{self.cfg.poll_wait:g}s"},
                    timeout=self.cfg.poll_wait + 15,
                )
            except (TransportError, ApiError) as e:
                episode.fail(e)
                if isinstance(e, ApiError) and e.status == 404:
                    self.reregister = True
                self.clock.wait(self.stop_event, delay)
                delay = min(delay * 2, POLL_RETRY_MAX_S)
                continue
            episode.ok()
            delay = RETRY_MIN_S
            instance = self.client.instance  # of the controller that answered
            self._note_instance(instance)
            if resp.status == 200 and not self.stop_event.is_set():
                got = decode(Assignments, resp.json())
                self._dispatch(got, instance)
                if got.assignments or got.kills or got.sessions:
                    continue  # work came: poll again at once (the floor is for empty answers)
            if self.clock.monotonic() - t0 < POLL_FLOOR_S:
                self.clock.wait(self.stop_event, POLL_FLOOR_S)

    def _maybe_reregister(self) -> None:
        """Pay a re-registration debt once due. A controller that does not know
        this worker (404) is answered at once, busy or not (the same process
        keeps its jobs); otherwise only while the worker supervises nothing,
        so that it computes and presents a recovery proof. A failed attempt is
        retried no sooner than REREGISTER_RETRY_S."""
        if not self._reregistering.acquire(blocking=False):
            return  # the other loop is doing it
        try:
            self._reregister_if_due()
        finally:
            self._reregistering.release()

    def _reregister_if_due(self) -> None:
        if self.runs.closed:
            return  # a worker shutting down leaves; registering would undo that
        urgent = self.reregister
        now = self.clock.monotonic()
        busy = self.runs.busy()
        with self._lock:
            due = urgent or (self.reregister_at is not None and now >= self.reregister_at)
        if not due or (busy and not urgent):
            return
        self.reregister = False
        with self._lock:
            self.reregister_at = None
        if not self._register_once():
            with self._lock:
                self.reregister_at = now + REREGISTER_RETRY_S

    def _dispatch(self, got: Assignments, instance: str = "") -> None:
        """Act on one long poll's answer from controller `instance` (its id:
        session and scan ids are numbered per controller run, so a restarted
        controller's ids are new ones, though the same numbers)."""
        kills = set(got.kills)
        for job_id in kills:
            self.runs.cancel(job_id, "")
        if kills:
            self.runs.note_kills(kills)
        if got.sessions and not self.runs.closed:  # sessions inside holds (rc shell / exec / cp)
            sessions.dispatch_sessions(self, got.sessions, instance)
        for req in got.scans:  # survivor scans (rc clear, rc kill of a lost job)
            if (instance, req.scan_id) not in self._scans_seen:
                if len(self._scans_seen) >= 1024:  # each is handed out once anyway
                    self._scans_seen.clear()
                self._scans_seen.add((instance, req.scan_id))
                threading.Thread(
                    target=self._answer_scan, args=(req,), name="rc-scan", daemon=True
                ).start()
        for a in got.assignments:
            admitted, run = self.runs.admit(a, kills, lambda a=a: self._new_run(a))
            if not admitted:
                continue
            if run is None:
                self.reporter.submit(
                    Report(a.job_id, "killed", None, "killed before this worker started it")
                )
            else:
                run.start()

    def _new_run(self, a: Assignment) -> JobRun:
        """A run of assignment `a` on this worker's devices (not started)."""
        return JobRun(
            self.job_context, a, [self.devices.get(d.rpartition(":")[2]) for d in a.devices]
        )

    def _carried_assignments(self, items: list) -> None:
        """Start the assignments a report reply carried (rc.worker.reporter),
        as a long poll's: a job id and restart count already started here is
        skipped."""
        got = decode(Assignments, {"assignments": items})
        if got.assignments and not self.stop_event.is_set():
            self._dispatch(got)

    def survivor_scan(
        self, device_ids=(), job_ids=(), kill: bool = False
    ) -> tuple[survivors.Scan, tuple]:
        """A fresh survivor scan (rc.worker.survivors) of `device_ids` and
        `job_ids`, skipping this process's running jobs; with `kill`, end
        what it finds and scan again. Returns (the last scan, the survivors
        the kill ended). Empty cgroups it looked in are removed."""
        running = set(self.runs.running())

        def look() -> survivors.Scan:
            return survivors.scan(
                self.tracker, self.cfg.host, device_ids, job_ids, running, self.gpu_uuid
            )

        found = look()
        ended: tuple = ()
        if kill and found.found:
            before = found.survivors
            survivors.end(found, self.cfg.kill_grace)
            found = look()
            ended = tuple(s for s in before if s.pid not in found.found)
        for cg in found.groups:
            if not cg.live_pids():
                cg.remove()
        return found, ended

    def _health_now(self, req: ScanRequest) -> dict[str, str]:
        """The scanned GPU devices' health, read afresh (rc.worker.health
        Monitor.check): what rc clear of a health fault needs to see clean."""
        mine = f"{self.cfg.host}:"
        gpus = {
            d[len(mine) :]: int(cuda_index(d[len(mine) :]) or -1)
            for d in req.device_ids
            if d.startswith(mine) and cuda_index(d[len(mine) :]) is not None
        }
        if not gpus:
            return {}
        with self._probe_lock:
            got = self.prober.health.check(gpus)
        return {mine + n: v for n, v in got.items()}

    def _answer_scan(self, req: ScanRequest) -> None:
        try:
            found, ended = self.survivor_scan(req.device_ids, req.job_ids, req.kill)
            result = ScanResult(
                found.survivors, ended, found.complete, health=self._health_now(req)
            )
        except Exception as e:  # a bug must still answer
            log.exception("survivor scan %d failed", req.scan_id)
            result = ScanResult(complete=False, error=f"worker error: {e}")
        try:
            self.client.post(f"/v1/workers/{self.worker_id}/scans/{req.scan_id}", encode(result))
        except (ApiError, TransportError) as e:
            log.warning("could not answer survivor scan %d: %s", req.scan_id, e)

    # -- job completion -----------------------------------------------------

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
                hardware_device_ids=tuple(f"{self.cfg.host}:{n}" for n in note.faulty),
                log=run.sink,
            )
        )

    def _xid_note(self, run: JobRun) -> health.JobNote:
        """Read the kernel log now: act on new Xid faults and drains (before
        the job's report, naming the job), and say which Xids hit the job's
        GPUs since it started (rc.worker.health.job_note; an empty JobNote
        for none).
        Kernel times are seconds since boot: the job's start is mapped onto
        them through the monotonic clock, with SINCE_SLACK_S of slack."""
        if not any(cuda_index(n) is not None for n in run.device_names):
            return health.JobNote()
        with self._probe_lock:
            new = self.prober.health.poll_xids()
            recent = list(self.prober.health.recent)
        self._act_on_health(
            health.Pass(actions=[f for f in new if f.action in ("fault", "drain")]), run.job_id
        )
        started = run.started_at if run.started_at is not None else time.time()
        since = time.monotonic() - (time.time() - started) - SINCE_SLACK_S
        return health.job_note(recent, self.cfg.host, run.device_names, since)

    def _report_done(self, job_id: int, accepted: bool) -> None:
        run = self.runs.settled(job_id, accepted)
        if run is not None:
            for name, epoch in run.release_epochs.items():
                hooks = self.leases.device(name)
                if hooks is not None:
                    hooks.arm_release(epoch, run.hook_context)

    def leave(self, timeout: float) -> bool:
        """Tell the controller this process stops (POST /v1/workers/{id}/leave):
        it starts nothing more (its Runs must be closed), and it may have
        started only the jobs its Runs name unsettled, so every other job assigned to it goes
        back to the queue in its old place (rc.controller.fleet.leave). After
        it no heartbeat is sent. Best effort within `timeout` seconds: when
        it does not get through, those jobs stay assigned and the next
        registration reconciles them (silence proves nothing). True when the
        controller took it."""
        deadline = self.clock.monotonic() + timeout
        # No heartbeat and no re-registration may land after the leave: either
        # would bring this worker's devices back into the pool.
        if not self._leaving.acquire(timeout=timeout):
            log.warning("could not hand back the jobs assigned here: a heartbeat is stuck")
            return False
        try:
            self.left = True
            left = max(0.0, deadline - self.clock.monotonic())
            if not self._reregistering.acquire(timeout=left):
                log.warning("could not hand back the jobs assigned here: a registration is stuck")
                return False
            try:
                req = LeaveRequest(self.instance_id, self.runs.unsettled())
                resp = self.client.post(
                    f"/v1/workers/{self.worker_id}/leave",
                    encode(req),
                    timeout=max(1.0, deadline - self.clock.monotonic()),
                )
            except (ApiError, TransportError) as e:
                log.warning("could not hand back the jobs assigned here that never started: %s", e)
                return False
            finally:
                self._reregistering.release()
        finally:
            self._leaving.release()
        got = decode(LeaveResponse, resp)
        if got.requeued_job_ids:
            log.info(
                "handed back %d assigned job(s) that never started here, to the queue: %s",
                len(got.requeued_job_ids),
                ", ".join(map(str, got.requeued_job_ids)),
            )
        if got.killed_job_ids:
            log.info(
                "assigned job(s) killed before they started here: %s",
                ", ".join(map(str, got.killed_job_ids)),
            )
        return True

    def _job_fault(self, device_id: str, reason: str, job_id: int | None) -> None:
        """A job run quarantines a device; survivors of its teardown arm the re-check."""
        if reason.startswith(("processes of job ", "GPU ")):
            self.recheck_due = True
        self.reporter.submit_fault(device_id, reason, job_id)

    def recheck_once(self) -> list[str]:
        """One periodic re-check: a survivor scan of every job of this host
        not running here; when it is complete and finds nothing, present the
        proof (POST /v1/workers/{id}/recheck). Returns the devices it
        returned to the pool."""
        running, busy = self.runs.in_use()
        idle = [f"{self.cfg.host}:{n}" for n in self.devices]
        found = survivors.scan(
            self.tracker,
            self.cfg.host,
            [d for d in idle if d not in busy],  # their GPUs: no compute process may remain
            running=running,
            gpu_uuid=self.gpu_uuid,
            every_job=True,
        )
        if found.found or not found.complete or self.cfg.require_manual_clear:
            return []
        for cg in found.groups:
            if not cg.live_pids():
                cg.remove()
        proof = RecoveryProof(survivors_checked=True, survivors_found=False)
        try:
            resp = self.client.post(
                f"/v1/workers/{self.worker_id}/recheck", encode(RecheckRequest(proof))
            )
        except (ApiError, TransportError) as e:
            log.warning("re-check not delivered: %s", e)
            return []
        self.recheck_due = False
        back = list(decode(RecheckResponse, resp).recovered)
        if back:
            log.info("a clean survivor scan returned %s", ", ".join(back))
        return back

    def _recheck_loop(self) -> None:
        while not self.clock.wait(self.stop_event, self.cfg.recheck_interval):
            if self.recheck_due:
                try:
                    self.recheck_once()
                except Exception:  # a bug must not end the loop
                    log.exception("re-check failed")

    def fault(self, device_id: str, reason: str, job_id: int | None) -> None:
        """Quarantine a device (`fault`): queued, retried, and sent before any
        later report (rc.worker.reporter)."""
        self.reporter.submit_fault(device_id, reason, job_id)

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
        self.leave(max(1.0, min(LEAVE_TIMEOUT_S, deadline - self.clock.monotonic())))
        self.reporter.stop()
        self.leases.drain()
        self.spool.close()
        self.tracker.close()
        log.info("worker stopped")
        return 0
