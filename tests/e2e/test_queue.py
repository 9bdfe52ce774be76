"""The queue end to end through the CLI: refusals at submit, `rc ps` order,
positions and waits, idempotency under concurrency, --no-wait, `rc devices -s`,
`rc explain -s`."""

from __future__ import annotations

import json
import re
import threading
import uuid

import pytest

from rc.proto.client import Client
from rc.proto.errors import ApiError
from tests.helpers.fleet_users import admin, alice, bob, start_fleet  # noqa: F401  (fixtures)
from tests.helpers.harness import Cli, job
from tests.helpers.wait import wait_until


@pytest.fixture(scope="module")
def fleet(tmp_path_factory, pyz):
    tmp = tmp_path_factory.mktemp("queue")
    ctl, w, env = start_fleet(tmp, pyz, ["--max-user-priority", "5"])  # alice asks for 5
    yield (
        ctl,
        {name: Cli(ctl.url, ctl.token(name), env, tmp) for name in ("alice", "bob")},
        w.proc.pid,
    )
    w.stop()
    ctl.stop()


def table(stdout: bytes) -> list[dict[str, str]]:
    """A CLI table as rows of {header: cell}, cut at the header's column starts."""
    head, *lines = stdout.decode().splitlines()
    starts = [m.start() for m in re.finditer(r"\S+", head)]
    names = head.split()
    bounds = list(zip(starts, starts[1:] + [None]))
    return [{n: ln[a:b].strip() for n, (a, b) in zip(names, bounds)} for ln in lines]


def detach(cli: Cli, *args: str) -> int:
    res = cli.run("run", "--detach", *args)
    assert res.returncode == 0, res.stderr
    return int(res.stdout)


def test_refused_at_submit(alice, admin):
    cases = [
        (("-s", "model=tpu"), b"no_matching_device"),
        (("-s", "vram>=100G"), b"no_matching_device"),
        (("-d", "box:cpu7"), b"unknown_device"),
        (("-d", "box:cpu0", "--max-runtime", "3h"), b"runtime_above_ceiling"),
        (("-s", "model=h100,,vram>1G"), b"bad_selector"),
    ]
    for args, code in cases:
        res = alice.run("run", *args, "--", "true")
        assert res.returncode == 1, (args, res)
        assert code in res.stderr, (args, res.stderr)
        assert len(res.stderr.splitlines()) == 1 and b"Traceback" not in res.stderr
    for prio in ("11", "-11"):  # refused before asking (the API's check: test_error_shape)
        res = alice.run("run", "--priority", prio, "--", "true")
        assert res.returncode == 2 and b"outside -10..10" in res.stderr
    res = alice.run("run", "-s", "model=h100 , vram=>1G", "--", "true")
    assert b"bad selector term 'vram=>1G'" in res.stderr
    assert admin.get("/v1/state")["queued"] == []
    # a runtime above one ceiling is fine when another candidate allows it (cpu1: none)
    j = job(admin, detach(alice, "--max-runtime", "3h", "--", "true"))
    assert (j["device_id"], j["max_runtime_seconds"]) == ("box:cpu1", 3 * 3600)


def test_ceilings_are_inherited_where_the_job_lands(alice, admin):
    j = job(admin, detach(alice, "-s", "model=h100", "--", "sleep", "30"))
    assert (j["selector"], j["device_id"], j["max_runtime_seconds"]) == (
        "model=h100",
        "box:cpu0",
        7200,
    )
    j = job(admin, detach(alice, "-d", "box:cpu1", "--", "true"))
    assert j["max_runtime_seconds"] == 0  # no ceiling, none asked: none


def test_ps_shows_running_then_the_queue_in_order(alice, bob, admin):
    h0 = int(bob.run("hold", "-d", "box:cpu0", "--ttl", "1h", "--reason", "r0", "--detach").stdout)
    h1 = int(bob.run("hold", "-d", "box:cpu1", "--ttl", "1h", "--reason", "r1", "--detach").stdout)
    any0 = detach(alice, "--", "true")
    pinned = detach(alice, "--priority", "5", "-d", "box:cpu1", "--", "sleep", "30")
    h100 = detach(alice, "-s", "model = h100", "--", "true")
    low = detach(alice, "--priority", "-2", "--", "true")
    rows = table(alice.run("ps", check=True).stdout)
    assert list(rows[0]) == ["JOB", "DEVICE", "STATE", "SUBMITTER", "PRIO", "FOR", "COMMAND"]
    assert [int(r["JOB"]) for r in rows] == [h1, h0, pinned, any0, h100, low]
    assert [(r["DEVICE"], r["STATE"], r["SUBMITTER"], r["PRIO"], r["COMMAND"]) for r in rows] == [
        ("box:cpu1", "running", "bob (token bob)", "0", "hold: r1"),
        ("box:cpu0", "running", "bob (token bob)", "0", "hold: r0"),
        # positions: 1 + the jobs ahead that want a device this one could use
        ("box:cpu1", "queued (#1)", "alice (token alice)", "5", "sleep 30"),
        ("*", "queued (#2)", "alice (token alice)", "0", "true"),
        ("model=h100", "queued (#2)", "alice (token alice)", "0", "true"),
        ("*", "queued (#4)", "alice (token alice)", "-2", "true"),
    ]
    assert all(re.fullmatch(r"(\d+m)?\d+s", r["FOR"]) for r in rows), rows
    st = json.loads(alice.run("ps", "-o", "json", check=True).stdout)
    assert [j["id"] for j in st["queued"]] == [pinned, any0, h100, low]
    assert st["queue_positions"] == {str(pinned): 1, str(any0): 2, str(h100): 2, str(low): 4}
    assert all(w >= 0 for w in st["queued_waiting_seconds"].values())
    # when cpu1 frees, the pinned priority-5 job gets it; everyone moves up
    assert bob.run("release", str(h1)).returncode == 0
    wait_until(lambda: job(admin, pinned)["state"] == "running", 20, "the pinned job to start")
    view = admin.get(f"/v1/jobs/{low}")
    assert view["queue_position"] == 3


