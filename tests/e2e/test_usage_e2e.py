"""The priority policy, the ledger and fair share through the real CLI and
a real controller (`rc serve --max-user-priority 2 --fair-share 7d`)."""

from __future__ import annotations

import csv
import io
import json

import pytest

from tests.helpers.harness import Cli, job
from tests.helpers.wait import wait_until


@pytest.fixture
def box(make_controller, make_worker, env, tmp_path):
    ctl = make_controller("--max-user-priority", "2", "--fair-share", "7d")
    make_worker(ctl, host="box", devices="cpu:2")
    alice = Cli(ctl.url, ctl.token("alice"), env, tmp_path)
    admin = Cli(ctl.url, ctl.admin_token, env, tmp_path)
    return ctl, alice, admin


def test_the_priority_policy_names_its_limit(box):
    _, alice, admin = box
    res = alice.run("run", "--detach", "--priority", "3", "--", "true")
    assert res.returncode == 1
    err = res.stderr.decode()
    assert "priority_not_allowed" in err and "limit of 2" in err and "Traceback" not in err
    assert len(err.splitlines()) == 1
    for prio in ("2", "-10"):  # up to the limit, and being nice is always allowed
        assert alice.run("run", "--detach", "--priority", prio, "--", "true").returncode == 0
    assert admin.run("run", "--detach", "--priority", "10", "--", "true").returncode == 0


def test_rc_usage_and_rc_share(box):
    ctl, alice, admin = box
    res = alice.run("run", "-n", "2", "--", "sleep", "1")
    assert res.returncode == 0, res.stderr
    rep = json.loads(alice.run("usage", "-o", "json", check=True).stdout)
    assert rep["by"] == "user" and [r["key"] for r in rep["rows"]] == ["alice"]
    row = rep["rows"][0]
    assert row["jobs"] == {"succeeded": 1} and row["waits"] == 1
    assert 2.0 <= row["device_seconds"] < 60  # two devices for about a second each
    rows = list(
        csv.DictReader(io.StringIO(alice.run("usage", "-o", "csv", check=True).stdout.decode()))
    )
    assert [r["user"] for r in rows] == ["alice", "total"] and rows[0]["jobs_succeeded"] == "1"
    text = alice.run("usage", "--by", "device", check=True).stdout.decode()
    assert "box:cpu0" in text and "box:cpu1" in text
    res = alice.run("usage", "--since", "0")  # refused by rc itself: a usage error
    assert res.returncode == 2 and b"--since" in res.stderr and b"Traceback" not in res.stderr
    from rc.proto.errors import ApiError

    with pytest.raises(ApiError, match="outside 1s..3660d"):  # and by the controller
        ctl.client().get("/v1/usage", params={"since": "0"})
    res = alice.run("usage", "--by", "month")
    assert res.returncode == 2
    # weights: admin only; rc share lists standings
    res = alice.run("share", "set", "bob", "2")
    assert res.returncode == 1 and b"forbidden" in res.stderr
    got = json.loads(admin.run("share", "set", "bob", "2", "-o", "json", check=True).stdout)
    assert got["half_life_seconds"] == 7 * 86400
    assert {s["user"]: s["weight"] for s in got["shares"]}["bob"] == 2
    out = alice.run("share", check=True).stdout.decode()
    assert out.splitlines()[0].split()[:3] == ["USER", "WEIGHT", "ENTITLED"] and "alice" in out
    assert admin.run("share", "set", "bob", "0").returncode == 2  # above 0, at most 1000


def test_explain_shows_every_term_of_the_priority(box):
    ctl, alice, admin = box
    hold = int(
        admin.run("hold", "-n", "2", "--ttl", "1h", "--reason", "r", "--detach", check=True).stdout
    )
    wait_until(lambda: job(ctl.client(), hold)["state"] == "running", 30, "the hold to run")
    queued = int(alice.run("run", "--detach", "--priority", "1", "--", "true", check=True).stdout)
    got = ctl.client().get(f"/v1/jobs/{queued}/explain")
    assert got["priority"].startswith("priority 1 + aging 0 - fair share 0 (alice: 0% ")
    assert got["priority"].endswith(" = 1")
    out = alice.run("explain", str(queued), check=True).stdout.decode()
    assert got["priority"] in out
