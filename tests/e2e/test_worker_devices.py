"""A GPU worker end to end, with a fake nvidia-smi first on its PATH: labels
from nvidia-smi, drop-ins and the config, usage sheets and `rc describe`;
CUDA numbering; lease hooks with linger; an acquire failure; the verify pass;
a compute process left on the GPU; labels kept while nvidia-smi is broken or
gone (docs/design.md#teardown-empty-or-out)."""

from __future__ import annotations

import signal
import sys

import pytest

from tests.helpers.fake_nvidia_smi import FakeNvidiaSmi
from tests.helpers.harness import Cli
from tests.helpers.wait import wait_until
from tests.helpers.worker_kit import Site, device, logs, submit, wait_state

HOST = "gpubox"
CONFIG = """
kill_grace = "1s"
probe_interval = "1s"
probe_dir = "{root}/probe.d"
verify_dir = "{root}/verify.d"
sheet_dir = "{root}/sheets"
labels = {{ site = "lab" }}
hooks = {{ timeout = "5s", release_linger = "2s" }}

[[devices]]
name = "gpu0"
on_acquire = "{root}/hooks/acquire"
on_release = "{root}/hooks/release"
labels = {{ tier = "a" }}

[[devices]]
name = "gpu1"

[[devices]]
name = "gpu2"
on_acquire = "{root}/hooks/bad-acquire"

[[devices]]
name = "gpu3"
"""


