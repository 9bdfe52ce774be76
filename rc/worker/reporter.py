"""Job status reports and device faults, retried.

One thread sends every pending fault (POST /v1/devices/{id}/fault), then every
pending report in one request to POST /v1/workers/{id}/reports. No report goes
out while a fault is still pending, so a job's terminal report (which frees
its device) can never overtake the fault that must quarantine the device. A terminal report replaces a running report
not yet sent for the same job (it carries started_at). Transport errors and
5xx are retried with backoff (200 ms doubling to 5 s) until the report's
deadline (30 min: the controller may be restarting); a report the controller
refuses (4xx) is logged and dropped. `on_done(job_id, accepted)` is called
once a terminal report is settled either way, so the job stops being named in
heartbeats; `accepted` says whether the controller took it (so it has
recorded the job's end).

Fewer requests per job (worker protocol 2): each reports request asks for
the worker's new assignments in its reply (?assignments=1), which the
controller reads after the reports' commit: the devices a terminal report
freed come back with their next jobs, handed to `on_assignments` (after the
batch is settled). While a running report is pending, the batch waits for
the jobs' ends until its oldest report has waited RUNNING_LINGER_S (a
fault ends the wait at once), so short jobs' starts and ends travel in one
request (the running report carries started_at, so the recorded start is
exact either way).

Log tails (README "Operating a worker"): with a controller that takes them
(`tail_bytes` > 0, from its registration reply), each report carries its
job's unacknowledged output held in memory (LogSink.tail: at most
`tail_bytes` per job, LOG_TAILS_PER_REQUEST per request, base64), so a job's
start travels with its first output and a short job's end with its last;
the bytes leave the sink once the reply says the log reaches past them
(LogSink.tail_stored). A terminal report whose job's sink was handed off
(LogSink.close(hand_off=True)) goes only with all of that output, so the
log is stored when the end is recorded; once settled, the sink is released
(LogSink.release: whatever was not acknowledged, on a refused tail or a
given-up report, goes through the uploader). A controller that refuses the
fields (an older one after a failover) makes the reporter stop sending them
and send the batch again without.
"""

from __future__ import annotations

import base64
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass

from rc.proto import calls
from rc.proto.client import Client
from rc.proto.errors import ApiError, TransportError
from rc.proto.wire import LOG_TAILS_PER_REQUEST, FaultRequest
from rc.worker import health
from rc.worker.clock import SYSTEM, Clock
from rc.worker.logsink import LogSink

__all__ = ["REPORT_DEADLINE_S", "Fault", "Report", "Reporter"]

log = logging.getLogger("rc.worker.reports")

REPORT_DEADLINE_S = 1800.0
RETRY_MIN_S = 0.2
RETRY_MAX_S = 5.0
RUNNING_LINGER_S = 0.05
"""While a running report is pending, the most the oldest pending report
waits for the jobs' ends before the batch goes (real seconds: a short tick,
not a timer of the worker's clock)."""


@dataclass(slots=True)
class Report:
    """A pending report: state "running" or terminal."""

    job_id: int
    state: str
    exit_code: int | None = None
    reason: str = ""
    started_at: float | None = None
    hardware_cause: str = ""
    """What of the hardware ended the job (rc.worker.health.JobNote), "" if nothing."""
    hardware_device_ids: tuple[str, ...] = ()
    """Its faulty devices (ids)."""
    deadline: float = 0.0
    """Monotonic seconds (the reporter's clock) after which it is given up."""
    since: float = 0.0
    """When it (or the running report it replaced) was queued: real
    monotonic seconds, for RUNNING_LINGER_S."""
    log: LogSink | None = None
    """The job's log sink, whose tail the report may carry (None: no log)."""

    @property
    def terminal(self) -> bool:
        """Not a "running" report."""
        return self.state != "running"

    def wire(self) -> dict:
        """The report as a JobReport in JSON."""
        return {
            "job_id": self.job_id,
            "state": self.state,
            "exit_code": self.exit_code,
            "reason": self.reason,
            "started_at": self.started_at,
            # only when there is one: a controller from before them never sees them
            **(
                {
                    "hardware_cause": self.hardware_cause,
                    "hardware_device_ids": list(self.hardware_device_ids),
                }
                if self.hardware_cause
                else {}
            ),
        }


@dataclass(slots=True)
class Fault:
    """A pending quarantine of a device (`fault`), with its reason."""

    device_id: str
    reason: str
    job_id: int | None = None
    deadline: float = 0.0
    drain: bool = False
    """Drain the device instead (its job finishes, no new one starts)."""


FAULT_REASON_MAX = 4000
"""Longest fault reason sent (the controller's free-text limit is 4096)."""


