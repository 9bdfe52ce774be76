"""A worker stopping cleanly hands back what it never started: an assigned
job goes back to the queue only when it provably never started, and one
that may have run is lost (docs/design.md#job-states). On the real store
with a fake clock: rc.controller.store.workers.leave and the registration
after it."""

from __future__ import annotations

import subprocess
import time

from rc.proto.relay import Download, FrameDecoder, Upload
from tests.helpers.harness import Cli, stop_process
from tests.helpers.leave import Tap
from tests.helpers.wait import wait_until

# -- rc hold, waiting on a hold that goes back to the queue -----------------------


def test_rc_hold_waits_on_when_its_hold_goes_back_to_the_queue(controller, env, tmp_path):
    """The hold was assigned (rc hold waits for its sleeper to start) when its
    worker stopped and handed it back: rc hold goes on waiting in the queue
    instead of saying the hold ended, and the hold is granted later."""
    host, port = controller.url.rsplit("//", 1)[1].rsplit(":", 1)
    tap = Tap((host, int(port)))
    admin = controller.client()
    worker = controller.client(controller.token("w-hand", "worker"))

    def register(instance: str) -> None:
        body = {"host": "hand", "devices": [{"name": "cpu0"}], "instance": instance}
        body["allow_root_jobs"] = True  # a root worker: the admin's jobs run as root
        worker.post("/v1/workers/register", body)

    register("one")
    first = admin.post("/v1/jobs", {"command": ["true"], "device_id": "hand:cpu0"})["job"]["id"]
    alice = Cli(f"http://127.0.0.1:{tap.port}", controller.token("alice"), env, tmp_path)
    proc = alice.popen("hold", "-d", "hand:cpu0", "--ttl", "10m", "--reason", "r")
    try:
        wait_until(lambda: b"state=queued" in tap.seen, 30, "rc hold to wait in the queue")
        [hold] = [j["id"] for j in admin.get("/v1/state")["queued"]]
        report = {"job_id": first, "state": "succeeded", "exit_code": 0}
        worker.post("/v1/workers/hand/reports", {"reports": [report]})
        wait_until(lambda: b"state=assigned" in tap.seen, 30, "rc hold to wait for the sleeper")
        mark = len(tap.seen)
        got = worker.post("/v1/workers/hand/leave", {"instance": "one"})
        assert got["requeued_job_ids"] == [hold]
        wait_until(
            lambda: proc.poll() is not None or b"state=queued" in tap.seen[mark:],
            30,
            "rc hold to notice",
        )
        assert proc.poll() is None, proc.communicate(timeout=10)
        register("two")  # the worker is back: the hold is assigned again, and starts
        report = {"job_id": hold, "state": "running", "started_at": time.time()}
        worker.post("/v1/workers/hand/reports", {"reports": [report]})
        line = proc.stdout.readline().decode()
        assert line.startswith(f"hold {hold} granted on hand:cpu0 until "), line
        admin.post(f"/v1/jobs/{hold}/kill", {"reason": "done"})
        report = {"job_id": hold, "state": "killed", "exit_code": None}
        worker.post("/v1/workers/hand/reports", {"reports": [report]})
        _, err = proc.communicate(timeout=30)
        assert proc.returncode == 0, err
    finally:
        stop_process(proc)
        for stream in (proc.stdout, proc.stderr):
            stream.close()
        tap.close()


