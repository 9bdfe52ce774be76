"""The route table: every endpoint of the controller's HTTP API, declared once.

Each `Endpoint` (rc.controller.api.endpoint) names its method, path, handler,
the token roles it admits (admin always passes), what it takes and returns,
its query parameters and the errors it answers with. rc.controller.app builds
the Starlette routes from ROUTES, each behind its role check (the worker
protocol's come first, from rc.controller.api.worker_routes);
rc.controller.openapi writes /openapi.json from it; tests/e2e/test_auth_matrix.py
checks every route against nine kinds of caller by it. A code's HTTP status
is its own in rc.proto.errors.STATUS; `(429, E.LIMIT_EXCEEDED)` names that
code's second status.
"""

from __future__ import annotations

from rc.controller import dashboard
from rc.controller.api import (
    admin,
    devices,
    docs,
    jobs,
    metrics,
    relay,
    signin,
    stream,
    usage,
)
from rc.controller.api.endpoint import ADMIN, ANY, BAD, PUBLIC, USER, WAIT, WORKER, Endpoint, Param
from rc.controller.api.worker_routes import WORKER_ROUTES
from rc.proto import wire
from rc.proto.errors import ErrorCode as E

__all__ = ["ROUTES"]

HALF = (E.NOT_FOUND, E.NOT_ATTACHED, E.SESSION_ENDED, E.CONFLICT, (429, E.LIMIT_EXCEEDED))
"""What a relay half may answer: no such job or session, no terminal or pipe,
the session ended, the half already connected, too many sessions open."""


def _halves(prefix: str, what: str, in_hold: bool) -> tuple[Endpoint, ...]:
    """The four streamed halves of a terminal or pipe session under `prefix`."""
    return (
        Endpoint(
            "GET",
            f"{prefix}/tty/out",
            relay.Half("client_out", in_hold),
            USER,
            f"Client half: the output of {what}, streamed raw until it ends (a stream cut "
            "without its last chunk means the session broke)",
            "bytes",
            errors=(*HALF, E.NOT_JOB_OWNER),
        ),
        Endpoint(
            "POST",
            f"{prefix}/tty/in",
            relay.Half("client_in", in_hold),
            USER,
            f"Client half: input for {what}, a streamed body (tty: JSON frames, one a line; "
            "pipe: raw); answered at once, ended by one JSON line",
            "json",
            request="bytes",
            errors=(*HALF, E.NOT_JOB_OWNER),
        ),
        Endpoint(
            "POST",
            f"{prefix}/tty/out",
            relay.Half("worker_out", in_hold),
            WORKER,
            f"Worker half: the output of {what}, a streamed raw body; answered at once, "
            'ended by one JSON line ({"ended": why} when the session ended first)',
            "json",
            request="bytes",
            errors=(*HALF, E.NOT_WORKER_JOB),
        ),
        Endpoint(
            "GET",
            f"{prefix}/tty/in",
            relay.Half("worker_in", in_hold),
            WORKER,
            f"Worker half: the input of {what}, streamed",
            "bytes",
            errors=(*HALF, E.NOT_WORKER_JOB),
        ),
    )


