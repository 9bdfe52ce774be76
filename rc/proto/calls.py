"""The client vocabulary: every route of the controller a client calls, typed.

One `Call` per route the worker (rc.worker) or the CLI (rc.cli) sends: its
method, its path template, what it takes and what it answers, and the query
parameters it reads. `request` and `response` are as the route table declares
them (rc.controller.api.routes.ROUTES, which tests/unit/test_layout.py holds this
module equal to): a record of rc.proto.wire, "bytes" (a raw body), "json" (an
untyped JSON object) or None (no body; a POST without a record sends `{}`, an
answer without one is `{"ok": true}`).

A caller names the call and its path parameters, in the template's order,
and never writes a path:

    view = client.call(calls.JOB_GET, job_id, params={"detail": "1"})
    client.call(calls.LABELS, worker_id, body=LabelsRequest(...))
    client.call(calls.JOB_KILL, job_id, body={"reason": why})

(rc.proto.client.Client.call; `call_response` gives the whole Response,
`call_stream` the chunks of a streamed answer.) Path parameters are
percent-encoded (`Call.target`): a device id, a token or user name as typed
stays one segment, `rc clear 'gpu1:gpu0/drain?'` names a device, never
another route. A body is the route's record (encoded with rc.proto.codec) or
a dict of some of its fields (the others take the record's defaults on the
controller); "bytes" takes bytes. A body, a query parameter or a number of
path parameters the route does not take raises TypeError before anything is
sent: that is a bug in the caller, never bad input.

The relayed streams (a tty or pipe job, a session inside a hold) have four
halves each, grouped as a `Relay`; rc.proto.relay's Upload and Download dial
them at the paths `Relay.at(...)` gives.

Every call may answer the error shape (rc.proto.errors: ApiError with the
code) with 401 (no valid token), 403 (a role the route does not admit) and,
for a path with parameters, 404; each entry below names the refusals of its
own that callers handle. Times are seconds since the epoch, durations seconds,
sizes bytes, unless an entry says otherwise. Standard library only.
"""

from __future__ import annotations

import dataclasses
import re
import urllib.parse
from dataclasses import dataclass
from typing import Any

from rc.proto import wire
from rc.proto.codec import encode

__all__ = [
    "ARRAY_GET",
    "ASSIGNMENTS",
    "CALLS",
    "DASHBOARD_CODE",
    "DEVICES",
    "DEVICE_CLEAR",
    "DEVICE_DESCRIBE",
    "DEVICE_DRAIN",
    "DEVICE_FAULT",
    "DEVICE_RETIRE",
    "DEVICE_UNDRAIN",
    "EVENTS",
    "EXPLAIN",
    "HEARTBEAT",
    "JOBS",
    "JOBS_KILL",
    "JOB_EXPLAIN",
    "JOB_EXTEND",
    "JOB_GET",
    "JOB_KILL",
    "JOB_LOGS",
    "JOB_RELAY",
    "JOB_SUBMIT",
    "JOB_UPDATE",
    "LABELS",
    "LEAVE",
    "LOG_APPEND",
    "RECHECK",
    "REGISTER",
    "REPORTS",
    "SCAN_RESULT",
    "SESSION_GET",
    "SESSION_OPEN",
    "SESSION_RELAY",
    "SESSION_REPORT",
    "SHARES",
    "SHARE_SET",
    "STATE",
    "TOKENS",
    "TOKEN_CREATE",
    "TOKEN_REVOKE",
    "TOKEN_ROTATE",
    "USAGE",
    "WHOAMI",
    "Call",
    "Relay",
    "RelayPaths",
]

_PARAM = re.compile(r"{([a-z_]+)}")
_SAFE = ":@"
"""Characters a path parameter keeps unencoded: a device id is host:name."""


