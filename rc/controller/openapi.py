"""The OpenAPI document served at GET /openapi.json (issue "Multi-user security").

Every route of the app has one `Doc` in ROUTES: who may call it, what it takes
and returns (rc.proto.wire records, turned into JSON Schema here), and the
errors it answers with. tests/test_openapi.py fails when a route of the app
has no entry (or an entry names no route), so the document cannot drift from
the code; schemathesis checks the live controller against it.
"""

from __future__ import annotations

import dataclasses
import enum
import types
import typing
from dataclasses import dataclass, field
from typing import Any

from rc import __version__
from rc.proto import model, wire
from rc.proto.errors import ErrorCode

__all__ = ["ROUTES", "Doc", "Param", "document", "schema_for"]

PUBLIC = "public"
ANY = ("user", "worker", "admin")


@dataclass(frozen=True, slots=True)
class Param:
    """A query parameter: name, JSON type ("integer", "string", "boolean"), description."""

    name: str
    type: str
    description: str
    required: bool = False


@dataclass(frozen=True, slots=True)
class Doc:
    """How one route behaves.

    roles: the token roles it accepts (admin always passes); ("public",) for no
    token. request/response: a wire record, "bytes" (raw body), "text"
    (text/plain), "sse", or None. errors: (status, code) pairs beyond the 401
    and 403 every authenticated route can answer.
    """

    summary: str
    roles: tuple[str, ...]
    response: Any = None
    status: int = 200
    request: Any = None
    errors: tuple[tuple[int, str], ...] = ()
    params: tuple[Param, ...] = ()
    path_params: dict[str, str] = field(default_factory=dict)


E = ErrorCode
BAD = ((400, E.BAD_REQUEST), (400, E.BAD_JSON), (413, E.BODY_TOO_LARGE))
NO_JOB = ((404, E.NOT_FOUND),)
JOB = {"job_id": "integer"}
DEVICE = {"device_id": "string"}
WORKER = {"worker_id": "string"}
WAIT = Param(
    "wait",
    "string",
    "long poll: answer when something changes, at most this long "
    "(a duration such as 30s; at most 60s)",
)

