"""`rc hold` / `rc release` end to end: a real controller, a real worker from
the zipapp, the CLI as subprocesses; Ctrl-C is a real SIGINT to `rc hold`."""

from __future__ import annotations

import os
import re
import signal
import time

import pytest

from rc.proto.errors import ApiError
from tests.helpers.fleet_users import admin, alice, bob, fleet, read_line  # noqa: F401  (fixtures)
from tests.helpers.harness import job, stop_process
from tests.helpers.wait import wait_until


def _parent(pid: str) -> str:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rpartition(")")[2].split()[1]


def sleeper_of(job_id: int, worker_pid: int) -> str:
    """The command line of the process our worker runs for job `job_id` ("" if
    none). Only descendants of `worker_pid` count: other tests' workers on this
    machine number their jobs from 1 too."""
    marker = f"RC_JOB_ID={job_id}".encode()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if marker not in f.read().split(b"\0"):
                    continue
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmdline = f.read().replace(b"\0", b" ").decode().strip()
            up = pid
            for _ in range(8):
                up = _parent(up)
                if up == str(worker_pid):
                    return cmdline
                if up in ("0", "1"):
                    break
        except (OSError, IndexError):
            continue
    return ""


GRANTED = re.compile(
    r"hold (\d+) granted on (\S+) until (\d{4}-\d\d-\d\d \d\d:\d\d:\d\d) "
    r"\((\S+)\)\n"
)


def test_a_long_hold_reason_never_cuts_or_widens_the_holder_column(alice, bob):
    """The trial: rc devices put a hold's reason inside the HOLDER column,
    which is never cut: a long reason widened every row. The holder stays
    whole in its column; the reason goes, cut, in the last one."""
    reason = "sweeping learning rates for the ablation table " * 5
    held = int(
        alice.run(
            "hold", "-d", "box:cpu1", "--ttl", "5m", "--reason", reason, "--detach", check=True
        ).stdout
    )
    try:
        lines = bob.run("devices", check=True).stdout.decode().splitlines()
        header = lines[0]
        holder_width = header.index("ELAPSED") - header.index("HOLDER") - 2
        assert holder_width == len("alice (token alice)"), header
        row = next(ln for ln in lines if ln.startswith("box:cpu1"))
        assert row[header.index("HOLDER") :].startswith("alice (token alice)  ")
        assert row.endswith("hold: " + reason[:33] + "…"), row
        assert max(len(ln) for ln in lines) < 120, lines
    finally:
        alice.run("release", str(held), check=True)


def test_hold_is_granted_shown_and_released(alice, bob, admin, fleet):
    worker_pid = fleet[2]
    proc = alice.popen("hold", "-d", "box:cpu0", "--ttl", "1h", "--reason", "poking at nccl")
    try:
        m = GRANTED.fullmatch(read_line(proc, 30, "the grant"))
        assert m, "no grant line"
        hold_id, device, until, ttl = int(m[1]), m[2], m[3], m[4]
        assert (device, ttl) == ("box:cpu0", "1h")
        started = job(admin, hold_id)["started_at"]
        # local time, as every human-facing time (this process has rc's TZ)
        assert until == time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(started + 3600))
        # the worker runs its own sleeper, never a submitted command
        assert (
            wait_until(lambda: sleeper_of(hold_id, worker_pid), 10, "its process")
            == "sleep 2147483647"
        )
        # rc devices shows the holder and the reason
        rows = bob.run("devices", check=True).stdout.decode()
        line = next(ln for ln in rows.splitlines() if ln.startswith("box:cpu0"))
        # (the holder by its label: the token alice, whose jobs run as alice)
        assert "alice (token alice)  " in line and line.endswith("hold: poking at nccl")
        views = {v["device"]["id"]: v for v in bob.json("devices")}
        assert (views["box:cpu0"]["holder"], views["box:cpu0"]["reason"]) == (
            "alice (token alice)",
            "poking at nccl",
        )
        # it blocks until released from elsewhere
        assert proc.poll() is None
        res = alice.run("release", str(hold_id))
        assert (res.returncode, res.stdout) == (0, f"released {hold_id}\n".encode())
        _, err = proc.communicate(timeout=30)
        assert proc.returncode == 0
        # in words (found by a new user: "ended: killed by alice: released"), who first
        assert f"hold {hold_id} ended: released by alice (token alice)\n".encode() in err
        wait_until(lambda: not sleeper_of(hold_id, worker_pid), 10, "the sleeper to be gone")
    finally:
        stop_process(proc)


# a closed terminal (SIGHUP) or a killed client (SIGTERM) cleans up as Ctrl-C does
INTERRUPTS = [(signal.SIGINT, "Ctrl-C"), (signal.SIGHUP, "SIGHUP"), (signal.SIGTERM, "SIGTERM")]


