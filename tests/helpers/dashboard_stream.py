"""What tests/e2e/test_dashboard_stream.py and its fast-lane half
tests/unit/test_dashboard_stream.py share: their helpers and fixtures,
written once (the fixtures are imported by name, as fleet_users' are)."""

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
