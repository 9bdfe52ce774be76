"""A worker stopping cleanly hands back what it never started: an assigned
job goes back to the queue only when it provably never started, and one
that may have run is lost (docs/design.md#job-states). On the real store
with a fake clock: rc.controller.store.workers.leave and the registration
after it."""

from __future__ import annotations

import pytest

from rc.controller.errors import Refused
from rc.controller.store import workers
from rc.proto.model import JobState
from tests.helpers.leave import (
    _behind_a_running_job,
    box,  # noqa: F401 (fixtures)
)


def test_an_assigned_job_never_started_goes_back_to_its_place(box):
    """Found by a new user: `rc down` then `rc up -d` made a job that was
    assigned but never started `lost (worker re-registered)`."""
    _, b, c = _behind_a_running_job(box)
    before = box.row(b)
    assert box.leave("first") == ([b], [])
    after = box.row(b)
    assert after["state"] == "queued"
    assert (after["device_id"], after["worker_id"], after["assigned_at"]) == ("", "", None)
    for same in ("priority", "queued_at", "submitted_at", "selector", "command"):
        assert after[same] == before[same], same
    assert not box.live_lease(b)
    assert box.device() == "unknown", "nothing more is handed to a worker that is leaving"
    assert box.job(b).state is JobState.QUEUED and box.job(c).state is JobState.QUEUED
    box.register("second")  # the next worker process: b runs first, nothing is lost
    assert box.job(b).state is JobState.ASSIGNED
    assert box.job(c).state is JobState.QUEUED
    assert box.lost() == []
    assert box.device() == "busy"


def test_a_pinned_job_keeps_its_device_and_a_high_priority_its_rank(box):
    _, b, c = _behind_a_running_job(box, device_id="h:cpu0", priority=5)
    box.leave("first")
    assert (box.row(b)["device_id"], box.row(b)["priority"]) == ("h:cpu0", 5)
    box.register("second")
    assert box.job(b).state is JobState.ASSIGNED and box.job(c).state is JobState.QUEUED


def test_a_job_the_worker_may_have_started_stays_and_is_lost_at_registration(box):
    _, b, _ = _behind_a_running_job(box)
    assert box.leave("first", started=[b]) == ([], [])
    assert box.job(b).state is JobState.ASSIGNED
    box.register("second")
    assert box.job(b).state is JobState.LOST
    assert box.lost() == [b]


def test_silence_is_no_proof_a_crashed_worker_loses_its_assigned_job(box):
    _, b, _ = _behind_a_running_job(box)
    box.register("second")  # no leave: the first process was killed with -9
    assert box.job(b).state is JobState.LOST


def test_only_the_registered_process_can_hand_jobs_back(box):
    _, b, _ = _behind_a_running_job(box)
    for claim in ("someone-else", ""):
        with pytest.raises(Refused) as e:
            box.leave(claim)
        assert (e.value.status, e.value.code) == (409, "conflict")
    assert box.job(b).state is JobState.ASSIGNED and box.device() == "busy"
    with pytest.raises(Refused) as e:
        box.write(workers.leave, "nobody", "first", ())
    assert e.value.status == 404


def test_a_job_killed_while_assigned_ends_killed_instead_of_queued(box):
    _, b, _ = _behind_a_running_job(box)
    box.kill(b)
    assert box.leave("first") == ([], [b])
    j = box.job(b)
    assert (j.state, j.kill_reason) == (JobState.KILLED, "killed by alice")
    assert not box.live_lease(b)


# -- rc hold, waiting on a hold that goes back to the queue -----------------------
