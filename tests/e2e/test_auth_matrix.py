"""The auth matrix (docs/design.md#identity-and-ownership): every route of the route table
(rc.controller.api.routes) × {no token, unknown, revoked, expired, user,
another user, another token of the user's own Unix user, worker of this
host, worker of another host, admin} → the status the table's declaration
promises: 401 without a valid token, 403 for a role the route does not
admit, 403 for another user, and for another principal of the same Unix
user (ownership is the principal), where the route refuses
not_job_owner, and for another host's worker where it refuses
wrong_host or not_worker_job, else the route's answer. Here each route has
only a way to call it (and its answer when that is not a 2xx); a route
without one fails the test.

Calls build fresh objects where a call changes something (kill, clear, token
revoke...), so the outcome of one never depends on another.
"""

from __future__ import annotations

import http.client
import json
import time
import urllib.parse
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest

from rc.controller.api.endpoint import Endpoint
from rc.controller.api.routes import ROUTES
from rc.proto.client import Client
from rc.proto.errors import ErrorCode
from rc.proto.model import Role
from tests.helpers.harness import Controller, base_env
from tests.helpers.wait import wait_until

CALLERS = (
    "none",
    "unknown",
    "revoked",
    "expired",
    "user",
    "other_user",
    "same_user",
    "worker_this",
    "worker_other",
    "admin",
)
ANON = ("none", "unknown", "revoked", "expired")
OK = "ok"  # any 2xx


@dataclass
class World:
    url: str
    tokens: dict[str, str | None]
    admin: Client
    user: Client
    host: str = "mh"
    other_host: str = "oh"
    job: int = 0
    counter: int = 0
    extra: dict = field(default_factory=dict)

    def fresh(self, prefix: str) -> str:
        self.counter += 1
        return f"{prefix}{self.counter}"

    def queued_job(self) -> int:
        """A job of `user` that stays queued (pinned to a busy device)."""
        return self.user.post("/v1/jobs", {"command": ["true"], "device_id": "mh:cpu0"})["job"][
            "id"
        ]

    def queued_hold(self) -> int:
        """A hold of `user` that stays queued (pinned to a busy device)."""
        body = {"kind": "hold", "device_id": "mh:cpu0", "reason": "m", "max_runtime_seconds": 60}
        return self.user.post("/v1/jobs", body)["job"]["id"]


ROLE_OF = {
    "user": Role.USER,
    "other_user": Role.USER,
    "same_user": Role.USER,
    "worker_this": Role.WORKER,
    "worker_other": Role.WORKER,
    "admin": Role.ADMIN,
}
"""The role of each caller that holds a valid token."""


def expected(e: Endpoint, answer: object) -> dict[str, object]:
    """What each caller gets from `e`, by its declaration in the route table;
    `answer` is what an admitted caller gets (OK, or the route's refusal of
    the call made)."""
    if e.public:
        return dict.fromkeys(CALLERS, answer)
    out: dict[str, object] = dict.fromkeys(ANON, 401)
    for caller, role in ROLE_OF.items():
        out[caller] = answer if role is Role.ADMIN or role in e.roles else 403
    codes = {code for _, code in e.refusals()}
    if ErrorCode.NOT_JOB_OWNER in codes:
        out["other_user"] = 403  # alice's job, bob's token
        out["same_user"] = 403  # the token alice's job, another token of Unix user alice
    if codes & {ErrorCode.WRONG_HOST, ErrorCode.NOT_WORKER_JOB}:
        out["worker_other"] = 403  # host mh's worker, a token bound to oh
    return out


@dataclass(frozen=True)
class Call:
    """How to call one route, and what an admitted caller gets."""

    method: str
    path: str
    call: Callable[[World], tuple[str, object]]  # → (concrete path with query, body)
    answer: object = OK
    stream: bool = False


def _body(obj) -> bytes:
    return json.dumps(obj).encode()


def reg(w: World):
    return "/v1/workers/register", {
        "host": w.host,
        "devices": [{"name": f"cpu{i}"} for i in range(6)],
        "allow_root_jobs": True,  # the admin's jobs run as root, the controller's user
    }