ROUTES: dict[tuple[str, str], Doc] = {
    # -- workers (inventory §3.2) ------------------------------------------------
    ("POST", "/v1/workers/register"): Doc(
        "A worker registers its host and devices (reconciles in-flight jobs)",
        ("worker",),
        wire.RegisterResponse,
        request=wire.RegisterRequest,
        errors=BAD + ((400, E.LIMIT_EXCEEDED), (413, E.SHEET_TOO_LARGE), (403, E.WRONG_HOST)),
    ),
    ("POST", "/v1/workers/{worker_id}/labels"): Doc(
        "Periodic re-probe: labels and usage sheets only",
        ("worker",),
        None,
        request=wire.LabelsRequest,
        path_params=WORKER,
        errors=BAD
        + (
            (400, E.LIMIT_EXCEEDED),
            (413, E.SHEET_TOO_LARGE),
            (403, E.WRONG_HOST),
            (404, E.NOT_FOUND),
        ),
    ),
    ("POST", "/v1/workers/{worker_id}/heartbeat"): Doc(
        "The worker is alive and names the jobs it supervises",
        ("worker",),
        wire.HeartbeatResponse,
        request=wire.HeartbeatRequest,
        path_params=WORKER,
        errors=BAD + ((403, E.WRONG_HOST), (404, E.NOT_FOUND)),
    ),
    ("POST", "/v1/workers/{worker_id}/leave"): Doc(
        "A worker stopping cleanly hands back the assigned jobs it never started",
        ("worker",),
        wire.LeaveResponse,
        request=wire.LeaveRequest,
        path_params=WORKER,
        errors=BAD + ((403, E.WRONG_HOST), (404, E.NOT_FOUND), (409, E.CONFLICT)),
    ),
    ("GET", "/v1/workers/{worker_id}/assignments"): Doc(
        "Long poll for new jobs and kill requests (204 after the wait)",
        ("worker",),
        wire.Assignments,
        params=(WAIT,),
        path_params=WORKER,
        errors=((400, E.BAD_REQUEST), (403, E.WRONG_HOST)),
    ),
    ("POST", "/v1/workers/{worker_id}/reports"): Doc(
        "Running and terminal reports, batched",
        ("worker",),
        wire.ReportResults,
        request=wire.Reports,
        path_params=WORKER,
        errors=BAD + ((403, E.WRONG_HOST),),
    ),
    ("POST", "/v1/jobs/{job_id}/status"): Doc(
        "One status report (inventory form)",
        ("worker",),
        None,
        request=wire.StatusReport,
        path_params=JOB,
        errors=BAD + NO_JOB + ((403, E.WRONG_HOST), (403, E.NOT_WORKER_JOB)),
    ),
    ("POST", "/v1/jobs/{job_id}/logs"): Doc(
        "Append output starting at byte `offset` (idempotent per offset)",
        ("worker",),
        wire.LogAppended,
        request="bytes",
        path_params=JOB,
        params=(Param("offset", "integer", "the stream offset this chunk starts at", True),),
        errors=(
            (400, E.BAD_REQUEST),
            (413, E.CHUNK_TOO_LARGE),
            (409, E.OFFSET_GAP),
            (409, E.LOGS_NOT_STORED),
            (403, E.NOT_WORKER_JOB),
        )
        + NO_JOB,
    ),
    ("POST", "/v1/devices/{device_id}/fault"): Doc(
        "Quarantine a device as `fault`",
        ("worker",),
        None,
        request=wire.FaultRequest,
        path_params=DEVICE,
        errors=BAD + ((403, E.WRONG_HOST), (404, E.DEVICE_NOT_FOUND)),
    ),
    # -- jobs (inventory §3.3) ---------------------------------------------------
    ("POST", "/v1/jobs"): Doc(
        "Submit a job or a hold (201; 200 for an idempotent replay)",
        ("user",),
        wire.JobView,
        status=201,
        request=wire.SubmitRequest,
        errors=BAD
        + (
            (400, E.PRIORITY_OUT_OF_RANGE),
            (400, E.BAD_SELECTOR),
            (400, E.RUNTIME_ABOVE_CEILING),
            (400, E.UNKNOWN_DEVICE),
            (400, E.NO_MATCHING_DEVICE),
            (400, E.LIMIT_EXCEEDED),
            (409, E.IDEMPOTENCY_CONFLICT),
            (409, E.NO_DEVICE_AVAILABLE),
            (429, E.QUEUE_FULL),
        ),
    ),
    ("GET", "/v1/jobs"): Doc(
        "Jobs, newest first (history included)",
        ("user",),
        wire.JobList,
        params=(
            Param("limit", "integer", "1..1000 (default 20)"),
            Param("device", "string", "only this device"),
            Param("submitter", "string", "only this submitter"),
            Param("state", "string", "only this state"),
            Param("before", "integer", "only ids below this (paging)"),
        ),
        errors=((400, E.BAD_REQUEST),),
    ),
    ("GET", "/v1/jobs/{job_id}"): Doc(
        "A job and its queue position (long poll with wait/state/position)",
        ("user",),
        wire.JobView,
        path_params=JOB,
        params=(
            WAIT,
            Param("state", "string", "the state the caller saw"),
            Param("position", "string", "the queue position the caller saw"),
        ),
        errors=NO_JOB + ((400, E.BAD_REQUEST),),
    ),
    ("POST", "/v1/jobs/{job_id}/kill"): Doc(
        "Kill or cancel a job (its owner, or an admin)",
        ("user",),
        wire.ActionResult,
        request=wire.KillRequest,
        path_params=JOB,
        errors=BAD + NO_JOB + ((403, E.NOT_JOB_OWNER), (409, E.NOT_CANCELLABLE)),
    ),
    ("GET", "/v1/jobs/{job_id}/logs"): Doc(
        "Stored output from byte `offset`; follows until the job ends unless follow=0",
        ("user",),
        "bytes",
        path_params=JOB,
        params=(
            Param("offset", "integer", "start at this byte"),
            Param("follow", "string", "1 (default) or 0"),
        ),
        errors=NO_JOB + ((400, E.BAD_REQUEST), (403, E.NOT_JOB_OWNER), (409, E.LOGS_NOT_STORED)),
    ),
    ("GET", "/v1/jobs/{job_id}/explain"): Doc(
        "Why a queued job is not running, in words",
        ("user",),
        wire.JobExplanation,
        path_params=JOB,
        errors=NO_JOB,
    ),
    # -- the fleet -----------------------------------------------------------------
    ("GET", "/v1/devices"): Doc(
        "Every device and who holds it",
        ("user", "worker"),
        wire.DeviceList,
        params=(Param("labels", "boolean", "include each device's labels (default true)"),),
        errors=((400, E.BAD_REQUEST),),
    ),
    ("GET", "/v1/devices/{device_id}/describe"): Doc(
        "Labels with source and age, usage sheet, recent jobs",
        ("user",),
        wire.DescribeResponse,
        path_params=DEVICE,
        errors=((404, E.DEVICE_NOT_FOUND),),
    ),
    ("GET", "/v1/explain"): Doc(
        "Which devices a selector matches, which are free, queue depth",
        ("user",),
        wire.ExplainResponse,
        params=(Param("selector", "string", "a label selector", True),),
        errors=((400, E.BAD_SELECTOR),),
    ),
    ("GET", "/v1/state"): Doc(
        "Devices, active jobs, the queue in scheduling order", ("user",), wire.StateResponse
    ),
    ("POST", "/v1/devices/{device_id}/clear"): Doc(
        "Return a quarantined device to the pool (admin)",
        ("admin",),
        wire.ActionResult,
        path_params=DEVICE,
        errors=((404, E.DEVICE_NOT_FOUND), (409, E.DEVICE_NOT_CLEARED)),
    ),
    ("DELETE", "/v1/devices/{device_id}"): Doc(
        "Retire a device (admin); job history stays",
        ("admin",),
        wire.ActionResult,
        path_params=DEVICE,
        errors=((404, E.DEVICE_NOT_FOUND), (409, E.DEVICE_BUSY)),
    ),
    ("POST", "/v1/devices/{device_id}/drain"): Doc(
        "Drain: the current job finishes, no new one starts (admin)",
        ("admin",),
        wire.ActionResult,
        request=wire.DrainRequest,
        path_params=DEVICE,
        errors=BAD + ((404, E.DEVICE_NOT_FOUND),),
    ),
    ("POST", "/v1/devices/{device_id}/undrain"): Doc(
        "Put a drained device back in the pool (admin)",
        ("admin",),
        wire.ActionResult,
        path_params=DEVICE,
        errors=((404, E.DEVICE_NOT_FOUND),),
    ),
    # -- identity, tokens, feed ------------------------------------------------------
    ("GET", "/v1/whoami"): Doc("The caller's token name and role", ("user", "worker"), wire.WhoAmI),
    ("POST", "/v1/tokens"): Doc(
        "Create a token (admin); the only response carrying its secret",
        ("admin",),
        wire.TokenCreated,
        status=201,
        request=wire.TokenCreate,
        errors=BAD + ((409, E.TOKEN_EXISTS),),
    ),
    ("GET", "/v1/tokens"): Doc("Tokens without their secrets (admin)", ("admin",), wire.TokenList),
    ("DELETE", "/v1/tokens/{name}"): Doc(
        "Revoke a token (admin); its name's queued jobs are cancelled unless keep_jobs",
        ("admin",),
        wire.TokenRevoked,
        path_params={"name": "string"},
        params=(
            Param(
                "keep_jobs",
                "boolean",
                "leave the queued jobs and holds of the token's name queued "
                '(default false: they are cancelled, "token revoked")',
            ),
        ),
        errors=((400, E.BAD_REQUEST), (404, E.NOT_FOUND), (409, E.LAST_ADMIN_TOKEN)),
    ),
    ("GET", "/v1/events"): Doc(
        "The activity feed, oldest first (long poll with after/wait)",
        ("user",),
        wire.EventList,
        params=(
            Param("after", "integer", "only events with a larger id"),
            Param("since", "string", "only events of the last D (a duration)"),
            Param("limit", "integer", "1..1000 (default 100)"),
            WAIT,
        ),
        errors=((400, E.BAD_REQUEST),),
    ),
    ("GET", "/v1/events/stream"): Doc(
        "Live updates as Server-Sent Events: `change` nudges and new feed rows "
        "(the only route that also takes ?token=)",
        ("user",),
        "sse",
        params=(
            Param("after", "integer", "resume after this event id (or send Last-Event-ID)"),
            Param("token", "string", "the bearer token, for EventSource (this route only)"),
        ),
        errors=((400, E.BAD_REQUEST), (503, E.UNAVAILABLE)),
    ),
    ("GET", "/metrics"): Doc("Prometheus metrics in the text format", ANY, "text"),
    ("GET", "/"): Doc(
        "The dashboard: one self-contained page; it asks for a token", (PUBLIC,), "html"
    ),
    ("GET", "/openapi.json"): Doc("This document", (PUBLIC,), "json"),
}

