"""GET /v1/events/stream: Server-Sent Events for the
dashboard. Over HTTP against a real `rc serve`: auth (header or ?token=, the
only route that takes one), change and feed frames, resume. In process, driving
the ASGI app of a real Controller (real SQLite) with a reader we control:
keepalives, a slow reader dropped within the write deadline while commits keep
flowing, the subscriber limit, and shutdown."""

from __future__ import annotations

import asyncio
import http.client
import json
import urllib.parse

import pytest

from rc.controller.app import build_app
from rc.controller.config import ControllerConfig
from rc.controller.core import Controller as InProcessController

STREAM = "/v1/events/stream"


class Stream:
    """A raw SSE reader over http.client with a per-read deadline."""

    def __init__(self, url: str, target: str, headers: dict[str, str] | None = None) -> None:
        u = urllib.parse.urlsplit(url)
        self.conn = http.client.HTTPConnection(u.hostname, u.port, timeout=10)
        self.conn.request("GET", target, headers=headers or {})
        self.resp = self.conn.getresponse()

    def close(self) -> None:
        self.conn.close()

    def frame(self) -> dict:
        """The next frame: {"event", "id", "data"} (comments are skipped)."""
        out: dict = {}
        while True:
            line = self.resp.readline()
            assert line, "the stream ended"
            text = line.decode().rstrip("\n")
            if not text:
                if out:
                    return out
                continue
            if text.startswith((":", "retry:")):
                continue
            field, _, val = text.partition(": ")
            out[field] = json.loads(val) if field == "data" else val

    def until(self, pred, limit: int = 50) -> dict:
        for _ in range(limit):
            f = self.frame()
            if pred(f):
                return f
        raise AssertionError("no matching frame")


@pytest.fixture
def stream_of(controller):
    opened: list[Stream] = []

    def open_(query: str = "", headers: dict[str, str] | None = None) -> Stream:
        s = Stream(controller.url, STREAM + query, headers)
        opened.append(s)
        return s

    yield open_
    for s in opened:
        s.close()


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


class Reader:
    """Plays the HTTP server's side for one ASGI request: `blocked` makes
    every body write after the first `allow` wait forever (a reader that
    stopped reading)."""

    def __init__(self, allow: int | None = None) -> None:
        self.messages: list[dict] = []
        self.allow = allow
        self.gone = asyncio.Event()

    async def receive(self) -> dict:
        if not hasattr(self, "_sent_request"):
            self._sent_request = True
            return {"type": "http.request", "body": b"", "more_body": False}
        await self.gone.wait()
        return {"type": "http.disconnect"}

    async def send(self, message: dict) -> None:
        bodies = sum(1 for m in self.messages if m["type"] == "http.response.body")
        if (
            message["type"] == "http.response.body"
            and self.allow is not None
            and bodies >= self.allow
        ):
            await asyncio.Event().wait()  # never returns
        self.messages.append(message)

    def body(self) -> bytes:
        return b"".join(
            m.get("body", b"") for m in self.messages if m["type"] == "http.response.body"
        )

    def status(self) -> int:
        return next(m["status"] for m in self.messages if m["type"] == "http.response.start")


def scope_for(token: str, path: str = STREAM) -> dict:
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "GET",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [(b"authorization", f"Bearer {token}".encode())],
        "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 2),
    }


def in_process(tmp_path, body):
    async def main():
        ctl = InProcessController(ControllerConfig(data_dir=str(tmp_path / "data")))
        await ctl.start(loops=False)
        app = build_app(ctl)
        token = (tmp_path / "data" / "admin.token").read_text().strip()
        try:
            return await asyncio.wait_for(body(ctl, app, app.app.state.stream, token), 30)
        finally:
            await ctl.stop()

    return asyncio.run(main())
