"""Worker protocol 2: the reply to a reports request carries the worker's new
assignments (POST /v1/workers/{id}/reports?assignments=1), and a job's long
poll answers a move in the queue once settled. Driven through the real ASGI
app in-process (tests.test_long_poll.call), on SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import time

import orjson
import pytest

from rc.controller.api.jobs import POSITION_SETTLE_S
from rc.controller.app import build_app
from rc.controller.auth import Caller, hash_secret
from rc.controller.store import jobs
from rc.proto.model import JobState, Role
from rc.proto.wire import WORKER_PROTOCOL
from tests.helpers.asgi import (
    REG,
    REPORTS,
    SECRET,
    call,
    lab,  # noqa: F401  (fixtures)
)
from tests.helpers.inprocess import Lab, local_user
from tests.helpers.wait import until

pytestmark = pytest.mark.usefixtures("engine")  # each test on SQLite, then PostgreSQL

POLL = "/v1/workers/again/assignments"


async def submit(lab: Lab) -> int:
    """A `true` job for any device, as POST /v1/jobs queues it; its id."""
    return (await lab.submit_async())[0]


async def parked(lab: Lab, job_id: int) -> None:
    """Until a long poll on job `job_id` waits in the controller's hub."""
    await until(lambda: f"job:{job_id}" in lab.ctl.hub._events, 10, f"a long poll on job {job_id}")


async def finish(lab: Lab, job_id: int) -> None:
    """Its worker reports the job succeeded; the pass after it runs."""
    await lab.ctl.db.write(jobs.release, job_id, "again", JobState.SUCCEEDED, 0, "", None)
    await lab.ctl.kick()


def ended(job_id: int) -> dict:
    """A short job's running and terminal report as one: succeeded, started_at set."""
    return {"job_id": job_id, "state": "succeeded", "exit_code": 0, "started_at": 1.0}


def first_job(lab: Lab, app) -> tuple[int, int]:
    """Register, queue two jobs for the one device, take the first from the
    long poll. Returns (first, second)."""

    async def go():
        assert (await call(app, "POST", "/v1/workers/register", REG))[0] == 200
        a = await submit(lab)
        b = await submit(lab)
        await lab.ctl.kick()
        status, body = await call(app, "GET", POLL, query="wait=5s")
        assert status == 200
        assert [x["job_id"] for x in orjson.loads(body)["assignments"]] == [a]
        return a, b

    return lab.run(go())


def test_a_report_reply_carries_the_job_for_the_device_it_freed_and_the_poll_does_not(lab):
    app = build_app(lab.ctl)
    a, b = first_job(lab, app)

    async def go():
        status, body = await call(app, "POST", REPORTS, {"reports": [ended(a)]}, "assignments=1")
        assert status == 200
        got = orjson.loads(body)
        assert got["results"][0]["ok"] is True
        assert [x["job_id"] for x in got["assignments"]] == [b]
        assert got["assignments"][0]["device_id"] == "again:cpu0"
        # handed out already: the long poll does not answer for it again
        status, _ = await call(app, "GET", POLL, query="wait=0.3s")
        assert status == 204

    lab.run(go())
    assert lab.job(a).state is JobState.SUCCEEDED
    assert lab.job(b).state is JobState.ASSIGNED


def test_a_retried_report_whose_reply_was_lost_carries_the_assignment_again(lab):
    """The first reply never reached the worker: its retry (the same report)
    is taken again and its reply names the same job, assigned once."""
    app = build_app(lab.ctl)
    a, b = first_job(lab, app)

    async def go():
        replies = []
        for _ in range(2):
            status, body = await call(
                app, "POST", REPORTS, {"reports": [ended(a)]}, "assignments=1"
            )
            assert status == 200
            replies.append(orjson.loads(body))
        return replies

    lost, retried = lab.run(go())
    assert [x["job_id"] for x in lost["assignments"]] == [b]
    assert retried["results"][0]["ok"] is True
    assert [x["job_id"] for x in retried["assignments"]] == [b]
    assert retried["assignments"][0]["restart_count"] == lost["assignments"][0]["restart_count"]
    assert lab.job(a).state is JobState.SUCCEEDED
    assert lab.job(b).state is JobState.ASSIGNED and lab.job(b).worker_id == "again"
    # once it runs, no reply carries it any more
    lab.run(call(app, "POST", REPORTS, {"reports": [{"job_id": b, "state": "running"}]}, ""))
    status, body = lab.run(call(app, "POST", REPORTS, {"reports": []}, "assignments=1"))
    assert status == 200 and orjson.loads(body)["assignments"] == []


def test_without_asking_a_report_reply_carries_nothing_and_the_poll_hands_it_out(lab):
    """A worker of protocol 1 (from before the field) never asks: its next
    job comes from the long poll, as before."""
    app = build_app(lab.ctl)
    a, b = first_job(lab, app)

    async def go():
        status, body = await call(app, "POST", REPORTS, {"reports": [ended(a)]})
        assert status == 200 and orjson.loads(body)["assignments"] == []
        status, body = await call(app, "GET", POLL, query="wait=5s")
        assert status == 200
        assert [x["job_id"] for x in orjson.loads(body)["assignments"]] == [b]

    lab.run(go())


