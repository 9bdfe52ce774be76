"""The worker's long poll, driven through the real ASGI app in-process (no
server, so that the test decides the order of requests exactly)."""

from __future__ import annotations

import asyncio
import time

import orjson
import pytest

from rc.controller.app import build_app
from rc.controller.auth import Caller, hash_secret
from rc.proto.model import Role
from tests.helpers.inprocess import Lab

pytestmark = pytest.mark.usefixtures("engine")  # each test on SQLite, then PostgreSQL

SECRET = "worker-secret-for-the-test"


async def call(app, method: str, path: str, body=None, query: str = "") -> tuple[int, bytes]:
    """One HTTP request to the ASGI `app` as the worker of host "again":
    returns (status, body)."""
    raw = orjson.dumps(body) if body is not None else b""
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
            (b"authorization", f"Bearer {SECRET}".encode()),
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


def test_a_poll_parked_before_its_worker_registers_again_hands_out_nothing():
    """CI found a job waiting a whole heartbeat interval: the long poll of a
    worker killed with -9 stays parked until the controller notices the
    connection is gone. If its successor registered but had not polled yet,
    the parked poll took the next job and the hand-out went to a dead
    connection. Registering supersedes every older poll."""
    lab = Lab()
    try:
        app = build_app(lab.ctl)
        lab.ctl.tokens.put_session(hash_secret(SECRET), Caller(0, "w-again", Role.WORKER, "again"))
        reg = {"host": "again", "devices": [{"name": "cpu0"}], "allow_root_jobs": True}
        polls = "/v1/workers/again/assignments"

        async def scenario():
            assert (await call(app, "POST", "/v1/workers/register", reg))[0] == 200
            stale = asyncio.create_task(call(app, "GET", polls, query="wait=30s"))
            deadline = time.monotonic() + 10
            while not lab.ctl.scans.polls.get("again"):  # the stale poll has begun
                assert time.monotonic() < deadline, "the first poll never began"
                await asyncio.sleep(0.005)
            assert (await call(app, "POST", "/v1/workers/register", reg))[0] == 200
            job_id, _ = await lab.submit_async()
            await lab.ctl.kick()
            status, _ = await asyncio.wait_for(stale, 10)
            assert status == 204, "the superseded poll handed out the job"
            status, body = await asyncio.wait_for(call(app, "GET", polls, query="wait=5s"), 10)
            assert status == 200
            assert [a["job_id"] for a in orjson.loads(body)["assignments"]] == [job_id]

        lab.run(scenario())
    finally:
        lab.close()
