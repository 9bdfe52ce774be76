"""Operator scripts the worker runs: the bounded runner, the verify pass
(fail-closed) and the lease hooks with linger and the epoch guard. Real
scripts; their timeouts, budgets and lingers on a fake clock
(tests.helpers.fakeclock)."""

from __future__ import annotations

import itertools
import os
import queue
import stat
import threading

import pytest

from rc.worker import script, verify
from rc.worker.config import DeviceConfig, WorkerConfig
from rc.worker.hooks import DeviceHooks, HookContext, Leases, hook_env
from tests.helpers.fakeclock import FakeClock
from tests.helpers.harness import pid_alive
from tests.helpers.wait import wait_until


def make_script(path, body: str, mode: int = 0o755):
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(mode)
    return path


ENV = dict(os.environ)


# -- the runner ------------------------------------------------------------------


def test_runner_keeps_the_head_of_stdout_and_the_tail_of_stderr(tmp_path):
    s = make_script(
        tmp_path / "s",
        "printf 'A%.0s' $(seq 100); printf 'e%.0s' $(seq 50) >&2; echo END >&2; exit 3",
    )
    res = script.run([str(s)], env=ENV, timeout=5, grace=0.5, out_cap=10, err_tail=8)
    assert not res.ok and res.describe() == "exited 3"
    assert res.out == b"A" * 10 and res.out_overflow
    assert res.err == b"eeeeEND\n"


def in_thread(fn, *args, **kwargs) -> queue.Queue:
    """Run fn on a thread; its return value arrives on the queue."""
    out: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: out.put(fn(*args, **kwargs)), daemon=True).start()
    return out


def test_runner_times_out_on_its_clock(tmp_path):
    s = make_script(tmp_path / "s", "trap '' TERM; sleep 300")
    clock = FakeClock()
    got = in_thread(script.run, [str(s)], env=ENV, timeout=60, grace=0.3, clock=clock)
    clock.wait_for_reads(2)  # its deadline, then a turn: it is running
    clock.advance(59.9)
    clock.turns()
    assert got.empty()
    clock.advance(0.1)
    res = got.get(timeout=10)
    assert res.timed_out and res.describe() == "timed out after 1m"
    assert res.outcome is not None and res.outcome.signal == 9  # ignored TERM: SIGKILL


def test_runner_is_cancelled(tmp_path):
    up = tmp_path / "up"
    s = make_script(tmp_path / "s", f"touch {up}; sleep 300")
    cancel = threading.Event()
    got = in_thread(script.run, [str(s)], env=ENV, timeout=600, grace=0.2, cancel=cancel)
    wait_until(up.exists, 10, "the script to start")
    cancel.set()
    res = got.get(timeout=10)
    assert res.cancelled and not res.ok and res.describe() == "cancelled"


def test_runner_reports_what_cannot_start(tmp_path):
    assert (
        script.run([str(tmp_path / "absent")], env=ENV, timeout=1, grace=1).describe()
        == "run: No such file or directory"
    )
    s = make_script(tmp_path / "noexec", "exit 0", mode=0o644)
    res = script.run([str(s)], env=ENV, timeout=1, grace=1)
    assert res.error == "Permission denied" and not res.ok


def test_runner_kills_what_a_script_leaves_in_its_group(tmp_path):
    s = make_script(tmp_path / "s", "sleep 30 & echo $! > pid; exit 0")
    res = script.run([str(s)], env=ENV, timeout=5, grace=0.5, cwd=str(tmp_path))
    assert res.ok
    pid = int((tmp_path / "pid").read_text())
    wait_until(lambda: not pid_alive(pid), 5, "the background sleep to be gone")


# -- the verify pass ---------------------------------------------------------------


def run_pass(d, timeout=2.0, budget=10.0):
    return verify.run_pass(str(d), ENV, timeout=timeout, budget=budget, grace=0.2)


def test_verify_missing_dir_passes_and_clean_scripts_pass(tmp_path):
    assert run_pass(tmp_path / "absent") is None
    d = tmp_path / "verify.d"
    d.mkdir()
    assert run_pass(d) is None
    make_script(d / "10-ok", "echo fine")
    (d / "sub").mkdir()  # ignored
    make_script(d / "sub" / "fail", "exit 1")
    make_script(d / "20-not-executable", "exit 1", mode=0o644)  # skipped
    assert run_pass(d) is None


