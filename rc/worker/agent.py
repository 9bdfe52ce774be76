"""The worker's main loop (inventory §6.2): register, heartbeat, long-poll, run.

Threads: the main thread waits for a signal; the poll thread long-polls for
assignments and kills; the heartbeat thread names the jobs this worker
supervises every `heartbeat_interval`; the reporter sends status reports; one
thread per job (rc.worker.job). The worker only dials out.

A job id is never started twice by one worker process. SIGTERM/SIGINT: stop
polling, end running jobs (their terminal reports go out), wait for the
reports, exit 0.
"""

from __future__ import annotations

import logging
import random
import threading
import time
import uuid

from rc import __version__
from rc.proto.client import Client
from rc.proto.codec import decode, encode
from rc.proto.errors import ApiError, TransportError
from rc.proto.model import RecoveryProof
from rc.proto.wire import Assignments, DeviceDecl, RegisterRequest
from rc.worker import probe, recovery
from rc.worker.config import WorkerConfig
from rc.worker.job import JobRun
from rc.worker.reporter import Report, Reporter

__all__ = ["Agent"]

log = logging.getLogger("rc.worker")

RETRY_MIN_S = 1.0
RETRY_MAX_S = 30.0
POLL_FLOOR_S = 0.25
SHUTDOWN_GRACE_S = 45.0
FAULT_ATTEMPTS = 5


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


