"""Crash consistency (docs/design.md#the-store): kill -9 the
controller at random moments during a stream of 500 submissions and
completions on 8 devices, restart it, five times over. Then a checker reads
the database and the log files and proves:

- every acknowledged submission exists exactly once (and nothing else does);
- every job ends in a terminal state (here: succeeded);
- no device ever had two live leases (lease intervals never overlap);
- no log byte was lost or doubled.
"""

from __future__ import annotations

import itertools
import random
import sqlite3
import threading

from rc.proto.client import Client
from rc.proto.errors import ApiError, TransportError
from tests.helpers.harness import Controller, Worker
from tests.helpers.wait import wait_until

JOBS = 500
CRASHES = 5
DEVICES = 8


def expected_log(i: int) -> bytes:
    return b"".join(b"job-%d-%d\n" % (i, n) for n in (1, 2, 3))


def test_kill_9_the_controller_five_times(tmp_path, env, pyz):
    flags = ["--heartbeat-interval", "1s", "--sweep-interval", "0.5s", "--startup-grace", "20s"]
    data = tmp_path / "data"
    ctl = Controller(data, env, flags).start()
    port = ctl.url.rsplit(":", 1)[1]
    worker = Worker(
        ctl.url,
        ctl.token("w", "worker"),
        tmp_path / "w",
        env,
        host="crashbox",
        devices=f"cpu:{DEVICES}",
        pyz=pyz,
    ).start()
    token = ctl.token("alice")
    acked: dict[str, int] = {}
    stop = threading.Event()
    errors: list[str] = []
    rng = random.Random(20261130)

    def submitter() -> None:
        c = Client(ctl.url, token, timeout=10, connect_timeout=2)
        for i in range(JOBS):
            key = f"crash-{i}"
            body = {
                "command": ["sh", "-c", f"printf 'job-{i}-%s\\n' 1 2 3"],
                "selector": "*",
                "idempotency_key": key,
            }
            while not stop.is_set():
                try:
                    acked[key] = c.post("/v1/jobs", body)["job"]["id"]
                    break
                except TransportError:
                    stop.wait(0.05)  # the controller is restarting: retry the same key
                except ApiError as e:
                    if e.status < 500:
                        errors.append(f"{key}: {e}")
                        break
                    stop.wait(0.05)
        c.close_all()

    thread = threading.Thread(target=submitter, daemon=True)
    try:
        wait_until(
            lambda: Client(ctl.url, token).get("/v1/devices")["devices"],
            30,
            "the worker to register",
        )
        thread.start()
        for n in range(CRASHES):
            target = (n + 1) * JOBS // (CRASHES + 1) + rng.randrange(-30, 30)
            wait_until(
                lambda: len(acked) >= target or not thread.is_alive(),
                300,
                f"{target} acknowledged submissions",
            )
            ctl.kill9()
            ctl = Controller(data, env, flags, listen=f"127.0.0.1:{port}").start()
        thread.join(300)
        assert not thread.is_alive(), "the submitter did not finish"
        assert errors == []
        c = Client(ctl.url, token)

        def settled() -> bool:
            st = c.get("/v1/state")
            return not st["jobs"] and not st["queued"]

        wait_until(settled, 300, "every job to finish")
        c.close_all()
    finally:
        stop.set()
        worker.stop()
        ctl.stop()

    db = sqlite3.connect(data / "rc.db")
    rows = db.execute("SELECT id, idempotency_key, state, kill_reason FROM jobs").fetchall()
    by_key = {}
    for job_id, key, state, reason in rows:
        assert key not in by_key, f"two jobs for {key}"
        by_key[key] = (job_id, state, reason)
    assert len(acked) == JOBS
    assert set(by_key) == set(acked), "jobs that nobody submitted, or acknowledged ones missing"
    for key, job_id in acked.items():
        assert by_key[key][0] == job_id, f"{key} changed id"
    bad = {k: v for k, v in by_key.items() if v[1] != "succeeded"}
    assert bad == {}, f"jobs that did not succeed: {list(bad.items())[:5]}"
    # no device ever had two live leases
    leases = db.execute(
        "SELECT device_id, acquired_at, released_at FROM leases ORDER BY device_id, acquired_at"
    ).fetchall()
    assert len(leases) == JOBS
    for (d1, _, rel1), (d2, acq2, _) in itertools.pairwise(leases):
        if d1 == d2:
            assert rel1 is not None and rel1 <= acq2, f"overlapping leases on {d1}"
    assert all(rel is not None for _, _, rel in leases)
    db.close()
    # no log byte lost or doubled
    for key, job_id in acked.items():
        i = int(key.split("-")[1])
        got = (data / "logs" / f"{job_id}.log").read_bytes()
        assert got == expected_log(i), f"job {job_id} log: {got!r}"