ROUTES: tuple[Endpoint, ...] = (
    # -- workers (rc.controller.api.worker_routes) -------------------------------------
    *WORKER_ROUTES,
    # -- jobs (rc.controller.api.jobs) ------------------------------------------------
    Endpoint(
        "POST",
        "/v1/jobs",
        jobs.submit,
        USER,
        "Submit a job or a hold (201; 200 for an idempotent replay)",
        wire.JobView,
        status=201,
        request=wire.SubmitRequest,
        errors=(
            *BAD,
            E.PRIORITY_OUT_OF_RANGE,
            E.BAD_SELECTOR,
            E.RUNTIME_ABOVE_CEILING,
            E.UNKNOWN_DEVICE,
            E.NO_MATCHING_DEVICE,
            E.LIMIT_EXCEEDED,
            E.IDEMPOTENCY_CONFLICT,
            E.NO_DEVICE_AVAILABLE,
            E.QUEUE_FULL,
            E.QUEUED_SPEC_BYTES,
        ),
    ),
    Endpoint(
        "GET",
        "/v1/jobs",
        jobs.list_jobs,
        USER,
        "Jobs, newest first (history included); commands and reasons cut to 256 characters",
        wire.JobList,
        params=(
            Param("limit", "integer", "1..1000 (default 20)"),
            Param("device", "string", "only jobs with this device among theirs"),
            Param("user", "string", "only jobs run as this Unix user (the person)"),
            Param("submitter", "string", "the older name of user"),
            Param("mine", "boolean", "only the jobs the caller owns (its principal)"),
            Param("state", "string", "only these states (a comma list)"),
            Param("name", "string", "only names matching this GLOB (* ? [..])"),
            Param("since", "number", "only jobs submitted at or after (seconds since the epoch)"),
            Param("before", "integer", "only ids below this (keyset paging: next_before)"),
            Param("array", "integer", "only the elements of this array"),
        ),
        errors=(E.BAD_REQUEST,),
    ),
    Endpoint(
        "GET",
        "/v1/jobs/{job_id}",
        jobs.get_job,
        USER,
        "A job and its queue position (long poll with wait/state/position)",
        wire.JobView,
        params=(
            WAIT,
            Param("state", "string", "the state the caller saw"),
            Param("position", "string", "the queue position the caller saw"),
            Param("detail", "boolean", "add what rc show prints (not with wait)"),
        ),
        errors=(E.NOT_FOUND, E.BAD_REQUEST),
    ),
    Endpoint(
        "POST",
        "/v1/jobs/{job_id}/kill",
        jobs.kill,
        USER,
        "Kill or cancel a job (its owner, or an admin)",
        wire.ActionResult,
        request=wire.KillRequest,
        errors=(*BAD, E.NOT_FOUND, E.NOT_JOB_OWNER, E.NOT_CANCELLABLE),
    ),
    Endpoint(
        "POST",
        "/v1/jobs/kill",
        jobs.kill_many,
        USER,
        "Kill or cancel many jobs in one transaction; each id's outcome in the answer",
        wire.KillManyResult,
        request=wire.KillManyRequest,
        errors=(*BAD, E.LIMIT_EXCEEDED),
    ),
    Endpoint(
        "GET",
        "/v1/arrays/{array_id}",
        jobs.get_array,
        USER,
        "An array summed up: counts by state, failed indices, wall time",
        wire.ArraySummary,
        errors=(E.NOT_FOUND, E.BAD_REQUEST),
    ),
    Endpoint(
        "POST",
        "/v1/jobs/{job_id}/extend",
        jobs.extend,
        USER,
        "Add to a hold's ttl, up to the ceiling of its devices (its owner, or an admin)",
        wire.ExtendResult,
        request=wire.ExtendRequest,
        errors=(
            *BAD,
            E.NOT_FOUND,
            E.NOT_JOB_OWNER,
            E.NOT_A_HOLD,
            E.NOT_CANCELLABLE,
            E.RUNTIME_ABOVE_CEILING,
            E.NO_MATCHING_DEVICE,
        ),
    ),
    Endpoint(
        "POST",
        "/v1/jobs/{job_id}/update",
        jobs.update,
        USER,
        "Change a queued job: priority, name, max runtime (shorter; longer is an admin's), "
        "stash, begin time (its owner, or an admin)",
        wire.JobView,
        request=wire.UpdateRequest,
        errors=(
            *BAD,
            E.NOT_FOUND,
            E.NOT_JOB_OWNER,
            E.NOT_CANCELLABLE,
            E.PRIORITY_OUT_OF_RANGE,
            E.PRIORITY_NOT_ALLOWED,
            E.RUNTIME_ABOVE_CEILING,
            E.NO_MATCHING_DEVICE,
            E.BAD_SELECTOR,
            E.LIMIT_EXCEEDED,
        ),
    ),
    Endpoint(
        "GET",
        "/v1/jobs/{job_id}/logs",
        jobs.read_logs,
        USER,
        "Stored output from byte `offset`; follows until the job ends unless follow=0",
        "bytes",
        params=(
            Param("offset", "integer", "start at this byte"),
            Param("follow", "string", "1 (default) or 0"),
        ),
        errors=(E.NOT_FOUND, E.BAD_REQUEST, E.NOT_JOB_OWNER, E.LOGS_NOT_STORED),
    ),
    Endpoint(
        "GET",
        "/v1/jobs/{job_id}/explain",
        jobs.explain_job,
        USER,
        "Why a queued job is not running, in words",
        wire.JobExplanation,
        errors=(E.NOT_FOUND,),
    ),
    # -- the fleet (rc.controller.api.devices) -----------------------------------------
    Endpoint(
        "GET",
        "/v1/devices",
        devices.list_devices,
        ANY,
        "Every device and who holds it",
        wire.DeviceList,
        params=(Param("labels", "boolean", "include each device's labels (default true)"),),
        errors=(E.BAD_REQUEST,),
    ),
    Endpoint(
        "GET",
        "/v1/devices/{device_id}/describe",
        devices.describe,
        USER,
        "Labels with source and age, usage sheet, recent jobs",
        wire.DescribeResponse,
        errors=(E.DEVICE_NOT_FOUND,),
    ),
    Endpoint(
        "GET",
        "/v1/explain",
        devices.explain,
        USER,
        "Which devices a selector matches, which are free, queue depth",
        wire.ExplainResponse,
        params=(Param("selector", "string", "a label selector", True),),
        errors=(E.BAD_SELECTOR,),
    ),
    Endpoint(
        "GET",
        "/v1/state",
        devices.state,
        USER,
        "Devices, active jobs, the queue in scheduling order; commands and reasons cut to 256 characters",
        wire.StateResponse,
    ),
    Endpoint(
        "POST",
        "/v1/devices/{device_id}/clear",
        devices.clear,
        ADMIN,
        "Return a quarantined device to the pool once its worker's survivor scan "
        "finds nothing (admin)",
        wire.ActionResult,
        request=wire.ClearRequest,
        errors=(
            *BAD,
            E.DEVICE_NOT_FOUND,
            E.DEVICE_NOT_CLEARED,
            E.SURVIVORS_FOUND,
            E.SCAN_UNAVAILABLE,
        ),
    ),
    Endpoint(
        "DELETE",
        "/v1/devices/{device_id}",
        devices.retire,
        ADMIN,
        "Retire a device (admin); job history stays",
        wire.ActionResult,
        errors=(E.DEVICE_NOT_FOUND, E.DEVICE_BUSY),
    ),
    Endpoint(
        "POST",
        "/v1/devices/{device_id}/drain",
        devices.drain,
        ADMIN,
        "Drain: the current job finishes, no new one starts (admin)",
        wire.ActionResult,
        request=wire.DrainRequest,
        errors=(*BAD, E.DEVICE_NOT_FOUND),
    ),
    Endpoint(
        "POST",
        "/v1/devices/{device_id}/undrain",
        devices.undrain,
        ADMIN,
        "Put a drained device back in the pool (admin); one a GPU health rule "
        "drained once its fresh reading shows the rule clean",
        wire.ActionResult,
        request=wire.UndrainRequest,
        errors=(*BAD, E.DEVICE_NOT_FOUND, E.DEVICE_NOT_CLEARED, E.SCAN_UNAVAILABLE),
    ),
    # -- the usage ledger and fair share (rc.controller.api.usage) ----------------------
    Endpoint(
        "GET",
        "/v1/usage",
        usage.get_usage,
        USER,
        "The usage ledger: device-time, jobs and holds by state, waits, idle hold time",
        wire.UsageReport,
        params=(
            Param("by", "string", "user (default), host, device, day or week"),
            Param("since", "string", "the window: the last D (a duration; default 30d)"),
            Param("user", "string", "only this user's"),
        ),
        errors=(E.BAD_REQUEST,),
    ),
    Endpoint(
        "GET",
        "/v1/usage/chart.svg",
        usage.usage_chart,
        USER,
        "The dashboard's usage picture: device-hours per user per day, queue wait per day",
        "svg",
        params=(Param("days", "integer", "1..90 (default 14)"),),
        errors=(E.BAD_REQUEST,),
    ),
    Endpoint(
        "GET",
        "/v1/shares",
        usage.list_shares,
        USER,
        "Fair share: weights, entitlements, decayed usage and each user's adjustment",
        wire.ShareList,
    ),
    Endpoint(
        "POST",
        "/v1/shares/{user}",
        usage.set_share,
        ADMIN,
        "Set a user's fair-share weight (admin; 1 is the default)",
        wire.ShareList,
        request=wire.ShareSet,
        errors=(*BAD,),
    ),
    # -- identity, tokens, feed (rc.controller.api.admin, .stream) ---------------------
    Endpoint(
        "GET", "/v1/whoami", admin.whoami, ANY, "The caller's token name and role", wire.WhoAmI
    ),
    Endpoint(
        "POST",
        "/v1/tokens",
        admin.create_token,
        ADMIN,
        "Create a token (admin); the only response carrying its secret",
        wire.TokenCreated,
        status=201,
        request=wire.TokenCreate,
        errors=(*BAD, E.TOKEN_EXISTS),
    ),
    Endpoint(
        "GET",
        "/v1/tokens",
        admin.list_tokens,
        ADMIN,
        "Tokens without their secrets (admin)",
        wire.TokenList,
    ),
    Endpoint(
        "POST",
        "/v1/tokens/{name}/rotate",
        admin.rotate_token,
        ADMIN,
        "A new secret for a token (admin): the old one stops working, the token keeps its "
        "jobs (the same principal); the only response carrying the new secret",
        wire.TokenCreated,
        errors=(E.NOT_FOUND,),
    ),
    Endpoint(
        "DELETE",
        "/v1/tokens/{name}",
        admin.revoke_token,
        ADMIN,
        "Revoke a token (admin); its name's queued jobs are cancelled unless keep_jobs",
        wire.TokenRevoked,
        params=(
            Param(
                "keep_jobs",
                "boolean",
                "leave the queued jobs and holds of the token's name queued "
                '(default false: they are cancelled, "token revoked")',
            ),
        ),
        errors=(E.BAD_REQUEST, E.NOT_FOUND, E.LAST_ADMIN_TOKEN),
    ),
    Endpoint(
        "GET",
        "/v1/events",
        admin.events,
        USER,
        "The activity feed, oldest first (long poll with after/wait); texts cut to 256 characters",
        wire.EventList,
        params=(
            Param("after", "integer", "only events with a larger id"),
            Param("since", "string", "only events of the last D (a duration)"),
            Param("limit", "integer", "1..1000 (default 100)"),
            WAIT,
        ),
        errors=(E.BAD_REQUEST,),
    ),
    Endpoint(
        "GET",
        "/v1/events/stream",
        stream.stream,
        USER,
        "Live updates as Server-Sent Events: `change` nudges and new feed rows "
        "(the only route that also takes ?token=)",
        "sse",
        params=(
            Param("after", "integer", "resume after this event id (or send Last-Event-ID)"),
            Param("token", "string", "the bearer token, for EventSource (this route only)"),
        ),
        errors=(E.BAD_REQUEST, E.UNAVAILABLE),
        query_token=True,
    ),
    # -- metrics, the dashboard page, this API's document ------------------------------
    Endpoint(
        "GET",
        "/metrics",
        metrics.metrics,
        ANY,
        "Prometheus metrics in the text format",
        "text",
    ),
    Endpoint(
        "GET",
        "/",
        dashboard.dashboard,
        PUBLIC,
        "The dashboard: one self-contained page; it asks for a token",
        "html",
    ),
    Endpoint("GET", "/openapi.json", docs.openapi_json, PUBLIC, "This document", "json"),
    Endpoint(
        "POST",
        "/v1/dashboard/code",
        signin.mint_code,
        USER,
        "A one-time code (valid 120 s, once) that opens a dashboard session acting as "
        "the caller (rc dashboard)",
        wire.SignInCode,
        status=201,
    ),
    Endpoint(
        "POST",
        "/v1/dashboard/session",
        signin.open_session,
        PUBLIC,
        "Spend a one-time code for a dashboard session token (no token: the code is "
        "the credential)",
        wire.SignInSession,
        status=201,
        request=wire.SignInRequest,
        errors=(*BAD, E.UNAUTHORIZED),
    ),
    # -- the relay and sessions inside holds (rc.controller.api.relay) -----------------
    *_halves("/v1/jobs/{job_id}", "a tty or pipe job", in_hold=False),
    *_halves("/v1/jobs/{job_id}/sessions/{sid}", "a session in a hold", in_hold=True),
    Endpoint(
        "POST",
        "/v1/jobs/{job_id}/sessions",
        relay.open_session,
        USER,
        "Start a tty or pipe session inside a running hold you own (no second lease)",
        wire.SessionView,
        status=201,
        request=wire.SessionRequest,
        errors=(
            *BAD,
            E.NOT_FOUND,
            E.NOT_JOB_OWNER,
            E.NOT_A_HOLD,
            E.SESSION_ENDED,
            E.LIMIT_EXCEEDED,
            (429, E.LIMIT_EXCEEDED),
        ),
    ),
    Endpoint(
        "GET",
        "/v1/jobs/{job_id}/sessions/{sid}",
        relay.get_session,
        USER,
        "A session in a hold: state, exit code, a pipe session's stderr (long poll with "
        "wait/state)",
        wire.SessionView,
        params=(WAIT, Param("state", "string", "the state the caller saw")),
        errors=(E.NOT_FOUND, E.BAD_REQUEST, E.NOT_JOB_OWNER),
    ),
    Endpoint(
        "POST",
        "/v1/jobs/{job_id}/sessions/{sid}/status",
        relay.report_session,
        WORKER,
        "The hold's worker reports a session running, or ended with its exit code",
        request=wire.SessionReport,
        errors=(*BAD, E.NOT_FOUND, E.NOT_WORKER_JOB),
    ),
)
