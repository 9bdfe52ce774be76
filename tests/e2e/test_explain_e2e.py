"""`rc explain JOB` through the CLI against real processes, in each waiting
case: devices held (by whom, for how long), jobs ahead, the per-user cap,
devices out of the pool."""

from __future__ import annotations

import datetime
import json
import re
import time

import pytest

from tests.helpers.fleet_users import start_fleet
from tests.helpers.harness import Cli, job
from tests.helpers.wait import wait_until


@pytest.fixture(scope="module")
def fleet(tmp_path_factory, pyz):
    tmp = tmp_path_factory.mktemp("explain")
    ctl, w, env = start_fleet(tmp, pyz, ["--max-devices-per-user", "1"])
    users = {n: Cli(ctl.url, ctl.token(n), env, tmp) for n in ("alice", "bob", "carol", "dave")}
    users["admin"] = Cli(ctl.url, ctl.admin_token, env, tmp)
    yield ctl, users
    w.stop()
    ctl.stop()


def explain(cli: Cli, job_id: int) -> str:
    res = cli.run("explain", str(job_id))
    assert res.returncode == 0, res.stderr
    return res.stdout.decode()


def hold(cli: Cli, device: str, reason: str) -> int:
    res = cli.run("hold", "-d", device, "--ttl", "10m", "--reason", reason, "--detach")
    assert res.returncode == 0, res.stderr
    return int(res.stdout)


def run(cli: Cli, *args: str) -> int:
    res = cli.run("run", "--detach", *args)
    assert res.returncode == 0, res.stderr
    return int(res.stdout)


def test_every_waiting_case(fleet):
    ctl, u = fleet
    c = ctl.client()
    alice, bob, carol, dave = u["alice"], u["bob"], u["carol"], u["dave"]

    # 1. no matching device is free: who holds each, for how long at most
    b = hold(bob, "box:cpu0", "nccl debugging")
    k = hold(carol, "box:cpu1", "profiling")
    a1 = run(alice, "--", "sleep", "120")
    out = explain(alice, a1)
    assert out.startswith(f"job {a1}: queued, position 1 in the queue\n")
    assert re.search(
        r"  - No matching device is free: box:cpu0: bob \(token bob\) holds it \(nccl debugging\), "
        r"for at most (10m|9m\d+s) more; box:cpu1: carol \(token carol\) holds it \(profiling\), "
        r"for at most (10m|9m\d+s) more\.\n",
        out,
    ), out
    assert "devices it could use:\n  box:cpu0: bob (token bob) holds it" in out
    # -o json: every time RFC 3339, the held devices' `until` too (the trial: epoch seconds)
    ex = json.loads(alice.run("explain", str(a1), "-o", "json", check=True).stdout)
    held = {x["device_id"]: x for h in ex["hosts"] for x in h["held"]}
    until = held["box:cpu0"]["until"]
    assert isinstance(until, str) and until.endswith("Z"), held
    assert datetime.datetime.fromisoformat(until).timestamp() > time.time()

    # 2. jobs ahead with higher or equal priority
    d1 = run(dave, "--", "sleep", "120")
    out = explain(dave, d1)
    assert f"job {d1}: queued, position 2 in the queue" in out
    assert (
        f"  - 1 job ahead of it with higher or equal priority wants the same devices and "
        f"gets them first (job {a1}). This job's priority is 0, and it gains a step every "
        "10m it waits."
    ) in out

    # 3. the per-user cap: a device is free, but not for alice
    assert bob.run("release", str(b)).returncode == 0
    wait_until(lambda: job(c, a1)["state"] == "running", 20, "alice's first job to start")
    a2 = run(alice, "--", "sleep", "120")
    assert dave.run("kill", str(d1)).returncode == 0
    assert carol.run("release", str(k)).returncode == 0
    wait_until(
        lambda: any(
            v["device"]["id"] == "box:cpu1" and v["device"]["state"] == "ready"
            for v in c.get("/v1/devices")["devices"]
        ),
        20,
        "cpu1 to be free",
    )
    assert job(c, a2)["state"] == "queued"
    out = explain(alice, a2)
    assert (
        "  - alice already holds 1 device, the per-user cap (rc serve "
        "--max-devices-per-user 1); it starts once one of them is released.\n"
    ) in out
    assert "  box:cpu1: free\n" in out
    assert "No matching device is free" not in out

    # 4. the devices it can use are out of the pool, and why
    assert u["admin"].run("drain", "box:cpu1", "--reason", "cable swap").returncode == 0
    d2 = run(dave, "-d", "box:cpu1", "--", "true")
    out = explain(dave, d2)
    assert "  - Every matching device is out of the pool: box:cpu1: draining (cable swap).\n" in out
    c.post("/v1/devices/box:cpu1/fault", {"reason": "verify failed: ECC errors"})
    ex = json.loads(dave.run("explain", str(d2), "-o", "json", check=True).stdout)
    assert ex["reasons"] == [
        (
            "Every matching device is out of the pool: box:cpu1: quarantined "
            "(fault): verify failed: ECC errors."
        )
    ]
    assert ex["queue_position"] == 1 and ex["state"] == "queued"

    # not waiting at all
    out = explain(alice, a1)
    assert out == f"job {a1}: running\n  - It is not waiting: it is running on box:cpu0.\n"
    res = alice.run("explain", "999999")
    assert res.returncode == 1 and b"not_found" in res.stderr
    c.close_all()
