"""The store's contract (rc/controller/store/__init__.py): a guarded write
changes exactly one row or raises, and what its transaction function wrote
is rolled back with it."""

from __future__ import annotations

import pytest

from rc.controller.errors import GuardFailed, StoreError
from rc.controller.store import devices, events, jobs, workers
from rc.proto.model import EventKind, JobKind, JobState
from rc.proto.wire import JobReport
from tests.helpers.inprocess import Lab

pytestmark = pytest.mark.usefixtures("engine")  # each test on SQLite, then PostgreSQL


@pytest.fixture
def lab():
    lb = Lab()
    lb.register("h", {"d0": (0, {})})
    yield lb
    lb.close()


def test_a_guarded_change_of_no_row_raises_naming_the_query(lab):
    def cancel_nothing(tx):
        tx.change("job_cancel_queued", ("gone", tx.now, 999_999))

    with pytest.raises(GuardFailed, match=r"query job_cancel_queued changed 0 rows") as err:
        lab.write(cancel_nothing)
    assert isinstance(err.value, StoreError)


def test_a_guarded_change_checks_the_state_it_is_guarded_by(lab):
    """`UPDATE ... WHERE state = 'assigned'` on a running job changes no row:
    with tx.change that is an error, not a silent no-op."""
    job_id, _ = lab.submit()
    worker = lab.job(job_id).worker_id
    assert lab.write(jobs.mark_running, job_id, worker, lab.now)

    def requeue_a_running_job(tx):
        tx.change("job_requeue", (job_id,))

    with pytest.raises(GuardFailed, match="job_requeue"):
        lab.write(requeue_a_running_job)
    assert lab.job(job_id).state is JobState.RUNNING


def test_a_failed_guard_rolls_back_what_its_function_wrote(lab):
    before = lab.read(events.last_id)

    def record_then_fail(tx):
        events.record(tx, EventKind.DEVICE_CLEARED, device_id="h:d0", text="never")
        tx.change("device_drain", (1, "x", "no:such"))

    with pytest.raises(GuardFailed, match="device_drain"):
        lab.write(record_then_fail)
    assert lab.read(events.last_id) == before
    # the writer goes on: the next transaction commits
    lab.write(lambda tx: events.record(tx, EventKind.DEVICE_CLEARED, device_id="h:d0", text="ok"))
    # ids increase but need not be dense: a PostgreSQL sequence never gives
    # back the id a rolled-back insert took
    assert [e.text for e in lab.read(events.after, before, 10)] == ["ok"]


def test_reports_return_the_start_latency_of_each_job_they_started(lab):
    job_id, _ = lab.submit()
    worker = lab.job(job_id).worker_id
    lab.now += 2.5
    running = JobReport(job_id, JobState.RUNNING, None, "", lab.now)
    applied = lab.write(jobs.apply_reports, worker, (running,))
    assert applied.results == [(job_id, "", "")]
    assert applied.start_latencies == [2.5]
    ended = JobReport(job_id, JobState.SUCCEEDED, 0, "", lab.now)
    again = lab.write(jobs.apply_reports, worker, (running, ended))
    assert again.start_latencies == []  # it had started already
    # a job that ends straight from assigned started too (at the report: no started_at)
    other, _ = lab.submit()
    lab.now += 1.0
    failed = JobReport(other, JobState.FAILED, 1, "", None)
    assert lab.write(jobs.apply_reports, worker, (failed,)).start_latencies == [1.0]


def test_a_job_after_an_array_takes_an_id_of_its_own(lab):
    """An array's later elements get their ids given (the first's plus their
    position); the next job must not be handed one of them (PostgreSQL's
    identity sequence is moved past them: queries.pg.sql job_insert_element)."""
    first, _ = lab.submit(array="0-2")
    after, created = lab.submit()
    assert created and after > first + 2
    assert [lab.job(i).array_index for i in (first, first + 1, first + 2)] == [0, 1, 2]


def test_every_way_a_job_ends_wakes_the_followers_of_its_log():
    """A follower of a job's log (GET /v1/jobs/ID/logs?follow=1) waits for
    `log:<id>` and otherwise looks again only every log_follow_check (0.5
    s): every transition to a terminal state must announce it. Found
    reading the code: a retire cancelled the queued jobs pinned to the
    device by a copy of jobs.cancel_queued that left it out, so their
    followers waited out the 0.5 s instead of ending at once."""
    lb = Lab()
    try:
        lb.register("h", {f"d{i}": (0, {}) for i in range(4)}, instance="i-1")
        lb.submit("bob", device_id="h:d1", kind=JobKind.HOLD, max_runtime_seconds=600, reason="r")
        woken = {}

        def ends(what: str, act, *job_ids: int) -> None:
            followers = {j: lb.ctl.hub.waiter(f"log:{j}") for j in job_ids}
            act()
            for j, follower in followers.items():
                assert lb.job(j).state.terminal, (what, j)
                woken[f"{what} (job {j})"] = follower.is_set()

        pinned, _ = lb.submit(device_ids=("h:d0", "h:d1"))  # h:d1 is held: it waits
        ends(
            "a retire",
            lambda: lb.write(devices.retire, "h:d0", "admin", lb.ctl.match_cache),
            pinned,
        )
        queued, _ = lb.submit(device_id="h:d1")
        after, _ = lb.submit(device_id="h:d2", after=(f"{queued}:ok",))
        ends(
            "a cancel, then a dependency that cannot be met", lambda: lb.kill(queued), queued, after
        )
        ran, _ = lb.submit(device_id="h:d2")
        ends("its report", lambda: lb.finish(ran), ran)
        unstarted, _ = lb.submit(device_id="h:d2")
        lb.kill(unstarted)  # requested before its worker started it
        ends("a leave", lambda: lb.write(workers.leave, "h", "i-1", ()), unstarted)
        lb.register("h", {f"d{i}": (0, {}) for i in (1, 2, 3)}, instance="i-2")
        lost, _ = lb.submit(device_id="h:d3")
        ends("a re-registration", lambda: lb.register("h", {"d3": (0, {})}, instance="i-3"), lost)
        assert woken == dict.fromkeys(woken, True)
    finally:
        lb.close()
