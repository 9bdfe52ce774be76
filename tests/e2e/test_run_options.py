"""What a newcomer hit in `rc run` / `rc hold` and their options: repeated
-s, a hold on any device, -e NAME and --env-file,
Ctrl-C and SIGTERM on a running job, --kill-on-detach, stdin that is not
passed on. The e2e tests run a real controller and a worker from the zipapp
(devices box:cpu0 model=h100 vram=81920M, box:cpu1 model=a100 vram=40G)."""

from __future__ import annotations

import re
import signal
import subprocess

import pytest

from rc.proto.errors import ApiError
from tests.helpers.fleet_users import admin, alice, bob, read_line, start_fleet  # noqa: F401  (fixtures)
from tests.helpers.harness import PY, Cli, job, stop_process
from tests.helpers.run_options import (
    LOOP,
    _running,
    fleet,  # noqa: F401 (fixtures)
)
from tests.helpers.wait import wait_until

# -- repeated -s ---------------------------------------------------------------------


def test_every_selector_verb_ands_its_s_flags(alice, admin):
    res = alice.run("run", "-s", "model=a100", "-s", "vram>=80G", "--", "true")
    assert res.returncode == 1 and b"no_matching_device" in res.stderr, res.stderr
    res = alice.run(
        "run", "-s", "model=h100", "-s", "vram>=80G", "--", "sh", "-c", "echo $RC_DEVICE"
    )
    assert (res.returncode, res.stdout) == (0, b"box:cpu0\n"), res.stderr
    res = alice.run(
        "hold", "-s", "model=a100", "-s", "vram>=80G", "--ttl", "1m", "--reason", "r", "--detach"
    )
    assert res.returncode == 1 and b"no_matching_device" in res.stderr, res.stderr
    res = alice.run("devices", "-s", "model=a100", "-s", "vram>=40G")
    assert res.returncode == 0, res.stderr
    assert b"box:cpu1" in res.stdout and b"box:cpu0" not in res.stdout, res.stdout
    res = alice.run("devices", "-s", "model=a100", "-s", "")
    assert res.returncode == 2 and b"-s needs a selector" in res.stderr, res.stderr
    res = alice.run("explain", "-s", "model=h100", "-s", "vram<80G")
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith(b"selector: model=h100,vram<80G\nno device matches it")


# -- rc hold on any device -------------------------------------------------------------


def test_hold_without_a_target_takes_any_device(alice, admin):
    """Report 17: `rc hold` without -d/-s was a usage error; `rc run` takes any device."""
    res = alice.run("hold", "--ttl", "1m", "--reason", "a quick look", "--detach")
    assert res.returncode == 0, res.stderr
    h = job(admin, int(res.stdout))
    assert (h["kind"], h["selector"], h["state"]) == ("hold", "*", "running")
    assert h["device_id"] in ("box:cpu0", "box:cpu1")


# -- the environment -----------------------------------------------------------------


def test_the_job_gets_e_and_env_file_variables(alice, admin, tmp_path):
    envfile = tmp_path / "job.env"
    envfile.write_text("# for the job\nFROM_FILE=file value\nBOTH=file\n")
    cli = Cli(alice.env["RC_CONTROLLER"], alice.env["RC_TOKEN"], alice.env, alice.cwd)
    cli.env["LOCAL_ONLY"] = "local value"
    res = cli.run(
        "run",
        "--env-file",
        str(envfile),
        "-e",
        "LOCAL_ONLY",
        "-e",
        "BOTH=flag",
        "--",
        "sh",
        "-c",
        'printf "%s|%s|%s\\n" "$FROM_FILE" "$LOCAL_ONLY" "$BOTH"',
    )
    assert (res.returncode, res.stdout) == (0, b"file value|local value|flag\n"), res.stderr
    res = cli.run("run", "--env-file", str(tmp_path / "missing.env"), "--", "true")
    assert res.returncode == 2 and b"missing.env: cannot read it" in res.stderr
    assert res.stderr.count(b"\n") == 1, res.stderr