@dataclass(frozen=True, slots=True)
class Call:
    """One route a client calls: `method` (GET, POST, DELETE), `path` (a
    template such as "/v1/jobs/{job_id}"), `request` and `response` (a wire
    record, "bytes", "json" or None: see the module docstring) and `query`,
    the names of the query parameters the route reads."""

    method: str
    path: str
    request: Any = None
    response: Any = None
    query: tuple[str, ...] = ()

    def __str__(self) -> str:
        return f"{self.method} {self.path}"

    @property
    def names(self) -> tuple[str, ...]:
        """The path parameters' names, in order ("job_id", "sid")."""
        return tuple(_PARAM.findall(self.path))

    def target(self, *ids: object) -> str:
        """The path with `ids` (one per path parameter, in order; ints or
        strings) in place, each percent-encoded as one segment
        (urllib.parse.quote, keeping ':' and '@'). Raises TypeError for too
        many or too few."""
        names = self.names
        if len(ids) != len(names):
            raise TypeError(
                f"{self} takes {len(names)} path parameter{'s' if len(names) != 1 else ''}"
                f"{' (' + ', '.join(names) + ')' if names else ''}, not {len(ids)}"
            )
        values = iter(ids)
        return _PARAM.sub(lambda m: urllib.parse.quote(str(next(values)), safe=_SAFE), self.path)

    def payload(self, body: Any) -> tuple[Any, Any]:
        """(JSON body, raw body) to send for `body`: the request record
        encoded, a dict of its fields as is, bytes as the raw body; a POST
        without a body sends `{}`. Raises TypeError for a body this route
        does not take (another record, a field the record lacks, bytes
        where it takes JSON or the other way round)."""
        if self.request == "bytes":
            if not isinstance(body, (bytes, bytearray, memoryview)):
                raise TypeError(f"{self} takes bytes, not {type(body).__name__}")
            return None, body
        if isinstance(body, (bytes, bytearray, memoryview)):
            raise TypeError(f"{self} takes a JSON body, not bytes")
        if body is None or (body == {} and self.request is None):
            return ({} if self.method == "POST" else None), None
        record = self.request
        if not isinstance(record, type):
            raise TypeError(f"{self} takes no body")
        if isinstance(body, record):
            return encode(body), None
        if not isinstance(body, dict):
            raise TypeError(f"{self} takes a {record.__name__} or a dict of its fields")
        known = {f.name for f in dataclasses.fields(record)}
        unknown = sorted(k for k in body if k not in known)
        if unknown:
            raise TypeError(f"{self}: {record.__name__} has no field {', '.join(unknown)}")
        return body, None

    def check_query(self, params: dict[str, Any] | None) -> dict[str, Any] | None:
        """`params`, once each of its names is one this route reads; raises
        TypeError naming one it does not."""
        unknown = sorted(k for k in params or () if k not in self.query)
        if unknown:
            raise TypeError(f"{self} reads no query parameter {', '.join(unknown)}")
        return params

    def read(self, resp: Any) -> Any:
        """What a caller gets from this route's Response: its raw body for a
        route answering bytes, else the body decoded as JSON (None when empty)."""
        return resp.body if self.response == "bytes" else resp.json()


@dataclass(frozen=True, slots=True)
class RelayPaths:
    """The four half paths of one relayed stream, parameters in place."""

    client_out: str
    client_in: str
    worker_out: str
    worker_in: str


@dataclass(frozen=True, slots=True)
class Relay:
    """The four streamed halves of a relayed stream (README "A terminal,
    a script and files on a device"): the client reads the output (`client_out`, GET, bytes until it
    ends) and sends the input (`client_in`, POST, a chunked body: tty JSON
    frames one a line, pipe raw); the worker sends the output (`worker_out`,
    POST, raw) and reads the input (`worker_in`, GET). A POST half is
    answered at once and ended by one JSON line ({"ok": true}, or
    {"ended": why} when the session ended first). Refusals: not_found,
    not_attached (no terminal or pipe), session_ended, conflict (that half
    is connected already), limit_exceeded (429: too many sessions open),
    not_job_owner (a client half of someone else's), not_worker_job (a
    worker half of a job that runs elsewhere)."""

    client_out: Call
    client_in: Call
    worker_out: Call
    worker_in: Call

    @classmethod
    def under(cls, prefix: str) -> Relay:
        """The halves under `prefix` (the job's or the session's path)."""
        return cls(
            Call("GET", f"{prefix}/tty/out", None, "bytes"),
            Call("POST", f"{prefix}/tty/in", "bytes", "json"),
            Call("POST", f"{prefix}/tty/out", "bytes", "json"),
            Call("GET", f"{prefix}/tty/in", None, "bytes"),
        )

    @property
    def halves(self) -> tuple[Call, Call, Call, Call]:
        """client_out, client_in, worker_out, worker_in."""
        return (self.client_out, self.client_in, self.worker_out, self.worker_in)

    def at(self, *ids: object) -> RelayPaths:
        """The four paths with `ids` in place (Call.target)."""
        return RelayPaths(*(half.target(*ids) for half in self.halves))


