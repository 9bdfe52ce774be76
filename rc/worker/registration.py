"""Registration: how a worker process dials out to its controller and stays
known to it. The worker only dials out.

- register (POST /v1/workers/register): a probe pass (labels, sheets,
  topology, health), the devices, the recovery proof when nothing runs here
  (rc.worker.recovery, and the cgroups of an earlier worker process of this
  host: rc.worker.survivors), whom it runs jobs as; retried until it works,
  the worker stops, or the controller refuses it for good
  (PERMANENT_REFUSALS: the worker exits 1);
- the probe loop: every `probe_interval` a probe pass whose labels and
  sheets go to POST /v1/workers/{id}/labels (never a re-registration);
- the heartbeat loop: every `heartbeat_interval` (and at once when a
  response came from a new controller instance) a heartbeat naming the jobs
  this worker supervises and its holds' use; it stops the runs the
  controller says have ended and sets the holds' runtimes;
- the long poll (GET /v1/workers/{id}/assignments), after the startup
  release pass (every device's on_release, rc.worker.hooks): each answer
  goes to the dispatch (rc.worker.dispatch);
- re-registration: a controller that does not know this worker (404) is
  registered with again at once; a restarted controller (a new instance id)
  or contact resumed after `reregister_after` of silence arms one, paid
  after a jitter once nothing runs here, so the worker presents a recovery
  proof;
- the leave (POST /v1/workers/{id}/leave) of a stopping worker, after which
  no heartbeat and no registration goes out.

A loop's failures are logged once per episode (the first failure, and when
it works again).
"""

from __future__ import annotations

import logging
import os
import random
import threading
from collections.abc import Callable

from rc import __version__
from rc.proto import calls
from rc.proto.client import Client
from rc.proto.codec import decode
from rc.proto.errors import ApiError, TransportError
from rc.proto.model import RecoveryProof
from rc.proto.wire import (
    WORKER_PROTOCOL,
    Assignments,
    DeviceDecl,
    HeartbeatRequest,
    LabelsRequest,
    LeaveRequest,
    LeaveResponse,
    RegisterRequest,
)
from rc.worker import account, cgroups, health, recovery, sheets, survivors, usage
from rc.worker.clock import Clock
from rc.worker.config import DeviceConfig, WorkerConfig
from rc.worker.hooks import Leases
from rc.worker.labels import Prober, ProbeResult
from rc.worker.recheck import Recheck
from rc.worker.reporter import Reporter
from rc.worker.runs import Runs

__all__ = ["PERMANENT_REFUSALS", "Registration"]

log = logging.getLogger("rc.worker")

RETRY_MIN_S = 1.0
RETRY_MAX_S = 30.0
POLL_FLOOR_S = 0.25
POLL_RETRY_MAX_S = 5.0
"""A failed long poll is retried within this, so work resumes soon after a
controller restart."""
REREGISTER_RETRY_S = 60.0
PERMANENT_REFUSALS = frozenset({400, 403, 413})
"""Registration answers that end the worker (exit 1) instead of being retried
(see Registration.register)."""


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


