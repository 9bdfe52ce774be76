"""Tokens never appear in logs, events, error messages or the database, and
secret files are 0600 (README "Security model")."""

from __future__ import annotations

import json
import os
import pwd
import stat

from rc.proto.client import Client
from rc.proto.errors import ApiError
from tests.helpers.harness import Cli
from tests.helpers.wait import wait_until


def test_no_secret_leaks_after_a_busy_run(controller, make_worker, env, tmp_path):
    admin = controller.client()
    secrets = {controller.admin_token}
    user = controller.token("alice")
    other = controller.token("mallory")
    secrets |= {user, other}
    w = make_worker(controller, host="leaky", devices="cpu:1")
    secrets.add(w.token)
    alice = Cli(controller.url, user, env, tmp_path)
    assert (
        alice.run("run", "--", "sh", "-c", "echo hi; env | grep -c RC_TOKEN || true").returncode
        == 0
    )
    job_id = int(alice.run("run", "--detach", "--", "sleep", "30").stdout)
    mallory = Cli(controller.url, other, env, tmp_path)
    assert mallory.run("kill", str(job_id)).returncode == 1
    assert mallory.run("logs", str(job_id)).returncode == 1
    expiring = admin.post("/v1/tokens", {"name": "temp", "role": "user", "expires_in_seconds": 1})[
        "secret"
    ]
    secrets.add(expiring)
    admin.delete("/v1/tokens/mallory")
    messages = []
    for bad in (other, expiring + "x", "rc_" + "A" * 43, expiring):
        try:
            Client(controller.url, bad).get("/v1/devices")
        except ApiError as e:
            messages.append(e.message)
    assert len(messages) >= 3
    alice.run("kill", str(job_id))
    wait_until(lambda: admin.get(f"/v1/jobs/{job_id}")["job"]["state"] == "killed", 30, "the kill")
    events = admin.request("GET", "/v1/events", params={"limit": 1000}).body.decode()
    tokens_listing = admin.request("GET", "/v1/tokens").body.decode()
    w.stop()
    controller.stop()
    db_bytes = b"".join(
        (controller.data / name).read_bytes()
        for name in os.listdir(controller.data)
        if name.startswith("rc.db")
    )
    haystacks = {
        "controller log": controller.log(),
        "worker log": w.log(),
        "events": events,
        "token list": tokens_listing,
        "error messages": "\n".join(messages),
        "database": db_bytes.decode("latin-1"),
    }
    for secret in secrets:
        for where, text in haystacks.items():
            assert secret not in text, f"a token appears in the {where}"
    job_output = (controller.data / "logs").glob("*.log")
    assert all(b"rc_" not in p.read_bytes() for p in job_output)


def test_secret_files_are_private(controller, tmp_path, env):
    mode = stat.S_IMODE(os.stat(controller.data / "admin.token").st_mode)
    assert mode == 0o600
    res = Cli(controller.url, controller.admin_token, env, tmp_path).run(
        "token", "create", "bob", "--role", "user"
    )
    assert res.returncode == 0
    secret = res.stdout.decode().strip()
    assert secret.startswith("rc_") and len(res.stdout.splitlines()) == 1
    assert Client(controller.url, secret).get("/v1/whoami")["name"] == "bob"


def test_a_job_never_sees_the_worker_token(controller, make_worker, cli, env):
    token = controller.token("w-env", "worker")
    make_worker(
        controller,
        host="envcheck",
        devices="cpu:1",
        token=token,
        worker_env=dict(env, RC_TOKEN=token, RC_OTHER_SETTING="x"),
    )
    res = cli.run("run", "--", "sh", "-c", "env | grep '^RC_' | cut -d= -f1 | sort")
    names = res.stdout.decode().split()
    assert "RC_TOKEN" not in names and "RC_OTHER_SETTING" not in names
    assert token.encode() not in res.stdout
    assert {"RC_JOB_ID", "RC_DEVICE"} <= set(names)