def test_explain_selector_and_devices_filter(alice, bob, admin):
    out = alice.run("devices", "-s", "vram>=40G", check=True).stdout.decode()
    assert [ln.split()[0] for ln in out.splitlines()[1:]] == ["box:cpu0", "box:cpu1"]
    out = alice.run("devices", "-s", "vram>40G", check=True).stdout.decode()
    assert [ln.split()[0] for ln in out.splitlines()[1:]] == ["box:cpu0"]
    res = alice.run("devices", "-s", "vram>>40G")
    assert res.returncode == 1 and b"bad_selector" in res.stderr
    int(bob.run("hold", "-d", "box:cpu0", "--ttl", "1h", "--reason", "r", "--detach").stdout)
    detach(bob, "-d", "box:cpu0", "--", "true")
    detach(bob, "--priority", "3", "-s", "model=h100", "--", "true")
    out = alice.run("explain", "-s", " vram >= 40G ", check=True).stdout.decode()
    assert out == (
        "selector: vram>=40G\n  box:cpu0  not free: busy, held by bob (token bob)\n"
        "  box:cpu1  free\nfree: 1/2\nqueue depth: 2\n"
    )
    out = alice.run("explain", "-s", "vram>=400G", check=True).stdout.decode()
    assert out.startswith("selector: vram>=400G\nno device matches it")
    ex = json.loads(alice.run("explain", "-s", "model=a100", "-o", "json", check=True).stdout)
    assert ex == {
        "selector": "model=a100",
        "matching": ["box:cpu1"],
        "free": ["box:cpu1"],
        "queue_depth": 0,
    }


def test_no_wait(alice, bob, admin):
    j = job(admin, detach(alice, "--no-wait", "-d", "box:cpu1", "--", "sleep", "30"))
    assert j["state"] in ("assigned", "running")
    res = bob.run("run", "--no-wait", "-d", "box:cpu1", "--", "true")
    assert res.returncode == 1 and b"no_device_available: box:cpu1" in res.stderr
    assert admin.get("/v1/state")["queued"] == []
    c = Client(admin.url, admin.token)
    with pytest.raises(ApiError) as e:
        c.post("/v1/jobs", {"command": ["true"], "device_id": "box:cpu1", "no_wait": True})
    assert (e.value.status, e.value.code) == (409, "no_device_available")
    assert admin.get("/v1/state")["queued"] == []
    c.close_all()


def test_concurrent_duplicate_submissions_make_one_job(fleet, admin):
    ctl = fleet[0]
    token = ctl.token("dana")
    key = uuid.uuid4().hex
    body = {"command": ["sleep", "5"], "selector": "*", "idempotency_key": key}
    start = threading.Barrier(12)
    answers: list = []

    def post() -> None:
        c = Client(ctl.url, token, timeout=30)
        start.wait(10)
        r = c.request("POST", "/v1/jobs", body)
        c.close_all()
        answers.append((r.status, r.json()["job"]["id"]))

    threads = [threading.Thread(target=post) for _ in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(answers) == 12
    assert len({job_id for _, job_id in answers}) == 1
    assert sorted(status for status, _ in answers) == [200] * 11 + [201]
    mine = admin.get("/v1/jobs", params={"submitter": "dana", "limit": 100})["jobs"]
    assert [j["id"] for j in mine] == [answers[0][1]]
    dana, erin = Client(ctl.url, token), Client(ctl.url, ctl.token("erin"))
    with pytest.raises(ApiError) as e:
        dana.post("/v1/jobs", {**body, "command": ["sleep", "6"]})
    assert (e.value.status, e.value.code) == (409, "idempotency_conflict")
    # another user's key is never their job: the same key from erin is erin's own new job
    r = erin.request("POST", "/v1/jobs", body)
    assert r.status == 201 and r.json()["job"]["id"] != answers[0][1]
    assert r.json()["job"]["submitter"].startswith("erin")
    dana.close_all()
    erin.close_all()