# -- the worker (rc.worker) --------------------------------------------------------------

REGISTER = Call("POST", "/v1/workers/register", wire.RegisterRequest, wire.RegisterResponse)
"""A worker registers its host and devices; answers its worker id, the
controller's instance and heartbeat interval (seconds). Refusals: limit_exceeded,
sheet_too_large, wrong_host (a worker token bound to another host), bad_request."""
LABELS = Call("POST", "/v1/workers/{worker_id}/labels", wire.LabelsRequest)
"""A periodic re-probe's labels and sheets. Refusals: not_found (register
again), wrong_host, limit_exceeded, sheet_too_large."""
HEARTBEAT = Call(
    "POST", "/v1/workers/{worker_id}/heartbeat", wire.HeartbeatRequest, wire.HeartbeatResponse
)
"""The worker is alive: the jobs it supervises, its holds' use; answers the
jobs to stop and the holds' ttls (seconds). Refusals: not_found, wrong_host."""
LEAVE = Call("POST", "/v1/workers/{worker_id}/leave", wire.LeaveRequest, wire.LeaveResponse)
"""A worker stopping cleanly hands back the assigned jobs it never started.
Refusals: not_found, wrong_host, conflict (another process of the host)."""
ASSIGNMENTS = Call("GET", "/v1/workers/{worker_id}/assignments", None, wire.Assignments, ("wait",))
"""Long poll for work (`wait`: a duration such as "30s", at most 60s): 200
with Assignments, or 204 with no body once the wait passed with nothing."""
RECHECK = Call("POST", "/v1/workers/{worker_id}/recheck", wire.RecheckRequest, wire.RecheckResponse)
"""A periodic survivor scan's proof; answers the devices it returned to the pool."""
SCAN_RESULT = Call("POST", "/v1/workers/{worker_id}/scans/{scan_id}", wire.ScanResult, "json")
"""The answer to survivor scan `scan_id` (an int). Refusals: not_found (no
such scan waits any more), wrong_host."""
REPORTS = Call(
    "POST", "/v1/workers/{worker_id}/reports", wire.Reports, wire.ReportResults, ("assignments",)
)
"""Running and terminal reports, batched; each one's outcome in order (with
`assignments=1`, worker protocol 2, also the jobs assigned and not yet running).
Refusals of the batch: wrong_host, bad_request (a field the controller does not know)."""
LOG_APPEND = Call("POST", "/v1/jobs/{job_id}/logs", "bytes", wire.LogAppended, ("offset",))
"""Append a job's output starting at byte `offset` of its stream (required;
idempotent per offset); answers the log's size. Refusals (4xx: the bytes are
dropped): offset_gap, chunk_too_large, logs_not_stored, not_worker_job, not_found."""
DEVICE_FAULT = Call("POST", "/v1/devices/{device_id}/fault", wire.FaultRequest)
"""Quarantine a device (`device_id` host:name) as `fault`, or drain it.
Refusals: device_not_found, wrong_host."""
SESSION_REPORT = Call("POST", "/v1/jobs/{job_id}/sessions/{sid}/status", wire.SessionReport)
"""The hold's worker reports session `sid` of hold `job_id` running, or
ended with its exit code. Refusals: not_found, not_worker_job."""

# -- jobs and holds (rc run, rc hold, rc jobs, rc show, rc logs, rc kill...) ------------

