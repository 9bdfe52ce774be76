"""GPU health end to end (README "GPU health"): a controller run with
--drain-degraded, a worker from the zipapp with a fake nvidia-smi first on
its PATH and a fake kmsg file as its kernel log. A failed row remap and an
Xid 79 quarantine their GPU as `fault` with the evidence, a pending remap
drains it, a narrowed PCIe link labels it degraded and drains it, `health=ok`
selects only healthy GPUs, and rc describe shows the baseline and history.
A job that an Xid 79 ends says `cause: hardware (...)` and its GPU is
faulted naming it; an application's own Xid is recorded on its job only.
rc clear and rc undrain of a health rule's doing need the rule's fact to
read clean (an unreadable one never is), and a GPU cleared while its fault
is there is quarantined again."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from rc.proto.client import Client
from rc.proto.errors import ApiError
from tests.helpers.fake_nvidia_smi import kmsg_xid
from tests.helpers.harness import BARE_PY, Cli
from tests.helpers.wait import wait_until
from tests.helpers.worker_kit import device, gpu_site, submit, wait_state

HOST = "healthbox"


@pytest.fixture(scope="module")
def site(tmp_path_factory, pyz):
    s = gpu_site(tmp_path_factory.mktemp("health"), pyz, HOST, 9, ("--drain-degraded",))
    yield s
    s.close()


def labels(site, name: str) -> dict[str, str]:
    info = site.admin.get(f"/v1/devices/{HOST}:{name}/describe")
    return {lb["key"]: lb["value"] for lb in info["labels"] if lb["source"] == "detected"}


def test_healthy_gpus_carry_health_ok_and_a_baseline(site):
    got = labels(site, "gpu0")
    assert got["health"] == "ok"
    assert got["health_baseline"] == "ok ecc_aggregate=0 pcie=gen4/4x16/16"
    job = submit(site.admin, ["true"], selector="health=ok")
    assert wait_state(site.admin, job)["state"] == "succeeded"


def test_a_failed_row_remap_quarantines_the_gpu_with_the_evidence(site):
    site.fake.set_gpu(1, remapped_rows__failure="Yes")
    wait_until(lambda: device(site.admin, f"{HOST}:gpu1")["state"] == "unhealthy", 20, "fault")
    d = device(site.admin, f"{HOST}:gpu1")
    assert d["quarantine_reason"] == "fault"
    assert d["quarantine_detail"].startswith(f"health: row-remap-failed on {HOST}:gpu1: ")
    assert "remapped_rows.failure=Yes" in d["quarantine_detail"]
    assert "GPU Memory Error Management" in d["quarantine_detail"]
    out = Cli(site.ctl.url, site.ctl.admin_token, site.env, site.root).run(
        "describe", f"{HOST}:gpu1"
    )
    assert out.returncode == 0, out.stderr
    text = out.stdout.decode()
    assert "HEALTH HISTORY" in text and "device_unhealthy  health: row-remap-failed" in text
    assert "health=fault:row-remap-failed" in text


def test_a_pending_row_remap_drains_the_gpu(site):
    site.fake.set_gpu(2, remapped_rows__pending="Yes")
    wait_until(lambda: device(site.admin, f"{HOST}:gpu2")["draining"], 20, "a drain")
    d = device(site.admin, f"{HOST}:gpu2")
    assert d["state"] == "ready" and d["drain_reason"].startswith("health: row-remap-pending")


def test_a_narrowed_link_is_degraded_and_drained_with_drain_degraded(site):
    site.fake.set_gpu(3, pcie__link__width__current="8")
    wait_until(lambda: labels(site, "gpu3")["health"] == "degraded:pcie-width", 20, "degraded")
    wait_until(lambda: device(site.admin, f"{HOST}:gpu3")["draining"], 20, "a drain")
    reason = device(site.admin, f"{HOST}:gpu3")["drain_reason"]
    assert reason == "health: degraded:pcie-width (rc serve --drain-degraded)"


def test_an_xid_79_quarantines_its_gpu(site):
    with open(site.kmsg, "a") as f:
        f.write(kmsg_xid(50, 9_000_000, 4, 79))
    wait_until(lambda: device(site.admin, f"{HOST}:gpu4")["state"] == "unhealthy", 20, "fault")
    d = device(site.admin, f"{HOST}:gpu4")
    assert d["quarantine_reason"] == "fault"
    assert d["quarantine_detail"].startswith(f"health: xid-79 on {HOST}:gpu4: GPU has fallen off")
    assert "Xid Catalog" in d["quarantine_detail"]
    assert labels(site, "gpu4")["health"] == "fault:xid-79"
    assert device(site.admin, f"{HOST}:gpu0")["state"] == "ready"  # only the GPU it names


def crash(kmsg, gpu: int, xid: int, text: str) -> list[str]:
    """A job that logs an Xid on fake GPU `gpu` (at the kernel's time: the
    monotonic clock) and exits 1, as a job the GPU fails under does."""
    line = kmsg_xid(0, 0, gpu, xid, text).replace("3,0,0,", "3,{seq},{usec},")
    code = (
        "import time; t = int(time.monotonic() * 1e6); "
        f"open({str(kmsg)!r}, 'a').write({line!r}.format(seq=t, usec=t)); "
        "raise SystemExit(1)"
    )
    return [BARE_PY, "-c", code]


def test_a_job_an_xid_79_ends_is_a_hardware_failure(site):
    dev = f"{HOST}:gpu5"
    j = wait_state(site.admin, submit(site.admin, crash(site.kmsg, 5, 79, "fell"), device_id=dev))
    assert j["state"] == "failed"
    assert f"cause: hardware (Xid 79 on {dev}: GPU has fallen off the bus)" in j["kill_reason"]
    # pinned to the GPU that failed it: it cannot go elsewhere (README "GPU health")
    assert j["kill_reason"].endswith("; not requeued: pinned to the faulty device")
    assert j["restart_count"] == 0
    d = device(site.admin, dev)
    assert d["state"] == "unhealthy" and d["quarantine_reason"] == "fault"
    assert d["quarantine_detail"].startswith(f"health: xid-79 on {dev}: ")
    feed = site.admin.get("/v1/events", params={"limit": "1000"})["events"]
    assert any(e["job_id"] == j["id"] and "xid-79" in e["text"] for e in feed)


def test_an_applications_own_xid_is_recorded_on_its_job_only(site):
    dev = f"{HOST}:gpu6"
    j = wait_state(site.admin, submit(site.admin, crash(site.kmsg, 6, 13, "oops"), device_id=dev))
    assert j["state"] == "failed"
    assert f"Xid 13 on {dev}: graphics engine exception (the application's own)" in j["kill_reason"]
    assert "cause: hardware" not in j["kill_reason"]
    assert device(site.admin, dev)["state"] == "ready"
    assert labels(site, "gpu6")["health"] == "ok"


def test_rc_clear_of_a_health_fault_reprobes_and_refuses_while_it_is_there(site):
    dev = f"{HOST}:gpu1"  # faulted by its failed row remap above
    assert device(site.admin, dev)["state"] == "unhealthy"
    cli = Cli(site.ctl.url, site.ctl.admin_token, site.env, site.root)
    out = cli.run("clear", dev)
    assert out.returncode == 1
    err = out.stderr.decode()
    assert "still reads fault:row-remap-failed (re-probed just now)" in err
    assert device(site.admin, dev)["state"] == "unhealthy"
    site.fake.set_gpu(1, remapped_rows__failure="No")  # the card was replaced
    out = cli.run("clear", dev)
    assert out.returncode == 0, out.stderr
    assert "its GPU reads ok again" in out.stdout.decode()
    assert device(site.admin, dev)["state"] == "ready"


def test_rc_clear_of_an_xid_fault_needs_the_gpu_to_answer_again(site):
    dev = f"{HOST}:gpu4"  # faulted by its Xid 79 above
    site.fake.set_gpu(4, index="[N/A]")  # off the bus: nvidia-smi no longer lists it
    cli = Cli(site.ctl.url, site.ctl.admin_token, site.env, site.root)
    out = cli.run("clear", dev)
    assert out.returncode == 1 and "still reads unreadable" in out.stderr.decode()
    site.fake.set_gpu(4, index="4")  # the reboot or reset brought it back
    out = cli.run("clear", dev)
    assert out.returncode == 0, out.stderr
    assert device(site.admin, dev)["state"] == "ready"
    wait_until(lambda: labels(site, "gpu4")["health"] == "ok", 20, "the label to return")


def admin_cli(site) -> Cli:
    return Cli(site.ctl.url, site.ctl.admin_token, site.env, site.root)


def test_rc_clear_refuses_a_fault_whose_fact_cannot_be_read(site):
    dev = f"{HOST}:gpu7"
    site.fake.set_gpu(7, remapped_rows__failure="Yes")
    wait_until(lambda: device(site.admin, dev)["state"] == "unhealthy", 20, "fault")
    site.fake.set_gpu(7, remapped_rows__failure="[Unknown Error]")
    out = admin_cli(site).run("clear", dev)
    err = out.stderr.decode()
    assert out.returncode == 1, err
    assert "device_not_cleared" in err and "still reads unknown:row-remap-failed" in err
    assert "could not be read for row-remap-failed" in err
    assert device(site.admin, dev)["state"] == "unhealthy"


def test_a_gpu_cleared_while_its_fault_is_there_is_quarantined_again(site):
    dev = f"{HOST}:gpu7"  # faulted by its failed row remap above
    site.fake.set_gpu(7, remapped_rows__failure="Yes")
    out = admin_cli(site).run("clear", "--force", dev)
    assert out.returncode == 0, out.stderr
    wait_until(lambda: device(site.admin, dev)["state"] == "unhealthy", 20, "a new fault")
    assert device(site.admin, dev)["quarantine_detail"].startswith(
        f"health: row-remap-failed on {dev}: "
    )
    site.fake.set_gpu(7, remapped_rows__failure="No")
    out = admin_cli(site).run("clear", dev)
    assert out.returncode == 0, out.stderr
    assert device(site.admin, dev)["state"] == "ready"


def test_rc_clear_while_nvidia_smi_fails_says_the_gpu_cannot_be_read(site):
    dev = f"{HOST}:gpu5"  # faulted by the Xid 79 that ended its job above
    assert device(site.admin, dev)["state"] == "unhealthy"
    site.fake.mode("broken")
    try:
        # an Xid fault stays on the label: a fault ranks before unknown
        wait_until(lambda: labels(site, "gpu0")["health"] == "unknown:nvidia-smi", 20, "unknown")
        assert labels(site, "gpu5")["health"] == "fault:xid-79"
        out = admin_cli(site).run("clear", dev)
        err = out.stderr.decode()
        assert out.returncode == 1, err
        assert "device_not_cleared" in err and "nvidia-smi cannot read the GPU at all" in err
        assert "scan_unavailable" not in err
    finally:
        site.fake.mode("healthy")
    out = admin_cli(site).run("clear", dev)
    assert out.returncode == 0, out.stderr
    assert device(site.admin, dev)["state"] == "ready"


def test_rc_undrain_of_a_health_drain_needs_the_fact_to_read_clean(site):
    dev = f"{HOST}:gpu2"  # drained by its pending row remap above
    cli = admin_cli(site)
    out = cli.run("undrain", dev)
    err = out.stderr.decode()
    assert out.returncode == 1, err
    assert "device_not_cleared" in err and "still reads drain:row-remap-pending" in err
    assert f"rc undrain --force {dev}" in err
    assert device(site.admin, dev)["draining"]
    site.fake.set_gpu(2, remapped_rows__pending="No")  # the GPU was reset
    out = cli.run("undrain", dev)
    assert out.returncode == 0, out.stderr
    assert "its GPU reads ok again" in out.stdout.decode()
    assert not device(site.admin, dev)["draining"]


def test_rc_undrain_force_undrains_a_health_drain_on_the_admins_word(site):
    dev = f"{HOST}:gpu8"
    site.fake.set_gpu(8, remapped_rows__pending="Yes")
    wait_until(lambda: device(site.admin, dev)["draining"], 20, "a drain")
    out = admin_cli(site).run("undrain", "--force", dev)
    assert out.returncode == 0, out.stderr
    assert "forced" in out.stdout.decode()
    assert not device(site.admin, dev)["draining"]
    feed = site.admin.get("/v1/events", params={"kind": "device_undrained"})["events"]
    assert any(e["device_id"] == dev and "forced" in e["text"] for e in feed), feed


def test_a_health_clear_answers_by_its_reading_and_sets_the_label(site):
    # a worker of our own, answering the clear's scan as we choose
    w = Client(site.ctl.url, site.ctl.token("w-xidbox", "worker"))
    w.post("/v1/workers/register", {"host": "xidbox", "devices": [{"name": "gpu0"}]})
    w.post(
        "/v1/workers/xidbox/labels",
        {"host": "xidbox", "labels": {"gpu0": {"health": "fault:xid-48"}}},
    )
    dev = "xidbox:gpu0"
    reason = f"health: xid-48 on {dev}: double-bit ECC error (kernel: NVRM: Xid 48; source: x)"
    w.post(f"/v1/devices/{dev}/fault", {"reason": reason})
    w.post(f"/v1/devices/{dev}/fault", {"reason": reason})  # standing: sent again
    feed = site.admin.get("/v1/events", params={"kind": "device_unhealthy"})["events"]
    assert len([e for e in feed if e["device_id"] == dev]) == 1  # once in its history

    def clear_answered(health: dict, complete: bool = True):
        w.get("/v1/workers/xidbox/assignments", params={"wait": "0s"})  # connected
        admin = Client(site.ctl.url, site.ctl.admin_token)
        with ThreadPoolExecutor(1) as pool:
            asked = pool.submit(admin.post, f"/v1/devices/{dev}/clear", {})
            scans = []
            for _ in range(20):
                got = w.get("/v1/workers/xidbox/assignments", params={"wait": "1s"})
                scans = (got or {}).get("scans", [])
                if scans:
                    break
            assert scans, "the clear's scan never came"
            w.post(
                f"/v1/workers/xidbox/scans/{scans[0]['scan_id']}",
                {"complete": complete, "health": health},
            )
            return asked.result(timeout=30)

    with pytest.raises(ApiError) as e:
        clear_answered({dev: "unreadable"}, complete=False)  # nvidia-smi fails: no process list
    assert (e.value.status, e.value.code) == (409, "device_not_cleared")
    assert "nvidia-smi cannot read the GPU at all" in str(e.value)
    with pytest.raises(ApiError) as e:
        clear_answered({dev: "fault:row-remap-failed"})
    assert e.value.code == "device_not_cleared" and "it has a fault" in str(e.value)
    got = clear_answered({dev: "ok"})
    assert "its GPU reads ok again" in got["message"]
    info = site.admin.get(f"/v1/devices/{dev}/describe")
    assert info["view"]["device"]["state"] == "ready"
    health = [lb for lb in info["labels"] if lb["key"] == "health"]
    assert [(lb["value"], lb["source"]) for lb in health] == [("ok", "detected")]
