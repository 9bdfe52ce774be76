"""Free text over the 4096-character limit (README: Limits): what a person
sends is refused, 400 limit_exceeded, never cut; what a worker reports is
cut with a visible "…", never refused (a refused report would be retried
for good). Found by a new user: a 5000-character `rc drain --reason` and a
kill reason were silently cut to 4096 and answered 200."""

from __future__ import annotations

import pytest

from rc.proto.client import Client
from rc.proto.errors import ApiError
from tests.helpers.harness import Cli, job
from tests.helpers.wait import wait_until

LIMIT = 4096


@pytest.fixture
def fake(controller):
    """A worker of host `tl` (cpu0, cpu1) spoken for over HTTP, and an admin client."""
    worker = Client(controller.url, controller.token("w-tl", "worker"))
    worker.post(
        "/v1/workers/register",
        {"host": "tl", "devices": [{"name": "cpu0"}, {"name": "cpu1"}], "instance": "one"},
    )
    yield worker, controller.client()
    worker.close_all()


def _assigned(admin: Client, job_id: int) -> None:
    wait_until(lambda: job(admin, job_id)["state"] == "assigned", 30, f"job {job_id} assigned")


def _device(admin: Client, device_id: str) -> dict:
    return next(
        v["device"] for v in admin.get("/v1/devices")["devices"] if v["device"]["id"] == device_id
    )


def test_a_persons_long_kill_or_drain_reason_is_refused(controller, fake, env, tmp_path):
    _worker, admin = fake
    alice = Client(controller.url, controller.token("alice"))
    job_id = alice.post("/v1/jobs", {"command": ["true"], "device_id": "tl:cpu0"})["job"]["id"]
    _assigned(admin, job_id)
    for path, what in ((f"/v1/jobs/{job_id}/kill", "kill"), ("/v1/devices/tl:cpu1/drain", "drain")):
        with pytest.raises(ApiError) as e:
            admin.post(path, {"reason": "z" * (LIMIT + 1)})
        assert (e.value.status, e.value.code) == (400, "limit_exceeded"), what
        assert f"the {what} reason is {LIMIT + 1} characters long; the limit is {LIMIT}" in str(
            e.value.message
        )
    assert job(admin, job_id)["state"] == "assigned", "a refused kill kills nothing"
    assert not _device(admin, "tl:cpu1")["draining"], "a refused drain drains nothing"
    # the CLI says so and exits 1 (the controller refused)
    cli = Cli(controller.url, controller.admin_token, env, tmp_path)
    res = cli.run("drain", "tl:cpu1", "--reason", "z" * 5000)
    assert res.returncode == 1, res
    assert res.stderr.startswith(b"rc: limit_exceeded: the drain reason is 5000 characters")
    # at the limit, both are taken whole
    admin.post("/v1/devices/tl:cpu1/drain", {"reason": "d" * LIMIT})
    assert _device(admin, "tl:cpu1")["drain_reason"] == "d" * LIMIT
    admin.post(f"/v1/jobs/{job_id}/kill", {"reason": "k" * LIMIT})
    assert job(admin, job_id)["kill_reason"].endswith(": " + "k" * LIMIT)


def test_a_workers_long_detail_is_cut_with_a_mark_and_taken(controller, fake):
    worker, admin = fake
    alice = Client(controller.url, controller.token("alice"))
    ids = [
        alice.post("/v1/jobs", {"command": ["true"], "device_id": f"tl:cpu{n}"})["job"]["id"]
        for n in (0, 1)
    ]
    for job_id in ids:
        _assigned(admin, job_id)
    long = "verify failed: " + "v" * 10_000
    report = {"job_id": ids[0], "state": "failed", "exit_code": 3, "reason": long}
    [res] = worker.post("/v1/workers/tl/reports", {"reports": [report]})["results"]
    assert res["ok"], res
    # a report of its own, as a worker sends each one that ends apart
    report = {"job_id": ids[1], "state": "failed", "exit_code": 4, "reason": long}
    [res] = worker.post("/v1/workers/tl/reports", {"reports": [report]})["results"]
    assert res["ok"], res
    for job_id in ids:
        stored = job(admin, job_id)["kill_reason"]
        assert len(stored) == LIMIT and stored == long[: LIMIT - 1] + "…", job_id
    worker.post("/v1/devices/tl:cpu1/fault", {"reason": long})
    dev = _device(admin, "tl:cpu1")
    assert dev["state"] == "unhealthy" and dev["quarantine_reason"] == "fault"
    assert dev["quarantine_detail"] == long[: LIMIT - 1] + "…"
    # a detail within the limit is kept whole
    worker.post("/v1/devices/tl:cpu0/fault", {"reason": "fan " * 10})
    assert _device(admin, "tl:cpu0")["quarantine_detail"] == "fan " * 10
