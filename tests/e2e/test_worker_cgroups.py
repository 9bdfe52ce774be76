"""Process tracking by cgroup, end to end (docs/design.md#teardown-empty-or-out):
a real controller and real workers from dist/rc.pyz, as root, one per
tracking mode this host allows: cgroup2 (the detected hierarchy), cgroup1
(cgroup_root pointed at the v1 freezer) and scan (cgroup_root pointed at a
directory that is no cgroup hierarchy). An `env -i setsid` escapee (no
process group, no RC_JOB_ID) is killed and the device comes back clean; the
mode is the proctrack label."""

from __future__ import annotations

import os
import tempfile

import pytest

from rc.worker import cgroups
from tests.helpers.harness import Cli, pid_alive
from tests.helpers.wait import wait_until
from tests.helpers.worker_kit import Site, quiet_config, read_pid, submit, wait_state

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="cgroups are written as root"),
]


FREEZER = "/sys/fs/cgroup/freezer"


def _has(fstype: str, option: str = "") -> bool:
    with open("/proc/self/mounts") as f:
        mounts = cgroups.parse_mounts(f.read())
    return any(m.fstype == fstype and (not option or option in m.options) for m in mounts)


MODES = {
    "cgroup2": ("", _has("cgroup2")),
    "cgroup1": (f'cgroup_root = "{FREEZER}"', _has("cgroup", "freezer")),
    "scan": ('cgroup_root = "{root}/not-a-cgroup"', True),
}


@pytest.fixture(scope="module")
def site(tmp_path_factory, pyz):
    root = tmp_path_factory.mktemp("cgroups")
    (root / "not-a-cgroup").mkdir()
    s = Site(root, pyz)
    for mode, (extra, available) in MODES.items():
        if available:
            s.worker(mode, quiet_config(root, extra=extra.format(root=root)))
    yield s
    s.close()


def _skip_unless(mode: str) -> None:
    if not MODES[mode][1]:
        pytest.skip(f"this host has no {mode} hierarchy")


def _worker_base(site, mode: str) -> str:
    """The subtree the worker of host `mode` owns: its name follows the host
    lock, which lives in the worker's TMPDIR (cgroups.subtree_name)."""
    saved = tempfile.tempdir
    tempfile.tempdir = site.env["TMPDIR"]
    try:
        return cgroups.Tracker.detect(mode, MODES[mode][0].partition('"')[2].rstrip('"')).base
    finally:
        tempfile.tempdir = saved


def test_workers_of_one_host_name_under_other_lock_dirs_have_subtrees_of_their_own(tmp_path):
    """Two workers named `box` with different TMPDIRs (each test has its own)
    shared rc-worker-box: one's sweep of empty leftover cgroups removed the
    other's new job cgroup before its child joined it, and the job failed to
    start with "No such file or directory"."""
    _skip_unless("cgroup2")
    saved = tempfile.tempdir
    bases = []
    try:
        for sub in ("one", "two"):
            (tmp_path / sub).mkdir()
            tempfile.tempdir = str(tmp_path / sub)
            bases.append(cgroups.Tracker.detect("box").base)
        tempfile.tempdir = str(tmp_path / "one")
        assert cgroups.Tracker.detect("box").base == bases[0]  # the next process finds it
    finally:
        tempfile.tempdir = saved
    assert bases[0] != bases[1]
    assert os.path.basename(bases[0]).startswith("rc-worker-box-")
    for b in bases:
        os.rmdir(b)


def labels(device: dict) -> dict[str, str]:
    return {lab["key"]: lab["value"] for lab in device["labels"]}


def device_state(site, device_id: str) -> str:
    return site.admin.get(f"/v1/devices/{device_id}/describe")["view"]["device"]["state"]


@pytest.mark.parametrize("mode", list(MODES))
def test_the_worker_names_its_tracking_mode(site, mode):
    _skip_unless(mode)
    view = site.admin.get(f"/v1/devices/{mode}:cpu0/describe")["view"]
    assert labels(view["device"])["proctrack"] == mode
    devices = site.admin.get("/v1/devices")["devices"]
    (mine,) = [v for v in devices if v["device"]["id"] == f"{mode}:cpu0"]
    assert labels(mine["device"])["proctrack"] == mode


