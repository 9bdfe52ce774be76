"""Survivor scans that return devices to the pool (rc.worker.survivors).

The periodic re-check: while `due` (this worker's registration proof proved
nothing, or a job's teardown left survivors), every `recheck_interval` a
scan of every job of this host not running here; when it is complete and
finds nothing, the proof goes to POST /v1/workers/{id}/recheck, which
returns the devices it can (unless require_manual_clear).

The scans the controller asks for (rc clear, rc kill of a lost job; handed
out by the long poll, rc.worker.dispatch): a fresh scan of the named devices
and jobs, killing what it finds when asked, with the GPUs' health read
afresh, answered on POST /v1/workers/{id}/scans/{scan}.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable

from rc.proto import calls
from rc.proto.client import Client
from rc.proto.codec import decode
from rc.proto.errors import ApiError, TransportError
from rc.proto.model import RecoveryProof
from rc.proto.wire import RecheckRequest, RecheckResponse, ScanRequest, ScanResult
from rc.worker import cgroups, survivors
from rc.worker.clock import Clock
from rc.worker.config import WorkerConfig
from rc.worker.labels import Prober
from rc.worker.probe import cuda_index
from rc.worker.runs import Runs

__all__ = ["Recheck"]

log = logging.getLogger("rc.worker")


class Recheck:
    """The survivor scans of one worker process; thread-safe.

    runs: the worker's jobs (never scanned while they run). tracker: how it
    tracks processes. prober: its prober (GPU UUIDs, the health read
    afresh). devices(): the names of the devices it registered.
    """

    def __init__(
        self,
        cfg: WorkerConfig,
        client: Client,
        clock: Clock,
        runs: Runs,
        tracker: cgroups.Tracker,
        prober: Prober,
        devices: Callable[[], Iterable[str]],
    ) -> None:
        self.cfg = cfg
        self.client = client
        self.clock = clock
        self.runs = runs
        self.tracker = tracker
        self.prober = prober
        self.devices = devices
        self.worker_id = cfg.host
        self.due = False
        """Devices of this worker may be out with survivors (its registration
        proof proved nothing, or a teardown left survivors): rescan every
        recheck_interval (rc.worker.survivors) until a clean scan returned them."""

    def note_fault(self, reason: str) -> None:
        """A job run quarantined a device for `reason`: survivors of its
        teardown make the re-check due."""
        if reason.startswith(("processes of job ", "GPU ")):
            self.due = True

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
                self.tracker, self.cfg.host, device_ids, job_ids, running, self.prober.gpu_uuid
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
        got = self.prober.health_check(gpus)
        return {mine + n: v for n, v in got.items()}

    def answer(self, req: ScanRequest) -> None:
        """Run the scan the controller asked for and send its result (a
        worker error, when the scan failed; nothing is raised)."""
        try:
            found, ended = self.survivor_scan(req.device_ids, req.job_ids, req.kill)
            result = ScanResult(
                found.survivors, ended, found.complete, health=self._health_now(req)
            )
        except Exception as e:  # a bug must still answer
            log.exception("survivor scan %d failed", req.scan_id)
            result = ScanResult(complete=False, error=f"worker error: {e}")
        try:
            self.client.call(calls.SCAN_RESULT, self.worker_id, req.scan_id, body=result)
        except (ApiError, TransportError) as e:
            log.warning("could not answer survivor scan %d: %s", req.scan_id, e)

    def once(self) -> list[str]:
        """One periodic re-check: a survivor scan of every job of this host
        not running here; when it is complete and finds nothing, present the
        proof (POST /v1/workers/{id}/recheck). Returns the devices it
        returned to the pool."""
        running, busy = self.runs.in_use()
        idle = [f"{self.cfg.host}:{n}" for n in self.devices()]
        found = survivors.scan(
            self.tracker,
            self.cfg.host,
            [d for d in idle if d not in busy],  # their GPUs: no compute process may remain
            running=running,
            gpu_uuid=self.prober.gpu_uuid,
            every_job=True,
        )
        if found.found or not found.complete or self.cfg.require_manual_clear:
            return []
        for cg in found.groups:
            if not cg.live_pids():
                cg.remove()
        proof = RecoveryProof(survivors_checked=True, survivors_found=False)
        try:
            resp = self.client.call(calls.RECHECK, self.worker_id, body=RecheckRequest(proof))
        except (ApiError, TransportError) as e:
            log.warning("re-check not delivered: %s", e)
            return []
        self.due = False
        back = list(decode(RecheckResponse, resp).recovered)
        if back:
            log.info("a clean survivor scan returned %s", ", ".join(back))
        return back

    def loop(self, stop: threading.Event) -> None:
        """Re-check every recheck_interval while due, until `stop` is set."""
        while not self.clock.wait(stop, self.cfg.recheck_interval):
            if self.due:
                try:
                    self.once()
                except Exception:  # a bug must not end the loop
                    log.exception("re-check failed")