def job_half(direction: str):
    return lambda w: (f"/v1/jobs/{w.job}/tty/{direction}", b"" if direction else None)


def session_path(w: World) -> str:
    return f"/v1/jobs/{w.extra['hold']}/sessions/{w.extra['sid']}"


HALF = 409
"""The relay halves answer an admitted caller with 409 here (a logs-mode job
has no terminal; the session has ended): the answer comes after the auth and
ownership checks, and nothing is left streaming. So does opening a session
inside a job that is not a hold."""


CALLS = [
    Call("POST", "/v1/workers/register", reg),
    Call(
        "POST",
        "/v1/workers/{worker_id}/labels",
        lambda w: (f"/v1/workers/{w.host}/labels", {"host": w.host}),
    ),
    Call(
        "POST",
        "/v1/workers/{worker_id}/heartbeat",
        lambda w: (f"/v1/workers/{w.host}/heartbeat", {}),
    ),
    # leave answers an authorized caller 409 here (the claim names another
    # process), so it hands nothing back and the world stays as it is
    Call(
        "POST",
        "/v1/workers/{worker_id}/leave",
        lambda w: (f"/v1/workers/{w.host}/leave", {"instance": "not-the-registered-one"}),
        409,
    ),
    Call(
        "GET",
        "/v1/workers/{worker_id}/assignments",
        lambda w: (f"/v1/workers/{w.host}/assignments?wait=0", None),
    ),
    Call(
        "POST",
        "/v1/workers/{worker_id}/reports",
        lambda w: (f"/v1/workers/{w.host}/reports", {"reports": []}),
    ),
    Call(
        "POST",
        "/v1/workers/{worker_id}/recheck",
        lambda w: (f"/v1/workers/{w.host}/recheck", {"recovery": {}}),  # proves nothing
    ),
    Call(
        "POST",
        "/v1/workers/{worker_id}/scans/{scan_id}",
        lambda w: (f"/v1/workers/{w.host}/scans/1", {"survivors": []}),
        404,  # admitted, but no scan 1 waits
    ),
    Call(
        "POST",
        "/v1/jobs/{job_id}/logs",
        lambda w: (f"/v1/jobs/{w.job}/logs?offset=0", b""),
    ),
    Call(
        "POST",
        "/v1/devices/{device_id}/fault",
        lambda w: (f"/v1/devices/{w.host}:cpu3/fault", {"reason": "matrix"}),
    ),
    Call(
        "POST",
        "/v1/jobs",
        lambda w: ("/v1/jobs", {"command": ["true"], "device_id": "mh:cpu0"}),
    ),
    Call("GET", "/v1/jobs", lambda w: ("/v1/jobs", None)),
    Call("GET", "/v1/jobs/{job_id}", lambda w: (f"/v1/jobs/{w.job}", None)),
    Call(
        "POST",
        "/v1/jobs/{job_id}/kill",
        lambda w: (f"/v1/jobs/{w.queued_job()}/kill", {}),
    ),
    Call("POST", "/v1/jobs/kill", lambda w: ("/v1/jobs/kill", {"ids": [w.queued_job()]})),
    Call("GET", "/v1/arrays/{array_id}", lambda w: (f"/v1/arrays/{w.extra['array']}", None)),
    Call(
        "POST",
        "/v1/jobs/{job_id}/extend",
        lambda w: (f"/v1/jobs/{w.queued_hold()}/extend", {"seconds": 1}),
    ),
    Call(
        "POST",
        "/v1/jobs/{job_id}/update",
        lambda w: (f"/v1/jobs/{w.queued_job()}/update", {"stashed": True}),
    ),
    Call(
        "GET",
        "/v1/jobs/{job_id}/logs",
        lambda w: (f"/v1/jobs/{w.job}/logs?follow=0", None),
    ),
    Call(
        "GET",
        "/v1/jobs/{job_id}/explain",
        lambda w: (f"/v1/jobs/{w.job}/explain", None),
    ),
    Call("GET", "/v1/devices", lambda w: ("/v1/devices", None)),
    Call(
        "GET",
        "/v1/devices/{device_id}/describe",
        lambda w: ("/v1/devices/mh:cpu0/describe", None),
    ),
    Call("GET", "/v1/explain", lambda w: ("/v1/explain?selector=*", None)),
    Call("GET", "/v1/state", lambda w: ("/v1/state", None)),
    Call(
        "POST",
        "/v1/devices/{device_id}/clear",
        lambda w: (_quarantined(w), {"force": True}),  # no worker polls here to scan
    ),
    Call("DELETE", "/v1/devices/{device_id}", lambda w: (_retirable(w), None)),
    # a fresh reason each time (draining again with the same one is a 409 no-op),
    # and undrain a device that is draining (undraining a ready one is too)
    Call(
        "POST",
        "/v1/devices/{device_id}/drain",
        lambda w: ("/v1/devices/mh:cpu2/drain", {"reason": w.fresh("r")}),
    ),
    Call(
        "POST",
        "/v1/devices/{device_id}/undrain",
        lambda w: (
            w.admin.post("/v1/devices/mh:cpu2/drain", {"reason": w.fresh("r")}),
            ("/v1/devices/mh:cpu2/undrain", None),
        )[1],
    ),
    Call("GET", "/v1/whoami", lambda w: ("/v1/whoami", None)),
    Call(
        "POST",
        "/v1/tokens",
        lambda w: ("/v1/tokens", {"name": w.fresh("t"), "role": "user"}),
    ),
    Call("GET", "/v1/tokens", lambda w: ("/v1/tokens", None)),
    Call(
        "POST",
        "/v1/tokens/{name}/rotate",
        lambda w: (f"/v1/tokens/{_victim(w)}/rotate", None),
    ),
    Call(
        "DELETE",
        "/v1/tokens/{name}",
        lambda w: (f"/v1/tokens/{_victim(w)}", None),
    ),
    Call("GET", "/v1/events", lambda w: ("/v1/events", None)),
    Call("GET", "/v1/usage", lambda w: ("/v1/usage", None)),
    Call("GET", "/v1/usage/chart.svg", lambda w: ("/v1/usage/chart.svg", None)),
    Call("GET", "/v1/shares", lambda w: ("/v1/shares", None)),
    Call("POST", "/v1/shares/{user}", lambda w: ("/v1/shares/carol", {"weight": 2})),
    Call(
        "GET",
        "/v1/events/stream",
        lambda w: ("/v1/events/stream", None),
        stream=True,
    ),
    Call("GET", "/metrics", lambda w: ("/metrics", None)),
    Call("GET", "/openapi.json", lambda w: ("/openapi.json", None)),
    Call("GET", "/", lambda w: ("/", None)),
    Call("POST", "/v1/dashboard/code", lambda w: ("/v1/dashboard/code", {})),
    # public: a fresh code of `user` each time, so every caller spends one
    Call(
        "POST",
        "/v1/dashboard/session",
        lambda w: ("/v1/dashboard/session", {"code": w.user.post("/v1/dashboard/code")["code"]}),
    ),
    # -- the relay ------------------------------------------------------------
    Call(
        "GET",
        "/v1/jobs/{job_id}/tty/out",
        lambda w: (f"/v1/jobs/{w.job}/tty/out", None),
        HALF,
    ),
    Call("POST", "/v1/jobs/{job_id}/tty/in", lambda w: (f"/v1/jobs/{w.job}/tty/in", b""), HALF),
    Call(
        "POST",
        "/v1/jobs/{job_id}/tty/out",
        lambda w: (f"/v1/jobs/{w.job}/tty/out", b""),
        HALF,
    ),
    Call("GET", "/v1/jobs/{job_id}/tty/in", lambda w: (f"/v1/jobs/{w.job}/tty/in", None), HALF),
    Call(
        "POST",
        "/v1/jobs/{job_id}/sessions",
        lambda w: (f"/v1/jobs/{w.job}/sessions", {"stdio": "pipe", "command": ["true"]}),
        HALF,
    ),
    Call(
        "GET",
        "/v1/jobs/{job_id}/sessions/{sid}",
        lambda w: (session_path(w), None),
    ),
    Call(
        "POST",
        "/v1/jobs/{job_id}/sessions/{sid}/status",
        lambda w: (session_path(w) + "/status", {"state": "ended", "exit_code": 0}),
    ),
    Call(
        "GET",
        "/v1/jobs/{job_id}/sessions/{sid}/tty/out",
        lambda w: (session_path(w) + "/tty/out", None),
        HALF,
    ),
    Call(
        "POST",
        "/v1/jobs/{job_id}/sessions/{sid}/tty/in",
        lambda w: (session_path(w) + "/tty/in", b""),
        HALF,
    ),
    Call(
        "POST",
        "/v1/jobs/{job_id}/sessions/{sid}/tty/out",
        lambda w: (session_path(w) + "/tty/out", b""),
        HALF,
    ),
    Call(
        "GET",
        "/v1/jobs/{job_id}/sessions/{sid}/tty/in",
        lambda w: (session_path(w) + "/tty/in", None),
        HALF,
    ),
]


