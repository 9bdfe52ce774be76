"""The controller's ASGI app called in-process as a worker calls it: a worker secret and one request."""

from __future__ import annotations

import asyncio
import threading

import orjson
import pytest

from rc.controller.auth import Caller, hash_secret
from rc.proto import calls
from rc.proto.model import Role
from rc.proto.wire import WORKER_PROTOCOL
from tests.helpers.inprocess import Lab

SECRET = "worker-secret-for-the-test"


async def call(
    app, method: str, path: str, body=None, query: str = "", token: str | None = SECRET
) -> tuple[int, bytes]:
    """One HTTP request to the ASGI `app` with bearer `token` (by default
    the worker of host "again"'s secret; None: no authorization header):
    returns (status, body)."""
    raw = orjson.dumps(body) if body is not None else b""
    auth = [(b"authorization", f"Bearer {token}".encode())] if token is not None else []
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": query.encode(),
        "root_path": "",
        "headers": [
            *auth,
            (b"content-type", b"application/json"),
            (b"content-length", str(len(raw)).encode()),
        ],
        "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 80),
    }
    sent = False
    status, chunks = 0, []

    async def receive():
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": raw, "more_body": False}
        await asyncio.Event().wait()  # the client never goes away by itself

    async def send(message):
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]
        elif message["type"] == "http.response.body":
            chunks.append(message.get("body", b""))

    await app(scope, receive, send)
    return status, b"".join(chunks)


REG = {
    "host": "again",
    "devices": [{"name": "cpu0"}],
    "allow_root_jobs": True,
    "protocol": WORKER_PROTOCOL,
}


REPORTS = "/v1/workers/again/reports"


@pytest.fixture
def lab():
    lab = Lab()
    lab.ctl.tokens.put_session(hash_secret(SECRET), Caller(0, "w-again", Role.WORKER, "again"))
    yield lab
    lab.close()


class _Uploads:
    """The controller's log endpoint as a LogSink sees it (Client.call):
    keeps each upload's offset and bytes; while `gate` is clear an upload
    waits (a controller that is slow, not gone)."""

    def __init__(self) -> None:
        self.got: list[tuple[int, bytes]] = []
        self.gate = threading.Event()
        self.gate.set()

    def call(self, route, job_id, *, body, params):
        assert route is calls.LOG_APPEND
        assert self.gate.wait(30), "a held upload was never released"
        self.got.append((params["offset"], bytes(body)))

    def bytes(self) -> bytes:
        return b"".join(data for _, data in self.got)
