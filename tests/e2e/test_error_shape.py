"""Every error is one JSON shape with the right status, never a traceback
(docs/design.md#the-wire). Walks the error paths of a live controller; each
answer's status is its code's in the one table (rc.proto.errors.STATUS)."""

from __future__ import annotations

import http.client
import json
import urllib.parse

import pytest

from rc.proto.errors import ErrorCode, statuses
from rc.proto.wire import INSTANCE_HEADER


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    from tests.helpers.harness import Controller, base_env

    home = tmp_path_factory.mktemp("home")
    ctl = Controller(tmp_path_factory.mktemp("data") / "d", base_env(home)).start()
    c = ctl.client()
    worker = ctl.token("w1", "worker")
    user = ctl.token("u1", "user")
    from rc.proto.client import Client

    Client(ctl.url, worker).post(
        "/v1/workers/register",
        {"host": "h1", "devices": [{"name": "cpu0"}], "labels": {"cpu0": {"kind": "cpu"}}},
    )
    yield ctl, {"admin": ctl.admin_token, "worker": worker, "user": user}
    c.close_all()
    ctl.stop()


def raw(
    url: str,
    method: str,
    path: str,
    token: str | None,
    body: bytes | None = None,
    headers: dict | None = None,
):
    """One request on its own connection. A body over 1 MiB is only declared
    (Content-Length) and not sent: the controller refuses it from the header,
    and sending it anyway would race the server closing the connection."""
    u = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=30)
    try:
        h = dict(headers or {})
        if token:
            h["Authorization"] = f"Bearer {token}"
        if body is not None and len(body) > 1 << 20:
            conn.putrequest(method, path)
            for k, v in {**h, "Content-Length": str(len(body))}.items():
                conn.putheader(k, v)
            conn.endheaders()
        else:
            conn.request(method, path, body=body, headers=h)
        resp = conn.getresponse()
        data = resp.read()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, data
    finally:
        conn.close()


J = json.dumps

