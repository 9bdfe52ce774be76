"""The store's contract (rc/controller/store/__init__.py): a guarded write
changes exactly one row or raises, and what its transaction function wrote
is rolled back with it."""

from __future__ import annotations

import pytest

from rc.controller.errors import GuardFailed, StoreError
from rc.controller.store import events, jobs
from rc.proto.model import EventKind, JobState
from rc.proto.wire import JobReport
from tests.inprocess import Lab

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