# -- the relay and sessions inside holds (issue 6) -------------------------------------
SESSION = {"job_id": "integer", "sid": "integer"}
_HALF = NO_JOB + (
    (409, E.NOT_ATTACHED),
    (409, E.SESSION_ENDED),
    (409, E.CONFLICT),
    (429, E.LIMIT_EXCEEDED),
)
for _prefix, _pp, _what in (
    ("/v1/jobs/{job_id}", JOB, "a tty or pipe job"),
    ("/v1/jobs/{job_id}/sessions/{sid}", SESSION, "a session in a hold"),
):
    ROUTES.update(
        {
            ("GET", f"{_prefix}/tty/out"): Doc(
                f"Client half: the output of {_what}, streamed raw until it ends (a stream cut "
                "without its last chunk means the session broke)",
                ("user",),
                "bytes",
                path_params=_pp,
                errors=_HALF + ((403, E.NOT_JOB_OWNER),),
            ),
            ("POST", f"{_prefix}/tty/in"): Doc(
                f"Client half: input for {_what}, a streamed body (tty: JSON frames, one a line; "
                "pipe: raw); answered at once, ended by one JSON line",
                ("user",),
                "json",
                request="bytes",
                path_params=_pp,
                errors=_HALF + ((403, E.NOT_JOB_OWNER),),
            ),
            ("POST", f"{_prefix}/tty/out"): Doc(
                f"Worker half: the output of {_what}, a streamed raw body; answered at once, "
                'ended by one JSON line ({"ended": why} when the session ended first)',
                ("worker",),
                "json",
                request="bytes",
                path_params=_pp,
                errors=_HALF + ((403, E.NOT_WORKER_JOB),),
            ),
            ("GET", f"{_prefix}/tty/in"): Doc(
                f"Worker half: the input of {_what}, streamed",
                ("worker",),
                "bytes",
                path_params=_pp,
                errors=_HALF + ((403, E.NOT_WORKER_JOB),),
            ),
        }
    )
