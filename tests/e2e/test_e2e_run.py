"""End to end through the CLI: real `rc serve`, a real worker from the zipapp
under `python3 -I`, real `rc` invocations."""

from __future__ import annotations

import json
import os
import re
import uuid

import pytest

from rc.proto.client import Client
from rc.proto.errors import ApiError
from tests.helpers.harness import Cli, job, pid_alive
from tests.helpers.wait import wait_until


@pytest.fixture
def fleet(controller, make_worker, tmp_path):
    config = tmp_path / "worker.toml"
    config.write_text('kill_grace = "1s"\n')  # children that ignore SIGTERM die sooner
    return make_worker(controller, host="box", devices="cpu:2", config=config)


def test_output_and_exit_code_come_back(fleet, cli):
    res = cli.run("run", "--", "sh", "-c", "echo to-out; echo to-err >&2; exit 7")
    assert res.returncode == 7
    assert b"to-out\n" in res.stdout and b"to-err\n" in res.stdout
    assert b"job " in res.stderr and b"exited with code 7" in res.stderr


def test_hello_from_device(fleet, cli):
    res = cli.run(
        "run", "--", "python3", "-c", 'import os; print("hello from", os.environ["RC_DEVICE"])'
    )
    assert res.returncode == 0, res.stderr
    assert res.stdout in (b"hello from box:cpu0\n", b"hello from box:cpu1\n")


ODD_ARGS = [
    "a b",
    '"quoted"',
    "'single'",
    "$(echo no)",
    "",
    "new\nline",
    "tab\tx",
    "ünï",
    "--",
    "*",
    "\\",
]


def test_argv_reaches_the_process_exactly(fleet, cli):
    res = cli.run(
        "run", "--", "python3", "-c", "import json, sys; print(json.dumps(sys.argv[1:]))", *ODD_ARGS
    )
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout) == ODD_ARGS


def test_non_utf8_output_is_stored_byte_exact(fleet, cli, controller):
    payload = bytes(range(256)) * 3 + b"\xff\xfe\x00end"
    script = f"import sys; sys.stdout.buffer.write({payload!r})"
    res = cli.run("run", "--", "python3", "-c", script)
    assert res.returncode == 0, res.stderr
    assert res.stdout == payload
    job_id = int(res.stderr.split(b"job ")[1].split()[0])
    again = cli.run("logs", str(job_id))
    assert again.stdout == payload


def test_killed_job_leaves_no_process_of_its_group(fleet, cli, controller, tmp_path):
    pids = tmp_path / "pids"
    script = (
        f"for i in 1 2 3; do (trap '' TERM; sleep 300) & echo $! >> {pids}; done; "
        f"echo $$ >> {pids}; wait"
    )
    res = cli.run("run", "--detach", "--", "sh", "-c", script)
    job_id = int(res.stdout)
    wait_until(
        lambda: pids.exists() and len(pids.read_text().split()) >= 4,
        20,
        "the job to write its pids",
    )
    started = [int(p) for p in pids.read_text().split()]
    assert all(pid_alive(p) for p in started)
    assert cli.run("kill", str(job_id)).returncode == 0
    c = controller.client()
    wait_until(lambda: job(c, job_id)["state"] == "killed", 30, "the job to be killed")
    assert not [p for p in started if pid_alive(p)]
    # nothing else in that process group either
    pgid = started[-1]
    left = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat") as f:
                    stat = f.read().rpartition(")")[2].split()
            except OSError:
                continue
            if int(stat[2]) == pgid and stat[0] != "Z":
                left.append(int(name))
    assert left == []


def test_same_idempotency_key_returns_same_job(fleet, controller):
    c = controller.client(controller.token("bob"))
    body = {"command": ["true"], "selector": "*", "idempotency_key": uuid.uuid4().hex}
    first = c.post("/v1/jobs", body)["job"]
    second = c.post("/v1/jobs", body)["job"]
    assert first["id"] == second["id"]
    with pytest.raises(ApiError) as e:
        c.post("/v1/jobs", {**body, "command": ["false"]})
    assert e.value.status == 409 and e.value.code == "idempotency_conflict"


def test_user_cannot_kill_another_users_job(fleet, controller, env, tmp_path):
    alice = Cli(controller.url, controller.token("alice"), env, tmp_path)
    mallory = Cli(controller.url, controller.token("mallory"), env, tmp_path)
    job_id = int(alice.run("run", "--detach", "--", "sleep", "60").stdout)
    res = mallory.run("kill", str(job_id))
    assert res.returncode == 1
    assert b"not_job_owner" in res.stderr
    c = controller.client()
    assert job(c, job_id)["state"] in ("assigned", "running", "queued")
    assert alice.run("kill", str(job_id)).returncode == 0
    wait_until(lambda: job(c, job_id)["state"] == "killed", 30, "alice's kill")


