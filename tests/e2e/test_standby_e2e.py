"""Standby controllers end to end: two real `rc serve` on one throwaway
PostgreSQL database (tests/helpers/pgcluster.py), on loopback ports. One is active;
the other answers every route 503 standby naming the active's URL; kill -9
of the active → the standby takes over within the bound and schedules; a
paused active (SIGSTOP past its ttl) is fenced when it wakes and stops."""

from __future__ import annotations

import json
import signal

import pytest

from rc.proto import INSTANCE_HEADER
from tests.helpers.harness import Cli
from tests.helpers.standby import _instance, _is_active, _leader_row, _pair, _raw
from tests.helpers.wait import wait_until


def _assert_standby(status, headers, body, active: str | None) -> None:
    assert status == 503, body
    doc = json.loads(body)
    assert doc["error"] == "standby"
    assert doc["active"] == active
    assert (f"the active controller is {active}" if active else "no controller") in doc["message"]
    assert headers["retry-after"] == "1"
    assert INSTANCE_HEADER.lower() not in headers  # no instance a worker would register with


def test_a_standby_answers_every_route_503_standby_naming_the_active(
    pg_dsn, make_controller, tmp_path
):
    a, b, token = _pair(make_controller, pg_dsn, tmp_path)
    assert "standby: the active controller is " + a.url in wait_until(
        lambda: "standby: the active controller" in b.log() and b.log(), 10, "b's standby line"
    )
    assert _leader_row(pg_dsn) == (_instance(a), a.url, 1)
    assert ", active)" in a.log() and ", standby)" in b.log()  # the start lines say which
    register = json.dumps({"host": "h", "devices": []}).encode()
    for method, path, body in [
        ("GET", "/v1/jobs", None),  # the API
        ("POST", "/v1/jobs", b"{}"),
        ("GET", "/v1/whoami", None),
        ("POST", "/v1/workers/register", register),  # worker routes
        ("POST", "/v1/workers/h/heartbeat", b"{}"),
        ("GET", "/v1/workers/h/assignments?wait=1", None),
        ("GET", "/v1/events/stream", None),  # streams
        ("GET", "/v1/jobs/1/logs?follow=1", None),
        ("GET", "/v1/jobs/1/tty/out", None),  # a relay half
        ("GET", "/metrics", None),
        ("GET", "/", None),
        ("GET", "/no/such/route", None),
    ]:
        _assert_standby(*_raw(b.url, method, path, token, body), a.url)
    # the active answers as ever
    status, headers, _ = _raw(a.url, "GET", "/v1/jobs", token)
    assert status == 200 and headers[INSTANCE_HEADER.lower()] == _instance(a)


def test_kill_9_of_the_active_the_standby_takes_over_within_the_bound_and_schedules(
    pg_dsn, make_controller, make_worker, env, tmp_path
):
    a, b, token = _pair(make_controller, pg_dsn, tmp_path)
    wait_until(lambda: "standby: the active controller" in b.log(), 10, "b standby")
    a.kill9()
    wait_until(lambda: _is_active(b, token), 15, "b to take over")
    # b took the lease once it ran out (test_leadership_pg: never before);
    # how long that takes is bench/failover.py's figure, not asserted here
    assert _leader_row(pg_dsn) == (_instance(b), b.url, 2)
    assert "took the leadership lease (epoch 2)" in b.log()
    # b schedules: a worker registers with it and a job runs
    make_worker(b, host="box", devices="cpu:1")
    cli = Cli(b.url, token, env, tmp_path)
    res = cli.run("run", "--", "sh", "-c", "echo after-failover")
    assert res.returncode == 0, res.stderr
    assert res.stdout == b"after-failover\n"
    assert any((tmp_path / "shared-logs").rglob("*"))  # the log in the shared dir


def test_a_paused_active_is_fenced_when_it_wakes_and_stops(pg_dsn, make_controller, tmp_path):
    a, b, token = _pair(make_controller, pg_dsn, tmp_path, "--leader-ttl", "1s")
    wait_until(lambda: "standby: the active controller" in b.log(), 10, "b standby")
    a.proc.send_signal(signal.SIGSTOP)
    try:
        wait_until(lambda: _is_active(b, token), 15, "b to take over from the paused a")
        assert _leader_row(pg_dsn) == (_instance(b), b.url, 2)
    finally:
        a.proc.send_signal(signal.SIGCONT)
    # a wakes: its next renewal finds the lease gone (or its next write batch
    # is fenced); it stops at once, exit 3, saying how to rejoin
    assert a.proc.wait(20) == 3
    log = a.log()
    assert "lost the leadership lease (epoch 1)" in log
    assert "restart rc serve to rejoin as a standby" in log
    # found by a new user: each loop's fenced write logged a traceback
    assert "Traceback" not in log, log
    assert _leader_row(pg_dsn) == (_instance(b), b.url, 2)  # a took nothing back
    assert _is_active(b, token)


def test_a_clean_stop_of_the_active_hands_over_at_once(pg_dsn, make_controller, tmp_path):
    a, b, token = _pair(make_controller, pg_dsn, tmp_path, "--leader-ttl", "60s")
    wait_until(lambda: "standby: the active controller" in b.log(), 10, "b standby")
    assert a.stop() == 0
    assert "gave up the leadership lease (epoch 1)" in a.log()  # a new user missed a word
    wait_until(lambda: _is_active(b, token), 10, "b to take over without the 60 s ttl")
    assert _leader_row(pg_dsn)[2] == 2


def test_advertise_url_is_checked_and_named_by_the_standby(pg_dsn, make_controller, tmp_path):
    with pytest.raises(AssertionError, match="--advertise-url.*must be only"):
        make_controller("--database", pg_dsn, "--advertise-url", "http://x:1/path")
    logs = str(tmp_path / "logs")
    a = make_controller(
        "--database", pg_dsn, "--log-dir", logs, "--advertise-url", "http://ctl-a.lab:8080/"
    )
    wait_until(lambda: (a.data / "admin.token").exists(), 20, "a to become active")
    b = make_controller("--database", pg_dsn, "--log-dir", logs)
    status, headers, body = wait_until(
        lambda: (r := _raw(b.url, "GET", "/v1/jobs")) and json.loads(r[2]).get("active") and r,
        10,
        "b to name a",
    )
    _assert_standby(status, headers, body, "http://ctl-a.lab:8080")
