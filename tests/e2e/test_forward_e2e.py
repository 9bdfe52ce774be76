"""`rc forward` end to end: a real controller, a worker from the zipapp, a
Python http.server started inside the hold with `rc exec`, and the CLI's
forward in front of it."""

from __future__ import annotations

import hashlib
import os
import re
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from rc.proto.errors import ApiError
from tests.helpers.fleet import Fleet, hold, running_fleet
from tests.helpers.forward import FarServer, Lines, _stop, forwarding
from tests.helpers.harness import PY, Cli, job
from tests.helpers.wait import wait_until

BIG_BYTES = 100 << 20
SMALL_FILES = 50


@dataclass
class Served:
    fleet: Fleet
    hold: int
    port: int
    root: Path
    server: subprocess.Popen


@pytest.fixture
def far() -> Iterator[FarServer]:
    srv = FarServer()
    try:
        yield srv
    finally:
        srv.shutdown()
        srv.server_close()


@pytest.fixture(scope="module")
def fleet(tmp_path_factory, pyz) -> Iterator[Fleet]:
    with running_fleet(tmp_path_factory.mktemp("forward"), pyz) as f:
        yield f


@pytest.fixture(scope="module")
def served(fleet) -> Iterator[Served]:
    """Alice's hold on box:cpu0 with an http.server inside it (on a port it
    chose) serving a 100 MB file and 50 small ones."""
    root = fleet.tmp / "www"
    root.mkdir()
    (root / "big.bin").write_bytes(os.urandom(BIG_BYTES))
    for i in range(SMALL_FILES):
        (root / f"f{i}.txt").write_bytes(b"file %d\n" % i * (i + 1))
    held = hold(fleet.alice, "box:cpu0")
    server = fleet.alice.popen(
        "exec",
        str(held),
        "--",
        PY,
        "-u",
        "-m",
        "http.server",
        "0",
        "--bind",
        "127.0.0.1",
        "--directory",
        str(root),
    )
    try:
        port = int(Lines(server.stdout).expect(rb"port (\d+)").group(1))
        yield Served(fleet, held, port, root, server)
    finally:
        fleet.alice.run("release", str(held))
        _stop(server)


def relay_sessions(fleet: Fleet) -> float:
    text = fleet.ctl.client().request("GET", "/metrics").body.decode()
    m = re.search(r"^rc_relay_sessions (\S+)$", text, re.MULTILINE)
    assert m, text[:400]
    return float(m.group(1))


def fetch(port: int, path: str) -> bytes:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/{path}", timeout=60) as r:
        return r.read()


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def test_a_forward_serves_concurrent_requests_and_a_100_mb_body(served):
    worker = served.fleet.worker.proc.pid
    with forwarding(served.fleet.alice, served.hold, f"0:{served.port}") as (p, port, _):
        fetch(port, "f0.txt")
        fds = open_fds(worker), open_fds(p.pid)
        with ThreadPoolExecutor(SMALL_FILES) as pool:
            bodies = list(pool.map(lambda i: fetch(port, f"f{i}.txt"), range(SMALL_FILES)))
        assert bodies == [(served.root / f"f{i}.txt").read_bytes() for i in range(SMALL_FILES)]
        # every connection's sockets are closed, its threads' kept-alive
        # connections to the controller too (one was kept per thread)
        wait_until(
            lambda: open_fds(worker) <= fds[0] + 2 and open_fds(p.pid) <= fds[1] + 2,
            20,
            f"the worker and rc forward back to {fds} open files",
        )
        body = fetch(port, "big.bin")
        assert len(body) == BIG_BYTES
        assert (
            hashlib.sha256(body).digest()
            == hashlib.sha256((served.root / "big.bin").read_bytes()).digest()
        )
        assert p.poll() is None  # connections end, the forward goes on
    assert p.returncode == 0  # SIGTERM ends it as Ctrl-C does


def test_connections_one_after_another_do_not_wait_for_the_workers_poll_floor(served):
    """The worker's long poll answered with session starts polls again at
    once: it waited out its 0.25 s floor (for empty answers) first, so each
    new session (a forward's every connection, rc shell, rc exec) started
    up to 0.25 s late."""
    n = 40
    with forwarding(served.fleet.alice, served.hold, f"0:{served.port}") as (_, port, _):
        fetch(port, "f0.txt")
        t0 = time.monotonic()
        for i in range(n):
            assert fetch(port, f"f{i % SMALL_FILES}.txt")
        took = time.monotonic() - t0
    # with the floor: at least n x ~0.25 s (10 s); without: ~25 ms each here
    assert took < n * 0.125, f"{n} connections one after another took {took:.1f}s"