CASES = [
    # (name, method, path, token role, body, status, code)
    ("no token", "GET", "/v1/devices", None, None, 401, "unauthorized"),
    ("unknown token", "GET", "/v1/devices", "bogus", None, 401, "unauthorized"),
    (
        "wrong role",
        "POST",
        "/v1/jobs",
        "worker",
        J({"command": ["x"], "selector": "*"}),
        403,
        "forbidden",
    ),
    ("user on worker route", "POST", "/v1/workers/h1/heartbeat", "user", b"{}", 403, "forbidden"),
    ("user on admin route", "POST", "/v1/devices/h1:cpu0/clear", "user", None, 403, "forbidden"),
    ("unknown route", "GET", "/v1/nothing", "user", None, 404, "not_found"),
    ("wrong method", "PUT", "/v1/jobs", "user", None, 405, "method_not_allowed"),
    ("malformed json", "POST", "/v1/jobs", "user", b"{not json", 400, "bad_json"),
    ("empty body", "POST", "/v1/jobs", "user", b"", 400, "bad_json"),
    (
        "unknown field",
        "POST",
        "/v1/jobs",
        "user",
        J({"command": ["x"], "selector": "*", "gpus": 2}),
        400,
        "bad_request",
    ),
    (
        "wrong type",
        "POST",
        "/v1/jobs",
        "user",
        J({"command": "x", "selector": "*"}),
        400,
        "bad_request",
    ),
    ("not an object", "POST", "/v1/jobs", "user", J([1, 2]), 400, "bad_request"),
    (
        "empty command",
        "POST",
        "/v1/jobs",
        "user",
        J({"command": [], "selector": "*"}),
        400,
        "bad_request",
    ),
    (
        "both targets",
        "POST",
        "/v1/jobs",
        "user",
        J({"command": ["x"], "selector": "*", "device_id": "h1:cpu0"}),
        400,
        "bad_request",
    ),
    ("no target", "POST", "/v1/jobs", "user", J({"command": ["x"]}), 400, "bad_request"),
    (
        "unknown device",
        "POST",
        "/v1/jobs",
        "user",
        J({"command": ["x"], "device_id": "h9:x"}),
        400,
        "unknown_device",
    ),
    (
        "no matching device",
        "POST",
        "/v1/jobs",
        "user",
        J({"command": ["x"], "selector": "kind=tpu"}),
        400,
        "no_matching_device",
    ),
    (
        "bad selector",
        "POST",
        "/v1/jobs",
        "user",
        J({"command": ["x"], "selector": "a=,b"}),
        400,
        "bad_selector",
    ),
    (
        "priority",
        "POST",
        "/v1/jobs",
        "user",
        J({"command": ["x"], "selector": "*", "priority": 11}),
        400,
        "priority_out_of_range",
    ),
    (
        "hold with command",
        "POST",
        "/v1/jobs",
        "user",
        J(
            {
                "kind": "hold",
                "command": ["x"],
                "selector": "*",
                "reason": "r",
                "max_runtime_seconds": 60,
            }
        ),
        400,
        "bad_request",
    ),
    (
        "nul in argv",
        "POST",
        "/v1/jobs",
        "user",
        J({"command": ["a\u0000b"], "selector": "*"}),
        400,
        "bad_request",
    ),
    ("huge body", "POST", "/v1/jobs", "user", b" " * (2 << 20), 413, "body_too_large"),
    ("unknown job", "GET", "/v1/jobs/424242", "user", None, 404, "not_found"),
    ("non-numeric job", "GET", "/v1/jobs/abc", "user", None, 404, "not_found"),
    ("kill unknown job", "POST", "/v1/jobs/424242/kill", "user", b"{}", 404, "not_found"),
    ("logs unknown job", "GET", "/v1/jobs/424242/logs", "user", None, 404, "not_found"),
    ("bad list limit", "GET", "/v1/jobs?limit=0", "user", None, 400, "bad_request"),
    ("bad list state", "GET", "/v1/jobs?state=sleeping", "user", None, 400, "bad_request"),
    ("explain no selector", "GET", "/v1/explain", "user", None, 400, "bad_selector"),
    ("describe unknown", "GET", "/v1/devices/h9:x/describe", "user", None, 404, "device_not_found"),
    (
        "clear not quarantined",
        "POST",
        "/v1/devices/h1:cpu0/clear",
        "admin",
        None,
        409,
        "device_not_cleared",
    ),
    ("retire unknown", "DELETE", "/v1/devices/h9:x", "admin", None, 404, "device_not_found"),
    (
        "log append offset",
        "POST",
        "/v1/jobs/424242/logs?offset=x",
        "worker",
        b"x",
        400,
        "bad_request",
    ),
    # digits are ASCII: "²" passed str.isdigit() and then failed int() (a 500)
    (
        "log append offset, superscript digit",
        "POST",
        "/v1/jobs/424242/logs?offset=%C2%B2",
        "worker",
        b"x",
        400,
        "bad_request",
    ),
    (
        "log append offset, Arabic-Indic digits",
        "POST",
        "/v1/jobs/424242/logs?offset=%D9%A1%D9%A2",
        "worker",
        b"x",
        400,
        "bad_request",
    ),
    (
        "heartbeat other host",
        "POST",
        "/v1/workers/h2/heartbeat",
        "worker",
        b"{}",
        403,
        "wrong_host",
    ),
    (
        "register other host",
        "POST",
        "/v1/workers/register",
        "worker",
        J({"host": "h2", "devices": []}),
        403,
        "wrong_host",
    ),
    (
        "fault other host",
        "POST",
        "/v1/devices/h2:cpu0/fault",
        "worker",
        J({"reason": "x"}),
        403,
        "wrong_host",
    ),
    (
        "fault without reason",
        "POST",
        "/v1/devices/h1:cpu0/fault",
        "worker",
        J({"reason": " "}),
        400,
        "bad_request",
    ),
    (
        "bad device name",
        "POST",
        "/v1/workers/register",
        "admin",
        J({"host": "h3", "devices": [{"name": "a:b"}]}),
        400,
        "bad_request",
    ),
    (
        "token name taken",
        "POST",
        "/v1/tokens",
        "admin",
        J({"name": "u1", "role": "user"}),
        409,
        "token_exists",
    ),
    ("revoke unknown token", "DELETE", "/v1/tokens/nobody", "admin", None, 404, "not_found"),
    (
        "revoke the last admin",
        "DELETE",
        "/v1/tokens/admin",
        "admin",
        None,
        409,
        "last_admin_token",
    ),
    (
        "reason too long",
        "POST",
        "/v1/jobs",
        "user",
        J({"command": ["x"], "selector": "*", "reason": "r" * 5000}),
        400,
        "limit_exceeded",
    ),
    (
        "heartbeat too large",
        "POST",
        "/v1/workers/h1/heartbeat",
        "worker",
        b'{"running_job_ids":[' + b"1," * 40000 + b"1]}",
        413,
        "body_too_large",
    ),
]


@pytest.mark.parametrize("name,method,path,role,body,status,code", CASES, ids=[c[0] for c in CASES])
def test_error_shape(live, name, method, path, role, body, status, code):
    ctl, tokens = live
    token = tokens.get(role, role) if role else None
    got, headers, data = raw(ctl.url, method, path, token, body)
    assert got == status, data
    assert headers["content-type"] == "application/json"
    assert headers[INSTANCE_HEADER.lower()]
    payload = json.loads(data)
    assert set(payload) == {"error", "message"}
    assert payload["error"] == code
    assert got in statuses(ErrorCode(code))
    assert payload["message"] and "Traceback" not in payload["message"]


def test_success_carries_the_instance_header_too(live):
    ctl, tokens = live
    status, headers, _ = raw(ctl.url, "GET", "/v1/whoami", tokens["user"])
    assert status == 200
    assert headers[INSTANCE_HEADER.lower()]


@pytest.mark.parametrize("last", ["\u00b2", "x1"])
def test_a_last_event_id_that_is_not_ascii_digits_is_a_400(live, last):
    """`Last-Event-ID: ²` (a superscript two passes str.isdigit() and fails
    int()) was a 500 with a traceback in the log."""
    ctl, tokens = live
    got, _headers, data = raw(
        ctl.url, "GET", "/v1/events/stream", tokens["user"], headers={"Last-Event-ID": last}
    )
    assert got == 400, data
    assert json.loads(data)["error"] == "bad_request"


def test_no_traceback_in_the_controller_log_after_bad_input(live):
    ctl, _ = live
    assert "Traceback" not in ctl.log()
