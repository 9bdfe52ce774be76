"""A network partition between worker and controller: a TCP
proxy inside the test stops forwarding for longer than the heartbeat interval
but shorter than the loss threshold. The job keeps running, its log arrives
complete and in order afterwards, and it ends exactly once, succeeded."""

from __future__ import annotations

import time

from tests.helpers.harness import Worker, job
from tests.helpers.proxy import Proxy
from tests.helpers.wait import wait_until


def test_partition_shorter_than_the_loss_threshold(make_controller, pyz, tmp_path, env):
    ctl = make_controller(
        "--heartbeat-interval",
        "1s",
        "--unknown-after",
        "2s",
        "--lost-after",
        "30s",
        "--sweep-interval",
        "0.2s",
    )
    host, port = ctl.url.rsplit("//", 1)[1].rsplit(":", 1)
    proxy = Proxy((host, int(port)))
    token = ctl.token("w-part", "worker")
    w = Worker(
        f"http://127.0.0.1:{proxy.port}",
        token,
        tmp_path / "w",
        env,
        host="parted",
        devices="cpu:1",
        pyz=pyz,
    )
    try:
        w.start()
        c = ctl.client(ctl.token("alice"))
        wait_until(lambda: c.get("/v1/devices")["devices"], 30, "the worker to register")
        lines = [f"line-{i:03d}" for i in range(1, 61)]
        script = "for i in $(seq -f %03g 1 60); do echo line-$i; sleep 0.1; done"
        j = c.post("/v1/jobs", {"command": ["sh", "-c", script], "selector": "*"})["job"]
        wait_until(lambda: job(c, j["id"])["state"] == "running", 30, "the job to start")
        proxy.pause()
        paused_at = time.monotonic()
        wait_until(
            lambda: c.get("/v1/devices")["devices"][0]["device"]["state"] == "unknown",
            10,
            "the controller to notice the silence",
        )
        wait_until(lambda: time.monotonic() - paused_at > 4.0, 10, "the partition to last 4 s")
        assert job(c, j["id"])["state"] == "running"
        proxy.resume()
        wait_until(
            lambda: job(c, j["id"])["state"] not in ("assigned", "running"), 60, "the job to end"
        )
        final = job(c, j["id"])
        assert final["state"] == "succeeded", final
        log = c.request("GET", f"/v1/jobs/{j['id']}/logs", params={"follow": "0"}).body
        assert log.decode().split() == lines
        events = c.get("/v1/events", params={"limit": 1000})["events"]
        assert not [
            e
            for e in events
            if e["kind"] in ("job_lost", "worker_lost", "lease_expired", "device_unhealthy")
        ]
        wait_until(
            lambda: c.get("/v1/devices")["devices"][0]["device"]["state"] == "ready",
            30,
            "the device to be free again",
        )
    finally:
        proxy.close()
        w.stop()
