"""Supervision that really kills (docs/design.md#teardown-empty-or-out), end to end:
a real controller, a real worker from dist/rc.pyz under `python3 -I` with a
1 s kill grace, real jobs. Process trees that ignore SIGTERM, setsid
escapees, trap-and-exit-0 after a kill, zombies and stragglers, a print
loop that must not look idle, 512 MB of output on one line against the
worker's memory, and SIGTERM to the worker. The watchdog's timing (idle
timeout, max runtime, a hold's ttl) is tested with real processes on a fake
clock in tests/worker/test_worker_watchdog.py."""

from __future__ import annotations

import signal
import sys
import time

import pytest

from tests.helpers.harness import pid_alive
from tests.helpers.wait import wait_until
from tests.helpers.worker_kit import (
    Site,
    device,
    job,
    logs,
    proc_status,
    quiet_config,
    read_pid,
    reset_peak_rss,
    submit,
    wait_state,
)


@pytest.fixture(scope="module")
def site(tmp_path_factory, pyz):
    root = tmp_path_factory.mktemp("supervision")
    s = Site(root, pyz, ["--log-cap", str(8 << 20)])
    s.box = s.worker("box", quiet_config(root, "cpu:2"))
    s.work = root / "work"
    s.work.mkdir()
    yield s
    s.close()


@pytest.fixture
def work(site, tmp_path):
    return tmp_path


def run_job(site, command, **fields) -> dict:
    job_id = submit(site.admin, command, **fields)
    return wait_state(site.admin, job_id)


def test_job_environment(site, work):
    j = run_job(
        site,
        [
            sys.executable,
            "-c",
            (
                "import os; print(sorted((k, v) for k, v in os.environ.items() "
                "if k.startswith(('RC_', 'CUDA_'))))"
            ),
        ],
    )
    assert j["state"] == "succeeded", j
    env = dict(eval(logs(site.admin, j["id"])))
    assert env["RC_JOB_ID"] == str(j["id"]) and env["RC_DEVICE"] == j["device_id"]
    assert env["CUDA_VISIBLE_DEVICES"] == ""  # a CPU device: no GPU
    assert "RC_TOKEN" not in env and "CUDA_DEVICE_ORDER" not in env


def test_a_child_ignoring_sigterm_is_killed_with_its_whole_tree(site, work):
    script = (
        f"(trap '' TERM; exec sleep 300) & echo $! > {work}/child; "
        f"(sleep 300) & echo $! > {work}/other; wait"
    )
    job_id = submit(site.admin, ["sh", "-c", script], cwd=str(work))
    child, other = read_pid(work / "child"), read_pid(work / "other")
    t0 = time.monotonic()
    site.admin.post(f"/v1/jobs/{job_id}/kill", {})
    j = wait_state(site.admin, job_id)
    assert j["state"] == "killed" and j["kill_reason"].startswith("killed by")
    assert not pid_alive(child) and not pid_alive(other)
    assert time.monotonic() - t0 < 10
    assert device(site.admin, j["device_id"])["state"] == "ready"


def test_setsid_and_double_fork_escapees_are_swept(site, work):
    script = (
        f"setsid sleep 300 & echo $! > {work}/setsid; "
        f"(setsid sh -c 'sleep 300 & echo $! > {work}/double' &); "
        f"while [ ! -s {work}/double ]; do sleep 0.05; done"
    )
    j = run_job(site, ["sh", "-c", script], cwd=str(work))
    pids = [read_pid(work / "setsid"), read_pid(work / "double")]
    # they left the group, so the job itself is labelled by its own exit...
    assert j["state"] == "succeeded", j
    # ...but nothing carrying its RC_JOB_ID survives, and the device stays in
    assert not [p for p in pids if pid_alive(p)]
    assert device(site.admin, j["device_id"])["state"] == "ready"


def test_trap_and_exit_0_after_a_kill_is_killed_not_succeeded(site, work):
    script = f"trap 'exit 0' TERM; touch {work}/ready; while :; do sleep 0.05; done"
    job_id = submit(site.admin, ["sh", "-c", script], cwd=str(work))
    wait_until((work / "ready").exists, 20, "the job to start")
    site.admin.post(f"/v1/jobs/{job_id}/kill", {"reason": "enough"})
    j = wait_state(site.admin, job_id)
    assert (j["state"], j["exit_code"]) == ("killed", 0)
    assert j["kill_reason"] == "killed by root (token admin): enough"


def test_death_by_signal_is_128_plus_n_and_killed(site):
    j = run_job(site, ["sh", "-c", "kill -USR1 $$"])
    assert (j["state"], j["exit_code"], j["kill_reason"]) == (
        "killed",
        128 + signal.SIGUSR1,
        "signal: SIGUSR1",
    )


