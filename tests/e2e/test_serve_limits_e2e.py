"""What `rc serve` does about the operating system's limits: its open-file
limit, and idle kept-alive connections (README "Limits")."""

from __future__ import annotations

import resource
import socket
import time

import pytest

from rc.controller.serve import KEEP_ALIVE_S
from tests.helpers.harness import Controller, base_env


def _soft_nofile(pid: int) -> int:
    with open(f"/proc/{pid}/limits") as f:
        line = next(x for x in f if x.startswith("Max open files"))
    return int(line.split()[3])


def test_serve_raises_its_open_file_limit_and_closes_idle_connections(tmp_path):
    """Found by a new user: under a soft limit of 1024, a burst of rc forward
    connections ran the controller out of descriptors (each closed connection
    stayed open on its side for Hypercorn's 75 s keep-alive), and nobody could
    reach it for a minute."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard <= 512:
        pytest.fail(f"this machine's hard open-file limit is {hard}: the test needs more")
    resource.setrlimit(resource.RLIMIT_NOFILE, (512, hard))
    try:  # the controller inherits the low soft limit
        ctl = Controller(tmp_path / "data", base_env(tmp_path / "home")).start()
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    try:
        assert _soft_nofile(ctl.proc.pid) > 512
        host, port = ctl.url.rsplit("//", 1)[1].rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=10) as s:
            s.sendall(b"GET /openapi.json HTTP/1.1\r\nHost: x\r\n\r\n")
            assert s.recv(65536).startswith(b"HTTP/1.1 200")
            t0 = time.monotonic()
            s.settimeout(KEEP_ALIVE_S + 30)  # the deadline: well under the 75 s it was
            while s.recv(65536):  # the server closes the idle connection: end of file
                pass
            assert time.monotonic() - t0 < KEEP_ALIVE_S + 30
    finally:
        ctl.stop()