ROUTES.update(
    {
        ("POST", "/v1/jobs/{job_id}/sessions"): Doc(
            "Start a tty or pipe session inside a running hold you own (no second lease)",
            ("user",),
            wire.SessionView,
            status=201,
            request=wire.SessionRequest,
            path_params=JOB,
            errors=BAD
            + NO_JOB
            + (
                (403, E.NOT_JOB_OWNER),
                (409, E.NOT_A_HOLD),
                (409, E.SESSION_ENDED),
                (400, E.LIMIT_EXCEEDED),
                (429, E.LIMIT_EXCEEDED),
            ),
        ),
        ("GET", "/v1/jobs/{job_id}/sessions/{sid}"): Doc(
            "A session in a hold: state, exit code, a pipe session's stderr (long poll with "
            "wait/state)",
            ("user",),
            wire.SessionView,
            path_params=SESSION,
            params=(WAIT, Param("state", "string", "the state the caller saw")),
            errors=NO_JOB + ((400, E.BAD_REQUEST), (403, E.NOT_JOB_OWNER)),
        ),
        ("POST", "/v1/jobs/{job_id}/sessions/{sid}/status"): Doc(
            "The hold's worker reports a session running, or ended with its exit code",
            ("worker",),
            None,
            request=wire.SessionReport,
            path_params=SESSION,
            errors=BAD + NO_JOB + ((403, E.NOT_WORKER_JOB),),
        ),
    }
)


# -- JSON Schema of the wire records ---------------------------------------------


