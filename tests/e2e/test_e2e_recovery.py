"""Recovery with real processes: a worker killed mid-job,
survivors that keep a device out, proofs that bring it back, the flap guard,
and a controller restart that must not expire a healthy job's lease."""

from __future__ import annotations

import os
import signal
import time
import uuid

from tests.helpers.harness import Controller, device_state, job, pid_alive
from tests.helpers.wait import wait_until


def _events(c, kind):
    return [e for e in c.get("/v1/events", params={"limit": 1000})["events"] if e["kind"] == kind]


def _device(c, device_id):
    return next(
        v["device"] for v in c.get("/v1/devices")["devices"] if v["device"]["id"] == device_id
    )


def _start_job(c, device_id, tmp_path, n):
    pidfile = tmp_path / f"pid-{n}"
    j = c.post(
        "/v1/jobs",
        {"command": ["sh", "-c", f"echo $$ > {pidfile}; exec sleep 300"], "device_id": device_id},
    )["job"]
    wait_until(lambda: pidfile.exists() and pidfile.read_text().strip(), 30, "the job to start")
    return j["id"], int(pidfile.read_text())


def test_worker_killed_mid_job_survivors_keep_the_device_out(controller, make_worker, tmp_path):
    host = "rcv-" + uuid.uuid4().hex[:8]
    device = f"{host}:cpu0"
    c = controller.client(controller.token("alice"))
    admin = controller.client()
    w = make_worker(controller, host=host, devices="cpu:1")
    token = w.token
    job_id, pid = _start_job(c, device, tmp_path, 0)
    w.kill9()
    assert pid_alive(pid), "the job outlives its worker (its own session)"
    w2 = make_worker(controller, host=host, devices="cpu:1", token=token, wait=False)
    wait_until(lambda: job(admin, job_id)["state"] == "lost", 30, "the job to be lost")
    assert job(admin, job_id)["kill_reason"] == "worker re-registered"
    d = _device(admin, device)
    assert (d["state"], d["quarantine_reason"]) == ("unhealthy", "registration")
    assert _events(admin, "device_recovered") == []  # the survivor scan found the sleep
    # once the process is gone, the next registration proves it and recovers
    os.kill(pid, signal.SIGKILL)
    wait_until(lambda: not pid_alive(pid), 10, "the survivor to die")
    w2.stop()
    make_worker(controller, host=host, devices="cpu:1", token=token, wait=False)
    wait_until(lambda: device_state(admin, device) == "ready", 30, "the device to recover")
    [ev] = _events(admin, "device_recovered")
    assert ev["device_id"] == device
    assert ev["text"].startswith("was quarantined for registration; ")
    assert "found none" in ev["text"]


def test_fourth_recovery_within_the_hour_waits_for_a_human(controller, make_worker, tmp_path):
    host = "flap-" + uuid.uuid4().hex[:8]
    device = f"{host}:cpu0"
    c = controller.client(controller.token("alice"))
    admin = controller.client()
    w = make_worker(controller, host=host, devices="cpu:1")
    token = w.token
    for cycle in range(4):
        job_id, pid = _start_job(c, device, tmp_path, cycle)
        w.kill9()
        os.kill(pid, signal.SIGKILL)
        wait_until(lambda: not pid_alive(pid), 10, "the job process to die")
        w = make_worker(controller, host=host, devices="cpu:1", token=token, wait=False)
        wait_until(lambda: job(admin, job_id)["state"] == "lost", 30, f"cycle {cycle}: job lost")
        if cycle < 3:
            wait_until(
                lambda: device_state(admin, device) == "ready", 30, f"cycle {cycle}: recovery"
            )
    d = _device(admin, device)
    assert (d["state"], d["quarantine_reason"]) == ("unhealthy", "registration")
    assert len(_events(admin, "device_recovered")) == 3
    assert _events(admin, "recovery_refused")
    admin.post(f"/v1/devices/{device}/clear")
    assert device_state(admin, device) == "ready"


def test_short_controller_restart_does_not_expire_a_healthy_lease(tmp_path, env, make_worker):
    flags = [
        "--lease-default",
        "2s",
        "--lease-renewal",
        "3s",
        "--heartbeat-interval",
        "2s",
        "--sweep-interval",
        "0.05s",
        "--startup-grace",
        "6s",
    ]
    ctl = Controller(tmp_path / "data", env, flags).start()
    try:
        port = ctl.url.rsplit(":", 1)[1]
        make_worker(ctl, host="steady", devices="cpu:1")
        c = ctl.client(ctl.token("alice"))
        marker = tmp_path / "done"
        j = c.post(
            "/v1/jobs", {"command": ["sh", "-c", f"sleep 6; touch {marker}"], "selector": "*"}
        )["job"]
        wait_until(lambda: job(c, j["id"])["state"] == "running", 30, "the job to run")
        ctl.kill9()
        c.close_all()
        # down long enough for the lease to lapse in wall time (the behaviour under test)
        deadline = time.monotonic() + 3.5
        wait_until(lambda: time.monotonic() > deadline, 5, "downtime")
        ctl = Controller(tmp_path / "data", env, flags, listen=f"127.0.0.1:{port}").start()
        c = ctl.client(ctl.token("bob"))
        wait_until(lambda: marker.exists(), 30, "the job to finish")
        wait_until(
            lambda: job(c, j["id"])["state"] in ("succeeded", "lost", "failed"),
            30,
            "the terminal report",
        )
        assert job(c, j["id"])["state"] == "succeeded"
        assert _events(c, "lease_expired") == []
    finally:
        ctl.stop()


