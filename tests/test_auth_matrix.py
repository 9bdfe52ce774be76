"""The auth matrix (issue "Multi-user security", DESIGN.md §6.1): every route
of the app × {no token, unknown, revoked, expired, user, another user, worker
of this host, worker of another host, admin} → the expected status, from one
table. A route of the app without a row fails the test.

Rows build fresh objects where a call changes something (kill, clear, token
revoke...), so the outcome of a row never depends on another row.
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

from rc.proto.client import Client
from tests.harness import Controller, base_env, wait_until

pytestmark = pytest.mark.e2e

CALLERS = (
    "none",
    "unknown",
    "revoked",
    "expired",
    "user",
    "other_user",
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


def expect(**overrides) -> dict[str, object]:
    """Statuses per caller: anonymous callers 401, everyone else 403, then
    the overrides (role names: user, other_user, worker_this, worker_other, admin)."""
    out: dict[str, object] = {c: 401 for c in ANON}
    out.update({c: 403 for c in CALLERS if c not in ANON})
    out.update(overrides)
    return out


USERS = {"user": OK, "other_user": OK, "admin": OK}
OWNER = {"user": OK, "other_user": 403, "admin": OK}
WORKER_HERE = {"worker_this": OK, "worker_other": 403, "admin": OK}
EVERYONE = {c: OK for c in ("user", "other_user", "worker_this", "worker_other", "admin")}
PUBLIC = {c: OK for c in CALLERS}


@dataclass(frozen=True)
class Row:
    """One route: how to call it as a caller, and what each caller gets."""

    method: str
    path: str
    call: Callable[[World], tuple[str, object]]  # → (concrete path with query, body)
    expected: dict[str, object]
    stream: bool = False


def _body(obj) -> bytes:
    return json.dumps(obj).encode()


def reg(w: World):
    return "/v1/workers/register", {
        "host": w.host,
        "devices": [{"name": f"cpu{i}"} for i in range(6)],
    }


def job_half(direction: str):
    return lambda w: (f"/v1/jobs/{w.job}/tty/{direction}", b"" if direction else None)


def session_path(w: World) -> str:
    return f"/v1/jobs/{w.extra['hold']}/sessions/{w.extra['sid']}"


# The relay halves answer an authorized caller with 409 here (a logs-mode job
# has no terminal; the session has ended): the answer comes after the auth and
# ownership checks, and nothing is left streaming.
CLIENT_HALF = expect(user=409, other_user=403, admin=409)
WORKER_HALF = expect(worker_this=409, worker_other=403, admin=409)


ROWS = [
    Row("POST", "/v1/workers/register", reg, expect(**WORKER_HERE)),
    Row(
        "POST",
        "/v1/workers/{worker_id}/labels",
        lambda w: (f"/v1/workers/{w.host}/labels", {"host": w.host}),
        expect(**WORKER_HERE),
    ),
    Row(
        "POST",
        "/v1/workers/{worker_id}/heartbeat",
        lambda w: (f"/v1/workers/{w.host}/heartbeat", {}),
        expect(**WORKER_HERE),
    ),
    # leave answers an authorized caller 409 here (the claim names another
    # process), so it hands nothing back and the world stays as it is
    Row(
        "POST",
        "/v1/workers/{worker_id}/leave",
        lambda w: (f"/v1/workers/{w.host}/leave", {"instance": "not-the-registered-one"}),
        expect(worker_this=409, worker_other=403, admin=409),
    ),
    Row(
        "GET",
        "/v1/workers/{worker_id}/assignments",
        lambda w: (f"/v1/workers/{w.host}/assignments?wait=0", None),
        expect(**WORKER_HERE),
    ),
    Row(
        "POST",
        "/v1/workers/{worker_id}/reports",
        lambda w: (f"/v1/workers/{w.host}/reports", {"reports": []}),
        expect(**WORKER_HERE),
    ),
    Row(
        "POST",
        "/v1/jobs/{job_id}/status",
        lambda w: (f"/v1/jobs/{w.job}/status", {"worker_id": w.host, "state": "running"}),
        expect(**WORKER_HERE),
    ),
    Row(
        "POST",
        "/v1/jobs/{job_id}/logs",
        lambda w: (f"/v1/jobs/{w.job}/logs?offset=0", b""),
        expect(**WORKER_HERE),
    ),
    Row(
        "POST",
        "/v1/devices/{device_id}/fault",
        lambda w: (f"/v1/devices/{w.host}:cpu3/fault", {"reason": "matrix"}),
        expect(**WORKER_HERE),
    ),
    Row(
        "POST",
        "/v1/jobs",
        lambda w: ("/v1/jobs", {"command": ["true"], "device_id": "mh:cpu0"}),
        expect(**USERS),
    ),
    Row("GET", "/v1/jobs", lambda w: ("/v1/jobs", None), expect(**USERS)),
    Row("GET", "/v1/jobs/{job_id}", lambda w: (f"/v1/jobs/{w.job}", None), expect(**USERS)),
    Row(
        "POST",
        "/v1/jobs/{job_id}/kill",
        lambda w: (f"/v1/jobs/{w.queued_job()}/kill", {}),
        expect(**OWNER),
    ),
    Row(
        "GET",
        "/v1/jobs/{job_id}/logs",
        lambda w: (f"/v1/jobs/{w.job}/logs?follow=0", None),
        expect(**OWNER),
    ),
    Row(
        "GET",
        "/v1/jobs/{job_id}/explain",
        lambda w: (f"/v1/jobs/{w.job}/explain", None),
        expect(**USERS),
    ),
    Row("GET", "/v1/devices", lambda w: ("/v1/devices", None), expect(**EVERYONE)),
    Row(
        "GET",
        "/v1/devices/{device_id}/describe",
        lambda w: ("/v1/devices/mh:cpu0/describe", None),
        expect(**USERS),
    ),
    Row("GET", "/v1/explain", lambda w: ("/v1/explain?selector=*", None), expect(**USERS)),
    Row("GET", "/v1/state", lambda w: ("/v1/state", None), expect(**USERS)),
    Row(
        "POST", "/v1/devices/{device_id}/clear", lambda w: (_quarantined(w), None), expect(admin=OK)
    ),
    Row("DELETE", "/v1/devices/{device_id}", lambda w: (_retirable(w), None), expect(admin=OK)),
    # a fresh reason each time (draining again with the same one is a 409 no-op),
    # and undrain a device that is draining (undraining a ready one is too)
    Row(
        "POST",
        "/v1/devices/{device_id}/drain",
        lambda w: ("/v1/devices/mh:cpu2/drain", {"reason": w.fresh("r")}),
        expect(admin=OK),
    ),
    Row(
        "POST",
        "/v1/devices/{device_id}/undrain",
        lambda w: (
            w.admin.post("/v1/devices/mh:cpu2/drain", {"reason": w.fresh("r")}),
            ("/v1/devices/mh:cpu2/undrain", None),
        )[1],
        expect(admin=OK),
    ),
    Row("GET", "/v1/whoami", lambda w: ("/v1/whoami", None), expect(**EVERYONE)),
    Row(
        "POST",
        "/v1/tokens",
        lambda w: ("/v1/tokens", {"name": w.fresh("t"), "role": "user"}),
        expect(admin=OK),
    ),
    Row("GET", "/v1/tokens", lambda w: ("/v1/tokens", None), expect(admin=OK)),
    Row(
        "DELETE",
        "/v1/tokens/{name}",
        lambda w: (f"/v1/tokens/{_victim(w)}", None),
        expect(admin=OK),
    ),
    Row("GET", "/v1/events", lambda w: ("/v1/events", None), expect(**USERS)),
    Row(
        "GET",
        "/v1/events/stream",
        lambda w: ("/v1/events/stream", None),
        expect(**USERS),
        stream=True,
    ),
    Row("GET", "/metrics", lambda w: ("/metrics", None), expect(**EVERYONE)),
    Row("GET", "/openapi.json", lambda w: ("/openapi.json", None), PUBLIC),
    Row("GET", "/", lambda w: ("/", None), PUBLIC),
    # -- the relay (issue "Interactive") ----------------------------------------
    Row(
        "GET",
        "/v1/jobs/{job_id}/tty/out",
        lambda w: (f"/v1/jobs/{w.job}/tty/out", None),
        CLIENT_HALF,
    ),
    Row(
        "POST", "/v1/jobs/{job_id}/tty/in", lambda w: (f"/v1/jobs/{w.job}/tty/in", b""), CLIENT_HALF
    ),
    Row(
        "POST",
        "/v1/jobs/{job_id}/tty/out",
        lambda w: (f"/v1/jobs/{w.job}/tty/out", b""),
        WORKER_HALF,
    ),
    Row(
        "GET", "/v1/jobs/{job_id}/tty/in", lambda w: (f"/v1/jobs/{w.job}/tty/in", None), WORKER_HALF
    ),
    Row(
        "POST",
        "/v1/jobs/{job_id}/sessions",
        lambda w: (f"/v1/jobs/{w.job}/sessions", {"stdio": "pipe", "command": ["true"]}),
        expect(user=409, other_user=403, admin=409),
    ),
    Row(
        "GET",
        "/v1/jobs/{job_id}/sessions/{sid}",
        lambda w: (session_path(w), None),
        expect(user=OK, other_user=403, admin=OK),
    ),
    Row(
        "POST",
        "/v1/jobs/{job_id}/sessions/{sid}/status",
        lambda w: (session_path(w) + "/status", {"state": "ended", "exit_code": 0}),
        expect(worker_this=OK, worker_other=403, admin=OK),
    ),
    Row(
        "GET",
        "/v1/jobs/{job_id}/sessions/{sid}/tty/out",
        lambda w: (session_path(w) + "/tty/out", None),
        CLIENT_HALF,
    ),
    Row(
        "POST",
        "/v1/jobs/{job_id}/sessions/{sid}/tty/in",
        lambda w: (session_path(w) + "/tty/in", b""),
        CLIENT_HALF,
    ),
    Row(
        "POST",
        "/v1/jobs/{job_id}/sessions/{sid}/tty/out",
        lambda w: (session_path(w) + "/tty/out", b""),
        WORKER_HALF,
    ),
    Row(
        "GET",
        "/v1/jobs/{job_id}/sessions/{sid}/tty/in",
        lambda w: (session_path(w) + "/tty/in", None),
        WORKER_HALF,
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


def _app_routes() -> set[tuple[str, str]]:
    from rc.controller.app import build_app
    from rc.controller.config import ControllerConfig
    from rc.controller.core import Controller as Ctl

    app = build_app(Ctl(ControllerConfig(data_dir="/nonexistent")))
    return {(m, r.path) for r in app.app.routes for m in (r.methods or ()) if m != "HEAD"}


def test_every_route_has_a_row():
    rows = {(r.method, r.path) for r in ROWS}
    missing = _app_routes() - rows
    assert missing == set(), f"routes without an auth-matrix row: {sorted(missing)}"
    stale = rows - _app_routes()
    assert stale == set(), f"rows for routes that do not exist: {sorted(stale)}"


@pytest.mark.parametrize("row", ROWS, ids=[f"{r.method} {r.path}" for r in ROWS])
def test_auth_matrix(world, row):
    got = {}
    for caller in CALLERS:
        target, body = row.call(world)
        got[caller] = _call(world, row.method, target, body, world.tokens[caller], row.stream)
    want = {c: row.expected[c] for c in CALLERS}
    norm = {c: (OK if 200 <= s < 300 else s) for c, s in got.items()}
    assert norm == want
