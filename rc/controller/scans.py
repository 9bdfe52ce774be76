"""Survivor scans asked of workers (docs/design.md#quarantine-and-proof).

`rc clear` and `rc kill` of a lost job need a fresh look at the host: the
controller queues a ScanRequest for the device's worker, the worker's long
poll hands it over (Assignments.scans, once), the worker scans (and, when
asked, kills) and answers at POST /v1/workers/{id}/scans/{scan_id}; the
request that asked waits for the answer with a deadline. Nothing here is
durable: a scan is only ever waited for by a live request, which fails with
503 scan_unavailable when the controller restarts or the worker does not
answer in time.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from dataclasses import dataclass, field

from rc.controller.errors import Refused
from rc.proto.errors import ErrorCode
from rc.proto.wire import ScanRequest, ScanResult

__all__ = [
    "CONNECTED_S",
    "PENDING_MAX",
    "SCAN_WAIT_S",
    "SURVIVORS_NAMED",
    "Scans",
    "refuse_incomplete",
    "scan_answer",
    "scan_or_refuse",
    "survivors_text",
]

SCAN_WAIT_S = 30.0
"""How long a request waits for a worker's scan (s); with --kill the worker
also spends its kill grace."""
CONNECTED_S = 5.0
"""A worker without a long poll waiting counts as connected this long after
its last one answered (s): it is acting on what it got."""
PENDING_MAX = 64
"""Scans waiting per worker, at most; more are refused (503 scan_unavailable)."""


@dataclass
class _Pending:
    request: ScanRequest
    answer: asyncio.Future
    delivered: bool = False


@dataclass
class Scans:
    """The scans asked of each worker and not yet answered."""

    pending: dict[str, dict[int, _Pending]] = field(default_factory=dict)
    polls: dict[str, int] = field(default_factory=dict)
    """worker id → its long polls waiting now."""
    last_poll: dict[str, float] = field(default_factory=dict)
    """worker id → when its last long poll answered (monotonic s)."""
    _ids: itertools.count = field(default_factory=lambda: itertools.count(1))

    def poll_started(self, worker_id: str) -> None:
        """A long poll of `worker_id` began."""
        self.polls[worker_id] = self.polls.get(worker_id, 0) + 1

    def poll_ended(self, worker_id: str) -> None:
        """A long poll of `worker_id` answered."""
        self.polls[worker_id] = max(0, self.polls.get(worker_id, 0) - 1)
        self.last_poll[worker_id] = time.monotonic()

    def connected(self, worker_id: str) -> bool:
        """Whether `worker_id` polls this controller now (a poll waits, or one
        answered within CONNECTED_S)."""
        if self.polls.get(worker_id, 0) > 0:
            return True
        last = self.last_poll.get(worker_id)
        return last is not None and time.monotonic() - last < CONNECTED_S

    def ask(
        self, worker_id: str, device_ids: tuple[str, ...], job_ids: tuple[int, ...], kill: bool
    ) -> tuple[ScanRequest, asyncio.Future] | None:
        """Queue a scan for `worker_id`; (the request, the future its
        ScanResult lands in), or None when PENDING_MAX are waiting already.
        The caller notifies "worker:<id>" so the long poll hands it over."""
        mine = self.pending.setdefault(worker_id, {})
        if len(mine) >= PENDING_MAX:
            return None
        req = ScanRequest(next(self._ids), device_ids, job_ids, kill)
        fut = asyncio.get_running_loop().create_future()
        mine[req.scan_id] = _Pending(req, fut)
        return req, fut

    def handout(self, worker_id: str) -> tuple[ScanRequest, ...]:
        """The scans this worker has not been handed yet (each is handed out once)."""
        out = []
        for p in self.pending.get(worker_id, {}).values():
            if not p.delivered:
                p.delivered = True
                out.append(p.request)
        return tuple(out)

    def answer(self, worker_id: str, scan_id: int, result: ScanResult) -> bool:
        """A worker's answer; False when no such scan waits (too late, or never asked)."""
        p = self.pending.get(worker_id, {}).pop(scan_id, None)
        if p is None:
            return False
        if not p.answer.done():
            p.answer.set_result(result)
        return True

    def forget(self, worker_id: str, scan_id: int) -> None:
        """The asker stopped waiting (its deadline passed)."""
        self.pending.get(worker_id, {}).pop(scan_id, None)

    async def run(
        self,
        hub,
        worker_id: str,
        device_ids: tuple[str, ...],
        job_ids: tuple[int, ...],
        kill: bool,
        timeout: float = SCAN_WAIT_S,
    ) -> ScanResult | None:
        """Ask for a scan and wait up to `timeout` seconds for it; None when
        it cannot be queued or the worker did not answer in time."""
        got = self.ask(worker_id, device_ids, job_ids, kill)
        if got is None:
            return None
        req, fut = got
        hub.notify([f"worker:{worker_id}"])
        try:
            return await asyncio.wait_for(fut, timeout)
        except TimeoutError:
            return None
        finally:
            self.forget(worker_id, req.scan_id)


SURVIVORS_NAMED = 10
"""Survivors named in a refusal or an event, at most (the rest are counted)."""


def survivors_text(found) -> str:
    """ "pid 12 'sleep 301' (cgroup job-58); ..." (at most SURVIVORS_NAMED)."""
    parts = [
        f"pid {s.pid} {s.command!r}" + (f" ({s.where})" if s.where else "")
        for s in found[:SURVIVORS_NAMED]
    ]
    if len(found) > SURVIVORS_NAMED:
        parts.append(f"and {len(found) - SURVIVORS_NAMED} more")
    return "; ".join(parts)


FORCE_HINT = " (rc clear --force clears a device without a survivor scan)"


async def scan_answer(
    c, host: str, device_ids, job_ids, kill: bool, what: str, hint: str = FORCE_HINT
) -> ScanResult:
    """A fresh survivor scan by `host`'s worker, complete or not (its health
    reading may decide first: rc clear of a GPU health fault); 503
    scan_unavailable when it is not connected or does not answer in time."""
    if not c.scans.connected(host):
        raise Refused(
            ErrorCode.SCAN_UNAVAILABLE,
            f"the worker of {host} is not connected, so nothing of {what} can be checked{hint}",
        )
    result = await c.scans.run(c.hub, host, tuple(device_ids), tuple(job_ids), kill)
    if result is None:
        raise Refused(
            ErrorCode.SCAN_UNAVAILABLE,
            f"the worker of {host} did not answer a survivor scan of {what} in time{hint}",
        )
    return result


async def scan_or_refuse(
    c, host: str, device_ids, job_ids, kill: bool, what: str, hint: str = FORCE_HINT
) -> ScanResult:
    """A fresh survivor scan by `host`'s worker; 503 scan_unavailable when it
    is not connected, does not answer in time, or cannot scan."""
    result = await scan_answer(c, host, device_ids, job_ids, kill, what, hint)
    refuse_incomplete(result, host, what)
    return result


def refuse_incomplete(result: ScanResult, host: str, what: str) -> None:
    """503 scan_unavailable for a scan that could not look everywhere."""
    if result.error or not result.complete:
        raise Refused(
            ErrorCode.SCAN_UNAVAILABLE,
            f"the survivor scan of {what} on {host} proves nothing: "
            f"{result.error or 'it could not read every process'}",
        )
