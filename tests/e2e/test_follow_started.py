"""An attached `rc run` that lost sight of its queued job (an outage, a
controller restart) and next sees it ended: it ran if it has a start, and
rc run then shows its output and exits with its code, as for any job that
ended before it looked (rc.cli.follow.wait_started)."""

from __future__ import annotations

import itertools
import threading

import pytest

from rc.cli.follow import wait_running, wait_terminal
from rc.proto import calls
from rc.proto.errors import RcError
from tests.helpers.wait import wait_until

TERMINAL = ("succeeded", "failed", "killed", "lost")


def test_a_job_seen_ended_after_queued_ran_if_it_has_a_start(controller, make_worker):
    make_worker(controller, devices="cpu:1")
    c = controller.client(controller.token("alice"))
    job = c.post("/v1/jobs", {"command": ["sh", "-c", "echo dq; exit 5"], "selector": "*"})["job"]
    wait_until(
        lambda: c.get(f"/v1/jobs/{job['id']}")["job"]["state"] in TERMINAL, 30, "the job's end"
    )
    # what the client last saw before the outage: queued, position 1
    stale = {**job, "state": "queued"}
    seen = wait_running(c, stale, 1, "any device")
    assert seen is not None and seen["state"] == "failed" and seen["exit_code"] == 5
    assert seen["started_at"] is not None


def test_a_job_cancelled_while_queued_still_ended_without_starting(controller, make_worker):
    make_worker(controller, devices="cpu:1")
    c = controller.client(controller.token("alice"))
    hold = c.post(
        "/v1/jobs",
        {"kind": "hold", "selector": "*", "max_runtime_seconds": 600, "reason": "busy"},
    )["job"]
    wait_until(lambda: c.get(f"/v1/jobs/{hold['id']}")["job"]["state"] == "running", 30, "the hold")
    job = c.post("/v1/jobs", {"command": ["true"], "selector": "*"})["job"]
    c.post(f"/v1/jobs/{job['id']}/kill", {"reason": "not now"})
    with pytest.raises(RcError, match="ended without starting"):
        wait_running(c, {**job, "state": "queued"}, 1, "any device")


def test_waiting_for_an_end_names_the_queue_position_it_was_given(controller, make_worker):
    """wait_terminal long-polls with the state and the queue position of
    the last answer: a poll naming another position is answered at once, so
    a job waiting in the queue (a requeued one) would cost a request per
    round trip."""
    make_worker(controller, devices="cpu:1")
    c = controller.client(controller.token("alice"))
    hold = c.post(
        "/v1/jobs", {"kind": "hold", "selector": "*", "max_runtime_seconds": 600, "reason": "b"}
    )["job"]
    wait_until(lambda: c.get(f"/v1/jobs/{hold['id']}")["job"]["state"] == "running", 30, "hold")
    queued = c.post("/v1/jobs", {"command": ["true"], "selector": "*"})["job"]
    polls: list[tuple[dict, dict]] = []
    real = c.call

    def call(spec, *args, **kw):
        got = real(spec, *args, **kw)
        if spec is calls.JOB_GET:
            polls.append((kw.get("params") or {}, got))
        return got

    c.call = call
    ended: list[dict] = []
    t = threading.Thread(target=lambda: ended.append(wait_terminal(c, queued["id"])))
    t.start()
    wait_until(lambda: len(polls) >= 1, 30, "the first answer")
    assert polls[0][1]["queue_position"] == 1
    c.post(f"/v1/jobs/{hold['id']}/kill", {})
    t.join(60)
    assert ended and ended[0]["state"] == "succeeded"
    for (_, before), (params, _) in itertools.pairwise(polls):
        assert params["position"] == before.get("queue_position", 0), polls