@pytest.mark.parametrize("name", ["A B", "X\nY", "1ST", "É"])
def test_the_controller_refuses_a_bad_variable_name(fleet, alice, admin, name):
    """Names with spaces or newlines were accepted at submit (and in a session)."""
    c = fleet[0].client(alice.env["RC_TOKEN"])
    with pytest.raises(ApiError) as e:
        c.post("/v1/jobs", {"command": ["true"], "selector": "*", "env": {name: "v"}})
    assert (e.value.status, e.value.code) == (400, "bad_request")
    assert f"environment variable name {name!r} is not valid" in e.value.message
    hold = c.post(
        "/v1/jobs",
        {"kind": "hold", "selector": "*", "max_runtime_seconds": 60, "reason": "env check"},
    )["job"]["id"]
    try:
        wait_until(lambda: job(c, hold)["state"] == "running", 20, "the hold to be granted")
        with pytest.raises(ApiError) as e:
            c.post(
                f"/v1/jobs/{hold}/sessions",
                {"stdio": "pipe", "command": ["true"], "env": {name: "v"}},
            )
        assert (e.value.status, e.value.code) == (400, "bad_request")
        assert f"environment variable name {name!r}" in e.value.message
    finally:
        c.post(f"/v1/jobs/{hold}/kill", {"reason": "test done"})
        wait_until(lambda: job(c, hold)["state"] == "killed", 20, "the hold to end")
        c.close_all()