def test_verify_fails_closed_and_keeps_the_first_reason(tmp_path):
    d = tmp_path / "verify.d"
    d.mkdir()
    ran = tmp_path / "ran"
    make_script(d / "10-bad", "echo 'ECC errors: 3' >&2; exit 4")
    make_script(d / "20-also-bad", f"touch {ran}; exit 5")
    reason = run_pass(d)
    assert reason == "verify failed: 10-bad: exited 4: ECC errors: 3"
    assert ran.exists()  # every script runs even after a failure


def test_verify_stderr_is_cut_to_its_last_200_characters(tmp_path):
    d = tmp_path / "verify.d"
    d.mkdir()
    make_script(d / "noisy", "printf 'x%.0s' $(seq 300) >&2; echo TAIL >&2; exit 1")
    reason = run_pass(d)
    assert reason.startswith("verify failed: noisy: exited 1: …(truncated) ")
    assert reason.endswith("TAIL") and len(reason.split("(truncated) ")[1]) == 200


def test_verify_dangling_symlink_fails(tmp_path):
    d = tmp_path / "verify.d"
    d.mkdir()
    (d / "gone").symlink_to(tmp_path / "nowhere")
    assert run_pass(d) == "verify failed: gone: cannot stat: No such file or directory"


def test_verify_unreadable_dir_fails(tmp_path):
    not_a_dir = tmp_path / "verify.d"
    not_a_dir.write_text("")
    assert run_pass(not_a_dir).startswith(f"verify failed: cannot read {not_a_dir}: ")
    if os.geteuid() != 0:  # root reads any directory
        d = tmp_path / "locked"
        d.mkdir()
        d.chmod(0)
        try:
            assert run_pass(d).startswith(f"verify failed: cannot read {d}: ")
        finally:
            d.chmod(stat.S_IRWXU)


def test_verify_timeout_and_budget_on_the_clock(tmp_path):
    d = tmp_path / "verify.d"
    d.mkdir()
    make_script(d / "slow", "sleep 300")
    clock = FakeClock()
    got = in_thread(verify.run_pass, str(d), ENV, timeout=60, budget=600, grace=0.2, clock=clock)
    clock.wait_for_reads(4)  # the pass's deadline and what is left, the script's, a turn
    clock.advance(60)
    assert got.get(timeout=10) == "verify failed: slow: timed out after 1m"
    make_script(d / "slow2", "sleep 300")
    clock = FakeClock()
    got = in_thread(verify.run_pass, str(d), ENV, timeout=600, budget=90, grace=0.2, clock=clock)
    clock.wait_for_reads(4)
    clock.advance(90)  # slow uses the whole budget; slow2 gets no time at all
    assert got.get(timeout=10) == "verify failed: pass exceeded its 1m30s budget"


def test_verify_env_names_the_event_device_job_and_gpu(tmp_path):
    d = tmp_path / "verify.d"
    d.mkdir()
    out = tmp_path / "env"
    make_script(d / "dump", f"env > {out}")
    env = hook_env("verify", "box:gpu3", HookContext(42, "alice"))
    assert verify.run_pass(str(d), env, timeout=2, budget=5, grace=0.2) is None
    got = dict(line.split("=", 1) for line in out.read_text().splitlines() if "=" in line)
    assert got["RC_EVENT"] == "verify" and got["RC_DEVICE"] == "box:gpu3"
    assert got["RC_JOB_ID"] == "42" and got["RC_SUBMITTER"] == "alice"
    assert got["CUDA_VISIBLE_DEVICES"] == "3" and got["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert not [
        k
        for k in got
        if k.startswith("RC_") and k not in ("RC_EVENT", "RC_DEVICE", "RC_JOB_ID", "RC_SUBMITTER")
    ]


# -- lease hooks -------------------------------------------------------------------


@pytest.fixture
def hooked(tmp_path):
    log = tmp_path / "events"
    acq = make_script(tmp_path / "acquire", f'echo "acquire $RC_JOB_ID" >> {log}')
    rel = make_script(tmp_path / "release", f'echo "release $RC_JOB_ID" >> {log}')

    def make(linger: float = 30.0, on_acquire=acq, clock=None, timeout=2.0) -> DeviceHooks:
        dev = DeviceConfig("gpu0", on_acquire=str(on_acquire), on_release=str(rel))
        return DeviceHooks(
            "box:gpu0", dev, timeout=timeout, linger=linger, grace=0.2, clock=clock or FakeClock()
        )

    def events() -> list[str]:
        return log.read_text().splitlines() if log.exists() else []

    return make, events