def test_worker_reregisters_after_a_controller_restart_and_proves(tmp_path, env, make_worker):
    """The device stays out while the survivor lives; after a controller restart
    the idle worker registers again by itself and its clean scan recovers it."""
    host = "rereg-" + uuid.uuid4().hex[:8]
    device = f"{host}:cpu0"
    ctl = Controller(tmp_path / "data", env, ["--heartbeat-interval", "1s"]).start()
    config = tmp_path / "worker.toml"
    config.write_text('reregister_jitter = "0s"\nkill_grace = "1s"\n')
    try:
        port = ctl.url.rsplit(":", 1)[1]
        c = ctl.client(ctl.token("alice"))
        w = make_worker(ctl, host=host, devices="cpu:1", config=config)
        job_id, pid = _start_job(c, device, tmp_path, 0)
        w.kill9()
        make_worker(ctl, host=host, devices="cpu:1", token=w.token, wait=False, config=config)
        admin = ctl.client()
        wait_until(lambda: job(admin, job_id)["state"] == "lost", 30, "the job to be lost")
        assert device_state(admin, device) == "unhealthy"
        os.kill(pid, signal.SIGKILL)
        wait_until(lambda: not pid_alive(pid), 10, "the survivor to die")
        assert device_state(admin, device) == "unhealthy"  # nobody proved anything yet
        admin.close_all()
        c.close_all()
        ctl.stop()
        ctl = Controller(
            tmp_path / "data", env, ["--heartbeat-interval", "1s"], listen=f"127.0.0.1:{port}"
        ).start()
        admin = ctl.client()
        wait_until(
            lambda: device_state(admin, device) == "ready",
            60,
            "the worker to re-register and prove the device empty",
        )
        assert [e for e in _events(admin, "device_recovered") if e["device_id"] == device]
    finally:
        ctl.stop()


def test_a_restarted_worker_gets_work_its_dead_predecessor_was_polling_for(
    make_controller, make_worker, tmp_path
):
    """A worker killed with -9 leaves its long poll parked on the controller.
    That stale poll must not take the next assignment: the new worker gets it
    at once, not after a heartbeat forgets the lost hand-out (found when a
    test took 10 s per worker restart)."""
    ctl = make_controller("--heartbeat-interval", "60s")
    w = make_worker(ctl, host="relay-race", devices="cpu:1")
    c = ctl.client(ctl.token("alice"))
    w.kill9()
    make_worker(ctl, host="relay-race", devices="cpu:1", token=w.token)
    marker = tmp_path / "ran"
    j = c.post("/v1/jobs", {"command": ["touch", str(marker)], "selector": "*"})["job"]
    wait_until(marker.exists, 30, "the new worker to run the job (a stale poll took it?)")
    wait_until(lambda: job(c, j["id"])["state"] == "succeeded", 30, "the job to succeed")


def test_after_a_controller_restart_the_worker_is_heard_before_its_next_heartbeat(
    tmp_path, env, make_worker
):
    """Found measuring failover: a restarted (or newly active) controller keeps
    a worker's devices `unknown` until it hears a heartbeat, and the worker's
    long poll parked there unanswered, so the first job waited for the next
    heartbeat (up to the interval: 10 s by default). Now the poll of a worker
    this controller process has not heard answers at once, and a response
    from a new instance makes the worker heartbeat at once. With a 1-hour
    interval, a job submitted after the restart still runs."""
    flags = ["--heartbeat-interval", "1h"]
    ctl = Controller(tmp_path / "data", env, flags).start()
    try:
        port = ctl.url.rsplit(":", 1)[1]
        make_worker(ctl, host="slowbeat", devices="cpu:1")
        ctl.kill9()
        ctl = Controller(tmp_path / "data", env, flags, listen=f"127.0.0.1:{port}").start()
        c = ctl.client(ctl.token("alice"))
        j = c.post("/v1/jobs", {"command": ["true"], "selector": "*"})["job"]
        wait_until(lambda: job(c, j["id"])["state"] == "succeeded", 30, "the job to run")
    finally:
        ctl.stop()
