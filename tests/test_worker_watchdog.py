"""The job watchdog as a pure function (rc.worker.watchdog): max runtime and
idle timeout at their boundaries, the device's ceiling, holds, and the kill
reasons. Time is an argument: no clock at all."""

from __future__ import annotations

import pytest

from rc.proto.model import JobKind
from rc.proto.wire import Assignment
from rc.worker.watchdog import Fired, Limits, due, reason, runtime_limit


def test_nothing_fires_without_limits():
    assert due(Limits(), started=0.0, last_output=0.0, now=10**9) is None


def test_max_runtime_fires_at_its_limit_not_before():
    limits = Limits(max_runtime=3600)
    assert due(limits, 100.0, 100.0, 100.0 + 3599.99) is None
    assert due(limits, 100.0, 100.0, 100.0 + 3600) is Fired.MAX_RUNTIME
    assert due(limits, 100.0, 4000.0, 100.0 + 3600) is Fired.MAX_RUNTIME  # output does not help


def test_idle_fires_after_silence_and_output_resets_it():
    """After 2 s of silence the watchdog fires; output at t=5 moves it to t=7."""
    limits = Limits(idle_timeout=2)
    assert due(limits, 0.0, 0.0, 1.99) is None
    assert due(limits, 0.0, 0.0, 2.0) is Fired.IDLE
    assert due(limits, 0.0, 5.0, 6.99) is None
    assert due(limits, 0.0, 5.0, 7.0) is Fired.IDLE
    # a write under way is passed as output now: never idle while it lasts
    assert due(limits, 0.0, 100.0, 100.0) is None


def test_max_runtime_wins_over_idle_when_both_are_due():
    limits = Limits(max_runtime=10, idle_timeout=5)
    assert due(limits, 0.0, 0.0, 10.0) is Fired.MAX_RUNTIME
    assert due(limits, 0.0, 0.0, 9.0) is Fired.IDLE


@pytest.mark.parametrize(
    ("requested", "ceiling", "limit"),
    [(0, 0, 0), (60, 0, 60), (0, 120, 120), (60, 120, 60), (600, 120, 120)],
)
def test_the_device_ceiling_caps_the_job_and_applies_to_a_job_without_one(
    requested, ceiling, limit
):
    assert runtime_limit(requested, ceiling) == limit


def _assignment(kind=JobKind.JOB, max_runtime=0, idle=0) -> Assignment:
    return Assignment(
        job_id=7,
        device_id="box:cpu0",
        kind=kind,
        command=("sleep", "300"),
        cwd="",
        env={},
        submitter="alice",
        max_runtime_seconds=max_runtime,
        idle_timeout_seconds=idle,
    )


def test_limits_of_an_assignment():
    assert Limits.of(_assignment(max_runtime=600, idle=30), 120.0, hold=False) == Limits(
        120, 30, False
    )
    # a hold has no idle timeout, whatever it carries
    assert Limits.of(_assignment(JobKind.HOLD, 1800, 30), 0, hold=True) == Limits(1800, 0, True)


def test_reasons_name_the_limit():
    assert reason(Fired.MAX_RUNTIME, Limits(max_runtime=3600)) == "max_runtime exceeded (1h)"
    assert reason(Fired.IDLE, Limits(idle_timeout=90)) == "idle: no output for 1m30s"
    assert (
        reason(Fired.MAX_RUNTIME, Limits(max_runtime=1800, hold=True))
        == "hold ended: its ttl of 30m was reached"
    )