def schema_for(tp: Any, components: dict[str, Any]) -> dict[str, Any]:
    """JSON Schema of an annotation; dataclasses go into `components`."""
    if dataclasses.is_dataclass(tp):
        name = tp.__name__
        if name not in components:
            components[name] = {}  # recursion guard
            hints = typing.get_type_hints(tp)
            props, required = {}, []
            for f in dataclasses.fields(tp):
                props[f.name] = schema_for(hints[f.name], components)
                if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                    required.append(f.name)
            body: dict[str, Any] = {
                "type": "object",
                "properties": props,
                "additionalProperties": False,
            }
            if required:
                body["required"] = required
            if tp.__doc__:
                body["description"] = " ".join(tp.__doc__.split())
            components[name] = body
        return {"$ref": f"#/components/schemas/{name}"}
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        inner = [schema_for(a, components) for a in args if a is not type(None)]
        out = inner[0] if len(inner) == 1 else {"anyOf": inner}
        if type(None) in args:
            return {"anyOf": [out, {"type": "null"}]}
        return out
    if origin is tuple:
        return {"type": "array", "items": schema_for(typing.get_args(tp)[0], components)}
    if origin is dict:
        return {
            "type": "object",
            "additionalProperties": schema_for(typing.get_args(tp)[1], components),
        }
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return {"type": "string", "enum": [m.value for m in tp]}
    return {
        str: {"type": "string"},
        int: {"type": "integer"},
        float: {"type": "number"},
        bool: {"type": "boolean"},
        Any: {},
    }[tp]


_ERROR = {
    "type": "object",
    "properties": {
        "error": {"type": "string", "enum": [c.value for c in ErrorCode]},
        "message": {"type": "string"},
    },
    "required": ["error", "message"],
    "additionalProperties": False,
}


def _content(kind: Any, components: dict[str, Any]) -> dict[str, Any]:
    if kind == "bytes":
        return {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}
    if kind == "text":
        return {"text/plain": {"schema": {"type": "string"}}}
    if kind == "html":
        return {"text/html": {"schema": {"type": "string"}}}
    if kind == "sse":
        return {"text/event-stream": {"schema": {"type": "string"}}}
    if kind == "json":
        return {"application/json": {"schema": {"type": "object"}}}
    return {"application/json": {"schema": schema_for(kind, components)}}


def document() -> dict[str, Any]:
    """The OpenAPI 3.1 document for ROUTES."""
    components: dict[str, Any] = {"Error": _ERROR}
    for cls in (model.Job, model.Device):
        schema_for(cls, components)
    paths: dict[str, Any] = {}
    for (method, path), doc in sorted(ROUTES.items()):
        op: dict[str, Any] = {"summary": doc.summary, "operationId": _op_id(method, path)}
        public = doc.roles == (PUBLIC,)
        if public:
            op["security"] = []
        else:
            op["security"] = [{"bearer": []}]
            op["description"] = "Token roles: " + ", ".join(doc.roles) + " (admin always passes)."
        params = [
            {"name": n, "in": "path", "required": True, "schema": {"type": t}}
            for n, t in doc.path_params.items()
        ]
        params += [
            {
                "name": p.name,
                "in": "query",
                "required": p.required,
                "description": p.description,
                "schema": {"type": p.type},
            }
            for p in doc.params
        ]
        if params:
            op["parameters"] = params
        if doc.request is not None:
            op["requestBody"] = {
                "required": doc.request == "bytes",
                "content": _content(doc.request, components),
            }
        responses: dict[str, Any] = {}
        ok: dict[str, Any] = {"description": "success"}
        if doc.response is not None:
            ok["content"] = _content(doc.response, components)
        responses[str(doc.status)] = ok
        if doc.response is wire.Assignments:
            responses["204"] = {"description": "nothing to do before the wait ended"}
        errors = list(doc.errors)
        if not public:
            errors += [(401, E.UNAUTHORIZED), (403, E.FORBIDDEN)]
        errors += [(404, E.NOT_FOUND), (405, E.METHOD_NOT_ALLOWED)] if doc.path_params else []
        for status in sorted({s for s, _ in errors}):
            codes = sorted({str(c) for s, c in errors if s == status})
            responses[str(status)] = {
                "description": "error: " + ", ".join(codes),
                "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}},
            }
        op["responses"] = responses
        paths.setdefault(path, {})[method.lower()] = op
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "rc controller API",
            "version": __version__,
            "description": "rc shares a lab's GPUs. Every error is "
            '{"error": code, "message": text}; every response carries '
            "the Rc-Controller-Instance header.",
        },
        "paths": paths,
        "components": {
            "schemas": components,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
    }


def _op_id(method: str, path: str) -> str:
    words = [w.strip("{}") for w in path.split("/") if w and w != "v1"]
    return method.lower() + "_" + "_".join(words).replace(".", "_")
