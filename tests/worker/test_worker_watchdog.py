"""The job watchdog: as a pure function (rc.worker.watchdog: max runtime and
idle timeout at their boundaries, the device's ceiling, holds, the kill
reasons; time is an argument), then in a job run with real processes on a
fake clock (tests.helpers.fakeclock)."""

from __future__ import annotations

import dataclasses
import queue
import signal
import threading
import uuid

import pytest

from rc.proto.model import JobKind, JobState
from rc.proto.wire import Assignment
from rc.worker.config import DeviceConfig, WorkerConfig
from rc.worker.hooks import DeviceHooks
from rc.worker.job import JobContext, JobRun
from rc.worker.launch import HOLD_COMMAND, Result
from rc.worker.reporter import Report
from rc.worker.watchdog import Fired, Limits, due, reason, runtime_limit
from tests.helpers.fakeclock import FakeClock
from tests.helpers.wait import wait_until


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


def test_silence_is_counted_from_the_start_not_from_before_it():
    """Found in review: idle was counted from when the worker took the job,
    so a slow acquire hook used up its idle timeout before it ran."""
    limits = Limits(idle_timeout=60)
    assert due(limits, started=100.0, last_output=0.0, now=159.9) is None
    assert due(limits, started=100.0, last_output=0.0, now=160.0) is Fired.IDLE


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


# -- a job run on a fake clock ----------------------------------------------------
#
# Real processes, fake time: a JobRun in this process, with a JobContext whose
# report, fault and log go to lists, and a FakeClock that the test advances.
# "After 60 s of silence the watchdog fires" takes one watchdog tick, not 60 s.


class _Log:
    """A job's log (JobContext.open_log): keeps the bytes; `hold` makes
    writes wait (the controller not taking output yet)."""

    def __init__(self) -> None:
        self.data = b""
        self.hold = threading.Event()
        self.hold.set()
        self.lost = 0

    def write(self, data: bytes) -> None:
        assert self.hold.wait(30), "a held log write was never released"
        self.data += data

    def close(self, timeout: float, hand_off: bool = False) -> bool:
        return True


class _Worker:
    """A JobContext on a FakeClock, and what the runs sent through it."""

    def __init__(self, tmp_path) -> None:
        self.clock = FakeClock()
        self.hooks: DeviceHooks | None = None
        self.log = _Log()
        self.reports: list[Report] = []
        self.faults: list[tuple] = []
        self.results: queue.Queue[Result] = queue.Queue()
        self.ctx = JobContext(
            # every job as this process's own user ("alice" has no account here)
            cfg=WorkerConfig(
                host="box",
                kill_grace=0.5,
                verify_dir=str(tmp_path / "none"),
                shared_account=True,
            ),
            clock=self.clock,
            client=None,  # only tty and pipe jobs reach the controller themselves
            markers={"RC_HOST": "box", "RC_WORKER_INSTANCE": uuid.uuid4().hex},
            report=self.reports.append,
            fault=lambda *fault: self.faults.append(fault),
            open_log=lambda job_id: self.log,
            hooks=lambda name: self.hooks,
            gpu_uuid=lambda name: "",
            stopping=lambda: False,
            finished=lambda run, result: self.results.put(result),
        )

    def start(self, command, device=None, **fields) -> JobRun:
        a = _assignment(**fields)
        a = dataclasses.replace(a, command=tuple(command))
        run = JobRun(self.ctx, a, [device])
        run.start()
        return run

    def running(self) -> None:
        """Wait for the run's watchdog to take turns (its process is up)."""
        wait_until(lambda: self.reports, 10, "the running report")
        self.clock.turns()

    def still_running(self) -> None:
        """The watchdog took turns at the clock's time and the job runs on."""
        target = self.clock.reads + 2
        wait_until(
            lambda: self.clock.reads >= target or not self.results.empty(),
            10,
            "two watchdog turns",
        )
        assert self.results.empty(), f"the job ended: {self.results.queue[0]}"

    def result(self) -> Result:
        try:
            return self.results.get(timeout=10)
        except queue.Empty:
            raise AssertionError("the job did not end") from None


SILENT = ["sh", "-c", "exec sleep 300"]


