"""The idle rule of holds end to end on CPU devices (README "Holds: the idle
rule"): a real controller, a worker from the zipapp, `rc hold` and `rc shell`
as the user runs them (the shell under a pseudo-terminal this test drives)."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest

from tests.helpers.fleet import BASH, Fleet, pty_cli, running_fleet
from tests.helpers.harness import job
from tests.helpers.wait import wait_until

__all__ = ["pty_cli"]  # the fixture, shared with the relay tests


@pytest.fixture(scope="module")
def fleet(tmp_path_factory, pyz) -> Iterator[Fleet]:
    # a hold is released only after a use report since its warning: heartbeats
    # (and so use reports) every second, so one comes before each limit here
    extra = ["--heartbeat-interval", "1s"]
    with running_fleet(tmp_path_factory.mktemp("idle"), pyz, extra=extra) as f:
        yield f


def _hold(fleet: Fleet, device: str, idle: str) -> int:
    res = fleet.alice.run(
        "hold", "-d", device, "--ttl", "10m", "--reason", "idle test", "--idle-timeout", idle,
        "--detach", check=True,
    )  # fmt: skip
    return int(res.stdout)


def _events(fleet: Fleet, hold_id: int) -> list[dict]:
    feed = fleet.ctl.client().get("/v1/events?limit=1000")["events"]
    return [e for e in feed if e.get("job_id") == hold_id]


def _kinds(fleet: Fleet, hold_id: int) -> list[str]:
    return [e["kind"] for e in _events(fleet, hold_id)]


def test_an_unused_hold_is_warned_then_ends_idle(fleet):
    held = _hold(fleet, "box:cpu0", "3s")
    c = fleet.ctl.client()
    shown = c.get(f"/v1/jobs/{held}?detail=1")["detail"]["idle"]
    assert shown["timeout_seconds"] == 3 and shown["state"].startswith("idle ")
    wait_until(lambda: job(c, held)["state"] == "killed", 30, f"hold {held} to be released idle")
    assert job(c, held)["kill_reason"] == "idle: no use for 3s"
    assert _kinds(fleet, held) == ["hold_idle_warning", "hold_reclaimed"]
    warning = _events(fleet, held)[0]["text"]
    assert f"hold {held} is idle and will be released at" in warning
    show = fleet.alice.run("show", str(held), check=True).stdout
    assert b"idle: no use for 3s" in show and b"3s without use" in show


def test_a_foreground_hold_says_its_idle_warning(fleet):
    """Found by a new user: a foreground `rc hold` was released idle without a
    word before it (only terminal sessions, the feed and webhooks were told)."""
    res = fleet.alice.run(
        "hold", "-d", "box:cpu1", "--ttl", "10m", "--reason", "r", "--idle-timeout", "4s",
        timeout=60,
    )  # fmt: skip
    err = res.stderr.decode()
    warned = re.search(r"hold (\d+) is idle and will be released at ", err)
    assert warned, err
    ended = err.index(f"hold {warned[1]} ended: idle: no use for 4s")
    assert warned.start() < ended, err


def test_show_says_when_the_ttl_ends_before_the_idle_release(fleet):
    """Found by a new user: `rc show` of a 1-minute hold with a 1-hour idle
    timeout said it would be released idle in an hour, after its ttl."""
    res = fleet.alice.run(
        "hold", "-d", "box:cpu1", "--ttl", "1m", "--reason", "r", "--idle-timeout", "1h",
        "--detach", check=True,
    )  # fmt: skip
    held = int(res.stdout)
    c = fleet.ctl.client()
    wait_until(lambda: job(c, held)["state"] == "running", 30, f"hold {held} to start")
    show = fleet.alice.run("show", str(held), check=True).stdout.decode()
    assert re.search(r"idle: +idle \S+.*; its ttl ends first, at ", show), show
    assert "released at" not in show, show
    fleet.alice.run("release", str(held), check=True)


def test_typing_into_its_session_resets_the_clock(fleet, pty_cli):
    held = _hold(fleet, "box:cpu1", "8s")  # warned at 4 s idle: time to attach
    c = fleet.ctl.client()
    t = pty_cli(fleet.alice, "shell", str(held), "--", *BASH)
    t.expect(rb"is idle and will be released at [0-9:]+; type anything to keep it", 30)
    first = _events(fleet, held)
    assert [e["kind"] for e in first] == ["hold_idle_warning"]
    t.send(b"echo back-$((40+2))\r")
    t.expect(b"back-42")
    show = fleet.alice.run("show", str(held), check=True).stdout
    line = rb"idle: +idle \d+s: input \d+s ago, (CPU \d+ %|use not reported yet), no forward; "
    assert re.search(line + rb"released at", show), show.decode()
    # a new idle spell: warned again, and still running after its first limit
    wait_until(
        lambda: (
            _kinds(fleet, held).count("hold_idle_warning") == 2
            or job(c, held)["state"] != "running"
        ),
        30,
        "a second warning",
    )
    events = _events(fleet, held)
    assert [e["kind"] for e in events] == ["hold_idle_warning", "hold_idle_warning"], events
    assert events[1]["at"] - first[0]["at"] >= 4  # the typing moved the clock on
    assert job(c, held)["state"] == "running"
    t.expect(rb"hold %d released \(idle: no use for 8s\)" % held, 30)
    t.wait()
    wait_until(lambda: job(c, held)["state"] == "killed", 30, f"hold {held} to end")
    assert job(c, held)["kill_reason"] == "idle: no use for 8s"


def test_bytes_through_a_forward_reset_the_clock(fleet):
    import socket

    from tests.helpers.forward import FarServer, forwarding

    far = FarServer()
    try:
        held = _hold(fleet, "box:cpu0", "8s")
        c = fleet.ctl.client()
        with forwarding(fleet.alice, held, f"0:{far.port}") as (_, port, _):
            wait_until(lambda: _kinds(fleet, held), 30, "the first warning")
            first = _events(fleet, held)
            assert [e["kind"] for e in first] == ["hold_idle_warning"]
            with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
                s.sendall(b"E" + b"x" * 1000)
                s.shutdown(socket.SHUT_WR)
                got = b""
                while chunk := s.recv(65536):
                    got += chunk
            assert got.startswith(b"x" * 1000) and b"sha256:" in got
            state = c.get(f"/v1/jobs/{held}?detail=1")["detail"]["idle"]["state"]
            assert re.fullmatch(r"idle \d+s: no input, .*, forward \d+s ago", state), state
            wait_until(
                lambda: (
                    _kinds(fleet, held).count("hold_idle_warning") == 2
                    or job(c, held)["state"] != "running"
                ),
                30,
                "a second warning",
            )
            events = _events(fleet, held)
            assert [e["kind"] for e in events] == ["hold_idle_warning"] * 2, events
            assert job(c, held)["state"] == "running"
            wait_until(lambda: job(c, held)["state"] == "killed", 30, f"hold {held} to end")
        assert job(c, held)["kill_reason"] == "idle: no use for 8s"
    finally:
        far.shutdown()
        far.server_close()
