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
import time
import urllib.parse

import pytest

from rc.controller.app import build_app
from rc.controller.config import ControllerConfig
from rc.controller.core import Controller as InProcessController
from tests.helpers.wait import until

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


def test_an_idle_stream_sends_keepalives(tmp_path):
    async def body(ctl, app, b, token):
        b.keepalive_s = 0.05
        r = Reader()
        task = asyncio.create_task(app(scope_for(token), r.receive, r.send))
        await until(
            lambda: r.body().count(b": keepalive\n\n") >= 2,
            timeout=5.0,
            interval=0.01,
            what="two keepalives",
        )
        r.gone.set()
        await asyncio.wait_for(task, 5)
        assert b.count() == 0

    in_process(tmp_path, body)


def test_a_reader_that_stops_reading_is_dropped_and_never_buffers(tmp_path):
    async def body(ctl, app, b, token):
        b.write_timeout_s = 0.3
        b.frame_interval_s = 0.0
        r = Reader(allow=1)  # takes the hello, then never reads again
        task = asyncio.create_task(app(scope_for(token), r.receive, r.send))
        await until(
            lambda: b.count() == 1 and b"hello" in r.body(),
            timeout=5.0,
            interval=0.01,
            what="the hello frame",
        )
        sub = next(iter(b.subs))
        started = time.monotonic()
        most = 0
        while not task.done():
            for _ in range(200):  # commits keep coming; none of them waits for the reader
                ctl.hub.notify(["devices", "jobs", "events", "log:1", "job:1"])
            most = max(most, len(sub.pending))
            await asyncio.sleep(0.01)
        assert time.monotonic() - started < 3.0
        assert most <= 3
        assert b.count() == 0

    in_process(tmp_path, body)


def test_streams_past_the_limit_are_refused_in_the_error_shape(tmp_path):
    async def body(ctl, app, b, token):
        b.max = 1
        first = Reader()
        task = asyncio.create_task(app(scope_for(token), first.receive, first.send))
        await until(lambda: b.count() == 1, timeout=5.0, interval=0.01, what="one subscriber")
        second = Reader()
        await app(scope_for(token), second.receive, second.send)
        assert second.status() == 503
        assert json.loads(second.body())["error"] == "unavailable"
        first.gone.set()
        await asyncio.wait_for(task, 5)

    in_process(tmp_path, body)


def test_shutdown_ends_every_stream_at_once(tmp_path):
    async def body(ctl, app, b, token):
        readers = [Reader() for _ in range(3)]
        tasks = [asyncio.create_task(app(scope_for(token), r.receive, r.send)) for r in readers]
        await until(lambda: b.count() == 3, timeout=5.0, interval=0.01, what="three subscribers")
        ctl.hub.close()
        await asyncio.wait_for(asyncio.gather(*tasks), 2)
        for r in readers:
            assert r.messages[-1] == {"type": "http.response.body", "body": b"", "more_body": False}
        assert b.count() == 0

    in_process(tmp_path, body)