JOB_SUBMIT = Call("POST", "/v1/jobs", wire.SubmitRequest, wire.JobView)
"""Submit a job or a hold: 201 with its JobView (200 replaying an idempotency
key). Refusals: bad_selector, no_matching_device, unknown_device,
priority_out_of_range, runtime_above_ceiling, limit_exceeded,
idempotency_conflict, no_device_available (no_wait), queue_full,
queued_spec_bytes (the user's queued jobs hold too many spec bytes)."""
JOBS = Call(
    "GET",
    "/v1/jobs",
    None,
    wire.JobList,
    ("limit", "device", "user", "submitter", "mine", "state", "name", "since", "before", "array"),
)
"""Jobs newest first, one page (`limit` 1..1000, default 20; `before` an id:
the page's `next_before` pages on); filters: `device`, `user` (the Unix user),
`mine`, `state` (a comma list), `name` (a GLOB), `since` (epoch seconds),
`array` (an array id). Commands and reasons come cut to 256 characters
(JOB_GET gives them whole). Refusals: bad_request."""
JOB_GET = Call(
    "GET", "/v1/jobs/{job_id}", None, wire.JobView, ("wait", "state", "position", "detail")
)
"""A job and its queue position; `detail=1` adds what rc show prints. Long
poll: `wait` (a duration, at most 60s) answers once the job's `state` or
queue `position` differs from the ones given. Refusals: not_found, bad_request."""
JOB_KILL = Call("POST", "/v1/jobs/{job_id}/kill", wire.KillRequest, wire.ActionResult)
"""Kill or cancel a job (its owner, or an admin). Refusals: not_found,
not_job_owner, not_cancellable (it has ended)."""
JOBS_KILL = Call("POST", "/v1/jobs/kill", wire.KillManyRequest, wire.KillManyResult)
"""Kill or cancel up to wire.KILL_MANY_MAX jobs in one transaction; each id's
outcome in the answer. Refusals: limit_exceeded."""
ARRAY_GET = Call("GET", "/v1/arrays/{array_id}", None, wire.ArraySummary)
"""An array summed up: counts by state, failed indices, wall time (seconds).
Refusals: not_found."""
JOB_EXTEND = Call("POST", "/v1/jobs/{job_id}/extend", wire.ExtendRequest, wire.ExtendResult)
JOB_UPDATE = Call("POST", "/v1/jobs/{job_id}/update", wire.UpdateRequest, wire.JobView)
"""Add `seconds` to a hold's ttl; answers the ttl (seconds from its start).
Refusals: not_found, not_job_owner, not_a_hold, not_cancellable,
runtime_above_ceiling, no_matching_device."""
JOB_LOGS = Call("GET", "/v1/jobs/{job_id}/logs", None, "bytes", ("offset", "follow"))
"""A job's stored output from byte `offset`, raw; with `follow` "1" (the
default) streamed until the job ends, with "0" what is stored now. Refusals:
not_found, not_job_owner, logs_not_stored (a terminal job)."""
JOB_EXPLAIN = Call("GET", "/v1/jobs/{job_id}/explain", None, wire.JobExplanation)
"""Why a queued job is not running, in sentences. Refusals: not_found."""

# -- the fleet (rc devices, rc describe, rc explain, rc ps, admin verbs) -----------------

DEVICES = Call("GET", "/v1/devices", None, wire.DeviceList, ("labels",))
"""Every device and who holds it (`labels` "false": without their labels)."""
DEVICE_DESCRIBE = Call("GET", "/v1/devices/{device_id}/describe", None, wire.DescribeResponse)
"""One device (`device_id` host:name): labels with source and age (seconds),
usage sheet, recent jobs. Refusals: device_not_found."""
EXPLAIN = Call("GET", "/v1/explain", None, wire.ExplainResponse, ("selector",))
"""Which devices `selector` (required) matches, which are free, the queue
depth. Refusals: bad_selector."""
STATE = Call("GET", "/v1/state", None, wire.StateResponse)
"""Devices, active jobs, the queue in scheduling order, holds' idle clocks;
commands and reasons cut to 256 characters."""
DEVICE_CLEAR = Call("POST", "/v1/devices/{device_id}/clear", wire.ClearRequest, wire.ActionResult)
"""Return a quarantined device to the pool after its worker's survivor scan
(admin). Refusals: device_not_found, device_not_cleared, survivors_found,
scan_unavailable."""
DEVICE_RETIRE = Call("DELETE", "/v1/devices/{device_id}", None, wire.ActionResult)
"""Retire a device (admin). Refusals: device_not_found, device_busy."""
DEVICE_DRAIN = Call("POST", "/v1/devices/{device_id}/drain", wire.DrainRequest, wire.ActionResult)
"""Drain a device (admin): its job finishes, no new one starts. Refusals:
device_not_found."""
DEVICE_UNDRAIN = Call(
    "POST", "/v1/devices/{device_id}/undrain", wire.UndrainRequest, wire.ActionResult
)
"""Put a drained device back in the pool (admin). Refusals: device_not_found,
device_not_cleared (a health rule still fails), scan_unavailable."""

