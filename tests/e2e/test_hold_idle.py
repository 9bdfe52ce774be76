"""The idle rule of holds (README "Holds: the idle rule") on a fake clock: the
real controller in-process (tests.helpers.inprocess.Lab), its real store, the idle
watch driven by `Controller.idle_pass`; the worker's sampler on captured
/proc text and a fake nvidia-smi reporting utilisation."""

from __future__ import annotations

from rc.worker import usage
from tests.helpers.fake_nvidia_smi import FakeNvidiaSmi


def test_a_gpu_hold_is_busy_while_its_gpu_is(tmp_path, monkeypatch):
    """A fake nvidia-smi reporting utilisation: only the hold's GPU counts."""
    fake = FakeNvidiaSmi(tmp_path / "bin", gpus=2)
    monkeypatch.setenv("PATH", fake.path_env({"PATH": "/usr/bin:/bin"})["PATH"])
    s = usage.Sampler({b"RC_WORKER_INSTANCE": b"none-such"})
    fake.utilization(0, 90)
    (a, b) = s.sample({7: ["gpu0"], 8: ["gpu1"]}, 1.0)
    assert (a.job_id, a.busy, a.gpu_pct) == (7, False, 0)
    assert (b.job_id, b.busy, b.gpu_pct) == (8, True, 90)
    fake.utilization(usage.GPU_BUSY_PCT + 1, 0)
    (a, b) = s.sample({7: ["gpu0"], 8: ["gpu1"]}, 11.0)
    assert a.busy and not b.busy
    fake.mode("broken")
    (a,) = s.sample({7: ["gpu0"]}, 21.0)
    assert not a.busy and a.gpu_pct is None
    (c,) = s.sample({9: ["cpu0"]}, 31.0)  # CPU devices: no nvidia-smi, CPU use (first: none)
    assert not c.busy and c.gpu_pct is None


def test_a_cpu_hold_is_busy_while_its_processes_use_a_core(tmp_path):
    """Only processes carrying the hold's RC_JOB_ID and this worker's marker count."""
    import os
    import subprocess
    import sys
    import time

    from tests.helpers.harness import stop_process
    from tests.helpers.wait import wait_until

    marker = {b"RC_WORKER_INSTANCE": b"w-1"}
    env = {**os.environ, "RC_JOB_ID": "77", "RC_WORKER_INSTANCE": "w-1"}
    spin = [sys.executable, "-c", "while True: pass"]
    busy = subprocess.Popen(spin, env=env)
    other = subprocess.Popen(spin, env={**env, "RC_WORKER_INSTANCE": "another"})
    try:
        s = usage.Sampler(marker)
        (first,) = s.sample({77: ["cpu0"]}, time.monotonic())
        assert not first.busy and first.cpu_pct is None  # nothing to compare with yet
        hit = wait_until(
            lambda: next(u for u in s.sample({77: ["cpu0"]}, time.monotonic()) if u.busy),
            20,
            "hold 77's spinning process to count as use",
        )
        assert hit.cpu_pct > usage.CPU_BUSY_PCT
        stop_process(busy)
        s.sample({77: ["cpu0"], 78: ["cpu1"]}, time.monotonic())
        (a, b) = s.sample({77: ["cpu0"], 78: ["cpu1"]}, time.monotonic() + 1)
        # the other worker's spinning process carries RC_JOB_ID=77 too: not counted
        assert (a.busy, a.cpu_pct, b.busy, b.cpu_pct) == (False, 0, False, 0)
    finally:
        stop_process(busy)
        stop_process(other)
