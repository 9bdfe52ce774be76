"""A job the hardware failed goes back to the queue (README "GPU health"),
end to end: a controller, a worker from the zipapp with a fake nvidia-smi
(8 GPUs) and a fake kmsg file as its kernel log. A job that an Xid 79 ends
runs again on another GPU with RC_RESTART_COUNT=1, its log going on after a
separator line; --no-requeue-on-hardware, a user's own failure and the
fourth hardware failure end the job with the cause."""

from __future__ import annotations

import pytest

from tests.helpers.harness import BARE_PY, Cli
from tests.helpers.worker_kit import device, gpu_site, logs, submit, wait_state

HOST = "requeuebox"
RUN_S = 90.0  # four runs, each a hand-out, a crash, a kernel-log read and a report


@pytest.fixture(scope="module")
def site(tmp_path_factory, pyz):
    s = gpu_site(tmp_path_factory.mktemp("requeue"), pyz, HOST, 8)
    yield s
    s.close()


def falls_off(kmsg, runs_failed: int, end: str = "\\n") -> list[str]:
    """A job that prints its run (ending with `end`), then, for its first
    `runs_failed` runs, logs an Xid 79 on its own GPU (at the kernel's time:
    the monotonic clock) and exits 1, as a job whose GPU fell off the bus
    does; a later run exits 0."""
    src = (
        "import os, time\n"
        "dev = os.environ['RC_DEVICE']; n = int(dev.rpartition('gpu')[2])\n"
        "r = int(os.environ['RC_RESTART_COUNT'])\n"
        f"print(f'run {{r}} on {{dev}}', end='{end}', flush=True)\n"
        f"if r < {runs_failed}:\n"
        "    t = int(time.monotonic() * 1e6)\n"
        f"    with open({str(kmsg)!r}, 'a') as f:\n"
        "        f.write(f'3,{t},{t},-;NVRM: Xid (PCI:0000:{0x10 + n:02x}:00): 79, pid=1, "
        "GPU has fallen off the bus.\\n')\n"
        "    raise SystemExit(1)\n"
    )
    return [BARE_PY, "-c", src]


def events_of(site, job_id: int) -> list[dict]:
    feed = site.admin.get("/v1/events", params={"limit": "1000"})["events"]
    return [e for e in feed if e["job_id"] == job_id and e["kind"] == "job_requeued"]


def test_a_job_an_xid_79_ends_runs_again_on_another_gpu_with_restart_count_1(site):
    job_id = submit(site.admin, falls_off(site.kmsg, 1))
    j = wait_state(site.admin, job_id, timeout=RUN_S)
    assert j["state"] == "succeeded", j
    assert j["restart_count"] == 1
    [faulty] = j["excluded_device_ids"]
    assert faulty.startswith(f"{HOST}:gpu") and j["device_id"] != faulty
    assert device(site.admin, faulty)["state"] == "unhealthy"
    text = logs(site.admin, job_id).decode()
    assert text == (
        f"run 0 on {faulty}\n"
        "--- restart 1 after a hardware failure ---\n"
        f"run 1 on {j['device_id']}\n"
    )
    [ev] = events_of(site, job_id)
    assert ev["text"] == (
        f"job {job_id} requeued after a hardware failure "
        f"(Xid 79 on {faulty}: GPU has fallen off the bus), restart 1 of 3"
    )
    out = Cli(site.ctl.url, site.ctl.admin_token, site.env, site.root).run("show", str(job_id))
    assert out.returncode == 0, out.stderr
    assert f"restarts:     1 of 3 (never again on {faulty})" in out.stdout.decode()


def test_no_requeue_on_hardware_fails_the_job_with_the_cause(site):
    cli = Cli(site.ctl.url, site.ctl.admin_token, site.env, site.root)
    out = cli.run("run", "--no-requeue-on-hardware", "--", *falls_off(site.kmsg, 1))
    assert out.returncode == 1, out.stderr
    mine = site.admin.get("/v1/jobs", params={"limit": "1"})["jobs"][0]
    j = wait_state(site.admin, mine["id"])
    assert j["state"] == "failed" and j["restart_count"] == 0
    assert f"cause: hardware (Xid 79 on {j['device_id']}: GPU has fallen off" in j["kill_reason"]
    assert j["kill_reason"].endswith("not requeued: submitted with --no-requeue-on-hardware")
    assert j["requeue_on_hardware"] is False
    assert not events_of(site, j["id"])


def test_a_jobs_own_failure_is_never_requeued(site):
    job_id = submit(site.admin, [BARE_PY, "-c", "print('mine'); raise SystemExit(3)"])
    j = wait_state(site.admin, job_id)
    assert j["state"] == "failed" and j["exit_code"] == 3
    assert j["restart_count"] == 0 and "hardware" not in j["kill_reason"]
    assert device(site.admin, j["device_id"])["state"] == "ready"
    assert not events_of(site, job_id)


def test_a_job_is_requeued_at_most_three_times(site):
    job_id = submit(site.admin, falls_off(site.kmsg, 99, end=""))  # each run ends mid-line
    j = wait_state(site.admin, job_id, timeout=RUN_S)
    assert j["state"] == "failed" and j["restart_count"] == 3, j
    assert len(set(j["excluded_device_ids"])) == 3
    assert j["device_id"] not in j["excluded_device_ids"]  # the fourth GPU
    assert j["kill_reason"].endswith("not requeued: requeued 3 times already")
    assert [e["text"].rpartition(", ")[2] for e in events_of(site, job_id)] == [
        f"restart {n} of 3" for n in (1, 2, 3)
    ]
    text = logs(site.admin, job_id).decode()
    for n in (1, 2, 3):  # the separator on a line of its own
        assert f"\n--- restart {n} after a hardware failure ---\nrun {n} on " in text
    assert text.count("\n") == 6