# -- usage and fair share (rc usage, rc share) ------------------------------------------

USAGE = Call("GET", "/v1/usage", None, wire.UsageReport, ("by", "since", "user"))
"""The usage ledger (device-seconds, jobs and holds by state, waits), `by`
user, host, device, day or week, over the last `since` (a duration, default
30d), of one `user` or all. Refusals: bad_request."""
SHARES = Call("GET", "/v1/shares", None, wire.ShareList)
"""Fair share: half-life (seconds), each user's weight, entitlement, usage."""
SHARE_SET = Call("POST", "/v1/shares/{user}", wire.ShareSet, wire.ShareList)
"""Set `user`'s fair-share weight (admin); answers the shares as SHARES does."""

# -- identity, tokens, the feed (rc whoami, rc token, rc events) -------------------------

WHOAMI = Call("GET", "/v1/whoami", None, wire.WhoAmI)
"""The caller's token name, role, Unix user and principal (never the secret)."""
TOKEN_CREATE = Call("POST", "/v1/tokens", wire.TokenCreate, wire.TokenCreated)
"""Create a token (admin): 201, the only answer carrying its secret.
Refusals: token_exists, bad_request."""
TOKENS = Call("GET", "/v1/tokens", None, wire.TokenList)
"""Every token without its secret (admin)."""
TOKEN_ROTATE = Call("POST", "/v1/tokens/{name}/rotate", None, wire.TokenCreated)
"""A new secret for token `name` (admin); the old one stops working.
Refusals: not_found."""
TOKEN_REVOKE = Call("DELETE", "/v1/tokens/{name}", None, wire.TokenRevoked, ("keep_jobs",))
"""Revoke token `name` (admin); its queued jobs are cancelled unless
`keep_jobs` is true. Refusals: not_found, last_admin_token."""
EVENTS = Call("GET", "/v1/events", None, wire.EventList, ("after", "since", "limit", "wait"))
"""The activity feed, oldest first: rows with an id above `after`, or of the
last `since` (a duration); `limit` 1..1000 (default 100); long poll with
`wait` (a duration, at most 60s). Refusals: bad_request."""
DASHBOARD_CODE = Call("POST", "/v1/dashboard/code", None, wire.SignInCode)
"""A one-time dashboard code acting as the caller: 201, valid 120 s, once."""

# -- terminals, pipes and sessions inside holds (rc run --tty, rc shell, rc exec, rc cp) --

SESSION_OPEN = Call("POST", "/v1/jobs/{job_id}/sessions", wire.SessionRequest, wire.SessionView)
"""Start a tty or pipe session (or a forward's connection) inside running
hold `job_id`: 201 with its SessionView. Refusals: not_found, not_job_owner,
not_a_hold, session_ended (the hold is not running), limit_exceeded."""
SESSION_GET = Call(
    "GET", "/v1/jobs/{job_id}/sessions/{sid}", None, wire.SessionView, ("wait", "state")
)
"""Session `sid` of hold `job_id`; long poll with `wait` (a duration, at most
60s) until its state differs from `state`. Refusals: not_found (also once
the controller forgot it), not_job_owner."""
JOB_RELAY = Relay.under("/v1/jobs/{job_id}")
"""The relay of a tty or pipe job `job_id`."""
SESSION_RELAY = Relay.under("/v1/jobs/{job_id}/sessions/{sid}")
"""The relay of session `sid` inside hold `job_id`."""

CALLS: tuple[Call, ...] = (
    *(value for value in tuple(globals().values()) if isinstance(value, Call)),
    *JOB_RELAY.halves,
    *SESSION_RELAY.halves,
)
"""Every call above, the relays' halves included."""