def _quarantined(w: World) -> str:
    """A device quarantined just now (so an admin clear succeeds)."""
    device = f"{w.host}:cpu1"
    w.admin.post(f"/v1/devices/{device}/fault", {"reason": "matrix"})
    return f"/v1/devices/{device}/clear"


def _retirable(w: World) -> str:
    """A device of a throwaway host (an admin retire succeeds)."""
    host = w.fresh("rt")
    w.admin.post("/v1/workers/register", {"host": host, "devices": [{"name": "cpu0"}]})
    return f"/v1/devices/{host}:cpu0"


def _victim(w: World) -> str:
    name = w.fresh("victim")
    w.admin.post("/v1/tokens", {"name": name, "role": "user"})
    return name


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    home = tmp_path_factory.mktemp("home")
    ctl = Controller(tmp_path_factory.mktemp("data") / "d", base_env(home)).start()
    admin = ctl.client()

    def token(name, role, **kw):
        return admin.post("/v1/tokens", {"name": name, "role": role, **kw})["secret"]

    tokens: dict[str, str | None] = {
        "none": None,
        "unknown": "rc_" + uuid.uuid4().hex * 2,
        "admin": ctl.admin_token,
        "user": token("alice", "user"),
        "other_user": token("bob", "user"),
        "same_user": token("alice-laptop", "user", unix_user="alice"),
        "worker_this": token("w-mh", "worker"),
        "worker_other": token("w-oh", "worker"),
        "revoked": token("gone", "user"),
        "expired": token("brief", "user", expires_in_seconds=1),
    }
    admin.delete("/v1/tokens/gone")
    Client(ctl.url, tokens["worker_this"]).post(*reg(World(ctl.url, {}, admin, admin)))
    Client(ctl.url, tokens["worker_other"]).post(
        "/v1/workers/register", {"host": "oh", "devices": [{"name": "cpu0"}]}
    )
    user = Client(ctl.url, tokens["user"])
    w = World(ctl.url, tokens, admin, user)
    w.job = user.post("/v1/jobs", {"command": ["true"], "device_id": "mh:cpu0"})["job"]["id"]
    arr = user.post("/v1/jobs", {"command": ["true"], "device_id": "mh:cpu0", "array": "0-1"})
    w.extra["array"] = arr["job"]["id"]
    # a session inside a hold on mh, ended at once by its worker's output half
    hold = user.post(
        "/v1/jobs",
        {"kind": "hold", "device_id": "mh:cpu4", "reason": "matrix", "max_runtime_seconds": 600},
    )["job"]["id"]
    sid = user.post(f"/v1/jobs/{hold}/sessions", {"stdio": "pipe", "command": ["true"]})
    w.extra.update(hold=hold, sid=sid["session_id"])
    assert _call(w, "POST", session_path(w) + "/tty/out", b"", tokens["worker_this"], False) == 200
    wait_until(
        lambda: user.get(session_path(w))["state"] != "" and _ended(w), 10, "the session to end"
    )
    deadline = time.monotonic() + 1.5
    wait_until(lambda: time.monotonic() > deadline, 5, "the short token to expire")
    yield w
    admin.close_all()
    user.close_all()
    ctl.stop()


