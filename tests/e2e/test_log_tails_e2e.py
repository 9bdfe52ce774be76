"""Log tails end to end (README "Operating a worker"): a real controller and
a real worker from the zipapp. A job that prints a line and ends sends its
output with its reports, no log upload; a long output still streams through
the uploader, in order; either way `rc logs` shows all of a finished job's
output, once, as soon as its end is recorded."""

from __future__ import annotations

import sys

from tests.helpers.wait import wait_until


def counter(client, name: str) -> float:
    """A counter of the controller's /metrics now."""
    for line in client.request("GET", "/metrics").body.decode().splitlines():
        if line.startswith(f"{name} "):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no {name} in /metrics")


def run_all(c, commands: list[list[str]]) -> list[int]:
    """Submit each command, wait for every job's success; their ids."""
    ids = [c.post("/v1/jobs", {"command": cmd, "selector": "*"})["job"]["id"] for cmd in commands]

    def ended() -> bool:
        return all(c.get(f"/v1/jobs/{i}")["job"]["state"] == "succeeded" for i in ids)

    wait_until(ended, 60, "the jobs to succeed", interval=0.1)
    return ids


def test_a_job_that_prints_a_line_and_ends_needs_no_log_upload(controller, make_worker, admin_cli):
    make_worker(controller, host="box", devices="cpu:2")
    c = controller.client()
    uploads, tails = counter(c, "rc_log_uploads_total"), counter(c, "rc_log_tails_total")
    ids = run_all(c, [["sh", "-c", f"echo line-{i}"] for i in range(5)])
    for i, job_id in enumerate(ids):
        # read at once: the end was recorded after the output was stored
        res = admin_cli.run("logs", str(job_id))
        assert res.returncode == 0, res.stderr
        assert res.stdout == f"line-{i}\n".encode()
    assert counter(c, "rc_log_uploads_total") == uploads, "a short job's output was uploaded"
    assert counter(c, "rc_log_tails_total") >= tails + len(ids)


def test_a_long_output_streams_through_the_uploader_in_order(controller, make_worker, admin_cli):
    make_worker(controller, host="box", devices="cpu:1")
    c = controller.client()
    uploads = counter(c, "rc_log_uploads_total")
    script = "import sys\nfor i in range(3000): sys.stdout.write('%06d %s\\n' % (i, 'y' * 90))"
    [job_id] = run_all(c, [[sys.executable, "-c", script]])
    res = admin_cli.run("logs", str(job_id))
    assert res.returncode == 0, res.stderr
    assert res.stdout == b"".join(b"%06d %s\n" % (i, b"y" * 90) for i in range(3000))
    assert counter(c, "rc_log_uploads_total") > uploads  # 294 KB: over the tails' 64 KiB


def test_a_jobs_first_output_travels_with_its_start(controller, make_worker, admin_cli):
    """Printed within the reports' linger, the first line goes with the
    running report; the last with the terminal one: no upload at all,
    though the job outlives the uploader's 1 s batch."""
    make_worker(controller, host="box", devices="cpu:1")
    c = controller.client()
    uploads = counter(c, "rc_log_uploads_total")
    job_id = c.post(
        "/v1/jobs", {"command": ["sh", "-c", "echo start; sleep 2; echo end"], "selector": "*"}
    )["job"]["id"]

    def started_with_output() -> bool:
        res = admin_cli.run("logs", str(job_id))
        return res.stdout == b"start\n" and c.get(f"/v1/jobs/{job_id}")["job"]["state"] == "running"

    wait_until(started_with_output, 20, "the first line while the job runs", interval=0.2)
    wait_until(lambda: c.get(f"/v1/jobs/{job_id}")["job"]["state"] == "succeeded", 30)
    assert admin_cli.run("logs", str(job_id)).stdout == b"start\nend\n"
    assert counter(c, "rc_log_uploads_total") == uploads