class Reporter:
    """Sends reports for one worker; thread-safe. Deadlines and retry
    delays are seconds of `clock`."""

    def __init__(
        self,
        client: Client,
        worker_id: str,
        on_done: Callable[[int, bool], None],
        clock: Clock = SYSTEM,
        on_assignments: Callable[[list], None] | None = None,
    ) -> None:
        """`on_assignments(items)`: the assignments a reply carried (JSON
        objects of rc.proto.wire.Assignment), called on the reporter's
        thread; None: never ask for them."""
        self.client = client
        self.on_assignments = on_assignments
        self.clock = clock
        self.worker_id = worker_id
        self.on_done = on_done
        self._pending: dict[int, Report] = {}
        self.tail_bytes = 0
        """Log-tail bytes per job the controller takes (RegisterResponse.log_tail_bytes; 0: none)."""
        self._faults: list[Fault] = []
        self._cond = threading.Condition()
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="rc-reporter", daemon=True)
        self._thread.start()

    def submit(self, report: Report) -> None:
        """Queue a report (a terminal one supersedes a running one)."""
        report.deadline = self.clock.monotonic() + REPORT_DEADLINE_S
        report.since = SYSTEM.monotonic()  # real: RUNNING_LINGER_S is a tick
        with self._cond:
            old = self._pending.get(report.job_id)
            if old is not None and old.terminal and not report.terminal:
                return
            if old is not None:
                report.since = old.since
            self._pending[report.job_id] = report
            self._cond.notify_all()

    def submit_fault(
        self,
        device_id: str,
        reason: str,
        job_id: int | None = None,
        drain: bool = False,
        quiet: bool = False,
    ) -> None:
        """Queue a fault (with `drain`: a drain); it goes out before any
        report queued after it. `quiet`: a fault sent before, again (logged
        at debug level only)."""
        level = logging.DEBUG if quiet else logging.ERROR
        log.log(level, "%s %s: %s", "draining" if drain else "faulting", device_id, reason)
        with self._cond:
            self._faults.append(
                Fault(
                    device_id,
                    reason[:FAULT_REASON_MAX],
                    job_id,
                    self.clock.monotonic() + REPORT_DEADLINE_S,
                    drain,
                )
            )
            self._cond.notify_all()

    def submit_health(self, checked: health.Pass | None, job_id: int | None = None) -> None:
        """Queue the faults (quarantine as `fault`) and drains a health pass
        found (rc.worker.health), and the faults still standing (quietly):
        each for device "WORKER_ID:NAME"; `job_id` names the job that ended
        when they were found (in the event). None: nothing."""
        if checked is None:
            return
        for f in checked.actions:
            device_id = f"{self.worker_id}:{f.device}"
            if f.action == "fault":
                self.submit_fault(device_id, f.reason(device_id), job_id)
            elif f.action == "drain":
                self.submit_fault(device_id, f.reason(device_id), job_id, drain=True)
        for f in checked.standing:  # a fault still there: again, for a device cleared meanwhile
            device_id = f"{self.worker_id}:{f.device}"
            self.submit_fault(device_id, f.reason(device_id), job_id, quiet=True)

    def pending(self) -> int:
        """Reports and faults not yet settled."""
        with self._cond:
            return len(self._pending) + len(self._faults)

    def drain(self, timeout: float) -> bool:
        """Wait up to `timeout` s for every queued report to settle."""
        deadline = self.clock.monotonic() + timeout
        with self._cond:
            while self._pending or self._faults:
                left = deadline - self.clock.monotonic()
                if left <= 0:
                    return False
                self.clock.wait_on(self._cond, left)
            return True

    def stop(self) -> None:
        """Stop once nothing is pending (bounded: RETRY_MAX_S + 2 s)."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        self._thread.join(RETRY_MAX_S + 2)

    def _run(self) -> None:
        delay = RETRY_MIN_S
        while True:
            with self._cond:
                while not self._pending and not self._faults and not self._stopping:
                    self._cond.wait()
                if self._stopping and not self._pending and not self._faults:
                    return
                self._linger()
                batch = list(self._pending.values())
            if not self._send_faults():
                if not self._pause(delay):
                    return
                delay = min(delay * 2, RETRY_MAX_S)
                continue
            if not batch:
                delay = RETRY_MIN_S
                continue
            batch, wires, tails = self._with_tails(batch)
            try:
                resp = self.client.call(
                    calls.REPORTS,
                    self.worker_id,
                    body={"reports": wires},
                    params={"assignments": "1"} if self.on_assignments else None,
                )
            except (TransportError, ApiError) as e:
                if isinstance(e, ApiError) and e.status == 400 and tails and "log_" in str(e):
                    log.warning(
                        "the controller takes no log tails in reports (%s); sending none", e
                    )
                    self.tail_bytes = 0
                    continue
                if isinstance(e, ApiError) and e.status < 500:
                    log.error("reports refused: %s; dropping %d", e, len(batch))
                    self._settle(batch, set())
                    continue
                now = self.clock.monotonic()
                expired = [r for r in batch if r.deadline <= now]
                if expired:
                    log.error(
                        "giving up on %d report(s) after %.0fs: %s",
                        len(expired),
                        REPORT_DEADLINE_S,
                        e,
                    )
                    self._settle(expired, set())
                if not self._pause(delay):
                    return
                delay = min(delay * 2, RETRY_MAX_S)
                continue
            delay = RETRY_MIN_S
            accepted = set()
            for res in resp.get("results", []):
                r = tails.get(res.get("job_id"))
                if r is not None and r.log is not None:
                    if isinstance(res.get("log_size"), int):
                        r.log.tail_stored(res["log_size"])
                    else:
                        log.info(
                            "job %s: log tail refused (%s); the uploader sends it",
                            res.get("job_id"),
                            res.get("log_error") or "no answer",
                        )
                if res.get("ok"):
                    accepted.add(res.get("job_id"))
                else:
                    log.warning(
                        "job %s: report refused: %s: %s",
                        res.get("job_id"),
                        res.get("error"),
                        res.get("message"),
                    )
            self._settle(batch, accepted)
            carried = resp.get("assignments") if self.on_assignments else None
            if carried:
                try:
                    self.on_assignments(carried)
                except Exception:  # a bug must not end the reporter
                    log.exception("starting the assignments a report reply carried failed")

    def _with_tails(self, batch: list[Report]) -> tuple[list[Report], list[dict], dict]:
        """The reports to send now, their JSON, and the reports among them
        that carry a log tail (by job id). A terminal report of a handed-off
        sink whose whole tail does not fit the request's budget waits for
        the next request (the first report always fits)."""
        limit = self.tail_bytes
        if not limit:
            return batch, [r.wire() for r in batch], {}
        budget = LOG_TAILS_PER_REQUEST
        sent, wires, tails = [], [], {}
        for r in batch:
            w = r.wire()
            cap = min(limit, budget)
            got = r.log.tail(limit) if r.log is not None else None
            if got is not None and len(got[1]) > cap:
                if r.terminal and r.log.handed and sent:
                    continue  # its whole output does not fit: with the next request
                got = (got[0], got[1][:cap]) if cap > 0 else None
            if got is not None:
                offset, data = got
                w["log_offset"] = offset
                w["log_tail"] = base64.b64encode(data).decode("ascii")
                budget -= len(data)
                tails[r.job_id] = r
            sent.append(r)
            wires.append(w)
        return sent, wires, tails

    def _linger(self) -> None:
        """With the lock held: while a running report is pending (its job
        may end soon) and no fault is, wait for the jobs' ends, until the
        oldest pending report has waited RUNNING_LINGER_S."""
        while self._pending and not self._faults and not self._stopping:
            if all(r.terminal for r in self._pending.values()):
                return
            left = min(r.since for r in self._pending.values()) + RUNNING_LINGER_S
            left -= SYSTEM.monotonic()
            if left <= 0:
                return
            self._cond.wait(left)

    def _pause(self, delay: float) -> bool:
        """Wait `delay` s before a retry (a new submission wakes it); False
        when stopping with nothing left to send."""
        with self._cond:
            if self._stopping and not self._pending and not self._faults:
                return False
            self.clock.wait_on(self._cond, delay)
            return True

    def _send_faults(self) -> bool:
        """Send pending faults in order; False when one must be retried."""
        while True:
            with self._cond:
                if not self._faults:
                    return True
                f = self._faults[0]
            try:
                self.client.call(
                    calls.DEVICE_FAULT,
                    f.device_id,
                    body=FaultRequest(f.reason, f.job_id, f.drain),
                )
            except ApiError as e:
                if e.status >= 500 and self.clock.monotonic() < f.deadline:
                    return False
                log.error("fault on %s refused: %s", f.device_id, e)
            except TransportError as e:
                if self.clock.monotonic() < f.deadline:
                    return False
                log.error("giving up on the fault of %s: %s", f.device_id, e)
            with self._cond:
                self._faults.pop(0)
                self._cond.notify_all()

    def _settle(self, batch: list[Report], accepted: set[int]) -> None:
        with self._cond:
            for r in batch:
                if self._pending.get(r.job_id) is r:
                    del self._pending[r.job_id]
            self._cond.notify_all()
        for r in batch:
            if r.terminal:
                if r.log is not None:
                    r.log.release()
                self.on_done(r.job_id, r.job_id in accepted)