def test_a_job_with_a_kill_requested_is_left_to_the_long_poll_with_its_kill(lab):
    app = build_app(lab.ctl)
    a, b = first_job(lab, app)

    async def go():
        status, body = await call(app, "POST", REPORTS, {"reports": [ended(a)]}, "assignments=1")
        assert [x["job_id"] for x in orjson.loads(body)["assignments"]] == [b]
        await lab.ctl.db.write(jobs.kill, b, local_user("alice"), "")
        status, body = await call(app, "POST", REPORTS, {"reports": []}, "assignments=1")
        assert orjson.loads(body)["assignments"] == []
        status, body = await call(app, "GET", POLL, query="wait=5s")
        got = orjson.loads(body)
        assert status == 200 and got["kills"] == [b]

    lab.run(go())


@pytest.mark.parametrize("protocol", [0, WORKER_PROTOCOL + 1, 99])
def test_a_registration_in_a_worker_protocol_this_controller_does_not_speak_is_refused(
    lab, protocol
):
    app = build_app(lab.ctl)
    status, body = lab.run(call(app, "POST", "/v1/workers/register", {**REG, "protocol": protocol}))
    assert status == 400
    err = orjson.loads(body)
    assert err["error"] == "bad_request"
    assert f"speaks worker protocol {protocol}" in err["message"]
    assert f"speaks 1 to {WORKER_PROTOCOL}" in err["message"]
    old = {k: v for k, v in REG.items() if k != "protocol"}  # a worker from before the field
    assert lab.run(call(app, "POST", "/v1/workers/register", old))[0] == 200


def test_a_queued_jobs_long_poll_answers_a_move_once_settled_and_a_state_change_at_once(lab):
    app = build_app(lab.ctl)

    async def get(job_id: int, query: str):
        return await call(app, "GET", f"/v1/jobs/{job_id}", query=query)

    async def go():
        assert (await call(app, "POST", "/v1/workers/register", REG))[0] == 200
        # from here on the test's token is an admin's, who may watch any job
        lab.ctl.tokens.put_session(
            hash_secret(SECRET), Caller(0, "root", Role.ADMIN, unix_user="root", uid=0)
        )
        a = await submit(lab)  # runs
        b = await submit(lab)  # queued, position 1
        c = await submit(lab)  # queued, position 2
        await lab.ctl.kick()
        t0 = time.monotonic()
        watch = asyncio.create_task(get(c, "wait=10&state=queued&position=2"))
        await parked(lab, c)
        await finish(lab, a)  # b takes the device: c moves to position 1
        status, body = await asyncio.wait_for(watch, 10)
        took = time.monotonic() - t0
        assert status == 200 and orjson.loads(body)["queue_position"] == 1
        assert took >= POSITION_SETTLE_S, f"answered a move after {took:.3f} s"
        # a position that differs when the poll begins: at once
        t0 = time.monotonic()
        status, body = await get(c, "wait=10&state=queued&position=2")
        assert orjson.loads(body)["queue_position"] == 1
        assert time.monotonic() - t0 < POSITION_SETTLE_S
        # a state change while it waits: at once
        watch = asyncio.create_task(get(b, "wait=10&state=assigned&position=0"))
        await parked(lab, b)
        t0 = time.monotonic()
        await finish(lab, b)
        status, body = await asyncio.wait_for(watch, 10)
        assert orjson.loads(body)["job"]["state"] == "succeeded"
        assert time.monotonic() - t0 < POSITION_SETTLE_S

    lab.run(go())


def test_a_worker_refused_by_a_controller_from_before_the_protocol_says_so():
    """Such a controller refuses the field itself (strict decoding): the
    worker's log line names an older controller, not just the field."""
    from rc.proto.errors import ApiError
    from rc.worker.registration import _explain_refusal

    old = ApiError(400, "bad_request", "RegisterRequest.protocol is not a known field")
    assert "the controller is older than this worker" in _explain_refusal(old)
    assert f"worker protocol {WORKER_PROTOCOL}" in _explain_refusal(old)
    other = ApiError(400, "limit_exceeded", "2000 devices; a worker may declare 1024")
    assert _explain_refusal(other) == str(other)


def test_an_assignment_a_reply_carries_after_its_kill_came_is_reported_killed_not_run():
    """The long poll hands out a job with a kill requested together with its
    kill; a report reply read before the kill may carry the job after the
    kill reached the worker. The worker remembers the kill of a job it does
    not run and reports the job killed instead of starting it, once."""
    from rc.proto.model import JobKind
    from rc.proto.wire import Assignment, Assignments
    from rc.worker.dispatch import Dispatcher
    from rc.worker.runs import Runs

    def never(what):
        def called(*args):
            pytest.fail(f"{what} for {args}")

        return called

    reported = []
    runs = Runs()
    # the agent's dispatch by its constructor: no controller, no threads
    dispatch = Dispatcher(
        runs,
        reported.append,
        never("a job run was made"),
        never("a session was run"),
        never("a scan was answered"),
    )
    job = Assignment(7, "h:cpu0", JobKind.JOB, ("true",), "/", {}, "alice")
    dispatch.dispatch(Assignments(kills=(7,)))
    dispatch.dispatch(Assignments(assignments=(job,)))
    dispatch.dispatch(Assignments(assignments=(job,)))  # the retry's reply carries it again
    assert [(r.job_id, r.state) for r in reported] == [(7, "killed")]
    assert runs.running() == {} and runs.unsettled() == (7,)


def test_a_bad_assignments_parameter_is_refused_before_any_report_is_applied(lab):
    app = build_app(lab.ctl)
    a, _ = first_job(lab, app)
    status, body = lab.run(call(app, "POST", REPORTS, {"reports": [ended(a)]}, "assignments=maybe"))
    assert status == 400
    assert orjson.loads(body)["message"] == "query parameter assignments must be true or false"
    assert lab.job(a).state is JobState.ASSIGNED