def test_a_zombie_left_behind_is_not_a_straggler(site):
    # the child exits at once and is never waited for: a zombie in the job's group
    j = run_job(
        site,
        [sys.executable, "-c", "import os, time\nif os.fork() == 0: os._exit(0)\ntime.sleep(0.3)"],
    )
    assert (j["state"], j["exit_code"], j["kill_reason"]) == ("succeeded", 0, ""), j


def test_a_live_background_child_is_reaped_and_the_job_keeps_its_exit(site, work):
    """Found by a new user: `sh -c 'sleep 100 & echo done'` ended `killed`
    with exit 1. The straggler is reaped and noted; the job is what its main
    process made it (as Slurm's COMPLETED)."""
    j = run_job(site, ["sh", "-c", f"sleep 300 & echo $! > {work}/bg; echo done"])
    assert (j["state"], j["exit_code"], j["kill_reason"]) == (
        "succeeded",
        0,
        "1 straggler reaped after exit",
    )
    assert not pid_alive(read_pid(work / "bg"))
    assert logs(site.admin, j["id"]) == b"done\n"
    assert device(site.admin, j["device_id"])["state"] == "ready"
    j = run_job(site, ["sh", "-c", f"sleep 300 & echo $! > {work}/bg2; exit 3"])
    assert (j["state"], j["exit_code"], j["kill_reason"]) == (
        "failed",
        3,
        "exited with code 3; 1 straggler reaped after exit",
    )
    assert not pid_alive(read_pid(work / "bg2"))


def test_python_output_streams_so_a_print_loop_is_not_idle(site):
    """Found by a new user: a job writes to a pipe, so Python block-buffered
    a healthy print() loop and --idle-timeout killed it. The worker sets
    PYTHONUNBUFFERED=1 unless the job sets it (this worker's own environment
    does not have it)."""
    env = {k: v for k, v in site.env.items() if k != "PYTHONUNBUFFERED"}
    config = quiet_config(site.root)
    site.worker("plain", config, env=env)
    loop = "import time\nfor i in range(4):\n    print('tick', i)\n    time.sleep(0.7)\n"
    j = run_job(site, [sys.executable, "-c", loop], device_id="plain:cpu0", idle_timeout_seconds=1)
    assert j["state"] == "succeeded", j
    assert logs(site.admin, j["id"]) == b"".join(b"tick %d\n" % i for i in range(4))
    show = "import os; print(repr(os.environ.get('PYTHONUNBUFFERED')))"
    j = run_job(site, [sys.executable, "-c", show], device_id="plain:cpu0")
    assert logs(site.admin, j["id"]) == b"'1'\n"
    j = run_job(
        site, [sys.executable, "-c", show], device_id="plain:cpu0", env={"PYTHONUNBUFFERED": ""}
    )
    assert logs(site.admin, j["id"]) == b"''\n", "the job's own setting wins"


def test_512_mb_on_one_line_does_not_grow_the_worker(site):
    pid = site.box.proc.pid
    before = proc_status(pid)
    if not reset_peak_rss(pid):
        pytest.skip("cannot reset the worker's peak RSS here")
    mib = 512
    code = (
        "import sys; b = b'x' * (1 << 20); w = sys.stdout.buffer.write\n"
        f"for _ in range({mib}): w(b)\n"
    )
    j = run_job(site, [sys.executable, "-c", code])
    after = proc_status(pid)
    assert j["state"] == "succeeded", j
    grew_kib = after["VmHWM"] - before["VmRSS"]
    print(
        f"worker RSS before {before['VmRSS']} KiB, peak during {after['VmHWM']} KiB, "
        f"growth {grew_kib} KiB for {mib} MiB of output"
    )
    assert grew_kib < 10 * 1024, (before, after)  # the worker grows by 10 MB at most
    stored = logs(site.admin, j["id"])  # the controller's 8 MiB cap kept the head
    assert stored.startswith(b"x" * (8 << 20)) and b"log truncated" in stored


def test_sigterm_to_the_worker_reports_running_jobs_and_exits_0(site, work):
    w = site.worker("leaving", quiet_config(site.root))
    job_id = submit(
        site.admin,
        ["sh", "-c", f"touch {work}/up; sleep 300"],
        device_id="leaving:cpu0",
        cwd=str(work),
    )
    wait_until((work / "up").exists, 20, "the job to start")
    assert w.stop(signal.SIGTERM, timeout=30) == 0, w.log()
    j = job(site.admin, job_id)
    assert j["state"] == "killed" and "shutting down" in j["kill_reason"], j
    assert "worker stopped" in w.log()