def _ended(w: World) -> bool:
    return _call(w, "GET", session_path(w) + "/tty/out", None, w.tokens["admin"], False) == 409


def _call(w: World, method: str, target: str, body, token: str | None, stream: bool) -> int:
    u = urllib.parse.urlsplit(w.url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=30)
    try:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        data = body if isinstance(body, bytes) else (_body(body) if body is not None else None)
        if data is not None:
            headers["Content-Type"] = "application/json"
        conn.request(method, target, body=data, headers=headers)
        resp = conn.getresponse()
        if not stream:
            resp.read()
        return resp.status
    finally:
        conn.close()


ENDPOINTS = {(e.method, e.path): e for e in ROUTES}


def test_every_route_of_the_table_has_a_call():
    calls = [(c.method, c.path) for c in CALLS]
    assert len(calls) == len(set(calls))
    missing = set(ENDPOINTS) - set(calls)
    assert missing == set(), f"routes without an auth-matrix call: {sorted(missing)}"
    stale = set(calls) - set(ENDPOINTS)
    assert stale == set(), f"calls for routes that do not exist: {sorted(stale)}"


def test_the_expectation_follows_the_declaration():
    """The derivation itself, on three kinds of route."""
    kill = expected(ENDPOINTS["POST", "/v1/jobs/{job_id}/kill"], OK)
    assert kill == {
        **dict.fromkeys(ANON, 401),
        "user": OK,
        "other_user": 403,
        "same_user": 403,
        "admin": OK,
        "worker_this": 403,
        "worker_other": 403,
    }
    beat = expected(ENDPOINTS["POST", "/v1/workers/{worker_id}/heartbeat"], OK)
    assert [c for c in CALLERS if beat[c] == OK] == ["worker_this", "admin"]
    clear = expected(ENDPOINTS["POST", "/v1/devices/{device_id}/clear"], OK)
    assert [c for c in CALLERS if clear[c] == OK] == ["admin"]
    assert set(expected(ENDPOINTS["GET", "/"], OK).values()) == {OK}


