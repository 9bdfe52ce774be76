"""`rc clear` verifies and `rc kill` of a lost job ends its remains
(docs/design.md#quarantine-and-proof), end to end: the issue's repro. A
detached `sleep 301` on vm:cpu1, the worker killed with -9, a new worker for
the host: the job is lost while its process runs; `rc clear` is refused
naming the `sleep 301`; `rc clear --kill` ends it and returns the device;
`rc kill` of a lost job ends what is left of it and says what it found;
`rc clear --force` clears without a scan and its event says so; a device
out with survivors recovers by itself once they are gone (the worker's
re-check, every recheck_interval)."""

from __future__ import annotations

import os

import pytest

from rc.proto.client import Client
from rc.proto.errors import ApiError
from tests.helpers.harness import Cli, pid_alive
from tests.helpers.wait import wait_until
from tests.helpers.worker_kit import Site, job, quiet_config, read_pid, submit, wait_state


@pytest.fixture
def site(tmp_path, pyz):
    s = Site(tmp_path, pyz)
    s.config = quiet_config(tmp_path, "cpu:2", 'recheck_interval = "1h"')
    s.cli = Cli(s.ctl.url, s.ctl.admin_token, s.env, tmp_path)
    yield s
    s.close()


def state(site, device_id: str) -> str:
    return site.admin.get(f"/v1/devices/{device_id}/describe")["view"]["device"]["state"]


def lose_a_running_job(site, tmp_path, script: str) -> tuple[int, int]:
    """Start `script` on vm:cpu1, kill the worker with -9, start a new one:
    (the job id, the pid its script wrote to `pid`)."""
    first = site.worker("vm", site.config)
    job_id = submit(site.admin, ["sh", "-c", script], device_id="vm:cpu1", cwd=str(tmp_path))
    pid = read_pid(tmp_path / "pid")
    wait_until(lambda: job(site.admin, job_id)["state"] == "running", 20, "the job to run")
    first.kill9()
    site.worker("vm", site.config, wait=False)
    wait_until(lambda: job(site.admin, job_id)["state"] == "lost", 30, "the job to be lost")
    assert pid_alive(pid)
    return job_id, pid


def test_the_worker_kill_repro_ends_with_a_verified_clear(site, tmp_path):
    _, pid = lose_a_running_job(site, tmp_path, f"echo $$ > {tmp_path}/pid; exec sleep 301")
    wait_until(lambda: state(site, "vm:cpu1") == "unhealthy", 20, "vm:cpu1 to be out")
    res = site.cli.run("clear", "vm:cpu1")
    err = res.stderr.decode()
    assert res.returncode == 1, err
    assert f"pid {pid} 'sleep 301'" in err and "survivors_found" in err, err
    assert state(site, "vm:cpu1") == "unhealthy" and pid_alive(pid)
    res = site.cli.run("clear", "--kill", "vm:cpu1")
    out = res.stdout.decode()
    assert res.returncode == 0, res.stderr.decode()
    assert f"ended pid {pid} 'sleep 301'" in out and "a survivor scan found nothing" in out, out
    assert not pid_alive(pid)
    wait_until(lambda: state(site, "vm:cpu1") == "ready", 10, "vm:cpu1 back")
    events = site.admin.get("/v1/events", params={"kind": "device_cleared"})["events"]
    assert any("a survivor scan found nothing" in e["text"] for e in events), events


def test_kill_of_a_lost_job_ends_what_is_left_of_it(site, tmp_path):
    script = (
        f"env -i setsid sleep 302 & echo $! > {tmp_path}/escapee; "
        f"echo $$ > {tmp_path}/pid; exec sleep 301"
    )
    job_id, pid = lose_a_running_job(site, tmp_path, script)
    escapee = read_pid(tmp_path / "escapee")
    res = site.cli.run("kill", str(job_id))
    out = res.stdout.decode() + res.stderr.decode()
    assert res.returncode == 0, out
    assert f"pid {pid} 'sleep 301'" in out, out
    if os.path.isdir("/sys/fs/cgroup/unified") or os.path.exists("/sys/fs/cgroup/cgroup.procs"):
        assert f"pid {escapee} 'sleep 302'" in out, out  # found by its cgroup alone
        assert not pid_alive(escapee)
    assert not pid_alive(pid)
    assert wait_state(site.admin, job_id)["state"] == "lost"


def test_clear_force_clears_without_a_scan_and_says_so(site, tmp_path):
    _, pid = lose_a_running_job(site, tmp_path, f"echo $$ > {tmp_path}/pid; exec sleep 301")
    wait_until(lambda: state(site, "vm:cpu1") == "unhealthy", 20, "vm:cpu1 to be out")
    with pytest.raises(ApiError) as e:
        site.admin.post("/v1/devices/vm:cpu1/clear", {"kill": False})
    assert e.value.code == "survivors_found"
    got = site.admin.post("/v1/devices/vm:cpu1/clear", {"force": True})
    assert "forced" in got["message"]
    events = site.admin.get("/v1/events", params={"kind": "device_cleared"})["events"]
    assert any("forced, without a survivor scan" in e["text"] for e in events), events
    os.kill(pid, 9)


def test_a_clear_whose_worker_is_not_connected_is_refused_at_once(site):
    ghost = Client(site.ctl.url, site.ctl.token("w-ghost", "worker"))
    ghost.post("/v1/workers/register", {"host": "ghost", "devices": [{"name": "cpu0"}]})
    ghost.post("/v1/devices/ghost:cpu0/fault", {"reason": "verify failed: test"})
    with pytest.raises(ApiError) as e:
        site.admin.post("/v1/devices/ghost:cpu0/clear", {})
    assert (e.value.status, e.value.code) == (503, "scan_unavailable")
    assert "the worker of ghost is not connected" in str(e.value), e.value
    assert state(site, "ghost:cpu0") == "unhealthy"


def test_a_device_out_with_survivors_recovers_by_itself_once_they_exit(site, tmp_path):
    site.config = quiet_config(tmp_path, "cpu:2", 'recheck_interval = "1s"')
    _, pid = lose_a_running_job(site, tmp_path, f"echo $$ > {tmp_path}/pid; exec sleep 301")
    wait_until(lambda: state(site, "vm:cpu1") == "unhealthy", 20, "vm:cpu1 to be out")
    # rescans while the survivor runs prove nothing: the device stays out
    assert state(site, "vm:cpu1") == "unhealthy"
    os.kill(pid, 9)
    wait_until(lambda: state(site, "vm:cpu1") == "ready", 20, "vm:cpu1 to recover by itself")
    events = site.admin.get("/v1/events", params={"kind": "device_recovered"})["events"]
    assert any(
        e["device_id"] == "vm:cpu1"
        and "found none left from an earlier job (the worker's periodic re-check)" in e["text"]
        for e in events
    ), events