def test_rc_run_says_its_job_went_back_to_the_queue_and_names_where_it_runs(
    controller, env, tmp_path
):
    """Found by a new user: a job assigned to vm:cpu1, handed back unstarted
    by `rc down`, then run on vm:cpu0 after `rc up -d`: rc run had said
    `job 161 on vm:cpu1`, and nothing more. It says the job went back to the
    queue, and names the device it starts on."""
    host, port = controller.url.rsplit("//", 1)[1].rsplit(":", 1)
    tap = Tap((host, int(port)))
    admin = controller.client()
    worker = controller.client(controller.token("w-back", "worker"))

    def register(instance: str, names: tuple[str, ...]) -> None:
        devices = [{"name": n} for n in names]
        worker.post(
            "/v1/workers/register",
            {"host": "back", "devices": devices, "instance": instance, "allow_root_jobs": True},
        )

    def report(job_id: int, state: str, **more) -> None:
        worker.post(
            "/v1/workers/back/reports", {"reports": [{"job_id": job_id, "state": state, **more}]}
        )

    def state_of(job_id: int) -> tuple[str, str]:
        j = admin.get(f"/v1/jobs/{job_id}")["job"]
        return j["state"], j["device_id"]

    register("one", ("cpu0", "cpu1"))
    a, b = (
        admin.post("/v1/jobs", {"command": ["true"], "device_id": f"back:cpu{n}"})["job"]["id"]
        for n in (0, 1)
    )
    alice = Cli(f"http://127.0.0.1:{tap.port}", controller.token("alice"), env, tmp_path)
    proc = alice.popen("run", "-s", "host=back", "--", "true", stdin=subprocess.DEVNULL)
    try:
        wait_until(lambda: b"state=queued" in tap.seen, 30, "rc run to wait in the queue")
        [run] = [j["id"] for j in admin.get("/v1/state")["queued"]]
        report(b, "succeeded", exit_code=0)  # cpu1 frees: rc run's job is assigned there
        wait_until(lambda: state_of(run) == ("assigned", "back:cpu1"), 30, "the job on cpu1")
        wait_until(
            lambda: b"state=assigned" in tap.seen or b"/logs" in tap.seen,
            30,
            "rc run to see its job assigned",
        )
        report(a, "succeeded", exit_code=0)
        mark = len(tap.seen)
        got = worker.post("/v1/workers/back/leave", {"instance": "one"})
        assert got["requeued_job_ids"] == [run]
        wait_until(
            lambda: proc.poll() is not None or b"state=queued" in tap.seen[mark:],
            30,
            "rc run to wait in the queue again",
        )
        register("two", ("cpu0",))  # the worker is back: the job goes to cpu0 now
        wait_until(lambda: state_of(run) == ("assigned", "back:cpu0"), 30, "the job on cpu0")
        report(run, "running", started_at=time.time())
        report(run, "succeeded", exit_code=0, started_at=time.time())
        _, err = proc.communicate(timeout=30)
        assert proc.returncode == 0, err
    finally:
        stop_process(proc)
        for stream in (proc.stdout, proc.stderr):
            stream.close()
        tap.close()
    text = err.decode()
    assert (
        f"rc: job {run} went back to the queue: the worker of back:cpu1 stopped "
        "before starting it\n"
    ) in text, text
    assert f"rc: job {run} on back:cpu0\n" in text and "on back:cpu1" not in text, text


def test_rc_run_tty_attaches_again_when_its_job_goes_back_to_the_queue(controller, env, tmp_path):
    """`rc run --tty` attaches as soon as its job is assigned (its window
    size must reach the worker before the command starts). When that worker
    hands the job back unstarted, rc drops those halves and attaches again
    once the job is assigned anew; the relay gives it a fresh session (the
    old one ended before any worker came), and the size comes first there."""
    host, port = controller.url.rsplit("//", 1)[1].rsplit(":", 1)
    tap = Tap((host, int(port)))
    admin = controller.client()
    worker = controller.client(controller.token("w-tty", "worker"))

    def register(instance: str, names: tuple[str, ...]) -> None:
        devices = [{"name": n} for n in names]
        worker.post(
            "/v1/workers/register",
            {"host": "tt", "devices": devices, "instance": instance, "allow_root_jobs": True},
        )

    def report(job_id: int, state: str, **more) -> None:
        worker.post(
            "/v1/workers/tt/reports", {"reports": [{"job_id": job_id, "state": state, **more}]}
        )

    register("one", ("cpu0", "cpu1"))
    a, b = (
        admin.post("/v1/jobs", {"command": ["true"], "device_id": f"tt:cpu{n}"})["job"]["id"]
        for n in (0, 1)
    )
    alice = Cli(f"http://127.0.0.1:{tap.port}", controller.token("alice"), env, tmp_path)
    proc = alice.popen("run", "--tty", "-s", "host=tt", "--", "true", stdin=subprocess.DEVNULL)
    try:
        wait_until(lambda: b"state=queued" in tap.seen, 30, "rc run to wait in the queue")
        [run] = [j["id"] for j in admin.get("/v1/state")["queued"]]
        attach = f"/v1/jobs/{run}/tty/in".encode()
        report(b, "succeeded", exit_code=0)  # cpu1 frees: the job is assigned there
        wait_until(lambda: attach in tap.seen, 30, "rc run to attach to its assigned job")
        report(a, "succeeded", exit_code=0)
        mark = len(tap.seen)
        assert worker.post("/v1/workers/tt/leave", {"instance": "one"})["requeued_job_ids"] == [run]
        register("two", ("cpu0",))  # back: the job goes to cpu0
        wait_until(lambda: attach in tap.seen[mark:], 30, "rc run to attach again")
        base = f"/v1/jobs/{run}"
        out = Upload(worker, base + "/tty/out")
        inp = Download(worker, base + "/tty/in")
        frames: list[tuple] = []
        decoder = FrameDecoder()
        wait_until(lambda: frames.extend(decoder.feed(inp.read())) or frames, 30, "the first frame")
        assert frames[0] == ("r", 24, 80), frames  # no terminal here: the default size
        report(run, "running", started_at=time.time())
        out.send(b"far-side\r\n")
        out.finish()
        report(run, "succeeded", exit_code=0, started_at=time.time())
        stdout, err = proc.communicate(timeout=30)
        inp.close()
        out.close()
        assert proc.returncode == 0, err
        assert b"far-side" in stdout, (stdout, err)
    finally:
        stop_process(proc)
        for stream in (proc.stdout, proc.stderr):
            stream.close()
        tap.close()