def test_submitter_is_the_tokens_label_and_the_owner_its_principal(fleet, cli, controller):
    job_id = int(cli.run("run", "--detach", "--", "true").stdout)
    got = job(controller.client(), job_id)
    assert got["submitter"] == "alice (token alice)"  # its Unix user and its name
    me = Client(controller.url, cli.env["RC_TOKEN"]).get("/v1/whoami")
    assert got["owner"] == me["principal"] and me["principal"].startswith("token:")
    assert me["label"] == "alice (token alice)"


def test_bad_input_is_one_line_and_nonzero(fleet, cli):
    cases = [
        (("run", "-d", "box:nope", "--", "true"), b"unknown_device"),
        (("run", "-s", "kind=tpu", "--", "true"), b"no_matching_device"),
        (("run", "-s", "kind==x", "--", "true"), b"bad_selector"),
        (("logs", "999999"), b"not_found"),
        (("kill", "999999"), b"not_found"),
    ]
    for args, code in cases:
        res = cli.run(*args)
        assert res.returncode == 1, (args, res)
        assert code in res.stderr, (args, res.stderr)
        assert len(res.stderr.strip().splitlines()) == 1, res.stderr
        assert b"Traceback" not in res.stderr
    res = cli.run("run")
    assert res.returncode == 2 and b"give a command" in res.stderr
    res = cli.run("run", "--priority", "99", "--", "true")
    assert res.returncode == 2 and b"outside -10..10" in res.stderr


def test_detach_prints_only_the_job_id(fleet, cli):
    res = cli.run("run", "--detach", "--", "true")
    assert res.returncode == 0
    assert res.stdout.strip().isdigit()


def test_no_wait_leaves_nothing_queued(fleet, cli, controller):
    holders = [int(cli.run("run", "--detach", "--", "sleep", "60").stdout) for _ in range(2)]
    c = controller.client()
    wait_until(
        lambda: all(job(c, j)["state"] == "running" for j in holders), 30, "both devices to be busy"
    )
    res = cli.run("run", "--no-wait", "--", "true")
    assert res.returncode == 1 and b"no_device_available" in res.stderr
    assert c.get("/v1/state")["queued"] == []
    for j in holders:
        cli.run("kill", str(j))


def test_a_relative_cwd_is_the_one_rc_runs_in(fleet, cli, tmp_path):
    (tmp_path / "sub dir").mkdir()
    res = cli.run("run", "--cwd", "sub dir", "--", "pwd")
    assert (res.returncode, res.stdout) == (0, f"{tmp_path / 'sub dir'}\n".encode()), res.stderr
    res = cli.run("run", "--cwd", ".", "--", "pwd")
    assert res.stdout == f"{tmp_path}\n".encode()


def test_closed_output_leaves_the_job_running(fleet, cli, controller):
    """`rc run -- cmd | head -1`: rc says the job goes on and exits 141 (128 +
    SIGPIPE); the job is not killed for it, and nothing is a traceback."""
    proc = cli.popen("run", "--", "sh", "-c", "while :; do echo y; sleep 0.01; done")
    try:
        assert proc.stdout.readline() == b"y\n"
        proc.stdout.close()
        _, err = proc.communicate(timeout=30)
        assert proc.returncode == 141, err
        m = re.search(rb"output closed; job (\d+) is still running on box:cpu\d", err)
        assert m, err
        assert b"Traceback" not in err and b"Exception ignored" not in err
        job_id = int(m[1])
        assert job(controller.client(), job_id)["state"] == "running"
        controller.client().post(f"/v1/jobs/{job_id}/kill", {})
        wait_until(lambda: job(controller.client(), job_id)["state"] == "killed", 20, "the kill")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def test_jobs_start_with_default_signal_dispositions_under_nohup(controller, make_worker, cli):
    """A worker started under nohup ignores SIGHUP; its jobs must not inherit
    that (nor anything else ignored), or a job's own children outlive a hangup."""
    make_worker(controller, host="nohup", devices="cpu:1", launcher=["nohup"])
    res = cli.run(
        "run", "-d", "nohup:cpu0", "--", "grep", "-E", "^Sig(Ign|Blk)", "/proc/self/status"
    )
    assert res.returncode == 0, res.stderr
    assert res.stdout == b"SigBlk:\t0000000000000000\nSigIgn:\t0000000000000000\n"
