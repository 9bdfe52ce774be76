"""GET /v1/events/stream: Server-Sent Events for the
dashboard. Over HTTP against a real `rc serve`: auth (header or ?token=, the
only route that takes one), change and feed frames, resume. In process, driving
the ASGI app of a real Controller (real SQLite) with a reader we control:
keepalives, a slow reader dropped within the write deadline while commits keep
flowing, the subscriber limit, and shutdown."""

from __future__ import annotations

import http.client
import json
import urllib.parse

from tests.helpers.dashboard_stream import stream_of  # noqa: F401 (fixtures)


def test_the_stream_needs_a_user_token(controller, stream_of):
    s = stream_of()
    assert s.resp.status == 401
    assert json.loads(s.resp.read())["error"] == "unauthorized"
    s = stream_of("?token=rc_not-a-token")
    assert s.resp.status == 401
    worker = controller.token("w1", "worker")
    s = stream_of("?token=" + worker)
    assert s.resp.status == 403
    assert json.loads(s.resp.read())["error"] == "forbidden"
    s = stream_of("?token=" + controller.token("carol"))
    assert s.resp.status == 200
    assert s.resp.getheader("Content-Type").startswith("text/event-stream")
    assert s.frame()["event"] == "hello"


def test_no_other_route_takes_a_query_token(controller):
    u = urllib.parse.urlsplit(controller.url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=10)
    for path in ("/v1/state", "/v1/events", "/metrics"):
        conn.request("GET", f"{path}?token={controller.admin_token}")
        r = conn.getresponse()
        assert r.status == 401, path
        assert json.loads(r.read())["error"] == "unauthorized"
    conn.close()


def test_changes_and_feed_rows_arrive_and_the_token_is_never_logged(controller, stream_of):
    admin = controller.client()
    s = stream_of("?token=" + controller.admin_token)
    hello = s.frame()
    assert hello["event"] == "hello" and hello["data"]["instance"]
    newest = hello["data"]["after"]
    assert newest == max(e["id"] for e in admin.get("/v1/events")["events"])

    admin.post("/v1/workers/register", {"host": "h1", "devices": [{"name": "d0"}]})
    change = s.until(lambda f: f["event"] == "change")
    assert "devices" in change["data"]["keys"] and change["data"]["at"] > 0

    admin.post("/v1/devices/h1:d0/fault", {"reason": "fan failure"})
    row = s.until(lambda f: f["event"] == "feed")
    assert row["data"]["kind"] == "device_unhealthy"
    assert row["data"]["device_id"] == "h1:d0" and row["data"]["text"] == "fan failure"
    assert int(row["id"]) == row["data"]["id"] > newest
    assert controller.admin_token not in controller.log()


def test_a_resumed_stream_replays_the_rows_it_missed_in_order(controller, stream_of):
    for name in ("r1", "r2", "r3"):
        controller.token(name)  # each leaves a token_created row
    ids = [e["id"] for e in controller.client().get("/v1/events")["events"]]
    assert len(ids) >= 4
    s = stream_of("?token=" + controller.admin_token, {"Last-Event-ID": str(ids[0])})
    assert s.frame()["data"]["after"] == ids[0]
    got = [int(s.until(lambda f: f["event"] == "feed")["id"]) for _ in ids[1:]]
    assert got == ids[1:]
    s = stream_of(f"?after={ids[-2]}", {"Authorization": f"Bearer {controller.admin_token}"})
    assert int(s.until(lambda f: f["event"] == "feed")["id"]) == ids[-1]


# -------------------------------------------------------------- in process