@pytest.mark.parametrize("mode", ["cgroup2", "cgroup1"])
def test_an_env_i_setsid_escapee_is_killed_and_the_device_returns_clean(site, tmp_path, mode):
    _skip_unless(mode)
    script = (
        f"env -i setsid sleep 1000 & echo $! > {tmp_path}/escapee; "
        f"(env -i setsid sh -c 'sleep 1000 & echo $! > {tmp_path}/double' &); "
        f"while [ ! -s {tmp_path}/double ]; do sleep 0.05; done"
    )
    job_id = submit(site.admin, ["sh", "-c", script], device_id=f"{mode}:cpu0", cwd=str(tmp_path))
    j = wait_state(site.admin, job_id)
    pids = [read_pid(tmp_path / "escapee"), read_pid(tmp_path / "double")]
    assert j["state"] == "succeeded", j
    # neither carries the job's tag nor its group, yet both were in its cgroup
    assert not [p for p in pids if pid_alive(p)]
    wait_until(lambda: device_state(site, f"{mode}:cpu0") == "ready", 10, "the device back")
    base = _worker_base(site, mode)
    assert not os.path.exists(os.path.join(base, f"job-{job_id}"))  # verified empty, removed


@pytest.mark.parametrize("mode", ["cgroup2", "cgroup1"])
def test_a_killed_job_takes_its_cgroup_escapees_with_it(site, tmp_path, mode):
    _skip_unless(mode)
    script = f"env -i setsid sleep 1000 & echo $! > {tmp_path}/escapee; exec sleep 1000"
    job_id = submit(site.admin, ["sh", "-c", script], device_id=f"{mode}:cpu0", cwd=str(tmp_path))
    escapee = read_pid(tmp_path / "escapee")
    site.admin.post(f"/v1/jobs/{job_id}/kill", {})
    j = wait_state(site.admin, job_id)
    assert j["state"] == "killed", j
    assert not pid_alive(escapee)
    wait_until(lambda: device_state(site, f"{mode}:cpu0") == "ready", 10, "the device back")


def test_scan_mode_still_sweeps_tagged_escapees(site, tmp_path):
    script = (
        f"setsid sleep 1000 & echo $! > {tmp_path}/escapee; "
        f"while [ ! -s {tmp_path}/escapee ]; do sleep 0.05; done"
    )
    job_id = submit(site.admin, ["sh", "-c", script], device_id="scan:cpu0", cwd=str(tmp_path))
    j = wait_state(site.admin, job_id)
    assert j["state"] == "succeeded", j
    assert not pid_alive(read_pid(tmp_path / "escapee"))
    assert device_state(site, "scan:cpu0") == "ready"


@pytest.mark.parametrize("mode", ["cgroup2", "cgroup1"])
def test_an_exec_session_has_a_cgroup_of_its_own(site, tmp_path, mode):
    """`rc exec` in a hold: an untagged escapee of the session ends with the
    session, while the hold goes on."""
    _skip_unless(mode)
    cli = Cli(site.ctl.url, site.ctl.admin_token, site.env, tmp_path)
    hold = cli.run(
        "hold", "-d", f"{mode}:cpu0", "--ttl", "10m", "--reason", "cg", "--detach", check=True
    )
    hold_id = int(hold.stdout)
    try:
        res = cli.run(
            "exec",
            str(hold_id),
            "--",
            "sh",
            "-c",
            "env -i setsid sleep 1000 >/dev/null 2>&1 < /dev/null & echo $!",
            check=True,
        )
        escapee = int(res.stdout)
        wait_until(lambda: not pid_alive(escapee), 15, "the session's escapee to be killed")
        assert site.admin.get(f"/v1/jobs/{hold_id}")["job"]["state"] == "running"
    finally:
        cli.run("release", str(hold_id), check=True)