def test_the_table_opens_nothing_by_accident():
    """The matrix follows the table, so the table's widest doors are pinned
    here: the only public routes, and the admin verbs of the README's role
    table (tokens, clear, retire, drain, undrain) admit no other role."""
    public = {k for k, e in ENDPOINTS.items() if e.public}
    # the dashboard's sign-in takes a one-time code instead of a token
    assert public == {("GET", "/"), ("GET", "/openapi.json"), ("POST", "/v1/dashboard/session")}
    admin_only = {k for k, e in ENDPOINTS.items() if e.roles == (Role.ADMIN,)}
    assert admin_only == {
        ("POST", "/v1/tokens"),
        ("GET", "/v1/tokens"),
        ("DELETE", "/v1/tokens/{name}"),
        ("POST", "/v1/tokens/{name}/rotate"),
        ("POST", "/v1/shares/{user}"),
        ("POST", "/v1/devices/{device_id}/clear"),
        ("DELETE", "/v1/devices/{device_id}"),
        ("POST", "/v1/devices/{device_id}/drain"),
        ("POST", "/v1/devices/{device_id}/undrain"),
    }


@pytest.mark.parametrize("row", CALLS, ids=[f"{r.method} {r.path}" for r in CALLS])
def test_auth_matrix(world, row):
    got = {}
    for caller in CALLERS:
        target, body = row.call(world)
        got[caller] = _call(world, row.method, target, body, world.tokens[caller], row.stream)
    want = expected(ENDPOINTS[row.method, row.path], row.answer)
    norm = {c: (OK if 200 <= s < 300 else s) for c, s in got.items()}
    assert norm == {c: want[c] for c in CALLERS}
