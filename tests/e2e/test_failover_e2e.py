"""Clients and workers given a list of controller URLs, with real processes:
a dead first URL is passed over at once, and a controller killed with
SIGKILL and started again on another port over the same SQLite data (what
a failover to another controller looks like from the outside) is followed
by the worker, an attached `rc run` and `rc logs -f`, with no line lost or
shown twice and no job run twice."""

from __future__ import annotations

import socket
import subprocess
import time

import pytest

from rc.proto.client import Client
from tests.helpers.harness import Cli, Controller, Worker, job
from tests.helpers.wait import wait_until

FLAGS = ["--heartbeat-interval", "1s", "--sweep-interval", "0.5s", "--startup-grace", "20s"]


def closed_port() -> int:
    """A loopback port nothing listens on (bound, read back, closed)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def registrations(w: Worker, host: str) -> int:
    return w.log().count(f"registered {host} ")


def test_a_dead_first_url_is_passed_over_by_the_cli_and_the_worker(tmp_path, env, pyz):
    ctl = Controller(tmp_path / "data", env, FLAGS).start()
    urls = f"http://127.0.0.1:{closed_port()},{ctl.url}"
    w = Worker(urls, ctl.token("w", "worker"), tmp_path / "w", env, host="listed", pyz=pyz)
    try:
        t0 = time.monotonic()
        w.start()
        wait_until(lambda: registrations(w, "listed"), 15, "the worker to register")
        cli = Cli(urls, ctl.token("alice"), env, tmp_path)
        res = cli.run("run", "--", "sh", "-c", "echo hello; exit 4", timeout=30)
        assert (res.returncode, res.stdout) == (4, b"hello\n"), res.stderr
        assert b"answers yet" not in res.stderr  # a round that found one says nothing
        assert time.monotonic() - t0 < 15
    finally:
        w.stop()
        ctl.stop()


def test_a_controller_moving_to_another_port_is_followed_without_gaps(tmp_path, env, pyz):
    data = tmp_path / "data"
    ctl = Controller(data, env, FLAGS).start()
    spare = closed_port()  # where the "other controller" comes up
    urls = f"{ctl.url},http://127.0.0.1:{spare}"
    runs, half, go = tmp_path / "runs", tmp_path / "half", tmp_path / "go"
    script = (
        f"echo run >> {runs}; for i in $(seq 1 10); do echo line-$i; done; touch {half}; "
        f"while [ ! -e {go} ]; do sleep 0.05; done; "
        "for i in $(seq 11 20); do echo line-$i; sleep 0.02; done; exit 3"
    )
    expected = b"".join(b"line-%d\n" % i for i in range(1, 21))
    w = Worker(urls, ctl.token("w", "worker"), tmp_path / "w", env, host="mover", pyz=pyz)
    try:
        w.start()
        wait_until(lambda: registrations(w, "mover"), 30, "the worker to register")
        cli = Cli(urls, ctl.token("alice"), env, tmp_path)
        run = cli.popen("run", "--", "sh", "-c", script)
        wait_until(half.exists, 30, "the job to print its first half")
        admin = Client(urls, ctl.admin_token, timeout=30)
        job_id = next(j["id"] for j in admin.get("/v1/state")["jobs"])
        logs = cli.popen("logs", "-f", str(job_id))
        wait_until(
            lambda: (
                b"line-10"
                in admin.request("GET", f"/v1/jobs/{job_id}/logs", params={"follow": "0"}).body
            ),
            30,
            "the first half to reach the controller",
        )
        ctl.kill9()
        ctl = Controller(data, env, FLAGS, listen=f"127.0.0.1:{spare}").start()
        go.touch()
        out, err = run.communicate(timeout=90)
        assert run.returncode == 3, err.decode(errors="replace")
        assert out == expected
        assert b"Traceback" not in err
        lout, lerr = logs.communicate(timeout=60)
        assert lout == expected, lerr.decode(errors="replace")
        assert logs.returncode == 3, lerr.decode(errors="replace")
        c = Client(ctl.url, ctl.admin_token)
        assert job(c, job_id)["state"] == "failed"
        assert runs.read_text() == "run\n"  # ran once
        # the idle worker registers with the controller it moved to
        wait_until(lambda: registrations(w, "mover") >= 2, 30, "the worker to register again")
        assert "the controller restarted" in w.log()
        res = cli.run("run", "--", "echo", "after", timeout=30)
        assert (res.returncode, res.stdout) == (0, b"after\n"), res.stderr
    finally:
        w.stop()
        ctl.stop()


@pytest.mark.parametrize("moved", [False, True], ids=["gone", "moved"])
def test_an_exec_cut_by_the_controller_going_away_says_why(tmp_path, env, pyz, moved):
    """The relay is the controller: when it dies mid-session, rc exec ends
    with one line saying so and that the hold lives on (no traceback). Found
    by a new user: with a list of URLs, the client moved on to the other
    controller, which knows no session of the old one, and rc exec said
    "not_found: no session 1 in hold 12" instead."""
    data = tmp_path / "data"
    ctl = Controller(data, env, FLAGS).start()
    spare = closed_port()
    urls = f"{ctl.url},http://127.0.0.1:{spare}" if moved else ctl.url
    w = Worker(ctl.url, ctl.token("w", "worker"), tmp_path / "w", env, host="cut", pyz=pyz)
    started = tmp_path / "started"
    try:
        w.start()
        wait_until(lambda: registrations(w, "cut"), 30, "the worker to register")
        cli = Cli(urls, ctl.token("alice"), env, tmp_path)
        res = cli.run(
            "hold", "-d", "cut:cpu0", "--ttl", "10m", "--reason", "t", "--detach", check=True
        )
        held = int(res.stdout)
        proc = cli.popen(
            "exec",
            str(held),
            "--",
            "sh",
            "-c",
            f"touch {started}; sleep 300",
            stdin=subprocess.DEVNULL,
        )
        wait_until(started.exists, 30, "the session to start")
        ctl.kill9()
        if moved:  # another controller answers at the list's second URL
            ctl = Controller(data, env, FLAGS, listen=f"127.0.0.1:{spare}").start()
        _out, err = proc.communicate(timeout=60)
        assert proc.returncode == 1
        why = "another one answers now: a restart or a failover" if moved else "connection lost"
        assert err.decode().endswith(
            f"rc: the controller went away ({why}): session 1 of hold {held} "
            f"ended; the hold keeps running (rc exec {held} -- ... starts another)\n"
        ), err
        assert b"Traceback" not in err
    finally:
        w.kill9()  # its reports could only wait for the dead controller
        w.kill_jobs_left()  # the hold's process, which no restarted worker ends
        ctl.stop()