def test_a_burst_of_jobs_gives_one_acquire_and_one_release(hooked):
    make, events = hooked
    clock = FakeClock()
    h = make(linger=30, clock=clock)
    never = threading.Event()
    for job in (1, 2, 3):
        got = h.acquire(HookContext(job, "alice"), never)
        assert got.ok
        h.arm_release(got.epoch, HookContext(job, "alice"))
        clock.advance(29)  # each job comes within the linger of the last one
    assert events() == ["acquire 1"] and h.pending()
    clock.advance(1)  # 30 s after job 3: its release runs (during advance)
    assert events() == ["acquire 1", "release 3"]
    assert not h.pending()
    got = h.acquire(HookContext(4, "bob"), never)  # released: acquire runs again
    assert events()[-1] == "acquire 4" and got.ok


def test_a_release_armed_late_never_fires_during_the_next_job(hooked):
    make, events = hooked
    clock = FakeClock()
    h = make(linger=0.0, clock=clock)
    never = threading.Event()
    first = h.acquire(HookContext(1, "alice"), never)
    second = h.acquire(HookContext(2, "bob"), never)  # job 1's report was slow; job 2 started
    assert not h.arm_release(first.epoch, HookContext(1, "alice"))  # stale epoch: dropped
    clock.advance(3600)  # runs every release that is due, wrongly armed or not
    assert events() == ["acquire 1"]
    assert h.arm_release(second.epoch, HookContext(2, "bob"))
    clock.advance(0)
    assert events() == ["acquire 1", "release 2"]


def test_an_acquire_cancels_a_release_that_is_about_to_fire(hooked):
    """The race of a release timer firing on its own thread while a new
    acquire cancels it: another thread keeps the clock moving (the timers
    fire on it) while this one acquires, arms, and waits on the clock until
    just before, at or after the linger's end."""
    make, events = hooked
    clock = FakeClock()
    # the clock runs fast here: a hook's timeout must not come while it runs
    h = make(linger=0.05, clock=clock, timeout=1e9)
    never = threading.Event()
    stop = threading.Event()

    def tick() -> None:
        while not stop.is_set():
            clock.advance(0.01)  # timers fire on this thread

    ticker = threading.Thread(target=tick, daemon=True)
    ticker.start()
    try:
        for job in range(1, 30):
            got = h.acquire(HookContext(job, ""), never)
            h.arm_release(got.epoch, HookContext(job, ""))
            clock.sleep(0.03 + 0.01 * (job % 3))  # the next job comes near the linger's end
    finally:
        stop.set()
        ticker.join(10)
    clock.advance(1)  # the last job's release
    ev = events()
    assert ev[-1].startswith("release"), ev
    # strictly alternating: never two acquires or two releases in a row
    assert all(a.split()[0] != b.split()[0] for a, b in itertools.pairwise(ev)), ev
    assert ev[0] == "acquire 1"


def test_acquire_failure_and_cancel(hooked, tmp_path):
    make, _events = hooked
    bad = make_script(tmp_path / "bad-acquire", "echo 'nvidia-persistenced: not running'; exit 3")
    h = make(on_acquire=bad)
    got = h.acquire(HookContext(7, "alice"), threading.Event())
    assert not got.ok and not got.cancelled
    assert got.error == (f"acquire hook failed: {bad}: exited 3\nnvidia-persistenced: not running")
    assert not h.arm_release(got.epoch, HookContext(7, "alice"))  # failed: nothing to release
    slow = make_script(tmp_path / "slow-acquire", "sleep 30")
    h = make(on_acquire=slow)
    cancel = threading.Event()
    threading.Timer(0.2, cancel.set).start()
    got = h.acquire(HookContext(8, "alice"), cancel)
    assert got.cancelled and got.error == f"cancelled during acquire hook: {slow}"
    absent = make(on_acquire=tmp_path / "absent")
    got = absent.acquire(HookContext(9, ""), threading.Event())
    assert got.error.endswith("run: No such file or directory")


def test_startup_release_pass_runs_every_release_hook_once(tmp_path):
    log = tmp_path / "events"
    rel = make_script(tmp_path / "release", f'echo "release $RC_DEVICE $RC_JOB_ID." >> {log}')
    cfg = WorkerConfig(
        host="box",
        kill_grace=0.2,
        devices=(
            DeviceConfig("gpu0", on_release=str(rel)),
            DeviceConfig("gpu1"),
            DeviceConfig("gpu2", on_release=str(rel)),
        ),
    )
    leases = Leases(cfg)
    leases.configure(list(cfg.devices))
    leases.startup_release_pass()
    assert log.read_text().splitlines() == ["release box:gpu0 .", "release box:gpu2 ."]