def test_another_users_hold_is_refused(served):
    fleet = served.fleet
    res = fleet.bob.run("forward", str(served.hold), f"0:{served.port}", timeout=30)
    assert res.returncode == 1
    assert b"belongs to alice" in res.stderr
    admin = Cli(fleet.ctl.url, fleet.ctl.token("carol-admin", "admin"), fleet.alice.env, fleet.tmp)
    with forwarding(admin, served.hold, f"0:{served.port}") as (_, port, _):
        assert fetch(port, "f1.txt") == (served.root / "f1.txt").read_bytes()
    # and by the controller itself, whatever the client checks
    bob = fleet.ctl.client(fleet.bob.env["RC_TOKEN"])
    with pytest.raises(ApiError) as e:
        bob.post(f"/v1/jobs/{served.hold}/sessions", {"stdio": "pipe", "port": served.port})
    assert e.value.status == 403 and e.value.code == "not_job_owner"


def test_bad_ports_are_usage_errors_and_a_port_nobody_listens_on_is_named(served):
    fleet = served.fleet
    for spec in ("0", "70000", "x:80", "80:"):
        res = fleet.alice.run("forward", str(served.hold), spec, timeout=30)
        assert res.returncode == 2, (spec, res.stderr)
        assert b"port" in res.stderr
    with pytest.raises(ApiError) as e:
        fleet.ctl.client(fleet.alice.env["RC_TOKEN"]).post(
            f"/v1/jobs/{served.hold}/sessions", {"stdio": "pipe", "port": 80, "command": ["ls"]}
        )
    assert e.value.status == 400
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = taken.getsockname()[1]
        res = fleet.alice.run("forward", str(served.hold), f"{busy}:{served.port}", timeout=30)
        assert res.returncode == 1
        assert b"cannot listen on 127.0.0.1:%d" % busy in res.stderr
    res = fleet.alice.run("forward", "999999", "80", timeout=30)
    assert res.returncode == 1 and b"no hold 999999" in res.stderr
    free = socket.socket()
    free.bind(("127.0.0.1", 0))
    unused = free.getsockname()[1]
    free.close()  # nothing listens there now
    with forwarding(fleet.alice, served.hold, f"0:{unused}") as (p, port, err):
        with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
            assert s.recv(10) == b""  # closed, no bytes
        err.expect(rb"cannot connect to 127\.0\.0\.1:%d on box" % unused)
        assert p.poll() is None


def test_connections_are_independent_and_end_of_file_is_a_half_close(served, far):
    with forwarding(served.fleet.alice, served.hold, f"0:{far.port}") as (p, port, _):
        a = socket.create_connection(("127.0.0.1", port), timeout=30)
        b = socket.create_connection(("127.0.0.1", port), timeout=30)
        a.sendall(b"E" + b"one")
        assert a.recv(3) == b"one"
        b.sendall(b"Ebefore")
        assert b.recv(6) == b"before"
        a.close()  # one side closing ends that connection only
        wait_until(lambda: far.closed == 1, 20, "the far end of the closed connection closed")
        payload = os.urandom(3 << 20)
        b.sendall(payload)
        b.shutdown(socket.SHUT_WR)  # end of file here: the far side still answers
        got = b""
        while data := b.recv(1 << 20):
            got += data
        want = payload + b"sha256:" + hashlib.sha256(b"before" + payload).hexdigest().encode()
        assert got == want
        b.close()
        assert p.poll() is None


def test_killing_the_client_ends_every_connection_and_leaves_no_relay_sessions(served, far):
    fleet = served.fleet
    before = relay_sessions(fleet)  # the http.server's own exec session
    with forwarding(fleet.alice, served.hold, f"0:{far.port}") as (p, port, _):
        conns = []
        for _ in range(3):
            s = socket.create_connection(("127.0.0.1", port), timeout=30)
            s.sendall(b"E" + b"up")
            assert s.recv(2) == b"up"
            conns.append(s)
        assert relay_sessions(fleet) == before + 3
        p.kill()  # no goodbye: the kernel closes its connections
        p.wait(10)
        wait_until(lambda: far.closed == 3, 20, "every far end closed")
        wait_until(
            lambda: relay_sessions(fleet) == before, 20, "every forward session ended on the relay"
        )
        for s in conns:
            s.close()
    assert served.server.poll() is None  # the exec session is untouched


def test_the_hold_ending_ends_the_forward(fleet):
    held = hold(fleet.alice, "box:cpu1")
    with forwarding(fleet.alice, held, "0:9") as (p, _, err):
        fleet.alice.run("release", str(held), check=True)
        err.expect(rb"hold %d ended: released by alice \(token alice\)" % held)
        assert p.wait(20) == 1
    assert job(fleet.ctl.client(), held)["state"] != "running"
