"""GET /metrics: Prometheus text, parsed with prometheus_client's own
parser and checked against the store; the hooks others plug into; access."""

from __future__ import annotations

import collections

from rc.proto.client import Client
from tests.helpers.harness import job
from tests.helpers.scrape import parse, scrape, value
from tests.helpers.wait import wait_until


def test_metrics_match_the_store(make_controller, make_worker, tmp_path):
    controller = make_controller("--max-user-priority", "5")  # alice asks for 5 below
    conf = tmp_path / "worker.toml"
    conf.write_text('kill_grace = "1s"\n')
    worker_token = controller.token("worker-box", "worker")
    make_worker(controller, host="box", devices="cpu:2", config=conf, token=worker_token)
    admin = controller.client()
    alice_token = controller.token("alice")
    alice = Client(controller.url, alice_token)

    ok = alice.post(
        "/v1/jobs", {"command": ["sh", "-c", "echo hello metrics"], "device_id": "box:cpu0"}
    )["job"]["id"]
    bad = alice.post(
        "/v1/jobs", {"command": ["sh", "-c", "echo oops >&2; exit 3"], "device_id": "box:cpu0"}
    )["job"]["id"]
    for j, state in ((ok, "succeeded"), (bad, "failed")):
        wait_until(lambda j=j: job(admin, j)["state"] == state, 30, f"job {j} to be {state}")
    hold = alice.post(
        "/v1/jobs",
        {
            "kind": "hold",
            "device_id": "box:cpu1",
            "max_runtime_seconds": 600,
            "reason": "metrics test",
        },
    )
    wait_until(lambda: job(admin, hold["job"]["id"])["state"] == "running", 30, "the hold to run")
    for p in (5, 5, -3):
        alice.post("/v1/jobs", {"command": ["true"], "device_id": "box:cpu1", "priority": p})
    admin.post("/v1/devices/box:cpu0/fault", {"reason": "fan failure"})

    assert scrape(controller.url, None)[0] == 401
    assert scrape(controller.url, worker_token)[0] == 200

    def scraped():
        status, text = scrape(controller.url, alice_token)
        assert status == 200, text
        m = parse(text)
        return m if value(m, "rc_job_start_latency_seconds_count") == 3 else None

    m = wait_until(scraped, 15, "three job starts (two jobs and the hold) in the histogram")

    devices = admin.get("/v1/devices")["devices"]
    by_state = collections.Counter(v["device"]["state"] for v in devices)
    for state in ("ready", "busy", "unknown", "unhealthy"):
        assert value(m, "rc_devices", state=state) == by_state[state]
    assert (by_state["busy"], by_state["unhealthy"]) == (1, 1)
    assert value(m, "rc_devices_quarantined", reason="fault") == 1

    jobs = admin.get("/v1/jobs", params={"limit": 1000})["jobs"]
    states = collections.Counter(j["state"] for j in jobs)
    for state in ("succeeded", "failed", "killed", "lost"):
        assert value(m, "rc_jobs_finished_total", state=state) == states[state]
    for state in ("queued", "assigned", "running"):
        assert value(m, "rc_jobs", state=state) == states[state]
    queued = collections.Counter(j["priority"] for j in jobs if j["state"] == "queued")
    for p in range(-10, 11):
        assert value(m, "rc_queue_depth", priority=str(p)) == queued[p]
    assert queued == {5: 2, -3: 1}

    events = admin.get("/v1/events", params={"limit": 1000})["events"]
    kinds = collections.Counter(e["kind"] for e in events)
    assert kinds["device_unhealthy"] == 1
    for kind in kinds:
        assert value(m, "rc_events_total", kind=kind) == kinds[kind]

    age = value(m, "rc_worker_heartbeat_age_seconds", worker="box")
    assert 0 <= age < 30
    logs = list((controller.data / "logs").iterdir())
    assert value(m, "rc_log_bytes") == sum(f.stat().st_size for f in logs) > 0
    assert value(m, "rc_log_files") == len(logs)
    assert value(m, "rc_sse_subscribers") == 0
    assert value(m, "rc_job_start_latency_seconds_sum") >= 0
    assert value(m, "rc_job_start_latency_seconds_bucket", le="+Inf") == 3
    # two jobs and the hold were granted devices: three waits
    assert value(m, "rc_queue_wait_seconds_count") == 3
    # the store's device-time: the ledger's and the counter's are one number
    used = admin.get("/v1/usage", params={"since": "1d"})
    alice_row = next(r for r in used["rows"] if r["key"] == "alice")
    counted = value(m, "rc_device_seconds_total", user="alice")
    assert counted > 0 and abs(counted - alice_row["device_seconds"]) < 5.0