def script(path, body: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(0o755)


@pytest.fixture(scope="module")
def site(tmp_path_factory, pyz):
    root = tmp_path_factory.mktemp("devices")
    s = Site(root, pyz)
    s.events = root / "events"
    s.flags = root / "flags"
    s.flags.mkdir()
    s.passes = root / "passes"
    script(
        root / "hooks" / "acquire",
        f'echo "acquire $RC_DEVICE $RC_JOB_ID $RC_SUBMITTER" >> {s.events}',
    )
    script(root / "hooks" / "release", f'echo "release $RC_DEVICE $RC_JOB_ID" >> {s.events}')
    script(root / "hooks" / "bad-acquire", "echo 'cannot stop the display manager'; exit 3")
    script(
        root / "verify.d" / "10-xid",
        f'if [ -e "{s.flags}/$RC_JOB_ID" ]; then echo "Xid 79: GPU has fallen off the bus" >&2;'
        f" exit 1; fi",
    )
    script(
        root / "probe.d" / "10-site",
        f"n=$(cat {s.passes} 2>/dev/null || echo 0); echo $((n + 1)) > {s.passes}; "
        """echo '{"rack": "r7", "gpu1.ecc": "on", "pass": '$n'}'""",
    )
    (root / "sheets" / "host.d").mkdir(parents=True)
    (root / "sheets" / "host.md").write_text("# gpubox\nAsk #gpu-lab before long runs.\n")
    (root / "sheets" / "host.d" / "gpu1.md").write_text("gpu1: ECC on, fan 3 is loud.\n")
    s.fake = FakeNvidiaSmi(root / "fakebin", gpus=4)
    s.worker(HOST, CONFIG.format(root=root), env=s.fake.path_env(s.env))
    s.cli = Cli(s.ctl.url, s.ctl.admin_token, s.env, root)
    yield s
    s.close()


def events(site) -> list[str]:
    return site.events.read_text().splitlines() if site.events.exists() else []


def clear(site, device_id: str) -> None:
    site.admin.post(f"/v1/devices/{device_id}/clear", {})
    assert device(site.admin, device_id)["state"] == "ready"


def test_startup_release_pass_ran(site):
    # the pass runs on the poll thread, which may still be in it after registration
    wait_until(lambda: events(site), 20, "the startup release pass")
    assert events(site)[0].strip() == f"release {HOST}:gpu0"


def test_labels_sheets_and_recent_jobs_in_describe(site):
    j = wait_state(site.admin, submit(site.admin, ["true"], device_id=f"{HOST}:gpu1"))
    assert j["state"] == "succeeded"
    res = site.cli.run("describe", f"{HOST}:gpu1", check=True)
    out = res.stdout.decode()
    for line in (
        "vendor=nvidia  detected",
        "model=NVIDIA A100-SXM4-80GB  detected",
        "vram=81920M  detected",
        "driver=535.104.05  detected",
        "uuid=GPU-fake-1  detected",
        "ecc=on  detected",
        "rack=r7  detected",
        "site=lab  declared",
        "kind=gpu  detected",
        "cpus=",
    ):
        assert line in out, out
    assert "vram_free=80999M" in out
    assert "gpu1: ECC on, fan 3 is loud." in out and "device note" in out
    assert f"  {j['id']}  succeeded" in out
    info = site.cli.json("describe", f"{HOST}:gpu3")
    assert "Ask #gpu-lab before long runs." in info["sheet"] and info["sheet_is_host_wide"]
    assert {(lb["key"], lb["source"]) for lb in info["labels"]} >= {
        ("uuid", "detected"),
        ("site", "declared"),
    }
    assert all(age >= 0 for age in info["label_age_seconds"].values())
    tier = site.cli.json("describe", f"{HOST}:gpu0")["labels"]
    assert {"key": "tier", "value": "a"}.items() <= next(
        lb for lb in tier if lb["key"] == "tier"
    ).items()


def test_cuda_numbering_matches_nvidia_smi(site):
    code = "import os; print(os.environ['CUDA_VISIBLE_DEVICES'], os.environ['CUDA_DEVICE_ORDER'])"
    j = wait_state(
        site.admin, submit(site.admin, [sys.executable, "-c", code], device_id=f"{HOST}:gpu3")
    )
    assert logs(site.admin, j["id"]) == b"3 PCI_BUS_ID\n"


def test_a_burst_of_jobs_gives_one_acquire_and_one_release(site):
    before = len(events(site))
    ids = [submit(site.admin, ["true"], device_id=f"{HOST}:gpu0") for _ in range(3)]
    for i in ids:
        assert wait_state(site.admin, i)["state"] == "succeeded"
    wait_until(lambda: len(events(site)) >= before + 2, 20, "the lingering release")
    assert events(site)[before:] == [
        f"acquire {HOST}:gpu0 {ids[0]} root (token admin)",
        f"release {HOST}:gpu0 {ids[-1]}",
    ]


def test_an_acquire_failure_fails_the_job_and_faults_the_device(site):
    j = wait_state(site.admin, submit(site.admin, ["true"], device_id=f"{HOST}:gpu2"))
    assert j["state"] == "failed"
    assert j["kill_reason"] == (
        f"acquire hook failed: {site.root}/hooks/bad-acquire: exited 3\n"
        "cannot stop the display manager"
    )
    d = device(site.admin, f"{HOST}:gpu2")
    assert (d["state"], d["quarantine_reason"]) == ("unhealthy", "fault")
    assert "acquire hook failed" in d["quarantine_detail"]


def test_a_failed_verify_faults_the_device_before_the_report(site):
    code = f"import os; open('{site.flags}/' + os.environ['RC_JOB_ID'], 'w')"
    j = wait_state(
        site.admin, submit(site.admin, [sys.executable, "-c", code], device_id=f"{HOST}:gpu3")
    )
    assert j["state"] == "succeeded"  # the job itself is not relabelled
    d = device(site.admin, f"{HOST}:gpu3")  # already out when the job shows terminal
    assert (d["state"], d["quarantine_reason"]) == ("unhealthy", "fault")
    assert (
        d["quarantine_detail"]
        == "verify failed: 10-xid: exited 1: Xid 79: GPU has fallen off the bus"
    )
    kinds = [
        e["kind"]
        for e in site.admin.get("/v1/events")["events"]
        if e["device_id"] == f"{HOST}:gpu3"
    ]
    assert "verify_failed" in kinds
    clear(site, f"{HOST}:gpu3")


def test_a_compute_process_left_on_the_gpu_faults_the_device(site):
    line = "GPU-fake-3, 4242, python leftover.py, 100"
    j = wait_state(
        site.admin,
        submit(
            site.admin,
            ["sh", "-c", f"echo '{line}' >> {site.fake.dir}/apps"],
            device_id=f"{HOST}:gpu3",
        ),
        timeout=40,
    )
    try:
        assert j["state"] == "succeeded"
        d = device(site.admin, f"{HOST}:gpu3")
        assert (d["state"], d["quarantine_reason"]) == ("unhealthy", "fault")
        assert d["quarantine_detail"] == (
            "GPU GPU-fake-3 still has compute processes: pid 4242 'python leftover.py' (100 MiB)"
        )
    finally:
        site.fake.clear_apps()
        clear(site, f"{HOST}:gpu3")


def labels_of(site, device_id: str) -> dict[str, str]:
    info = site.admin.get(f"/v1/devices/{device_id}/describe")
    return {lb["key"]: lb["value"] for lb in info["labels"] if lb["source"] == "detected"}


def passes(site) -> int:
    return int(site.passes.read_text() or 0)


def next_passes(site, n: int = 2) -> None:
    start = passes(site)
    wait_until(lambda: passes(site) >= start + n, 20, f"{n} more probe passes")


def test_labels_are_kept_while_nvidia_smi_is_broken_or_gone(site):
    gpu1 = f"{HOST}:gpu1"
    healthy = labels_of(site, gpu1)
    assert healthy["vram"] == "81920M"
    try:
        site.fake.mode("broken")
        next_passes(site)
        broken = labels_of(site, gpu1)  # a failing source preserves, but never as healthy
        assert healthy["health"] == "ok" and broken["health"] == "unknown:nvidia-smi"
        moving = ("pass", "health", "disk_free_bytes")
        assert {k: v for k, v in broken.items() if k not in moving} == {
            k: v for k, v in healthy.items() if k not in moving
        }
        site.fake.mode("na")  # runs and reports: what it cannot read clears
        wait_until(lambda: "vram" not in labels_of(site, gpu1), 20, "vram to clear")
        na = labels_of(site, gpu1)
        assert na["model"] == "NVIDIA A100-SXM4-80GB" and "vram_free" not in na
        site.fake.mode("gone")  # was present at start: missing is a failure
        next_passes(site)
        gone = labels_of(site, gpu1)
        assert gone["health"] == "unknown:nvidia-smi"
        assert {k: v for k, v in gone.items() if k not in moving} == {
            k: v for k, v in na.items() if k not in moving
        }
    finally:
        site.fake.mode("healthy")
    wait_until(lambda: labels_of(site, gpu1).get("vram") == "81920M", 20, "vram to return")


def test_sigterm_runs_the_pending_release_at_once_and_exits_0(site):
    before = len(events(site))
    j = wait_state(site.admin, submit(site.admin, ["true"], device_id=f"{HOST}:gpu0"))
    assert j["state"] == "succeeded"
    w = site.workers[0]
    assert w.stop(signal.SIGTERM, timeout=30) == 0  # within the 2 s linger
    assert events(site)[before:] == [
        f"acquire {HOST}:gpu0 {j['id']} root (token admin)",
        f"release {HOST}:gpu0 {j['id']}",
    ]
    assert f"shutdown: releasing {HOST}:gpu0 now" in w.log()