class Registration:
    """One worker process's standing with its controller; its loops run on
    threads of their own until `stop` is set.

    runs: the worker's jobs (named in registrations and heartbeats).
    reporter: where health faults go (and the log-tail size a registration
    reply names). prober: the probe passes. tracker: how jobs are tracked.
    leases: the devices' lease hooks (configured at each registration).
    recheck: made due when a registration's proof proves nothing.
    instance_id: this worker process's id (RC_WORKER_INSTANCE). stop: set
    when the worker stops. ready_fd: where to write "registered" once the
    first registration went through (rc up's --ready-fd), or None.
    """

    def __init__(
        self,
        cfg: WorkerConfig,
        client: Client,
        clock: Clock,
        runs: Runs,
        reporter: Reporter,
        prober: Prober,
        tracker: cgroups.Tracker,
        leases: Leases,
        recheck: Recheck,
        instance_id: str,
        stop: threading.Event,
        ready_fd: int | None = None,
    ) -> None:
        self.cfg = cfg
        self.client = client
        self.clock = clock
        self.runs = runs
        self.reporter = reporter
        self.prober = prober
        self.tracker = tracker
        self.leases = leases
        self.recheck = recheck
        self.instance_id = instance_id
        self.stop_event = stop
        self.worker_id = cfg.host
        self.beat_now = threading.Event()
        """Set to send a heartbeat at once (a new controller instance; a stop)."""
        self.left = False
        self._lock = threading.Lock()
        self._leaving = threading.Lock()  # a heartbeat never overtakes the leave
        self.devices: dict[str, DeviceConfig] = {}
        """The devices of the last registration, by name."""
        self.heartbeat_interval = cfg.heartbeat_interval
        self.instance = ""
        self.reregister = False
        self.reregister_at: float | None = None
        self._last_contact = 0.0
        self.ready_fd = ready_fd
        """Where to say "registered" once (rc up's --ready-fd), or None."""
        self.refused = False
        """Set when the controller refused the registration for good."""
        self._reregistering = threading.Lock()
        self._health_due: health.Pass | None = None
        self.usage = usage.Sampler({b"RC_WORKER_INSTANCE": instance_id.encode()})
        """Whether each running hold was used between heartbeats (the idle rule)."""

    # -- registering --------------------------------------------------------

    def _probe(
        self, devices: list[DeviceConfig] | None
    ) -> tuple[ProbeResult, str | None, dict[str, str]]:
        """One probe pass plus the usage sheets."""
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
        self.recheck.due = proof is None or not proof.proves()
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
            self.client.call(calls.LABELS, self.worker_id, body=req)
        except ApiError as e:
            log.warning("labels push refused: %s", e)
            if e.status == 404:
                self.reregister = True
            return False
        except TransportError as e:
            log.warning("labels push failed: %s", e)
            return False
        finally:
            self.reporter.submit_health(res.health)
        return True

    def _register_once(self) -> bool:
        """One registration attempt; True when the controller took it."""
        try:
            resp = self.client.call(calls.REGISTER, body=self._registration())
        except (ApiError, TransportError) as e:
            log.warning("re-registration failed: %s", e)
            return False
        self.instance = resp["instance"]
        self.reporter.tail_bytes = _tail_bytes(resp)
        log.info("registered %s again", self.cfg.host)
        self.reporter.submit_health(self._health_due)
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
                resp = self.client.call(calls.REGISTER, body=req)
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
                self.reporter.submit_health(self._health_due)
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

    # -- the loops --------------------------------------------------------------

    def probe_loop(self) -> None:
        """Push labels every probe_interval until the worker stops."""
        while not self.clock.wait(self.stop_event, self.cfg.probe_interval):
            try:
                self.push_labels()
            except Exception:  # a probe bug must not end the loop
                log.exception("probe pass failed")

    def heartbeat_loop(self) -> None:
        """A heartbeat every heartbeat_interval, and at once when a response
        came from a new controller instance (a restart or a failover: the new
        one keeps this worker's devices `unknown` until it hears one)."""
        episode = _Episode("heartbeat failed")
        self.client.on_new_instance = lambda _instance: self.beat_now.set()
        while True:
            self.clock.wait(self.beat_now, self.heartbeat_interval)
            if self.stop_event.is_set():
                return
            self.beat_now.clear()
            self.heartbeat_once(episode)

    def heartbeat_once(self, episode: _Episode | None = None) -> None:
        """One heartbeat naming the jobs this worker supervises; stops the
        ones the controller says have ended. None once the worker has left
        (a heartbeat would bring its devices back into the pool)."""
        holds = self.runs.holds()
        use = self.usage.sample(holds, self.clock.monotonic())
        with self._leaving:
            if self.left:
                return
            named = self.runs.named()
            runs = self.runs.running()  # a stop names these runs, not a later one
            try:
                resp = self.client.call(
                    calls.HEARTBEAT,
                    self.worker_id,
                    body=HeartbeatRequest(tuple(named), use),
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

    def poll_loop(self, dispatch: Callable[[Assignments, str], None]) -> None:
        """The startup release pass, then long polls until the worker stops,
        each answer handed to `dispatch(assignments, controller instance)`."""
        self.leases.startup_release_pass()
        episode = _Episode(f"cannot reach {self.client.url}")
        delay = RETRY_MIN_S
        while not self.stop_event.is_set():
            self._maybe_reregister()
            t0 = self.clock.monotonic()
            try:
                resp = self.client.call_response(
                    calls.ASSIGNMENTS,
                    self.worker_id,
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
                dispatch(got, instance)
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

    # -- leaving ----------------------------------------------------------------

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
                resp = self.client.call(
                    calls.LEAVE,
                    self.worker_id,
                    body=req,
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
