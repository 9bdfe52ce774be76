"""Listings stay small (README "Limits"): what the store lists of a job with
a 256 KiB command, and the per-user budget of queued spec bytes, on both
engines. Found in a lab trial: 1,000 queued jobs of 256 KiB commands made
`GET /v1/state` 201 MB and the controller 1.37 GB after one dashboard load."""

from __future__ import annotations

import pytest

from rc.controller.config import Limits
from rc.controller.errors import Refused
from rc.controller.store import devices, events, jobs, rows, views
from rc.controller.store.db import dumps
from rc.proto.errors import ErrorCode
from rc.proto.listed import CUT_MARK, LISTED_TEXT_CHARS, listed_chars
from rc.proto.model import EventKind, JobState
from tests.helpers.inprocess import Lab, local_user

pytestmark = pytest.mark.usefixtures("engine")  # each test on SQLite, then PostgreSQL

LONG = ("echo", "x" * ((256 << 10) - 4))
"""A command at the limit: 256 KiB of arguments."""
REASON = "r" * 4000


def _listed(argv: tuple[str, ...]) -> bool:
    """Whether `argv` is LONG as a listing carries it."""
    return (
        listed_chars(argv) <= LISTED_TEXT_CHARS
        and argv[-1].endswith(CUT_MARK)
        and argv[0] == "echo"
        and LONG[1].startswith(argv[-1][:-1])
    )


@pytest.fixture
def lab():
    lb = Lab()
    lb.register("h", {"d0": (0, {})})
    yield lb
    lb.close()


def test_listings_state_and_the_feed_carry_a_long_command_cut_and_the_job_whole(lab):
    running, _ = lab.submit(command=LONG, reason=REASON)
    lab.kick()
    assert lab.job(running).state is JobState.ASSIGNED
    queued, _ = lab.submit(command=LONG, reason=REASON)
    lab.write(jobs.kill, running, local_user("alice"), REASON)  # a kill reason too
    policy = lab.ctl.policy

    st = lab.read(views.state, policy)
    [active], [waiting] = st.jobs, st.queued
    assert (active.id, waiting.id) == (running, queued)
    for j in (active, waiting):
        assert _listed(j.command), j.command[-1][-20:]
        assert len(j.reason) == LISTED_TEXT_CHARS and j.reason.endswith(CUT_MARK)
    assert len(active.kill_reason) <= LISTED_TEXT_CHARS and active.kill_reason.endswith(CUT_MARK)
    [dev] = st.devices
    assert dev.job_id == running and _listed(dev.command) and len(dev.reason) <= 256

    listing = lab.read(jobs.listing, jobs.Filter(), 10)
    assert [j.id for j in listing] == [queued, running]
    assert all(_listed(j.command) and j.reason.endswith(CUT_MARK) for j in listing)
    recent = lab.read(views.describe, "h:d0").recent_jobs
    assert [j.id for j in recent] == [running] and _listed(recent[0].command)

    # GET /v1/jobs/ID (rc show) carries the job whole
    whole = lab.read(views.job_view, queued, policy).job
    assert whole.command == LONG and whole.reason == REASON
    assert lab.job(running).kill_reason.endswith(REASON)

    # the feed: an event's text cut, the device's own record whole
    lab.write(devices.drain, "h:d0", True, REASON, "root")
    feed = lab.read(events.since, 0, 0.0, 100)
    drained = [e for e in feed if e.kind is EventKind.DEVICE_DRAINED]
    assert drained and all(len(e.text) <= LISTED_TEXT_CHARS for e in feed)
    assert drained[0].text.endswith(CUT_MARK)
    assert lab.read(events.after, 0, 100)[-1].text.endswith(CUT_MARK)
    assert lab.read(views.describe, "h:d0").view.device.drain_reason == REASON


def _spec(command: tuple[str, ...]) -> int:
    return len(dumps(list(command)).encode()) + len(b"{}")


def test_the_budget_of_queued_spec_bytes_refuses_past_it_and_keeps_what_it_took():
    per = _spec(LONG)
    lab = Lab(limits=Limits(queued_spec_bytes=2 * per + 100))
    try:
        lab.register("h", {"d0": (0, {})})
        lab.write(devices.drain, "h:d0", True, "keep them queued", "root")
        first, _ = lab.submit(command=LONG)
        second, _ = lab.submit(command=LONG)
        with pytest.raises(Refused) as e:
            lab.submit(command=LONG)
        assert (e.value.status, e.value.code) == (429, ErrorCode.QUEUED_SPEC_BYTES)
        words = e.value.message
        assert f"alice has {2 * per:,} bytes (512.0 KiB) of job specs queued" in words, words
        assert f"this job's {per:,} bytes" in words
        assert f"per-user budget of {2 * per + 100:,} bytes" in words
        assert "--max-queued-spec-bytes" in words and "nothing was queued" in words
        # an array counts every element: 20 of 10 bytes pass the 100 left
        small = ("true",)
        assert 20 * _spec(small) > 100 >= _spec(small)
        with pytest.raises(Refused) as e:
            lab.submit(command=small, array="0-19")
        assert e.value.code == ErrorCode.QUEUED_SPEC_BYTES
        assert "this array's 20 elements'" in e.value.message
        # nothing accepted was lost, and nothing refused was queued
        queued = lab.read(jobs.listing, jobs.Filter(states=("queued",)), 100)
        assert [j.id for j in queued] == [second, first]
        # another user has a budget of their own; a cancel frees room
        lab.submit("bob", command=LONG)
        lab.kill(first)
        again, _ = lab.submit(command=LONG)
        assert lab.job(again).state is JobState.QUEUED
    finally:
        lab.close()


def test_a_jobs_spec_bytes_are_its_stored_texts_in_utf8(lab):
    """The spec bytes a submit stores are what schema 11 counted for old
    jobs: command and env as stored, cwd, reason, array item, in bytes."""
    first, _ = lab.submit(
        command=("echo", "h\u00e9llo \u2603"),
        env={"K": "v\u00e9"},
        cwd="/tmp/\u00e9",
        reason="why \u2603",
        array_items=("a", "\u00e9\u00e9"),
    )
    for job_id in (first, first + 1):
        r = lab.read(lambda tx, i=job_id: tx.one("job_get", (i,)))
        texts = (r["command"], r["env"], r["cwd"], r["reason"], r["array_item"])
        assert r["spec_bytes"] == sum(len(t.encode()) for t in texts), job_id
    assert rows.job(r).array_item == "\u00e9\u00e9"
