"""Worker protocol 2 end to end: a real controller and a real worker from
the zipapp. A busy worker running short jobs gets each next job in the reply
to the report of the one before (rc.worker.reporter), and a short job's
start and end travel in one reports request."""

from __future__ import annotations

from tests.helpers.wait import wait_until

JOBS = 12


def worker_requests(client) -> float:
    """rc_http_requests_total{side="worker"} of the controller now."""
    for line in client.request("GET", "/metrics").body.decode().splitlines():
        if line.startswith('rc_http_requests_total{side="worker"}'):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError("no rc_http_requests_total for the worker side")


def test_short_jobs_queued_on_one_device_each_start_once_in_about_one_request_each(
    controller, make_worker, tmp_path
):
    make_worker(controller, host="box", devices="cpu:1")
    c = controller.client()
    seen = tmp_path / "started"

    def submit(command: list[str]) -> int:
        return c.post("/v1/jobs", {"command": command, "selector": "*"})["job"]["id"]

    blocker = submit(["sleep", "1"])
    wait_until(lambda: c.get(f"/v1/jobs/{blocker}")["job"]["state"] == "running", 20)
    before = worker_requests(c)
    ids = [submit(["sh", "-c", f'echo "$RC_JOB_ID" >> {seen}']) for _ in range(JOBS)]

    def all_ended() -> bool:
        return all(c.get(f"/v1/jobs/{i}")["job"]["state"] == "succeeded" for i in ids)

    wait_until(all_ended, 60, interval=0.2)
    used = worker_requests(c) - before
    started = seen.read_text().split()
    assert sorted(map(int, started)) == ids, "a job started twice, or never"
    # Before: each job took a long poll answer and its reports (at least 2).
    # Now its start came in the reply to the previous job's report, whose
    # running and terminal reports went as one (a heartbeat may fall inside).
    assert used <= 1.5 * JOBS + 2, f"{used:.0f} worker requests for {JOBS} jobs"
