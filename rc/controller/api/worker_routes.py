"""The worker protocol's routes (register, labels, heartbeat, leave, the
long poll, reports, log appends, scans, faults): the first part of
rc.controller.api.routes.ROUTES, declared as every route is there."""

from __future__ import annotations

from rc.controller.api import workers
from rc.controller.api.endpoint import BAD, WAIT, WORKER, Endpoint, Param
from rc.proto import wire
from rc.proto.errors import ErrorCode as E

__all__ = ["WORKER_ROUTES"]

WORKER_ROUTES: tuple[Endpoint, ...] = (
    Endpoint(
        "POST",
        "/v1/workers/register",
        workers.register,
        WORKER,
        "A worker registers its host and devices (reconciles in-flight jobs)",
        wire.RegisterResponse,
        request=wire.RegisterRequest,
        errors=(*BAD, E.LIMIT_EXCEEDED, E.SHEET_TOO_LARGE, E.WRONG_HOST),
    ),
    Endpoint(
        "POST",
        "/v1/workers/{worker_id}/labels",
        workers.labels,
        WORKER,
        "Periodic re-probe: labels and usage sheets only",
        request=wire.LabelsRequest,
        errors=(*BAD, E.LIMIT_EXCEEDED, E.SHEET_TOO_LARGE, E.WRONG_HOST, E.NOT_FOUND),
    ),
    Endpoint(
        "POST",
        "/v1/workers/{worker_id}/heartbeat",
        workers.heartbeat,
        WORKER,
        "The worker is alive and names the jobs it supervises",
        wire.HeartbeatResponse,
        request=wire.HeartbeatRequest,
        errors=(*BAD, E.WRONG_HOST, E.NOT_FOUND),
    ),
    Endpoint(
        "POST",
        "/v1/workers/{worker_id}/leave",
        workers.leave,
        WORKER,
        "A worker stopping cleanly hands back the assigned jobs it never started",
        wire.LeaveResponse,
        request=wire.LeaveRequest,
        errors=(*BAD, E.WRONG_HOST, E.NOT_FOUND, E.CONFLICT),
    ),
    Endpoint(
        "GET",
        "/v1/workers/{worker_id}/assignments",
        workers.assignments,
        WORKER,
        "Long poll for new jobs and kill requests (204 after the wait)",
        wire.Assignments,
        params=(WAIT,),
        errors=(E.BAD_REQUEST, E.WRONG_HOST),
    ),
    Endpoint(
        "POST",
        "/v1/workers/{worker_id}/recheck",
        workers.recheck,
        WORKER,
        "A worker's periodic survivor scan: a clean one returns its devices out with survivors",
        wire.RecheckResponse,
        request=wire.RecheckRequest,
        errors=(*BAD, E.WRONG_HOST),
    ),
    Endpoint(
        "POST",
        "/v1/workers/{worker_id}/scans/{scan_id}",
        workers.scan_result,
        WORKER,
        "A worker's answer to a survivor scan (rc clear, rc kill of a lost job)",
        "json",
        request=wire.ScanResult,
        errors=(*BAD, E.WRONG_HOST, E.NOT_FOUND),
    ),
    Endpoint(
        "POST",
        "/v1/workers/{worker_id}/reports",
        workers.reports,
        WORKER,
        "Running and terminal reports, batched",
        wire.ReportResults,
        request=wire.Reports,
        params=(
            Param(
                "assignments",
                "boolean",
                "worker protocol 2: the reply carries the jobs assigned and not yet running",
            ),
        ),
        errors=(*BAD, E.WRONG_HOST),
    ),
    Endpoint(
        "POST",
        "/v1/jobs/{job_id}/logs",
        workers.append_log,
        WORKER,
        "Append output starting at byte `offset` (idempotent per offset)",
        wire.LogAppended,
        request="bytes",
        params=(Param("offset", "integer", "the stream offset this chunk starts at", True),),
        errors=(
            E.BAD_REQUEST,
            E.CHUNK_TOO_LARGE,
            E.OFFSET_GAP,
            E.LOGS_NOT_STORED,
            E.NOT_WORKER_JOB,
            E.NOT_FOUND,
        ),
    ),
    Endpoint(
        "POST",
        "/v1/devices/{device_id}/fault",
        workers.device_fault,
        WORKER,
        "Quarantine a device as `fault` (with drain: drain it; GPU health rules)",
        request=wire.FaultRequest,
        errors=(*BAD, E.WRONG_HOST, E.DEVICE_NOT_FOUND),
    ),
)