class Agent:
    """One worker process: `run()` returns the exit code."""

    def __init__(self, cfg: WorkerConfig, client: Client) -> None:
        self.cfg = cfg
        self.client = client
        self.worker_id = cfg.host
        self.stop_event = threading.Event()
        self.stopping = False
        self.jobs: dict[int, JobRun] = {}
        self.reporting: set[int] = set()
        self.started: set[int] = set()
        self._lock = threading.Lock()
        self.devices: dict[str, probe.Device] = {}
        self.heartbeat_interval = cfg.heartbeat_interval
        self.instance = ""
        self.reregister = False
        self.reporter = Reporter(client, self.worker_id, self._report_done)
        # Every job carries these, so sweeps and survivor scans only ever see
        # this host's jobs (and post-job sweeps only this worker process's).
        self.instance_id = uuid.uuid4().hex
        self.markers = {"RC_HOST": cfg.host, "RC_WORKER_INSTANCE": self.instance_id}
        self.sweep_scope = {b"RC_WORKER_INSTANCE": self.instance_id.encode()}

    # -- registration -----------------------------------------------------

    def _registration(self) -> RegisterRequest:
        gpus = probe.query_gpus()
        configs = probe.discover(self.cfg.devices, gpus)
        detected: dict[str, dict[str, str]] = {"": probe.host_facts()}
        declared: dict[str, dict[str, str]] = {"": dict(self.cfg.labels)}
        self.devices = {}
        for d in configs:
            labels = probe.device_labels(d, gpus)
            detected[d.name] = labels
            declared[d.name] = dict(d.labels)
            self.devices[d.name] = probe.Device(d, labels)
        with self._lock:
            idle = not self.jobs
        proof = recovery.recovery_proof(self.cfg.require_manual_clear, self.cfg.host) if idle else None
        return RegisterRequest(
            host=self.cfg.host,
            devices=tuple(DeviceDecl(d.name, int(d.max_runtime)) for d in configs),
            boot_id=recovery.boot_id(),
            recovery=proof or RecoveryProof(),
            labels=detected,
            declared_labels=declared,
            version=__version__,
        )

    def register(self) -> bool:
        """Register until it works or the worker is told to stop."""
        episode = _Episode(f"cannot register with {self.client.url}")
        delay = RETRY_MIN_S
        while not self.stop_event.is_set():
            try:
                req = self._registration()
                resp = self.client.post("/v1/workers/register", encode(req))
                self.instance = resp["instance"]
                self.heartbeat_interval = float(resp.get("heartbeat_seconds") or
                                                self.cfg.heartbeat_interval)
                episode.ok()
                log.info("registered %s with %s: %s", self.cfg.host, self.client.url,
                         ", ".join(self.devices) or "no devices")
                return True
            except ApiError as e:
                if e.status in (401, 403):
                    log.error("the controller refused this worker: %s", e)
                episode.fail(e)
            except TransportError as e:
                episode.fail(e)
            self.stop_event.wait(delay)
            delay = min(delay * 2, RETRY_MAX_S)
        return False

    # -- loops ------------------------------------------------------------

    def run(self) -> int:
        if not self.register():
            return 0
        threading.Thread(target=self._heartbeat_loop, name="rc-heartbeat", daemon=True).start()
        threading.Thread(target=self._poll_loop, name="rc-poll", daemon=True).start()
        while not self.stop_event.wait(1.0):
            pass
        return self._shutdown()

    def stop(self) -> None:
        """Ask the worker to shut down (signal handlers call this)."""
        self.stopping = True
        self.stop_event.set()

    def _heartbeat_loop(self) -> None:
        episode = _Episode("heartbeat failed")
        while not self.stop_event.wait(self.heartbeat_interval):
            self.heartbeat_once(episode)

    def heartbeat_once(self, episode: _Episode | None = None) -> None:
        with self._lock:
            named = sorted(set(self.jobs) | self.reporting)
        try:
            resp = self.client.post(f"/v1/workers/{self.worker_id}/heartbeat",
                                    {"running_job_ids": named})
        except ApiError as e:
            if e.status == 404:
                log.warning("the controller does not know this worker; registering again")
                self.reregister = True
            elif episode:
                episode.fail(e)
            return
        except TransportError as e:
            if episode:
                episode.fail(e)
            return
        if episode:
            episode.ok()
        self._note_instance(resp.get("instance", ""))
        for job_id in resp.get("stop_job_ids", []):
            self._cancel(job_id, "the controller ended this job")

    def _note_instance(self, instance: str) -> None:
        if instance and self.instance and instance != self.instance:
            log.info("the controller restarted (instance %s)", instance[:8])
            self.instance = instance
            self.reregister = True

    def _poll_loop(self) -> None:
        episode = _Episode(f"cannot reach {self.client.url}")
        delay = RETRY_MIN_S
        path = f"/v1/workers/{self.worker_id}/assignments"
        while not self.stop_event.is_set():
            self._maybe_reregister()
            t0 = time.monotonic()
            try:
                resp = self.client.request("GET", path, params={"wait": f"{self.cfg.poll_wait:g}s"},
                                           timeout=self.cfg.poll_wait + 15)
            except (TransportError, ApiError) as e:
                episode.fail(e)
                if isinstance(e, ApiError) and e.status == 404:
                    self.reregister = True
                self.stop_event.wait(delay)
                delay = min(delay * 2, RETRY_MAX_S)
                continue
            episode.ok()
            delay = RETRY_MIN_S
            self._note_instance(self.client.instance)
            if resp.status == 200 and not self.stop_event.is_set():
                got = decode(Assignments, resp.json())
                self._dispatch(got)
                if got.assignments or got.kills:
                    continue
            if time.monotonic() - t0 < POLL_FLOOR_S:
                self.stop_event.wait(POLL_FLOOR_S)

    def _maybe_reregister(self) -> None:
        if not self.reregister:
            return
        with self._lock:
            busy = bool(self.jobs) or bool(self.reporting)
        if busy:
            return
        self.stop_event.wait(random.uniform(0, 1.0))
        self.reregister = False
        if not self.register():
            self.reregister = True

    def _dispatch(self, got: Assignments) -> None:
        kills = set(got.kills)
        for job_id in kills:
            self._cancel(job_id, "")
        for a in got.assignments:
            with self._lock:
                if a.job_id in self.started:
                    continue
                self.started.add(a.job_id)
            if a.job_id in kills:
                self.reporter.submit(Report(a.job_id, "killed", None,
                                            "killed before this worker started it"))
                with self._lock:
                    self.reporting.add(a.job_id)
                continue
            device = self.devices.get(a.device_id.rpartition(":")[2])
            cuda = probe.cuda_index(device.name) if device else None
            run = JobRun(self, a, cuda)
            with self._lock:
                self.jobs[a.job_id] = run
            run.start()

    def _cancel(self, job_id: int, reason: str) -> None:
        with self._lock:
            run = self.jobs.get(job_id)
        if run is not None:
            run.cancel(reason or "cancelled")

    # -- job completion -----------------------------------------------------

    def finished(self, run: JobRun, state: str, exit_code: int | None, reason: str,
                 started_at: float | None) -> None:
        """Called by a JobRun when its process is gone and its logs flushed."""
        with self._lock:
            self.jobs.pop(run.job_id, None)
            self.reporting.add(run.job_id)
        self.reporter.submit(Report(run.job_id, state, exit_code, reason, started_at))

    def _report_done(self, job_id: int) -> None:
        with self._lock:
            self.reporting.discard(job_id)

    def fault(self, device_id: str, reason: str, job_id: int | None) -> None:
        """Quarantine a device (`fault`), retrying transport errors and 5xx."""
        delay = 0.2
        for _ in range(FAULT_ATTEMPTS):
            try:
                self.client.post(f"/v1/devices/{device_id}/fault",
                                 {"reason": reason[:4000], "job_id": job_id})
                log.error("faulted %s: %s", device_id, reason)
                return
            except ApiError as e:
                if e.status < 500:
                    log.error("fault report for %s refused: %s", device_id, e)
                    return
            except TransportError:
                pass
            time.sleep(delay)
            delay *= 2
        log.error("could not report a fault on %s: %s", device_id, reason)

    def _shutdown(self) -> int:
        log.info("shutting down: ending %d running job(s)", len(self.jobs))
        deadline = time.monotonic() + SHUTDOWN_GRACE_S
        with self._lock:
            runs = list(self.jobs.values())
        for run in runs:
            run.cancel("the worker is shutting down")
        for run in runs:
            run.thread.join(max(0.0, deadline - time.monotonic()))
        if not self.reporter.drain(max(1.0, deadline - time.monotonic())):
            log.error("some job reports could not be delivered before shutdown")
        self.reporter.stop()
        log.info("worker stopped")
        return 0
