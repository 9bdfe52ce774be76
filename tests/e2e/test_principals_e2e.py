"""People are principals, not names (a lab trial; docs/design.md#identity-and-ownership).

A one-box started as root (`rc up -d`), and real Unix users on its socket
whose names equal those of its API tokens: `admin` (Debian cloud images ship
one; the admin token rc up makes is `admin`), `worker-HOST` (the worker token
rc up makes for HOST) and `rc-test-ci` (a token an admin made, mapped to
another Unix user). A name grants nothing: none of them can read the logs
of, kill, release, extend, exec or cp or forward into, rerun, see the
environment values of, or reuse the idempotency key of the same-named
token's jobs, nor act as its worker. Users with the names people have
(`john.doe`, `Erin`) use the box, and revoking a token leaves the queued
jobs of the local user of that name alone.
"""

from __future__ import annotations

import json
import pwd
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from rc.proto.client import Client
from rc.proto.errors import ApiError
from tests.helpers.harness import PY, RUNUSER, SYSTEM_PY, UserCli, base_env, ensure_unix_user, job
from tests.helpers.wait import wait_until

HOST = "pbox"
CI_TOKEN = "rc-test-ci"
"""A token an admin makes (its jobs run as BOB), and a Unix user of that name."""
ALICE, BOB = "rc-test-alice", "rc-test-bob"
NAMED_LIKE_TOKENS = ("admin", f"worker-{HOST}", CI_TOKEN)
PEOPLE = ("john.doe", "Erin")
"""Names useradd takes (LDAP/AD style) that rc refused before."""

PROBE = r"""
import json, socket, sys, urllib.error, urllib.request
path, calls = sys.argv[1], json.loads(sys.argv[2])
s = socket.socket(socket.AF_UNIX)
s.connect(path)
got = json.loads(s.makefile("rb").readline())
s.close()
if "error" in got:
    print(json.dumps({"refused": got["message"]}))
    sys.exit(0)
out = {}
for name, method, route, body in calls:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(
        got["url"] + route, data=data, method=method,
        headers={"Authorization": "Bearer " + got["token"], "Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            status, text = r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        status, text = e.code, e.read().decode()
    try:
        answer = json.loads(text)
    except ValueError:
        answer = text
    out[name] = [status, answer]
print(json.dumps(out))
"""
"""Run as a Unix user: take a token from the socket as the kernel names
that user, make each call (name, method, route, body) with it, print
{name: [status, answer]}."""


@dataclass
class Box:
    root: Path
    data: Path
    socket: str
    env: dict[str, str]
    admin: Client
    pyz: Path

    def user(self, name: str) -> UserCli:
        return UserCli(name, self.pyz, {"RC_SOCKET": self.socket})

    def probe(self, name: str, calls: list) -> dict:
        """PROBE as Unix user `name`."""
        res = subprocess.run(
            [
                RUNUSER,
                "-u",
                name,
                "--",
                SYSTEM_PY,
                "-I",
                "-c",
                PROBE,
                self.socket,
                json.dumps(calls),
            ],
            capture_output=True,
            timeout=120,
            check=False,
            cwd="/",
        )
        assert res.returncode == 0, res.stderr
        return json.loads(res.stdout)


