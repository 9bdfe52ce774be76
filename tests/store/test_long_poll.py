"""The worker's long poll, driven through the real ASGI app in-process (no
server, so that the test decides the order of requests exactly)."""

from __future__ import annotations

import asyncio

import orjson
import pytest

from rc.controller.app import build_app
from rc.controller.auth import Caller, hash_secret
from rc.proto.model import Role
from tests.helpers.asgi import SECRET, call
from tests.helpers.inprocess import Lab
from tests.helpers.wait import until

pytestmark = pytest.mark.usefixtures("engine")  # each test on SQLite, then PostgreSQL


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
            await until(lambda: lab.ctl.scans.polls.get("again"), 10, "the first poll to begin")
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
