"""Worker routes: register, labels, heartbeat, leave, long
poll, reports, log appends, faults.

A worker token is bound to its host at its first registration
(docs/design.md#identity-and-ownership): afterwards it may only act for
that host's worker, devices and jobs (403 wrong_host / not_worker_job
otherwise). Admin tokens pass.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import dataclasses
import time

from starlette.requests import Request

from rc import __version__
from rc.controller.api import (
    Role,
    caller,
    ctl,
    cut_text,
    json_body,
    path_int,
    query_bool,
    query_float,
    read_body,
    reply,
)
from rc.controller.auth import Caller
from rc.controller.config import Limits
from rc.controller.errors import Refused
from rc.controller.handout import with_log_offset
from rc.controller.store import devices, jobs, tokens, workers
from rc.controller.store import labels as device_labels
from rc.proto.errors import ErrorCode
from rc.proto.model import NAME_RE, Stdio
from rc.proto.selector import valid_label_key
from rc.proto.wire import (
    LOG_TAIL_BYTES,
    WORKER_PROTOCOL,
    Assignment,
    Assignments,
    HeartbeatResponse,
    LeaveResponse,
    LogAppended,
    RecheckResponse,
    RegisterResponse,
    ReportResult,
    ReportResults,
)

PROTOCOLS = (1, WORKER_PROTOCOL)
"""The worker protocols a registration may name (rc.proto.wire.WORKER_PROTOCOL)."""

__all__ = [
    "append_log",
    "assignments",
    "device_fault",
    "heartbeat",
    "labels",
    "leave",
    "recheck",
    "register",
    "reports",
    "scan_result",
]


def _check_name(what: str, value: str) -> None:
    if not NAME_RE.fullmatch(value):
        raise Refused(
            ErrorCode.BAD_REQUEST,
            f"{what} {value!r} is not valid (letters, digits, '.', '_', '-'; at most 63)",
        )


def _check_labels(lim: Limits, labels: dict[str, dict[str, str]] | None, what: str) -> None:
    if labels is None:
        return
    for scope, facts in labels.items():
        if len(facts) > lim.labels_per_device:
            raise Refused(
                ErrorCode.LIMIT_EXCEEDED,
                f"{what}[{scope!r}] has {len(facts)} labels; the limit is {lim.labels_per_device}",
            )
        for k, v in facts.items():
            if not valid_label_key(k):
                raise Refused(
                    ErrorCode.BAD_REQUEST,
                    f"{what}[{scope!r}] label {k[:40]!r}: a label name has no "
                    "spaces or control characters and none of = ! < > ,",
                )
            if len(k) > lim.label_bytes or len(v) > lim.label_bytes:
                raise Refused(
                    ErrorCode.LIMIT_EXCEEDED,
                    f"{what}[{scope!r}] label {k[:40]!r}: keys must be non-empty "
                    f"and keys and values at most {lim.label_bytes} characters",
                )


def _check_sheets(lim: Limits, sheet: str | None, device_sheets: dict[str, str]) -> None:
    for name, body in [("host.md", sheet or ""), *device_sheets.items()]:
        if len(body.encode()) > lim.sheet_bytes:
            raise Refused(
                ErrorCode.SHEET_TOO_LARGE,
                f"usage sheet {name} is over the {lim.sheet_bytes}-byte limit",
            )


def _check_links(lim: Limits, links, names: set[str]) -> None:
    """A topology names pairs of two different declared devices, each pair once."""
    if links is None:
        return
    if len(links) > lim.links_per_worker:
        raise Refused(
            ErrorCode.LIMIT_EXCEEDED,
            f"{len(links)} device links; a worker may report {lim.links_per_worker}",
        )
    seen = set()
    for lk in links:
        for name in (lk.a, lk.b):
            if name not in names:
                raise Refused(
                    ErrorCode.BAD_REQUEST, f"link {lk.a!r}-{lk.b!r}: {name!r} is not a device here"
                )
        key = frozenset((lk.a, lk.b))
        if len(key) == 1:
            raise Refused(ErrorCode.BAD_REQUEST, f"link {lk.a!r}-{lk.b!r} joins a device to itself")
        if key in seen:
            raise Refused(ErrorCode.BAD_REQUEST, f"link {lk.a!r}-{lk.b!r} is given twice")
        seen.add(key)


def _bound(request: Request, who: Caller, host: str) -> None:
    """A worker token may act only for the host it is bound to."""
    if who.role is Role.WORKER and who.host != host:
        bound = who.host or "no host yet (register first)"
        raise Refused(
            ErrorCode.WRONG_HOST, f"worker token {who.name!r} is bound to {bound}, not {host!r}"
        )


async def register(request: Request):
    """POST /v1/workers/register."""
    c = ctl(request)
    who = caller(request)
    lim = c.cfg.limits
    req = await json_body(request, lim.register_body_bytes)
    _check_name("host", req.host)
    if req.protocol not in PROTOCOLS:
        raise Refused(
            ErrorCode.BAD_REQUEST,
            f"worker {req.host!r} speaks worker protocol {req.protocol}; this controller "
            f"(rc {__version__}) speaks {PROTOCOLS[0]} to {PROTOCOLS[-1]}: run the same rc "
            "version on the worker and the controller",
        )
    if len(req.devices) > lim.devices_per_worker:
        raise Refused(
            ErrorCode.LIMIT_EXCEEDED,
            f"{len(req.devices)} devices; a worker may declare {lim.devices_per_worker}",
        )
    names = set()
    for d in req.devices:
        _check_name("device name", d.name)
        if d.name in names:
            raise Refused(ErrorCode.BAD_REQUEST, f"device {d.name!r} is declared twice")
        if d.max_runtime_seconds < 0:
            raise Refused(ErrorCode.BAD_REQUEST, f"device {d.name}: negative max_runtime")
        names.add(d.name)
    _check_labels(lim, req.labels, "labels")
    _check_labels(lim, req.declared_labels, "declared_labels")
    _check_sheets(lim, req.sheet, req.device_sheets)
    _check_links(lim, req.links, names)
    if who.role is Role.WORKER and not who.host:
        live = await c.db.write(tokens.bind_host, who.token_id, req.host)
        if live is None:  # revoked meanwhile
            raise Refused(ErrorCode.UNAUTHORIZED, "unknown or revoked token")
        c.tokens.put(live)
        who = dataclasses.replace(who, host=live.token.host)
    _bound(request, who, req.host)
    # A (re)registering worker supersedes every poll parked before it: the
    # poll of a predecessor killed with -9 stays parked until its connection
    # is noticed gone, and must not take work meant for the new one.
    _supersede_polls(c, req.host)
    await c.db.write(workers.register, req, c.match_cache, c.thresholds)
    c.heard.add(req.host)
    c.handouts.forget(req.host)
    await _drain_degraded(c, req.host, req.labels, who.name)
    return reply(RegisterResponse(req.host, c.instance, c.cfg.heartbeat_interval, LOG_TAIL_BYTES))


async def labels(request: Request):
    """POST /v1/workers/{worker_id}/labels: a periodic re-probe (labels and sheets only)."""
    c = ctl(request)
    who = caller(request)
    worker_id = request.path_params["worker_id"]
    _bound(request, who, worker_id)
    lim = c.cfg.limits
    req = await json_body(request, lim.register_body_bytes)
    if req.host != worker_id:
        raise Refused(ErrorCode.WRONG_HOST, f"labels for {req.host!r} sent to worker {worker_id!r}")
    _check_labels(lim, req.labels, "labels")
    _check_labels(lim, req.declared_labels, "declared_labels")
    _check_sheets(lim, req.sheet, req.device_sheets)
    if req.links is not None:
        known = await c.db.read(device_labels.device_names, worker_id)
        _check_links(lim, req.links, known)
    await c.db.write(device_labels.relabel, req, c.match_cache)
    await _drain_degraded(c, worker_id, req.labels, who.name)
    return reply({"ok": True})


async def _drain_degraded(c, host: str, labels: dict | None, actor: str) -> None:
    """With rc serve --drain-degraded: drain the devices whose detected
    `health` label says degraded (README "GPU health")."""
    if not c.cfg.drain_degraded or not labels:
        return
    degraded = {
        n: v["health"]
        for n, v in labels.items()
        if n and v.get("health", "").startswith("degraded:")
    }
    if degraded:
        await c.db.write(devices.drain_degraded, host, degraded, actor)


async def heartbeat(request: Request):
    """POST /v1/workers/{worker_id}/heartbeat."""
    c = ctl(request)
    who = caller(request)
    worker_id = request.path_params["worker_id"]
    _bound(request, who, worker_id)
    req = await json_body(request, c.cfg.limits.heartbeat_body_bytes, empty_ok=True)
    stop, ttls = await c.heartbeat(worker_id, req.running_job_ids)
    if req.hold_use:
        now, named, ended = c.clock(), set(req.running_job_ids), set(stop)
        for u in req.hold_use:  # only its own holds, still running (hold_ttls names them)
            if u.job_id in named and u.job_id not in ended and str(u.job_id) in ttls:
                c.idle.report(u.job_id, now, u.busy, u.gpu_pct, u.cpu_pct)
    if c.handouts.keep_only(worker_id, set(req.running_job_ids)):
        c.hub.notify([f"worker:{worker_id}"])
    return reply(HeartbeatResponse(c.instance, tuple(stop), ttls))


async def leave(request: Request):
    """POST /v1/workers/{worker_id}/leave: a worker process stopping cleanly
    hands back the assigned jobs it never started (store.workers.leave)."""
    c = ctl(request)
    who = caller(request)
    worker_id = request.path_params["worker_id"]
    _bound(request, who, worker_id)
    req = await json_body(request, c.cfg.limits.body_bytes)
    requeued, killed = await c.db.write(workers.leave, worker_id, req.instance, req.started_job_ids)
    c.handouts.forget(worker_id)
    return reply(LeaveResponse(tuple(requeued), tuple(killed)))


async def assignments(request: Request):
    """GET /v1/workers/{worker_id}/assignments?wait=30s: the long poll.

    Answers as soon as the worker has a job or a kill to act on, else 204
    after `wait` (default 30 s, at most 60 s). A worker has one poll at a
    time: a new poll, or a registration, supersedes older ones, which answer
    204 at once and hand out nothing (the poll of a worker killed with -9
    stays parked here, and must not take work meant for its successor). The
    poll of a worker that has neither registered nor heartbeated with this
    controller process (Controller.heard) answers 204 at once.
    """
    c = ctl(request)
    who = caller(request)
    worker_id = request.path_params["worker_id"]
    _bound(request, who, worker_id)
    wait = query_float(request, "wait", c.cfg.poll_wait_default, 0.0, c.cfg.poll_wait_max)
    deadline = time.monotonic() + wait
    key = f"worker:{worker_id}"
    if worker_id not in c.heard:
        # a worker this controller process has not heard from (it restarted,
        # or took over as the active one): answer at once, so the worker sees
        # the new instance and heartbeats (its devices are `unknown` until then)
        return _no_content()
    generation = _supersede_polls(c, worker_id)
    c.scans.poll_started(worker_id)
    try:
        return await _long_poll(c, worker_id, key, generation, deadline)
    finally:
        c.scans.poll_ended(worker_id)


def _supersede_polls(c, worker_id: str) -> int:
    """Start a new poll generation for `worker_id` and wake the polls of older
    ones, which then answer 204 and hand out nothing; returns the new one."""
    generation = c.poll_generation[worker_id] = c.poll_generation.get(worker_id, 0) + 1
    c.hub.notify([f"worker:{worker_id}"])
    return generation


async def _long_poll(c, worker_id: str, key: str, generation: int, deadline: float):
    while True:
        ev = c.hub.waiter(key)
        if c.poll_generation.get(worker_id) != generation:
            return _no_content()
        fresh, kills = await c.handout(worker_id)
        if c.poll_generation.get(worker_id) != generation:
            # superseded while reading: give the jobs back for the newer poll
            # (a kill due is stamped; it is handed out again after kill_redelivery)
            c.handouts.give_back(worker_id, fresh)
            c.hub.notify([key])
            return _no_content()
        starts = c.relay.starts_for(worker_id)  # sessions inside holds (rc.controller.relay)
        scans = c.scans.handout(worker_id)  # survivor scans (rc.controller.scans)
        if fresh or kills or starts or scans:
            return reply(
                Assignments(
                    tuple(with_log_offset(a, c.logs) for a in fresh), tuple(kills), starts, scans
                )
            )
        left = deadline - time.monotonic()
        if left <= 0 or c.hub.closing:
            return _no_content()
        try:
            await asyncio.wait_for(ev.wait(), left)
        except TimeoutError:
            return _no_content()


def _no_content():
    from starlette.responses import Response

    return Response(status_code=204)


async def recheck(request: Request):
    """POST /v1/workers/{worker_id}/recheck: a worker's periodic survivor
    scan. A proof that proves returns its devices out with survivors
    (registration, worker_lost, lease_expired, or a fault for processes that
    survived a teardown) under the recovery rules and flap guard
    (store.workers.recover); anything else changes nothing."""
    c = ctl(request)
    who = caller(request)
    worker_id = request.path_params["worker_id"]
    _bound(request, who, worker_id)
    req = await json_body(request, c.cfg.limits.body_bytes)
    back: list[str] = []
    if req.recovery.proves():
        back = await c.db.write(workers.recover, worker_id, req.recovery, c.thresholds, True)
    return reply(RecheckResponse(tuple(back)))


async def scan_result(request: Request):
    """POST /v1/workers/{worker_id}/scans/{scan_id}: a worker's answer to a
    survivor scan (rc.controller.scans); 404 not_found when no request
    waits for it any more."""
    c = ctl(request)
    who = caller(request)
    worker_id = request.path_params["worker_id"]
    _bound(request, who, worker_id)
    req = await json_body(request, c.cfg.limits.body_bytes)
    raw = request.path_params["scan_id"]
    scan_id = int(raw) if raw.isascii() and raw.isdigit() and len(raw) < 19 else 0
    if not c.scans.answer(worker_id, scan_id, req):
        raise Refused(ErrorCode.NOT_FOUND, f"no survivor scan {scan_id} waits for {worker_id}")
    return reply({"ok": True})


async def reports(request: Request):
    """POST /v1/workers/{worker_id}/reports: running and terminal reports, batched.

    With ?assignments=1 (worker protocol 2) the reply also carries every job
    assigned to the worker and not yet running (ReportResults.assignments),
    read after the reports' commit, whose scheduling pass gave the devices
    they freed their next jobs: a busy worker needs no long poll answer to
    get its next job. A long poll does not hand those out again.

    A report may carry its job's log tail (JobReport.log_offset/log_tail):
    each is stored through the log store as POST /v1/jobs/{id}/logs stores
    an upload, before the reports are applied, so a job's output is stored
    when its end is recorded; a refused tail (ReportResult.log_error) does
    not refuse its report."""
    c = ctl(request)
    who = caller(request)
    worker_id = request.path_params["worker_id"]
    _bound(request, who, worker_id)
    req = await json_body(request, c.cfg.limits.body_bytes)
    carry = query_bool(request, "assignments", False)
    limit = c.cfg.limits.text_bytes
    batch = tuple(
        dataclasses.replace(
            r,
            reason=cut_text(r.reason, limit),
            hardware_cause=cut_text(r.hardware_cause, limit),
        )
        for r in req.reports
    )
    carrying = [r for r in batch if r.log_offset is not None]
    # each to its own log file: their writes (each fdatasync'd) go side by side
    stored = await asyncio.gather(*(_store_tail(c, worker_id, r) for r in carrying))
    tails = {r.job_id: got for r, got in zip(carrying, stored, strict=True)}
    applied = await c.db.write(jobs.apply_reports, worker_id, batch)
    c.metrics.observe_starts(applied.start_latencies)
    carried: tuple[Assignment, ...] = ()
    if carry:
        carried = tuple(with_log_offset(a, c.logs) for a in await c.handout_assigned(worker_id))
    return reply(
        ReportResults(
            tuple(
                ReportResult(j, not code, code, msg, *tails.get(j, (None, "")))
                for j, code, msg in applied.results
            ),
            carried,
        )
    )


async def _store_tail(c, worker_id: str, r) -> tuple[int | None, str]:
    """Store the log tail report `r` carries (JobReport.log_tail) as an
    upload at its offset; (the log's end after it, "") or (None, the error
    code of the refusal)."""
    try:
        data = base64.b64decode(r.log_tail, validate=True)
    except (binascii.Error, ValueError):
        return None, ErrorCode.BAD_REQUEST
    if len(data) > LOG_TAIL_BYTES or r.log_offset < 0:
        return None, ErrorCode.LIMIT_EXCEEDED if r.log_offset >= 0 else ErrorCode.BAD_REQUEST
    try:
        await _check_log_target(c, r.job_id, worker_id)
        end = await c.logs.append(r.job_id, r.log_offset, data)
    except Refused as e:
        return None, e.code
    c.metrics.log_tails += 1
    return end, ""


async def _check_log_target(c, job_id: int, worker_id: str | None) -> None:
    """Whether output may be stored for job `job_id`, from worker `worker_id`
    (None: an admin's upload, from anywhere). Raises Refused: not_found,
    not_worker_job (it runs elsewhere), logs_not_stored (a terminal job)."""
    job = await c.db.read(jobs.brief, job_id)
    if job is None:
        raise Refused(ErrorCode.NOT_FOUND, f"no job {job_id}")
    if worker_id is not None and job.worker_id != worker_id:
        raise Refused(
            ErrorCode.NOT_WORKER_JOB, f"job {job_id} does not run on {worker_id or 'this worker'}"
        )
    if job.stdio == Stdio.TTY:
        raise Refused(
            ErrorCode.LOGS_NOT_STORED,
            f"job {job_id} is a terminal session; its output is not stored",
        )


async def append_log(request: Request):
    """POST /v1/jobs/{job_id}/logs?offset=N: append output starting at byte N."""
    c = ctl(request)
    who = caller(request)
    job_id = path_int(request)
    raw_offset = request.query_params.get("offset", "")
    if not (raw_offset.isascii() and raw_offset.isdigit()):
        raise Refused(ErrorCode.BAD_REQUEST, "offset must be a non-negative integer")
    await _check_log_target(c, job_id, who.host if who.role is Role.WORKER else None)
    data = await read_body(request, c.cfg.limits.log_chunk_bytes, ErrorCode.CHUNK_TOO_LARGE)
    end = await c.logs.append(job_id, int(raw_offset), data)
    c.metrics.log_uploads += 1
    return reply(LogAppended(end))


async def device_fault(request: Request):
    """POST /v1/devices/{device_id}/fault: quarantine a device as `fault`
    (with drain=true: drain it, as POST /v1/devices/{id}/drain does)."""
    c = ctl(request)
    who = caller(request)
    device_id = request.path_params["device_id"]
    req = await json_body(request, c.cfg.limits.body_bytes)
    if not req.reason.strip():
        raise Refused(ErrorCode.BAD_REQUEST, "a fault needs a reason")
    host = device_id.rpartition(":")[0]
    if who.role is Role.WORKER and who.host != host:
        raise Refused(
            ErrorCode.WRONG_HOST,
            f"worker token {who.name!r} may not fault {device_id} "
            f"(bound to {who.host or 'no host'})",
        )
    reason = cut_text(req.reason, c.cfg.limits.text_bytes)
    if req.drain:
        await c.db.write(devices.drain, device_id, True, reason, who.name)
    else:
        await c.db.write(devices.fault, device_id, reason, req.job_id, who.name)
    return reply({"ok": True})