def test_acting_as_someone_is_for_admins_and_leaves_both_names(
    controller, make_worker, env, tmp_path
):
    make_worker(controller, host="asbox", devices="cpu:1")
    alice = Cli(controller.url, controller.token("alice2"), env, tmp_path)
    res = alice.run("run", "--as", "carol", "--detach", "--", "true")
    assert res.returncode == 1 and b"forbidden" in res.stderr
    admin = Cli(controller.url, controller.admin_token, env, tmp_path)
    # a Unix user of the controller's host: theirs (their uid), run as them
    job_id = int(admin.run("run", "--as", "nobody", "--detach", "--", "true").stdout)
    c = controller.client()
    got = c.get(f"/v1/jobs/{job_id}")["job"]
    nobody = pwd.getpwnam("nobody").pw_uid
    assert (got["submitter"], got["unix_user"], got["owner"]) == (
        "nobody",
        "nobody",
        f"uid:{nobody}",
    )
    # a token: token:NAME
    as_token = int(admin.run("run", "--as", "token:alice2", "--detach", "--", "true").stdout)
    assert c.get(f"/v1/jobs/{as_token}")["job"]["submitter"] == "alice2 (token alice2)"
    res = admin.run("run", "--as", "carol", "--detach", "--", "true")  # nobody of that name
    assert res.returncode == 1 and b"give token:carol" in res.stderr, res.stderr
    events = c.get("/v1/events", params={"limit": 1000})["events"]
    [ev, ev2] = [e for e in events if e["kind"] == "submitted_as"]
    assert (ev["actor"], ev["job_id"]) == ("root (token admin)", job_id)
    assert f"as nobody (uid:{nobody})" in ev["text"]
    assert "as alice2 (token alice2) (token:" in ev2["text"]


def test_another_user_never_sees_a_jobs_environment_values(controller, make_worker, env, tmp_path):
    """Found by a new user: `rc jobs -o json` showed everyone's secrets."""
    make_worker(controller, host="envbox", devices="cpu:1")
    alice = Cli(controller.url, controller.token("alice3"), env, tmp_path)
    bob = Client(controller.url, controller.token("bob3"))
    res = alice.run(
        "run", "--detach", "--export", "NONE", "-e", "AWS_SECRET_ACCESS_KEY=abc123secret", "--",
        "sleep", "30",
    )  # fmt: skip
    job_id = int(res.stdout)
    seen = [
        bob.request("GET", "/v1/jobs").body,
        bob.request("GET", f"/v1/jobs/{job_id}").body,
        bob.request("GET", "/v1/state").body,
        bob.request("GET", "/v1/devices/envbox:cpu0/describe").body,
    ]
    for body in seen:
        assert b"abc123secret" not in body
    assert bob.get(f"/v1/jobs/{job_id}")["job"]["env"] == {"AWS_SECRET_ACCESS_KEY": "(hidden)"}
    mine = json.loads(alice.run("jobs", "-o", "json").stdout)
    assert mine[0]["env"]["AWS_SECRET_ACCESS_KEY"] == "abc123secret"
    assert controller.client().get(f"/v1/jobs/{job_id}")["job"]["env"] == {
        "AWS_SECRET_ACCESS_KEY": "abc123secret"
    }
    alice.run("kill", str(job_id))
    bob.close_all()


def test_the_database_and_a_new_data_dir_are_private(controller, tmp_path):
    assert stat.S_IMODE(os.stat(controller.data / "rc.db").st_mode) == 0o600
    from tests.helpers.inprocess import Lab

    lab = Lab(tmp_path / "fresh" / "data")  # rc creates the directory itself
    try:
        assert stat.S_IMODE(os.stat(tmp_path / "fresh" / "data").st_mode) == 0o700
    finally:
        lab.close()


def test_a_revoked_token_stops_its_open_log_stream(controller, make_worker, env, tmp_path):
    """Found by a fresh user: a follow kept streaming after its token was revoked."""
    make_worker(controller, host="revbox", devices="cpu:1")
    token = controller.token("carl")
    c = Client(controller.url, token)
    j = c.post(
        "/v1/jobs",
        {"command": ["sh", "-c", "while :; do echo tick; sleep 0.2; done"], "selector": "*"},
    )["job"]
    got = []
    stream = c.stream("GET", f"/v1/jobs/{j['id']}/logs", params={"follow": "1"}, timeout=30)
    got.append(next(stream))
    controller.client().delete("/v1/tokens/carl")
    got.extend(stream)  # must end by itself, not run for ever
    assert b"tick" in b"".join(got)
    controller.client().post(f"/v1/jobs/{j['id']}/kill", {})