def test_a_piped_stdin_is_said_to_be_not_passed_on(alice, admin):
    res = alice.run("run", "--", "sh", "-c", "cat; echo done", input=b"lost data\n")
    assert (res.returncode, res.stdout) == (0, b"done\n"), res.stderr
    assert b"stdin is empty (/dev/null): rc run does not pass its stdin on" in res.stderr
    assert b"rc exec HOLD -- CMD inside a hold" in res.stderr
    quiet = subprocess.run(
        [PY, "-m", "rc", "run", "--", "true"],
        env=alice.env,
        cwd=alice.cwd,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert quiet.returncode == 0 and b"stdin" not in quiet.stderr, quiet.stderr


# -- Ctrl-C, SIGTERM, SIGHUP on a running job ----------------------------------------------


def test_a_first_ctrl_c_detaches_and_says_a_second_one_kills(alice, admin):
    """Report 5: Ctrl-C only ever detached."""
    proc, job_id = _running(alice)
    try:
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
        assert proc.returncode == 130, err
        assert (
            f"rc: detached from job {job_id}; press Ctrl-C again within 2 s to kill job {job_id}\n"
            f"rc: detached; job {job_id} is still running"
        ).encode() in err, err
        assert job(admin, job_id)["state"] == "running"
    finally:
        stop_process(proc)


def test_a_second_ctrl_c_within_2s_kills_the_job(alice, admin):
    proc, job_id = _running(alice)
    try:
        proc.send_signal(signal.SIGINT)
        line = read_line(proc, 10, "the detach line", "stderr")
        assert line.startswith(f"rc: detached from job {job_id}; press Ctrl-C again"), line
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
        assert proc.returncode == 130, err
        assert f"rc: Ctrl-C twice: killed job {job_id}\n".encode() in err, err
        j = job(admin, job_id)
        assert (j["state"], j["kill_reason"]) == (
            "killed",
            "killed by alice (token alice): rc run got Ctrl-C twice",
        )
    finally:
        stop_process(proc)


def test_sigterm_kills_the_running_job(alice, admin):
    """`timeout 60 rc run ...` left the job running: SIGTERM now kills it, as
    srun passes SIGTERM on to its tasks."""
    proc, job_id = _running(alice)
    try:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
        assert proc.returncode == 130, err
        assert f"rc: SIGTERM: killed job {job_id}\n".encode() in err, err
        j = job(admin, job_id)
        assert (j["state"], j["kill_reason"]) == (
            "killed",
            "killed by alice (token alice): rc run got SIGTERM",
        )
    finally:
        stop_process(proc)


def test_timeout_rc_run_bounds_the_job(alice, admin):
    res = subprocess.run(
        ["timeout", "4", PY, "-m", "rc", "run", *LOOP],
        env=alice.env,
        cwd=alice.cwd,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert res.returncode == 124, res.stderr
    job_id = int(re.search(rb"job (\d+)", res.stderr)[1])
    # killed if it had started by then, cancelled if not; rc waits at most 10 s
    # to see the end (a loaded machine may take longer), so wait for it here
    wait_until(lambda: job(admin, job_id)["state"] == "killed", 60, f"job {job_id} killed")


def test_sighup_detaches_and_the_job_goes_on(alice, admin):
    proc, job_id = _running(alice)
    try:
        proc.send_signal(signal.SIGHUP)
        _, err = proc.communicate(timeout=30)
        assert proc.returncode == 130, err
        assert f"rc: detached; job {job_id} is still running".encode() in err, err
        assert b"press Ctrl-C again" not in err
        assert job(admin, job_id)["state"] == "running"
    finally:
        stop_process(proc)


@pytest.mark.parametrize(
    "flags,env,sig,cause",
    [
        (["--kill-on-detach"], {}, signal.SIGINT, "Ctrl-C"),
        ([], {"RC_KILL_ON_DETACH": "1"}, signal.SIGHUP, "SIGHUP"),
        (["--kill-on-detach"], {}, signal.SIGHUP, "SIGHUP"),
    ],
)
def test_kill_on_detach_kills_at_the_first_interruption(alice, admin, flags, env, sig, cause):
    proc, job_id = _running(alice, *flags, env=env)
    try:
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=30)
        assert proc.returncode == 130, err
        assert f"rc: {cause}: killed job {job_id}\n".encode() in err, err
        assert b"press Ctrl-C again" not in err
        j = job(admin, job_id)
        assert (j["state"], j["kill_reason"]) == (
            "killed",
            f"killed by alice (token alice): rc run got {cause}",
        )
    finally:
        stop_process(proc)


def test_kill_on_detach_kills_when_the_output_closes(alice, admin):
    proc, job_id = _running(alice, "--kill-on-detach")
    try:
        proc.stdout.close()
        _, err = proc.communicate(timeout=30)
        assert proc.returncode == 141, err
        assert f"rc: output closed: killed job {job_id}\n".encode() in err, err
        j = job(admin, job_id)
        assert (j["state"], j["kill_reason"]) == (
            "killed",
            "killed by alice (token alice): rc run's output closed",
        )
    finally:
        stop_process(proc)


def test_kill_on_detach_usage_errors(alice):
    res = alice.run("run", "--detach", "--kill-on-detach", "--", "true")
    assert res.returncode == 2 and b"--detach and --kill-on-detach" in res.stderr
    cli = Cli(alice.env["RC_CONTROLLER"], alice.env["RC_TOKEN"], alice.env, alice.cwd)
    cli.env["RC_KILL_ON_DETACH"] = "maybe"
    res = cli.run("run", "--", "true")
    assert res.returncode == 2 and b"RC_KILL_ON_DETACH='maybe': use 1" in res.stderr


# -- a controller that cannot be reached -------------------------------------------


def test_run_says_at_once_that_it_cannot_reach_the_controller(env, tmp_path):
    """Found by a new user: `RC_CONTROLLER=http://127.0.0.1:1 rc run -- true`
    retried silently for about 30 s. It says so at once, and for how long."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = s.getsockname()[1]  # closed again: nobody listens there
    cli = Cli(f"http://127.0.0.1:{dead}", "rc_x", env, tmp_path)
    proc = cli.popen("run", "--", "true", stdin=subprocess.DEVNULL)
    try:
        line = read_line(proc, 10, "the first message", "stderr")
        assert line == (
            f"rc: cannot reach the controller (http://127.0.0.1:{dead}: connection refused "
            "(is the controller running?)); retrying for up to 30 s\n"
        )
        assert proc.poll() is None, "it goes on trying"
    finally:
        stop_process(proc)
        proc.stdout.close()
        proc.stderr.close()
