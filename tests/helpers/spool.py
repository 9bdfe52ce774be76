"""What tests/e2e/test_worker_spool.py and its fast-lane half
tests/worker/test_worker_spool.py share: their helpers and fixtures,
written once (the fixtures are imported by name, as fleet_users' are)."""

from __future__ import annotations

import sys

import pytest

from tests.helpers.harness import Controller
from tests.helpers.wait import wait_until
from tests.helpers.worker_kit import Site, free_port, logs, submit, wait_state

SPOOL_BYTES = 4 << 20


WRITER = """
import os, sys, time
go, done, total = sys.argv[1], sys.argv[2], int(sys.argv[3])
print("start", flush=True)
while not os.path.exists(go):
    time.sleep(0.02)
w, n, i = sys.stdout.buffer, 0, 0
while n < total:
    line = b"%08d %s\\n" % (i, b"y" * 90)
    w.write(line)
    n, i = n + len(line), i + 1
w.flush()
open(done, "w").close()
time.sleep(0.3)
print("end", flush=True)
"""


def expected(total: int) -> bytes:
    out, n, i = [b"start\n"], 0, 0
    while n < total:
        line = b"%08d %s\n" % (i, b"y" * 90)
        out.append(line)
        n, i = n + len(line), i + 1
    return b"".join(out) + b"end\n"


@pytest.fixture(scope="module")
def site(tmp_path_factory, pyz):
    root = tmp_path_factory.mktemp("spool")
    port = free_port()
    s = Site(root, pyz, listen=f"127.0.0.1:{port}")
    s.port = port
    s.box = s.worker(
        "spoolbox",
        f"""
kill_grace = "1s"
verify_dir = "{root}/none"
probe_dir = "{root}/none"
spool_dir = "{root}/spool"
spool_max_bytes = {SPOOL_BYTES}
devices = "cpu:1"
""",
    )
    yield s
    s.close()


def outage(site, tmp_path, total: int) -> bytes:
    """Run a writer of `total` bytes while the controller is down; its log."""
    go, done = tmp_path / "go", tmp_path / "done"
    job_id = submit(site.admin, [sys.executable, "-c", WRITER, str(go), str(done), str(total)])
    wait_until(lambda: logs(site.admin, job_id) == b"start\n", 20, "the job to start")
    site.ctl.kill9()  # a crash: nothing acknowledged may be lost
    go.touch()
    # no controller: the job must still be able to write everything (no blocking)
    wait_until(done.exists, 30, "the job to write everything while the controller is down")
    site.ctl = Controller(site.root / "data", site.env, listen=f"127.0.0.1:{site.port}").start()
    j = wait_state(site.admin, job_id, timeout=60)
    assert j["state"] == "succeeded", j
    return logs(site.admin, job_id)