@pytest.mark.parametrize(("sig", "cause"), INTERRUPTS)
def test_ctrl_c_on_a_granted_hold_releases_it(alice, admin, sig, cause):
    proc = alice.popen("hold", "-s", "model=a100", "--ttl", "30m", "--reason", "profiling")
    try:
        m = GRANTED.fullmatch(read_line(proc, 30, "the grant"))
        hold_id = int(m[1])
        assert m[2] == "box:cpu1"
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=30)
        assert proc.returncode == 130, err
        assert f"released hold {hold_id}".encode() in err
        wait_until(lambda: job(admin, hold_id)["state"] == "killed", 15, "the hold to end")
        assert f"released ({cause})" in job(admin, hold_id)["kill_reason"]
    finally:
        stop_process(proc)


def test_a_hold_ends_at_its_ttl(alice, admin):
    res = alice.run("hold", "-d", "box:cpu1", "--ttl", "1s", "--reason", "quick look", timeout=30)
    assert res.returncode == 0, res.stderr
    hold_id = int(GRANTED.fullmatch(res.stdout.decode())[1])
    assert f"hold {hold_id} ended: its ttl of 1s was reached".encode() in res.stderr
    h = job(admin, hold_id)
    assert (h["state"], h["kill_reason"]) == ("succeeded", "hold ended: its ttl of 1s was reached")


def test_detach_prints_the_hold_id_alone(alice, bob, admin):
    res = alice.run("hold", "-s", "vram>=80G", "--ttl", "10m", "--reason", "x", "--detach")
    assert res.returncode == 0, res.stderr
    hold_id = int(res.stdout)
    assert res.stdout == f"{hold_id}\n".encode()
    h = job(admin, hold_id)
    assert (h["kind"], h["device_id"], h["state"]) == ("hold", "box:cpu0", "running")
    # only its owner may release it
    res = bob.run("release", str(hold_id))
    assert res.returncode == 1 and b"not_job_owner" in res.stderr
    assert b"only its owner or an admin may release it" in res.stderr, res.stderr
    assert alice.run("release", str(hold_id)).returncode == 0


@pytest.mark.parametrize(("sig", "cause"), INTERRUPTS)
@pytest.mark.parametrize(
    "verb",
    [
        ["hold", "-d", "box:cpu0", "--ttl", "10m", "--reason", "b"],
        ["run", "-d", "box:cpu0", "--", "true"],
    ],
)
def test_a_hold_queues_and_ctrl_c_while_queued_cancels_it(alice, bob, admin, sig, cause, verb):
    first = int(
        bob.run("hold", "-d", "box:cpu0", "--ttl", "10m", "--reason", "a", "--detach").stdout
    )
    proc = alice.popen(*verb)
    try:
        wait_until(lambda: admin.get("/v1/state")["queued"], 20, "the second hold to queue")
        queued = admin.get("/v1/state")["queued"][0]["id"]
        # the position line says the client is in its wait (and its handlers are set)
        assert read_line(proc, 20, "the position", stream="stderr").startswith(
            "rc: queued at position 1 for box:cpu0"
        )
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=30)
        assert proc.returncode == 130
        assert f"cancelled queued job {queued}".encode() in err
        assert admin.get("/v1/state")["queued"] == []
        assert job(admin, queued)["state"] == "killed"
        assert job(admin, queued)["kill_reason"].endswith(f"cancelled while queued ({cause})")
        assert job(admin, first)["state"] == "running"
    finally:
        stop_process(proc)
        admin.post(f"/v1/jobs/{first}/kill", {})
        wait_until(lambda: job(admin, first)["state"] == "killed", 15, "the first hold to end")


def test_holds_are_refused_with_a_command_or_without_a_reason(alice, admin, fleet):
    res = alice.run("hold", "-d", "box:cpu0", "--ttl", "10m", "--reason", "  ")
    assert res.returncode == 2 and b"--reason cannot be blank" in res.stderr
    res = alice.run("hold", "-d", "box:cpu0", "--ttl", "3h", "--reason", "too long")
    assert res.returncode == 1 and b"runtime_above_ceiling" in res.stderr  # cpu0 allows 2h
    c = fleet[0].client(fleet[0].token("carol"))
    base = {"kind": "hold", "device_id": "box:cpu1", "max_runtime_seconds": 60, "reason": "r"}
    for extra in (
        {"command": ["sh"]},
        {"cwd": "/tmp"},
        {"env": {"A": "1"}},
        {"idle_timeout_seconds": 5},
        {"stdio": "tty"},
        {"reason": " "},
        {"max_runtime_seconds": 0},
    ):
        with pytest.raises(ApiError) as e:
            c.post("/v1/jobs", {**base, **extra})
        assert (e.value.status, e.value.code) == (400, "bad_request"), extra
    c.close_all()
    assert admin.get("/v1/state")["queued"] == [] and admin.get("/v1/state")["jobs"] == []