@pytest.fixture(scope="module")
def box(unix_users, public_pyz, tmp_path_factory) -> Iterator[Box]:
    for name in (*NAMED_LIKE_TOKENS, *PEOPLE):
        ensure_unix_user(name)
    root = Path(tempfile.mkdtemp(prefix="rc-principals-", dir="/tmp"))
    root.chmod(0o755)
    env = base_env(tmp_path_factory.mktemp("root-home"))
    env["RC_SOCKET"] = str(root / "rc.sock")
    data = root / "data"
    res = subprocess.run(
        [PY, "-m", "rc", "up", "-d", "--data", str(data), "--listen", "127.0.0.1:0",
         "--devices", "2", "--host", HOST],
        env=env, cwd=root, capture_output=True, timeout=120, check=False,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    url = json.loads((data / "up.json").read_text())["url"]
    admin = Client(url, (data / "admin.token").read_text().strip())
    try:
        yield Box(root, data, env["RC_SOCKET"], env, admin, public_pyz)
    finally:
        subprocess.run(
            [PY, "-m", "rc", "down", "--data", str(data)],
            env=env, cwd=root, capture_output=True, timeout=120, check=False,
        )  # fmt: skip
        shutil.rmtree(root, ignore_errors=True)


def _ended(c: Client, job_id: int) -> dict:
    return wait_until(
        lambda: (j := job(c, job_id))["state"] in ("succeeded", "failed", "killed") and j,
        60,
        f"job {job_id} to end",
    )


def _running(c: Client, job_id: int) -> dict:
    return wait_until(
        lambda: (j := job(c, job_id))["state"] == "running" and j, 60, f"job {job_id} to run"
    )


def _attempts(hold: int, done: int, key: str, env: dict) -> list:
    """What a user tries on someone's hold `hold` and finished job `done`
    (submitted with idempotency key `key` and environment `env`)."""
    return [
        ("whoami", "GET", "/v1/whoami", None),
        ("logs", "GET", f"/v1/jobs/{done}/logs?follow=0", None),
        ("show", "GET", f"/v1/jobs/{done}", None),
        ("kill", "POST", f"/v1/jobs/{hold}/kill", {}),
        ("kill_many", "POST", "/v1/jobs/kill", {"ids": [hold]}),
        ("extend", "POST", f"/v1/jobs/{hold}/extend", {"seconds": 60}),
        ("exec", "POST", f"/v1/jobs/{hold}/sessions", {"stdio": "pipe", "command": ["id", "-u"]}),
        ("forward", "POST", f"/v1/jobs/{hold}/sessions", {"stdio": "pipe", "port": 22}),
        ("mine", "GET", "/v1/jobs?mine=1&limit=1000", None),
        (
            "key",
            "POST",
            "/v1/jobs",
            {"command": ["true"], "device_id": f"{HOST}:cpu1", "env": env, "idempotency_key": key},
        ),
    ]


def _nothing_granted(got: dict, name: str, hold: int, done: int) -> None:
    uid = pwd.getpwnam(name).pw_uid
    status, me = got["whoami"]
    assert (status, me["name"], me["label"], me["principal"]) == (200, name, name, f"uid:{uid}")
    for what in ("logs", "kill", "extend", "exec", "forward"):
        status, answer = got[what]
        assert (status, answer["error"]) == (403, "not_job_owner"), (name, what, answer)
    [outcome] = got["kill_many"][1]["results"]
    assert (outcome["ok"], outcome["code"]) == (False, "not_job_owner"), outcome
    status, shown = got["show"]
    assert status == 200 and shown["job"]["env"] == {"SECRET": "(hidden)"}, shown
    assert not {j["id"] for j in got["mine"][1]["jobs"]} & {hold, done}
    status, made = got["key"]  # the same key is another principal's submission
    assert status == 201 and made["job"]["id"] != done, made
    assert made["job"]["owner"] == f"uid:{uid}" and made["job"]["env"] == {"SECRET": "s3cret"}


def _cli_refuses(box: Box, name: str, hold: int, done: int) -> None:
    """The same, through the CLI: the issue's repro was `rc exec HOLD -- id`
    into the admin token's hold, printing uid=0(root)."""
    user = box.user(name)
    src = Path(user.home) / f"cp-{uuid.uuid4().hex[:6]}"
    src.write_text("x\n")
    for args, said in (
        (("exec", str(hold), "--", "id", "-u"), b"not_job_owner"),
        (("logs", str(done)), b"not_job_owner"),
        (("release", str(hold)), b"not_job_owner"),
        (("extend", str(hold), "1m"), b"not_job_owner"),
        (("rerun", str(done)), b"environment is hidden"),
        (("cp", "--hold", str(hold), str(src), f"{HOST}:cpu0:/tmp/"), b"not_job_owner"),
        (("forward", str(hold), "0:22"), b"only its owner or an admin may forward"),
    ):
        res = user.run(*args, timeout=60)
        assert res.returncode == 1, (name, args, res.stdout, res.stderr)
        assert said in res.stderr, (name, args, res.stderr)
        assert b"uid=0" not in res.stdout and res.stdout.strip() != b"0"
    src.unlink()


@pytest.mark.parametrize("name", ["admin", CI_TOKEN])
def test_a_local_user_named_like_a_token_gets_nothing_of_its_jobs(box, name):
    """Found in a lab trial: the Unix user `admin` read the admin token's
    logs and `rc exec HOLD -- id` into its hold printed uid=0(root)."""
    admin = box.admin
    if name == "admin":
        token = admin  # the admin token rc up made: name admin, jobs as root
    else:
        made = admin.post("/v1/tokens", {"name": name, "role": "user", "unix_user": BOB})
        token = Client(admin.url, made["secret"])
    me = token.get("/v1/whoami")
    assert me["name"] == name and me["principal"].startswith("token:")
    key = uuid.uuid4().hex
    env = {"SECRET": "s3cret"}
    done = token.post(
        "/v1/jobs",
        {"command": ["echo", "the token's output"], "device_id": f"{HOST}:cpu1", "env": env,
         "idempotency_key": key},
    )["job"]["id"]  # fmt: skip
    assert _ended(admin, done)["state"] == "succeeded"
    hold = token.post(
        "/v1/jobs",
        {"kind": "hold", "device_id": f"{HOST}:cpu0", "max_runtime_seconds": 600, "reason": "t"},
    )["job"]["id"]
    try:
        _running(admin, hold)
        got = box.probe(name, _attempts(hold, done, key, env))
        _nothing_granted(got, name, hold, done)
        _ended(admin, got["key"][1]["job"]["id"])
        _cli_refuses(box, name, hold, done)
        held = job(admin, hold)
        assert (held["state"], held["max_runtime_seconds"]) == ("running", 600)
        # the token itself still may, and its replayed key is its own job
        assert token.request("GET", f"/v1/jobs/{done}/logs", params={"follow": 0}).body == (
            b"the token's output\n"
        )
        again = token.post(
            "/v1/jobs",
            {"command": ["echo", "the token's output"], "device_id": f"{HOST}:cpu1", "env": env,
             "idempotency_key": key},
        )  # fmt: skip
        assert again["job"]["id"] == done
    finally:
        admin.post(f"/v1/jobs/{hold}/kill")
        _ended(admin, hold)
        if token is not admin:
            admin.delete(f"/v1/tokens/{name}")


def test_a_local_user_named_like_the_worker_token_is_no_worker(box):
    """rc up names its worker token worker-HOST; a Unix user of that name
    is a user like any other, with no worker route."""
    name = f"worker-{HOST}"
    tokens = {t["name"]: t for t in box.admin.get("/v1/tokens")["tokens"]}
    assert tokens[name]["role"] == "worker"
    reg = {"host": HOST, "devices": [{"name": "cpu0"}]}
    got = box.probe(
        name,
        [
            ("whoami", "GET", "/v1/whoami", None),
            ("register", "POST", "/v1/workers/register", reg),
            ("poll", "GET", f"/v1/workers/{HOST}/assignments", None),
            ("beat", "POST", f"/v1/workers/{HOST}/heartbeat", {"job_ids": []}),
        ],
    )
    me = got["whoami"][1]
    assert (me["role"], me["label"]) == ("user", name)
    for what in ("register", "poll", "beat"):
        status, answer = got[what]
        assert (status, answer["error"]) == (403, "forbidden"), (what, answer)
        # never "'worker-HOST' is a user token", which reads as the worker token's
        assert answer["message"] == (
            f"this route needs a worker token; the local user {name} has the role user"
        ), answer
    assert box.admin.get("/v1/devices")["devices"][0]["device"]["state"] != "unhealthy"


def test_people_with_ldap_names_share_the_box(box):
    """Found in a lab trial: john.doe and Erin were refused by the socket
    ("a name rc cannot use as an identity")."""
    john, erin = (box.user(n) for n in PEOPLE)
    res = john.run("whoami")
    assert res.stdout == b"john.doe (user, runs jobs as john.doe)\n", res.stderr
    ids = {}
    for user in (john, erin):
        res = user.run("run", "--detach", "--", "sh", "-c", "id -un; echo $HOME")
        assert res.returncode == 0, res.stderr
        ids[user.name] = int(res.stdout)
    for user in (john, erin):
        assert _ended(box.admin, ids[user.name])["state"] == "succeeded"
        res = user.run("logs", str(ids[user.name]))
        assert res.stdout.decode() == f"{user.name}\n{user.home}\n", res.stderr
    # each is their own principal: one cannot read the other's logs
    res = erin.run("logs", str(ids["john.doe"]))
    assert res.returncode == 1 and b"not_job_owner" in res.stderr
    # a token may run its jobs as them too (--unix-user takes their names)
    made = box.admin.post(
        "/v1/tokens", {"name": "erins-laptop", "role": "user", "unix_user": "Erin"}
    )
    try:
        laptop = Client(box.admin.url, made["secret"])
        j = laptop.post("/v1/jobs", {"command": ["id", "-un"], "selector": "*"})["job"]
        assert (j["submitter"], j["unix_user"]) == ("Erin (token erins-laptop)", "Erin")
        _ended(box.admin, j["id"])
        assert laptop.request("GET", f"/v1/jobs/{j['id']}/logs", params={"follow": 0}).body == (
            b"Erin\n"
        )
        # the same person for fair share and the ledger: one account
        rows = box.admin.get("/v1/usage", params={"since": "1h"})["rows"]
        assert "Erin" in {r["key"] for r in rows}
        assert not {r["key"] for r in rows} & {"Erin (token erins-laptop)", "erins-laptop"}
        # but another principal: the socket's Erin does not own the token's job
        res = erin.run("logs", str(j["id"]))
        assert res.returncode == 1 and b"not_job_owner" in res.stderr
        mine = json.loads(erin.run("jobs", "--mine", "-o", "json").stdout)
        assert j["id"] not in {x["id"] for x in mine} and ids["Erin"] in {x["id"] for x in mine}
        theirs = json.loads(erin.run("jobs", "--user", "Erin", "-o", "json").stdout)
        assert {j["id"], ids["Erin"]} <= {x["id"] for x in theirs}
    finally:
        box.admin.delete("/v1/tokens/erins-laptop")


def test_revoking_a_token_leaves_the_local_user_of_its_name_alone(box):
    """Found in a lab trial: revoking token alice cancelled the jobs the
    Unix user alice queued through the socket."""
    admin = box.admin
    made = admin.post("/v1/tokens", {"name": ALICE, "role": "user"})
    token = Client(admin.url, made["secret"])
    sock = box.user(ALICE)
    block = [
        admin.post(
            "/v1/jobs",
            {"kind": "hold", "device_id": f"{HOST}:cpu{i}", "max_runtime_seconds": 600,
             "reason": "keep the queue waiting"},
        )["job"]["id"]
        for i in (0, 1)
    ]  # fmt: skip
    try:
        for h in block:
            _running(admin, h)
        res = sock.run("run", "--detach", "--", "true")
        assert res.returncode == 0, res.stderr
        socket_job = int(res.stdout)
        token_job = token.post("/v1/jobs", {"command": ["true"], "selector": "*"})["job"]["id"]
        assert job(admin, socket_job)["state"] == job(admin, token_job)["state"] == "queued"
        assert job(admin, socket_job)["submitter"] == ALICE
        assert job(admin, token_job)["submitter"] == f"{ALICE} (token {ALICE})"
        res = subprocess.run(
            [PY, "-m", "rc", "token", "revoke", ALICE],
            env={**box.env, "RC_TOKEN": admin.token}, cwd=box.root, capture_output=True, timeout=60, check=False,
        )  # fmt: skip
        assert res.stdout.decode() == (
            f"revoked token '{ALICE}'; cancelled its 1 queued job ({token_job})\n"
        ), res.stderr
        assert (job(admin, token_job)["state"], job(admin, token_job)["kill_reason"]) == (
            "killed",
            "token revoked",
        )
        assert job(admin, socket_job)["state"] == "queued"
        # a new token of the same name is another principal, and is labelled
        # apart from the revoked one's jobs (a trial: both read "alice (token alice)")
        assert job(admin, token_job)["submitter"] == f"{ALICE} (revoked token {ALICE})"
        again = Client(
            admin.url, admin.post("/v1/tokens", {"name": ALICE, "role": "user"})["secret"]
        )
        assert again.get("/v1/whoami")["label"] == f"{ALICE} (token {ALICE})"
        with pytest.raises(ApiError) as e:
            again.get(f"/v1/jobs/{token_job}/logs", params={"follow": 0})
        assert e.value.code == "not_job_owner" and f"(revoked token {ALICE})" in e.value.message
        admin.delete(f"/v1/tokens/{ALICE}")
    finally:
        for h in block:
            admin.post(f"/v1/jobs/{h}/kill")
    assert _ended(admin, socket_job)["state"] == "succeeded"  # it ran once a device was free