def test_after_60s_of_silence_the_idle_watchdog_fires(tmp_path):
    w = _Worker(tmp_path)
    w.start(SILENT, idle=60)
    w.running()
    w.clock.advance(59.9)
    w.still_running()
    w.clock.advance(0.1)
    r = w.result()
    assert (r.state, r.reason) == (JobState.KILLED, "idle: no output for 1m")
    assert r.exit_code == 128 + signal.SIGTERM and r.survivors == []


def test_output_on_stderr_resets_the_idle_timer(tmp_path):
    go = tmp_path / "go"
    script = f"while [ ! -e {go} ]; do sleep 0.01; done; echo tick >&2; exec sleep 300"
    w = _Worker(tmp_path)
    run = w.start(["sh", "-c", script], idle=60)
    w.running()
    w.clock.advance(50)
    go.touch()
    wait_until(lambda: w.log.data == b"tick\n" and not run.in_write, 10, "the output")
    w.clock.advance(59.9)  # 110 s after the start, 59.9 s after the output
    w.still_running()
    w.clock.advance(0.1)
    assert w.result().reason == "idle: no output for 1m"


def test_a_write_held_up_by_the_worker_is_not_idleness(tmp_path):
    """Output the log does not take yet (backpressure) is output now."""
    w = _Worker(tmp_path)
    w.log.hold.clear()
    run = w.start(["sh", "-c", "echo x; exec sleep 300"], idle=60)
    wait_until(lambda: run.in_write, 10, "the held write")
    w.clock.advance(600)
    w.still_running()
    w.log.hold.set()
    wait_until(lambda: w.log.data == b"x\n" and not run.in_write, 10, "the write")
    w.clock.advance(59.9)
    w.still_running()
    w.clock.advance(0.1)
    assert w.result().reason == "idle: no output for 1m"


def test_max_runtime_fires_at_the_device_ceiling(tmp_path):
    w = _Worker(tmp_path)
    w.start(SILENT, device=DeviceConfig("cpu0", max_runtime=3600), max_runtime=7200)
    w.running()
    assert w.reports[0].state == "running"
    assert w.reports[0].started_at == w.clock.time()  # wall time, from the clock
    w.clock.advance(3599.9)
    w.still_running()
    w.clock.advance(0.1)
    r = w.result()
    assert (r.state, r.reason) == (JobState.KILLED, "max_runtime exceeded (1h)")


def test_a_hold_ends_at_its_ttl_and_succeeds(tmp_path):
    w = _Worker(tmp_path)
    run = w.start(HOLD_COMMAND, kind=JobKind.HOLD, max_runtime=1800, idle=5)
    w.running()
    w.clock.advance(1799.9)  # a hold has no idle timeout
    w.still_running()
    w.clock.advance(0.1)
    r = w.result()
    assert (r.state, r.exit_code, r.reason) == (
        JobState.SUCCEEDED,
        0,
        "hold ended: its ttl of 30m was reached",
    )
    assert run.ending == "hold 7 expired (ttl 30m)"  # what its sessions report


def test_a_slow_acquire_hook_does_not_use_up_the_idle_timeout(tmp_path):
    """Found in review: a job whose acquire hook took longer than its idle
    timeout was killed as idle at its first watchdog turn."""
    go = tmp_path / "go"
    hook = tmp_path / "acquire"
    hook.write_text(
        f"#!/bin/sh\ntouch {tmp_path}/hooked; while [ ! -e {go} ]; do sleep 0.01; done\n"
    )
    hook.chmod(0o755)
    w = _Worker(tmp_path)
    dev = DeviceConfig("cpu0", on_acquire=str(hook))
    w.hooks = DeviceHooks("box:cpu0", dev, timeout=1e6, linger=0, grace=0.2, clock=w.clock)
    w.start(SILENT, device=dev, idle=60)
    wait_until((tmp_path / "hooked").exists, 10, "the acquire hook to run")
    w.clock.advance(100)  # the hook takes 100 s
    go.touch()
    w.running()
    w.still_running()
    w.clock.advance(59.9)
    w.still_running()
    w.clock.advance(0.1)
    assert w.result().reason == "idle: no output for 1m"
