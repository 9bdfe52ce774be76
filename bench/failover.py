#!/usr/bin/env python3
"""Failover benchmark (README "More than one box", "Performance").

Starts a throwaway PostgreSQL cluster (tests/helpers/pgcluster.py, Debian's server
binaries), two `rc serve` on one database with one log directory, and one
worker with 2 CPU devices given both URLs. Each round: the active
controller is killed with SIGKILL while jobs wait in the queue, and the
figure is the time from the kill to the first job the new active
controller dispatched (its `assigned_at` in the database); the killed one
is started again (as a standby) for the next round.

Prints the median and the range over the rounds beside the target
(≤ 10 s with the default settings: a 5 s lease renewed every 2 s, a
standby trying every 0.5 s, clients and workers backing off up to 2 s).
Usage: python bench/failover.py [--rounds 5]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from rc.proto.client import Client
from tests.helpers.harness import Controller, Worker, base_env
from tests.helpers.pgcluster import PgCluster, missing_postgres
from tests.helpers.wait import wait_until

TARGET_S = 10.0


def _active(ctl: Controller, token: str) -> bool:
    try:
        Client(ctl.url, token, timeout=2, connect_timeout=1).get("/v1/whoami")
        return True
    except Exception:  # noqa: BLE001 - a standby (503) or a dead one
        return False


def _first_assignment_after(dsn: str, at: float) -> float:
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as c:
        got = c.execute("SELECT min(assigned_at) FROM jobs WHERE assigned_at > %s", (at,))
        return got.fetchone()[0] or 0.0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=5, help="failovers to measure (default 5)")
    args = p.parse_args()
    why = missing_postgres()
    if why:
        sys.exit(f"bench/failover.py needs PostgreSQL: {why}")
    root = Path(tempfile.mkdtemp(prefix="rc-bench-failover-"))
    cluster = PgCluster(root / "pg").start()
    ctls: list[Controller] = []
    worker = None
    try:
        dsn = cluster.create_database()
        env = base_env(root / "home")
        flags = ["--database", dsn, "--log-dir", str(root / "logs")]
        a = Controller(root / "a", env, flags).start()
        wait_until(lambda: (a.data / "admin.token").exists(), 30, "the first controller")
        token = a.admin_token
        wait_until(lambda: _active(a, token), 30, "the first controller to answer")
        b_data = root / "b"
        b_data.mkdir()
        shutil.copy(a.data / "admin.token", b_data / "admin.token")
        b = Controller(b_data, env, flags).start()
        ctls = [a, b]
        urls = f"{a.url},{b.url}"
        admin = Client(urls, token, timeout=60)
        secret = admin.post("/v1/tokens", {"name": "w", "role": "worker"})["secret"]
        pyz = root / "rc.pyz"
        subprocess.run(
            [sys.executable, str(ROOT / "zipapp"), "--output", str(pyz)], check=True, timeout=60
        )
        worker = Worker(urls, secret, root / "w", env, host="box", devices="cpu:2", pyz=pyz)
        worker.start()
        wait_until(lambda: "registered box " in worker.log(), 30, "the worker to register")
        took = []
        for n in range(args.rounds):
            active = next(c for c in ctls if _active(c, token))
            standby = next(c for c in ctls if c is not active)
            for _ in range(20):  # more than the devices: some wait in the queue
                admin.post("/v1/jobs", {"command": ["sleep", "0.2"], "selector": "*"})
            killed = time.time()
            active.kill9()
            wait_until(lambda: _active(standby, token), 60, "the standby to take over", 0.05)
            took_over = time.time() - killed
            first = wait_until(
                lambda: _first_assignment_after(dsn, killed), 60, "a job dispatched by the new"
            )
            took.append(first - killed)
            print(f"round {n + 1}: {took[-1]:.2f} s (the standby active after {took_over:.2f} s)")
            active.listen = active.url.removeprefix("http://")  # the address in the lists
            active.start()  # back as a standby for the next round
            wait_until(
                lambda: "standby: the active controller" in active.log(), 30, "a standby again"
            )
        print(
            json.dumps(
                {
                    "figure": "failover: kill -9 of the active -> first job dispatched by the new",
                    "median_s": round(statistics.median(took), 2),
                    "min_s": round(min(took), 2),
                    "max_s": round(max(took), 2),
                    "rounds": len(took),
                    "target_s": TARGET_S,
                }
            )
        )
    finally:
        if worker is not None:
            worker.stop()
        for c in ctls:
            c.stop()
        cluster.stop()
        if not os.environ.get("RC_BENCH_KEEP"):
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
